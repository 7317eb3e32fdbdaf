"""The end-of-run report reads the run's shared state: what the operations recorded, per host."""

import io
import json
import os
from types import SimpleNamespace

import pytest
from pyinfra.api.state import StateStage
from rich.console import Console

from thorfleet.run import report, report_rows, report_table
from thorfleet.run.report_rows import FIELDS, HostRun
from thorfleet.run.runstate import RunState, run_state


class FakeHost(SimpleNamespace):
    __hash__ = object.__hash__


def fake_state(names, failed=()):
    """pyinfra's State as the report reads it at the end of a run (through pyinfra_hooks)."""
    hosts = [FakeHost(name=n, data={}, connected=True) for n in names]
    return SimpleNamespace(inventory=hosts, get_op_order=list, is_host_in_limit=lambda h: True,
                           should_check_for_changes=lambda: True,
                           failed_hosts={h for h in hosts if h.name in failed},
                           handlers=[], add_callback_handler=lambda h: None)


def test_rows_hold_what_the_run_recorded_and_every_field():
    hosts = [HostRun("thor-1", failed=True), HostRun("thor-2"), HostRun("thor-3", failed=True)]
    run = RunState()
    run.errors["thor-1"] = [("did not come back within 900s of the reboot for power mode 2 "
                            "(power_reboot_timeout_s)")]
    run.observed["thor-2"] = {"health": True, "chat": True, "service": "active"}
    run.observed["thor-3"] = {"health": False}
    rows = report_rows.host_rows(hosts, run)
    assert all(tuple(sorted(row)) == tuple(sorted(FIELDS)) for row in rows.values())
    assert "power_reboot_timeout_s" in rows["thor-1"]["error"]
    assert rows["thor-2"]["health"] is True and rows["thor-2"]["error"] is None
    # failed, connected, read at the end, but nothing recorded why: said so, not left blank
    assert rows["thor-3"]["error"] == "failed before any operation (see pyinfra's output above)"


def test_the_report_is_installed_once_per_run(monkeypatch):
    registered = []
    monkeypatch.setattr(report.atexit, "register", lambda *args: registered.append(args))
    one, other = fake_state(["thor-1"]), fake_state(["thor-1"])
    for _ in range(3):  # deploy.py runs once per host
        report.install(one, "one.json")
    report.install(other, "other.json")
    assert [args[2] for args in registered] == ["one.json", "other.json"]
    assert run_state(one).report_path == "one.json"


# --- the benchmark, the table, --dry and --limit ------------------------------------------------

BENCH = {"tok_s": 33.62, "ttft_s": 0.061, "eagle_acceptance": 0.71, "vs_median": 1.0,
         "fleet_median_tok_s": 33.62, "passed": True, "as_of": "2026-05-01T10:00:00+0000",
         "runs": [{"tokens": 512, "seconds": 15.23, "tok_s": 33.62, "ttft_s": 0.061}] * 3}


def executed(state):
    state.current_stage = StateStage.Execute
    return state


def test_a_benchmarked_host_has_its_figures_in_the_row():
    run = RunState()
    run.benchmarks["thor-1"] = BENCH
    row = report_rows.host_rows([HostRun("thor-1")], run)["thor-1"]
    assert (row["tok_s"], row["ttft_s"], row["eagle_acceptance"], row["vs_median"]) == \
        (33.62, 0.061, 0.71, 1.0)
    assert row["benchmark"]["runs"] == BENCH["runs"]  # every figure in the JSON


def test_a_host_not_benchmarked_keeps_the_figures_of_the_version_it_still_serves():
    run = RunState()
    run.observed["thor-1"] = {"serving_fingerprint": "aaaa" * 16}
    run.observed["thor-2"] = {"serving_fingerprint": "cccc" * 16}  # restarted with a new version
    previous = {"thor-1": {"serving_fingerprint": "aaaa" * 16, "benchmark": BENCH, "tok_s": 33.62},
                "thor-2": {"serving_fingerprint": "bbbb" * 16, "benchmark": BENCH, "tok_s": 33.62}}
    rows = report_rows.host_rows([HostRun("thor-1"), HostRun("thor-2")], run, previous)
    assert rows["thor-1"]["tok_s"] == 33.62 and rows["thor-1"]["benchmark"]["from_earlier_run"]
    assert rows["thor-2"]["tok_s"] is None and rows["thor-2"]["benchmark"] is None


def rendered(rows, median=None, width=report_table.TABLE_WIDTH):
    console = Console(width=width, file=io.StringIO(), record=True)
    console.print(report_table.table(rows, median))
    return console.export_text().rstrip("\n").splitlines()


def test_the_table_fits_120_columns_one_line_per_host():
    slow = dict(BENCH, tok_s=17.48, vs_median=0.52, eagle_acceptance=None, passed=False)
    rows = {
        "thor-1": {**dict.fromkeys(FIELDS), "serving_fingerprint": "0123456789ab" * 5,
                   "health": True, "chat": True, "reasoning_split": True, "tok_s": 33.62,
                   "ttft_s": 0.061, "eagle_acceptance": 0.71, "vs_median": 1.0, "benchmark": BENCH,
                   "changed": ["a"] * 12, "patches": "chat-template,api-key-all-routes," * 6},
        "thor-rack-b-unit-07.lab.example.com": {
            **dict.fromkeys(FIELDS), "serving_fingerprint": "fedcba9876543210" * 4,
            "health": True, "chat": True, "tok_s": 17.48, "ttft_s": 0.114, "vs_median": 0.52,
            "benchmark": slow, "changed": [],
            "error": "too slow: 17.5 tok/s is below the floor of 27 tok/s (rollout_bench_min_toks); "
                     "17.5 tok/s is 0.52x the fleet median 33.6 tok/s, below 0.8 " * 3},
        "thor-3": {**dict.fromkeys(FIELDS), "stale": True, "as_of": "2026-05-01T10:00:00+0000",
                   "health": True, "error": None, "changed": []},
        "thor-4": {**dict.fromkeys(FIELDS), "changed": [],
                   "error": "could not connect to 10.0.0.4:22: Connection refused"},
    }
    lines = rendered(rows, median=33.62)
    assert max(len(line) for line in lines) <= 120, "\n".join(lines)
    # the title, the header and one line per host: no cell wrapped
    assert len(lines) == 2 + len(rows), "\n".join(lines)
    assert all(sum(line.count(name[:10]) for line in lines) == 1 for name in rows)
    body = "\n".join(lines)
    assert "33.6" in body and "0.52x" in body and "0.71" in body and "stale" in body
    assert "chat-template" not in body  # the patch list stays in the JSON


def test_a_dry_run_leaves_the_last_report_alone_and_writes_its_plan_beside_it(tmp_path):
    path = tmp_path / "report.json"
    path.write_text('{"finished": "earlier", "hosts": {}}')
    state = fake_state(["thor-1"])
    state.current_stage = StateStage.Prepare  # --dry stops before Execute
    state.get_op_meta = lambda op_hash: SimpleNamespace(names={"Install the benchmark tool"})
    report.write(state, str(path))
    assert path.read_text() == '{"finished": "earlier", "hosts": {}}'
    plan = json.loads((tmp_path / "report.json.dry.json").read_text())
    assert plan["dry_run"] is True and plan["would_change"] == {"thor-1": []}


@pytest.mark.parametrize("dry", [False, True])
def test_a_run_that_reached_no_host_writes_its_report_or_under_dry_its_plan(tmp_path, dry):
    """Breaks with: is_plan taking a run that stopped while connecting for a dry run; write
    leaving a run cut while connecting (nothing known) to overwrite the last report."""
    path = tmp_path / "report.json"
    path.write_text('{"finished": "earlier", "hosts": {}}')
    state = fake_state(["thor-1", "thor-2"], failed=["thor-1"])  # cut: thor-2 not said yet
    state.current_stage = StateStage.Connect
    for h in state.inventory:
        h.connected = False
    run_state(state).dry_run = dry
    run_state(state).note_error("thor-1", "could not connect over SSH to 10.0.0.1:22 (...): fix")
    report.write(state, str(path))
    assert path.read_text() == '{"finished": "earlier", "hosts": {}}'
    assert not (tmp_path / "report.json.dry.json").exists()
    state.failed_hosts = set(state.inventory)  # pyinfra's "No hosts remaining!"
    run_state(state).note_error("thor-2", "could not connect over SSH to 10.0.0.2:22 (...): fix")
    report.write(state, str(path))
    if dry:
        assert path.read_text() == '{"finished": "earlier", "hosts": {}}'
        plan = json.loads((tmp_path / "report.json.dry.json").read_text())
        assert plan["would_change"] == {} and sorted(plan["unreachable"]) == ["thor-1", "thor-2"]
    else:
        rows = json.loads(path.read_text())["hosts"]
        assert rows["thor-2"]["error"] == "could not connect over SSH to 10.0.0.2:22 (...): fix"


def test_a_limited_run_keeps_the_other_hosts_last_state_marked_stale(tmp_path, capsys):
    path = tmp_path / "report.json"
    earlier = {"health": True, "chat": True, "serving_fingerprint": "ab" * 32, "tok_s": 33.6,
               "benchmark": BENCH, "changed": [], "error": None, "stale": False,
               "as_of": "2026-05-01T10:00:00+0000"}
    path.write_text(json.dumps({"finished": "2026-05-01T10:00:00+0000",
                                "hosts": {"thor-1": earlier, "thor-2": earlier}}))
    state = executed(fake_state(["thor-1", "thor-2", "thor-3"]))
    state.is_host_in_limit = lambda h: h.name == "thor-1"  # pyinfra --limit thor-1
    run_state(state).observed["thor-1"] = {"health": True, "chat": False}
    report.write(state, str(path))
    rows = json.loads(path.read_text())["hosts"]
    assert rows["thor-1"]["stale"] is False and rows["thor-1"]["chat"] is False
    assert rows["thor-2"] == {**dict.fromkeys(FIELDS), **earlier, "stale": True}
    assert rows["thor-3"]["stale"] is True and "no earlier report" in rows["thor-3"]["error"]
    assert all(tuple(sorted(row)) == tuple(sorted(FIELDS)) for row in rows.values())
    assert "stale: as of 2026-05-01T10:00:00+0000" in capsys.readouterr().err


# --- the report file: replaced whole, and a broken one never merged -------------------------------


class Cut(BaseException):
    """The run stopped where it stood (a kill, a lost laptop lid)."""


def test_a_run_cut_while_writing_leaves_the_last_report_whole(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    earlier = json.dumps({"finished": "earlier", "hosts": {"thor-1": {"health": True}}})
    path.write_text(earlier)
    path.chmod(0o640)
    state = executed(fake_state(["thor-1"]))

    def cut_half_way(value, f, **kwargs):  # a report written into the file as it goes
        f.write(json.dumps(value, **kwargs)[:40])
        raise Cut

    def cut_before_the_rename(*args):
        raise Cut

    monkeypatch.setattr(report.json, "dump", cut_half_way)
    monkeypatch.setattr(os, "replace", cut_before_the_rename)
    with pytest.raises(Cut):
        report.write(state, str(path))
    assert path.read_text() == earlier
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no half file left
    monkeypatch.undo()
    report.write(state, str(path))
    assert json.loads(path.read_text())["hosts"]["thor-1"]["stale"] is False
    assert path.stat().st_mode & 0o777 == 0o640  # the operator's mode is kept


def test_a_last_report_that_does_not_parse_is_kept_beside_and_not_merged(tmp_path, capsys):
    path = tmp_path / "report.json"
    whole = json.dumps({"finished": "2026-05-01T10:00:00+0000",
                        "hosts": {"thor-1": {"health": True}, "thor-2": {"health": True}}})
    path.write_text(whole[:50])  # a run cut while writing it, before it was written atomically
    state = executed(fake_state(["thor-1", "thor-2"]))
    state.is_host_in_limit = lambda h: h.name == "thor-1"  # pyinfra --limit thor-1
    report.write(state, str(path))  # the run itself goes on
    broken = tmp_path / "report.json.broken"
    assert broken.read_text() == whole[:50]
    said = capsys.readouterr().err
    assert f"the last report {path} does not parse (" in said
    assert f"it is kept as {broken}" in said and "run without --limit" in said
    rows = json.loads(path.read_text())["hosts"]
    assert rows["thor-1"]["stale"] is False
    assert rows["thor-2"]["stale"] is True and rows["thor-2"]["health"] is None
    assert "the last report was not merged" in rows["thor-2"]["error"]
    assert str(broken) in rows["thor-2"]["error"]
