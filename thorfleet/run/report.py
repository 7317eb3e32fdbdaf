"""The end-of-run report, as pyinfra runs it: a row per host, as a table on the terminal and JSON
in a file, written when pyinfra exits.

    report.install(host.state, path)                  # deploy.py: once per run, however many hosts
    report.observed(name="...", settings=settings)    # the run's last operation

Hosts that finished the run record what they look like in the run's last operation (`observed`).
Hosts that dropped out on the way but are still connected are read the same way once that last
operation has run; a host the run could not connect to gets only its error, the one line with its
fix said as it connected (`unreachable`; a probe of its SSH port under the Python API). A run
that reached none of its Thors still writes its report (its plan under --dry): config.py's
`before_connecting` hands `unreachable` every host that cannot be reached, which installs it.
The rows are built in report_rows.py (the --limit merge is there too), the table in
report_table.py; this module gathers what they need from pyinfra (pyinfra_hooks.py).

It reads the run's shared state (runstate.py): the operations record into it, and never import this.

A dry run (`pyinfra --dry`, or a run not confirmed) leaves the last report alone and writes its plan
beside it (`<report>.dry.json`). Each file is replaced whole (a temporary file beside it, then a
rename), so a run cut while writing leaves the last report as it was. A last report that does not
parse is not merged: it is kept beside as `<report>.broken`, the run says so and goes on (the report
is the run's record, not one of its steps), and the hosts outside --limit say why they have no row.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys

from pyinfra import host, logger
from pyinfra.api import operation
from pyinfra.api.exceptions import PyinfraError

from thorfleet import facts
from thorfleet.run import pyinfra_hooks
from thorfleet.run.laptop import write_whole
from thorfleet.run.report_rows import (
    FIELDS,
    NO_EARLIER_REPORT,
    HostRun,
    dry_run_plan,
    host_rows,
    whole_report,
)
from thorfleet.run.report_table import print_table
from thorfleet.run.runstate import run_state
from thorfleet.run.snapshot import read, reads
from thorfleet.run.unreachable import why_unreachable
from thorfleet.settings.roles import thors

__all__ = ["FIELDS", "install", "observe", "observed", "write"]


def _weights(settings):
    return (("model", settings.weights_model_repo, settings.model_dir,
             settings.weights_model_revision),
            ("draft", settings.weights_draft_repo, settings.draft_dir,
             settings.weights_draft_revision))


def _server_query(settings):
    return {"service": settings.service_name, "port": settings.service_port, "chat": True}


def observe(target, settings):
    """Read what `target` looks like now (facts only; never a change) into the report: from the
    run's first read of the box when the run changed nothing on it (snapshot.py)."""
    weights = {}
    for role, repo, folder, revision in _weights(settings):
        found = read(facts.serving.WeightsState, target, folder=folder, revision=revision)
        weights[role] = {"repo": repo, "revision": revision, "verified": found["complete"]}
    labels = read(facts.serving.DockerImageLabels, target, ref=settings.image_tag) or {}
    server = read(facts.serving.ServerState, target, **_server_query(settings))
    run_state(target.state).observed[target.name] = {
        "l4t_release": read(facts.box.L4TRelease, target),
        "power_mode": read(facts.power.PowerMode, target),
        "clocks_locked": (read(facts.power.Clocks, target) or {}).get("locked"),
        "weights": weights,
        "image": settings.image_tag if labels else None,
        "patches": labels.get("thorfleet.patches"),
        "service": server.get("active"),
        "serving_fingerprint": server.get("proven_fingerprint"),
        "health": server.get("healthy"),
        "chat": server.get("chat_ok"),
        # the proof's reasoning_content check, once thorfleet-serve's state reports it
        "reasoning_split": server.get("reasoning_split"),
    }


@reads(lambda settings, **_: [
    *((facts.serving.WeightsState, {"folder": folder, "revision": revision})
      for _, _, folder, revision in _weights(settings)),
    (facts.serving.DockerImageLabels, {"ref": settings.image_tag}),
    (facts.serving.ServerState, _server_query(settings)),
    (facts.box.L4TRelease, {}), (facts.power.PowerMode, {}), (facts.power.Clocks, {})])
@operation()
def observed(settings):
    """Record what the host looks like now for the report (reads facts; never a change)."""
    yield from ()  # reads only: never a command, so never a change
    if not pyinfra_hooks.executing(host.state):
        host.noop("the report reads the host after the run")
        return
    observe(host, settings)
    host.noop("state recorded for the report")


def _read_dropped_hosts(state):
    """Read the hosts that dropped out on the way (once the run's last operation has run)."""
    observed = run_state(state).observed
    for h in pyinfra_hooks.failed_hosts(state):
        if h.name in observed or not h.connected:
            continue
        try:
            observe(h, run_state(state).planned()[h.name])
        # a box that broke mid-run: report what we have
        except (PyinfraError, OSError, KeyError, TypeError, ValueError) as error:
            logger.warning(f"thorfleet: could not read {h.name} for the report: {error}")


def before_connecting(state):
    """config.py's step as the inventory loads: each host the run cannot connect to is said in one
    line with its fix and gets its row (`unreachable`). Whether the CLI was given --dry is read
    now: click's context is gone when the report is written, at exit."""
    run_state(state).dry_run = pyinfra_hooks.cli_dry_run()
    pyinfra_hooks.when_unreachable(unreachable)(state)


def unreachable(state, h, error):
    """Say in one line why the run cannot connect to `h` and the fix, and keep it for its row.
    A run with a Thor in it writes its report even when no host is left to run deploy.py (which
    installs it otherwise); a run of the gateways alone writes none, as ever."""
    data = h.data.dict()
    try:
        where = pyinfra_hooks.ssh_destination(h.name, data)
    except (TypeError, ValueError):  # an ssh_port that is no number: pyinfra's words say it
        where = pyinfra_hooks.SSHDestination(data.get("ssh_hostname") or h.name,
                                             data.get("ssh_port"), ("~/.ssh/known_hosts",))
    known_hosts = data.get("ssh_known_hosts_file") or where.known_hosts[0]
    run_state(state).fail(h, why_unreachable(error, address=where.address, port=where.port,
                                             user=data.get("ssh_user"), key=data.get("ssh_key"),
                                             known_hosts=known_hosts))
    first = next((t for t in thors(state.inventory) if pyinfra_hooks.in_limit(state, t)), None)
    if first is not None:
        install(state, run_state(state).planned()[first.name].rollout_report_path)


def install(state, path):
    """Write the report when pyinfra exits (once per run, however many hosts)."""
    recorded = run_state(state)
    if recorded.report_path is None:
        recorded.report_path = path
        pyinfra_hooks.after_last_operation(state, _read_dropped_hosts)
        atexit.register(write, state, path)


def name_the_gateways_left_behind(state):
    """At the run's end, say which gateway of a pair this run did not bring level, when no report
    will (a run of the gateways alone, `--limit gateway`: the report is the Thors')."""
    recorded = run_state(state)
    if not recorded.gateways_told:
        recorded.gateways_told = True
        atexit.register(_say_left_behind, state)


def _say_left_behind(state):
    recorded = run_state(state)
    front = None if recorded.report_path is not None else _front_door(state)
    if front is None:
        return  # the report says it, or there is no gateway
    for name, why in sorted(_not_level(state, front, recorded).items()):
        print(f"thorfleet: gateway {name} is not level with this run ({why}): it stays out of "
              f"gateway_virtual_ip until a run reaches it", file=sys.stderr)


def _front_door(state):
    """The run's GatewaySettings, or None without a gateway."""
    try:
        held = run_state(state).planned()
    except Exception:  # noqa: BLE001 - refused settings: the run stopped before, no gateway
        return None
    return next((s.gateway_role for s in held.values() if s.gateway_role is not None), None)


def _not_level(state, front, recorded) -> dict:
    """{gateway: why} of the gateways sharing gateway_virtual_ip that this run did not bring level
    (it failed them, or a drain or ready could not reach them): each one's level check keeps it
    from taking the address until a run does. One gateway alone: nothing to be level with."""
    if len(front.pair) < 2:
        return {}
    failed = {h.name for h in pyinfra_hooks.failed_hosts(state)}
    return {name: "; ".join(recorded.errors.get(name, [])) or "this run did not reach it"
            for name, _ in front.pair if name in failed or name in recorded.errors}


def _unreachable(h):
    """Why a host that never connected could not be reached, in a few words."""
    address = h.data.get("ssh_hostname") or h.name
    port = h.data.get("ssh_port") or 22
    try:
        with socket.create_connection((address, port), timeout=3):
            return f"could not connect over SSH to {address}:{port} (see pyinfra's output above)"
    except OSError as error:
        return f"could not connect to {address}:{port}: {error.strerror or error}"


def host_runs(state):
    """[HostRun] of every inventory host, as this run left it."""
    failed = set(pyinfra_hooks.failed_hosts(state))
    found = []
    for h in thors(state.inventory):
        if not pyinfra_hooks.in_limit(state, h):
            found.append(HostRun(h.name, in_limit=False))
            continue
        found.append(HostRun(h.name, failed=h in failed, connected=h.connected,
                             operations=tuple(pyinfra_hooks.outcomes(state, h))))
    return found


def read_previous(path):
    """(the last report's rows, None), or ({}, why they are not merged). A report that does not
    parse (a cut run, an edit) is moved aside to `<path>.broken`: kept to look at, never merged."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return {}, None
    except OSError as error:
        return {}, f"cannot be read ({error.strerror or error})"
    try:
        content = json.loads(text)
    except ValueError as error:  # truncated, or not JSON at all
        problem = str(error)
    else:
        hosts = content.get("hosts") if isinstance(content, dict) else None
        if isinstance(hosts, dict):
            return hosts, None
        problem = 'not a report: no "hosts" object'
    broken = f"{path}.broken"
    try:
        os.replace(path, broken)
    except OSError as error:
        return {}, f"does not parse ({problem}) and could not be moved to {broken}: {error}"
    return {}, f"does not parse ({problem}); it is kept as {broken}"


def _not_reached(state) -> dict:
    """{host: why} of the run's Thors it could not connect to."""
    errors = run_state(state).errors
    return {h.name: "; ".join(errors.get(h.name, [])) or _unreachable(h)
            for h in thors(state.inventory) if pyinfra_hooks.in_limit(state, h)
            and h in pyinfra_hooks.failed_hosts(state) and not h.connected}


def _reached_none(state) -> bool:
    """Whether the run stopped while connecting because it could reach none of its Thors
    (pyinfra's "No hosts remaining!"), rather than cut there (Ctrl-C, pyinfra's fail percent)."""
    inside = [h for h in thors(state.inventory) if pyinfra_hooks.in_limit(state, h)]
    return bool(inside) and len(_not_reached(state)) == len(inside)


def is_plan(state) -> bool:
    """Whether the run's end writes a plan, not the report: --dry, or a run not confirmed, which
    stopped before executing. A run that stopped while connecting (no host left) is the one
    exception: it writes its report unless it was given --dry."""
    if pyinfra_hooks.stopped_connecting(state):
        return run_state(state).dry_run
    return not pyinfra_hooks.executing(state)


def write(state, path):
    """Write the report (or a dry run's plan) and print the table: pyinfra's exit, once per run."""
    if pyinfra_hooks.stopped_connecting(state) and not _reached_none(state):
        return  # cut while connecting: it knows nothing new, the last report and plan stand
    if is_plan(state):
        # --dry (or a run not confirmed): nothing ran, the last report still tells the truth.
        dry = f"{path}.dry.json"
        away = _not_reached(state)
        plan = dry_run_plan({h.name: pyinfra_hooks.planned_changes(state, h)
                             for h in thors(state.inventory) if pyinfra_hooks.in_limit(state, h)
                             and h.name not in away}, unreachable=away)
        try:
            write_whole(dry, json.dumps(plan, indent=2, sort_keys=True))
            print(f"thorfleet: dry run: the last report ({path}) is left alone; the plan is in "
                  f"{dry}", file=sys.stderr)
        except OSError as error:
            print(f"thorfleet: could not write the plan to {dry}: {error}", file=sys.stderr)
        return
    previous, refused = read_previous(path)
    no_previous = NO_EARLIER_REPORT
    if refused:  # the run still writes its own rows: the report is its record, not one of its steps
        print(f"thorfleet: the last report {path} {refused}: not merged, so the hosts outside "
              "this run's --limit have no row and earlier benchmark figures are not carried over; "
              "run without --limit to read every host again", file=sys.stderr)
        no_previous = f"the last report was not merged ({path} {refused})"
    by_name = {h.name: h for h in state.inventory}
    recorded = run_state(state)
    rows = host_rows(host_runs(state), recorded, previous,
                     probe=lambda name: _unreachable(by_name[name]), no_previous=no_previous)
    report = whole_report(rows, recorded)
    front = _front_door(state)
    if front is not None:
        # What clients use (the URL and the file they trust), and the boxes this run left out
        # of the gateway's rotation (a failed proof), with why.
        report["endpoint"] = front.endpoint
        behind = _not_level(state, front, recorded)
        report["gateway"] = {"host": front.name, "hosts": [name for name, _ in front.pair],
                             "out_of_rotation": recorded.out_of_rotation, "not_level": behind}
        for name, why in sorted(recorded.out_of_rotation.items()):
            print(f"thorfleet: {name} is out of the gateway's rotation: {why}", file=sys.stderr)
        for name, why in sorted(behind.items()):
            print(f"thorfleet: gateway {name} is not level with this run ({why}): it stays out of "
                  f"gateway_virtual_ip until a run reaches it", file=sys.stderr)
    try:
        write_whole(path, json.dumps(report, indent=2, sort_keys=True))
    except OSError as error:
        print(f"thorfleet: could not write the report to {path}: {error}", file=sys.stderr)
    print_table(rows, path, report["fleet_median_tok_s"])
