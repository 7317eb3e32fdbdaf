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

pytestmark = pytest.mark.fast

TOOL = ROOT / "files" / "bin" / "thorfleet-run-lock"


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
