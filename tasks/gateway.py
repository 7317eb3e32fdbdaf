"""Gateway: one HTTPS endpoint in front of the Thors, and each Thor answering only it.

On the gateway host (inventory group `gateway`): HAProxy and socat from the distribution's
packages, the certificate (the fleet CA's or the operator's), the config checked by `haproxy -c`
before it goes live, and a reload that drops no connection. Each box takes max_num_seqs requests
at a time, the rest queue at the gateway; a box that refuses a connection is skipped.

With gateway_virtual_ip (two gateways, or one that may get a second): keepalived from the
distribution's packages holds the address on one of them, and checks that HAProxy runs there and
that the gateway is level with the other (it never takes the address with what a run it missed
has replaced). Both carry one config, one certificate, the same client keys.

On each Thor: with a gateway in the inventory, an nftables table lets only the gateway (and the
box itself) reach the vLLM port, now and at every boot; without one, no table (the port answers
as it did). The drain around a restart is the verification step's (operations/verification.py).
"""

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files as pyinfra_files
from pyinfra.operations import systemd

from thorfleet import facts
from thorfleet.gateway.config import (
    GATEWAY_FIREWALL,
    GATEWAY_FIREWALL_DROPIN,
    firewall_script,
)
from thorfleet.operations import files, gateway, preflight, system
from thorfleet.run.runstate import run_state
from thorfleet.run.snapshot import read
from thorfleet.settings.layout import (
    BOX_ETC,
    BOX_FIREWALL,
    BOX_UNIT_DIR,
    FIREWALL_DROPIN,
    FIREWALL_UNIT,
    GATEWAY_BOX_KEY_MAP,
    GATEWAY_CLASS_MAP,
    GATEWAY_CLIENTS_MAP,
    GATEWAY_CONFIG,
    GATEWAY_DOOR_CHECK,
    GATEWAY_DOOR_USAGE,
    GATEWAY_DOOR_USAGE_CONFIG,
    GATEWAY_DOOR_USAGE_STATE,
    GATEWAY_DOOR_USAGE_UNIT,
    GATEWAY_FILES,
    GATEWAY_INFLIGHT_MAP,
    GATEWAY_MODELS_MAP,
    GATEWAY_PEER_LEVEL,
    GATEWAY_PEM,
    GATEWAY_POOLS_MAP,
    GATEWAY_RATE_MAP,
    GATEWAY_ROTATION,
    GATEWAY_STATE_DROPIN,
    KEEPALIVED_CONFIG,
    KEEPALIVED_UNIT,
    THOR_FILES,
)

HAPROXY_UNIT = "haproxy.service"
KEEPALIVED_DROPINS = f"{BOX_UNIT_DIR}/{KEEPALIVED_UNIT}.d"


@deploy("Gateway")
def run(g, lock=True):
    if lock:  # a gateway that is a Thor too is held by its preflight
        this_run = run_state(host.state)
        preflight.box_held(name="Hold the gateway for this run (one thorfleet run at a time)",
                           holder=this_run.holder, token=this_run.token,
                           wait_s=g.preflight_lock_wait_s)
    system.packages(name="Install HAProxy and socat (the distribution's packages)",
                    packages=gateway.GATEWAY_PACKAGES)
    files.directory(name="Create the folder of the gateway's certificate (root-only)",
                    path=GATEWAY_PEM.rsplit("/", 1)[0], mode="700")
    pem = files.secret_file(name="Install the gateway's certificate and key (root-only)",
                            path=GATEWAY_PEM, src=StringIO(g.pem))
    files.whole_file(name="Install the rotation tool (drain, ready through the runtime API)",
                     src=str(GATEWAY_FILES / "bin" / "thorfleet-rotation"), path=GATEWAY_ROTATION,
                     mode="755")
    keys = _door_maps(g)  # before the config: `haproxy -c` reads the maps it names
    _runtime_maps(g)  # ...those the door's programs keep too
    # before the config too: it names the level file. A run dying before the reload leaves it
    # unread: HAProxy reads it with its config, and the check asks HAProxy (door-check)
    level = _level(g)
    config = files.whole_file(
        name=f"Write HAProxy's config: {len(g.backends)} box(es), queue "
             f"{g.gateway_queue_timeout_s}s (haproxy -c checks it before it goes live)",
        src=StringIO(g.config_text), path=GATEWAY_CONFIG, mode="644",
        check=("haproxy", "-c", "-q", "-f"))
    files.directory(name="Create HAProxy's drop-in folder",
                    path=GATEWAY_STATE_DROPIN.rsplit("/", 1)[0], mode="755")
    dropin = files.whole_file(
        name="Keep the boxes' states across HAProxy's restarts (a drop-in saves them at its stop)",
        src=str(GATEWAY_FILES / "haproxy-state.conf"), path=GATEWAY_STATE_DROPIN, mode="644")
    systemd.daemon_reload(name="systemd reads the drop-in", _if=dropin.did_change)
    files.unit_enabled(name="Enable HAProxy at boot", unit=HAPROXY_UNIT)
    gateway.haproxy_reloaded(name="Reload HAProxy for its new config (no connection dropped)",
                     unit=HAPROXY_UNIT,
                     _if=lambda: config.did_change() or pem.did_change() or keys() or level())
    system.running(name="HAProxy is running", unit=HAPROXY_UNIT)
    _door_usage(g)
    _shared_address(g)


def _level(g):
    """With gateway_virtual_ip: what this run sets here, recorded for HAProxy to answer both
    gateways' checks with (a digest, dated by the run that first set it; claimed once HAProxy
    reloads). Returns whether it changed."""
    if not g.gateway_virtual_ip:
        return lambda: False
    op = gateway.level_recorded(name="Record what this run sets here (the other gateway reads it)",
                                since=run_state(host.state).started, digest=g.level_digest)
    return op.did_change


def _shared_address(g):
    """gateway_virtual_ip held by keepalived on one gateway at a time; without it, no keepalived
    of thorfleet's."""
    if not g.gateway_virtual_ip:
        gateway.no_shared_address(name="No gateway_virtual_ip: no keepalived of thorfleet's")
        _no_peer_firewall()
        return
    system.packages(name="Install keepalived and curl (the distribution's packages)",
                    packages=gateway.SHARED_ADDRESS_PACKAGES)
    files.whole_file(name="Install keepalived's check (HAProxy runs; this gateway is level)",
                     src=str(GATEWAY_FILES / "bin" / "thorfleet-door-check"), path=GATEWAY_DOOR_CHECK,
                     mode="755")
    files.directory(name="Create the folder of what the other gateway last said",
                    path=GATEWAY_PEER_LEVEL.rsplit("/", 1)[0], mode="700")
    found = read(facts.box.InterfaceOf, address=g.own_address)
    gateway.holds_address(name=f"{g.own_address} is on the LAN {g.gateway_virtual_ip} is for",
                          address=g.own_address, virtual=g.gateway_virtual_ip)
    if gateway.shared_address_problem(g.own_address, g.gateway_virtual_ip, found):
        return  # failed above, naming the fix: nothing of keepalived written
    interface = found.name
    firewall = _peer_firewall(g)
    held_by = " or ".join(name for name, _ in g.pair)
    config = files.whole_file(
        name=f"Write keepalived's config: {g.gateway_virtual_ip} held by {held_by} "
             "(keepalived -t checks it)",
        src=StringIO(g.keepalived_text(interface)), path=KEEPALIVED_CONFIG, mode="644",
        check=("keepalived", "--config-test", "-f"))
    files.unit_enabled(name="Enable keepalived at boot", unit=KEEPALIVED_UNIT)
    system.reloaded(name="Reload keepalived for its new config and firewall (the address stays put)",
                    unit=KEEPALIVED_UNIT, _if=lambda: config.did_change() or firewall())
    system.running(name="keepalived is running", unit=KEEPALIVED_UNIT)


def _peer_firewall(g):
    """VRRP, the level port and the clients table's peers port answer the other gateway only:
    an nftables table keepalived's drop-in loads before keepalived starts (and at its reloads).
    Returns whether it changed."""
    system.packages(name="Install nftables (the distribution's package)", packages=("nftables",))
    peers = " and ".join(address for _, address in g.peers)
    script = files.whole_file(
        name=f"Write the gateways' firewall: VRRP, the level port and the peers port answer "
             f"{peers} only (nft -c checks it)",
        src=StringIO(g.peer_firewall), path=GATEWAY_FIREWALL, mode="644", check=("nft", "-c", "-f"))
    files.directory(name="Create keepalived's drop-in folder", path=KEEPALIVED_DROPINS, mode="755")
    dropin = files.whole_file(
        name="keepalived starts only once the gateways' firewall is loaded",
        src=str(GATEWAY_FILES / "systemd" / GATEWAY_FIREWALL_DROPIN),
        path=f"{KEEPALIVED_DROPINS}/{GATEWAY_FIREWALL_DROPIN}", mode="644")
    systemd.daemon_reload(name="systemd reads keepalived's drop-in", _if=dropin.did_change)
    return lambda: script.did_change() or dropin.did_change()


def _no_peer_firewall():
    files.absent(name="No gateway_virtual_ip: keepalived loads no gateways' firewall",
                 path=f"{KEEPALIVED_DROPINS}/{GATEWAY_FIREWALL_DROPIN}")
    files.absent(name="No gateway_virtual_ip: no gateways' firewall script", path=GATEWAY_FIREWALL)


MAPS_HOLD = {GATEWAY_CLIENTS_MAP: "the door's key digests (each client's, or the fleet's)",
             GATEWAY_BOX_KEY_MAP: "the key the door sends the boxes",
             GATEWAY_INFLIGHT_MAP: "each client's max_inflight",
             GATEWAY_RATE_MAP: "each client's requests_per_minute",
             GATEWAY_CLASS_MAP: "each client's queue class (its priority)",
             GATEWAY_POOLS_MAP: "the pools each client may call",
             GATEWAY_MODELS_MAP: "each client's /v1/models"}


def _door_maps(g):
    """What opens the door (each client's key, or the fleet's one key, by its digest), the key
    the door sends the boxes and each client's policy, in root-only maps HAProxy reads, written
    before the config that names them; a policy map no config names (no gateway_clients) goes.
    Returns whether any changed: a reload then (idle connections close, so a revoked key's next
    request comes on a new one, and is refused)."""
    ops = [files.secret_file(name=f"Write the map of {MAPS_HOLD[path]} (root-only)", path=path,
                             src=StringIO(text)) for path, text in g.maps.items()]
    for path in set(MAPS_HOLD) - set(g.maps):
        files.absent(name=f"No gateway_clients: no map of {MAPS_HOLD[path]}", path=path)
    return lambda: any(op.did_change() for op in ops)


def _runtime_maps(g):
    """With gateway_clients, the budget map (thorfleet-door-usage's, in its state folder): made
    empty when missing, never written (pyinfra's files.file touches no content), so a run
    leaves every client the door holds over a budget held."""
    if not g.runtime_maps:
        return
    files.directory(name="Create the usage service's state folder (root-only)",
                    path=GATEWAY_DOOR_USAGE_STATE, mode="700")
    for path in g.runtime_maps:
        pyinfra_files.file(name="Make the budget map empty when missing (the usage service "
                                "keeps it)", path=path, user="root", group="root", mode="600")


def _door_usage(g):
    """With gateway_clients, each client's counts served to Prometheus on loopback and its
    token budgets held at the door (files/gateway/bin/thorfleet-door-usage, from HAProxy's table and
    the boxes' counts, by the config written here); without, none of it."""
    unit_path = f"{BOX_UNIT_DIR}/{GATEWAY_DOOR_USAGE_UNIT}"
    if not g.gateway_clients:
        system.stopped(name="No gateway_clients: no usage service", unit=GATEWAY_DOOR_USAGE_UNIT)
        files.absent(name="No gateway_clients: no usage service at boot",
                     path=f"{BOX_UNIT_DIR}/multi-user.target.wants/{GATEWAY_DOOR_USAGE_UNIT}")
        files.absent(name="No gateway_clients: no usage service unit", path=unit_path)
        files.absent(name="No gateway_clients: no usage service tool", path=GATEWAY_DOOR_USAGE)
        files.absent(name="No gateway_clients: no usage service config",
                     path=GATEWAY_DOOR_USAGE_CONFIG)
        files.absent(name="No gateway_clients: no budget map, nor the boxes' last counts",
                     path=GATEWAY_DOOR_USAGE_STATE)
        return
    tool = files.whole_file(name="Install the usage service (each client's counts and budgets)",
                            src=str(GATEWAY_FILES / "bin" / "thorfleet-door-usage"),
                            path=GATEWAY_DOOR_USAGE, mode="755")
    files.directory(name=f"Create {BOX_ETC}", path=BOX_ETC, mode="755")
    budgets = sum(v is not None for p in g.policies.values() for v in p.budgets.values())
    config = files.whole_file(
        name=f"Write the usage service's config: {len(g.backends)} box(es) asked every "
             f"{g.usage_config['interval_s']} s, {budgets} token budget(s)",
        src=StringIO(g.usage_config_text), path=GATEWAY_DOOR_USAGE_CONFIG, mode="644")
    unit = files.whole_file(name="Install its unit (127.0.0.1:9106, for Prometheus)",
                            src=str(GATEWAY_FILES / "systemd" / GATEWAY_DOOR_USAGE_UNIT), path=unit_path,
                            mode="644")
    systemd.daemon_reload(name="systemd reads the usage service's unit", _if=unit.did_change)
    files.unit_enabled(name="Enable the usage service at boot", unit=GATEWAY_DOOR_USAGE_UNIT)
    system.reloaded(name="Restart the usage service for its new code or config",
                    unit=GATEWAY_DOOR_USAGE_UNIT, restart=True,
                    _if=lambda: tool.did_change() or unit.did_change() or config.did_change())
    system.running(name="The usage service is running", unit=GATEWAY_DOOR_USAGE_UNIT)


@deploy("Firewall")
def box(settings):
    unit_path = f"{BOX_UNIT_DIR}/{FIREWALL_UNIT}"
    dropin_dir = f"{BOX_UNIT_DIR}/{settings.service_name}.service.d"
    if settings.gateway_sources is None:
        # disabled first: the watchdog loads an enabled unit's table again once it is gone
        files.absent(name="No gateway: no firewall unit",
                     path=f"{BOX_UNIT_DIR}/multi-user.target.wants/{FIREWALL_UNIT}")
        gateway.in_system_ruleset(name="No gateway: the system's nftables ruleset includes no "
                                       "firewall of thorfleet's", present=False)
        gateway.no_firewall(name="No gateway: no firewall table of thorfleet's")
        files.absent(name="No gateway: no firewall unit file", path=unit_path)
        files.absent(name="No gateway: no firewall script", path=BOX_FIREWALL)
        gone = files.absent(name="No gateway: the server waits for no firewall",
                            path=f"{dropin_dir}/{FIREWALL_DROPIN}")
        systemd.daemon_reload(name="Reload systemd after the drop-in went", _if=gone.did_change)
        return
    ports = (settings.service_port, settings.watchdog_port)
    script, mark = firewall_script(ports, *settings.gateway_sources, settings.monitor_source)
    monitor = f" and {settings.monitor_source} (the monitor)" if settings.monitor_source else ""
    gateways = " and ".join(settings.gateway_sources)
    files.whole_file(name=f"Write the firewall: ports {ports[0]} (vLLM) and {ports[1]} (the "
                          f"watchdog) answer {gateways} (the gateway"
                          f"{'s' if len(settings.gateway_sources) > 1 else ''}){monitor} and the box only",
                     src=StringIO(script), path=BOX_FIREWALL, mode="644")
    unit = files.whole_file(name="Install the unit that loads it at every boot",
                            src=str(THOR_FILES / "systemd" / FIREWALL_UNIT), path=unit_path, mode="644")
    files.directory(name="Create the server unit's drop-in folder", path=dropin_dir, mode="755")
    dropin = files.whole_file(
        name="The server starts only once the firewall is live (a failed load keeps it down)",
        src=str(THOR_FILES / "systemd" / "thorfleet-vllm-firewall.conf"),
        path=f"{dropin_dir}/{FIREWALL_DROPIN}", mode="644")
    systemd.daemon_reload(name="Reload systemd after the firewall unit or the drop-in changed",
                          _if=lambda: unit.did_change() or dropin.did_change())
    files.unit_enabled(name="Enable the firewall unit", unit=FIREWALL_UNIT)
    gateway.firewall(name="Load the firewall table (live now)", mark=mark)
    gateway.in_system_ruleset(name="The system's nftables ruleset loads it too (a reload by hand "
                                   "leaves no moment open)")
