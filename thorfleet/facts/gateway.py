"""The gateway: HAProxy's build and its servers' states, keepalived, the level a run set there,
and thorfleet's firewall table on a box (its mark).
"""

from __future__ import annotations

import re
from shlex import quote as q

from pyinfra.api import FactBase

from thorfleet.settings.layout import (
    BOX_FIREWALL_LISTED,
    FIREWALL_TABLE,
    GATEWAY_ADMIN_SOCKET,
    GATEWAY_LEVEL,
    RULESET_INCLUDE,
    SYSTEM_RULESET,
)

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


class RulesetIncludes(FactBase[bool | None]):
    """Whether the system's ruleset (SYSTEM_RULESET) holds thorfleet's include line, whole, on a
    line of its own; None without the file (no nftables package)."""

    def command(self):
        return (f"if [ -f {q(SYSTEM_RULESET)} ]; then "
                f"grep -cxF {q(RULESET_INCLUDE)} {q(SYSTEM_RULESET)} || true; else echo none; fi")

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return None if lines in ([], ["none"]) else int(lines[0]) > 0


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
