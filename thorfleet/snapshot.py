"""What a converged run reads from a box, in one SSH round trip.

pyinfra runs one command per fact, and thorfleet's operations read about forty of them: on a
converged box those round trips were most of a re-run. So every thorfleet operation declares what
it reads (`@reads`) when it is planned. The first read on a host runs all of that host's declared
reads in one command, in parallel on the box, and keeps the answers. They answer the host's
operations until the host has changed something in this run (an operation sent it a command);
from then on each read is its own fact command, as in pyinfra, so no operation decides on what an
earlier one has changed.

    @reads(lambda path, **_: [(facts.FileState, {"path": path})])
    @operation()
    def whole_file(path, src, mode="644"):
        current = snapshot.read(facts.FileState, path=path)

Every read runs as root (the deploy's config.SUDO); a read that fails on the box (exit status not
0, a missing command, output its fact cannot parse) is read again on its own, so pyinfra reports it
the way it always did.
"""

from __future__ import annotations

import functools
import json
import os
from shlex import quote as q

from pyinfra import host as context_host
from pyinfra.api import StringCommand

from thorfleet import pyinfra_hooks
from thorfleet.runstate import run_state

MARK = "@@thorfleet-read"


def key_of(fact, kwargs):
    """One read: the fact's class and its arguments."""
    return f"{fact.__module__}.{fact.__name__}{json.dumps(kwargs, sort_keys=True, default=str)}"


def reads(declare):
    """Declare what an operation reads: `declare(**its arguments)` returns [(FactClass, {args})].
    Put it above @operation(); the operation's own arguments reach `declare`, pyinfra's do not."""

    def decorator(op):
        params = pyinfra_hooks.operation_parameters(op)

        @functools.wraps(op)
        def planned(*args, **kwargs):
            own = params.bind_partial(
                *args, **{k: v for k, v in kwargs.items() if k in params.parameters})
            own.apply_defaults()
            plan(context_host, declare(**own.arguments))
            return op(*args, **kwargs)

        return planned  # functools.wraps keeps the operation's `_inner`

    return decorator


def plan(target, wanted):
    """Add `wanted` ([(FactClass, {args})]) to what `target` is read for in one round trip."""
    planned = run_state(target.state).planned_reads.setdefault(target.name, {})
    for fact, kwargs in wanted:
        planned[key_of(fact, kwargs)] = (fact, kwargs)


def read(fact, target=None, **kwargs):
    """`target`'s (default: the current host's) value of `fact`, from the host's one-round-trip
    read while it is still true, else from a fact command of its own. For an operation's first
    look at the box, before it yields a command."""
    target = context_host if target is None else target
    key = key_of(fact, kwargs)
    run = run_state(target.state)
    planned = run.planned_reads.get(target.name, {})
    if key in planned and batched() and not _changed_in_run(target):
        held = _held(run, target)
        if key not in held["values"] and key not in held["tried"]:
            missing = {k: v for k, v in planned.items() if k not in held["tried"]}
            held["values"].update(gather(target, missing))
            held["tried"].update(missing)
        if key in held["values"]:
            return held["values"][key]
    return target.get_fact(fact, _sudo=True, **kwargs)


def batched() -> bool:
    """False with THORFLEET_BATCH_READS=0: every read is its own fact command, as in pyinfra
    (to measure what the one round trip saves, or to rule it out when debugging)."""
    return os.environ.get("THORFLEET_BATCH_READS", "1") != "0"


def _held(run, target):
    """The answers read for `target` in this stage of the run (pyinfra plans, then executes: the
    box is read again for the execution)."""
    stage = pyinfra_hooks.stage(target.state)
    held = run.held_reads.get(target.name)
    if held is None or held["stage"] != stage:
        held = run.held_reads[target.name] = {"stage": stage, "values": {}, "tried": set()}
    return held


def _changed_in_run(target):
    """True once an operation has sent `target` a command in this run."""
    return pyinfra_hooks.sent_commands(target)


def script(queries):
    """One shell command that runs every query ([(FactClass, {args})]) at once and prints each
    one's exit status and output after a MARK line, in order."""
    lines = ['d=$(mktemp -d) || exit 1']
    for index, (fact, kwargs) in enumerate(queries):
        command = _command(fact, kwargs)
        # the command on lines of its own: a comment in it cannot swallow the rest
        lines += ["{ (", command, (f') >"$d/{index}" 2>/dev/null </dev/null; '
                                   f'echo $? >"$d/{index}.rc"; }} &')]
    # awk 1: every output ends in a newline, so the next MARK starts its own line
    printed = (f'for i in $(seq 0 {len(queries) - 1}); do read rc <"$d/$i.rc"; '
               f'echo "{MARK} $i $rc"; awk 1 "$d/$i"; done')
    lines += ["wait", printed, 'rm -rf "$d"']
    return "\n".join(lines)


def _command(fact, kwargs):
    instance = fact()
    command = instance.command(**kwargs) if callable(instance.command) else instance.command
    if isinstance(command, StringCommand):
        command = command.get_raw_value()
    requires = instance.requires_command
    if callable(requires):
        requires = requires(**kwargs)
    if requires:  # missing: a failed read, read again on its own (pyinfra's default value then)
        # the command on a line of its own here too: a comment in it cannot swallow the `fi`
        command = (f"if command -v {q(str(requires))} >/dev/null 2>&1; then\n{command}\n"
                   "else exit 127; fi")
    return command


def parse(queries, lines):
    """{key: value} of the queries that exited 0 and whose output their fact could process."""
    outputs, current = {}, None
    for line in lines:
        if line.startswith(MARK + " "):
            index, status = line[len(MARK) + 1:].split(" ", 1)
            current = int(index)
            outputs[current] = (status.strip() == "0", [])
        elif current is not None:
            outputs[current][1].append(line)
    values = {}
    for index, (fact, kwargs) in enumerate(queries):
        ok, output = outputs.get(index, (False, []))
        if not ok:
            continue
        instance = fact()
        try:
            values[key_of(fact, kwargs)] = instance.process(output) if output else \
                instance.default()
        except Exception:  # noqa: BLE001, S110 - read again on its own, reported pyinfra's way
            pass
    return values


def gather(target, planned):
    """Read every query in `planned` ({key: (FactClass, {args})}) from `target` in one command."""
    queries = list(planned.values())
    if not target.connected:
        target.connect(reason="to read the box", raise_exceptions=True)
    state = target.state
    ok, output = target.run_shell_command(StringCommand(script(queries)), _sudo=True,
                                          print_output=state.print_fact_output,
                                          print_input=state.print_fact_input)
    return parse(queries, output.stdout_lines) if ok else {}
