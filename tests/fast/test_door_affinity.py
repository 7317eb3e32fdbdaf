"""The door keeps a conversation on its box (gateway_affinity_balance_factor): HAProxy itself on
the rendered config, in front of stand-in boxes that say which one answered.

Fast: no Docker, no SSH; haproxy and socat from Debian's packages (.ci/setup installs them).
"""

import concurrent.futures
import contextlib
import functools
import http.client
import json
import ssl
import subprocess
import time
import urllib.request

import pytest

from tests.fast.test_client_policy import resynced
from tests.fast.test_gateway_render import (
    BOX_KEY,
    ROTATION,
    gateway_settings,
    haproxy_check,
    running_door,
)
from thorfleet.settings import layout

# The bound at its widest: the door may count a turn's previous request as in flight for a moment
# after its answer (on a loaded machine), and a tight bound would then pass its box for the next.
AFFINITY = {"gateway_affinity_balance_factor": 1000}
SYSTEM = {"role": "system", "content": "You are a careful assistant."}  # shared by every one


@pytest.mark.parametrize("factor", [None, 100, 150, 400])
def test_the_pools_homes_follow_the_setting_and_haproxy_takes_it(tmp_path, factor):
    g = gateway_settings(tmp_path, gateway_affinity_balance_factor=factor)
    checked = haproxy_check(tmp_path, g)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rendered = {line.strip() for line in g.config_text.splitlines()}
    assert "balance leastconn" in rendered  # a first turn, and every turn without affinity
    homes = {line for line in rendered if line.startswith("use-server ")}
    assert len(homes) == (0 if factor is None else len(g.backends))
    assert any(f"be_conn,mul({factor})," in line for line in rendered) == (factor is not None)
    # the conversation is named only with affinity: off, a body of declared length streams
    assert ("req.fhdr(X-Session-Token)" in g.config_text) == (factor is not None)


def chat(door, g, messages, token=None):
    """The box (its vLLM port) that answered a chat completion through the door."""
    connection = http.client.HTTPSConnection(
        "::1", int(door), context=ssl.create_default_context(cafile=g.ca_file), timeout=10)
    headers = {"Authorization": f"Bearer {BOX_KEY}", "Content-Type": "application/json"}
    if token is not None:
        headers["X-Session-Token"] = token
    # the OpenAI SDK writes `model` after the messages
    connection.request("POST", "/v1/chat/completions", headers=headers,
                       body=json.dumps({"messages": messages, "model": "mistral-small-4"}))
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    assert answer.status == 200, body
    if isinstance(door, Door):  # the next turn comes once this one has ended at the door too
        door.settled()
    return json.loads(body)["box"]


class Door(int):
    """The door's port, with its admin socket. The client has the whole answer a moment before
    HAProxy lets the request's stream go: a turn sent at once, as these tests send them, would
    find its one-slot home still taken and rightly go elsewhere (seen once in the fast tier at
    -n 4). A person, or an agent reading the answer, sends later than that."""

    def __new__(cls, port, tmp_path):
        door = super().__new__(cls, port)
        door.tmp_path = tmp_path
        return door

    def settled(self, seconds=5):
        """Wait, at most `seconds`, until the door holds no request (its pool's sessions: 0)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rows = [r.split(",") for r in api(self.tmp_path, "show stat").splitlines()]
            if all(r[4] == "0" for r in rows
                   if len(r) > 4 and r[0] == layout.GATEWAY_BACKEND and r[1] == "BACKEND"):
                return
            time.sleep(0.01)


def turns(n, first, content_parts=False):
    """The messages of turn `n` (1-based) of a conversation opening with `first`."""
    said = []
    for k in range(1, n + 1):
        text = first if k == 1 else f"and then {k}?"
        said.append({"role": "user", "content": [{"type": "text", "text": text}]
                     if content_parts else text})
        if k < n:
            said.append({"role": "assistant", "content": f"answer {k}"})
    return said


def api(tmp_path, command):
    return subprocess.run(["socat", "-t", "5", "stdio", f"UNIX-CONNECT:{tmp_path / 'admin.sock'}"],
                          input=command + "\n", capture_output=True, text=True, timeout=30,
                          check=True).stdout


def boxes(tmp_path):
    """{box: (its status, its failed health checks)} at the door."""
    rows = [r.split(",") for r in api(tmp_path, "show stat").splitlines()]
    return {r[1]: (r[17], r[20]) for r in rows if len(r) > 20 and r[0] == layout.GATEWAY_BACKEND
            and r[1] not in ("FRONTEND", "BACKEND")}


class RingChanged(Exception):
    """A box failed a health check while the test ran (a stand-in late on a loaded machine): the
    ring changed under it, and its turns could move for that, not for the door."""


@contextlib.contextmanager
def door_of_three(tmp_path, gateway_data=AFFINITY, thor_data=()):
    """running_door of 3 boxes, once the door has every one in rotation: a box coming up later
    takes its share of the ring, and conversations would move for that, not for the test. A
    failed assertion while a box failed a health check is RingChanged, which on_a_steady_ring
    tries again."""
    with running_door(tmp_path, thors=3, gateway_data=gateway_data, thor_data=thor_data) as (
            door, g, running):
        for _ in range(300):
            before = boxes(tmp_path)
            if [status for status, _ in before.values()] == ["UP"] * 3:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the boxes did not all come up: {before}")
        try:
            yield Door(door, tmp_path), g, running
        except AssertionError as failed:
            if [f for _, f in boxes(tmp_path).values()] != [f for _, f in before.values()]:
                raise RingChanged(f"{failed}; the boxes after: {boxes(tmp_path)}") from failed
            raise


def on_a_steady_ring(test, tries=3):
    """The test again, in a fresh folder, when the ring changed under it (RingChanged): a
    failure on a steady ring fails at once, and one whose every try saw the ring change fails
    too (never a skip, which would pass CI with the door unproven)."""

    @functools.wraps(test)
    def run(tmp_path, **kwargs):
        for attempt in range(tries):
            where = tmp_path / f"try-{attempt}"
            where.mkdir()
            try:
                return test(tmp_path=where, **kwargs)
            except RingChanged as changed:
                last = changed
        raise AssertionError(f"the ring changed under each of {tries} tries; the last: {last}")
    return run


def test_a_ring_that_changes_under_every_try_fails_and_a_steady_one_passes(tmp_path):
    tried = []

    def flaky(tmp_path, changes):
        tried.append(tmp_path.name)
        if len(tried) <= changes:
            raise RingChanged("thor-2 failed a check")

    on_a_steady_ring(flaky)(tmp_path=tmp_path, changes=2)
    assert tried == ["try-0", "try-1", "try-2"]
    tried.clear()
    (tmp_path / "again").mkdir()
    with pytest.raises(AssertionError, match="under each of 3 tries"):
        on_a_steady_ring(flaky)(tmp_path=tmp_path / "again", changes=3)


@pytest.mark.parametrize("parts", [False, True], ids=["text", "parts"])
@pytest.mark.parametrize("system", [[SYSTEM], []], ids=["system-prompt", "none"])
@on_a_steady_ring
def test_each_conversations_turns_go_to_the_box_of_its_first(tmp_path, system, parts):
    """Each later turn goes where the first went, and the conversations spread over the boxes:
    a shared system prompt alone would put them all on one. Content as a string, or as the
    SDK's list of parts."""
    with door_of_three(tmp_path) as (door, g, _):
        homes = {}
        for c in range(10):
            opening = f"question {c} of its own"
            homes[c] = chat(door, g, [*system, *turns(1, opening, parts)])
            for n in range(2, 5):
                assert chat(door, g, [*system, *turns(n, opening, parts)]) == homes[c], (c, n)
        assert len(set(homes.values())) > 1, homes


@on_a_steady_ring
def test_a_session_token_keeps_a_conversation_whatever_its_messages(tmp_path):
    with door_of_three(tmp_path) as (door, g, _):
        for token in ("t-1", "t-2", "t-3", "a,comma"):
            home = chat(door, g, turns(1, "hello"), token)
            assert {chat(door, g, turns(1, f"other {k}"), token) for k in range(6)} == {home}


@on_a_steady_ring
def test_a_drained_box_hands_its_conversations_on_and_the_others_stay(tmp_path):
    """Drained as a rollout drains a box (thorfleet-rotation): its conversations go on elsewhere
    (cold), every turn answered; every other conversation stays on its box; ready again, the
    box takes new conversations, and a moved one stays where it is now warm."""
    with door_of_three(tmp_path) as (door, g, _):
        homes = {c: chat(door, g, turns(1, f"opening {c}")) for c in range(12)}
        drained = next(iter(set(homes.values())))
        server = next(b.name for b in g.backends if b.port == drained)
        rotation(tmp_path, "drain", server, "30")
        during = {c: chat(door, g, turns(2, f"opening {c}")) for c in homes}
        assert drained not in during.values()
        assert {c for c in homes if during[c] != homes[c]} == {
            c for c in homes if homes[c] == drained}
        rotation(tmp_path, "ready", server)
        assert {c: chat(door, g, turns(3, f"opening {c}")) for c in homes} == during
        assert drained in {chat(door, g, turns(1, f"new {c}")) for c in range(6)}


@pytest.mark.parametrize("profile, factor, stays", [
    ("default", 1000, False), ("throughput", 100, False), ("throughput", 1000, True)])
@on_a_steady_ring
def test_a_busy_home_is_passed_over_when_full_or_past_the_bound(tmp_path, profile, factor, stays):
    """A box of three busy with the conversation's own long answer: its next request goes home
    only while home has a free slot (never waits for one box while another is idle) and holds
    under `factor` percent of the mean (100: no more than the mean, so it spreads). The default
    profile's boxes take one request at a time, the throughput profile's eight."""
    data = {"gateway_affinity_balance_factor": factor}
    thors = [{"service_profile": profile}] * 3
    with door_of_three(tmp_path, data, thors) as (door, g, _):
        home = chat(door, g, turns(1, "hello"), "t")
        context = ssl.create_default_context(cafile=g.ca_file)
        slow = urllib.request.Request(f"https://[::1]:{door}/v1/models?slow", headers={
            "Authorization": f"Bearer {BOX_KEY}", "X-Session-Token": "t"})
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            held = pool.submit(lambda: json.loads(
                urllib.request.urlopen(slow, context=context, timeout=10).read()))
            time.sleep(0.5)  # the long answer in flight on its home
            second = chat(door, g, turns(2, "hello"), "t")
            assert held.result()["path"].endswith("?slow")
        assert (second == home) == stays, (home, second)


@on_a_steady_ring
def test_a_reload_keeps_every_conversations_home(tmp_path):
    """A change at the door is a reload: the old process hands the homes to the new one at the
    local peer, so no conversation moves (none would return to a box by chance: each was
    placed where the fewest requests were)."""
    with door_of_three(tmp_path) as (door, g, running):
        homes = {c: chat(door, g, turns(1, f"kept {c}")) for c in range(9)}
        resynced(tmp_path)
        running.reload()
        chat(door, g, turns(1, "another"))  # the boxes' turn moved on: a new process's leastconn
        assert {c: chat(door, g, turns(2, f"kept {c}")) for c in reversed(homes)} == homes


def rotation(tmp_path, action, server, *more):
    done = subprocess.run(["sh", str(ROTATION), str(tmp_path / "admin.sock"),
                           str(tmp_path / "server-state"), action, layout.GATEWAY_BACKEND, server,
                           *more], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
