"""What a converged run reads from a box, in one SSH round trip.

pyinfra runs one command per fact, and thorfleet's operations read about forty of them: on a
converged box those round trips were most of a re-run. So every thorfleet operation declares what
it reads (`@reads`), once, above its body; the declaration is planned when the operation is called
and the answers are handed to the body when it runs. The first read on a host runs all of that
host's declared reads in one command, in parallel on the box, and keeps the answers. They answer
the host's operations until the host has changed something in this run (an operation sent it a
command); from then on each read is its own fact command, as in pyinfra, so no operation decides on
what an earlier one has changed.

    @reads(current=lambda path, **_: (facts.system.FileState, {"path": path}))
    @operation()
    def whole_file(path, src, mode="644", *, current):
        if current == ...

Every read runs as root (the deploy's config.SUDO); a read that fails on the box (exit status not
0, a missing command, output its fact cannot parse) is read again on its own, so pyinfra reports it
the way it always did. A read with pyinfra's own arguments (`{"_sudo": False}`) is always its own
fact command: the one command runs as root.

THORFLEET_BATCH_READS=0 in the environment makes every read its own fact command, as pyinfra does
without this module (to measure what the one round trip saves).
"""

from __future__ import annotations

import functools
import json
import os
from inspect import Parameter, signature
from shlex import quote as q

from pyinfra import host as context_host
from pyinfra.api import StringCommand, operation

from thorfleet.run import pyinfra_hooks
from thorfleet.run.runstate import run_state

MARK = "@@thorfleet-read"


def key_of(fact, kwargs):
    """One read: the fact's class and its arguments."""
    return f"{fact.__module__}.{fact.__name__}{json.dumps(kwargs, sort_keys=True, default=str)}"


def batched():
    """Whether declared reads share one round trip (THORFLEET_BATCH_READS, default 1)."""
    return os.environ.get("THORFLEET_BATCH_READS", "1") != "0"


def reads(*declare, **named):
    """Declare what an operation reads; put it above @operation().

    Each keyword names one read: `lambda **operation arguments: (FactClass, {fact arguments})`, or
    None when nothing is read with those arguments. The body takes each name as a keyword-only
    argument: its answer, read whenever pyinfra runs the body (plan, then execute). The operation's
    callers pass only its own arguments; pyinfra's (`name`, `_sudo`, ...) never reach `named`.

    `declare(**arguments)` returning [(FactClass, {args})] declares reads that the body makes
    itself through a function it shares with code outside any operation (report.observe).
    """

    def decorator(op):
        if named:
            op = _answered(op, named)
        params = pyinfra_hooks.operation_parameters(op)
        # pyinfra's own arguments (name, _sudo, ...) bound apart, then dropped: never a read's
        loose = params.replace(parameters=[*params.parameters.values(),
                                           Parameter("_pyinfra", Parameter.VAR_KEYWORD)])

        def declared_for(*args, **kwargs):
            own = loose.bind_partial(*args, **kwargs)
            own.arguments.pop("_pyinfra", None)
            own.apply_defaults()
            return [*(query for d in declare for query in d(**own.arguments)),
                    *_named_queries(named, own).values()]

        @functools.wraps(op)
        def planned(*args, **kwargs):  # called while the deploy is planned: declared before run
            plan(context_host, declared_for(*args, **kwargs))
            return op(*args, **kwargs)

        planned.declared = declared_for
        return planned

    return decorator


def declared(op, *args, **kwargs):
    """[(FactClass, {args})] that `op` reads called with these arguments ([] without @reads)."""
    declare = getattr(op, "declared", None)
    return declare(*args, **kwargs) if declare else []


def _named_queries(named, bound):
    """{name: (FactClass, {args})} of the named reads that apply to the operation's arguments
    (`bound`, inspect's BoundArguments)."""
    queries = {name: query(**bound.arguments) for name, query in named.items()}
    return {name: query for name, query in queries.items() if query is not None}


def _answered(op, named):
    """`op` again, its body handed the answers of its `named` reads as keyword arguments."""
    body = pyinfra_hooks.operation_body(op)
    full = signature(body)
    untaken = [name for name in named
               if getattr(full.parameters.get(name), "kind", None) != Parameter.KEYWORD_ONLY]
    if untaken:
        raise TypeError(f"{body.__name__} takes no keyword-only argument {', '.join(untaken)}: "
                        "each named read is one")
    own = full.replace(parameters=[p for p in full.parameters.values() if p.name not in named])

    @functools.wraps(body)
    def answered(*args, **kwargs):
        arguments = own.bind(*args, **kwargs)
        arguments.apply_defaults()
        answers = dict.fromkeys(named)
        for name, (fact, fact_kwargs) in _named_queries(named, arguments).items():
            answers[name] = read(fact, **fact_kwargs)
        yield from body(*args, **kwargs, **answers)

    answered.__signature__ = own  # what callers (and pyinfra's argument check) may pass
    # pyinfra runs the function its operation() was given: to hand the body its answers, that
    # function must be `answered`, so it is wrapped again, with the options the first one set
    return operation(**pyinfra_hooks.operation_options(body))(answered)


def plan(target, wanted):
    """Add `wanted` ([(FactClass, {args})]) to what `target` is read for in one round trip."""
    planned = run_state(target.state).planned_reads.setdefault(target.name, {})
    for fact, kwargs in wanted:
        # pyinfra's arguments, or a fact that must be read alone (RunLock): a command of its own
        if getattr(fact, "batched", True) and not any(k.startswith("_") for k in kwargs):
            planned[key_of(fact, kwargs)] = (fact, kwargs)


def is_planned(target, fact, **kwargs):
    """Whether one of `target`'s operations declared this read in this run."""
    return key_of(fact, kwargs) in run_state(target.state).planned_reads.get(target.name, {})


def read(fact, target=None, **kwargs):
    """`target`'s (default: the current host's) value of `fact`, from the host's one-round-trip
    read while it is still true, else from a fact command of its own. For an operation's first
    look at the box, before it yields a command."""
    target = context_host if target is None else target
    key = key_of(fact, kwargs)
    records = run_state(target.state)
    planned = records.planned_reads.get(target.name, {})
    if batched() and key in planned and not _changed_in_run(target):
        answers = _answers_this_stage(records, target)
        if key not in answers["values"] and key not in answers["tried"]:
            missing = {k: v for k, v in planned.items() if k not in answers["tried"]}
            answers["values"].update(gather(target, missing))
            answers["tried"].update(missing)
        if key in answers["values"]:
            return answers["values"][key]
    return target.get_fact(fact, **{"_sudo": True, **kwargs})


def _answers_this_stage(records, target):
    """The answers read for `target` in this stage of the run (pyinfra plans, then executes: the
    box is read again for the execution)."""
    stage = pyinfra_hooks.stage(target.state)
    answers = records.held_reads.get(target.name)
    if answers is None or answers["stage"] != stage:
        answers = records.held_reads[target.name] = {"stage": stage, "values": {}, "tried": set()}
    return answers


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
    command, requires = pyinfra_hooks.fact_command(fact, kwargs)
    if requires:  # missing: a failed read, read again on its own (pyinfra's default value then)
        # the command on a line of its own here too: a comment in it cannot swallow the `fi`
        command = (f"if command -v {q(str(requires))} >/dev/null 2>&1; then\n{command}\n"
                   "else exit 127; fi")
    return command


def outputs(lines) -> dict[int, tuple[str, list[str]]]:
    """{query index: (its exit status as printed, its output lines)} of script()'s output."""
    found, current = {}, None
    for line in lines:
        if line.startswith(MARK + " "):
            index, status = line[len(MARK) + 1:].split(" ", 1)
            current = int(index)
            found[current] = (status.strip(), [])
        elif current is not None:
            found[current][1].append(line)
    return found


def parse(queries, lines):
    """{key: value} of the queries that exited 0 and whose output their fact could process."""
    printed = outputs(lines)
    values = {}
    for index, (fact, kwargs) in enumerate(queries):
        status, output = printed.get(index, ("?", []))
        if status != "0":
            continue
        try:
            values[key_of(fact, kwargs)] = pyinfra_hooks.fact_value(fact, output)
        except Exception:  # noqa: BLE001, S110 - read again on its own, reported pyinfra's way
            pass
    return values


def gather(target, planned):
    """Read every query in `planned` ({key: (FactClass, {args})}) from `target` in one command."""
    queries = list(planned.values())
    pyinfra_hooks.connected(target, "to read the box")
    state = target.state
    ok, output = target.run_shell_command(StringCommand(script(queries)), _sudo=True,
                                          print_output=state.print_fact_output,
                                          print_input=state.print_fact_input)
    return parse(queries, output.stdout_lines) if ok else {}
