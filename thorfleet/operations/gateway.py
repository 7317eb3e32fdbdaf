"""The gateway's HAProxy reloaded without dropping a connection, the Thors' firewall, and a box
taken out of rotation and put back through HAProxy's runtime API (around its restart)."""

from __future__ import annotations

from shlex import quote as q

from pyinfra import host
from pyinfra.api import operation

from thorfleet import facts
from thorfleet.operations.commands import fail_host, sh
from thorfleet.run.snapshot import reads
from thorfleet.settings.layout import (
    FIREWALL_TABLE,
    FIREWALL_UNIT,
    GATEWAY_ADMIN_SOCKET,
    GATEWAY_LEVEL,
    GATEWAY_ROTATION,
    GATEWAY_SERVER_STATE,
    GATEWAY_STATE_LOCK,
    KEEPALIVED_CONFIG,
    KEEPALIVED_UNIT,
    RULESET_INCLUDE,
    SYSTEM_RULESET,
)

# HAProxy, and socat to speak to its runtime API (Debian's haproxy suggests, not depends on it).
GATEWAY_PACKAGES = ("haproxy", "socat")
# With gateway_virtual_ip: keepalived holds it; curl reads the other gateway's level.
SHARED_ADDRESS_PACKAGES = ("keepalived", "curl")


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


@reads(live=lambda **_: (facts.gateway.FirewallMark, {}))
@operation()
def firewall(mark, *, live):
    """thorfleet's nftables table live on the box as `mark` says (gateway.firewall_script's mark
    of the script at BOX_FIREWALL) and as it was loaded: the vLLM port answers the gateway and the
    box itself only. A table changed, extended or flushed by hand is loaded again, through its
    unit (one `nft -f` replaces it whole, and the unit records what nft then lists)."""
    if live == mark:
        host.noop("the vLLM port answers the gateway only (nftables table is live)")
        return
    if live == facts.gateway.NO_NFT:
        yield fail_host("nft is not installed: the box's vLLM port cannot be closed to all but "
                        "the gateway; install nftables (apt install nftables), then run again")
        return
    yield sh("systemctl", "restart", FIREWALL_UNIT)


@reads(live=lambda **_: (facts.gateway.FirewallMark, {}))
@operation()
def no_firewall(*, live):
    """No thorfleet nftables table (no gateway in the inventory: the port answers as before)."""
    if live in (facts.gateway.NO_NFT, facts.gateway.NO_TABLE):
        host.noop("no thorfleet firewall table")
        return
    yield sh("nft", "delete", "table", *FIREWALL_TABLE)


@reads(found=lambda **_: (facts.gateway.RulesetIncludes, {}))
@operation()
def in_system_ruleset(present=True, *, found):
    """The system's ruleset (SYSTEM_RULESET) ends by including thorfleet's script, or does not
    (`present`). Its `flush ruleset` empties every table, thorfleet's too, and the watchdog can
    load it again only after: a prober saw the port answer in between. Included, the one `nft
    -f` that empties the table fills it again, in one transaction. A box without the file (no
    nftables package) is left alone: nothing loads a ruleset there but thorfleet's unit."""
    if found is None:
        host.noop(f"no {SYSTEM_RULESET}: thorfleet's unit alone loads its table")
        return
    if found == present:
        host.noop(f"{SYSTEM_RULESET} {'includes' if present else 'does not include'} "
                  "thorfleet's firewall")
        return
    ruleset = q(SYSTEM_RULESET)
    if present:  # on a line of its own, even after a last line without its newline
        yield (f"{{ [ -z \"$(tail -c1 {ruleset})\" ] || echo; echo {q(RULESET_INCLUDE)}; }}"
               f" >> {ruleset}")
        return
    # the line whole (sed's basic regex: the dots escaped, the rest as it is)
    whole = "^" + RULESET_INCLUDE.replace(".", "\\.") + "$"
    yield sh("sed", "-i", f"\\#{whole}#d", SYSTEM_RULESET)


@reads(live=lambda **_: (facts.gateway.DoorLevel, {}))
@operation()
def level_recorded(since, digest, *, live):
    """The gateway says what this run set on it: `digest` (GatewaySettings.level_digest) and
    `since`, when a run first set it (this run's start, the same on both gateways). A re-run that
    sets the same keeps the date: only a change dates it again, so the other gateway, reading
    a later date and another digest, knows it holds what this one missed."""
    if live is not None and live[1] == digest:
        host.noop(f"level: {digest[:12]} set since {live[0]}")
        return
    tmp = f"{GATEWAY_LEVEL}.tmp"
    yield (f"umask 077 && printf '%s %s\\n' {sh(since, digest)} > {sh(tmp)} && "
           f"mv {sh(tmp, GATEWAY_LEVEL)}")


def shared_address_problem(address, virtual, interface) -> str | None:
    """Why keepalived cannot hold `virtual` (gateway_virtual_ip) beside `address` on this
    gateway, `interface` its fact (InterfaceOf), or None. Its prefix must be the LAN's: keepalived
    adds the address with it, and so a route to its network from the shared address; a longer one
    (10.0.0.50/25 on a /24) makes the holder dial the boxes of that network from an address
    their firewall does not admit, and it marks them all down."""
    if interface is None:
        return (f"no interface of this gateway has {address} (gateway_fleet_address, else "
                "ssh_hostname): keepalived adds gateway_virtual_ip beside it; set "
                "gateway_fleet_address to this gateway's own address on the LAN the gateways "
                "share")
    host_part, _, prefix = virtual.partition("/")
    if int(prefix) != interface.prefix:
        return (f"gateway_virtual_ip {virtual} has prefix /{prefix}, but this gateway's LAN "
                f"({address} on {interface.name}) is /{interface.prefix}: keepalived would "
                "route that network from the shared address; set gateway_virtual_ip to "
                f"{host_part}/{interface.prefix}")
    return None


@reads(interface=lambda address, **_: (facts.box.InterfaceOf, {"address": address}))
@operation()
def holds_address(address, virtual, *, interface):
    """This gateway has `address` (gateway_fleet_address) on an interface of the LAN that
    `virtual` (gateway_virtual_ip) is written for; a gateway without it fails, saying why."""
    problem = shared_address_problem(address, virtual, interface)
    if problem is None:
        host.noop(f"{address} is on {interface.name}, /{interface.prefix} as {virtual}")
        return
    yield fail_host(problem)


@reads(header=lambda **_: (facts.system.FirstLine, {"path": KEEPALIVED_CONFIG}))
@operation()
def no_shared_address(*, header):
    """No gateway_virtual_ip: keepalived stopped and thorfleet's config of it removed, so the
    address goes; a keepalived config of the operator's own (no thorfleet header) is left alone."""
    if not header or not header.startswith("# Managed by thorfleet"):
        host.noop("no keepalived config of thorfleet's")
        return
    yield (f"systemctl disable --now {sh(KEEPALIVED_UNIT)} 2>/dev/null || true; "
           f"rm -f {sh(KEEPALIVED_CONFIG)}")
