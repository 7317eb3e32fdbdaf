"""pyinfra reads this file first, before it loads the inventory and connects (run from the repo root).

thorfleet uses it to check every host's group data before the first SSH connection: bad input is
refused with one line per problem and the run exits non-zero, no host contacted, nothing changed.
The check runs right after the CLI loads the inventory (thorfleet/run/pyinfra_hooks.py says how and
why); deploy.py checks again, for the Python API.
"""

import sys

from thorfleet.plan import no_hosts, settings_for_run
from thorfleet.run import pyinfra_hooks, report
from thorfleet.settings.schema import SettingsError


def _refuse_bad_group_data(state):
    if not list(state.inventory):  # pyinfra would run nothing, print an empty table and exit 0
        source = pyinfra_hooks.cli_inventory_argument() or "the inventory"
        print(f"thorfleet: {no_hosts(source)}", file=sys.stderr)
        sys.exit(2)
    try:
        settings_for_run(state)  # checked once per run, held by the run's state
    except SettingsError as error:
        print("thorfleet: bad group data, refusing to run (no host was contacted):", file=sys.stderr)
        for problem in error.problems:
            print(f"  - {problem}", file=sys.stderr)
        sys.exit(2)


pyinfra_hooks.after_inventory_loaded(
    _refuse_bad_group_data,
    pyinfra_hooks.keep_ssh_sessions_alive,  # idle sessions survive a long health wait behind NAT
    pyinfra_hooks.watch,  # what each operation did: the one-round-trip reads and the report
    # a host it cannot connect to: one line with the fix (not paramiko's tracebacks), in the report
    report.before_connecting,
)
