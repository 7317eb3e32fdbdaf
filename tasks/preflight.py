"""Preflight: is this box a Thor that can run the model? Reads only; changes nothing."""

from pyinfra import host, inventory
from pyinfra.api import deploy

from thorfleet.operations import preflight
from thorfleet.run.peers import fleet_copy
from thorfleet.run.runstate import run_state


@deploy("Preflight")
def run(settings):
    this_run = run_state(host.state)
    preflight.box_held(name="Hold the box for this run (one thorfleet run at a time)",
                       holder=this_run.holder, token=this_run.token,
                       wait_s=settings.preflight_lock_wait_s)
    preflight.thor_ready(name="Check L4T, memory, disk, Docker's nvidia runtime and sudo",
                         min_l4t_release=settings.preflight_min_l4t_release,
                         min_memory_gib=settings.preflight_min_memory_gib,
                         min_free_disk_gib=settings.preflight_min_free_disk_gib,
                         weights_dir=settings.weights_dir,
                         checkpoints=[settings.model_dir, settings.draft_dir],
                         fleet_copy=fleet_copy(settings, inventory))
