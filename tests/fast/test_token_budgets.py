"""Token budgets per client, held at the door: the boxes count each client's tokens (told who
asks by the door's X-Thorfleet-Client header) and answer /usage on their check port;
files/gateway/bin/thorfleet-door-usage sums them, decides who is over which budget (verdicts) and puts
it in the budget map, which HAProxy reads to answer 429 with Retry-After before any box is asked.

The decisions are tables; the door is HAProxy itself on the rendered config, in front of
stand-in boxes whose watchdogs answer /usage, with the usage service running as its unit runs it.

The edits that break them (each seen failing once; docs/gateway.md "Token budgets" lists them):
the set-header rule dropped or made add-header; the budget 429 dropped; Retry-After the map's
epoch itself; the gpt0 count dropped; the map's file never written; the kept counts not read at
start; next_month's December in the same year; a second 60 s old kept in the window; `>` for
`>=`; an earlier day's answer giving its day; a count below 0 taken; a client name no label
holds kept; every wanted row set again; ';' taken in a runtime API word; a map key starting with
'#'; the map value's budget first; a client no box counted looked up by index; the deploy
writing the budget map at every run.
"""

import calendar
import contextlib
import http.client
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone

import pytest

from tests.fast.test_gateway_render import (
    USAGE,
    JsonBox,
    client_files,
    running_door,
    usage_tool,
)
from tests.fast.test_models import chat
from tests.helpers import free_port
from thorfleet.gateway.config import FLEET_CLIENT, map_line
from thorfleet.settings import layout

TOOL = usage_tool()
KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdefg",
        "carol": "carol-key-0123456789abcdef"}
MODEL = "mistral-small-4"
NONE = {"tokens_per_minute": None, "tokens_per_day": None, "tokens_per_month": None}


def at(*when) -> int:
    """The epoch of a UTC time (year, month, day, hour, minute, second)."""
    return calendar.timegm((*when, 0, 0, 0)[:6])


NOON = at(2026, 12, 6, 12)


# --- who is over which budget, and until when ----------------------------------------------------

def spent(day=0, month=0, minute=()):
    return {"day": day, "month": month, "minute": [list(entry) for entry in minute]}


@pytest.mark.parametrize("budget, total, now, verdict", [
    # under every budget, or no budget at all however much it spent: nobody is refused
    ({"tokens_per_day": 2_000_000}, spent(day=1_999_999), NOON, None),
    ({}, spent(day=10**9, month=10**9, minute=[(NOON - 1, 10**9)]), NOON, None),
    # a day's budget reached (not only passed): refused until the next 00:00 UTC
    ({"tokens_per_day": 2_000_000}, spent(day=2_000_000), NOON,
     ("tokens_per_day", at(2026, 12, 7))),
    # day end: a second before midnight it frees in one second
    ({"tokens_per_day": 1000}, spent(day=5000), at(2026, 12, 6, 23, 59, 59),
     ("tokens_per_day", at(2026, 12, 7))),
    # month end: the 1st of the next month, the year turning; February of a leap year
    ({"tokens_per_month": 10**6}, spent(month=10**6), at(2026, 12, 31, 23, 59, 30),
     ("tokens_per_month", at(2027, 1, 1))),
    ({"tokens_per_month": 10**6}, spent(month=2 * 10**6), at(2028, 2, 28, 12),
     ("tokens_per_month", at(2028, 3, 1))),
    # over both a day and a month: the month frees last, and it wins
    ({"tokens_per_day": 5000, "tokens_per_month": 50_000}, spent(day=6000, month=60_000), NOON,
     ("tokens_per_month", at(2027, 1, 1))),
    # ...on the month's last day both free at once: the month, which says more
    ({"tokens_per_day": 5000, "tokens_per_month": 50_000}, spent(day=6000, month=60_000),
     at(2026, 12, 31, 8), ("tokens_per_month", at(2027, 1, 1))),
    # minute window: 1,100 in the last 60 s against 1,000; once the 600 of 50 s ago leaves the
    # window (10 s from now) 500 are left: it frees then
    ({"tokens_per_minute": 1000}, spent(minute=[(NOON - 50, 600), (NOON - 30, 300),
                                                (NOON - 5, 200)]), NOON,
     ("tokens_per_minute", NOON + 10)),
    # two seconds must leave before it is under: the second one's time decides
    ({"tokens_per_minute": 600}, spent(minute=[(NOON - 40, 500), (NOON - 20, 500),
                                               (NOON - 1, 500)]), NOON,
     ("tokens_per_minute", NOON + 40)),
    # a second 60 s old is out of the window: 500 of 1,000 is under
    ({"tokens_per_minute": 1000}, spent(minute=[(NOON - 60, 5000), (NOON - 10, 500)]), NOON,
     None),
    # a second 59 s old still counts, and frees in one second
    ({"tokens_per_minute": 1000}, spent(minute=[(NOON - 59, 5000), (NOON - 10, 500)]), NOON,
     ("tokens_per_minute", NOON + 1)),
    # over a minute's and a day's: the day frees last
    ({"tokens_per_minute": 1000, "tokens_per_day": 2000},
     spent(day=2500, minute=[(NOON - 1, 1500)]), NOON, ("tokens_per_day", at(2026, 12, 7))),
])
def test_who_is_over_which_budget_and_when_it_frees(budget, total, now, verdict):
    found = TOOL.verdicts({"ci": {**NONE, **budget}}, {"ci": total}, now)
    assert found == ({"ci": verdict} if verdict else {})


def test_a_client_the_boxes_never_counted_has_spent_nothing():
    assert TOOL.verdicts({"ci": {**NONE, "tokens_per_day": 1000}}, {}, NOON) == {}


def answer(now, day=None, month=None, minute=None, **clients):
    """A box's /usage answer at `now`: each client's (prompt, cached, completion) of the day and
    the month for MODEL, as {"day": (...), "month": (...)}."""
    stamp = datetime.fromtimestamp(now, timezone.utc)
    kinds = ("prompt", "cached", "completion")
    return {"now": now, "day": day or stamp.strftime("%Y-%m-%d"),
            "month": month or stamp.strftime("%Y-%m"),
            "clients": {name: {MODEL: {period: dict(zip(kinds, counts, strict=True))
                                       for period, counts in periods.items()}}
                        for name, periods in clients.items()},
            "minute": minute or {}}


def test_each_boxs_last_answer_is_summed_an_earlier_days_for_its_month_only():
    boxes = {
        # today's: its day and its month
        "thor-1": answer(NOON, alice={"day": (1000, 800, 100), "month": (9000, 5000, 900)},
                         minute={"alice": [[NOON - 10, 300], [NOON - 90, 5000]]}),
        # yesterday's (it stopped answering then): its month only
        "thor-2": answer(NOON - 86400, alice={"day": (7, 0, 3), "month": (700, 0, 300)},
                         minute={"alice": [[NOON - 86400, 10]]}),
        # last month's: nothing
        "thor-3": answer(at(2026, 11, 30, 23), alice={"day": (5, 5, 5), "month": (50, 50, 50)}),
    }
    boxes = {name: TOOL.read_answer(json.loads(json.dumps(a))) for name, a in boxes.items()}
    total = TOOL.totals(boxes, NOON)["alice"]
    assert total["models"] == {MODEL: {"day": {"prompt": 1000, "cached": 800, "completion": 100},
                                       "month": {"prompt": 9700, "cached": 5000,
                                                 "completion": 1200}}}
    # tokens are prompt + completion (cached is inside prompt); the minute's last 60 s alone
    assert (total["day"], total["month"], total["minute"]) == (1100, 10900, [[NOON - 10, 300]])
    assert TOOL.budget_left({**NONE, "tokens_per_day": 1000, "tokens_per_month": 20_000},
                            total, NOON) == {"tokens_per_minute": None, "tokens_per_day": 0,
                                             "tokens_per_month": 9100}


@pytest.mark.parametrize("bad", [
    {"day": "2026-12-06", "month": "2026-12", "clients": {}},  # no now
    {"now": NOON, "day": "06.12.2026", "month": "2026-12"},
    {"now": NOON, "day": "2026-12-06", "month": "2026-11"},  # a day outside its month
    answer(NOON, alice={"day": (1, 0, -1), "month": (1, 0, 1)}),  # a count below 0
    answer(NOON, alice={"day": (1, 0, 1.5), "month": (1, 0, 1)}),
    answer(NOON, alice={"day": (1, 0, True), "month": (1, 0, 1)}),
    {**answer(NOON), "minute": {"alice": [[NOON, "300"]]}},
    [], "usage",
])
def test_an_answer_that_is_not_usage_leaves_the_boxs_last_one(bad):
    assert TOOL.read_answer(bad) is None


def test_a_name_no_label_holds_is_left_out_of_an_answer_not_the_answer():
    said = answer(NOON, alice={"day": (1, 0, 1), "month": (1, 0, 1)})
    said["clients"]['x"} 1\n'] = said["clients"]["alice"]
    assert set(TOOL.read_answer(said)["clients"]) == {"alice"}


# --- the budget map: only the rows that changed, in the lines HAProxy reads -------------------------

M = "/var/lib/thorfleet/door-usage/budget.map"


@pytest.mark.parametrize("current, wanted, commands", [
    ({}, {}, []),
    # a client newly over: added; one still over as it was: left alone
    ({"alice": "1796601600:tokens_per_day:2000000"},
     {"alice": "1796601600:tokens_per_day:2000000", "bob": "1796569260:tokens_per_minute:5000"},
     [f"add map {M} bob 1796569260:tokens_per_minute:5000"]),
    # its minute frees later now (it spent more): set; a client that freed: deleted
    ({"alice": "1796601600:tokens_per_day:2000000", "bob": "1796569260:tokens_per_minute:5000"},
     {"bob": "1796569262:tokens_per_minute:5000"},
     [f"set map {M} bob 1796569262:tokens_per_minute:5000", f"del map {M} alice"]),
])
def test_the_budget_map_changes_only_the_rows_that_differ(current, wanted, commands):
    assert TOOL.map_changes(M, current, wanted) == commands


@pytest.mark.parametrize("word", ["a b", "a;b", "a\\b", "", "é"])
def test_a_word_the_runtime_api_would_split_is_refused(word):
    with pytest.raises(ValueError):
        TOOL.map_changes(M, {}, {"alice": word})


@pytest.mark.parametrize("key, value", [
    ("alice", "1796601600:tokens_per_day:2000000"), ("a-b_c", "1"), ("#x", "1"), ("a b", "1"),
    ("alice", " 1"), ("alice", "1\n"), ("", "1"), ("alice", "")])
def test_the_tool_writes_map_lines_as_the_laptop_does(key, value):
    try:
        laptop = map_line(key, value)
    except ValueError:
        laptop = ValueError
    try:
        tool = TOOL.map_line(key, value)
    except ValueError:
        tool = ValueError
    assert tool == laptop


def test_the_map_value_is_what_the_door_reads():
    found = TOOL.verdicts({"alice": {**NONE, "tokens_per_day": 2_000_000}},
                          {"alice": spent(day=2_000_001)}, NOON)
    assert TOOL.wanted_map(found, {"alice": {**NONE, "tokens_per_day": 2_000_000}}) == {
        "alice": f"{at(2026, 12, 7)}:tokens_per_day:2000000"}
    assert TOOL.shown_map("0x55d5676df350 alice 1:tokens_per_day:2000000\n\n") == {
        "alice": "1:tokens_per_day:2000000"}


# --- the door itself: HAProxy, stand-in boxes, the usage service as its unit runs it ---------------

class Watchdog(JsonBox):
    """A box's watchdog as the door sees it: /healthy, and /usage answering the server's
    `usage(now)` (None: the box does not answer it, 503)."""

    def do_GET(self):
        if self.path != "/usage":
            self.answer({"path": self.path})
            return
        usage = getattr(self.server, "usage", None)
        if usage is None:
            self.answer({"error": "down"}, 503)
            return
        self.answer(usage(time.time()))


class SeeingBox(JsonBox):
    """A vLLM stand-in answering with the X-Thorfleet-Client headers it got."""

    def do_GET(self):
        self.answer({"clients": self.headers.get_all(layout.GATEWAY_CLIENT_HEADER) or []})


def request(door, g, method, path, key, body=None, headers=()):
    """(status, headers (lower-case names), JSON answer) of a request through the door;
    `headers`: (name, value) pairs, sent as they are (a name twice is sent twice)."""
    connection = http.client.HTTPSConnection(
        "::1", door, timeout=30, context=ssl.create_default_context(cafile=g.ca_file))
    connection.putrequest(method, path)
    for name, value in [("Authorization", f"Bearer {key}"), *headers]:
        connection.putheader(name, value)
    if body is not None:
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    answer = connection.getresponse()
    said = answer.status, {k.lower(): v for k, v in answer.getheaders()}, json.loads(answer.read())
    connection.close()
    return said


def test_the_box_is_told_which_client_asks_and_no_client_can_say_another(tmp_path):
    files = client_files(tmp_path, alice=KEYS["alice"], bob=KEYS["bob"])
    claims = [(layout.GATEWAY_CLIENT_HEADER, "bob"), ("x-thorfleet-client", FLEET_CLIENT)]
    (tmp_path / "clients-door").mkdir()
    with running_door(tmp_path / "clients-door", gateway_data={"gateway_clients": files},
                      handlers=[SeeingBox]) as (door, g, _):
        for key, name in ((KEYS["alice"], "alice"), (KEYS["bob"], "bob")):
            assert request(door, g, "GET", "/v1/models", key)[2] == {"clients": [name]}
            # a client's own header, in any case, once or twice: replaced by its name
            assert request(door, g, "GET", "/v1/models", key, headers=claims)[2] == {
                "clients": [name]}
    (tmp_path / "fleet-door").mkdir()
    with running_door(tmp_path / "fleet-door", handlers=[SeeingBox]) as (door, g, _):
        from tests.fast.test_gateway_render import BOX_KEY  # the fleet's one key opens it

        assert request(door, g, "GET", "/v1/models", BOX_KEY, headers=claims)[2] == {
            "clients": [FLEET_CLIENT]}


@contextlib.contextmanager
def usage_service(tmp_path, g):
    """thorfleet-door-usage serve as its unit runs it, on this door's socket, map and config
    (the deploy's JSON, as rendered): yields the port of its /metrics."""
    config = tmp_path / "door-usage.json"
    config.write_text(g.usage_config_text)
    (tmp_path / "door-usage").mkdir(exist_ok=True)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(USAGE), "serve", "--listen", f"127.0.0.1:{port}",
         "--socket", str(tmp_path / "admin.sock"), "--config", str(config),
         "--state", str(tmp_path / "door-usage"), "--map", str(tmp_path / "budget.map")],
        stderr=subprocess.PIPE, text=True)
    try:
        yield port
    finally:
        process.terminate()
        _, said = process.communicate(timeout=10)
        print(said, file=sys.stderr)  # its journal, shown when a test fails


def budget_rows(tmp_path):
    return TOOL.shown_map(TOOL.ask(str(tmp_path / "admin.sock"),
                                   f"show map {tmp_path / 'budget.map'}"))


def until(what, timeout=15):
    deadline = time.monotonic() + timeout
    while not (found := what()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_a_client_over_its_days_budget_is_refused_at_the_door_and_another_is_served(tmp_path):
    """alice has spent her tokens_per_day on the boxes (thor-1 counted most of it, thor-2 the
    rest); carol spends her tokens_per_minute; bob has no budget left to spend, and is served.
    Neither alice's nor carol's request reaches a box; the refusals are counted and shown, the
    map is in its file so a reload keeps it, and a restarted service whose box went quiet
    starts again from the counts it kept."""
    files = client_files(tmp_path, **KEYS)
    clients = {"alice": {"key_file": files["alice"], "tokens_per_day": 2_000_000},
               "bob": files["bob"],
               "carol": {"key_file": files["carol"], "tokens_per_minute": 5000}}
    boxes = []
    with running_door(tmp_path, thors=2, servers_out=boxes, watchdogs=[Watchdog, Watchdog],
                      gateway_data={"gateway_clients": clients}) as (door, g, running):
        boxes[1].usage = lambda now: answer(
            now, alice={"day": (1_500_000, 1_000_000, 400_000), "month": (1_500_000, 0, 400_000)},
            bob={"day": (9_000_000, 0, 1), "month": (9_000_000, 0, 1)},
            minute={"carol": [[int(now) - 2, 6000]]})
        boxes[3].usage = lambda now: answer(
            now, alice={"day": (90_000, 0, 10_000), "month": (90_000, 0, 10_000)})
        with usage_service(tmp_path, g) as metrics_port:
            assert set(until(lambda: budget_rows(tmp_path))) == {"alice", "carol"}
            asked = sum(getattr(b, "completions", 0) for b in boxes)
            status, headers, said = request(door, g, "POST", "/v1/chat/completions",
                                            KEYS["alice"], chat(MODEL))
            assert status == 429 and said["error"]["type"] == "insufficient_quota", said
            assert said["error"]["message"].startswith(
                "alice is over its tokens_per_day (2000000 tokens, UTC day): it frees at 00:00 "
                "UTC"), said
            midnight = TOOL.next_day(time.time())
            assert 1 <= int(headers["retry-after"]) <= midnight - time.time() + 1, headers
            status, headers, said = request(door, g, "POST", "/v1/chat/completions",
                                            KEYS["carol"], chat(MODEL))
            assert status == 429 and "carol is over its tokens_per_minute (5000 tokens" in (
                said["error"]["message"]), said
            assert 1 <= int(headers["retry-after"]) <= 60, headers
            assert sum(getattr(b, "completions", 0) for b in boxes) == asked  # no box asked
            status, _, said = request(door, g, "POST", "/v1/chat/completions", KEYS["bob"],
                                      chat(MODEL))
            assert status == 200 and said["model"] == MODEL, said
            assert sum(getattr(b, "completions", 0) for b in boxes) == asked + 1
            shown = json.loads(subprocess.run(
                [sys.executable, str(USAGE), "show", "--socket", str(tmp_path / "admin.sock"),
                 "--config", str(tmp_path / "door-usage.json"),
                 "--state", str(tmp_path / "door-usage")],
                capture_output=True, text=True, check=True, timeout=30).stdout)["clients"]
            exported = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                              timeout=10).read().decode()
        assert shown["alice"]["tokens"]["today"] == {"prompt": 1_590_000, "cached": 1_000_000,
                                                     "completion": 410_000}, shown
        assert shown["alice"]["budget_left"] == {**NONE, "tokens_per_day": 0}
        assert shown["alice"]["refused"] == {"in_flight": 0, "rate": 0, "budget": 1}
        assert shown["bob"]["budget_left"] == NONE and shown["bob"]["refused"]["budget"] == 0
        assert (f'thorfleet_door_tokens{{client="alice",model="{MODEL}",kind="cached",'
                'period="day"} 1000000') in exported, exported
        assert ('thorfleet_door_budget_left{client="alice",budget="tokens_per_day"} 0'
                in exported), exported
        assert 'thorfleet_door_refused_total{client="carol",reason="budget"} 1' in exported
        # the map's file holds what HAProxy holds: a reload (a change of clients) keeps it
        assert (tmp_path / "budget.map").read_text().startswith("alice ")
        running.reload()
        assert request(door, g, "POST", "/v1/chat/completions", KEYS["alice"],
                       chat(MODEL))[0] == 429
        # thor-1 goes quiet and the service restarts: it starts from the counts it kept, and
        # puts alice back in a map that lost her
        boxes[1].usage = None
        TOOL.ask(str(tmp_path / "admin.sock"), f"del map {tmp_path / 'budget.map'} alice")
        assert "alice" not in budget_rows(tmp_path)
        with usage_service(tmp_path, g):
            assert until(lambda: "alice" in budget_rows(tmp_path)), budget_rows(tmp_path)


# --- the deploy: the map made empty when missing, never written; the config shipped --------------

def planned(tmp_path, box, monkeypatch):
    """{operation name: [command text]} of the gateway task's budget steps (its runtime maps, and
    the usage service) planned and executed against `box`'s facts (fact -> value), none read."""
    from pyinfra.api import Config, FileUploadCommand, State
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_host, ctx_inventory, ctx_state

    from tasks import gateway as task
    from tests.fast.test_gateway_render import inventory
    from thorfleet.plan import settings_for_inventory

    monkeypatch.setenv("THORFLEET_BATCH_READS", "0")  # each read from the table, no round trip
    files = client_files(tmp_path, alice=KEYS["alice"])
    inv = inventory(tmp_path, gateway_data={"gateway_clients": {
        "alice": {"key_file": files["alice"], "tokens_per_day": 2_000_000}}})
    g = settings_for_inventory(inv)["gw-1"]
    state = State(check_for_changes=False)
    state.init(inv, Config())
    state.current_stage = StateStage.Prepare
    h = inv.get_host("gw-1")
    h.get_fact = lambda fact, **kwargs: box.get(fact, fact().default() if hasattr(
        fact, "default") else None)
    with ctx_state.use(state), ctx_inventory.use(inv), ctx_host.use(h):
        task._runtime_maps(g)
        task._door_usage(g)
        found = {}
        for op_hash in state.get_op_order():
            if op_hash in state.ops[h]:
                op = state.ops[h][op_hash]
                found[", ".join(state.op_meta[op_hash].names)] = [
                    "upload" if isinstance(c, FileUploadCommand) else str(getattr(c, "value", c))
                    for c in op.command_generator()]
    return g, found


def test_the_deploy_makes_the_budget_map_only_when_missing_and_ships_the_config(
        tmp_path, monkeypatch):
    from pyinfra.facts.files import File

    from thorfleet import facts

    make = "Make the budget map empty when missing (the usage service keeps it)"
    held = {"user": "root", "group": "root", "mode": 600, "size": 52}  # alice, over her budget
    folder = {"type": "directory", "mode": "700", "user": "root", "group": "root"}
    g, kept = planned(tmp_path, {File: held, facts.system.PathState: folder}, monkeypatch)
    assert g.runtime_maps == (layout.GATEWAY_BUDGET_MAP,)
    assert kept[make] == [], kept[make]  # there: nothing written, alice held through the run
    _, made = planned(tmp_path, {File: None, facts.system.PathState: None}, monkeypatch)
    text = "\n".join(made[make])
    assert f"touch {layout.GATEWAY_BUDGET_MAP}" in text and "chmod 600" in text, made[make]
    assert not any("upload" in c or ">" in c for c in made[make])
    config = next(name for name in made if name.startswith("Write the usage service's config"))
    assert "1 token budget(s)" in config and made[config][1] == "upload", made[config]
    assert json.loads(g.usage_config_text) == {
        "boxes": [{"name": "thor-1", "address": "10.0.0.1", "port": 9105},
                  {"name": "thor-2", "address": "10.0.0.2", "port": 9105}],
        "clients": {"alice": {**NONE, "tokens_per_day": 2_000_000}},
        "interval_s": 2, "timeout_s": 1}
