"""thorfleet-run-lock on a temporary folder: one run at a time on a box, a gone holder freed.

A run's SSH connection is stood in by a `sleep` process passed as --session-pid (on a box, the
tool finds the connection's sshd above itself).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT

TOOL = ROOT / "files" / "thor" / "bin" / "thorfleet-run-lock"


def lock(folder, command, token, *args, timeout=30):
    return subprocess.run([sys.executable, str(TOOL), command, "--dir", str(folder),
                           "--token", token, *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture
def session():
    """A stand-in for a run's SSH connection: it lives until the test ends it."""
    started = []

    def start():
        process = subprocess.Popen(["sleep", "600"])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def take(folder, token, session_pid, holder="alice@laptop pid 4242", wait=0):
    return lock(folder, "take", token, "--holder", holder, "--wait", str(wait),
                "--session-pid", str(session_pid))


def test_a_second_run_stops_at_once_naming_the_run_that_holds_the_box(tmp_path, session):
    first = take(tmp_path, "run-a", session().pid)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["held"] is True
    holder = json.loads((tmp_path / "run.holder").read_text())
    assert holder["holder"] == "alice@laptop pid 4242" and holder["token"] == "run-a"
    second = take(tmp_path, "run-b", session().pid, holder="bob@other pid 7")
    assert second.returncode == 3
    assert "held by another thorfleet run: alice@laptop pid 4242, since " in second.stderr
    assert "preflight_lock_wait_s" in second.stderr


def test_the_same_run_taking_again_is_already_held(tmp_path, session):
    connection = session().pid
    assert take(tmp_path, "run-a", connection).returncode == 0
    again = take(tmp_path, "run-a", connection)
    assert again.returncode == 0 and json.loads(again.stdout).get("again") is True


def test_a_lock_is_freed_when_its_runs_connection_ends(tmp_path, session):
    connection = session()
    assert take(tmp_path, "run-a", connection.pid).returncode == 0
    connection.kill()
    connection.wait()
    second = take(tmp_path, "run-b", session().pid, wait=5)
    assert second.returncode == 0, second.stderr
    assert json.loads((tmp_path / "run.holder").read_text())["token"] == "run-b"


def test_a_killed_keeper_leaves_a_lock_the_next_run_takes(tmp_path, session):
    assert take(tmp_path, "run-a", session().pid).returncode == 0
    keeper = json.loads((tmp_path / "run.holder").read_text())["keeper_pid"]
    os.kill(keeper, signal.SIGKILL)
    time.sleep(0.3)
    second = take(tmp_path, "run-b", session().pid)
    assert second.returncode == 0, second.stderr
    assert json.loads((tmp_path / "run.holder").read_text())["token"] == "run-b"


def test_a_waiting_run_takes_the_lock_once_the_holder_releases_it(tmp_path, session):
    assert take(tmp_path, "run-a", session().pid).returncode == 0
    waiting = subprocess.Popen([sys.executable, str(TOOL), "take", "--dir", str(tmp_path),
                                "--token", "run-b", "--holder", "bob", "--wait", "20",
                                "--session-pid", str(session().pid)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert waiting.poll() is None, "the second run did not wait"
    assert json.loads(lock(tmp_path, "release", "run-a").stdout)["released"] is True
    _, err = waiting.communicate(timeout=20)
    assert waiting.returncode == 0, err
    assert "held by alice@laptop pid 4242" in err and "waiting up to 20 s" in err
    assert json.loads((tmp_path / "run.holder").read_text())["holder"] == "bob"


def test_only_the_holding_run_releases_the_lock(tmp_path, session):
    assert take(tmp_path, "run-a", session().pid).returncode == 0
    assert json.loads(lock(tmp_path, "release", "run-b").stdout)["released"] is False
    assert take(tmp_path, "run-c", session().pid).returncode == 3
    assert json.loads(lock(tmp_path, "release", "run-a").stdout)["released"] is True
    assert not (tmp_path / "run.holder").exists()
    assert take(tmp_path, "run-c", session().pid).returncode == 0


# --- the fact that takes the lock and the operation that holds the box ---------------------------

def test_the_lock_fact_sends_the_tool_with_its_command_and_reads_what_it_said(tmp_path,
                                                                               monkeypatch):
    from thorfleet import facts

    monkeypatch.setattr(facts.lock, "BOX_RUN_LOCK_DIR", str(tmp_path / "run"))
    command = facts.lock.RunLock().command(holder="me@laptop pid 7", token="t", wait_s=0)
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30,
                          check=False)
    assert (tmp_path / "run" / "thorfleet-run-lock").read_text() == TOOL.read_text()
    # no sshd above a local shell: the tool ran, and its line is what the fact returns
    got = facts.lock.RunLock().process(done.stdout.splitlines())
    assert got == {"held": False, "why": "no sshd above this command: pass --session-pid"}


@pytest.mark.parametrize(("output", "expected"), [
    (['{"held": true, "holder": "me"}', "rc=0"], {"held": True, "why": None}),
    (["thorfleet-run-lock: held by bob@desk pid 9, since 2026-12-01T09:00:00Z: waiting up to 3 s",
      ("thorfleet-run-lock: this box is held by another thorfleet run: bob@desk pid 9, since "
       "2026-12-01T09:00:00Z (waited 3 s; preflight_lock_wait_s sets how long a run waits)"),
      "rc=3"],
     {"held": False, "why": "this box is held by another thorfleet run: bob@desk pid 9, since "
                            "2026-12-01T09:00:00Z (waited 3 s; preflight_lock_wait_s sets how "
                            "long a run waits)"}),
    (["sh: 1: python3: not found", "rc=127"],
     {"held": False, "why": "the run lock failed (rc=127): sh: 1: python3: not found / rc=127"}),
])
def test_the_lock_fact_parses_the_tools_answers(output, expected):
    from thorfleet import facts

    assert facts.lock.RunLock().process(output) == expected


def test_a_held_box_is_a_noop_and_a_box_held_elsewhere_fails_or_waits_naming_the_holder():
    from tests.fast.test_operations import execute, plan
    from thorfleet import facts
    from thorfleet.operations import preflight

    why = ("this box is held by another thorfleet run: bob@desk pid 9, since "
           "2026-12-01T09:00:00Z (waited 3 s; preflight_lock_wait_s sets how long a run waits)")
    held, elsewhere = {"held": True, "why": None}, {"held": False, "why": why}
    commands, fake = plan(preflight.box_held, {facts.lock.RunLock: held}, holder="me", token="t")
    assert commands == [] and fake.noops == ["held for this run (me)"]
    # stops at once: the host fails with the holder's line
    commands, fake = plan(preflight.box_held, {facts.lock.RunLock: elsewhere}, holder="me", token="t")
    assert execute(commands[0], fake) is False
    assert fake.logged[-1][0] == f"thorfleet: {why}"
    # waits: says so at once, then waits on the box for the holder, and holds it
    commands, fake = plan(preflight.box_held, {facts.lock.RunLock: elsewhere}, holder="me", token="t",
                          wait_s=600, shell=lambda command: (True, None))
    assert fake.logged[0][0] == ("thorfleet: this box is held by another thorfleet run: bob@desk "
                                 "pid 9, since 2026-12-01T09:00:00Z: waiting up to 600 s "
                                 "(preflight_lock_wait_s)")
    assert execute(commands[0], fake) is True
    assert fake.ran[0].endswith("take --dir /run/thorfleet --holder me --token t --wait 600")
