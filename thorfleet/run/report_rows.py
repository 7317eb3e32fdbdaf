"""The report's rows: one per host, from what the run recorded. Pure: no pyinfra, no I/O.

    rows = host_rows(hosts, recorded, previous, now, probe)   # {host name: row}
    report = whole_report(rows, recorded, now)               # what the JSON file holds

Every row has every field of FIELDS (None when it could not be read). A host outside this run's
--limit keeps its row from the last report, marked `"stale": true` with the time it was read
(`as_of`). A host not benchmarked in this run keeps its last figures while it serves the same
version (the benchmark's own `as_of` says when).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# Every row has exactly these keys, in this order.
FIELDS = ("l4t_release", "power_mode", "clocks_locked", "weights", "image", "patches", "service",
          "serving_fingerprint", "health", "chat", "reasoning_split", "tok_s", "ttft_s",
          "eagle_acceptance", "vs_median", "benchmark", "changed", "error", "stale", "as_of")
# What a benchmark puts in the row (the whole result stays in "benchmark").
BENCH_FIELDS = ("tok_s", "ttft_s", "eagle_acceptance", "vs_median")
NO_EARLIER_REPORT = "in no earlier report"


@dataclass(frozen=True)
class HostRun:
    """One inventory host as the run left it."""

    name: str
    in_limit: bool = True  # in this run (its --limit)
    failed: bool = False  # pyinfra failed it
    connected: bool = True
    # (name, changed, failed, output lines) of each operation that ran on it, in order
    # (pyinfra_hooks.Outcome)
    operations: tuple = ()


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def host_rows(hosts, recorded, previous=None, as_of=None, probe: Callable[[str], str] | None = None,
              no_previous=NO_EARLIER_REPORT):
    """{host: row} for `hosts` ([HostRun], inventory order); `recorded`: the run's RunState.

    `previous`: the last report's rows, kept (marked stale) for the hosts outside this run's
    --limit, and for their benchmark when a host serves the version it measured. `no_previous`
    says why a host outside the limit has no earlier row. `probe(name)`: why a host that never
    connected could not be reached."""
    rows, as_of, previous = {}, as_of or now(), previous or {}
    for h in hosts:
        if not h.in_limit:
            rows[h.name] = _kept_row(h.name, previous, no_previous)
            continue
        changed, failed = [], []
        for operation in h.operations:
            if operation.failed:
                tail = list(operation.output)[-6:]
                # a FunctionCommand that failed the host said why through RunState.fail
                if tail or not recorded.errors.get(h.name):
                    failed.append(f"{operation.name}: " + " / ".join(line.strip() for line in tail))
            elif operation.changed:
                changed.append(operation.name)
        errors = recorded.errors.get(h.name, []) + failed
        if h.failed and not errors:
            errors = [probe(h.name) if not h.connected and h.name not in recorded.observed
                      else "failed before any operation (see pyinfra's output above)"]
        row = {field: None for field in FIELDS}
        row.update(recorded.observed.get(h.name, {}))
        bench = recorded.benchmarks.get(h.name)
        last = previous.get(h.name) or {}
        if bench is None and last.get("benchmark") and row["serving_fingerprint"] and \
                last.get("serving_fingerprint") == row["serving_fingerprint"]:
            # the last figures of the version it still serves, marked as such
            bench = {**last["benchmark"], "from_earlier_run": True}
        if bench is not None:
            row.update({k: bench.get(k) for k in BENCH_FIELDS}, benchmark=bench)
        row.update(changed=changed, error="; ".join(errors) or None, stale=False, as_of=as_of)
        rows[h.name] = row
    return rows


def _kept_row(name, previous, no_previous):
    """The row of a host outside --limit: its last one, marked stale."""
    row = {field: None for field in FIELDS}
    if name in previous:
        row.update({k: v for k, v in previous[name].items() if k in FIELDS})
        row.update(stale=True, as_of=previous[name].get("as_of"))
    else:
        row.update(changed=[], stale=True, error=f"not in this run (--limit) and {no_previous}")
    return row


def whole_report(rows, recorded, finished=None):
    """The report file's content: the rows, when the run finished, and the fleet's median."""
    medians = {b.get("fleet_median_tok_s") for b in recorded.benchmarks.values()} - {None}
    return {"finished": finished or now(),
            "fleet_median_tok_s": medians.pop() if len(medians) == 1 else None, "hosts": rows}


def dry_run_plan(would_change, planned=None, unreachable=None):
    """The plan file of a dry run: {host: [operations it would change]}, and {host: why} of the
    hosts it could not connect to (no plan for them)."""
    return {"dry_run": True, "planned": planned or now(), "would_change": would_change,
            "unreachable": unreachable or {}}
