"""Preflight: is this box a Thor that can run the model? Reads only; changes nothing."""

from pyinfra import inventory
from pyinfra.api import deploy

from thorfleet import operations as thor
from thorfleet.peers import fleet_copy


@deploy("Preflight")
def run(s):
    thor.thor_ready(name="Check L4T, memory, disk, Docker's nvidia runtime and sudo", s=s,
                    fleet_copy=fleet_copy(s, inventory))
