"""`thorfleet bench --conversations`: the turns it sends, the whole history each resends, what it
makes of the answers, and one streamed answer read as vLLM and the door send it (a local TLS
server with a CA of the gateway's own making)."""

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from thorfleet.cli import conversations as c
from thorfleet.gateway import tls
from thorfleet.settings import layout


def test_each_conversation_starts_long_and_grows_a_little_a_turn():
    turns = c.plan(2, 3, 1500, 300)
    assert [(t.conversation, t.turn) for t in turns] == [(0, 1), (0, 2), (0, 3),
                                                         (1, 1), (1, 2), (1, 3)]
    assert [t.words for t in turns[:3]] == [1250, 250, 250]


def test_no_two_conversations_share_more_than_the_system_prompt():
    first = [c.text(n, 1, 50) for n in range(3)]
    assert len(set(first)) == 3 and all(t.startswith(f"Conversation {n}, message 1. ")
                                        for n, t in enumerate(first))
    assert c.text(1, 2, 50) == c.text(1, 2, 50)  # the same conversation, the same words
    assert len(c.text(0, 1, 50).split()) == 4 + 50
    # a run's conversations are new to a box that served another run's (its prefix cache)
    assert c.text(0, 1, 50, "a1") != c.text(0, 1, 50, "b2")
    assert c.text(0, 1, 50, "a1").startswith("Conversation 0 of run a1, message 1. ")


def test_a_turn_resends_the_whole_history_in_order():
    messages = c.history(["one", "two", "three"], ["a1", "a2"])
    assert [(m["role"], m["content"]) for m in messages] == [
        ("system", c.SYSTEM), ("user", "one"), ("assistant", "a1"), ("user", "two"),
        ("assistant", "a2"), ("user", "three")]
    assert c.history(["one"], []) == [
        {"role": "system", "content": c.SYSTEM}, {"role": "user", "content": "one"}]


def row(conversation, turn, box, ttft, cached=0, queued=0.0, prompt=1000):
    return {"conversation": conversation, "turn": turn, "box": box, "ttft_ms": ttft,
            "queued_ms": queued, "prompt_tokens": prompt, "cached_tokens": cached}


@pytest.mark.parametrize(("rows", "stayed", "busiest", "ratio"), [
    # each conversation stays on its box: every later turn where its prefix is
    ([row(0, 1, "a", 1000), row(0, 2, "a", 100, 900), row(0, 3, "a", 100, 950),
      row(1, 1, "b", 1000), row(1, 2, "b", 100, 900), row(1, 3, "b", 100, 950)], 1.0, 1.0, 0.1),
    # spread: the second turn moves, the third stays where the second went
    ([row(0, 1, "a", 1000), row(0, 2, "b", 1000), row(0, 3, "b", 100, 950)], 0.5, 1.33, 0.55),
    # one box takes all: the later turns stay, the busiest is 2x a mean over the boxes used
    ([row(0, 1, "a", 1000), row(0, 2, "a", 100), row(1, 1, "a", 1000), row(1, 2, "a", 100),
      row(2, 1, "b", 1000), row(2, 2, "a", 1000)], 0.667, 1.67, 0.1),
])
def test_the_summary_counts_where_later_turns_landed_and_how_fast(rows, stayed, busiest, ratio):
    s = c.summary(rows)
    assert s["later_turns_on_their_box"] == stayed
    assert s["busiest_box_vs_mean"] == busiest
    assert s["later_vs_first_ttft"] == ratio
    assert s["failed"] == 0


def test_a_turn_that_failed_is_counted_and_left_out_of_the_figures():
    s = c.summary([row(0, 1, "a", 1000), row(0, 2, "a", 100, 900),
                   {"conversation": 1, "turn": 1, "error": "503 no box was free"}])
    assert s["failed"] == 1
    assert s["turns"][1]["requests"] == 1 and s["requests_per_box"] == {"a": 2}
    assert s["later_turns_on_their_box"] == 1.0


def test_the_doors_wait_is_taken_out_of_the_time_to_first_token():
    s = c.summary([row(0, 1, "a", 1500, queued=500), row(0, 2, "a", 300, 900, queued=200)])
    assert s["turns"][1]["median_ttft_ms"] == 1000 and s["turns"][2]["median_ttft_ms"] == 100
    assert s["turns"][2]["cached_share"] == 0.9
    assert s["later_vs_first_ttft"] == 0.1


CHUNKS = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
          {"choices": [{"delta": {"content": "Hello"}}]},
          {"choices": [{"delta": {"content": " there"}, "finish_reason": "length"}]},
          {"choices": [], "usage": {"prompt_tokens": 1200, "completion_tokens": 2,
                                    "prompt_tokens_details": {"cached_tokens": 1152}}}]


@pytest.fixture
def door(tmp_path):
    """A door on 127.0.0.1 with a certificate of the fleet's CA, streaming CHUNKS as vLLM does
    and saying which box answered and how long it queued; the requests it got."""
    ca = tls.ensure_fleet_ca(tmp_path / "ca")
    cert, key = tls.gateway_pair(tmp_path / "ca", "gw", ["127.0.0.1"])
    (tmp_path / "gw.pem").write_bytes(tls.haproxy_pem(cert, key))
    got = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append((self.path, dict(self.headers),
                        json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header(layout.GATEWAY_BOX_HEADER, "thor-2")
            self.send_header(layout.GATEWAY_QUEUED_HEADER, "250")
            self.end_headers()
            for chunk in CHUNKS:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "gw.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield c.Door(f"https://127.0.0.1:{server.server_port}/v1", str(ca), "the-key"), got
    server.shutdown()


def test_one_turn_reads_the_stream_the_usage_and_the_doors_headers(door):
    client, got = door
    answer = client.ask("mistral-small-4", [{"role": "user", "content": "hi"}], 2,
                        {"X-Session-Token": "conversation-0"})
    assert answer["answer"] == "Hello there"
    assert (answer["box"], answer["queued_ms"]) == ("thor-2", 250.0)
    assert (answer["prompt_tokens"], answer["cached_tokens"]) == (1200, 1152)
    assert answer["ttft_ms"] > 0
    path, headers, body = got[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer the-key"
    assert headers["X-Session-Token"] == "conversation-0"
    assert body["stream"] and body["temperature"] == 0 and body["max_tokens"] == 2


def test_a_refusal_is_the_turns_error(tmp_path):
    ca = tls.ensure_fleet_ca(tmp_path / "ca")
    answer = c.Door("https://127.0.0.1:9/v1", str(ca), "k").ask("m", [], 1)
    assert "error" in answer and "answer" not in answer


def test_each_conversation_sends_its_turns_in_order_each_with_the_answers_before_it(door):
    client, got = door
    rows = c.converse(client, "m", c.plan(2, 3, 30, 15), 2, think_s=0)
    assert [(r["conversation"], r["turn"], r["box"]) for r in rows] == [
        (0, 1, "thor-2"), (0, 2, "thor-2"), (0, 3, "thor-2"),
        (1, 1, "thor-2"), (1, 2, "thor-2"), (1, 3, "thor-2")]
    bodies = [body for _, _, body in got]
    third = next(b for b in bodies if b["messages"][-1]["content"].startswith(
        "Conversation 1, message 3."))
    assert [m["role"] for m in third["messages"]] == ["system", "user", "assistant", "user",
                                                     "assistant", "user"]
    assert third["messages"][2]["content"] == "Hello there"  # the answer the door streamed
    assert c.summary(rows)["later_turns_on_their_box"] == 1.0
