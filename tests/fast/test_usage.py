"""Each client's tokens, counted on the box (thorfleet/box/usage.py): the middleware vLLM
loads, driven as vLLM's ASGI app drives it (a response start, then body messages, SSE events
split wherever the transport splits them), and the ledger the watchdog answers GET /usage from.

The edits that break them: the in-flight record not rewritten per chunk (a server killed
mid-stream loses what its client had); `settle` not run at a start (a killed server's stream
never reaches the journal, and stops counting at the month's end) or counting an id twice; the
client header ignored (every token is `_box`'s); a chunk's usage read only from the last event
(an abandoned stream counts nothing); the ledger reading each file from the start at every poll
(counts doubled).
"""

import asyncio
import json
import time
import urllib.request

import pytest

from tests.fast.test_watchdog import wd
from thorfleet.settings import layout

usage = wd.usage  # the module the watchdog imports from beside it, as on the box

NOW = 1796558400.0  # 2026-12-06 12:00 UTC (a Sunday)


def chunk(completion, prompt=30, cached=0, model="mistral-small-4", choices=True):
    """One SSE event as vLLM writes it with continuous usage (every chunk its usage so far)."""
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": {"content": "x"}}] if choices else [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": cached} if cached else None}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def app_sending(messages, then=None):
    """An ASGI app that answers with `messages` (body parts), then raises `then` if given."""
    async def app(scope, receive, send):
        kind = b"text/event-stream" if messages and messages[0].startswith(b"data:") \
            else b"application/json"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind)]})
        for part in messages:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if then:
            raise then
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    return app


def ask(tmp_path, app, client=b"alice", method="POST"):
    """Run one request through the middleware; what the client received."""
    got = []
    headers = [(b"content-type", b"application/json")]
    if client:
        headers.append((usage.CLIENT_HEADER, client))
    scope = {"type": "http", "method": method, "path": "/v1/chat/completions",
             "headers": headers}

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        got.append(message)

    asyncio.run(usage.Usage(app, str(tmp_path))(scope, receive, send))
    return got


def journal(tmp_path):
    return [json.loads(line) for path in sorted(tmp_path.glob("*.jsonl"))
            for line in path.read_text().splitlines()]


def test_a_stream_is_counted_once_from_its_last_usage_whatever_the_chunking(tmp_path):
    events = chunk(1) + chunk(2) + chunk(3, cached=16) + chunk(3, cached=16, choices=False)
    parts = [events[i:i + 37] for i in range(0, len(events), 37)]  # cut mid-event, mid-line
    got = ask(tmp_path, app_sending(parts))
    assert b"".join(m.get("body", b"") for m in got) == events  # passed on untouched
    [line] = journal(tmp_path)
    assert (line["client"], line["model"], line["prompt"], line["cached"], line["completion"]) \
        == ("alice", "mistral-small-4", 30, 16, 3)
    assert list((tmp_path / "inflight").iterdir()) == []


def test_a_whole_answer_a_request_from_the_box_and_answers_without_usage(tmp_path):
    answer = {"model": "mistral-small-4-256k", "choices": [],
              "usage": {"prompt_tokens": 900, "completion_tokens": 12, "total_tokens": 912}}
    text = json.dumps(answer).encode()
    ask(tmp_path, app_sending([text[:10], text[10:]]), client=None)
    ask(tmp_path, app_sending([b'{"error": {"message": "bad", "code": 400}}']))  # no usage
    ask(tmp_path, app_sending([text]), method="GET")  # not an answer that costs tokens
    assert [(r["client"], r["model"], r["prompt"], r["completion"]) for r in journal(tmp_path)] \
        == [(usage.BOX_CLIENT, "mistral-small-4-256k", 900, 12)]


def test_the_responses_api_counts_input_and_output_tokens(tmp_path):
    done = {"type": "response.completed", "response": {
        "model": "mistral-small-4", "usage": {"input_tokens": 40, "output_tokens": 7,
                                              "input_tokens_details": {"cached_tokens": 32}}}}
    events = b"event: response.completed\ndata: " + json.dumps(done).encode() + b"\n\n"
    ask(tmp_path, app_sending([b"data: {}\n\n", events]))
    [line] = journal(tmp_path)
    assert (line["prompt"], line["cached"], line["completion"]) == (40, 32, 7)


def test_an_abandoned_stream_counts_what_was_sent_before_it_stopped(tmp_path):
    with pytest.raises(asyncio.CancelledError):
        ask(tmp_path, app_sending([chunk(1), chunk(2) + chunk(5)[:20]],
                                  then=asyncio.CancelledError()))
    [line] = journal(tmp_path)
    assert line["completion"] == 2  # the half-sent third event is not what the client had


def test_a_server_killed_mid_stream_leaves_what_its_client_had_counted_once(tmp_path):
    (tmp_path / "inflight").mkdir()
    answer = usage.Answer(tmp_path, "bob")
    answer.stream = True
    answer.feed(chunk(4, prompt=50))
    answer.feed(chunk(9, prompt=50))  # ...then SIGKILL: no close(), no journal line
    ledger = usage.Ledger(str(tmp_path))
    now = time.time()
    day = ledger.answer(now)["clients"]["bob"]["mistral-small-4"]["day"]
    assert (day["prompt"], day["completion"]) == (50, 9)
    usage.Usage(app_sending([]), str(tmp_path))  # the next server's start settles it
    assert [(r["client"], r["completion"]) for r in journal(tmp_path)] == [("bob", 9)]
    assert list((tmp_path / "inflight").iterdir()) == []
    again = ledger.answer(now)["clients"]["bob"]["mistral-small-4"]["day"]
    assert (again["prompt"], again["completion"]) == (50, 9)  # not 100, 18
    usage.settle(tmp_path)  # a second start finds nothing to move
    assert len(journal(tmp_path)) == 1


def test_a_record_both_in_flight_and_in_the_journal_is_counted_once(tmp_path):
    """close() appends the line, then removes the in-flight record: a read between sees both."""
    (tmp_path / "inflight").mkdir()
    answer = usage.Answer(tmp_path, "carol")
    answer.stream = True
    answer.feed(chunk(6))
    usage.journal(tmp_path, answer.record(time.time()))
    totals = usage.Ledger(str(tmp_path)).answer()["clients"]["carol"]["mistral-small-4"]["day"]
    assert totals["completion"] == 6


def write(tmp_path, day, t, client, prompt, completion, cached=0, model="m"):
    with (tmp_path / f"{day}.jsonl").open("a") as f:
        f.write(json.dumps({"id": f"{client}{t}{prompt}", "t": t, "client": client, "model": model,
                            "prompt": prompt, "cached": cached, "completion": completion}) + "\n")


def test_the_ledger_splits_day_month_and_minute_and_reads_only_what_was_appended(tmp_path):
    (tmp_path / "inflight").mkdir()
    write(tmp_path, "2026-11-30", NOW - 6 * 86400, "alice", 1000, 1)  # last month: not counted
    write(tmp_path, "2026-12-01", NOW - 5 * 86400, "alice", 100, 10, cached=64)
    write(tmp_path, "2026-12-06", NOW - 120, "alice", 20, 2)
    write(tmp_path, "2026-12-06", NOW - 30.5, "alice", 5, 1)
    write(tmp_path, "2026-12-06", NOW - 30.2, "bob", 7, 0)
    ledger = usage.Ledger(str(tmp_path))
    seen = ledger.answer(NOW)
    assert (seen["day"], seen["month"]) == ("2026-12-06", "2026-12")
    alice = seen["clients"]["alice"]["m"]
    assert alice["month"] == {"prompt": 125, "cached": 64, "completion": 13}
    assert alice["day"] == {"prompt": 25, "cached": 0, "completion": 3}
    assert seen["minute"] == {"alice": [[int(NOW - 30.5), 6]], "bob": [[int(NOW - 30.2), 7]]}
    write(tmp_path, "2026-12-06", NOW - 1, "alice", 3, 3)
    with (tmp_path / "2026-12-06.jsonl").open("a") as f:
        f.write('{"id": "half-written", "t": ')  # a line being appended: read at the next poll
    again = ledger.answer(NOW)
    assert again["clients"]["alice"]["m"]["day"] == {"prompt": 28, "cached": 0, "completion": 6}
    assert again["minute"]["alice"] == [[int(NOW - 30.5), 6], [int(NOW - 1), 6]]
    assert ledger.answer(NOW + 40)["minute"] == {"alice": [[int(NOW - 1), 6]]}  # the window moved


def test_the_watchdog_answers_usage_on_its_port_and_the_paths_are_one(tmp_path):
    (tmp_path / "inflight").mkdir()
    write(tmp_path, time.strftime("%Y-%m-%d", time.gmtime()), time.time(), "alice", 11, 4)
    server = wd.serve_exporter("127.0.0.1", 0, dict, lambda: True, tmp_path)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/usage",
                                    timeout=5) as answer:
            seen = json.load(answer)
    finally:
        server.shutdown()
    assert seen["clients"]["alice"]["m"]["day"] == {"prompt": 11, "cached": 0, "completion": 4}
    assert usage.DIRECTORY == layout.BOX_USAGE_DIR
    assert usage.CLIENT_HEADER.decode() == layout.GATEWAY_CLIENT_HEADER.lower()
    assert layout.BOX_USAGE_CODE == f"{layout.BOX_LIB}/usage.py"
