"""Rolling restarts: which hosts restart together.

The slow steps run on every host at once (pyinfra's default), and so do the first starts of hosts
that never served a version (operations.serving, first_install). Only the restart rolls: the canary
group first, then the rest in inventory order, `rollout_batch` hosts at a time. Each batch is its own
operation, so pyinfra finishes (and proves) one batch on every host before the next starts. A batch
whose restart failed stops the later ones: the run state's `failed_restarts` (runstate.py), read by
operations.serving.
"""

from __future__ import annotations


def batches(inventory, size, canary_group=None):
    """Host names in restart order, `size` at a time, the canary group's hosts first."""
    names = [h.name for h in inventory]
    canaries = []
    if canary_group:
        canaries = [h.name for h in inventory.get_group(canary_group, [])]
    rest = [n for n in names if n not in canaries]

    def chunk(items):
        return [items[i:i + size] for i in range(0, len(items), size)]

    return chunk(canaries) + chunk(rest)
