"""pyinfra reads this file first, before it loads the inventory and connects (run from the repo root).

thorfleet uses it to check every host's group data before the first SSH connection: bad input is
refused with one line per problem and the run exits non-zero, no host contacted, nothing changed.
pyinfra has no hook between "inventory loaded" and "connecting", so the check follows state.init,
which the CLI calls right after loading the inventory (deploy.py checks again, for the Python API).
"""

import sys

import click
from pyinfra.context import ctx_state

from thorfleet.settings import SettingsError, no_hosts, settings_for_run
from thorfleet.ssh import install_keepalive

_state = ctx_state.get()
_init = _state.init


def _init_then_check(inventory, *args, **kwargs):
    _init(inventory, *args, **kwargs)
    if not list(inventory):  # pyinfra would run nothing, print an empty table and exit 0
        context = click.get_current_context(silent=True)
        source = context.params.get("inventory") if context else None
        print(f"thorfleet: {no_hosts(source or 'the inventory')}", file=sys.stderr)
        sys.exit(2)
    try:
        settings_for_run(_state)  # checked once per run, held by the run's state
    except SettingsError as error:
        print("thorfleet: bad group data, refusing to run (no host was contacted):", file=sys.stderr)
        for problem in error.problems:
            print(f"  - {problem}", file=sys.stderr)
        sys.exit(2)


_state.init = _init_then_check
install_keepalive()  # idle sessions survive a long health wait behind NAT
