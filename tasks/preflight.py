"""Preflight: is this box a Thor that can run the model? Reads only; changes nothing."""

from pyinfra.api import deploy

from thorfleet import operations as thor


@deploy("Preflight")
def run(s):
    thor.thor_ready(name="Check L4T, memory, disk, Docker's nvidia runtime and sudo", s=s)
