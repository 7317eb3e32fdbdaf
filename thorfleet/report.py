"""The end-of-run report: one row per host, as a table on the terminal and JSON in a file.

Every host gets every field (None when it could not be read). Hosts that finished the run record
what they look like in the run's last operation (`observed`). Hosts that dropped out on the way but
are still connected are read the same way once that last operation has run; a host that could not
be reached at all gets only its error. The report is written when pyinfra exits.

It reads the run's shared state (runstate.py): the operations record into it, and never import this.
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

from thorfleet import facts
from thorfleet.runstate import run_state
from thorfleet.settings import settings_for_run

# Every row has exactly these keys, in this order.
FIELDS = ("l4t_release", "power_mode", "clocks_locked", "weights", "image", "patches", "service",
          "serving_fingerprint", "health", "chat", "changed", "error")


def observe(target, s):
    """Read what `target` looks like now (facts only; never a change) into the report."""
    weights = {}
    for role, repo, folder, revision in (
        ("model", s.weights_model_repo, s.model_dir, s.weights_model_revision),
        ("draft", s.weights_draft_repo, s.draft_dir, s.weights_draft_revision),
    ):
        state = target.get_fact(facts.WeightsState, folder=folder, revision=revision, _sudo=True)
        weights[role] = {"repo": repo, "revision": revision, "verified": state["complete"]}
    labels = target.get_fact(facts.DockerImageLabels, ref=s.image_tag, _sudo=True) or {}
    server = target.get_fact(facts.ServerState, service=s.service_name, port=s.service_port,
                             chat=True, _sudo=True)
    run_state(target.state).observed[target.name] = {
        "l4t_release": target.get_fact(facts.L4TRelease),
        "power_mode": target.get_fact(facts.PowerMode, _sudo=True),
        "clocks_locked": target.get_fact(facts.ClocksLocked, _sudo=True),
        "weights": weights,
        "image": s.image_tag if labels else None,
        "patches": labels.get("thorfleet.patches"),
        "service": server.get("active"),
        "serving_fingerprint": server.get("proven_fingerprint"),
        "health": server.get("healthy"),
        "chat": server.get("chat_ok"),
    }


@operation()
def observed(s):
    """Record what the host looks like now for the report (reads facts; never a change)."""
    yield from ()  # reads only: never a command, so never a change
    if host.state.current_stage != StateStage.Execute:
        host.noop("the report reads the host after the run")
        return
    observe(host, s)
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


def _host_rows(state):
    run, rows = run_state(state), {}
    for h in state.inventory:
        changed, failed = [], []
        for op_hash in state.get_op_order():
            op_data = state.ops[h].get(op_hash)
            if op_data is None or not op_data.operation_meta.is_complete():
                continue
            name = min(state.get_op_meta(op_hash).names)
            meta = op_data.operation_meta
            if meta.did_error():
                tail = (meta.stdout_lines + meta.stderr_lines)[-6:]
                failed.append(f"{name}: " + " / ".join(line.strip() for line in tail))
            elif meta.did_change():
                changed.append(name)
        errors = run.errors.get(h.name, []) + failed
        if h in state.failed_hosts and not errors:
            errors = [_unreachable(h) if not h.connected and h.name not in run.observed
                      else "failed before any operation (see pyinfra's output above)"]
        row = {field: None for field in FIELDS}
        row.update(run.observed.get(h.name, {}))
        row.update(changed=changed, error="; ".join(errors) or None)
        rows[h.name] = row
    return rows


def _write(state, path):
    rows = _host_rows(state)
    report = {"finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "hosts": rows}
    try:
        with open(path, "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
    except OSError as error:
        print(f"thorfleet: could not write the report to {path}: {error}", file=sys.stderr)
    _print_table(rows, path)


def _print_table(rows, path):
    from rich.console import Console
    from rich.table import Table

    def mark(value):
        if value is True or value is False:
            return "yes" if value else "NO"
        return "-" if value is None else str(value)

    table = Table(title=f"thorfleet report (also in {path})")
    for column in ("host", "L4T", "power", "clocks", "weights", "image / patches", "service",
                   "health", "chat", "changed", "error"):
        table.add_column(column, overflow="fold")
    for name, row in rows.items():
        weights = row.get("weights") or {}
        table.add_row(
            name,
            mark(row["l4t_release"]),
            mark(row["power_mode"]),
            mark(row["clocks_locked"]),
            ", ".join(f"{k}@{v['revision'][:8]} {'ok' if v['verified'] else 'BAD'}"
                      for k, v in weights.items()) or "-",
            f"{row['image'] or '-'} {row['patches'] or ''}".strip(),
            mark(row["service"]),
            mark(row["health"]),
            mark(row["chat"]),
            str(len(row["changed"])),
            row["error"] or "",
        )
    Console(stderr=True, width=200).print(table)
