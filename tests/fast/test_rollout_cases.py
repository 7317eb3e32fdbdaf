"""The rollout's decision as a table, the way pyinfra tests its own operations: each file of
tests/rollout_cases/ is one host's turn, facts in and commands out, and this one runner reads them.

A case holds:
- story: the operator's question it answers;
- step: "batch" (the host's batch) or "first install" (the step before the batches);
- served: what the box serves (facts.serving.ServerState); rendered: the fingerprint of group data;
- earlier: {host: what its turn did in this run} for the hosts of earlier batches ("passed",
  "failed", "dropped": pyinfra failed it before its turn, "outside": not in the run), and
  first_installs: the same for the hosts started as first installs ("passed" or "failed");
- canaries: the canary group's hosts;
- decision, why: what rollout.decide says;
- box: how the box answers thorfleet-serve ("ok", or the lines of a failure);
- commands: what reaches the box, in order; fails: whether the turn fails the host;
- recorded: what the turn records for the run (a first start, a failed restart, its error line).

Each case is checked twice: the pure decision (rollout.decide), and operations.serving against the
same facts, planned (no record written), planned again (the same commands) and executed.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import FunctionCommand, StringCommand
from pyinfra.context import ctx_host

from thorfleet import facts
from thorfleet.operations import verification
from thorfleet.run import rollout
from thorfleet.run.runstate import run_state

CASES = sorted((Path(__file__).resolve().parents[1] / "rollout_cases").glob("*.json"))
HOST = "thor-2"  # the host whose turn it is
SERVICE = {"service": "thorfleet-vllm", "port": 8002, "health_timeout": 1200}


def load(path):
    case = json.loads(path.read_text())
    case.setdefault("step", "batch")
    case.setdefault("earlier", {})
    case.setdefault("first_installs", {})
    case.setdefault("canaries", [])
    case.setdefault("box", "ok")
    case.setdefault("fails", False)
    case["recorded"] = {"first_start": False, "failed_restart": False, "error": None,
                        **case.get("recorded", {})}
    return case


class TurnHost:
    """The host whose turn it is: answers the ServerState fact, records its noops and red lines,
    and what reaches its box (answered as the case's `box` says)."""

    def __init__(self, case, state):
        self.name, self.state, self.data, self.case = HOST, state, {}, case
        self.noops, self.logged, self.ran = [], [], []

    def get_fact(self, fact, **kwargs):
        assert fact is facts.serving.ServerState
        assert (kwargs["service"], kwargs["port"]) == (SERVICE["service"], SERVICE["port"])
        return self.case["served"]

    def noop(self, message):
        self.noops.append(message)

    def log_styled(self, message, **kwargs):
        self.logged.append((message, kwargs.get("fg")))

    def run_shell_command(self, command, **kwargs):
        self.ran.append(str(command))
        if self.case["box"] == "ok":
            return True, SimpleNamespace(stdout_lines=[], stderr_lines=[])
        return False, SimpleNamespace(stdout_lines=self.case["box"], stderr_lines=[])


class Other:
    """Another host of the inventory, as pyinfra's State holds it."""

    def __init__(self, name):
        self.name = name


def the_run(case):
    """pyinfra's State and the run's records as the turns before this one left them: a host that
    failed or dropped out is one of pyinfra's failed hosts, one that passed is still active."""
    turns = {**case["earlier"], **case["first_installs"]}
    active = {Other(HOST), *(Other(n) for n, did in turns.items() if did == rollout.PASSED)}
    state = SimpleNamespace(
        inventory=SimpleNamespace(get_active_hosts=lambda: active),
        failed_hosts={Other(n) for n, did in turns.items()
                      if did in (rollout.FAILED, rollout.DROPPED)})
    records = run_state(state)
    records.failed_restarts.update(n for n, did in turns.items() if did == rollout.FAILED)
    records.first_starts.update(case["first_installs"])
    return state


def rollout_records(state):
    records = run_state(state)
    return (set(records.failed_restarts), set(records.first_starts),
            {k: list(v) for k, v in records.errors.items()})


def plan(host, case):
    with ctx_host.use(host):
        return list(verification.serving._inner(
            fingerprint=case["rendered"], earlier=list(case["earlier"]),
            canaries=set(case["canaries"]), first_install=case["step"] == "first install",
            **SERVICE))


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_a_turn(path):
    case = load(path)
    decision = rollout.decide(case["served"], case["rendered"], case["step"] == "first install",
                              {**case["earlier"], **case["first_installs"]}, case["canaries"])
    assert (decision.action, decision.why) == (case["decision"], case["why"]), case["story"]

    state = the_run(case)
    before = rollout_records(state)
    host = TurnHost(case, state)
    planned = plan(host, case)
    assert rollout_records(state) == before, "the body wrote the run's records: only commands may"
    assert [type(c) for c in plan(host, case)] == [type(c) for c in planned]  # planned again
    assert host.noops == ([case["why"]] * 2 if decision.action == rollout.NOOP else [])

    failed = False
    for command in planned:
        if isinstance(command, FunctionCommand):
            ok = command.function(state, host, *command.args, **command.kwargs)
        else:  # a shell command: as the operation yields it, or as pyinfra wraps it
            assert isinstance(command, (str, StringCommand))
            host.ran.append(str(command))
            ok = case["box"] == "ok"
        if ok is False:
            failed = True
            break
    assert host.ran == case["commands"], case["story"]
    assert failed == case["fails"], case["story"]

    failed_restarts, first_starts, errors = rollout_records(state)
    error = errors.get(HOST)
    assert {"first_start": HOST in first_starts, "failed_restart": HOST in failed_restarts,
            "error": error[0] if error else None} == case["recorded"], case["story"]
    if failed:  # a failure is told in red under the host's name, not only recorded
        assert host.logged and all(colour == "red" for _, colour in host.logged)


def test_every_decision_has_a_case():
    decided = {load(path)["decision"] for path in CASES}
    assert decided == {rollout.NOOP, rollout.PROVE, rollout.ACTIVATE, rollout.HOLD}
