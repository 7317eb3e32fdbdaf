"""Which hosts of the inventory are Thors and which is the gateway.

    is_gateway(h)    # in the inventory group `gateway`: HAProxy in front of the Thors
    is_thor(h)       # serves the model: every host but a gateway or monitor that is a box of its own
    thors(hosts)     # the Thors of an inventory (or any iterable of hosts), in order
    gateway_of(hosts)  # the gateway host, or None
    monitors_of(hosts)  # where Prometheus runs: the `monitor` group's host, else every gateway

A gateway is a box of its own unless its data says gateway_serves_model=True (then it is one of
the Thors too): group names other than `gateway` and `monitor` are the operator's, so they cannot
say it. A host of the group `monitor` runs Prometheus and serves no model.
"""

import difflib

GATEWAY_GROUP = "gateway"
MONITOR_GROUP = "monitor"


def near_role_groups(groups) -> list[str]:
    """One line per group whose name is a role's, nearly (`gateways`, `Gateway`, `monitr`): its
    hosts would silently be Thors, a role being read from its group's exact name."""
    problems = []
    for group in sorted(groups):
        if group in (GATEWAY_GROUP, MONITOR_GROUP):
            continue
        for role in (GATEWAY_GROUP, MONITOR_GROUP):
            if difflib.SequenceMatcher(None, group.lower(), role).ratio() >= 0.8:
                problems.append(f"group {group!r}: nearly the role group {role!r}, whose exact "
                                f"name gives its hosts their role; as it is, its hosts are Thors "
                                f"that serve the model: rename it {role!r}, or further from it")
    return problems


def is_gateway(h) -> bool:
    return GATEWAY_GROUP in getattr(h, "groups", ())  # hosts made by hand (tests) have none


def is_monitor_host(h) -> bool:
    """In the inventory group `monitor` (a gateway is the monitor only when no host is)."""
    return MONITOR_GROUP in getattr(h, "groups", ())


def is_thor(h) -> bool:
    if is_monitor_host(h) and not is_gateway(h):
        return False
    return not is_gateway(h) or h.data.get("gateway_serves_model") is True


def thors(hosts) -> list:
    return [h for h in hosts if is_thor(h)]


def gateway_of(hosts):
    found = [h for h in hosts if is_gateway(h)]
    return found[0] if found else None


def gateways(hosts) -> list:
    return [h for h in hosts if is_gateway(h)]


def monitors_of(hosts) -> list:
    """The hosts Prometheus runs on: the group `monitor`'s (one; settings refuse more), else every
    gateway, so a pair's usage and alerts outlive either gateway; [] without either."""
    hosts = list(hosts)
    return [h for h in hosts if is_monitor_host(h)] or gateways(hosts)
