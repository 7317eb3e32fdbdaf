"""CPU time of this host's containers and of the boxes' own, read from the cgroups themselves
(Docker's stats answer 0 for it here).

Where each sits, on cgroup v1 with Docker's cgroupfs driver, as this machine and CI run it:
    docker/<id>                      this host's containers: the boxes, the registry, the hub,
                                     the tests' throwaway containers
    docker/buildkit/<id>             this host's image builds (the sim's bases)
    thorfleet-box-<host>/<id>        a box's containers: its own Docker engine puts them there
    thorfleet-box-<host>/buildkit/.. its image builds       (sim/box/files/docker-cgroup.conf)
A box's containers are not under the box's own cgroup (its engine writes to the host's
cgroupfs), so a box costs its own cgroup plus its thorfleet-box-<host>/. cgroup v1 charges CPU to
every ancestor as it is spent, so a parent's counter keeps what its removed children spent.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/cpuacct")
V2_ROOT = Path("/sys/fs/cgroup")
CONTAINER = re.compile(r"^(?:docker-)?([0-9a-f]{64})(?:\.scope)?$")
BOX_PARENT = "thorfleet-box-"


def root() -> Path:
    return V1_ROOT if (V1_ROOT / "cpuacct.usage").exists() else V2_ROOT


def usage_s(cgroup: Path) -> float | None:
    """CPU seconds a cgroup (and everything below it, removed children included) has spent."""
    try:
        if (cgroup / "cpuacct.usage").exists():
            return int((cgroup / "cpuacct.usage").read_text()) / 1e9
        for line in (cgroup / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass  # removed between the listing and the read
    return None


def containers(base: Path | None = None, depth: int = 3) -> dict[str, Path]:
    """{container ID: its cgroup} for every container cgroup within `depth` levels of the root."""
    base = base or root()
    found = {}
    for path, dirs, _ in os.walk(base):
        level = len(Path(path).relative_to(base).parts)
        if level >= depth:
            dirs[:] = []
        for name in dirs:
            if match := CONTAINER.match(name):
                found[match[1]] = Path(path, name)
    return found


def box_parents(base: Path | None = None) -> dict[str, Path]:
    """{box host name: the cgroup its own Docker engine puts its containers under}."""
    base = base or root()
    return {p.name[len(BOX_PARENT):]: p for p in base.iterdir()
            if p.is_dir() and p.name.startswith(BOX_PARENT)}


def command_of(cgroup: Path) -> str:
    """The command lines of a cgroup's processes, joined: what the container is running."""
    lines = []
    for name in ("cgroup.procs", "tasks"):
        try:
            pids = sorted(int(p) for p in (cgroup / name).read_text().split())
        except (FileNotFoundError, ValueError):
            continue
        for pid in pids[:6]:
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            lines.append(raw.replace(b"\0", b" ").decode(errors="replace").strip())
        break
    return " | ".join(line for line in lines if line)


ENGINE = ("dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "docker-proxy")


def host_engine_s(proc: Path = Path("/proc")) -> float:
    """CPU seconds of this host's own Docker engine (dockerd, containerd, the shims and port
    proxies, with the children they reaped: runc, each `docker exec`'s setup): not in any
    container's cgroup, so the container sampling above never sees them. A box's engine of the
    same names is in its box's cgroup, and skipped."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cgroup = (stat.parent / "cgroup").read_text()
        except OSError:
            continue  # gone meanwhile
        name = text[text.index("(") + 1:text.rindex(")")]
        if name not in ENGINE or "/docker/" in cgroup or BOX_PARENT in cgroup:
            continue
        fields = text[text.rindex(")") + 2:].split()
        total += sum(int(f) for f in fields[11:15]) / ticks  # utime stime cutime cstime
    return total
