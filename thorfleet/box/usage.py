"""Each client's tokens, counted on the box from the usage vLLM itself puts in its answers.

Two halves, one file (stdlib only):

- `Usage`, an ASGI middleware vLLM loads (`--middleware thorfleet_usage.Usage`, in the server's
  container: files/thor/vllm.yaml.j2). It reads, as they leave, the `usage` of each answer: a whole
  JSON answer's, or for a stream the one every chunk carries (vLLM's --enable-force-include-usage
  turns continuous usage on: entrypoints/utils.py should_include_usage). The client is the one the
  door names (its X-Thorfleet-Client header; only the gateways reach a box's port, and the door
  replaces any header a client sent); a request from the box itself (the proof, the benchmark)
  is `_box`.
- `Ledger`, what the watchdog answers on GET /usage (files/thor/bin/thorfleet-watchdog): each client's
  prompt, cached-prompt and completion tokens per model, today and this month (UTC calendar
  periods), and its tokens by second over the last minute.

Why counted here, not at the door: the usage is in the answer's body, which only the box writes
(the door would have to parse every chunk of every stream); the box's disk outlives a gateway's
reload, a failover and the loss of a gateway, and each gateway reads every box, so both know the
same totals.

What survives what. A finished answer is one line of the UTC day's journal (DIR/YYYY-MM-DD.jsonl,
appended in one write). While a stream runs, its latest usage is rewritten in place after every
chunk (DIR/inflight/ID.json, one pwrite of a fixed size: no partial record, no growth), so a
server killed mid-stream leaves what its client had received; the next server start moves such
records into the journal. A client that abandons a stream leaves the usage of the last chunk it
was sent: what the box generated before vLLM stopped its request.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import deque
from pathlib import Path

DIRECTORY = "/var/lib/thorfleet/usage"  # layout.BOX_USAGE_DIR: mounted at the same path
CLIENT_HEADER = b"x-thorfleet-client"  # layout.GATEWAY_CLIENT_HEADER, lower-case as ASGI gives headers
BOX_CLIENT = "_box"  # a request that did not come through the door
RECORD_SIZE = 512  # an in-flight record's fixed size (a client name is 32 at most, a model's ~80)
WINDOW_S = 60  # tokens_per_minute's window


def _day(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def counts(usage: dict) -> tuple[int, int, int] | None:
    """(prompt, cached, completion) of an answer's `usage`: chat and completions name them
    prompt_/completion_tokens, the Responses API input_/output_tokens; None when it is not one."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens") or 0
    return prompt, cached if isinstance(cached, int) else 0, completion


class Answer:
    """One answer's usage as it leaves: its latest counts, and the in-flight record of a stream."""

    def __init__(self, directory: Path, client: str):
        self.directory = directory
        self.id = uuid.uuid4().hex
        self.client = client
        self.model = ""
        self.counts: tuple[int, int, int] | None = None
        self.stream = False
        self.rest = b""  # a stream's bytes after its last whole event
        self.body = []  # a JSON answer's bytes, parsed once whole
        self.fd = None

    def record(self, t: float) -> dict:
        prompt, cached, completion = self.counts
        return {"id": self.id, "t": round(t, 3), "client": self.client, "model": self.model,
                "prompt": prompt, "cached": cached, "completion": completion}

    def note(self, answer: dict):
        """Take the usage an answer (or a chunk) carries; the Responses API's streamed events
        carry theirs inside `response`."""
        if not isinstance(answer, dict):
            return
        if not isinstance(answer.get("usage"), dict) and isinstance(answer.get("response"), dict):
            answer = answer["response"]
        found = counts(answer.get("usage"))
        if found is not None:
            self.counts = found
            self.model = str(answer.get("model") or self.model)[:120]

    def feed(self, chunk: bytes):
        """Read one body message's bytes: SSE events (`data: {...}` then a blank line) as they
        come, or a JSON answer's bytes until it is whole."""
        if not self.stream:
            self.body.append(chunk)
            return
        events = (self.rest + chunk).replace(b"\r\n", b"\n").split(b"\n\n")
        self.rest = events.pop()
        before = self.counts
        for event in events:
            for line in event.split(b"\n"):
                if line.startswith(b"data:") and b'"usage"' in line:
                    try:
                        self.note(json.loads(line[5:]))
                    except ValueError:
                        pass
        if self.counts != before:
            self.keep()

    def keep(self):
        """Rewrite the in-flight record with the latest counts (one write, fixed size)."""
        if self.fd is None:
            self.fd = os.open(self.directory / "inflight" / f"{self.id}.json",
                              os.O_WRONLY | os.O_CREAT, 0o600)
        text = json.dumps(self.record(time.time())).encode()
        os.pwrite(self.fd, text[:RECORD_SIZE].ljust(RECORD_SIZE), 0)

    def close(self):
        """The answer ended (whole, cut or abandoned): its line in the day's journal, then its
        in-flight record gone (a reader meanwhile sees both and counts the id once)."""
        if not self.stream and self.body:
            try:
                self.note(json.loads(b"".join(self.body)))
            except ValueError:
                pass
        if self.counts is not None:
            journal(self.directory, self.record(time.time()))
        if self.fd is not None:
            os.close(self.fd)
            os.unlink(self.directory / "inflight" / f"{self.id}.json")


def journal(directory: Path, record: dict):
    """Append `record` to its UTC day's journal in one write (O_APPEND: lines never interleave)."""
    fd = os.open(directory / f"{_day(record['t'])}.jsonl",
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, json.dumps(record).encode() + b"\n")
    finally:
        os.close(fd)


def settle(directory: Path):
    """Move the in-flight records a killed server left into the journal: at a server's start,
    when none of its own is in flight."""
    for path in sorted((directory / "inflight").glob("*.json")):
        try:
            record = json.loads(path.read_bytes())
            if not _seen(directory / f"{_day(record['t'])}.jsonl", record["id"]):
                journal(directory, record)
        except (ValueError, KeyError, OSError):
            pass
        path.unlink(missing_ok=True)


def _seen(path: Path, record_id: str) -> bool:
    try:
        return f'"id": "{record_id}"'.encode() in path.read_bytes()
    except FileNotFoundError:
        return False


class Usage:
    """vLLM's middleware: counts the usage of each POST's answer (the completions, chat and
    responses routes all carry one; other answers carry none and are passed untouched)."""

    def __init__(self, app, directory: str = DIRECTORY):
        self.app = app
        self.directory = Path(directory)
        (self.directory / "inflight").mkdir(parents=True, exist_ok=True)
        settle(self.directory)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        named = dict(scope["headers"]).get(CLIENT_HEADER, b"").decode("latin-1")
        answer = Answer(self.directory, named or BOX_CLIENT)

        async def counting(message):
            if message["type"] == "http.response.start":
                kind = dict(message.get("headers", ())).get(b"content-type", b"")
                answer.stream = kind.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                answer.feed(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, counting)
        finally:
            answer.close()


# --- the reading half: what GET /usage answers ------------------------------------------------

def _zero():
    return {"prompt": 0, "cached": 0, "completion": 0}


class Ledger:
    """The journal's totals, read incrementally: a day's file is read from where the last read
    stopped (a journal only grows), so a poll every few seconds costs what was appended since."""

    def __init__(self, directory: str = DIRECTORY):
        self.directory = Path(directory)
        self.read_to = {}  # file name: bytes read
        self.totals = {}  # file name: {(client, model): {prompt, cached, completion}}
        self.ids = {}  # file name: ids read (an in-flight record whose line is in is not counted)
        self.recent = deque()  # (t, client, tokens) of lines of the last minute, oldest first

    def _read(self, path: Path, now: float):
        start = self.read_to.get(path.name, 0)
        with path.open("rb") as f:
            f.seek(start)
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]  # a line being written waits for the next read
        self.read_to[path.name] = start + len(whole)
        totals = self.totals.setdefault(path.name, {})
        ids = self.ids.setdefault(path.name, set())
        for line in whole.splitlines():
            try:
                r = json.loads(line)
                row = totals.setdefault((r["client"], r["model"]), _zero())
                for kind in row:
                    row[kind] += r[kind]
                ids.add(r["id"])
                if r["t"] > now - WINDOW_S:
                    self.recent.append((r["t"], r["client"], r["prompt"] + r["completion"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line thorfleet did not write

    def answer(self, now: float | None = None) -> dict:
        """The JSON of GET /usage (shape: files/gateway/bin/thorfleet-door-usage reads it)."""
        now = time.time() if now is None else now
        day, month = _day(now), _day(now)[:7]
        if self.directory.is_dir():
            for path in sorted(self.directory.glob(f"{month}-??.jsonl")):
                self._read(path, now)
        while self.recent and self.recent[0][0] <= now - WINDOW_S:
            self.recent.popleft()
        clients: dict = {}

        def add(client, model, period, row):
            kinds = clients.setdefault(client, {}).setdefault(
                model, {"day": _zero(), "month": _zero()})[period]
            for kind in kinds:
                kinds[kind] += row[kind]

        for name, totals in self.totals.items():
            if name.startswith(month):
                for (client, model), row in totals.items():
                    add(client, model, "month", row)
                    if name.startswith(day):
                        add(client, model, "day", row)
        minute = [(t, c, n) for t, c, n in self.recent]
        for record in self._in_flight():
            if record["id"] in self.ids.get(f"{_day(record['t'])}.jsonl", ()):
                continue
            if _day(record["t"])[:7] == month:
                add(record["client"], record["model"], "month", record)
                if _day(record["t"]) == day:
                    add(record["client"], record["model"], "day", record)
            if record["t"] > now - WINDOW_S:
                minute.append((record["t"], record["client"],
                               record["prompt"] + record["completion"]))
        by_second: dict = {}
        for t, client, tokens in minute:
            seconds = by_second.setdefault(client, {})
            seconds[int(t)] = seconds.get(int(t), 0) + tokens
        return {"now": now, "day": day, "month": month, "clients": clients,
                "minute": {c: sorted(map(list, s.items())) for c, s in by_second.items()}}

    def _in_flight(self):
        for path in (self.directory / "inflight").glob("*.json"):
            try:
                record = json.loads(path.read_bytes())
                if isinstance(record, dict) and all(k in record for k in (
                        "id", "t", "client", "model", "prompt", "cached", "completion")):
                    yield record
            except (ValueError, OSError):
                continue  # gone meanwhile, or not ours
