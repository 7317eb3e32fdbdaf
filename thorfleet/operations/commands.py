"""The shell helpers every operation uses: each value quoted (shlex.quote), long commands shown as
they run, and the one way to fail a host from a command."""

from __future__ import annotations

import shlex

from pyinfra.api import FunctionCommand

from thorfleet.run.pyinfra_hooks import ShownCommand  # noqa: F401 (the operations' import)
from thorfleet.run.runstate import run_state

q = shlex.quote


def sh(*args):
    """One shell command from its words, each quoted."""
    return " ".join(q(str(a)) for a in args)


def fail_host(message):
    """A command that fails the host with `message`: logged, recorded for the report, failed."""

    def fail(state, host):
        return run_state(state).fail(host, message)

    return FunctionCommand(fail, (), {})
