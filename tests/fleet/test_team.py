"""A fleet a team shares (issue 51): each client's tokens counted exactly, its budget held at the
door, and a change of clients live on both gateways without touching a Thor.

The operator lists three clients in gateway_clients on the two gateways of the pair stories:
alice and bob (interactive), and a CI robot with a day's budget of tokens. Then, with the OpenAI
SDK as the clients:
- the tokens each gateway counts for alice are the usage her answers carried, whole answers and
  streams alike, and a stream she abandons counts what the box sent before it stopped;
- bob's stream, its server killed mid-answer (SIGKILL: no code of the server runs after), counts
  what he had received;
- the robot, over its day's budget, gets 429 naming tokens_per_day with a Retry-After until the
  UTC day ends, on both gateways, and no box is asked; how far it overshot is printed;
- alice revoked and the robot's budget raised by a run limited to the gateways (`--limit
  gateway`): alice's key is refused on both gateways when it returns, the robot is served again,
  bob's stream running across the change ends whole, and no counter started again;
- a gateway down during such a change: the run names it, and back up it fails its level check
  (keepalived keeps it out of the shared address) until a run reaches it.

The edits that break them, each seen failing on the sim: the middleware not loaded (the first
three fail: nothing counted, no record in flight, the robot never held); the in-flight record
not rewritten per chunk (bob's killed stream: no record in flight to count); the budget's 429
rule dropped from the template (the robot spent 6,840 tokens of its 1,500, never refused); the
usage service not restarted for its new config (the robot still held after its budget was
raised); the gateways' run not naming a gateway it left behind (deploy.py's
name_the_gateways_left_behind not called: no line names gw-3); HAProxy's set-priority-class
rules dropped (the robot's and bob's waiting requests got the slot before dana).

Uses boxes 2 and 9 and the gateway boxes gw-2 and gw-3 (after the soak).
"""

import json
import ssl
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import openai
import pytest

from tests.fleet.test_gateway_pair import PAIR
from tests.helpers import box, deploy, outcome, wait_for

BUDGET = 1500  # the robot's tokens_per_day: a few short answers


@pytest.fixture(scope="module")
def team(sim_fleet, my_boxes, tmp_path_factory):
    """The pair converged with three clients: (converge(clients), endpoint, keys, tls)."""
    workdir = tmp_path_factory.mktemp("team")
    folder = workdir / "clients"
    paths = {name: str(folder / f"{name}.key") for name in ("alice", "bob", "ci")}
    clients = {"alice": paths["alice"], "bob": paths["bob"],
               "ci": {"key_file": paths["ci"], "tokens_per_day": BUDGET, "priority": "batch",
                      "models": ["mistral-small-4"]}}
    report_path = workdir / "report.json"

    def converge(name, clients, *args):
        inventory = sim_fleet.write_inventory(
            workdir / f"{name}.py", hosts=my_boxes,
            gateway=[(g, {"gateway_clients": clients}) for g in PAIR],
            extra_data={"rollout_report_path": str(report_path)})
        return deploy(inventory, *args)

    for gateway in PAIR:
        sim_fleet.heal(gateway)
    run = converge("team", clients)
    assert run.returncode == 0, outcome(run, PAIR[0])
    endpoint = json.loads(report_path.read_text())["endpoint"]
    keys = {name: (folder / f"{name}.key").read_text().strip() for name in paths}
    tls = ssl.create_default_context(cafile=endpoint["ca_file"])
    return converge, clients, endpoint, keys, tls


def sdk(team, name, gateway=None, sim_fleet=None):
    """The OpenAI SDK as a client writes it, with `name`'s key, trusting the fleet's CA; with
    `gateway`, that gateway on its own address (the certificate names the shared one)."""
    _, _, endpoint, keys, tls = team
    url = endpoint["url"]
    if gateway:
        url = f"https://{sim_fleet.ip(gateway)}:{url.rsplit(':', 1)[1]}"
        tls = ssl.create_default_context(cafile=endpoint["ca_file"])
        tls.check_hostname = False
    return openai.OpenAI(base_url=url + "/v1", api_key=keys[name],
                         http_client=openai.DefaultHttpxClient(verify=tls), max_retries=0)


def tokens(usage):
    return usage.prompt_tokens + usage.completion_tokens


def counted(sim_fleet, gateway, client):
    """(prompt + completion tokens today, the client's row) as `gateway`'s usage service has
    them (thorfleet-door-usage show, as `thorfleet status` reads it)."""
    shown = json.loads(box(sim_fleet, gateway, "/usr/local/sbin/thorfleet-door-usage show"))
    row = shown["clients"].get(client, {})
    today = row.get("tokens", {}).get("today", {})
    return today.get("prompt", 0) + today.get("completion", 0), row


def ask(client, max_tokens, **more):
    """A chat answer of exactly `max_tokens` (vLLM's ignore_eos: the stand-in's text is short)."""
    return client.chat.completions.create(
        model="mistral-small-4", max_tokens=max_tokens, extra_body={"ignore_eos": True},
        messages=[{"role": "user", "content": "Tell me about the Thor."}], **more)


def test_each_clients_tokens_are_the_usage_its_answers_carried(sim_fleet, team):
    alice = sdk(team, "alice")
    before = {g: counted(sim_fleet, g, "alice")[0] for g in PAIR}  # the soak's alice, today

    def since(g):
        return counted(sim_fleet, g, "alice")[0] - before[g]

    received = sum(tokens(ask(alice, n).usage) for n in (12, 40, 77))
    for n in (25, 60):  # streams: every chunk carries the usage so far, the last the whole
        last = [c.usage for c in ask(alice, n, stream=True) if c.usage][-1]
        assert last.completion_tokens == n
        received += tokens(last)
    assert wait_for(lambda: all(since(g) == received for g in PAIR), 30), (
        [since(g) for g in PAIR], received)

    # a stream she leaves after a few chunks: what the box sent before vLLM stopped it
    stream = ask(alice, 400, stream=True)
    seen = [c.usage for _, c in zip(range(6), stream, strict=False) if c.usage][-1]
    stream.close()
    time.sleep(3)
    now = [since(g) - received for g in PAIR]
    assert now[0] == now[1] and tokens(seen) <= now[0] < seen.prompt_tokens + 400, (now, seen)


def test_a_stream_whose_server_is_killed_counts_what_its_client_had(sim_fleet, team, my_boxes):
    bob = sdk(team, "bob")
    before = counted(sim_fleet, PAIR[0], "bob")[0]
    stream = ask(bob, 2000, stream=True)
    seen = []
    for chunk in stream:
        if chunk.usage:
            seen.append(chunk.usage)
        if len(seen) == 10:
            break
    serving = [t for t in my_boxes if box(sim_fleet, t, "ls /var/lib/thorfleet/usage/inflight")]
    assert len(serving) == 1, serving
    box(sim_fleet, serving[0], "docker kill --signal KILL thorfleet-vllm")
    cut = None
    try:
        for chunk in stream:  # what was on the way when it died
            if chunk.usage:
                seen.append(chunk.usage)
    except Exception as error:  # noqa: BLE001 - the cut, as the SDK's transport words it
        cut = error
    print(f"bob's stream ended by {cut!r}")
    assert seen[-1].completion_tokens < 2000  # cut, not finished
    had = tokens(seen[-1])
    assert wait_for(lambda: all(counted(sim_fleet, g, "bob")[0] - before == had for g in PAIR),
                    30), ([counted(sim_fleet, g, "bob")[0] - before for g in PAIR], had)
    # systemd starts it again; the next start moves the record into the day's journal, once
    assert wait_for(lambda: box(sim_fleet, serving[0], "ls /var/lib/thorfleet/usage/inflight")
                    == "", 300, every=5)
    assert all(counted(sim_fleet, g, "bob")[0] - before == had for g in PAIR)


def test_a_client_over_its_days_budget_is_refused_at_the_door_on_both_gateways(sim_fleet, team,
                                                                                my_boxes):
    ci = sdk(team, "ci")
    spent, refused = 0, None
    for _ in range(40):
        try:
            spent += tokens(ask(ci, 150).usage)
        except openai.RateLimitError as error:
            refused = error
            break
        time.sleep(0.5)
    assert refused is not None, spent
    said = refused.response.json()["error"]
    assert "tokens_per_day" in said["message"] and str(BUDGET) in said["message"], said
    midnight = (datetime.now(timezone.utc) + timedelta(days=1)).replace(
        hour=0, minute=0, second=0, microsecond=0)
    retry = int(refused.response.headers["Retry-After"])
    assert 0 < retry <= (midnight - datetime.now(timezone.utc)).total_seconds() + 2, retry
    print(f"the robot spent {spent} tokens of a {BUDGET}-token day: {spent - BUDGET} over")
    # each gateway on its own address refuses it too, and no box is asked
    def robots(t):  # the robot's lines in a box's journal (the watchdog's own probes are _box's)
        return box(sim_fleet, t, "cat /var/lib/thorfleet/usage/*.jsonl | grep -c '\"ci\"' || true")

    journals = {t: robots(t) for t in my_boxes}
    for gateway in PAIR:
        with pytest.raises(openai.RateLimitError):
            ask(sdk(team, "ci", gateway, sim_fleet), 5)
        assert counted(sim_fleet, gateway, "ci")[1]["refused"]["budget"] >= 1
    assert journals == {t: robots(t) for t in journals}


def test_a_change_limited_to_the_gateways_is_live_on_both_and_drops_no_stream(sim_fleet, team,
                                                                               my_boxes):
    converge, clients, _, _, _ = team
    requests_before = {g: counted(sim_fleet, g, "ci")[1]["requests"] for g in PAIR}
    streamed = []
    bob = sdk(team, "bob")
    stream = threading.Thread(target=lambda: streamed.append(
        [c.usage for c in ask(bob, 300, stream=True) if c.usage][-1]))
    stream.start()
    time.sleep(1)
    changed = {"bob": clients["bob"], "ci": {**clients["ci"], "tokens_per_day": 10_000_000}}
    started = time.monotonic()
    run = converge("change", changed, "--limit", "gateway")
    took = time.monotonic() - started
    assert run.returncode == 0, outcome(run, PAIR[0])
    assert all(f"[{t}]" not in run.stderr for t in my_boxes), "a Thor was touched"
    for gateway in PAIR:  # alice is refused on each gateway, the run returned
        with pytest.raises(openai.AuthenticationError):
            ask(sdk(team, "alice", gateway, sim_fleet), 5)
    stream.join(timeout=120)
    assert streamed and streamed[0].completion_tokens == 300, streamed
    # the robot's new budget reaches the door's usage service: served again
    assert wait_for(lambda: _served(sdk(team, "ci")), 30)
    print(f"the change took {took:.1f} s from the command to its return")
    for gateway in PAIR:  # its counts went on: a reload, not a new table
        assert counted(sim_fleet, gateway, "ci")[1]["requests"] > requests_before[gateway]


def _served(client):
    try:
        ask(client, 5)
        return True
    except openai.RateLimitError:
        return False


def test_a_gateway_down_during_a_change_is_named_and_stays_out_until_a_run_reaches_it(
        sim_fleet, team):
    """The change applies where it can; the gateway it missed is named, and its level check
    (keepalived's, the one that keeps a gateway out of the shared address) fails until a run
    brings it level: it never holds the address with the old clients."""
    converge, clients, endpoint, _, _ = team
    holding = next(g for g in PAIR if sim_fleet.exec(
        g, f"ip -o -4 addr show | grep -qw {endpoint['url'].split('//')[1].rsplit(':', 1)[0]}")[0]
        == 0)
    away = next(g for g in PAIR if g != holding)
    check = box(sim_fleet, away, "sed -n 's/^ *script \"\\(.* level .*\\)\"$/\\1/p' "
                                 "/etc/keepalived/keepalived.conf")
    assert sim_fleet.exec(away, check)[0] == 0  # level before
    sim_fleet.client.containers.get(f"thorfleet-{away}").stop(timeout=10)
    try:
        changed = {**clients, "ci": {**clients["ci"], "tokens_per_day": 10_000_000},
                   "dana": str(Path(clients["alice"]).with_name("dana.key"))}
        run = converge("missed", changed, "--limit", "gateway")
        assert run.returncode != 0
        assert f"gateway {away} is not level with this run" in run.stderr, run.stderr[-3000:]
    finally:
        sim_fleet.client.containers.get(f"thorfleet-{away}").start()
        sim_fleet.wait_booted(away)
    # back with the old clients: behind the other, so its check fails and keepalived keeps it out
    assert wait_for(lambda: sim_fleet.exec(away, check)[0] == 1, 30)
    run = converge("level", changed, "--limit", "gateway")
    assert run.returncode == 0, outcome(run, away)
    assert wait_for(lambda: sim_fleet.exec(away, check)[0] == 0, 30)


def test_when_the_pool_is_full_a_person_is_served_before_the_robots_queue_and_a_second_request(
        sim_fleet, team, my_boxes):
    """Two boxes of one request each: a pool of 2 slots, a fair share of 1. bob holds one with a
    long answer and asks a second; the robot (batch) floods; dana (interactive, last in) gets
    the next slot that frees, before every request that waited longer: the robot's (batch waits
    behind interactive) and bob's second (a client at its share waits behind every other)."""
    _, clients, endpoint, _, tls = team
    dana = Path(clients["alice"]).with_name("dana.key").read_text().strip()  # the last story's

    def as_key(key):
        return openai.OpenAI(base_url=endpoint["url"] + "/v1", api_key=key, max_retries=0,
                             http_client=openai.DefaultHttpxClient(verify=tls))

    firsts = []  # (who, sent, first token)

    def one(who, client, max_tokens):
        sent, first = time.monotonic(), None
        for chunk in ask(client, max_tokens, stream=True):
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.monotonic()
                firsts.append((who, sent, first))
        # read to the end: a stream left after its first token is closed, and the box frees
        # the slot at once (vLLM aborts a request whose client is gone), so the requests behind
        # it would not be waiting when dana comes

    bob, robot = sdk(team, "bob"), sdk(team, "ci")
    holding = threading.Thread(target=lambda: [c for c in ask(bob, 6000, stream=True)])
    holding.start()
    time.sleep(2)
    # the robot's answers take seconds each, so every request still waits when dana comes
    waiting = [threading.Thread(target=one, args=("robot", robot, 1500)) for _ in range(3)]
    waiting.append(threading.Thread(target=one, args=("bob", bob, 40)))
    for thread in waiting:
        thread.start()
        time.sleep(0.3)
    time.sleep(1)
    one("dana", as_key(dana), 40)
    for thread in waiting:
        thread.join(timeout=300)
    holding.join(timeout=300)
    (_, sent, first), = [f for f in firsts if f[0] == "dana"]
    # none that waited when she came got a slot before her (a first token comes a prefill
    # after the slot: the robot's seconds-long answers leave no other slot in that time)
    jumped = [who for who, their_sent, their_first in firsts
              if who != "dana" and their_sent < sent and their_first > sent
              and their_first < first]
    assert jumped == [], (jumped, firsts)
    waited = [who for who, their_sent, their_first in firsts
              if who != "dana" and their_sent < sent and their_first > sent]
    assert set(waited) == {"robot", "bob"}, firsts  # the queue was there when she came
    assert len(firsts) == 5 and sum(f[0] == "robot" for f in firsts) == 3, firsts
