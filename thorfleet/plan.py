"""The run's plan: every host's settings and what crosses hosts, built once per run.

    settings_for_inventory(inventory)  # {host name: Settings}, or SettingsError naming every problem
    settings_for_run(state)            # the same, built once per pyinfra run and held by the run

One host's data checked, with the laptop's secrets it names (settings_for); then what needs more
than one host: the gateway (or the pair) and the boxes it sends to, its clients, the monitors and
their targets, the canary and the batches, the copy keys, the boxes sharing an address, the
laptop's SSH files.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from pathlib import Path

import yaml
from paramiko import HostKeys

from thorfleet.gateway import tls
from thorfleet.gateway.config import SERVER_NAME, Backend, GatewaySettings
from thorfleet.gateway.monitor import MonitorSettings, Target, label_value, target
from thorfleet.run import pyinfra_hooks
from thorfleet.run.laptop import (
    client_keys,
    private_file_problems,
    private_folder_problems,
    read_secret_of,
)
from thorfleet.run.peers import (
    dial_host,
    fleet_copy,
    image_copy,
    key_pair,
    peer_address_problems,
)
from thorfleet.run.runstate import run_state
from thorfleet.run.unreachable import keyscan, known_hosts_name, no_host_key
from thorfleet.settings.layout import GATEWAY_DOOR_USAGE_LISTEN, IMAGE_USER, ROOT
from thorfleet.settings.render import Settings, image_files_hash
from thorfleet.settings.roles import (
    is_gateway,
    is_monitor_host,
    is_thor,
    monitors_of,
    near_role_groups,
    thors,
)
from thorfleet.settings.schema import (
    API_KEY_MIN,
    CLIENT_BUDGETS,
    CLIENT_KEY,
    SettingsError,
    check,
    check_gateway,
    check_monitor,
    check_names,
    is_host,
    is_ip_address,
)


def refuse_outside_the_repository(cwd=None) -> None:
    """Exit 2 with one line when pyinfra runs from another folder than this checkout: it reads
    config.py and group_data/ from its working directory only, so thorfleet's check of every
    host's data before connecting and its strict host-key default would be off."""
    here = Path(cwd or os.getcwd()).resolve()
    if here != ROOT:
        print(f"thorfleet: run pyinfra from the repository root, not {here}: cd {ROOT} && "
              "pyinfra INVENTORY deploy.py (pyinfra reads config.py and group_data/ from the "
              "working directory; without them the settings check and strict host keys are "
              "off). No operation ran.", file=sys.stderr)
        sys.exit(2)


def no_hosts(source) -> str:
    """What `check` and a deploy say of an inventory with no host in it (the example as shipped)."""
    return (f"{source}: no hosts: list your boxes in a group "
            "(uncomment the examples in inventory/example.py)")


def settings_for(data, *, groups=None, image_files=None):
    """Settings for one host's data, or SettingsError naming every problem.

    `groups`: the inventory's group names (rollout_canary_group must be one); `image_files`: the
    run's image_files_hash(), so the image's files are read once, not once per host.
    """
    data = dict(data)
    api_key, key_unread = read_secret_of("service_api_key_file", data.get("service_api_key_file"),
                                         "THORFLEET_API_KEY")
    hf_token, token_unread = read_secret_of("weights_hf_token_file",
                                            data.get("weights_hf_token_file"), "HF_TOKEN")
    # a key file that cannot be read is its own problem, not "no API key": the rest still checked
    values, problems = check(data, api_key=api_key or key_unread is not None, hf_token=hf_token,
                             groups=groups)
    problems = [p for p in (key_unread, token_unread) if p] + problems
    for key in ("service_api_key_file", "weights_hf_token_file"):
        problems += private_file_problems(key, data.get(key))
    if problems:
        raise SettingsError(problems)
    return Settings(values, api_key=api_key, hf_token=hf_token, image_files=image_files)


def ssh_file_problems(inventory) -> list[str]:
    """The laptop's SSH files a host's data names that are not there (every host: Thors, the
    gateway, the monitor): pyinfra would fail the connection only once the run has started."""
    found = []
    for h in inventory:
        data = h.data.dict()
        address = data.get("ssh_hostname") or h.name
        fixes = {"ssh_key": "make one (ssh-keygen -t ed25519 -f FILE) or point ssh_key at yours",
                 "ssh_known_hosts_file": f"{keyscan(address, data.get('ssh_port'), 'FILE')}, once"}
        for key, fix in fixes.items():
            value = data.get(key)
            if isinstance(value, str) and not Path(value).expanduser().exists():
                found.append(f"{h.name}: {key}={value!r} does not exist on this machine: "
                             f"{fix.replace('FILE', value)}")
    return found + _ssh_user_left_behind(inventory)


def host_key_problems(inventory) -> list[str]:
    """Each host whose host key SSH checks strictly (ssh_strict_host_key_checking 'yes',
    group_data's default) while its known_hosts holds no key for the address SSH dials: the
    first connection would fail on it. `check` asks it; a deploy does not refuse the whole run
    for it (the host's connection fails, one line naming this fix, and the others go on), nor do
    status and doctor, whose row of that box says it. A named file not there is
    ssh_file_problems' to say."""
    found, loaded = [], {}
    for h in inventory:
        data = h.data.dict()
        named = data.get("ssh_known_hosts_file")
        if data.get("ssh_strict_host_key_checking") != "yes" or (
                isinstance(named, str) and not Path(named).expanduser().exists()):
            continue
        try:
            where = pyinfra_hooks.ssh_destination(h.name, data)
        except (TypeError, ValueError):
            continue  # an ssh_port that is no number: pyinfra says so itself
        for file in where.known_hosts:
            if file not in loaded:
                loaded[file] = _host_keys(file)
        shown = named if isinstance(named, str) else where.known_hosts[0]
        problem = missing_host_key(where.address, where.port, shown,
                                   [loaded[f] for f in where.known_hosts],
                                   named=isinstance(named, str))
        if problem:
            found.append(f"{h.name}: {problem}")
    return found


def _host_keys(file):
    """The host keys in `file` as paramiko (pyinfra's SSH) reads them; none when it is not there,
    or an OSError saying why it cannot be read."""
    try:
        return HostKeys(file)
    except FileNotFoundError:
        return HostKeys()
    except OSError as error:
        return error


def missing_host_key(address, port, file, host_keys, named=True) -> str | None:
    """What the laptop lacks to connect to `address`:`port` with a strict host key check, or None:
    a key for it in one of `host_keys` (paramiko's HostKeys of each file, or an OSError for one
    that cannot be read), looked up as SSH looks it up, hashed entries included. `file`: the
    file to name in the fix; `named`: whether ssh_known_hosts_file names it (else SSH's own)."""
    said = f"ssh_known_hosts_file={str(file)!r}" if named else \
        f"{file} (SSH's own: ssh_known_hosts_file is not set)"
    unread = [keys for keys in host_keys if isinstance(keys, OSError)]
    if any(keys.lookup(known_hosts_name(address, port)) for keys in host_keys
           if not isinstance(keys, OSError)):
        return None
    if unread:
        return (f"{said} cannot be read ({unread[0].strerror or unread[0]}): make it readable, "
                "or point ssh_known_hosts_file at the file that holds the boxes' host keys")
    return no_host_key(said, address, port, file)


def _ssh_user_left_behind(inventory) -> list[str]:
    """A gateway or monitor with no ssh_user while the Thors have one: their group's data does not
    reach it, so pyinfra would log in as this laptop's user and fail only once the run started."""
    users = sorted({h.data.dict().get("ssh_user") for h in thors(inventory)} - {None})
    if not users:
        return []  # nobody names a user: ~/.ssh/config decides for every host alike
    return [f"{h.name}: no ssh_user, while the Thors log in as {', '.join(map(repr, users))}: set "
            f"ssh_user (and ssh_key, ssh_known_hosts_file) in {h.name}'s group data too; the Thors' "
            "group data does not reach it" for h in inventory
            if not is_thor(h) and not h.data.dict().get("ssh_user")]


def settings_for_inventory(inventory, make=False):
    """Settings for every host of the inventory, or SettingsError naming each host's problems.
    `make`: a client key file not there yet is made as it is read (a deploy's plan)."""
    found, settings, boxes = [], {}, {}
    groups = set(inventory.groups)
    image_files = image_files_hash()
    canary_group, found = _the_canary_group(inventory)
    found += near_role_groups(groups)
    found += ssh_file_problems(inventory)
    for h in thors(inventory):
        data = h.data.dict()
        if canary_group and data.get("rollout_canary_group") is None:
            data["rollout_canary_group"] = canary_group  # named in one group's data: the run's
        try:
            settings[h.name] = settings_for(data, groups=groups, image_files=image_files)
        except SettingsError as error:
            found += [f"{h.name}: {p}" for p in error.problems]
        address = (data.get("ssh_hostname") or h.name, data.get("ssh_port") or 22,
                   data.get("service_port"))
        boxes.setdefault(address, []).append(h.name)
    if any(fleet_copy(checked, inventory) or image_copy(checked, inventory)
           for checked in settings.values()):
        found += peer_address_problems(inventory)
    found += _peer_key_problems(inventory, settings)
    for (addr, ssh_port, port), names in boxes.items():
        if len(names) > 1:
            found.append(f"{', '.join(names)}: the same box ({addr}:{ssh_port}) twice with "
                         f"service_port={port}: two services cannot share one port")
    found += _one_batch_size(settings)
    gateways, problems = _the_gateway(inventory, settings, make=make and not found)
    found += problems
    monitors, problems = _the_monitors(inventory, settings, gateways)
    found += problems
    if found:
        raise SettingsError(found)
    for name, gateway in gateways.items():
        if name in settings:  # a Thor that is the gateway too (gateway_serves_model)
            settings[name].gateway_role = gateway
        else:
            settings[name] = gateway
    for name, monitor in monitors.items():
        door = gateways.get(name)  # its own gateway's usage per client, on its loopback
        if door is not None and door.gateway_clients:
            monitor.door_usage = target(*GATEWAY_DOOR_USAGE_LISTEN)
        if name in settings:  # the gateway (or a gateway that is a Thor too) is the monitor
            settings[name].monitor_role = monitor
        else:
            settings[name] = monitor
    for held in [*settings.values(), *gateways.values(), *monitors.values()]:
        held.freeze()  # built: what the run reads is what was checked here
    return settings


def _peer_key_problems(inventory, settings) -> list[str]:
    """The boxes' copy keys (weights_peer_key_file, image_peer_key_file) as laptop secrets, for
    the runs that use them (private_file_problems): each named once, by the hosts that use it."""
    users = {}
    for name, checked in settings.items():
        for key, used in (("weights_peer_key_file", fleet_copy(checked, inventory)),
                          ("image_peer_key_file", image_copy(checked, inventory))):
            if used:
                users.setdefault((key, getattr(checked, key)), []).append(name)
    return [f"{', '.join(names)}: {p}" for (key, path), names in users.items()
            for p in private_file_problems(key, path)]


def _the_monitors(inventory, settings, gateways):
    """({name: MonitorSettings}, [problem]) of the hosts Prometheus runs on (roles.monitors_of):
    the group `monitor`'s host, checked with its own settings, else each gateway with its own;
    none without either. Every one scrapes every Thor, at the address the gateways dial it at,
    under the same labels, so either of a pair answers a query or fires an alert alike."""
    hosts = monitors_of(inventory)
    if not hosts:
        return {}, []
    if len(hosts) > 1 and is_monitor_host(hosts[0]):
        return {}, [(f"{', '.join(m.name for m in hosts)}: group `monitor` holds one host "
                     "(one Prometheus scrapes the whole fleet)")]
    found, problems = {}, []
    for h in hosts:
        if is_gateway(h):
            gateway = gateways.get(h.name)
            if gateway is None:
                return {}, []  # the gateway's own problems are listed already
            found[h.name] = gateway.values
        else:
            values, own = check_monitor(h.data.dict())
            problems += [f"{h.name}: {p}" for p in own]
            found[h.name] = values
    if problems:
        return {}, problems
    source, h = None, hosts[0]  # a gateway is in the boxes' firewall as a gateway already
    if not is_gateway(h):  # a host of its own: the boxes' firewall (with a gateway) lets it in
        address = h.data.get("ssh_hostname") or h.name
        source = found[h.name].monitor_fleet_address or address
        if gateways and not is_ip_address(source):
            problems.append(f"{h.name}: monitor_fleet_address is not set and ssh_hostname "
                            f"{address!r} is not an IP address: set monitor_fleet_address to the "
                            "IP the boxes see the monitor connect from (their firewall lets it in)")
    targets, more = _monitor_targets(inventory, settings, gateways, source)
    problems += more
    if problems:
        return {}, problems
    return {name: MonitorSettings(values, name, targets) for name, values in found.items()}, []


def _monitor_targets(inventory, settings, gateways, source):
    """([Target], [problem]): each Thor as every monitor scrapes it, and each told the IP a
    monitor host of its own (`source`) scrapes it from, for its firewall."""
    problems, targets = [], []
    for t in thors(inventory):
        checked = settings.get(t.name)
        if checked is None:
            continue  # its own problems are listed already
        checked.monitor_source = source if source and is_ip_address(source) else None
        address = dial_host(t)
        if gateways and source:  # the firewall (there with a gateway) must let the monitor in
            problems += _family_problems(t.name, "the monitor", address, source,
                                         "monitor_fleet_address")
        try:
            label_value(t.name)
        except ValueError:
            problems.append(f"{t.name!r}: Prometheus labels each box's series and alerts with its "
                            "inventory name (host), which an alert's one line cannot show with a "
                            "newline or a control character in it: rename the host in the inventory")
        try:
            target(address, checked.service_port)
        except ValueError:
            problems.append(f"{t.name}: Prometheus dials it at {address!r}, not a host name or "
                            "address: set weights_peer_address (the address the other boxes, "
                            "the gateway and the monitor reach it at)")
        targets.append(Target(t.name, address, checked.service_port, checked.watchdog_port))
    return targets, problems


def _the_gateway(inventory, settings, make=False):
    """({name: GatewaySettings}, [problem]) of the inventory's gateways (group `gateway`: one
    host, or two sharing gateway_virtual_ip), and each Thor told where the gateways connect from
    (Settings.gateway_sources), for its firewall."""
    hosts = [h for h in inventory if is_gateway(h)]
    if not hosts:
        return {}, []
    if len(hosts) > 2:
        return {}, [(f"{', '.join(h.name for h in hosts)}: group `gateway` holds one host, or two "
                     "that share gateway_virtual_ip (keepalived moves it between them)")]
    checked = [(h, *check_gateway(h.data.dict())) for h in hosts]
    problems = [f"{h.name}: {p}" for h, _, found in checked for p in found]
    problems += [f"{h.name}: {p}" for h, _, _ in checked for p in private_file_problems(
        "gateway_tls_key_file", h.data.get("gateway_tls_key_file"))]
    if problems:
        return {}, problems
    # the fleet CA's folder (made on the first run): every client trusts what its key signs
    problems += [f"{h.name}: {p}" for h, values, _ in checked if not values.gateway_tls_cert_file
                 for p in private_folder_problems("gateway_ca_dir", values.gateway_ca_dir,
                                                  values.gateway_ca_dir)]
    first = checked[0][1]
    addresses = [h.data.get("ssh_hostname") or h.name for h in hosts]
    sources = [values.gateway_fleet_address or address
               for (_, values, _), address in zip(checked, addresses)]
    for h, address, source in zip(hosts, addresses, sources):
        if not is_ip_address(source):
            problems.append(f"{h.name}: gateway_fleet_address is not set and ssh_hostname "
                            f"{address!r} is not an IP address: set gateway_fleet_address to the "
                            "IP the boxes see the gateway connect from (their firewall lets only "
                            "it in)")
    problems += _pair_problems(hosts, [values for _, values, _ in checked], sources)
    virtual = first.gateway_virtual_ip.split("/")[0] if first.gateway_virtual_ip else None
    try:
        # One certificate for the door, on every gateway: the shared address first (the URL
        # clients use), then each gateway's own as the laptop reaches it, then as the boxes
        # reach it (gateway_fleet_address: `thorfleet bench` asks the door from a box), then
        # gateway_names.
        names = check_names([*([virtual] if virtual else []), *addresses,
                                 *(s for s in sources if is_ip_address(s)),
                                 *first.gateway_names])
    except ValueError as error:
        problems.append(f"{hosts[0].name}: {error}: the certificate names the gateway's "
                        "ssh_hostname as clients use it; set ssh_hostname to an address or DNS "
                        "name")
        names = []
    cert, key = first.gateway_tls_cert_file, first.gateway_tls_key_file
    if cert and key and names:
        try:
            tls.operator_pair(Path(cert).expanduser(), Path(key).expanduser(), names)
        except (OSError, ValueError) as error:
            problems.append(f"{hosts[0].name}: gateway_tls_cert_file/gateway_tls_key_file: {error}")
    backs = [t for t in thors(inventory) if t not in hosts]
    if not backs and not any(is_thor(h) for h in hosts):
        problems.append(f"{hosts[0].name}: the gateway has no Thor behind it: list the boxes in a "
                        "group of their own")
    backends = []
    for t in [*backs, *(h for h in hosts if is_thor(h))]:
        box = settings.get(t.name)
        if box is None:
            continue  # its own problems are listed already
        target = dial_host(t)  # an IPv6 address whole (its first ':' is no port)
        if not SERVER_NAME.fullmatch(t.name):
            problems.append(f"{t.name!r}: the gateway names each box by its inventory name, and "
                            "HAProxy takes letters, digits, '-', '_', '.' and ':' only (64 at "
                            "most): rename the host in the inventory")
        if not is_host(target) or "%" in target:
            problems.append(f"{t.name}: the gateway dials it at {target!r}, not a host name or "
                            "address: set weights_peer_address (the address the other boxes "
                            "and the gateway reach it at)")
        for source in sources:
            problems += _family_problems(t.name, "the gateway", target, source,
                                         "gateway_fleet_address")
        box.gateway_sources = tuple(s for s in sources if is_ip_address(s)) or None
        backends.append(Backend(t.name, target, box.service_port, _max_num_seqs(box),
                                box.watchdog_port, box.service_profile, tuple(box.served_names),
                                box.service_images_per_prompt if box.vision else 0))
    if first.gateway_virtual_ip:
        problems += _shared_address_problems(hosts, first.gateway_virtual_ip, sources, backends)
    box_keys = {settings[b.name].api_key for b in backends}
    box_key = next(iter(box_keys)) if len(box_keys) == 1 else None
    problems += [f"{hosts[0].name}: {p}" for p in box_key_problems(box_keys)]
    # each client's key read once (made first in a deploy, when nothing else is wrong), for
    # both gateways of a pair: they hold one set of keys
    keyed, unkeyed = client_keys(first.client_policies, box_keys, CLIENT_KEY,
                                 make=make and not problems)
    problems += [f"{hosts[0].name}: {p}" for p in unkeyed]
    problems += [f"{hosts[0].name}: {p}"
                 for p in client_model_problems(first.client_policies, backends)]
    if problems:
        return {}, problems
    pair = list(zip((h.name for h in hosts), sources))
    found = {h.name: GatewaySettings(values, h.name, address, backends, box_key=box_key,
                                     names=names, pair=pair, policies=keyed)
             for (h, values, _), address in zip(checked, addresses)}
    for b in backends:  # each box's pool at the door: where its drain is set
        settings[b.name].gateway_pool = found[hosts[0].name].pool_of(b.name)
    return found, []


# What the two gateways of a pair must say alike: they render one config, one certificate and one
# set of client keys, so a failover changes nothing a client sees; and one Prometheus config, so
# the series and alerts of either read alike (each runs its own: roles.monitors_of).
PAIR_ALIKE = ("gateway_virtual_ip", "gateway_vrrp_router_id", "gateway_port", "gateway_names",
              "gateway_tls_cert_file", "gateway_tls_key_file", "gateway_ca_dir",
              "gateway_clients", "gateway_client_max_inflight",
              "gateway_client_requests_per_minute", *CLIENT_BUDGETS.values(),
              "gateway_queue_timeout_s", "gateway_retry_after_s", "gateway_check_interval_s",
              "gateway_affinity_balance_factor", "monitor_scrape_interval_s", "monitor_retention")


def _pair_problems(hosts, values, sources) -> list[str]:
    """What stops two gateways from holding one address: no gateway_virtual_ip, settings that
    differ between them, or an address of theirs outside the virtual address's network (VRRP
    needs them on one LAN)."""
    virtual = values[0].gateway_virtual_ip
    if len(hosts) == 1:
        return _on_network(hosts[0].name, sources[0], virtual) if virtual else []
    names = " and ".join(h.name for h in hosts)
    if virtual is None:
        return [(f"{names}: two gateways need gateway_virtual_ip, the one address clients use "
                 "(keepalived moves it to the other when one fails), like 192.168.1.50/24")]
    problems = [f"{names}: {key} differs between the two gateways ({getattr(values[0], key)!r} "
                f"and {getattr(values[1], key)!r}): set it once, in the group `gateway`'s data"
                for key in PAIR_ALIKE if getattr(values[0], key) != getattr(values[1], key)]
    if sources[0] == sources[1]:
        problems.append(f"{names}: both connect from {sources[0]} (gateway_fleet_address or "
                        "ssh_hostname): two gateways are two machines, each with its own address")
    for h, source in zip(hosts, sources):
        problems += _on_network(h.name, source, virtual)
    return problems


def _on_network(name, source, virtual) -> list[str]:
    """The gateway's own address (`source`) in the virtual address's network, and not it."""
    network = ipaddress.IPv4Interface(virtual).network
    address = ipaddress.ip_address(source) if is_ip_address(source) else None
    if address is None:
        return []  # said already: not an IP address
    if address not in network:
        return [(f"{name}: gateway_virtual_ip {virtual} is not on its network: its address "
                 f"{source} (gateway_fleet_address, else ssh_hostname) is outside {network}, "
                 "and keepalived can only hold an address of the LAN the gateways share")]
    if str(address) == virtual.split("/")[0]:
        return [(f"{name}: gateway_virtual_ip {virtual} is the gateway's own address: pick a "
                 "free address of its network, which only the one holding it answers")]
    return []


def _shared_address_problems(hosts, virtual, sources, backends) -> list[str]:
    """A shared address whose network leaves out a box the gateways dial (by an IPv4 address).

    keepalived adds gateway_virtual_ip with its prefix, and with it a route to that network from
    the shared address. A prefix longer than the LAN's (10.0.0.50/25 on a /24) makes the holder
    dial the boxes inside the /25 from the shared address, which their firewall does not let in
    (it admits each gateway's own address): all marked down, the door shut. The LAN's prefix is
    not in the inventory, but the boxes the gateways dial are on it (or the shared address has
    nothing to do with them): each must be inside the shared address's network. A box dialed by
    name is not known here; the prefix itself is only knowable on the gateway (ip -4 addr).
    """
    interface = ipaddress.IPv4Interface(virtual)
    outside = [(b.name, b.address) for b in backends if is_ip_address(b.address)
               and ipaddress.ip_address(b.address).version == 4
               and ipaddress.ip_address(b.address) not in interface.network]
    if not outside:
        return []
    # the longest prefix whose network holds the shared address, the gateways and the boxes: the
    # LAN's is that or shorter
    every = [interface.ip, *(ipaddress.ip_address(a) for _, a in outside),
             *(ipaddress.ip_address(s) for s in sources
               if is_ip_address(s) and ipaddress.ip_address(s).version == 4)]
    prefix = interface.network.prefixlen
    while any(a not in ipaddress.IPv4Interface(f"{interface.ip}/{prefix}").network for a in every):
        prefix -= 1
    boxes = ", ".join(f"{name} ({address})" for name, address in outside)
    return [(f"{' and '.join(h.name for h in hosts)}: gateway_virtual_ip {virtual} leaves out "
             f"{boxes}, which the gateways dial: its network {interface.network} is narrower than "
             "the LAN the boxes are on, so the gateway holding it would dial the boxes inside "
             f"{interface.network} from {interface.ip}, which their firewall does not let in, and "
             "mark them all down; write it with the LAN's own prefix (ip -4 addr on a gateway "
             f"shows it: /{prefix} or shorter, to hold them all), like {interface.ip}/{prefix}")]


def box_key_problems(box_keys) -> list[str]:
    """What stops the door holding the boxes' one key (`box_keys`: the keys of the Thors whose own
    settings passed, None for none): it sends that key on, and without gateway_clients opens to it
    alone, so every Thor has the same, a bearer token (a header word and a map value as it is).
    No key at all means no Thor passed: each one's own line says why (a missing pin, an API key
    file others can read), and "give every Thor the same one" would name the wrong fix."""
    if not box_keys:
        return []
    if len(box_keys) == 1 and CLIENT_KEY.fullmatch(next(iter(box_keys)) or ""):
        return []
    return [(f"service_api_key_file: the door opens to the fleet's key (or to each client's, "
             f"gateway_clients) and sends the boxes theirs, one for all: give every Thor the "
             f"same one, of {API_KEY_MIN} to 512 letters, digits and -._~+/= (openssl rand -hex "
             "24)")]


def client_model_problems(policies, backends) -> list[str]:
    """A client's `models` naming one no box of the inventory serves (service_profile: the
    names each box answers to)."""
    served = {n for b in backends for n in b.names}
    own = sorted({b.model for b in backends})
    return [f"gateway_clients[{name!r}]: models has {model!r}, which no box here serves: name "
            f"one of {', '.join(own)} (a box's service_profile serves it)"
            for name, policy in sorted(policies.items())
            for model in policy.models or () if model not in served]


def _family_problems(name, who, target, source, key) -> list[str]:
    """A box's firewall lets `source` in, but `who` dials the box at `target`, of the other IP
    family: its connections would come from its other address, and be dropped."""
    if not (is_ip_address(source) and is_ip_address(target)):
        return []
    dials, allowed = ipaddress.ip_address(target).version, ipaddress.ip_address(source).version
    if dials == allowed:
        return []
    return [(f"{name}: {who} dials it at {target} (IPv{dials}) while its firewall would let in "
             f"{source} (IPv{allowed}): set {key} to {who}'s address in the family it dials the "
             "boxes with")]


def _max_num_seqs(checked) -> int:
    """The requests vLLM runs at once, as its rendered config says: the gateway's maxconn."""
    return int(yaml.safe_load(checked.config_text)["max_num_seqs"])


# The restart order (rollout.plan) is one plan for the whole run: each host computes it from its
# own settings, so every host must find the same canary group and batch size.
ONE_PLAN = "the restart order is one plan for the whole run"


def _disagree(key, by_value):
    """The line for hosts that set `key` differently ({value: [host names]})."""
    return " but ".join(f"{', '.join(names)}: {key}={value!r}" for value, names in by_value.items())


def _the_canary_group(inventory):
    """(the run's canary group, [problem]): rollout_canary_group may be named in any group's data,
    the canary group's own included, and then orders every host; hosts naming two groups cannot
    make one plan. A value that is not a name is left to the check of each host."""
    by_value = {}
    for h in inventory:
        value = h.data.get("rollout_canary_group")
        if isinstance(value, str):
            by_value.setdefault(value, []).append(h.name)
    if len(by_value) > 1:
        line = (f"{_disagree('rollout_canary_group', by_value)}: {ONE_PLAN}: name one canary "
                "group (in group_data/all.py, or in that group's own data)")
        return None, [line]
    return next(iter(by_value), None), []


def _one_batch_size(settings):
    """[problem] when the checked hosts ({name: Settings}) set rollout_batch differently."""
    by_value = {}
    for name, checked in settings.items():
        by_value.setdefault(checked.rollout_batch, []).append(name)
    if len(by_value) > 1:
        line = (f"{_disagree('rollout_batch', by_value)}: {ONE_PLAN}: set rollout_batch once (in "
                "group_data/all.py, or in the data of a group every host is in)")
        return [line]
    return []


def make_door_files(door) -> None:
    """A door's files on the laptop: the fleet CA and the door's certificate, made or renewed
    (tls.gateway_pair; an operator's own certificate is theirs to make). The door then reads
    them (GatewaySettings.pem). Its clients' keys are made and read as its plan is built
    (_the_gateway: laptop.client_keys)."""
    if not door.operator_certificate:
        tls.gateway_pair(door.ca_dir, door.door_holder, door.names)


def make_laptop_files(settings, inventory) -> None:
    """The run's side effects on the laptop, in one step once the plan is built and before any
    host is planned: the fleet CA and the door's certificate, the boxes' copy keys. Each is made
    through one writer (run/laptop.py), whole or not at all; the deploy then reads what this
    made (each is cached where it is read), so no task makes a file while it plans. The
    clients' keys are made as the plan reads them (settings_for_inventory(make=True)), once the
    checks before have passed. `check`, status and doctor make none."""
    for checked in settings.values():
        door = checked.gateway_role  # a gateway's own, a Thor's that is one too, else None
        if door is not None:
            make_door_files(door)
    for h in thors(inventory):
        checked = settings[h.name]
        if fleet_copy(checked, inventory):
            key_pair(checked.weights_peer_key_file)
        if image_copy(checked, inventory):
            key_pair(checked.image_peer_key_file, IMAGE_USER)


def settings_for_run(state):
    """settings_for_inventory(state.inventory), checked once per run and kept on the run's State,
    then the laptop's files the run needs made (make_laptop_files).

    config.py calls it right after pyinfra loads the inventory, so bad data stops the whole run
    before any host is contacted; deploy.py and the report then read the same Settings.
    """
    run = run_state(state)
    held = run.settings
    if held is None:
        try:
            held = settings_for_inventory(state.inventory, make=True)
            make_laptop_files(held, state.inventory)
        except SettingsError as error:
            held = error
        except (OSError, ValueError) as error:  # a file the laptop cannot make or read
            held = SettingsError([f"the laptop's files for this run: {error}"])
        run.settings = held
    return run.planned()
