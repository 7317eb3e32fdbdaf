"""A Debian bookworm root filesystem, made with debootstrap and `docker import`ed.

Every sim image (the simulated Thor, the vLLM stand-in base, the hub) starts from it, so all of
them share one set of layers and one trusted CA bundle.
"""

import hashlib
import inspect
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker.errors

from sim import locked, log, run_logged, state_dir

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
REPOSITORY = "thorfleet-sim/rootfs"
# What every sim container needs: systemd as PID 1, sshd for pyinfra, an inner Docker engine,
# and Python for the stand-ins.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "sudo", "docker.io", "iptables",
    "ca-certificates", "curl", "procps", "iproute2", "python3", "python3-venv", "python3-pip",
    "less",
]
# The host's bundle trusts the site's TLS-intercepting proxy; without it pip inside cannot reach PyPI.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
IMPORT_CHANGES = ["ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']


def _inputs_hash() -> str:
    digest = hashlib.sha256()
    for part in (SUITE, MIRROR, " ".join(PACKAGES)):
        digest.update(part.encode() + b"\0")
    # What decides the tree: debootstrap's arguments above, what _finish does to the tree and how
    # it is imported (IMPORT_CHANGES), not how progress is shown.
    digest.update(_FINISH_SOURCE.encode())
    digest.update(json.dumps(IMPORT_CHANGES).encode())
    digest.update(HOST_CA_BUNDLE.read_bytes())
    return digest.hexdigest()[:16]


def rootfs_tag() -> str:
    """The rootfs image's tag: a function of its inputs, known before it is built."""
    return f"{REPOSITORY}:{_inputs_hash()}"


def ensure_rootfs(client) -> str:
    """Return the tag of the rootfs image, building it only when its inputs changed."""
    tag = rootfs_tag()
    with locked("rootfs"):
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        _build(client, tag)
    return tag


def _build(client, tag: str) -> None:
    state = state_dir()
    # debootstrap keeps the downloaded .debs here: a rebuild after an input change fetches little.
    cache = state / "cache" / "debootstrap"
    cache.mkdir(parents=True, exist_ok=True)
    log_path = state / "logs" / "rootfs.log"
    log(f"rootfs {tag}: debootstrap {SUITE} with {len(PACKAGES)} packages and what they need")
    with tempfile.TemporaryDirectory(dir=state, prefix="rootfs-") as work:
        target = Path(work) / "root"
        run_logged("rootfs", ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                              f"--cache-dir={cache}", SUITE, str(target), MIRROR],
                   log_path, shown=_new_phase())
        _finish(target)
        log("rootfs: packing the tree and importing it into Docker")
        tarball = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "-C", str(target), "-cf",
                        str(tarball), "."], check=True)
        repository, _, version = tag.partition(":")
        client.api.import_image(src=str(tarball), repository=repository, tag=version,
                                changes=IMPORT_CHANGES)


def _new_phase():
    """debootstrap prints a line per package and step ("I: Retrieving libc6 2.36"): show its
    phase lines ("I: Installing core packages..."), the first line of each step, and warnings."""
    seen = set()

    def shown(line: str) -> bool:
        words = line.split()
        if len(words) < 2 or words[0] not in ("I:", "W:", "E:"):
            return False
        # a phase: "I: Installing core packages..."; not a package: "I: Extracting zlib1g..."
        first = words[1] not in seen
        seen.add(words[1])
        return words[0] != "I:" or (line.rstrip().endswith("...") and len(words) > 3) or first

    return shown


def _finish(target: Path) -> None:
    """Make the debootstrapped tree fit for an image: trust the site CA, drop caches."""
    # As the system bundle, and as a local CA so update-ca-certificates (run by any later
    # apt install of ca-certificates) keeps it.
    shutil.copyfile(HOST_CA_BUNDLE, target / "etc/ssl/certs/ca-certificates.crt")
    shutil.copyfile(HOST_CA_BUNDLE, target / "usr/local/share/ca-certificates/site-bundle.crt")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (target / leftover).glob("*"):
            if path.is_file():
                path.unlink()
    # Empty machine-id: systemd makes a fresh one per container instead of sharing one.
    (target / "etc/machine-id").write_text("")
    for path in (target / "etc/ssh").glob("ssh_host_*"):
        path.unlink()  # each box gets its own host keys at first boot (see box/)


# Read once, at import: getsource reads the file again at each call, and an edit since would move
# the lines it reads.
_FINISH_SOURCE = inspect.getsource(_finish)
