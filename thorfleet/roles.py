"""Which hosts of the inventory are Thors and which is the gateway.

    is_gateway(h)    # in the inventory group `gateway`: HAProxy in front of the Thors
    is_thor(h)       # serves the model: every host but a gateway that is a box of its own
    thors(hosts)     # the Thors of an inventory (or any iterable of hosts), in order
    gateway_of(hosts)  # the gateway host, or None

A gateway is a box of its own unless its data says gateway_serves_model=True (then it is one of
the Thors too): group names other than `gateway` are the operator's, so they cannot say it.
"""

GATEWAY_GROUP = "gateway"


def is_gateway(h) -> bool:
    return GATEWAY_GROUP in getattr(h, "groups", ())  # hosts made by hand (tests) have none


def is_thor(h) -> bool:
    return not is_gateway(h) or h.data.get("gateway_serves_model") is True


def thors(hosts) -> list:
    return [h for h in hosts if is_thor(h)]


def gateway_of(hosts):
    found = [h for h in hosts if is_gateway(h)]
    return found[0] if found else None


def gateways(hosts) -> list:
    return [h for h in hosts if is_gateway(h)]
