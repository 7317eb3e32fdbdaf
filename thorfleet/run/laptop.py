"""What thorfleet writes on the laptop (the report, the fleet CA and its certificates, the copy
keys), through one writer: the whole file or none of it, so a run cut short never leaves half a
key or half a report behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_whole(path, data: str | bytes, private: bool = False) -> None:
    """`data` as all of `path`, or nothing: a temporary file beside it, synced, then os.replace.
    `private`: 0600 from the first byte (a key is never readable by others); else the mode of
    the file it replaces, or the umask's for a new one. A symlink stays a link to the file it
    names."""
    real = Path(os.path.realpath(path))
    descriptor, temporary = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp",
                                             dir=real.parent)  # made 0600
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        if not private:
            try:
                mode = real.stat().st_mode & 0o7777
            except FileNotFoundError:
                mode = 0o666 & ~_umask()
            os.chmod(temporary, mode)
        os.replace(temporary, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
