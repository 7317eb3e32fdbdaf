"""The end-of-run report reads the run's shared state: what the operations recorded, per host."""

from types import SimpleNamespace

import pytest

from thorfleet import report
from thorfleet.runstate import run_state

pytestmark = pytest.mark.fast


class FakeHost(SimpleNamespace):
    __hash__ = object.__hash__


def fake_state(names, failed=()):
    hosts = [FakeHost(name=n, data={}, connected=True) for n in names]
    return SimpleNamespace(inventory=hosts, ops={h: {} for h in hosts}, get_op_order=list,
                           failed_hosts={h for h in hosts if h.name in failed},
                           handlers=[], add_callback_handler=lambda h: None)


def test_rows_hold_what_the_run_recorded_and_every_field():
    state = fake_state(["thor-1", "thor-2", "thor-3"], failed={"thor-1", "thor-3"})
    run = run_state(state)
    run.errors["thor-1"] = [("did not come back within 900s of the reboot for power mode 2 "
                            "(power_reboot_timeout_s)")]
    run.observed["thor-2"] = {"health": True, "chat": True, "service": "active"}
    run.observed["thor-3"] = {"health": False}
    rows = report._host_rows(state)
    assert all(tuple(sorted(row)) == tuple(sorted(report.FIELDS)) for row in rows.values())
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
