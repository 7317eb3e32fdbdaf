"""The box itself: its L4T release, memory, disk, swap and page cache, Docker and its runtimes,
sudo, temperatures, its network interface, and what doctor probes in a throwaway container.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from shlex import quote as q
from typing import NamedTuple

from pyinfra.api import FactBase

from thorfleet.box import readings
from thorfleet.settings.layout import (
    BOX_REBOOT_MARKER,
    FILES,
)


class L4TRelease(FactBase[str | None]):
    """The L4T release as "38.2" from /etc/nv_tegra_release, or None on a box that is not a Jetson."""

    command = "! test -f /etc/nv_tegra_release || cat /etc/nv_tegra_release"

    def process(self, output):
        # "# R38 (release), REVISION: 2.0, GCID: ..., BOARD: generic, EABI: aarch64, DATE: ..."
        match = re.match(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", "\n".join(output))
        return f"{match.group(1)}.{match.group(2)}" if match else None


class MemTotalGiB(FactBase[float]):
    """Total memory in GiB (MemTotal)."""

    command = "awk '/^MemTotal:/ {print $2}' /proc/meminfo"

    def process(self, output):
        return int(output[0]) / 1024**2


class FreeDiskGiB(FactBase[float]):
    """Free disk in GiB on the filesystem that holds `path` (or its nearest existing parent)."""

    def command(self, path):
        return (
            f"p={q(path)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
            "df -Pk \"$p\" | awk 'NR==2 {print $4}'"
        )

    def process(self, output):
        return int(output[0]) / 1024**2


class DockerRuntimes(FactBase[list[str] | None]):
    """Names of the runtimes the Docker engine offers (`nvidia` is needed), or None without Docker."""

    command = "docker info --format '{{json .Runtimes}}'"
    requires_command = "docker"

    def process(self, output):
        return sorted(json.loads("".join(output)))


class SudoWorks(FactBase[bool]):
    """True when the deploy user can run sudo without a password prompt (False: it prints nothing)."""

    command = "! sudo -n true >/dev/null 2>&1 || echo yes"

    @staticmethod
    def default():
        return False

    def process(self, output):
        return output[-1] == "yes"


class RebootMarker(FactBase[bool]):
    """True while the reboot marker (layout.BOX_REBOOT_MARKER, in /run) exists: every boot
    empties /run (False: it prints nothing)."""

    command = f"! test -e {q(BOX_REBOOT_MARKER)} || echo yes"

    @staticmethod
    def default():
        return False

    def process(self, output):
        return output[-1] == "yes"


class Interface(NamedTuple):
    name: str
    prefix: int  # the LAN's prefix length, as the address is configured


class InterfaceOf(FactBase[Interface | None]):
    """The network interface that holds IPv4 `address`, and that address's prefix (`ip -o -4 addr
    show`: "2: eth0 inet 172.18.0.5/16 brd ..."): where keepalived adds the gateways' shared
    address, and the LAN's prefix it must be given; None when no interface has it."""

    requires_command = "ip"

    def command(self, address):
        return ("ip -o -4 addr show | awk -v a=" + q(address)
                + " '$3 == \"inet\" { split($4, p, \"/\"); if (p[1] == a) print $2, p[2] }'")

    def process(self, output):
        found = [line.split() for line in output if line.strip()]
        if not found or len(found[0]) != 2 or not found[0][1].isdigit():
            return None
        return Interface(found[0][0].split("@")[0], int(found[0][1]))


PROBE = Path(FILES) / "doctor" / "container_probe.py"  # run by python3 in the throwaway container


MIRROR_PROBE = Path(FILES) / "doctor" / "mirror_probe.py"  # run by python3 on a gateway


class Swaps(FactBase[list]):
    """Active swap areas ([{"name", "type", "size_kib"}], readings.swaps of /proc/swaps): zram
    and swap files change what MemAvailable, the memory gate's reading, means."""

    command = "cat /proc/swaps"

    def process(self, output):
        return readings.swaps("\n".join(output))


class DropCachesWritable(FactBase[bool]):
    """True when root may write /proc/sys/vm/drop_caches, the memory gate's lever (tested with
    `test -w`, never written)."""

    command = "! test -w /proc/sys/vm/drop_caches || echo yes"

    @staticmethod
    def default():
        return False

    def process(self, output):
        return output[-1].strip() == "yes"


class ThermalReadings(FactBase[dict]):
    """{zone: {"type", "temp"} or {"type", "error"}} of every /sys/class/thermal/thermal_zone*:
    a zone the watchdog cannot read (readings.thermal_zones leaves it out) is named here."""

    command = ("for z in /sys/class/thermal/thermal_zone*; do [ -d \"$z\" ] || continue; "
               "t=$(cat \"$z/type\" 2>/dev/null) || t=?; "
               "if v=$(cat \"$z/temp\" 2>&1); then echo \"${z##*/} $t ok $v\"; "
               "else echo \"${z##*/} $t error $v\"; fi; done")

    @staticmethod
    def default():
        return {}

    def process(self, output):
        found = {}
        for line in output:
            zone, kind, state, said = (line.split(" ", 3) + ["", "", ""])[:4]
            reading = {"type": kind}
            try:
                if state != "ok":
                    raise ValueError(said)
                reading["temp_c"] = int(said.strip()) / 1000
            except ValueError:
                reading["error"] = said.strip().rsplit(": ", 1)[-1] or "unreadable"
            found[zone] = reading
        return found


class DockerServerVersion(FactBase[str | None]):
    """The Docker engine's version (None: docker answers no server)."""

    command = "docker version --format '{{.Server.Version}}' 2>/dev/null || true"
    requires_command = "docker"

    def process(self, output):
        return output[-1].strip() or None


class CdiDevices(FactBase[list | None]):
    """The CDI devices nvidia-ctk lists (`nvidia-ctk cdi list`), None without nvidia-ctk."""

    command = "nvidia-ctk cdi list 2>/dev/null | grep -v '^INFO' || true"
    requires_command = "nvidia-ctk"

    def process(self, output):
        return [line.strip() for line in output if line.strip()]


class ContainerProbe(FactBase[dict | None]):
    """What a throwaway container of `image` says of itself (files/doctor/container_probe.py:
    versions, PyTorch's CUDA arch list, the GPU it sees), run as the server runs (`--runtime
    nvidia --gpus GPUS`) with no network and removed at once; None when the image is not on the
    box (doctor pulls nothing). {"error": ...} when the container does not run."""

    requires_command = "docker"

    def command(self, image, gpus):
        probe = PROBE.read_text()
        return (f"if docker image inspect {q(image)} >/dev/null 2>&1; then "
                f"docker run --rm --network none --runtime nvidia --gpus {q(gpus)} "
                f"--entrypoint python3 {q(image)} -c {q(probe)} 2>&1; fi")

    def process(self, output):
        try:
            found = json.loads(output[-1])
        except ValueError:
            found = None
        if isinstance(found, dict):
            return found
        said = [line.strip() for line in output if line.strip()]
        return {"error": said[-1][:300] if said else "no output"}


class AptMirror(FactBase[dict | None]):
    """The first http(s) package mirror of APT's sources, and whether it answers within 5 s
    ({"url", "ok", "said"}: files/doctor/mirror_probe.py); None when APT names none (the
    gateway's packages come from it)."""

    @staticmethod
    def command():
        return ("url=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list "
                "/etc/apt/sources.list.d/*.sources 2>/dev/null | grep -E '^(deb|URIs:)' | "
                "grep -oE 'https?://[^ ]+' | head -n 1); [ -n \"$url\" ] || exit 0; "
                f"python3 -c {q(MIRROR_PROBE.read_text())} \"$url\"")

    def process(self, output):
        return json.loads(output[-1])
