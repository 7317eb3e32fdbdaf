"""Each client's own policy at the door (gateway_clients as a dict): refused by `check` when it
cannot hold, rendered into maps HAProxy reads, and enforced by HAProxy itself in front of
stand-in boxes: its own max_inflight, the models it may call, batch behind interactive, and no
freed slot to a client holding its fair share of a pool while another waits.

The edits that break them (each seen failing once; docs/gateway.md lists them): the inflight
map's lookup dropped (`acl over_inflight sc_conn_cur(0) gt 4`); the 403 rule for a named model
dropped; the client-models map's answer replaced by the fleet's list; the `set-priority-class
var(txn.class)` rule dropped; the at-share `set-priority-class ...,add(2)` rules dropped; the
clients table without `peers door` (after a reload alice has no row: `assert (None, None) ==
(3, 3)`); a client's token budget under 1,000 taken (schema.client_entry_problems); the budget
order check not called (plan.py); a client's own budgets ignored for the fleet's (policies).
"""

import re
import threading
import time

import pytest

from tests.fast.test_gateway_render import (
    JsonBox,
    ask,
    client_files,
    haproxy_check,
    inventory,
    planned,
    running_door,
    usage_tool,
)
from tests.fast.test_models import chat, post
from thorfleet.gateway.policy import fair_share, queue_class
from thorfleet.plan import settings_for_inventory
from thorfleet.settings.clients import ClientPolicy
from thorfleet.settings.layout import GATEWAY_CLIENT_TABLE, GATEWAY_PEERS_PORT
from thorfleet.settings.schema import SettingsError, policies

KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdefg",
        "ci": "ci-key-0123456789abcdefgh"}
HF_ID = "mistralai/Mistral-Small-4-119B-2603-NVFP4"
MIXED = ({}, {"service_profile": "no-eagle"})  # an EAGLE box and a long-context box


# --- the decisions, as tables ---------------------------------------------------------------------

@pytest.mark.parametrize("slots, share", [(1, 1), (2, 1), (3, 2), (4, 2), (8, 4), (9, 5), (0, 1)])
def test_a_clients_fair_share_is_half_the_pools_slots_rounded_up_at_least_one(slots, share):
    assert fair_share(slots) == share


@pytest.mark.parametrize("priority, at_share, klass", [
    ("interactive", False, 0), ("batch", False, 1), ("interactive", True, 2), ("batch", True, 3)])
def test_a_request_waits_by_priority_then_behind_others_once_its_client_has_its_share(
        priority, at_share, klass):
    assert queue_class(priority, at_share) == klass


@pytest.mark.parametrize("entry, expected", [
    ("~/a.key", ClientPolicy("a", "~/a.key", 4, 120, tokens_per_day=10**6)),
    ({"key_file": "~/a.key"}, ClientPolicy("a", "~/a.key", 4, 120, tokens_per_day=10**6)),
    ({"key_file": "~/a.key", "max_inflight": 1, "requests_per_minute": 10, "models": ["m"],
      "priority": "batch"}, ClientPolicy("a", "~/a.key", 1, 10, ("m",), "batch", None, 10**6)),
    # its own budgets; None: no budget for it, though the fleet has one
    ({"key_file": "~/a.key", "tokens_per_minute": 5000, "tokens_per_day": None},
     ClientPolicy("a", "~/a.key", 4, 120, tokens_per_minute=5000)),
])
def test_a_client_takes_the_fleets_limits_for_what_it_does_not_set(entry, expected):
    fleet = {"tokens_per_minute": None, "tokens_per_day": 10**6, "tokens_per_month": None}
    assert policies({"a": entry}, 4, 120, fleet) == {"a": expected}


# --- refused by check, naming the client, the key and the fix ------------------------------------

@pytest.mark.parametrize("policy, said", [
    ({"max_inflight": 0}, ("gateway_clients['ci']: max_inflight=0 must be a whole number from 1 "
                          "to 10000, as gateway_client_max_inflight")),
    ({"max_inflight": True}, "max_inflight=True must be a whole number from 1 to 10000"),
    ({"requests_per_minute": 1.5}, ("gateway_clients['ci']: requests_per_minute=1.5 must be a "
                                   "whole number from 1 to 1000000")),
    ({"requests_per_minute": 1000001}, "requests_per_minute=1000001 must be a whole number"),
    ({"models": ["gpt-4o"]}, ("gateway_clients['ci']: models has 'gpt-4o', which no box here "
                             "serves: name one of mistral-small-4")),
    ({"models": "mistral-small-4"}, ("gateway_clients['ci']: models='mistral-small-4' must be a "
                                    "list of model names")),
    ({"models": []}, "gateway_clients['ci']: models=[] lets it call no model"),
    ({"priority": "urgent"}, ("gateway_clients['ci']: priority='urgent' is not a priority: use "
                             "'interactive' or 'batch'")),
    ({"tokens_per_hour": 1000}, ("gateway_clients['ci'] has 'tokens_per_hour', not a key of a "
                                "client's policy: use key_file, max_inflight, requests_per_minute, "
                                "tokens_per_minute, tokens_per_day, tokens_per_month")),
    ({"tokens_per_day": 999}, ("gateway_clients['ci']: tokens_per_day=999 must be a whole number "
                              "of tokens, at least 1000 (less serves not one turn: a typo); None "
                              "for no budget, or leave it out for the fleet's "
                              "gateway_client_tokens_per_day")),
    ({"tokens_per_month": 1.5e6}, ("gateway_clients['ci']: tokens_per_month=1500000.0 must be a "
                                  "whole number of tokens")),
    ({"tokens_per_minute": "5000"}, "tokens_per_minute='5000' must be a whole number of tokens"),
    ({"tokens_per_minute": True}, "tokens_per_minute=True must be a whole number of tokens"),
    ({"key_file": None}, "gateway_clients['ci'] has no key_file: add \"key_file\""),
])
def test_a_policy_that_cannot_hold_is_refused_naming_client_key_and_fix(tmp_path, policy, said):
    files = client_files(tmp_path, ci=KEYS["ci"])
    entry = {k: v for k, v in {"key_file": files["ci"], **policy}.items() if v is not None}
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, gateway_data={"gateway_clients": {
            "ci": entry}}))
    assert any(said in p for p in error.value.problems), error.value.problems


FLEET = "(the fleet's gateway_client_tokens_per_{})"


@pytest.mark.parametrize("fleet, own, said", [
    ({}, {"tokens_per_minute": 50000, "tokens_per_day": 20000},
     [("gateway_clients['ci']: tokens_per_minute=50000 is above tokens_per_day=20000: it could "
       "never be spent; lower tokens_per_minute or raise tokens_per_day")]),
    ({}, {"tokens_per_day": 2000000, "tokens_per_month": 1000000},
     [("gateway_clients['ci']: tokens_per_day=2000000 is above tokens_per_month=1000000: it could "
       "never be spent; lower tokens_per_day or raise tokens_per_month")]),
    # no day budget between them: a minute's is held to the month's
    ({}, {"tokens_per_minute": 90000, "tokens_per_month": 50000},
     [("gateway_clients['ci']: tokens_per_minute=90000 is above tokens_per_month=50000: it could "
       "never be spent; lower tokens_per_minute or raise tokens_per_month")]),
    # after the fleet's are filled in: its own day under the fleet's minute
    ({"gateway_client_tokens_per_minute": 10000}, {"tokens_per_day": 5000},
     [(f"gateway_clients['ci']: tokens_per_minute=10000 {FLEET.format('minute')} is above "
       "tokens_per_day=5000: it could never be spent; lower tokens_per_minute or raise "
       "tokens_per_day")]),
    ({"gateway_client_tokens_per_month": 3000000}, {"tokens_per_day": 4000000},
     [(f"gateway_clients['ci']: tokens_per_day=4000000 is above tokens_per_month=3000000 "
       f"{FLEET.format('month')}: it could never be spent; lower tokens_per_day or raise "
       "tokens_per_month")]),
    # the fleet's own pair is said once, as the fleet's settings, not for each client
    ({"gateway_client_tokens_per_day": 5000, "gateway_client_tokens_per_month": 4000}, {},
     [("gateway_client_tokens_per_day=5000 is above gateway_client_tokens_per_month=4000: it "
       "could never be spent; lower gateway_client_tokens_per_day or raise "
       "gateway_client_tokens_per_month")]),
    # None is no budget for this client, whatever the fleet's: nothing to be above
    ({"gateway_client_tokens_per_minute": 10000}, {"tokens_per_minute": None,
                                                  "tokens_per_day": 5000}, []),
    ({"gateway_client_tokens_per_minute": 10000}, {"tokens_per_day": 10000}, []),  # equal holds
])
def test_a_budget_it_could_never_spend_is_refused_once_the_fleets_are_filled_in(
        tmp_path, fleet, own, said):
    files = client_files(tmp_path, ci=KEYS["ci"], me=KEYS["alice"])
    data = {"gateway_clients": {"ci": {"key_file": files["ci"], **own}, "me": files["me"]},
            **fleet}
    try:
        settings_for_inventory(inventory(tmp_path, gateway_data=data))
        problems = []
    except SettingsError as error:
        problems = error.problems
    assert problems == [f"gw-1: {line}" for line in said]


def test_a_whole_policy_renders_a_config_haproxy_takes(tmp_path):
    files = client_files(tmp_path, **KEYS)
    own = {"weights_source": "hub", "image_source": "build"}
    inv = inventory(tmp_path, thor_hosts=[
        ("thor-1", {"ssh_hostname": "10.0.0.1", **own}),
        ("thor-2", {"ssh_hostname": "10.0.0.2", "service_profile": "no-eagle", **own})],
        gateway_data={"gateway_clients": {
            "alice": {"key_file": files["alice"], "max_inflight": 1},
            "bob": files["bob"],
            "ci": {"key_file": files["ci"], "priority": "batch", "requests_per_minute": 10,
                   "models": [HF_ID]}}})
    g = planned(inv)["gw-1"]
    checked = haproxy_check(tmp_path, g)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    maps = {path.rsplit("/", 1)[1]: text for path, text in g.maps.items()}
    assert maps["client-inflight.map"] == "alice 1\nbob 4\nci 4\n"
    assert maps["client-rate.map"] == "alice 120\nbob 120\nci 10\n"
    assert maps["client-class.map"] == "alice 0\nbob 0\nci 1\n"
    # the HF id is a name of the EAGLE pool: ci may call that pool only
    assert maps["client-pools.map"].splitlines() == [
        "alice:thors-mistral-small-4 1", "alice:thors-mistral-small-4-256k 1",
        "bob:thors-mistral-small-4 1", "bob:thors-mistral-small-4-256k 1",
        "ci:thors-mistral-small-4 1"]
    assert g.fair_shares == {"thors-mistral-small-4": 1, "thors-mistral-small-4-256k": 1}


# --- enforced by HAProxy itself ---------------------------------------------------------------------

def test_a_client_held_to_one_request_gets_429_on_its_second_while_another_is_served(tmp_path):
    files = client_files(tmp_path, alice=KEYS["alice"], bob=KEYS["bob"])
    clients = {"alice": {"key_file": files["alice"], "max_inflight": 1}, "bob": files["bob"]}
    with running_door(tmp_path, thors=2, gateway_data={"gateway_clients": clients}) as (
            door, g, _):
        slow = threading.Thread(target=ask, args=(door, g, "/v1/slow", KEYS["alice"]))
        slow.start()
        time.sleep(0.5)
        status, body = ask(door, g, "/v1/models", KEYS["alice"])
        assert status == 429, body
        assert "this client has 1 requests at the door already" in body["error"]["message"]
        bob = threading.Thread(target=ask, args=(door, g, "/v1/slow", KEYS["bob"]))
        bob.start()  # bob, at the fleet's 4, has two at once
        time.sleep(0.3)
        assert ask(door, g, "/v1/models", KEYS["bob"])[0] == 200
        slow.join(10)
        bob.join(10)


def test_a_client_calls_only_its_own_models_and_lists_only_them(tmp_path):
    files = client_files(tmp_path, alice=KEYS["alice"], ci=KEYS["ci"])
    clients = {"alice": files["alice"],
               "ci": {"key_file": files["ci"], "models": ["mistral-small-4-256k"]}}
    boxes = []
    with running_door(tmp_path, thors=2, thor_data=MIXED, servers_out=boxes,
                      gateway_data={"gateway_clients": clients}) as (door, g, _):
        asked = [getattr(b, "completions", 0) for b in boxes]
        for model in ("mistral-small-4", HF_ID, "/model"):
            status, said = post(door, g, chat(model), key=KEYS["ci"])
            assert status == 403 and said["error"]["type"] == "PermissionDeniedError", said
            assert f'may not call the model "{model}"' in said["error"]["message"], said
        status, said = post(door, g, chat(None), key=KEYS["ci"])  # naming none: the first pool
        assert status == 403 and "naming no model goes to mistral-small-4" in (
            said["error"]["message"]), said
        assert [getattr(b, "completions", 0) for b in boxes] == asked  # no box was asked
        status, seen = post(door, g, chat("mistral-small-4-256k"), key=KEYS["ci"])
        assert status == 200 and seen["model"] == "mistral-small-4-256k", seen
        assert post(door, g, chat("mistral-small-4"), key=KEYS["alice"])[0] == 200
        status, listed = ask(door, g, "/v1/models", KEYS["ci"])
        assert status == 200 and [m["id"] for m in listed["data"]] == ["mistral-small-4-256k"]
        status, listed = ask(door, g, "/v1/models", KEYS["alice"])
        assert [m["id"] for m in listed["data"]] == ["mistral-small-4", "mistral-small-4-256k"]


def holding_box(order, releases):
    """A vLLM stand-in that notes each request's path as it reaches a box (`order`), and holds
    one of `releases` (a dict of path: Event) until its event is set (a long answer taking the
    slot)."""

    class Box(JsonBox):
        def do_GET(self):
            order.append(self.path)
            if self.path in releases:
                releases[self.path].wait(20)
            self.answer({"path": self.path})

    return Box


def in_turn(door, g, asks):
    """Send each (path, client) of `asks` from a thread of its own, 0.3 s apart (so each is
    at the door, answered or queued, before the next); returns the threads."""
    threads = []
    for path, client in asks:
        threads.append(threading.Thread(target=ask, args=(door, g, path, KEYS[client])))
        threads[-1].start()
        time.sleep(0.3)
    return threads


def test_a_batch_request_waits_behind_an_interactive_one_queued_after_it(tmp_path):
    files = client_files(tmp_path, **KEYS)
    clients = {"alice": files["alice"], "bob": files["bob"],
               "ci": {"key_file": files["ci"], "priority": "batch"}}
    order, releases = [], {"/v1/hold": threading.Event()}
    with running_door(tmp_path, gateway_data={"gateway_clients": clients},
                      handlers=[holding_box(order, releases)]) as (door, g, _):
        # one box, one slot: alice holds it; ci's batch request queues, then bob's
        threads = in_turn(door, g, [("/v1/hold", "alice"), ("/v1/ci", "ci"), ("/v1/bob", "bob")])
        assert order == ["/v1/hold"]
        releases["/v1/hold"].set()
        for thread in threads:
            thread.join(20)
    assert order == ["/v1/hold", "/v1/bob", "/v1/ci"]


def test_a_client_holding_half_a_pools_slots_waits_behind_another_client(tmp_path):
    files = client_files(tmp_path, alice=KEYS["alice"], bob=KEYS["bob"])
    clients = {"alice": files["alice"], "bob": files["bob"]}
    order = []
    releases = {path: threading.Event() for path in ("/v1/hold-1", "/v1/hold-2")}
    box = holding_box(order, releases)
    with running_door(tmp_path, thors=2, gateway_data={"gateway_clients": clients},
                      handlers=[box, box]) as (door, g, _):
        assert g.fair_shares == {"thors": 1}  # two boxes of one slot each
        # alice takes both slots (nobody waited: she keeps them), queues a third; then bob one
        threads = in_turn(door, g, [("/v1/hold-1", "alice"), ("/v1/hold-2", "alice"),
                                    ("/v1/alice", "alice"), ("/v1/bob", "bob")])
        assert sorted(order) == ["/v1/hold-1", "/v1/hold-2"]
        releases["/v1/hold-1"].set()  # one slot frees: bob's, though alice's came first
        time.sleep(0.5)
        releases["/v1/hold-2"].set()
        for thread in threads:
            thread.join(20)
    assert order[2:] == ["/v1/bob", "/v1/alice"], order


# --- changed live: a reload starts nobody's counts again -----------------------------------------

def clients_table(tmp_path) -> dict:
    """{client: {field: number}} of the door's clients table, through its runtime API."""
    usage = usage_tool()
    return usage.rows(usage.ask(str(tmp_path / "admin.sock"), f"show table {GATEWAY_CLIENT_TABLE}"))


def resynced(tmp_path, deadline_s=15):
    """Wait until the door's peers section has finished its own start: HAProxy 2.6 hands its
    tables on at a reload only then (PEERS_F_RESYNC_LOCAL and _REMOTE, flags 0x3 of `show peers`:
    its 5 s resync timeout after a start; at once after a reload that was handed them)."""
    usage = usage_tool()
    for _ in range(int(deadline_s * 10)):
        said = usage.ask(str(tmp_path / "admin.sock"), "show peers")
        flags = re.search(r" flags=0x([0-9a-f]+) ", said)
        if flags and int(flags[1], 16) & 0x3 == 0x3:
            return
        time.sleep(0.1)


def test_a_reload_keeps_each_clients_counts_and_its_limit_goes_on(tmp_path):
    """A change of clients is a reload (the deploy's `systemctl reload haproxy`: HAProxy's master
    starts a process on the new config with -sf). The old process hands the clients table to
    the new one at the local peer, so alice's requests this minute still count there: her
    totals, her rate, and her requests_per_minute refusing the one too many."""
    files = client_files(tmp_path, alice=KEYS["alice"], bob=KEYS["bob"])
    data = {"gateway_clients": files, "gateway_client_requests_per_minute": 5}
    with running_door(tmp_path, gateway_data=data) as (door, g, running):
        # one gateway: its own peer alone, on loopback (running_door moves it to a free port)
        assert g.door_peers == [("gateway-1", f"127.0.0.1:{GATEWAY_PEERS_PORT}")]
        assert [ask(door, g, "/v1/models", KEYS["alice"])[0] for _ in range(3)] == [200] * 3
        resynced(tmp_path)
        running.reload()
        row = clients_table(tmp_path).get("alice", {})
        assert (row.get("http_req_cnt"), row.get("http_req_rate(60000)")) == (3, 3), row
        # two more make her five this minute; the sixth is one too many
        answers = [ask(door, g, "/v1/models", KEYS["alice"])[0] for _ in range(3)]
        assert answers == [200, 200, 429], answers
        assert ask(door, g, "/v1/models", KEYS["bob"])[0] == 200
