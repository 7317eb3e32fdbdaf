"""The end-of-run report: one row per host, as a table on the terminal and JSON in a file.

Every host gets every field (None when it could not be read). Hosts that finished the run record
what they look like in the run's last operation (`observed`). Hosts that dropped out on the way but
are still connected are read the same way once that last operation has run; a host that could not
be reached at all gets only its error. The report is written when pyinfra exits.

It reads the run's shared state (runstate.py): the operations record into it, and never import this.

A dry run (`pyinfra --dry`, or a run not confirmed) leaves the last report alone and writes its plan
beside it (`<report>.dry.json`). A limited run (`--limit`) reports the hosts it touched and keeps
the others' rows from the last report, marked `"stale": true` with the time they were read
(`as_of`). A host not benchmarked in this run keeps its last figures while it serves the same
version (the benchmark's own `as_of` says when).
"""

from __future__ import annotations

import atexit
import json
import socket
import sys
import time

from pyinfra import host, logger
from pyinfra.api import operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback, StateStage

from thorfleet import facts, pyinfra_hooks
from thorfleet.runstate import run_state
from thorfleet.settings import settings_for_run
from thorfleet.snapshot import read, reads

# Every row has exactly these keys, in this order.
FIELDS = ("l4t_release", "power_mode", "clocks_locked", "weights", "image", "patches", "service",
          "serving_fingerprint", "health", "chat", "reasoning_split", "tok_s", "ttft_s",
          "eagle_acceptance", "vs_median", "benchmark", "changed", "error", "stale", "as_of")
# What a benchmark puts in the row (the whole result stays in "benchmark").
BENCH_FIELDS = ("tok_s", "ttft_s", "eagle_acceptance", "vs_median")
TABLE_WIDTH = 120  # the terminal table never needs more: long values stay in the JSON


def _weights(s):
    return (("model", s.weights_model_repo, s.model_dir, s.weights_model_revision),
            ("draft", s.weights_draft_repo, s.draft_dir, s.weights_draft_revision))


def _server_query(s):
    return {"service": s.service_name, "port": s.service_port, "chat": True}


def observe(target, s):
    """Read what `target` looks like now (facts only; never a change) into the report: from the
    run's first read of the box when the run changed nothing on it (snapshot.py)."""
    weights = {}
    for role, repo, folder, revision in _weights(s):
        state = read(facts.WeightsState, target, folder=folder, revision=revision)
        weights[role] = {"repo": repo, "revision": revision, "verified": state["complete"]}
    labels = read(facts.DockerImageLabels, target, ref=s.image_tag) or {}
    server = read(facts.ServerState, target, **_server_query(s))
    run_state(target.state).observed[target.name] = {
        "l4t_release": read(facts.L4TRelease, target),
        "power_mode": read(facts.PowerMode, target),
        "clocks_locked": read(facts.ClocksLocked, target),
        "weights": weights,
        "image": s.image_tag if labels else None,
        "patches": labels.get("thorfleet.patches"),
        "service": server.get("active"),
        "serving_fingerprint": server.get("proven_fingerprint"),
        "health": server.get("healthy"),
        "chat": server.get("chat_ok"),
        # the proof's reasoning_content check, once thorfleet-serve's state reports it
        "reasoning_split": server.get("reasoning_split"),
    }


@reads(lambda settings, **_: [
    *((facts.WeightsState, {"folder": folder, "revision": revision})
      for _, _, folder, revision in _weights(settings)),
    (facts.DockerImageLabels, {"ref": settings.image_tag}),
    (facts.ServerState, _server_query(settings)),
    (facts.L4TRelease, {}), (facts.PowerMode, {}), (facts.ClocksLocked, {})])
@operation()
def observed(settings):
    """Record what the host looks like now for the report (reads facts; never a change)."""
    yield from ()  # reads only: never a command, so never a change
    if not pyinfra_hooks.executing(host.state):
        host.noop("the report reads the host after the run")
        return
    observe(host, settings)
    host.noop("state recorded for the report")


class _ReadDroppedHosts(BaseStateCallback):
    """Once the run's last operation has run, read the hosts that dropped out on the way."""

    @staticmethod
    def operation_end(state, op_hash):
        if op_hash != state.get_op_order()[-1]:
            return
        observed = run_state(state).observed
        for h in state.failed_hosts:
            if h.name in observed or not h.connected:
                continue
            try:
                observe(h, settings_for_run(state)[h.name])
            # a box that broke mid-run: report what we have
            except (PyinfraError, OSError, KeyError, TypeError, ValueError) as error:
                logger.warning(f"thorfleet: could not read {h.name} for the report: {error}")


def install(state, path):
    """Write the report when pyinfra exits (once per run, however many hosts)."""
    run = run_state(state)
    if run.report_path is None:
        run.report_path = path
        state.add_callback_handler(_ReadDroppedHosts())
        atexit.register(_write, state, path)


def _unreachable(h):
    """Why a host that never connected could not be reached, in a few words."""
    address = h.data.get("ssh_hostname") or h.name
    port = h.data.get("ssh_port") or 22
    try:
        with socket.create_connection((address, port), timeout=3):
            return f"could not connect over SSH to {address}:{port} (see pyinfra's output above)"
    except OSError as error:
        return f"could not connect to {address}:{port}: {error.strerror or error}"


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _host_rows(state, previous=None, now=None):
    """{host: row}; `previous`: the last report's rows, kept (marked stale) for the hosts outside
    this run's --limit, and for their benchmark when a host serves the version it measured."""
    run, rows, now = run_state(state), {}, now or _now()
    previous = previous or {}
    in_limit = getattr(state, "is_host_in_limit", lambda h: True)
    for h in state.inventory:
        if not in_limit(h):
            row = {field: None for field in FIELDS}
            if h.name in previous:
                row.update({k: v for k, v in previous[h.name].items() if k in FIELDS})
                row.update(stale=True, as_of=previous[h.name].get("as_of"))
            else:
                row.update(changed=[], stale=True,
                           error="not in this run (--limit) and in no earlier report")
            rows[h.name] = row
            continue
        changed, failed = [], []
        for op_hash in state.get_op_order():
            op_data = state.ops[h].get(op_hash)
            if op_data is None or not op_data.operation_meta.is_complete():
                continue
            name = min(state.get_op_meta(op_hash).names)
            meta = op_data.operation_meta
            if meta.did_error():
                tail = (meta.stdout_lines + meta.stderr_lines)[-6:]
                # a FunctionCommand that failed the host said why through RunState.fail
                if tail or not run.errors.get(h.name):
                    failed.append(f"{name}: " + " / ".join(line.strip() for line in tail))
            elif meta.did_change():
                changed.append(name)
        errors = run.errors.get(h.name, []) + failed
        if h in state.failed_hosts and not errors:
            errors = [_unreachable(h) if not h.connected and h.name not in run.observed
                      else "failed before any operation (see pyinfra's output above)"]
        row = {field: None for field in FIELDS}
        row.update(run.observed.get(h.name, {}))
        bench = run.benchmarks.get(h.name)
        last = previous.get(h.name) or {}
        if bench is None and last.get("benchmark") and row["serving_fingerprint"] and \
                last.get("serving_fingerprint") == row["serving_fingerprint"]:
            # the last figures of the version it still serves, marked as such
            bench = {**last["benchmark"], "from_earlier_run": True}
        if bench is not None:
            row.update({k: bench.get(k) for k in BENCH_FIELDS}, benchmark=bench)
        row.update(changed=changed, error="; ".join(errors) or None, stale=False, as_of=now)
        rows[h.name] = row
    return rows


def _read_previous(path):
    """The last report's rows ({} when there is none or it cannot be read)."""
    try:
        with open(path) as f:
            hosts = json.load(f).get("hosts")
    except (OSError, ValueError, AttributeError):
        return {}
    return hosts if isinstance(hosts, dict) else {}


def _planned(state):
    """{host: [operations a dry run would change]}: what `pyinfra --dry` would do."""
    plan = {}
    for h in state.inventory:
        if not getattr(state, "is_host_in_limit", lambda _: True)(h):
            continue
        plan[h.name] = [min(state.get_op_meta(op_hash).names)
                        for op_hash in state.get_op_order()
                        if (op := state.ops[h].get(op_hash)) is not None
                        and op.operation_meta._maybe_is_change]
    return plan


def _write(state, path):
    if state.current_stage < StateStage.Execute:
        # --dry (or a run not confirmed): nothing ran, the last report still tells the truth.
        dry = f"{path}.dry.json"
        plan = {"dry_run": True, "planned": _now(), "would_change": _planned(state)}
        try:
            with open(dry, "w") as f:
                json.dump(plan, f, indent=2, sort_keys=True)
            print(f"thorfleet: dry run: the last report ({path}) is left alone; the plan is in "
                  f"{dry}", file=sys.stderr)
        except OSError as error:
            print(f"thorfleet: could not write the plan to {dry}: {error}", file=sys.stderr)
        return
    rows = _host_rows(state, _read_previous(path))
    medians = {b.get("fleet_median_tok_s") for b in run_state(state).benchmarks.values()} - {None}
    report = {"finished": _now(), "fleet_median_tok_s": medians.pop() if len(medians) == 1 else None,
              "hosts": rows}
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
    except OSError as error:
        print(f"thorfleet: could not write the report to {path}: {error}", file=sys.stderr)
    _print_table(rows, path, report["fleet_median_tok_s"])


def _mark(value):
    if value is True or value is False:
        return "yes" if value else "NO"
    return "-" if value is None else str(value)


COLUMNS = (("host", "left"), ("version", "left"), ("health", "left"), ("chat", "left"),
           ("think", "left"), ("tok/s", "right"), ("vs med", "right"), ("TTFT", "right"),
           ("EAGLE", "right"), ("chg", "right"), ("error", "left"))
HOST_WIDTH = 16  # a longer host name is cut with an ellipsis (in full in the JSON)


def _cells(name, row):
    """One host's cells, as the table shows them."""
    bench = row.get("benchmark") or {}
    tok_s, ratio = row.get("tok_s"), row.get("vs_median")
    acceptance = row.get("eagle_acceptance")
    error = row.get("error") or ""
    if row.get("stale"):
        error = f"stale: as of {row.get('as_of') or '?'}" + \
            (f"; {error}" if error else "")
    return (
        name,
        (row.get("serving_fingerprint") or "-")[:8],
        _mark(row.get("health")),
        _mark(row.get("chat")),
        _mark(row.get("reasoning_split")),
        "-" if tok_s is None else f"{tok_s:.1f}{'*' if bench.get('from_earlier_run') else ''}",
        "-" if ratio is None else f"{ratio:.2f}x",
        "-" if row.get("ttft_s") is None else f"{row['ttft_s']:.2f}s",
        "-" if acceptance is None else f"{acceptance:.2f}",
        str(len(row.get("changed") or ())),
        error,
    )


def table(rows, median=None, width=TABLE_WIDTH):
    """The report as a rich Table of at most `width` columns, one line per host: every column but
    the error is as wide as its widest cell, the error gets the rest and is cut with an ellipsis;
    long values (patches, weights, the whole error) are in the JSON."""
    from rich.table import Table

    cells = [_cells(name, row) for name, row in rows.items()]
    widths = [max([len(header), *(len(c[i]) for c in cells)])
              for i, (header, _) in enumerate(COLUMNS[:-1])]
    widths[0] = min(widths[0], HOST_WIDTH)
    # no rules and no padding at the edges: two spaces between columns
    rest = width - sum(widths) - 2 * (len(COLUMNS) - 1)
    title = "thorfleet report" + (f": fleet median {median:.1f} tok/s" if median else "")
    grid = Table(title=title, title_justify="left", box=None, pad_edge=False,
                 header_style="bold underline")
    for (header, justify), size in zip(COLUMNS, [*widths, max(rest, len("error"))]):
        grid.add_column(header, justify=justify, no_wrap=True, overflow="ellipsis",
                        min_width=size if header != "error" else None, max_width=size)
    for row in cells:
        grid.add_row(*row)
    return grid


def _print_table(rows, path, median=None):
    from rich.console import Console

    console = Console(stderr=True, width=TABLE_WIDTH)
    console.print(table(rows, median))
    console.print(f"Every field is in {path} (tok/s with *: measured in an earlier run; "
                  "stale: a host not in this run)",
                  soft_wrap=True)
