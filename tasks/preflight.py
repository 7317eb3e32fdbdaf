"""Preflight: is this box a Thor that can run the model? Reads only; changes nothing."""

from pyinfra import host, inventory
from pyinfra.api import deploy

from thorfleet import operations as thor
from thorfleet.peers import fleet_copy
from thorfleet.runstate import run_state


@deploy("Preflight")
def run(s):
    this_run = run_state(host.state)
    thor.run_held(name="Hold the box for this run (one thorfleet run at a time)",
                  holder=this_run.holder, token=this_run.token, wait_s=s.preflight_lock_wait_s)
    thor.thor_ready(name="Check L4T, memory, disk, Docker's nvidia runtime and sudo", s=s,
                    fleet_copy=fleet_copy(s, inventory))
