"""What thorfleet writes on the laptop (the report, the fleet CA and its certificates, the copy
keys), through one writer: the whole file or none of it, so a run cut short never leaves half a
key or half a report behind; and the laptop's secrets (the API key, the hub token, keys and
certificates): read where a host's data names them, and refused when another user could read
or replace them."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sys
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


def private_dir(path: Path) -> Path:
    with contextlib.suppress(FileExistsError):  # another deploy may make it first
        path.mkdir(parents=True)
        path.chmod(0o700)  # keys live here; mkdir's mode is cut by the umask
    return path


def client_keys(policies, box_keys, pattern, make=False):
    """({client name: its policy with its key}, [problem]) of the door's clients (their parsed
    gateway_clients): each key file read once, here, and refused when others could read or
    replace it, when two clients share a file or a key, or when a box takes it; each line names
    the file or setting, never a key. `make`: a file not there yet is made first (a fresh key,
    0600 in a 0700 folder, whole or not at all, said on stderr for the operator to hand over);
    else (`check`, status, doctor) its client is left without a key, for the deploy to make.
    `box_keys`: the keys the boxes take (service_api_key_file); `pattern`: what a key may be
    (schema.CLIENT_KEY)."""
    problems, keyed, seen, files = [], {}, {}, {}  # files: {the file, resolved: its first client}
    for name, policy in sorted(policies.items()):
        said = f"gateway_clients[{name!r}]"
        problems += private_file_problems(said, policy.key_file)
        file = Path(policy.key_file).expanduser()
        # one file, two clients (made or not: the run would make one key for both): revoking one
        # would leave the key working under the other's name
        same = files.setdefault(file.resolve(), name)
        if same != name:
            problems.append(f"{said}: {file} is client {same!r}'s key file too: each client "
                            f"needs a file (and a key) of its own, or revoking one leaves the key "
                            f"working as the other; point {said} at another file")
            continue
        if not file.exists() and make and not problems:
            private_dir(file.parent)
            write_whole(file, (secrets.token_hex(24) + "\n").encode(), private=True)
            print(f"thorfleet: made a key for client {name} at {file} (0600): hand it to them; "
                  "it opens the gateway's door", file=sys.stderr)
        if not file.exists():
            keyed[name] = policy  # the deploy makes it
            continue
        try:
            key = client_key(name, file, pattern)
        except (OSError, ValueError) as error:
            problems.append(f"{said}: {getattr(error, 'strerror', None) or error}")
            continue
        if key in box_keys:
            problems.append(f"{said}: {file} holds the boxes' own key (service_api_key_file): "
                            "a client key must be one no box takes; make it another")
        if key in seen:
            problems.append(f"{said}: {file} holds the same key as client {seen[key]!r}: "
                            "each client needs a key of its own, or a revocation locks out both")
        seen.setdefault(key, name)
        keyed[name] = dataclasses.replace(policy, key=key)
    return keyed, problems


def client_key(name, file: Path, pattern) -> str:
    """Client `name`'s key from `file` if `pattern` takes it, or ValueError naming the file
    (never the key)."""
    key = file.read_text().strip()
    if not pattern.fullmatch(key):
        raise ValueError(f"client {name}'s key file {file} holds no key: one line of 16 to 512 "
                         "letters, digits and -._~+/= (a bearer token); make one with "
                         f"(umask 077; openssl rand -hex 24 > {file})")
    return key


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _read_secret(path, env_name):
    if path:
        return Path(path).expanduser().read_text().strip() or None
    return os.environ.get(env_name) or None


def read_secret_of(key, path, env_name):
    """(the secret or None, None), or (None, the problem) when setting `key`'s file `path`
    cannot be read; with no file, the secret in `env_name`."""
    try:
        return _read_secret(path, env_name), None
    except (OSError, TypeError) as error:
        file = Path(str(path)).expanduser()
        fix = (f"make it: mkdir -p -m 700 {file.parent}; (umask 077; openssl rand -hex 24 > "
               f"{file})" if key == "service_api_key_file" else "put the token alone in it")
        why = getattr(error, "strerror", None) or str(error)
        return None, (f"{key}={path!r} cannot be read ({why}): {fix}, or point {key} at "
                      "the file that holds it")


def private_file_problems(key, path) -> list[str]:
    """A laptop secret (the API key, the hub token, the gateway's TLS key, a client's key, the
    boxes' copy keys) that another user could read, or replace: the file readable by others, or
    a folder it is in another user can write (private_folder_problems). Refused, with the fix;
    a missing file is reported where it is read (or made), but its folders are still checked."""
    if not path:
        return []
    file = Path(path).expanduser()
    problems = []
    try:
        mode = file.stat().st_mode
    except OSError:
        mode = None
    if mode is not None and mode & 0o077:
        problems.append(f"{key}={str(path)!r} can be read by other users (mode {mode & 0o777:o}): "
                        f"chmod 600 {file}")
    folders = [file.parent] + ([file.resolve().parent] if file.is_symlink() else [])
    for folder in folders:
        problems += [p for p in private_folder_problems(key, path, folder) if p not in problems]
    return problems


def private_folder_problems(key, path, folder) -> list[str]:
    """`folder`, which holds (or will hold) the laptop secret `key`=`path`, and every folder above
    it up to the user's home (else up to /), as OpenSSH's StrictModes holds ~/.ssh: each must be
    this user's or root's and writable by neither group nor others, or another user could put
    their own secret in its place (a CA key before the first run, a client key thorfleet makes
    when missing) or swap the folder holding it. A sticky folder (/tmp, 1777) only keeps others
    from renaming what is in it already: it is safe above a folder of ours that is there, never
    as the folder that holds the secret, nor above one not made yet (anyone may make it first).
    """
    current = Path(os.path.realpath(Path(folder).expanduser()))
    home = Path(os.path.realpath(Path.home()))
    missing = None  # the first folder of the path not there yet: thorfleet makes it (0700)
    while not current.is_dir() and current.parent != current:
        missing, current = current, current.parent
    problems, below, me = [], None, os.getuid()
    said = f"{key}={str(path)!r}"
    while True:
        try:
            stat = current.stat()
        except OSError:
            return problems  # unreadable: reported where the secret is read or made
        mode = stat.st_mode & 0o7777
        if stat.st_uid not in (0, me):
            problems.append(f"{said}: {current} belongs to another user (uid {stat.st_uid}), who "
                            "could replace what it holds: keep the secret in a folder of yours, "
                            "like ~/.config/thorfleet")
        elif stat.st_mode & 0o022:
            sticky = stat.st_mode & 0o1000
            if below is None and missing is None:
                problems.append(f"{said} is in {current}, which other users can write (mode "
                                f"{mode:o}): they could replace it; chmod go-w {current}")
            elif below is None:
                fix = (f"mkdir -m 700 {missing} yourself now, or keep it under your home"
                       if sticky else f"chmod go-w {current}")
                problems.append(f"{said}: {missing} is not there yet, and other users can write "
                                f"{current} (mode {mode:o}): one could make it first and hold "
                                f"what thorfleet puts there; {fix}")
            elif not sticky:
                problems.append(f"{said}: {current}, above it, can be written by other users "
                                f"(mode {mode:o}): they could swap {below} for their own; "
                                f"chmod go-w {current}")
        if current == home or current.parent == current:
            return problems
        below, current = current, current.parent
