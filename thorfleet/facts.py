"""What thorfleet reads from a Thor before deciding what to change. Each fact is one command;
every value put into it is quoted (shlex.quote), the box's paths come from layout.py.

As pyinfra's own facts do, a fact says what it returns in its type, and marks absence by printing
nothing: pyinfra then gives the fact's `default()` (None unless said otherwise), and a command the
box lacks is named in `requires_command`.
"""

from __future__ import annotations

import json
import re
from shlex import quote as q
from typing import NamedTuple

from pyinfra.api import FactBase

from thorfleet import readings
from thorfleet.settings.layout import (
    BOX_CLEAN,
    BOX_FIREWALL_LISTED,
    BOX_LAYOUT_ENV,
    BOX_REBOOT_MARKER,
    BOX_RUN_LOCK_DIR,
    BOX_SERVE,
    BOX_WEIGHTS,
    FILES,
    FIREWALL_TABLE,
    GATEWAY_ADMIN_SOCKET,
    GATEWAY_LEVEL,
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
    """What one of thorfleet's own box tools (files/bin/) answers: the JSON on its last line, run
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
    """What nothing serves any more (files/bin/thorfleet-clean): {"dirs", "images", "contexts"},
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


class PowerMode(FactBase[int | None]):
    """The current nvpmodel mode id (readings.power_mode: the last line of `nvpmodel -q`, after any
    NVPM WARN lines)."""

    command = "nvpmodel -q </dev/null"
    requires_command = "nvpmodel"

    def process(self, output):
        return readings.power_mode(output)


class ClocksLocked(FactBase[bool | None]):
    """True when jetson_clocks has pinned every CPU and the GPU (readings.clocks_locked reads
    `jetson_clocks --show`, the box's watchdog reads it the same way). None without
    jetson_clocks."""

    command = "jetson_clocks --show </dev/null"
    requires_command = "jetson_clocks"

    def process(self, output):
        return readings.clocks_locked(output)


class RebootMarker(FactBase[bool]):
    """True while the reboot marker (layout.BOX_REBOOT_MARKER, in /run) exists: every boot
    empties /run (False: it prints nothing)."""

    command = f"! test -e {q(BOX_REBOOT_MARKER)} || echo yes"

    @staticmethod
    def default():
        return False

    def process(self, output):
        return output[-1] == "yes"


class FileState(FactBase[dict | None]):
    """What is at a file's path (read as root, never through a symbolic link): {"type", "mode",
    "user", "group", "sha256"}; the sha256 only of a regular file (None for a link, a folder...),
    so a link to a copy with the same content is seen as what it is. None when nothing is there."""

    def command(self, path):
        return (f"if [ -e {q(path)} ] || [ -L {q(path)} ]; then stat -c '%a %U %G %F' {q(path)}; "
                f"if [ -f {q(path)} ] && [ ! -L {q(path)} ]; then "
                f"sha256sum {q(path)} | cut -d' ' -f1; fi; fi")

    def process(self, output):
        if not output or not output[0].strip():
            return None
        mode, user, group, kind = output[0].split(" ", 3)
        return {"type": kind, "mode": mode, "user": user, "group": group,
                "sha256": output[1].strip() if len(output) > 1 else None}


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
    """Offline check of one pinned checkpoint folder (files/bin/thorfleet-weights verify):
    {"complete": bool, "problems": [...]}."""

    tool = BOX_WEIGHTS

    @staticmethod
    def default():
        return {"complete": False, "problems": ["thorfleet tools not installed"]}

    def command(self, folder, revision):
        return self.tool_command("verify", "--dir", folder, "--revision", revision)


class ServerState(BoxToolFact):
    """What the server runs now (files/bin/thorfleet-serve state): {"active", "enabled",
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


class PathState(FactBase[dict | None]):
    """What is at `path`: {"type": "directory" | "regular file" | ..., "mode", "user", "group"},
    or None when nothing is."""

    def command(self, path):
        return f"if [ -e {q(path)} ] || [ -L {q(path)} ]; then stat -c '%a %U %G %F' {q(path)}; fi"

    def process(self, output):
        mode, user, group, kind = output[0].split(" ", 3)
        return {"type": kind, "mode": mode, "user": user, "group": group}


class UnitEnabled(FactBase[str | None]):
    """`systemctl is-enabled` of a unit: "enabled", "disabled", "static", ... (None when systemd
    does not know it: it prints nothing on stdout)."""

    def command(self, unit):
        return f"systemctl is-enabled {q(unit)} 2>/dev/null || true"

    def process(self, output):
        return output[-1].strip() or None


class PasswdEntry(FactBase[dict | None]):
    """A user's passwd entry as {"uid", "home", "shell"}, or None when there is no such user."""

    def command(self, user):
        return f"getent passwd {q(user)} || true"

    def process(self, output):
        fields = output[-1].split(":")
        return {"uid": int(fields[2]), "home": fields[5], "shell": fields[6]}


class TreeState(FactBase[dict]):
    """Every file under `path` as {relative path: {"sha256", "mode", "owner"}} ({} when `path` is
    absent); anything that is not a regular file (a link, a fifo) is listed with type "other"."""

    @staticmethod
    def default():
        return {}

    def command(self, path):
        return (f"if [ -d {q(path)} ]; then cd {q(path)} && "
                "find . -type f -exec stat -c 'mode %a %U:%G %n' {} + && "
                "find . ! -type f ! -type d -exec stat -c 'other %F %n' {} + && "
                "find . -type f -exec sha256sum {} +; fi")

    def process(self, output):
        tree = {}
        for line in output:
            if line.startswith("mode "):
                _, mode, owner, name = line.split(" ", 3)
                tree.setdefault(name[2:], {}).update(mode=mode, owner=owner)
            elif line.startswith("other "):
                name = line.rsplit(" ./", 1)[1]
                tree[name] = {"type": "other"}
            else:
                digest, name = line.split("  ", 1)
                tree.setdefault(name[2:], {})["sha256"] = digest
        return tree


class RunLock(FactBase):
    """Take the box for this run, or say who has it: {"held": True} or {"held": False, "why":
    the line naming the run that holds it}. The lock's tool (files/bin/thorfleet-run-lock) is
    sent with the command, so a bare box is held before anything else is read or sent; its
    keeper holds the lock until this run's SSH connection ends. Taking it again with the same
    token (pyinfra runs an operation's body once to plan and once to execute) is a no-op.

    A fact that takes a lock, on purpose: pyinfra reads facts while it plans, before any operation
    runs, and a second run's reads (a half-written file, a fingerprint mid-restart) would plan
    from a box another run is changing. A fact's command is the only thing pyinfra runs on a box
    at plan time, so the lock is taken by the first one read."""

    batched = False  # read alone, before the one-round-trip read of everything else (snapshot.py)

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


# --- the gateway and the Thors' firewall -------------------------------------------------------

class DebInstalled(FactBase[list]):
    """Which of `packages` dpkg has installed (a sorted list; [] when none is)."""

    def command(self, packages):
        words = " ".join(q(p) for p in packages)
        return (f"dpkg-query -W -f='${{Package}} ${{db:Status-Status}}\\n' {words} 2>/dev/null "
                "| awk '$2 == \"installed\" {print $1}' || true")

    def default(self):
        return []

    def process(self, output):
        return sorted(line.strip() for line in output if line.strip())


class UnitActive(FactBase[str]):
    """`systemctl is-active` of a unit: "active", "inactive", "failed", ..."""

    def command(self, unit):
        return f"systemctl is-active {q(unit)} 2>/dev/null || true"

    def default(self):
        return "unknown"

    def process(self, output):
        return output[-1].strip() or "unknown"


# What FirewallMark reads when no mark of thorfleet's is the answer: no nft on the box, no
# thorfleet table, a table that is not what was loaded (a rule added or taken out by hand), a
# table without a mark.
NO_NFT, NO_TABLE, CHANGED, UNMARKED = "no nft", "no table", "changed", "unmarked"


class FirewallMark(FactBase[str]):
    """The comment on the drop rule of thorfleet's nftables table (the mark of
    gateway.firewall_script: which version of the script is live), or why there is none: CHANGED
    when the table as nft lists it now is not what was loaded (its digest, BOX_FIREWALL_LISTED),
    NO_TABLE, NO_NFT or UNMARKED. Always a string: a mark is `thorfleet <16 hex>`, which none of
    those is."""

    def command(self):
        family, table = FIREWALL_TABLE
        return (f"if ! command -v nft >/dev/null 2>&1; then echo {q(NO_NFT)}; "
                f"elif ! nft list table {family} {table} >/dev/null 2>&1; then echo {q(NO_TABLE)}; "
                f"elif [ \"$(nft -s list table {family} {table} | sha256sum)\" != "
                f"\"$(cat {q(BOX_FIREWALL_LISTED)} 2>/dev/null)\" ]; then echo {q(CHANGED)}; "
                f"else nft list table {family} {table} | grep -o 'comment \"thorfleet [0-9a-f]*\"' "
                "| sed 's/^comment \"//; s/\"$//' | tail -n 1; echo; fi")

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return lines[0] if lines else UNMARKED


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


class FirstLine(FactBase[str | None]):
    """The first line of a file (None when there is none): whose a config file is, by its
    header."""

    def command(self, path):
        return f"head -n 1 {q(path)} 2>/dev/null || true"

    def process(self, output):
        return output[0] if output else None


class DoorLevel(FactBase[tuple[int, str] | None]):
    """What the last run set on this gateway (layout.GATEWAY_LEVEL): (since, digest), or None
    when no run has, or the file is not one line of `<digits> <hex>`."""

    def command(self):
        return f"cat {q(GATEWAY_LEVEL)} 2>/dev/null || true"

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        found = re.fullmatch(r"([0-9]+) ([0-9a-f]+)", lines[0]) if len(lines) == 1 else None
        return (int(found[1]), found[2]) if found else None


# srv_admin_state is a bit field (HAProxy's include/haproxy/server-t.h, SRV_ADMF_*): FMAINT 0x01,
# IMAINT 0x02, CMAINT 0x04, FDRAIN 0x08, IDRAIN 0x10, RMAINT 0x20, HMAINT 0x40.
MAINT_BITS, DRAIN_BITS = 0x01 | 0x02 | 0x04 | 0x20 | 0x40, 0x08 | 0x10


def admin_state(bits: int) -> str:
    return "maint" if bits & MAINT_BITS else "drain" if bits & DRAIN_BITS else "ready"


class GatewayServers(FactBase[dict]):
    """{server: {"admin": "ready"|"drain"|"maint", "backend": its backend}} of every box at a
    gateway (one backend per model the fleet serves), from HAProxy's `show servers state` ({}
    when HAProxy or its runtime API is not there yet)."""

    def command(self):
        return (f"test -S {q(GATEWAY_ADMIN_SOCKET)} || exit 0; "
                f"echo {q('show servers state')} | "
                f"socat -t 5 stdio UNIX-CONNECT:{q(GATEWAY_ADMIN_SOCKET)} 2>/dev/null || true")

    def default(self):
        return {}

    def process(self, output):
        # be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state ... (the header
        # line, a "# " line, names them; version "1" first)
        found = {}
        for line in output:
            fields = line.split()
            if len(fields) > 6 and not line.startswith("#") and fields[0].isdigit():
                found[fields[3]] = {"admin": admin_state(int(fields[6])), "backend": fields[1]}
        return found
