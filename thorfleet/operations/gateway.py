"""The gateway's HAProxy reloaded without dropping a connection, the Thors' firewall, and a box
taken out of rotation and put back through HAProxy's runtime API (around its restart)."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from thorfleet import facts
from thorfleet.operations.commands import fail_host, sh
from thorfleet.run.snapshot import reads
from thorfleet.settings.layout import (
    FIREWALL_TABLE,
    FIREWALL_UNIT,
    GATEWAY_ADMIN_SOCKET,
    GATEWAY_ROTATION,
    GATEWAY_SERVER_STATE,
    GATEWAY_STATE_LOCK,
)

# HAProxy, and socat to speak to its runtime API (Debian's haproxy suggests, not depends on it).
GATEWAY_PACKAGES = ("haproxy", "socat")


@operation(is_idempotent=False)
def haproxy_reloaded(unit="haproxy.service"):
    """HAProxy reloaded without dropping a connection (its master process hands the listening
    socket to the new one), its boxes' states saved first so the reload keeps them: both under the
    state lock thorfleet-rotation sets a state under, so no drain falls between. Called only when
    its config or certificate changed (`_if`)."""
    save = sh(GATEWAY_ROTATION, GATEWAY_ADMIN_SOCKET, GATEWAY_SERVER_STATE, "save")
    locked = sh("flock", GATEWAY_STATE_LOCK, "sh", "-c",
                f"{{ {save} || true; }}; {sh('systemctl', 'reload', unit)}")
    yield (f"if systemctl is-active --quiet {unit}; then {locked}; "
           f"else {sh('systemctl', 'start', unit)}; fi")


@reads(live=lambda **_: (facts.FirewallMark, {}))
@operation()
def firewall(mark, *, live):
    """thorfleet's nftables table live on the box as `mark` says (gateway.firewall_script's mark
    of the script at BOX_FIREWALL) and as it was loaded: the vLLM port answers the gateway and the
    box itself only. A table changed, extended or flushed by hand is loaded again, through its
    unit (one `nft -f` replaces it whole, and the unit records what nft then lists)."""
    if live == mark:
        host.noop("the vLLM port answers the gateway only (nftables table is live)")
        return
    if live == facts.NO_NFT:
        yield fail_host("nft is not installed: the box's vLLM port cannot be closed to all but "
                        "the gateway; install nftables (apt install nftables), then run again")
        return
    yield sh("systemctl", "restart", FIREWALL_UNIT)


@reads(live=lambda **_: (facts.FirewallMark, {}))
@operation()
def no_firewall(*, live):
    """No thorfleet nftables table (no gateway in the inventory: the port answers as before)."""
    if live in (facts.NO_NFT, facts.NO_TABLE):
        host.noop("no thorfleet firewall table")
        return
    yield sh("nft", "delete", "table", *FIREWALL_TABLE)
