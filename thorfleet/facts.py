"""What thorfleet reads from a Thor before deciding what to change. Each fact is one command;
every value put into it is quoted (shlex.quote), the box's paths come from layout.py."""

from __future__ import annotations

import json
import re
from shlex import quote as q

from pyinfra.api import FactBase

from thorfleet.layout import (
    BOX_CLEAN,
    BOX_LAYOUT_ENV,
    BOX_REBOOT_MARKER,
    BOX_RUN_LOCK_DIR,
    BOX_SERVE,
    BOX_WEIGHTS,
    FILES,
)


class L4TRelease(FactBase):
    """The L4T release as "38.2" from /etc/nv_tegra_release, or None on a box that is not a Jetson."""

    command = "cat /etc/nv_tegra_release 2>/dev/null || true"

    def process(self, output):
        # "# R38 (release), REVISION: 2.0, GCID: ..., BOARD: generic, EABI: aarch64, DATE: ..."
        match = re.match(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", "\n".join(output))
        return f"{match.group(1)}.{match.group(2)}" if match else None


class MemTotalGiB(FactBase):
    """Total memory in GiB (MemTotal)."""

    command = "awk '/^MemTotal:/ {print $2}' /proc/meminfo"

    def process(self, output):
        return int(output[0]) / 1024**2


class FreeDiskGiB(FactBase):
    """Free disk in GiB on the filesystem that holds `path` (or its nearest existing parent)."""

    def command(self, path):
        return (
            f"p={q(path)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
            "df -Pk \"$p\" | awk 'NR==2 {print $4}'"
        )

    def process(self, output):
        return int(output[0]) / 1024**2


class PinnedWeightsGiB(FactBase):
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


class Leftovers(FactBase):
    """What nothing serves any more (files/bin/thorfleet-clean): {"dirs", "images", "contexts"},
    all empty until the tool is installed."""

    def command(self, models, contexts, image_name, keep_context, keep_dirs, keep_images, units):
        tool = q(BOX_CLEAN)
        args = [f"--models {q(models)}", f"--contexts {q(contexts)}",
                f"--image-name {q(image_name)}", f"--keep-context {q(keep_context)}",
                *(f"--keep-dir {q(d)}" for d in keep_dirs),
                *(f"--keep-image {q(i)}" for i in keep_images),
                *(f"--unit {q(u)}" for u in units)]
        return (f"if [ -f {tool} ]; then python3 {tool} {' '.join(args)}; "
                """else echo '{"dirs": [], "images": [], "contexts": []}'; fi""")

    def process(self, output):
        return json.loads(output[-1])


class DockerRuntimes(FactBase):
    """Names of the runtimes the Docker engine offers (`nvidia` is needed), or None without Docker."""

    command = "docker info --format '{{json .Runtimes}}'"
    requires_command = "docker"

    def process(self, output):
        return sorted(json.loads("".join(output)))


class SudoWorks(FactBase):
    """True when the deploy user can run sudo without a password prompt."""

    command = "sudo -n true >/dev/null 2>&1 && echo yes || echo no"

    def process(self, output):
        return output[-1] == "yes"


class PowerMode(FactBase):
    """The current nvpmodel mode id: the last line of `nvpmodel -q`, after any NVPM WARN lines."""

    command = "nvpmodel -q </dev/null"
    requires_command = "nvpmodel"

    def process(self, output):
        return int(output[-1].strip())


class ClocksLocked(FactBase):
    """True when jetson_clocks has pinned every CPU and the GPU: MinFreq == MaxFreq on each `cpuN`
    line and on each GPU line of --show. On Thor the GPU lines are its devfreq devices
    (`gpu-gpc-0`, `gpu-nvd-0`), not a line starting `GPU` as on Orin; EMC's MinFreq differs from
    its MaxFreq even when locked, so EMC is not read (FACTS.md, "Thor realities")."""

    command = "jetson_clocks --show </dev/null"
    requires_command = "jetson_clocks"

    def process(self, output):
        kinds = {"cpu": [], "gpu": []}
        for line in output:
            freqs = re.search(r"MinFreq=(\d+)\s+MaxFreq=(\d+)", line)
            name = line.strip().split(" ", 1)[0].rstrip(":").lower()
            if not freqs:
                continue
            if re.fullmatch(r"cpu\d+", name):
                kinds["cpu"].append(freqs)
            elif name.startswith("gpu"):  # "gpu-gpc-0", "gpu-nvd-0" (Thor) or "GPU" (Orin)
                kinds["gpu"].append(freqs)
        # no GPU line read is not "locked": a format we do not know must not pass as locked
        return all(kinds.values()) and all(
            f.group(1) == f.group(2) for found in kinds.values() for f in found)


class RebootMarker(FactBase):
    """True while the reboot marker (layout.BOX_REBOOT_MARKER, in /run) exists: every boot
    empties /run."""

    command = f"test -e {q(BOX_REBOOT_MARKER)} && echo yes || echo no"

    def process(self, output):
        return output[-1] == "yes"


class FileState(FactBase):
    """sha256, mode and owner of a file (read as root), or None when it does not exist."""

    def command(self, path):
        return (
            f"if [ -f {q(path)} ]; then sha256sum {q(path)} | cut -d' ' -f1; "
            f"stat -c '%a %U %G' {q(path)}; fi"
        )

    def process(self, output):
        if len(output) < 2:
            return None
        mode, user, group = output[1].split()
        return {"sha256": output[0], "mode": mode, "user": user, "group": group}


class DockerImageLabels(FactBase):
    """Labels of a local Docker image, or None when the image is not there."""

    def command(self, ref):
        return (
            f"docker image inspect --format '{{{{json .Config.Labels}}}}' {q(ref)} 2>/dev/null "
            "|| echo absent"
        )

    def process(self, output):
        text = "".join(output)
        return None if text == "absent" else (json.loads(text) or {})


class DockerImageId(FactBase):
    """The ID of a local Docker image (sha256 of its config, the same on every box that has those
    bytes), or None when the image is not there."""

    def command(self, ref):
        return f"docker image inspect --format '{{{{.Id}}}}' {q(ref)} 2>/dev/null || true"

    def process(self, output):
        return output[-1].strip() if output and output[-1].strip() else None


class WeightsState(FactBase):
    """Offline check of one pinned checkpoint folder: {"complete": bool, "problems": [...]}."""

    def command(self, folder, revision):
        tool = q(BOX_WEIGHTS)
        return (
            f"if [ -f {tool} ]; then "
            f"python3 {tool} verify --dir {q(folder)} --revision {q(revision)}; "
            "else echo '{\"complete\": false, \"problems\": [\"thorfleet tools not installed\"]}'; fi"
        )

    def process(self, output):
        return json.loads(output[-1])


class ServerState(FactBase):
    """What the server runs now: {"active", "enabled", "proven_fingerprint", "healthy"}, and with
    `chat` whether a short chat request answers ("chat_ok"). {} until thorfleet-serve and the
    layout file it reads its paths from are both installed."""

    def command(self, service, port, chat=False):
        tool = q(BOX_SERVE)
        extra = " --chat" if chat else ""
        return (
            f"if [ -f {tool} ] && [ -f {q(BOX_LAYOUT_ENV)} ]; then "
            f"python3 {tool} state --service {q(service)} --port {q(str(port))}{extra}; "
            "else echo '{}'; fi"
        )

    def process(self, output):
        return json.loads(output[-1])


class PathState(FactBase):
    """What is at `path`: {"type": "directory" | "regular file" | ..., "mode", "user", "group"},
    or None when nothing is."""

    def command(self, path):
        return f"if [ -e {q(path)} ] || [ -L {q(path)} ]; then stat -c '%a %U %G %F' {q(path)}; fi"

    def process(self, output):
        mode, user, group, kind = output[0].split(" ", 3)
        return {"type": kind, "mode": mode, "user": user, "group": group}


class UnitEnabled(FactBase):
    """`systemctl is-enabled` of a unit: "enabled", "disabled", "static", ... ("" when unknown)."""

    def command(self, unit):
        return f"systemctl is-enabled {q(unit)} 2>/dev/null || true"

    def process(self, output):
        return output[-1].strip() if output else ""


class PasswdEntry(FactBase):
    """A user's passwd entry as {"uid", "home", "shell"}, or None when there is no such user."""

    def command(self, user):
        return f"getent passwd {q(user)} || true"

    def process(self, output):
        fields = output[-1].split(":")
        return {"uid": int(fields[2]), "home": fields[5], "shell": fields[6]}


class TreeState(FactBase):
    """Every file under `path` as {relative path: {"sha256", "mode"}} ({} when `path` is absent)."""

    @staticmethod
    def default():
        return {}

    def command(self, path):
        return (f"if [ -d {q(path)} ]; then cd {q(path)} && "
                "find . -type f -exec stat -c 'mode %a %n' {} + && "
                "find . -type f -exec sha256sum {} +; fi")

    def process(self, output):
        tree = {}
        for line in output:
            if line.startswith("mode "):
                _, mode, name = line.split(" ", 2)
                tree.setdefault(name[2:], {})["mode"] = mode
            else:
                digest, name = line.split("  ", 1)
                tree.setdefault(name[2:], {})["sha256"] = digest
        return tree


class RunLock(FactBase):
    """Take the box for this run, or say who has it: {"held": True} or {"held": False, "why":
    the line naming the run that holds it}. The lock's tool (files/bin/thorfleet-run-lock) is
    sent with the command, so a bare box is held before anything else is read or sent; its
    keeper holds the lock until this run's SSH connection ends. Taking it again with the same
    token (pyinfra runs an operation's body once to plan and once to execute) is a no-op."""

    def command(self, holder, token, wait_s):
        tool = f"{BOX_RUN_LOCK_DIR}/thorfleet-run-lock"
        source = (FILES / "bin" / "thorfleet-run-lock").read_text()
        take = " ".join(q(str(word)) for word in (
            "python3", tool, "take", "--dir", BOX_RUN_LOCK_DIR, "--holder", holder,
            "--token", token, "--wait", wait_s))
        return (f"mkdir -p -m 755 {q(BOX_RUN_LOCK_DIR)} && "
                f"cat > {q(tool)}.new <<'THORFLEET_RUN_LOCK'\n{source}THORFLEET_RUN_LOCK\n"
                f"mv -f {q(tool)}.new {q(tool)} && {take} 2>&1; echo \"rc=$?\"")

    def process(self, output):
        status = output[-1] if output and output[-1].startswith("rc=") else "rc=?"
        if status == "rc=0":
            return {"held": True, "why": None}
        said = [line for line in output[:-1] if "thorfleet-run-lock:" in line]
        why = said[-1].split("thorfleet-run-lock: ", 1)[-1] if said else \
            f"the run lock failed ({status}): {' / '.join(output[-3:])}"
        return {"held": False, "why": why}
