"""The end-of-run report: one row per host, as a table on the terminal and JSON in a file.

Each host records what it observed in the last operation of the run (`observed`); hosts that
dropped out record nothing and are reported with the step that failed and its output. The report is
written when pyinfra exits, once every host has finished.
"""

from __future__ import annotations

import atexit
import json
import sys
import time

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.state import StateStage

from thorfleet import facts

observed_by_host: dict[str, dict] = {}
errors_by_host: dict[str, list[str]] = {}
_installed: list = []


def note_error(host_name, message):
    errors_by_host.setdefault(host_name, []).append(message)


@operation()
def observed(s):
    """Record what the host looks like now for the report (reads facts; never a change)."""
    yield from ()  # reads only: never a command, so never a change
    if host.state.current_stage != StateStage.Execute:
        host.noop("the report reads the host after the run")
        return
    weights = {}
    for role, repo, folder, revision in (
        ("model", s.weights_model_repo, s.model_dir, s.weights_model_revision),
        ("draft", s.weights_draft_repo, s.draft_dir, s.weights_draft_revision),
    ):
        state = host.get_fact(facts.WeightsState, folder=folder, revision=revision, _sudo=True)
        weights[role] = {"repo": repo, "revision": revision, "verified": state["complete"]}
    labels = host.get_fact(facts.DockerImageLabels, ref=s.image_tag, _sudo=True) or {}
    server = host.get_fact(facts.ServerState, service=s.service_name, port=s.service_port,
                           chat=True, _sudo=True)
    observed_by_host[host.name] = {
        "l4t_release": host.get_fact(facts.L4TRelease),
        "power_mode": host.get_fact(facts.PowerMode, _sudo=True),
        "clocks_locked": host.get_fact(facts.ClocksLocked, _sudo=True),
        "weights": weights,
        "image": s.image_tag if labels else None,
        "patches": labels.get("thorfleet.patches"),
        "service": server.get("active"),
        "serving_fingerprint": server.get("proven_fingerprint"),
        "health": server.get("healthy"),
        "chat": server.get("chat_ok"),
    }
    host.noop("state recorded for the report")


def install(state, path):
    """Write the report when pyinfra exits (once per run, however many hosts)."""
    if not _installed:
        _installed.append(path)
        atexit.register(_write, state, path)


def _host_rows(state):
    rows = {}
    for h in state.inventory:
        changed, failed = [], []
        for op_hash in state.get_op_order():
            op_data = state.ops[h].get(op_hash)
            if op_data is None or not op_data.operation_meta.is_complete():
                continue
            name = sorted(state.get_op_meta(op_hash).names)[0]
            meta = op_data.operation_meta
            if meta.did_error():
                tail = (meta.stdout_lines + meta.stderr_lines)[-6:]
                failed.append(f"{name}: " + " / ".join(line.strip() for line in tail))
            elif meta.did_change():
                changed.append(name)
        errors = errors_by_host.get(h.name, []) + failed
        if h in state.failed_hosts and not errors:
            errors = ["could not connect or failed before any operation (see the output above)"]
        rows[h.name] = {**observed_by_host.get(h.name, {}), "changed": changed,
                        "error": "; ".join(errors) or None}
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
            mark(row.get("l4t_release")),
            mark(row.get("power_mode")),
            mark(row.get("clocks_locked")),
            ", ".join(f"{k}@{v['revision'][:8]} {'ok' if v['verified'] else 'BAD'}"
                      for k, v in weights.items()) or "-",
            f"{row.get('image') or '-'} {row.get('patches') or ''}".strip(),
            mark(row.get("service")),
            mark(row.get("health")),
            mark(row.get("chat")),
            str(len(row["changed"])),
            row["error"] or "",
        )
    Console(stderr=True, width=200).print(table)
