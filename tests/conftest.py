"""Fixtures shared by every test module.

`sim_fleet` brings the simulated Thor fleet up once per session (`python -m tests.sim up`) and
takes it down at the end. Knobs for a developer:

    THORFLEET_SIM_HOSTS=6      boxes to bring up (default 6: two for the deploy and drift
                               stories, three for the rolling restarts, and the last one, which
                               no deploy touches, for the stories about the bare box)
    THORFLEET_SIM_KEEP=1       leave the fleet running after the session, to look around
                               (`python -m tests.sim status`, `ssh -p 22001 ...`, then `down`)
    THORFLEET_SIM_STATE=DIR    where keys, disks and caches live (default /var/tmp/thorfleet-sim)
"""

import os

import pytest

from tests.sim import fleet


@pytest.fixture(scope="session")
def sim_fleet():
    """The fleet: `.hosts`, `.inventory`, `.ssh(host, cmd)`, `.exec(host, cmd)` (as root through
    Docker), `.reboot(host)`, `.cut(host)`, `.heal(host)`,
    `.write_inventory(path, hosts, extra_data)`."""
    hosts = int(os.environ.get("THORFLEET_SIM_HOSTS", "6"))
    sim = fleet.up(hosts)
    yield sim
    if os.environ.get("THORFLEET_SIM_KEEP") == "1":
        print(f"\nTHORFLEET_SIM_KEEP=1: fleet left running; inventory {sim.inventory}")
    else:
        fleet.down(sim.client)
