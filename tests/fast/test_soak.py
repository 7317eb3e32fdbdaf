"""bench/soak.py without the sim: the report per fault window and outside them, the goal's four
counts, the timeline, the door's rotation as HAProxy's `show stat` says it, and the clients and
the prober against a server of this test's own on loopback (the real OpenAI SDK, its retries).

The edits that break them (each made once, seen failing, reverted):
- a request put in the window its answer came in, not the one it started in (report); one in
  flight when a fault was injected counted outside, not in that fault's window;
- a window ending when the heal ends, not when the fleet is whole (requests between the two
  counted outside);
- p99 taken as the largest value rather than the nearest rank;
- an answer while the key was being revoked (the revoking deploy still running) counted as
  served with a revoked key; a 401 outside any revocation counted as an expected refusal;
- a failure excused only when it started inside the gateway's loss (one in flight at the kill is
  then counted), or the whole gateway window excused rather than its first FAILOVER_S;
- fault windows shaded on the availability axis only; a window never whole not shaded;
- a box in rotation when any of its rows says UP (one pool UP, another DOWN);
- a stream that ended without a finish_reason counted as answered; the SDK's retries not counted
  (the request hook not installed);
- the prober counting only 200 as an answer (a box answering 403 from outside would pass).
"""

import http.server
import json
import socket
import threading
import typing

import pytest

from bench import soak
from bench.soak import Record, Revocation, Window
from thorfleet.settings.layout import GATEWAY_BOX_HEADER


def rec(start, outcome="ok", ttft=None, end=None, client="alice", kind="chat", retries=0,
        began=None, box=None):
    """A Record; a stream with a token (ttft) began then, unless `began` says earlier."""
    first = None if ttft is None else start + ttft
    return Record(client, kind, start, first, end if end is not None else start + 1, outcome,
                  retries, began=first if began is None else start + began, box=box)


def test_a_request_counts_in_the_window_it_started_in_until_the_fleet_is_whole():
    """Breaks with: a request put in the window its answer came in; a window ending at its heal,
    not when the fleet is whole; a request in flight when the fault came counted outside."""
    windows = [Window("engine_frozen", 10, 40, healed_at=70)]
    records = [rec(5, ttft=0.1), rec(9.5, "failed", ttft=0.2, end=12),  # in flight at 10: hit
               rec(3, "failed", end=9.9),  # over before the fault: outside
               rec(15, ttft=2.0), rec(20, "failed"), rec(50, "cut_silently", ttft=0.5),
               rec(65, ttft=1.0),  # healed at 40, whole at 70: still the window's
               rec(71, ttft=0.2)]
    probes = [(12, "thor-1", False, None), (30, "thor-1", True, 403), (80, "thor-2", True, 200)]
    rows, totals = soak.report(records, windows, probes)
    fault, outside = rows
    assert fault == {"window": "engine_frozen", "start_s": 10, "end_s": 40, "healed_at_s": 70,
                     "whole_after_s": 60, "remedied": False, "sent": 5, "answered": 2,
                     "failed_after_retries": 2, "failed_mid_answer": 1, "cut_silently": 1, "refused_revoked": 0,
                     "served_revoked": 0, "retried": 0, "ttft_p50_s": 0.5, "ttft_p99_s": 2.0,
                     "probes": 2, "prober_answers": 1}
    assert (outside["window"], outside["sent"], outside["answered"], outside["failed_after_retries"],
            outside["prober_answers"]) == ("outside", 3, 2, 1, 1)
    assert outside["ttft_p50_s"] == 0.1 and totals["sent"] == 8 and totals["prober_answers"] == 2


def test_p99_is_the_nearest_rank_not_the_largest():
    """Breaks with: p99 taken as the largest value."""
    values = list(range(1, 201))  # 1..200: the 99th percentile is the 198th value
    assert soak.percentile(values, 99) == 198 and soak.percentile(values, 50) == 100
    assert soak.percentile([], 50) is None


def test_a_revoked_key_must_be_refused_only_once_its_deploy_is_done():
    """Breaks with: an answer during the revoking deploy counted as served with a revoked key; a
    401 outside any revocation counted as an expected refusal."""
    revoked = [Revocation("carol", since=100, sure=130, until=160, back=190)]
    records = [rec(90, "refused", client="carol"),  # before any revocation: a failure
               rec(110, "ok", client="carol"),  # the revoking deploy still runs: either is right
               rec(120, "refused", client="carol"),
               rec(140, "ok", client="carol"),  # surely revoked, answered
               rec(150, "refused", client="carol"),
               rec(150, "ok", client="alice"),  # another client's key is not revoked
               rec(170, "ok", client="carol"), rec(175, "refused", client="carol"),
               rec(200, "refused", client="carol")]  # given back: a refusal is a failure
    assert [r.outcome for r in soak.settle(records, revoked)] == [
        "failed", "ok", "refused_revoked", "served_revoked", "refused_revoked", "ok", "ok",
        "refused_revoked", "failed"]


def test_the_goal_excuses_only_what_was_in_flight_in_the_gateways_own_loss():
    """Breaks with: a failure excused only when it started inside the loss; the whole gateway
    window excused rather than its first FAILOVER_S; a box's loss excusing a request whose
    answer had not begun (the door and the SDK retry those), or one over before it; a stream
    whose headers came but no token yet not excused (the door cannot send it again); one sent
    to the lost box after the fault began, before the door knew, not excused (CI met it twice);
    one begun on another box, or on that box once whole again, excused."""
    windows = [Window("gateway_killed", 100, 130, healed_at=200),
               Window("box_killed", 300, 310, healed_at=350, box="thor-2")]
    loss_end = 100 + soak.FAILOVER_S
    records = [rec(95, "failed", end=104),  # in flight at the kill: excused
               rec(110, "failed", end=111),  # inside the loss: excused
               rec(loss_end + 5, "failed"),  # the gateway's window, after its loss: counted
               rec(305, "failed"),  # another fault: counted
               rec(299, "failed", ttft=0.5, end=302),  # answering as the box was lost: excused
               rec(298, "failed", end=301),  # not answering yet: the door could retry it
               # begun, no token yet (vLLM sends its headers before the engine's first token):
               # the door cannot send it again either, excused
               rec(297, "failed", began=0.1, end=303),
               rec(290, "failed", ttft=0.5, end=299),  # over before the box was lost
               # sent to the lost box after it was lost, the door not knowing yet: begun, excused
               rec(301, "failed", began=0.1, end=320, box="thor-2"),
               rec(302, "failed", began=0.1, end=320, box="thor-1"),  # another box: counted
               rec(360, "failed", began=0.1, end=361, box="thor-2"),  # whole again: counted
               rec(320, "cut_silently"), rec(330, "served_revoked", client="carol"),
               rec(340, "refused_revoked", client="carol")]
    probes = [(50, "thor-1", False, None), (306, "thor-2", True, 403)]
    verdict = soak.goal(records, windows, probes)
    assert verdict == {"failed_after_retries": 6, "cut_silently": 1, "prober_answers": 1,
                       "served_revoked": 1, "met": False, "excused_in_gateway_loss": 2,
                       "excused_mid_answer_in_box_loss": 3, "failover_s": soak.FAILOVER_S}
    assert soak.goal([rec(1), rec(2)], windows, [(1, "thor-1", False, None)])["met"] is True


def test_the_timeline_shades_every_window_on_both_axes_and_writes_a_png(tmp_path):
    """Breaks with: windows shaded on the availability axis only; a window never whole not
    shaded."""
    windows = [Window("engine_frozen", 10, 30, healed_at=45),
               Window("nft_by_hand", 60, 90, healed_at=None),  # never whole: shaded to its heal
               Window("key_revoked", 100, 120, healed_at=125)]
    records = [rec(t, "ok" if t % 7 else "failed", ttft=0.3 + (t % 5) / 10, kind=kind)
               for t in range(0, 140, 2) for kind in ("tool_stream", "chat")]
    probes = [(t, "thor-1", 60 <= t < 90, None) for t in range(140)]
    figure = soak.draw_timeline(records, windows, probes)
    assert soak.spans(figure) == [3, 3]
    path = soak.write_timeline(records, windows, probes, tmp_path / "soak.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shares = dict(soak.availability(records))
    assert shares[0.0] == pytest.approx(4 / 6)  # 0, 2 and 4, a request of each kind: 0s failed


STAT = """# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight
door,FRONTEND,,,0,1,,5,0,0,0,0,0,,,,,OPEN,
thors,thor-1,0,0,0,1,1,3,0,0,,0,,0,0,0,0,UP,1
thors,thor-2,0,0,0,1,1,3,0,0,,0,,0,0,0,0,DRAIN,1
thors,thor-3,0,0,0,1,1,3,0,0,,0,,0,0,0,0,UP,1
thors-long,thor-3,0,0,0,1,1,3,0,0,,0,,0,0,0,0,DOWN,1
thors,thor-4,0,0,0,1,1,3,0,0,,0,,0,0,0,0,no check,1
thors,BACKEND,0,0,0,1,,9,0,0,0,0,,0,0,0,0,UP,3
stats,thor-9,0,0,0,1,1,3,0,0,,0,,0,0,0,0,UP,1
"""


def test_a_box_is_in_rotation_when_every_row_of_it_is_up():
    """Breaks with: a box in rotation when any of its rows says UP."""
    assert soak.in_rotation(STAT) == {"thor-1", "thor-4"}
    assert soak.in_rotation("") == set()


# --- the clients (the real SDK) and the prober, against this test's own server ----------------

CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}


def sse(*choices):
    return "".join(f"data: {json.dumps({**CHUNK, 'choices': [c]})}\n\n" for c in choices)


WHOLE = sse({"index": 0, "delta": {"role": "assistant", "content": "Hi"}},
            {"index": 0, "delta": {}, "finish_reason": "stop"}) + "data: [DONE]\n\n"
CUT = sse({"index": 0, "delta": {"role": "assistant", "content": "Hi"}})  # then the socket closes
CHAT = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}}
# a stream of ten chunks each carrying its usage so far, as the boxes send (forced usage)
LONG = "".join(f"data: {json.dumps({**CHUNK, 'choices': [{'index': 0, 'delta': {'content': 'x'}}], 'usage': {'prompt_tokens': 5, 'completion_tokens': n, 'total_tokens': 5 + n}})}\n\n"
               for n in range(1, 11)) + "data: [DONE]\n\n"


class Door(http.server.BaseHTTPRequestHandler):
    """Answers by the key: `whole` a stream to its finish, `cut` a stream closed without one,
    `flaky` 503 twice then a chat, `revoked` 401, `forbid` 403 to anything."""
    seen: typing.ClassVar[dict] = {}

    def log_message(self, *_):
        pass

    def do_GET(self):
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        key = self.headers["Authorization"].split()[-1]
        Door.seen[key] = Door.seen.get(key, 0) + 1
        if key == "revoked":
            return self.answer(401, json.dumps({"error": {"message": "no", "type": "x"}}))
        if key == "flaky" and Door.seen[key] <= 2:
            return self.answer(503, "{}")
        if key in ("whole", "cut", "long"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header(GATEWAY_BOX_HEADER, "thor-1")
            self.send_header("Connection", "close")  # no length: the body ends when it closes
            self.end_headers()
            self.wfile.write({"whole": WHOLE, "cut": CUT, "long": LONG}[key].encode())
            self.close_connection = True
            return None
        return self.answer(200, json.dumps(CHAT))

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if status == 200:
            self.send_header(GATEWAY_BOX_HEADER, "thor-1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture(scope="module")
def door():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Door)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def client(door, key):
    return soak.Client("alice", key, door, None, ("chat",), "m", clock=lambda: 0.0, timeout=10)


def test_a_stream_that_ends_without_a_finish_reason_is_cut_silently(door):
    """Breaks with: a stream that ended without a finish_reason counted as answered; the box
    the door named not kept (the goal's box loss reads it)."""
    whole = client(door, "whole").one("tool_stream")
    assert (whole.outcome, whole.box) == ("ok", "thor-1")
    cut = client(door, "cut").one("tool_stream")
    assert (cut.outcome, cut.error, cut.box) == ("cut_silently", "", "thor-1")
    assert client(door, "chat").one("chat").box == "thor-1"


def test_a_client_keeps_the_last_usage_it_received_and_an_abandoned_stream_stops_early(door):
    """Breaks with: the first chunk's usage kept, not the last; the abandoned stream read to
    its end (its tokens then those of the whole answer)."""
    assert client(door, "chat").one("chat").tokens == 8
    assert client(door, "long").one("tool_stream").tokens == 15
    left = client(door, "long").one("abandoned")
    assert (left.outcome, left.tokens) == ("ok", 5 + soak.ABANDON_AFTER)


def test_the_sdks_retries_are_counted_and_a_401_is_a_refusal(door):
    """Breaks with: the request hook not installed (the SDK's retries counted as none)."""
    flaky = client(door, "flaky").one("chat")
    assert (flaky.outcome, flaky.retries) == ("ok", 2)
    revoked = client(door, "revoked").one("chat")
    assert (revoked.outcome, revoked.retries) == ("refused", 0)


def test_any_http_answer_from_a_boxs_port_is_an_answer_to_the_prober(door):
    """Breaks with: the prober counting only 200 as an answer."""
    port = int(door.rsplit(":", 1)[1])
    with socket.socket() as closed:  # a port nothing listens on: no answer
        closed.bind(("127.0.0.1", 0))
        nobody = closed.getsockname()[1]
    prober = soak.Prober({"thor-1": "127.0.0.1"}, clock=lambda: 1.0, port=port)
    prober._one("thor-1", "127.0.0.1")
    prober.port = nobody
    prober._one("thor-2", "127.0.0.1")
    assert prober.probes == [(1.0, "thor-1", True, 403), (1.0, "thor-2", False, None)]


def test_each_gateways_token_count_is_what_the_client_received_plus_at_most_its_open_streams():
    """Breaks with: a count under the usage received taken (a box that missed a request); the
    gateways' disagreement not looked at; an abandoned or cut stream given no room (what its box
    sent past the client is a miscount)."""
    def toks(start, tokens, kind="chat", outcome="ok", client="alice"):
        r = rec(start, outcome, kind=kind, client=client)
        r.tokens = tokens
        return r

    closed = [toks(1, 100), toks(2, 50, "tool_stream"), toks(3, 0, outcome="refused_revoked")]
    cases = [  # (records, {gateway: counted}, met)
        (closed, {"gw-1": 150, "gw-2": 150}, True),
        (closed, {"gw-1": 150, "gw-2": 149}, False),  # the gateways disagree
        (closed, {"gw-1": 149, "gw-2": 149}, False),  # under what was received
        (closed, {"gw-1": 151, "gw-2": 151}, False),  # past it, nothing open-ended
        (closed + [toks(4, 20, "abandoned")], {"gw-1": 180, "gw-2": 180}, True),
        (closed + [toks(4, 20, "abandoned")],
         {"gw-1": 170 + soak.ABANDONED_MAX_TOKENS + 1, "gw-2": 170 + soak.ABANDONED_MAX_TOKENS + 1},
         False),  # past the abandoned stream's whole answer
        (closed + [toks(4, 20, "tool_stream", "failed")], {"gw-1": 175, "gw-2": 175}, True),
        (closed + [toks(4, 0, "chat", "failed")], {"gw-1": 151, "gw-2": 151}, False),
    ]
    for records, by_gateway, met in cases:
        counted = {g: {"alice": n} for g, n in by_gateway.items()}
        found = soak.exactness(records, counted)
        assert found["met"] is met, (by_gateway, found)
    row = soak.exactness(closed, {"gw-1": {"alice": 150}, "gw-2": {"alice": 150}})["clients"]
    assert row == {"alice": {"received": 150, "counted": {"gw-1": 150, "gw-2": 150},
                             "beyond_received": {"gw-1": 0, "gw-2": 0}, "open_ended": 0,
                             "bound": 0}}
