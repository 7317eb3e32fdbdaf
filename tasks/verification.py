"""Verification: (re)start the server when its inputs changed, and prove it serves.

Restarts roll through the fleet: a batch at a time (rollout_batch), the canary group first; a
batch that fails its checks stops the rollout and the hosts after it keep their current version.
"""

from pyinfra import host, inventory
from pyinfra.api import deploy

from thorfleet import operations as thor
from thorfleet import rollout


@deploy("Verification")
def run(s):
    plan = rollout.batches(inventory, s.rollout_batch, s.rollout_canary_group)
    for index in host.loop(range(len(plan))):
        if host.name in plan[index]:
            thor.serving(
                name=f"Batch {index + 1}/{len(plan)}: serve the rendered version and prove it "
                     "(health, kernels, chat, reasoning, tools)",
                s=s,
                wait_for=[name for batch in plan[:index] for name in batch],
            )
