"""The shell helpers every operation uses: each value quoted (shlex.quote), long commands shown as
they run, and the one way to fail a host from a command."""

from __future__ import annotations

import shlex

from pyinfra.api import FunctionCommand, StringCommand

from thorfleet.runstate import run_state

q = shlex.quote


def sh(*args):
    """One shell command from its words, each quoted."""
    return " ".join(q(str(a)) for a in args)


class ShownCommand(StringCommand):
    """A shell command whose output the operator sees as it comes, under the host's name, without
    -v: the progress of a long transfer or build. Fails the operation as any command does."""

    def execute(self, state, host, connector_arguments):
        connector_arguments.update(self.connector_arguments)
        return host.run_shell_command(self, print_output=True, print_input=state.print_input,
                                      **connector_arguments)


def fail_host(message):
    """A command that fails the host with `message`: logged, recorded for the report, failed."""

    def fail(state, host):
        return run_state(state).fail(host, message)

    return FunctionCommand(fail, (), {})
