"""What serves: the weights, the derived image, and the server as thorfleet-serve and the
watchdog on the box report it (their JSON, through BoxToolFact).
"""

from __future__ import annotations

import json
from shlex import quote as q

from pyinfra.api import FactBase

from thorfleet.settings.layout import (
    BOX_CLEAN,
    BOX_LAYOUT_ENV,
    BOX_LIB,
    BOX_SERVE,
    BOX_WATCHDOG,
    BOX_WEIGHTS,
)


class PinnedWeightsGiB(FactBase[float]):
    """GiB the pinned checkpoint folders (and their unfinished staging folders) already take: space
    the weights need that they already have."""

    def command(self, folders):
        paths = []
        for folder in folders:
            parent, name = folder.rsplit("/", 1)
            paths += [folder, f"{parent}/.{name}.partial"]  # thorfleet-weights' staging folder
        return (f"for d in {' '.join(q(p) for p in paths)}; do [ -d \"$d\" ] && du -sk \"$d\"; "
                "done | awk '{s += $1} END {print s + 0}'")

    def process(self, output):
        return int(output[-1]) / 1024**2


class BoxToolFact(FactBase[dict]):
    """What one of thorfleet's own box tools (files/thor/bin/) answers: the JSON on its last line, run
    with the box's python3. Until the tool (and every file in `needs`) is installed the command
    prints nothing, and the fact is its default()."""

    tool: str  # the tool's path on the box (layout.py)
    needs: tuple[str, ...] = ()  # other files it reads before it can answer

    def tool_command(self, *words):
        """The command that runs the tool with these words once it is installed. Each subclass's
        `command` names its own arguments: pyinfra passes a fact's arguments by the names in its
        command's signature."""
        installed = " && ".join(f"[ -f {q(path)} ]" for path in (self.tool, *self.needs))
        return (f"if {installed}; then python3 {q(self.tool)} "
                f"{' '.join(q(str(word)) for word in words)}; fi")

    def process(self, output):
        return json.loads(output[-1])


class Leftovers(BoxToolFact):
    """What nothing serves any more (files/thor/bin/thorfleet-clean): {"dirs", "images", "contexts"},
    all empty until the tool is installed."""

    tool = BOX_CLEAN

    @staticmethod
    def default():
        return {"dirs": [], "images": [], "contexts": []}

    def command(self, models, contexts, image_name, keep_context, keep_dirs, keep_images, units):
        return self.tool_command(
            "--models", models, "--contexts", contexts, "--image-name", image_name,
            "--keep-context", keep_context,
            *(word for d in keep_dirs for word in ("--keep-dir", d)),
            *(word for i in keep_images for word in ("--keep-image", i)),
            *(word for u in units for word in ("--unit", u)))


class DockerImageLabels(FactBase[dict | None]):
    """Labels of a local Docker image ({} when it has none), or None when the image is not there
    (docker's inspect fails, printing at most an empty line on stdout)."""

    def command(self, ref):
        return (f"docker image inspect --format '{{{{json .Config.Labels}}}}' {q(ref)} "
                "2>/dev/null || true")

    def process(self, output):
        text = "".join(output).strip()
        return (json.loads(text) or {}) if text else None


class DockerImageId(FactBase[str | None]):
    """The ID of a local Docker image (sha256 of its config, the same on every box that has those
    bytes), or None when the image is not there (at most an empty line printed)."""

    def command(self, ref):
        return f"docker image inspect --format '{{{{.Id}}}}' {q(ref)} 2>/dev/null || true"

    def process(self, output):
        return output[-1].strip() or None


class WeightsState(BoxToolFact):
    """Offline check of one pinned checkpoint folder (files/thor/bin/thorfleet-weights verify):
    {"complete": bool, "problems": [...]}."""

    tool = BOX_WEIGHTS

    @staticmethod
    def default():
        return {"complete": False, "problems": ["thorfleet tools not installed"]}

    def command(self, folder, revision):
        return self.tool_command("verify", "--dir", folder, "--revision", revision)


class ServerState(BoxToolFact):
    """What the server runs now (files/thor/bin/thorfleet-serve state): {"active", "enabled",
    "proven_fingerprint", "healthy"}, and with `chat` whether a short chat request answers
    ("chat_ok"). {} until thorfleet-serve and the layout file it reads its paths from are both
    installed."""

    tool = BOX_SERVE
    needs = (BOX_LAYOUT_ENV,)

    @staticmethod
    def default():
        return {}

    def command(self, service, port, chat=False):
        return self.tool_command("state", "--service", service, "--port", port,
                                 *(["--chat"] if chat else []))


class ServerKernels(BoxToolFact):
    """The running server's kernel lines since it started (files/thor/bin/thorfleet-serve kernels,
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
    needs = (BOX_LAYOUT_ENV, f"{BOX_LIB}/readings.py")

    @staticmethod
    def default():
        return None

    def command(self, port):
        return self.tool_command("metrics", "--port", port)

    def process(self, output):
        return json.loads(output[-1])["metrics"]
