"""What `thorfleet doctor` reads from a box besides the deploy's own facts (thorfleet/facts.py).

Each is a pyinfra fact, read in doctor's one round trip (thorfleet/doctor/ask.py), never by a
deploy. Nothing here changes the box: the container probe runs a throwaway container of an image
already there (`--rm`, no network), and only when it is there; caches are read, not dropped.
Parsers shared with the box's watchdog are in thorfleet/readings.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from shlex import quote as q

from pyinfra.api import FactBase

from thorfleet import readings
from thorfleet.facts import BoxToolFact
from thorfleet.settings.layout import BOX_LAYOUT_ENV, BOX_READINGS, BOX_SERVE, BOX_WATCHDOG, FILES

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


class PowerModes(FactBase[dict]):
    """{mode id: name} nvpmodel offers on this release (`nvpmodel -p --verbose`,
    docs/facts.md "The target box")."""

    command = "nvpmodel -p --verbose </dev/null"
    requires_command = "nvpmodel"

    def process(self, output):
        return readings.power_modes(output)


class PowerMasks(FactBase[dict | None]):
    """{mode id: GPU power-gating mask} of /etc/nvpmodel.conf (readings.power_masks), or None
    without the file."""

    command = "! test -f /etc/nvpmodel.conf || cat /etc/nvpmodel.conf"

    def process(self, output):
        return readings.power_masks("\n".join(output))


class ClockLines(FactBase[dict | None]):
    """`jetson_clocks --show` read as the watchdog reads it (readings.clock_lines): the CPU and
    GPU lines thorfleet knows, with "lines" the count of lines it printed."""

    command = "jetson_clocks --show </dev/null"
    requires_command = "jetson_clocks"

    def process(self, output):
        return {**readings.clock_lines(output), "lines": len(output)}


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


class ServerKernels(BoxToolFact):
    """The running server's kernel lines since it started (files/bin/thorfleet-serve kernels,
    the proof's own patterns): {"active", "kernels": {what: line or None}, "marlin", "chosen"};
    {} until thorfleet-serve is installed."""

    tool = BOX_SERVE
    needs = (BOX_LAYOUT_ENV,)

    @staticmethod
    def default():
        return {}

    def command(self, service, port):
        return self.tool_command("kernels", "--service", service, "--port", port)


class ServerMetrics(BoxToolFact):
    """{name: value} of the names the watchdog reads (readings.VLLM_METRICS) on the server's
    /metrics, as the box's watchdog reads them (`thorfleet-watchdog metrics`: the server's key
    sent as a header by root on the box); None until the watchdog is installed or while the
    server does not answer there."""

    tool = BOX_WATCHDOG
    needs = (BOX_LAYOUT_ENV, BOX_READINGS)

    @staticmethod
    def default():
        return None

    def command(self, port):
        return self.tool_command("metrics", "--port", port)

    def process(self, output):
        return json.loads(output[-1])["metrics"]


class HaproxyBuild(FactBase[dict | None]):
    """`haproxy -vv`: {"version", "lines"} (the build's feature lines), None without HAProxy."""

    command = "haproxy -vv 2>&1"
    requires_command = "haproxy"

    def process(self, output):
        version = next((line.split()[2] for line in output
                        if line.startswith("HAProxy version ") and len(line.split()) > 2), None)
        return {"version": version, "lines": [line.strip() for line in output]}


class KeepalivedVersion(FactBase[str | None]):
    """keepalived's version line (`keepalived --version` prints it on stderr), None without it."""

    command = "keepalived --version 2>&1 | head -n 1"
    requires_command = "keepalived"

    def process(self, output):
        return output[0].strip() if output else None


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
