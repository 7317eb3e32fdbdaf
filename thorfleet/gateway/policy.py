"""The door's rules for sharing a pool among its clients (their policies: settings/clients.py).

    fair_share(slots)                # a pool's slots one client may hold while another waits
    queue_class(priority, at_share)  # where a request waits in a pool's queue (HAProxy's class)
"""

from __future__ import annotations

import math

from thorfleet.settings.clients import PRIORITY_CLASS

# Added to the class of a request whose client holds its fair share of the pool already: it
# waits behind every other client's request, batch ones too, so a freed slot goes to another
# client while one waits; alone in the queue, it is served as before.
AT_SHARE_CLASS = len(PRIORITY_CLASS)


def fair_share(slots: int) -> int:
    """The slots of a pool one client may hold while another client waits for it: half of
    them, rounded up, at least one (a pool of one box taking one request: that one)."""
    return max(1, math.ceil(slots / 2))


def queue_class(priority: str, at_share: bool) -> int:
    """HAProxy's priority class of a request (lower waits less): its client's priority, behind
    every other client's once that client holds its fair share of the pool."""
    return PRIORITY_CLASS[priority] + (AT_SHARE_CLASS if at_share else 0)
