"""The gateways' shared address (gateway_virtual_ip) written with the LAN's prefix, as far as the
inventory can tell: a network that leaves out a box the gateways dial is refused before anything
connects, naming the boxes and the prefix that holds them all.

Why: keepalived adds the address with its prefix, and so a route to its network from the shared
address; 10.0.0.50/25 on a /24 LAN made the holder dial the boxes in the /25 from 10.0.0.50,
which their firewall does not admit: every box marked down. What is not knowable offline, and so
not refused here: a prefix too long that still holds every box (all boxes in the /25), boxes
dialed by name. The edits that break these (each tried once):
_the_gateway not calling _shared_address_problems; the network test reversed; the suggested
prefix not widened to hold every box.

What is knowable only on the gateway, its LAN's prefix, is checked there before keepalived's
config is written (operations/gateway.py shared_address_problem, from facts.box.InterfaceOf): a prefix
other than the LAN's fails that gateway, naming the prefix to write. The edits that break it: the
prefix not compared; the fact not reading the prefix (each tried once).

Fast: no Docker, no SSH.
"""

import pytest

from tests.fast.test_gateway_render import inventory
from thorfleet import facts
from thorfleet.operations.gateway import shared_address_problem
from thorfleet.plan import settings_for_inventory
from thorfleet.settings.schema import SettingsError

PAIR = [("gw-1", {"ssh_hostname": "10.0.0.9"}), ("gw-2", {"ssh_hostname": "10.0.0.8"})]
THORS = [("thor-1", {"ssh_hostname": "10.0.0.1"}), ("thor-2", {"ssh_hostname": "10.0.0.200"}),
         ("thor-3", {"ssh_hostname": "10.0.1.3", "weights_peer_address": "10.0.0.201"})]


def problems(tmp_path, virtual, gateways=PAIR, thors=THORS):
    inv = inventory(tmp_path, gateway_data={"gateway_virtual_ip": virtual},
                    gateway_hosts=gateways, thor_hosts=thors)
    try:
        settings_for_inventory(inv)
    except SettingsError as error:
        return error.problems
    return []


@pytest.mark.parametrize("gateways", [PAIR, PAIR[:1]], ids=["pair", "one"])
def test_a_shared_address_narrower_than_the_boxes_lan_is_refused(tmp_path, gateways):
    names = " and ".join(n for n, _ in gateways)
    assert problems(tmp_path, "10.0.0.50/25", gateways) == [
        (f"{names}: gateway_virtual_ip 10.0.0.50/25 leaves out thor-2 (10.0.0.200), thor-3 "
         "(10.0.0.201), which the gateways dial: its network 10.0.0.0/25 is narrower than the "
         "LAN the boxes are on, so the gateway holding it would dial the boxes inside "
         "10.0.0.0/25 from 10.0.0.50, which their firewall does not let in, and mark them all "
         "down; write it with the LAN's own prefix (ip -4 addr on a gateway shows it: /24 or "
         "shorter, to hold them all), like 10.0.0.50/24")]
    assert problems(tmp_path, "10.0.0.50/24", gateways) == []  # the fix it names


def test_the_prefix_named_holds_every_box(tmp_path):
    far = [*THORS, ("thor-4", {"ssh_hostname": "10.0.3.4"})]
    said = problems(tmp_path, "10.0.0.50/24", thors=far)
    assert len(said) == 1 and "thor-4 (10.0.3.4)" in said[0], said
    assert said[0].endswith("/22 or shorter, to hold them all), like 10.0.0.50/22"), said
    assert problems(tmp_path, "10.0.0.50/22", thors=far) == []


def test_boxes_dialed_by_name_or_all_inside_are_not_refused(tmp_path):
    # the shared address's network holds every box it dials: not knowable wrong offline
    assert problems(tmp_path, "10.0.0.50/25", thors=THORS[:1]) == []
    named = [("thor-1", {"ssh_hostname": "thor-1.lan"}), ("thor-2", {"ssh_hostname": "10.0.0.2"})]
    assert problems(tmp_path, "10.0.0.50/25", thors=named) == []


@pytest.mark.parametrize("output, found", [
    (["eth0 24"], facts.box.Interface("eth0", 24)),
    (["eth0@if12 16"], facts.box.Interface("eth0", 16)),
    ([], None),
    (["eth0"], None),  # no prefix printed: not taken for a /0
])
def test_the_gateway_reads_its_interface_and_the_lans_prefix(output, found):
    assert facts.box.InterfaceOf().process(output) == found


@pytest.mark.parametrize("virtual, interface, says", [
    ("10.0.0.50/24", facts.box.Interface("eth0", 24), None),
    ("10.0.0.50/25", facts.box.Interface("eth0", 24),
     ("gateway_virtual_ip 10.0.0.50/25 has prefix /25, but this gateway's LAN (10.0.0.9 on eth0) "
     "is /24: keepalived would route that network from the shared address; set "
     "gateway_virtual_ip to 10.0.0.50/24")),
    ("10.0.0.50/16", facts.box.Interface("eth0", 24), "set gateway_virtual_ip to 10.0.0.50/24"),
    ("10.0.0.50/24", None, "no interface of this gateway has 10.0.0.9"),
])
def test_a_shared_address_with_another_prefix_than_the_gateways_lan_fails_it(virtual, interface,
                                                                             says):
    """The issue's case that no inventory shows: every box inside the too-narrow network."""
    problem = shared_address_problem("10.0.0.9", virtual, interface)
    if says is None:
        assert problem is None
    else:
        assert says in problem, problem
