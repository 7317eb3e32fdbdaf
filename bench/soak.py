"""Soak: faults under load, counted. Clients through the door while a fault schedule runs on
the sim, and a prober on this machine's side of every box's vLLM port.

    python -m sim up --hosts 3 --gateways 2
    python -m bench.soak --hosts 1-3 --minutes 20 --out bench/results/soak.json \\
        --plot bench/results/soak.png
    python -m bench.soak --hosts 1-3 --short    # CI's: three cheap faults over 2 min (~5 min)

Setup: the boxes thor-<hosts> behind gw-1 and gw-2 (gateway_virtual_ip: the sim's, keepalived),
with three gateway_clients (alice, bob, carol; their keys made by the deploy under the run's
folder), a short watchdog (a frozen engine is restarted within a minute), converged once.

Load: a thread per client, each the real OpenAI SDK (`openai.OpenAI`, its default
max_retries=2: 429, 5xx, 408/409 and connection errors retried with backoff) on the door's
address, verifying it against the fleet CA, each with its own mix of MIX's kinds: a short chat
(not streamed), a streamed tool call, a streamed reasoning answer, a long prompt (streamed), and,
with --vision (the last box on the vision profile), a picture. Each request is one Record:
- `ok`: answered (a stream: it ended with a finish_reason);
- `cut_silently`: a stream that ended, no exception, without any finish_reason;
- `failed`: an exception out of the SDK: after its retries, or in the middle of a stream;
- `refused` (401) becomes `refused_revoked` when the client's key was revoked then (settle()),
  else `failed`; an answer while the key was surely revoked becomes `served_revoked`.
Time to first token: a stream's first chunk carrying content, a tool call or reasoning.

Prober: every PROBE_EVERY_S an HTTP GET of each box's vLLM port (its sim network address,
VLLM_PORT), PROBE_TIMEOUT_S each, from this machine. Any HTTP answer is an answer: the boxes'
firewall must admit only the gateways.

Faults (FAULTS, one at a time, each at its offset or once the one before is whole, whichever is
later): inject, hold, heal, then wait until the fleet is whole: every box's server UP at the door
(HAProxy's `show stat` on the address's holder), every box's firewall table live, both gateways
running HAProxy and keepalived at one level. A fault not whole within its time gets the
operator's remedy (a converge), and its row says so (`remedied`).

Windows: a fault's window runs from its injection to when the fleet is whole again (or the end
of its heal when it never was); a request belongs to the window it started in, the rest are
`outside`. The goal (goal()): 0 requests failed after retries, except those in flight during a
gateway's own loss (the FAILOVER_S after the gateway holding the address is killed) and streams
whose answer had begun (its headers came, with or without a token) when a box was lost
(BOX_LOSS), or on the lost box (the door names each answer's box) while its window ran, each
counted apart; 0 streams
cut silently, 0 prober answers, 0 requests served with a revoked key.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import math
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from thorfleet.settings.layout import GATEWAY_BOX_HEADER

VLLM_PORT = 8002  # the boxes' vLLM port (tests/fleet/test_gateway.py)
PROBE_EVERY_S = 1.0
PROBE_TIMEOUT_S = 1.0
BIN_S = 5.0  # the timeline's availability bins
# The door's own loss when the gateway holding the address dies: bench/door_failover.py measured
# the first request served 3.9 s after the kill (median of 3, door-failover.json), and the
# gateway pair's story allows the address 20 s to move and serve (MOVED_S): the bound stated here.
FAILOVER_S = 20.0
GATEWAY_LOSS = ("gateway_killed",)  # the faults whose first FAILOVER_S are the door's own loss
# the faults that take a box's engine away mid-answer: a stream it had begun cannot be sent
# again (the door retries only what never started), so it fails with an error event
BOX_LOSS = ("engine_frozen", "box_killed")
EAGLE, VISION = "mistral-small-4", "mistral-small-4-vision"
PAIR = ("gw-1", "gw-2")
CLIENTS = ("alice", "bob", "carol")
REVOKED = "carol"  # the client whose key the key_revoked fault takes away, then gives back
# Each client's mix (round robin), and --vision's client. Carol asks little: she is the one
# revoked, and her refusals should not crowd the others out.
MIXES = {"alice": ("chat", "tool_stream", "reasoning", "abandoned"),
         "bob": ("long", "chat", "tool_stream", "abandoned"),
         "carol": ("chat", "reasoning"),
         "dave": ("image", "chat")}
# Short watchdog settings (as tests/fleet/test_watch.py's): a frozen engine is restarted within
# about a minute, not the product's minutes.
WATCHDOG = {"watchdog_interval_s": 5, "watchdog_failures": 3, "watchdog_timeout_s": 5,
            "watchdog_restart_backoff_s": 0, "watchdog_max_restarts_per_hour": 10}
# The clients' limits at the door, above what the soak's clients ask (a 429 would be retried by
# the SDK, and counted, but is not what the soak is about).
DOOR_LIMITS = {"gateway_client_max_inflight": 4, "gateway_client_requests_per_minute": 600}
ABANDONED_MAX_TOKENS = 64  # what an abandoned stream asks; its client reads ABANDON_AFTER chunks
ABANDON_AFTER = 3
COUNTED_WITHIN_S = 6.0  # the gateways' usage services ask every box every 2 s (1 s each)


# ------------------------------------------------------------------ records and the report (pure)

@dataclasses.dataclass
class Record:
    """One request as its client saw it; times in seconds from the soak's start."""
    client: str
    kind: str
    start: float
    first_token: float | None  # a stream's first token (None: not a stream, or none came)
    end: float
    outcome: str  # ok, failed, cut_silently, refused (raw); refused_revoked, served_revoked
    retries: int = 0
    error: str = ""
    tokens: int = 0  # prompt + completion of the last usage the client received (0: none came)
    # a stream's answer began: its status and headers came through the door, which sends nothing
    # again after that (None: not a stream, or it failed before). vLLM sends them before the
    # engine's first token (chat_completion/api_router.py returns a StreamingResponse, which
    # starts the response before its first chunk), so a stream can have begun with no token.
    began: float | None = None
    # the box that answered, as the door names it (its X-Thorfleet-Box header; None: no answer)
    box: str | None = None


@dataclasses.dataclass
class Window:
    """A fault's window: injected at `start`, healed by `end`, whole again at `healed_at`."""
    name: str
    start: float
    end: float
    healed_at: float | None = None
    remedied: bool = False  # not whole by itself in time: a converge made it so
    box: str | None = None  # the box it took (BOX_LOSS), as the door names it

    @property
    def until(self) -> float:
        return self.healed_at if self.healed_at is not None else self.end


@dataclasses.dataclass
class Revocation:
    """A client's key taken away: the deploy that removed it ran [since, sure), the one that gave
    it back [until, back). Sent in [sure, until) a request must be refused; in the deploys
    either answer is right (HAProxy's reload lands somewhere in them)."""
    client: str
    since: float
    sure: float | None = None
    until: float | None = None
    back: float | None = None


def settle(records, revocations):
    """Records with `refused` and `ok` read against the revocations: refused while the key was
    (or may have been) revoked is `refused_revoked`, refused otherwise `failed`; answered while it
    was surely revoked `served_revoked`. The records' other outcomes stay."""
    settled = []
    for r in records:
        outcome = r.outcome
        mine = [v for v in revocations if v.client == r.client]
        surely = any(v.sure is not None and v.sure <= r.start < (v.until if v.until is not None
                                                                  else math.inf) for v in mine)
        maybe = any(v.since <= r.start < (v.back if v.back is not None else math.inf)
                    for v in mine)
        if outcome == "refused":
            outcome = "refused_revoked" if maybe else "failed"
        elif outcome == "ok" and surely:
            outcome = "served_revoked"
        settled.append(dataclasses.replace(r, outcome=outcome))
    return settled


def percentile(values, q):
    """The nearest-rank q-th percentile (None for no values)."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def window_of(start, windows):
    """The window a moment `start` falls in (the first that holds it), or None."""
    return next((w for w in windows if w.start <= start < w.until), None)


def hit_by(record, windows):
    """The window a request belongs to: the one it started in, else the first fault injected
    while it was in flight (a stream begun a second before a box froze is that fault's
    casualty, not a failure of the quiet fleet), or None."""
    return window_of(record.start, windows) or next(
        (w for w in windows if record.start < w.start <= record.end), None)


def counts(records, probes):
    """The figures of one row: `records` settled; `probes` [(time, host, answered)]."""
    ttft = [r.first_token - r.start for r in records if r.first_token is not None]
    p50, p99 = percentile(ttft, 50), percentile(ttft, 99)
    return {"sent": len(records),
            "answered": sum(r.outcome == "ok" for r in records),
            "failed_after_retries": sum(r.outcome == "failed" for r in records),
            # of those, streams whose answer had begun: never sent again (the door retries only
            # what never started), so the client gets an error mid-answer
            "failed_mid_answer": sum(r.outcome == "failed" and r.began is not None
                                     for r in records),
            "cut_silently": sum(r.outcome == "cut_silently" for r in records),
            "refused_revoked": sum(r.outcome == "refused_revoked" for r in records),
            "served_revoked": sum(r.outcome == "served_revoked" for r in records),
            "retried": sum(r.retries > 0 for r in records),
            "ttft_p50_s": None if p50 is None else round(p50, 3),
            "ttft_p99_s": None if p99 is None else round(p99, 3),
            "probes": len(probes),
            "prober_answers": sum(1 for p in probes if p[2])}


def report(records, windows, probes):
    """A row per fault window, one for outside them, and the totals: (rows, totals)."""
    rows = []
    for w in windows:
        mine = [r for r in records if hit_by(r, windows) is w]
        seen = [p for p in probes if window_of(p[0], windows) is w]
        rows.append({"window": w.name, "start_s": round(w.start, 1), "end_s": round(w.end, 1),
                     "healed_at_s": None if w.healed_at is None else round(w.healed_at, 1),
                     "whole_after_s": (None if w.healed_at is None
                                       else round(w.healed_at - w.start, 1)),
                     "remedied": w.remedied, **counts(mine, seen)})
    rest = [r for r in records if hit_by(r, windows) is None]
    rows.append({"window": "outside", **counts(rest, [p for p in probes
                                                      if window_of(p[0], windows) is None])})
    return rows, {"window": "all", **counts(records, probes)}


def gateway_loss(windows, failover_s=FAILOVER_S):
    """[(start, end)] of the door's own loss: the first failover_s of each gateway kill."""
    return [(w.start, w.start + failover_s) for w in windows if w.name in GATEWAY_LOSS]


def goal(records, windows, probes, failover_s=FAILOVER_S):
    """The issue's four counts, each to be 0. A request failed after retries is excused when it
    was in flight at any moment of a gateway's own loss (gateway_loss()), or when it is a stream
    whose answer had begun and was in flight as a box was lost (BOX_LOSS): its box stopped
    answering mid-stream, the one failure no retry may mend. Both are counted, apart."""
    losses = gateway_loss(windows, failover_s)
    box_losses = [w for w in windows if w.name in BOX_LOSS]

    def in_gateway_loss(r):
        return any(r.start <= b and r.end >= a for a, b in losses)

    def in_box_loss(r):
        """Begun, and its box lost while it was in flight: at the fault's start, or, on the
        box the fault took, at any moment until the door knew (a stream sent to a box whose
        engine had just frozen gets its headers from vLLM's API server and no token)."""
        return r.began is not None and any(
            r.start < w.start <= r.end or (r.box is not None and r.box == w.box
                                           and r.start <= w.until and r.end >= w.start)
            for w in box_losses)

    failed = [r for r in records if r.outcome == "failed"]
    found = {"failed_after_retries": sum(not in_gateway_loss(r) and not in_box_loss(r)
                                         for r in failed),
             "cut_silently": sum(r.outcome == "cut_silently" for r in records),
             "prober_answers": sum(1 for p in probes if p[2]),
             "served_revoked": sum(r.outcome == "served_revoked" for r in records)}
    return {**found, "met": not any(found.values()),
            "excused_in_gateway_loss": sum(in_gateway_loss(r) for r in failed),
            "excused_mid_answer_in_box_loss": sum(in_box_loss(r) and not in_gateway_loss(r)
                                                  for r in failed),
            "failover_s": failover_s}


def exactness(records, counted):
    """Each client's tokens as each gateway counted them over the run (`counted`: {gateway:
    {client: prompt + completion tokens}}, from its usage service, after minus before) against
    the usage its answers carried (Record.tokens). A stream its client left (`abandoned`), or one
    cut mid-answer by a fault, is open-ended: its box counts what it sent, which may run past
    what reached the client, by at most that request's answer (ABANDONED_MAX_TOKENS, the mix's
    longest). Met: the gateways agree, and each count is the usage received, plus no more than
    the open-ended requests' bound."""
    out, met = {}, True
    for client in sorted({r.client for r in records}):
        mine = [r for r in records if r.client == client]
        received = sum(r.tokens for r in mine)
        open_ended = sum(r.kind == "abandoned" or (r.outcome == "failed" and r.tokens > 0)
                         for r in mine)
        by_gateway = {g: c.get(client, 0) for g, c in counted.items()}
        beyond = {g: n - received for g, n in by_gateway.items()}
        bound = open_ended * ABANDONED_MAX_TOKENS
        met = met and len(set(by_gateway.values())) == 1 and all(
            0 <= b <= bound for b in beyond.values())
        out[client] = {"received": received, "counted": by_gateway, "beyond_received": beyond,
                       "open_ended": open_ended, "bound": bound}
    return {"clients": out, "met": met}


# ------------------------------------------------------------------ the timeline (pure)

SPAN_GID = "fault-window"


def availability(records, bin_s=BIN_S):
    """[(bin start, share answered)] of the requests started in each bin of bin_s: answered over
    answered + failed + cut silently (refusals of a revoked key are neither); NaN for none."""
    if not records:
        return []
    last = max(r.start for r in records)
    out = []
    for i in range(int(last // bin_s) + 1):
        mine = [r for r in records if i * bin_s <= r.start < (i + 1) * bin_s
                and r.outcome in ("ok", "failed", "cut_silently")]
        share = (sum(r.outcome == "ok" for r in mine) / len(mine)) if mine else math.nan
        out.append((i * bin_s, share))
    return out


def draw_timeline(records, windows, probes, bin_s=BIN_S, title="soak"):
    """The figure: availability per bin and the prober's answers above, TTFT per request
    below, each fault window shaded on both (SPAN_GID) and named above."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(13, 6),
                                         gridspec_kw={"height_ratios": [1, 1.3]})
    bins = availability(records, bin_s)
    if bins:
        top.step([b for b, _ in bins], [s * 100 for _, s in bins], where="post", color="tab:green",
                 label=f"answered, % of requests started per {bin_s:g} s")
    failed = [r for r in records if r.outcome in ("failed", "cut_silently", "served_revoked")]
    if failed:
        top.scatter([r.start for r in failed], [2] * len(failed), marker="x", color="tab:red",
                    label="failed / cut / served revoked", zorder=3)
    answered = [p for p in probes if p[2]]
    if answered:
        top.scatter([p[0] for p in answered], [-6] * len(answered), marker="|", color="black",
                    label="prober answered (must never)", zorder=3)
    top.set(ylabel="available %", ylim=(-10, 105), title=title)
    kinds = sorted({r.kind for r in records if r.first_token is not None})
    for kind in kinds:
        mine = [r for r in records if r.kind == kind and r.first_token is not None]
        bottom.scatter([r.start for r in mine], [r.first_token - r.start for r in mine], s=6,
                       label=kind)
    bottom.set(xlabel="seconds from start", ylabel="time to first token (s)")
    if kinds:
        bottom.set_yscale("log")
    for w in windows:
        for axes in (top, bottom):
            axes.axvspan(w.start, w.until, color="tab:orange" if w.healed_at is not None
                         else "tab:red", alpha=0.18, gid=SPAN_GID)
        whole = ("never whole" if w.healed_at is None
                 else f"whole {w.healed_at - w.start:.0f} s"
                 + (" (remedied)" if w.remedied else ""))
        top.text(w.start, 103, f"{w.name}\n{whole}", fontsize=7, va="top")
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    return figure


def write_timeline(records, windows, probes, path, **kwargs) -> Path:
    import matplotlib.pyplot as plt

    figure = draw_timeline(records, windows, probes, **kwargs)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return Path(path)


def spans(figure):
    """How many fault-window spans each of the figure's axes holds."""
    return [sum(1 for p in axes.patches if p.get_gid() == SPAN_GID) for axes in figure.axes]


def in_rotation(stat_csv):
    """The servers HAProxy's `show stat` says are UP in the boxes' pools (`thors*`): a box is in
    rotation when every row of it says UP (or `no check`)."""
    lines = stat_csv.strip().splitlines()
    if not lines or not lines[0].startswith("# "):
        return set()
    header = lines[0][2:].split(",")
    name, pool, status = header.index("svname"), header.index("pxname"), header.index("status")
    seen = {}
    for line in lines[1:]:
        fields = line.split(",")
        if len(fields) <= status or not fields[pool].startswith("thors"):
            continue
        if fields[name] in ("FRONTEND", "BACKEND"):
            continue
        seen.setdefault(fields[name], []).append(fields[status] in ("UP", "no check"))
    return {server for server, ups in seen.items() if all(ups)}


# ------------------------------------------------------------------ the clients

PICTURE = Path(__file__).resolve().parents[1] / "files" / "thor" / "bin" / "thorfleet-proof.png"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
LONG_PROMPT = " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog."
                       for i in range(600))


def request_of(kind, model):
    """The chat.completions.create arguments of one kind of the mix."""
    base = {"model": model, "temperature": 0}
    if kind == "chat":
        return {**base, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    if kind == "tool_stream":
        return {**base, "stream": True, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 48,
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    if kind == "reasoning":
        return {**base, "stream": True, "reasoning_effort": "high", "max_tokens": 64,
                "messages": [{"role": "user", "content": "Is 91 prime? Think first."}]}
    if kind == "abandoned":  # read a few chunks, then closed: the client walks away
        return {**base, "stream": True, "max_tokens": ABANDONED_MAX_TOKENS,
                "extra_body": {"ignore_eos": True},
                "messages": [{"role": "user", "content": "Tell me a long story."}]}
    if kind == "long":
        return {**base, "stream": True, "max_tokens": 16,
                "messages": [{"role": "user", "content": LONG_PROMPT + "\nSum it up."}]}
    if kind == "image":
        import base64

        url = "data:image/png;base64," + base64.b64encode(PICTURE.read_bytes()).decode()
        return {**base, "stream": True, "max_tokens": 16, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": url}}]}]}
    raise ValueError(kind)


def _has_token(delta):
    if delta is None:
        return False
    extra = getattr(delta, "model_extra", None) or {}
    return bool(delta.content or delta.tool_calls or extra.get("reasoning_content")
                or extra.get("reasoning"))


class Client(threading.Thread):
    """One client: the OpenAI SDK with its default retries, one request after another through
    the door, round robin over its mix, until stopped. Its Records in `.records`."""

    def __init__(self, name, key, url, ca_file, mix, model, clock, timeout=120.0):
        super().__init__(daemon=True, name=f"client-{name}")
        import openai

        self.name_, self.mix, self.model, self.clock = name, mix, model, clock
        self.records, self.stopping, self.attempts = [], threading.Event(), 0
        # the fleet CA, hostname checked (no ca_file: plain HTTP, the fast test's own server)
        tls = ssl.create_default_context(cafile=ca_file) if ca_file else True

        def count(_request):
            self.attempts += 1

        self.openai = openai
        self.sdk = openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key=key, timeout=timeout,
                                 http_client=openai.DefaultHttpxClient(
                                     verify=tls, event_hooks={"request": [count]}))

    def run(self):
        turn = 0
        while not self.stopping.is_set():
            kind = self.mix[turn % len(self.mix)]
            turn += 1
            self.records.append(self.one(kind))
            self.stopping.wait(0.2)

    def one(self, kind):
        openai = self.openai
        before, start = self.attempts, self.clock()
        began, first, outcome, error, usage, box = None, None, "ok", "", None, None
        arguments = request_of(kind, self.model)
        try:
            raw = self.sdk.chat.completions.with_raw_response.create(**arguments)
            box, answer = raw.headers.get(GATEWAY_BOX_HEADER), raw.parse()
            if arguments.get("stream"):
                began, finished = self.clock(), False
                for read, chunk in enumerate(answer, 1):  # each carries the usage so far
                    usage = chunk.usage or usage
                    for choice in chunk.choices:
                        if first is None and _has_token(choice.delta):
                            first = self.clock()
                        finished = finished or choice.finish_reason is not None
                    if kind == "abandoned" and read == ABANDON_AFTER:
                        answer.close()
                        finished = True
                        break
                if not finished:
                    outcome = "cut_silently"
            else:
                usage = answer.usage
        except openai.AuthenticationError as e:
            outcome, error = "refused", str(e)[:200]
        except Exception as e:  # noqa: BLE001 - whatever the SDK raised after its retries
            outcome, error = "failed", f"{type(e).__name__}: {str(e)[:200]}"
        tokens = usage.prompt_tokens + usage.completion_tokens if usage else 0
        return Record(self.name_, kind, start, first, self.clock(), outcome,
                      max(0, self.attempts - before - 1), error, tokens, began, box)


# ------------------------------------------------------------------ the prober

class Prober(threading.Thread):
    """Every PROBE_EVERY_S a GET of each box's vLLM port from here, one thread per box a round;
    `.probes` [(time, host, answered, status)]: any HTTP status is an answer."""

    def __init__(self, addresses: dict, clock, port=VLLM_PORT):
        super().__init__(daemon=True, name="prober")
        self.addresses, self.clock, self.port = addresses, clock, port
        self.probes, self.stopping = [], threading.Event()

    def _one(self, host, address):
        at = self.clock()
        connection = http.client.HTTPConnection(address, self.port, timeout=PROBE_TIMEOUT_S)
        try:
            connection.request("GET", "/health")
            status = connection.getresponse().status
            self.probes.append((at, host, True, status))
        except (OSError, http.client.HTTPException):
            self.probes.append((at, host, False, None))
        finally:
            connection.close()

    def run(self):
        due = time.monotonic()
        while not self.stopping.is_set():
            round_ = [threading.Thread(target=self._one, args=item, daemon=True)
                      for item in self.addresses.items()]
            for thread in round_:
                thread.start()
            for thread in round_:
                thread.join(PROBE_TIMEOUT_S + 2)
            due += PROBE_EVERY_S
            self.stopping.wait(max(0.0, due - time.monotonic()))


# ------------------------------------------------------------------ the fleet under soak

class Soak:
    """The soak's fleet: its boxes, the pair, the door, the clients' keys, what it is converged
    to (`state`), and the clock every time is read on (seconds from the start)."""

    def __init__(self, sim, hosts, workdir: Path, vision=False, gateways=PAIR):
        self.sim, self.hosts, self.gateways, self.workdir = sim, list(hosts), gateways, workdir
        self.vision = vision
        names = [*CLIENTS, *(("dave",) if vision else ())]
        self.keys = {n: str(workdir / "clients" / f"{n}.key") for n in names}
        self.state = {"roll": 0, "retry_after": 5, "clients": dict(self.keys)}
        self.revocations: list[Revocation] = []
        self.began = time.monotonic()
        self.runs = 0
        self.endpoint = None
        self.addresses = {}

    def clock(self):
        return time.monotonic() - self.began

    def inventory(self, name) -> Path:
        self.runs += 1
        report = self.workdir / f"{self.runs:02d}-{name}-report.json"
        gateway_data = {"gateway_clients": self.state["clients"], **DOOR_LIMITS,
                        "gateway_retry_after_s": self.state["retry_after"]}
        hosts = [(h, {"service_profile": "vision"}) if self.vision and h == self.hosts[-1] else h
                 for h in self.hosts]
        env = {"THORFLEET_SOAK_ROLL": str(self.state["roll"])} if self.state["roll"] else None
        return self.sim.write_inventory(
            self.workdir / f"{self.runs:02d}-{name}.py", hosts=hosts,
            gateway=[(g, gateway_data) for g in self.gateways],
            extra_data={"rollout_report_path": str(report), **WATCHDOG,
                        "service_extra_env": env})

    def converge(self, name, *args):
        from sim import operator

        inventory = self.inventory(name)
        run = operator.deploy(inventory, *args)
        log(f"{name}: deploy {' '.join(args)} exited {run.returncode} in {run.seconds:.0f} s")
        report = inventory.with_name(inventory.stem + "-report.json")
        if report.exists():
            self.endpoint = json.loads(report.read_text()).get("endpoint") or self.endpoint
        return run

    def converge_behind(self, name, *args):
        """A converge on its own thread; .join() it. Its Run in .done once joined."""
        def converge():
            thread.done = self.converge(name, *args)

        thread = threading.Thread(target=converge, daemon=True)
        thread.done = None
        thread.start()
        return thread

    def deploy_process(self, name, *args):
        """A deploy as its own process (the operator's pyinfra CLI), its stderr a pipe."""
        from sim import operator

        argv = [sys.executable, "-m", "pyinfra", "-y", *args, str(self.inventory(name)),
                "deploy.py"]
        return subprocess.Popen(argv, cwd=operator.ROOT, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def address(self):
        return self.endpoint["url"].split("//", 1)[1].rsplit(":", 1)[0]

    def holder(self):
        found = [g for g in self.gateways
                 if self.sim.exec(g, f"ip -o -4 addr show | grep -qw {self.address()}")[0] == 0]
        return found[0] if len(found) == 1 else None

    def whole(self):
        """Every box in rotation at the door and its firewall table live, both gateways running
        HAProxy and keepalived at one level."""
        holder = self.holder()
        if holder is None:
            return False
        levels = set()
        for g in self.gateways:
            code, out = self.sim.exec(g, "systemctl is-active -q haproxy keepalived && "
                                         "cat /etc/haproxy/thorfleet/level", timeout=30)
            if code != 0:
                return False
            levels.add(out.strip())
        if len(levels) != 1:
            return False
        for host in self.hosts:
            if self.sim.exec(host, "nft list table inet thorfleet >/dev/null", timeout=30)[0]:
                return False
        code, stat = self.sim.exec(holder, "echo 'show stat' | socat stdio "
                                           "UNIX-CONNECT:/run/haproxy/admin.sock", timeout=30)
        return code == 0 and set(self.hosts) <= in_rotation(stat)

    def tokens(self):
        """{gateway: {client: prompt + completion tokens this UTC month}} as each gateway's usage
        service counts them (`thorfleet-door-usage show`, what `thorfleet status` reads)."""
        found = {}
        for g in self.gateways:
            code, out = self.sim.exec(g, "/usr/local/sbin/thorfleet-door-usage show", timeout=30)
            clients = json.loads(out)["clients"] if code == 0 else {}
            found[g] = {c: row["tokens"]["month"]["prompt"] + row["tokens"]["month"]["completion"]
                        for c, row in clients.items() if "tokens" in row}
        return found

    def engine_cores(self, host):
        _, top = self.sim.exec(host, "docker top thorfleet-vllm -eo pid,args || true")
        return [line.split()[0] for line in top.splitlines()[1:] if "VLLM::EngineCore" in line]


def log(message):
    print(f"[soak {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the faults

@dataclasses.dataclass
class Fault:
    """inject(soak) does the harm and may return what heal needs; heal(soak, it) undoes what
    the operator would undo by hand (or nothing: the fleet is to recover by itself)."""
    name: str
    at_s: float
    inject: Callable
    heal: Callable
    hold_s: float = 20.0
    whole: Callable = Soak.whole
    whole_timeout_s: float = 300.0
    lost: Callable | None = None  # lost(what inject returned): the box it took (BOX_LOSS)


def _box(soak, i):
    return soak.hosts[i % len(soak.hosts)]


def freeze_engine(soak):
    host = _box(soak, 0)
    cores = soak.engine_cores(host)
    if not cores:  # nothing frozen is no fault: the window would count a fleet left alone
        raise RuntimeError(f"engine_frozen: no VLLM::EngineCore process on {host}")
    soak.sim.exec(host, f"kill -STOP {' '.join(cores)}")
    log(f"engine_frozen: SIGSTOP {cores} on {host}")
    return host, cores


def thaw_engine(soak, it):
    """Whatever the watchdog has not restarted yet goes on (the frozen pids, if still there)."""
    host, cores = it
    soak.sim.exec(host, f"kill -CONT {' '.join(cores)} 2>/dev/null; true")


def kill_box(soak):
    host = _box(soak, 1)
    soak.sim.client.containers.get(f"thorfleet-{host}").kill()
    return host


def boot_box(soak, host):
    soak.sim.client.containers.get(f"thorfleet-{host}").start()
    soak.sim.wait_booted(host)


def kill_holder(soak):
    holder = soak.holder()
    if holder is None:
        raise RuntimeError("gateway_killed: no gateway holds the door's address")
    soak.sim.client.containers.get(f"thorfleet-{holder}").kill()
    return holder


def cut_in_rolling_change(soak):
    """A rolling change (a new server env: every box restarts, batch by batch) started, and the
    second box's SSH cut once the run is under way."""
    soak.state["roll"] += 1
    run = soak.converge_behind("roll-cut")
    time.sleep(8)
    host = _box(soak, 1)
    soak.sim.cut(host)
    log(f"ssh_cut_rolling: {host} cut")
    return host, run


def heal_cut(soak, it):
    host, run = it
    soak.sim.heal(host)
    run.join()
    soak.converge("roll-cut-again")  # the operator's re-run: what the cut left converges


def nft_by_hand(soak):
    host = _box(soak, 2)
    code, out = soak.sim.exec(host, "nft -f /etc/nftables.conf")
    log(f"nft_by_hand on {host}: exit {code} {out.strip()[:200]}")
    if code != 0:  # a ruleset not loaded is no fault
        raise RuntimeError(f"nft_by_hand on {host}: exit {code}: {out.strip()[:500]}")
    return host


def revoke_key(soak):
    revocation = Revocation(REVOKED, since=soak.clock())
    soak.revocations.append(revocation)
    soak.state["clients"] = {n: p for n, p in soak.keys.items() if n != REVOKED}
    soak.converge("revoke", "--limit", "gateway")
    revocation.sure = soak.clock()
    return revocation


def give_key_back(soak, revocation):
    revocation.until = soak.clock()
    soak.state["clients"] = dict(soak.keys)
    soak.converge("reinstate", "--limit", "gateway")
    revocation.back = soak.clock()


def kill_gateway_run(soak):
    """A run limited to the gateways, changing their config, killed (SIGKILL) once it has
    started on the gateways' operations."""
    soak.state["retry_after"] = 7 if soak.state["retry_after"] == 5 else 5
    process = soak.deploy_process("gateways-killed", "--limit", "gateway")
    # killed at the latest after 120 s, should its output stall before the gateways' part
    late = threading.Timer(120, lambda: process.poll() is None and process.kill())
    late.start()
    for line in process.stderr:
        if line.startswith("--> Starting operation: Gateway | "):
            time.sleep(1)
            break
    late.cancel()
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()
    log(f"run_killed: pyinfra {process.pid} killed")
    return process.pid


def full_run(soak, _it):
    soak.converge("after-kill")


def fill_disk_in_deploy(soak, keep_gib=9):
    """A rolling change started, and a box's disk filled (fallocate) under it to `keep_gib` free:
    below the sim's preflight minimum (10 GiB), and never the whole of this machine's disk,
    which the box's is and which other work shares."""
    soak.state["roll"] += 1
    run = soak.converge_behind("roll-disk")
    time.sleep(3)
    host = _box(soak, 0)
    _, free = soak.sim.exec(host, "df --output=avail -B1 /var/tmp | tail -1")
    size = int(free.strip()) - keep_gib * (1 << 30)
    if size > 0:
        code, out = soak.sim.exec(host, f"fallocate -l {size} /var/tmp/thorfleet-soak-fill")
        log(f"disk_filled: {size >> 30} GiB on {host}: exit {code} {out.strip()[:200]}")
    return host, run


def free_disk(soak, it):
    host, run = it
    run.join()
    soak.sim.exec(host, "rm -f /var/tmp/thorfleet-soak-fill")
    soak.converge("roll-disk-again")


def _nothing(_soak, _it):
    """No hand: the fleet recovers by itself, or the window says it did not."""


FAULTS = {
    "engine_frozen": {"inject": freeze_engine, "heal": thaw_engine, "hold_s": 60,
                      "lost": lambda it: it[0]},
    "box_killed": {"inject": kill_box, "heal": boot_box, "hold_s": 10, "lost": lambda it: it},
    "gateway_killed": {"inject": kill_holder, "heal": boot_box, "hold_s": 20},
    "ssh_cut_rolling": {"inject": cut_in_rolling_change, "heal": heal_cut, "hold_s": 30},
    "nft_by_hand": {"inject": nft_by_hand, "heal": _nothing, "hold_s": 30, "whole_timeout_s": 120},
    "key_revoked": {"inject": revoke_key, "heal": give_key_back, "hold_s": 20},
    "run_killed": {"inject": kill_gateway_run, "heal": full_run, "hold_s": 5},
    "disk_filled": {"inject": fill_disk_in_deploy, "heal": free_disk, "hold_s": 5},
}
SHORT = ("engine_frozen", "nft_by_hand", "key_revoked")  # the cheapest three: CI's schedule
WARMUP_S = 30.0


def schedule(names, minutes):
    """Faults `names` spaced evenly over `minutes` after WARMUP_S, the last leaving room."""
    span = max(minutes * 60 - WARMUP_S, 0)
    step = span / (len(names) + 1)
    return [Fault(name, round(WARMUP_S + i * step, 1), **FAULTS[name])
            for i, name in enumerate(names)]


def run_fault(soak, fault):
    """Inject, hold, heal, wait for whole (a converge if not in time): its Window."""
    start = soak.clock()
    log(f"{fault.name}: inject at {start:.0f} s")
    it = fault.inject(soak)
    time.sleep(fault.hold_s)
    fault.heal(soak, it)
    window = Window(fault.name, start, soak.clock(), box=fault.lost(it) if fault.lost else None)
    remedied = False
    for _ in range(2):
        deadline = time.monotonic() + fault.whole_timeout_s
        while time.monotonic() < deadline:
            if fault.whole(soak):
                window.healed_at = soak.clock()
                break
            time.sleep(2)
        if window.healed_at is not None or remedied:
            break
        log(f"{fault.name}: not whole after {fault.whole_timeout_s:.0f} s: a converge")
        soak.converge(f"remedy-{fault.name}")
        remedied = window.remedied = True
    log(f"{fault.name}: healed at {window.end:.0f} s, whole at {window.healed_at}")
    return window


def soak_run(soak, faults, minutes, tail_s=20.0):
    """The clients and the prober through the schedule: (records, windows, probes)."""
    soak.began = time.monotonic()
    models = {"dave": VISION} if soak.vision else {}
    clients = [Client(name, Path(path).read_text().strip(), soak.endpoint["url"],
                      soak.endpoint["ca_file"], MIXES[name], models.get(name, EAGLE), soak.clock)
               for name, path in soak.keys.items()]
    prober = Prober(soak.addresses, soak.clock)
    windows = []
    soak.counted_before = soak.tokens()
    for thread in [prober, *clients]:
        thread.start()
    try:
        for fault in faults:
            wait = fault.at_s - soak.clock()
            if wait > 0:
                time.sleep(wait)
            windows.append(run_fault(soak, fault))
        time.sleep(max(tail_s, minutes * 60 - soak.clock()))
    finally:
        for thread in [prober, *clients]:
            thread.stopping.set()
        for thread in [prober, *clients]:
            thread.join(timeout=180)
    records = settle([r for c in clients for r in c.records], soak.revocations)
    time.sleep(COUNTED_WITHIN_S)  # the usage services' next polls
    after = soak.tokens()
    soak.counted = {g: {c: n - soak.counted_before.get(g, {}).get(c, 0) for c, n in mine.items()}
                    for g, mine in after.items()}
    return records, windows, prober.probes


def setup(sim, hosts, workdir, vision=False):
    soak = Soak(sim, list(hosts), workdir, vision=vision)  # names: thor-<i>
    for gateway in soak.gateways:
        sim.heal(gateway)
    run = soak.converge("converge")
    if run.returncode != 0:
        raise RuntimeError(f"the soak's first converge failed:\n{run.stderr[-3000:]}")
    soak.addresses = {h: sim.ip(h) for h in soak.hosts}  # read while up: a killed box has none
    return soak


def main(argv=None):
    from bench.rollout import parse_range
    from sim import fleet

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1-3")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--short", action="store_true",
                        help=f"CI's schedule: {', '.join(SHORT)}, spaced over 2 minutes "
                             "(each waits for the fleet whole after the one before)")
    parser.add_argument("--faults", nargs="+", choices=list(FAULTS),
                        help="these faults, in this order (default: all, or --short's)")
    parser.add_argument("--vision", action="store_true",
                        help="the last box on the vision profile, and a client sending pictures")
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    names = args.faults or (SHORT if args.short else list(FAULTS))
    minutes = 2.0 if args.short else args.minutes
    sim = fleet.attach()
    workdir = Path(tempfile.mkdtemp(prefix="soak-"))
    log(f"workdir {workdir}: each run's inventory and report, the client keys, records.json")
    soak = setup(sim, parse_range(args.hosts), workdir, vision=args.vision)
    faults = schedule(names, minutes)
    records, windows, probes = soak_run(soak, faults, minutes)
    rows, totals = report(records, windows, probes)
    verdict = goal(records, windows, probes)
    tokens = exactness(records, soak.counted)
    out = {"command": "python -m bench.soak " + " ".join(sys.argv[1:] if argv is None else argv),
           "hosts": soak.hosts, "gateways": list(soak.gateways), "door": soak.endpoint["url"],
           "minutes": minutes, "probe_every_s": PROBE_EVERY_S, "failover_s": FAILOVER_S,
           "schedule": [{"name": f.name, "at_s": f.at_s, "hold_s": f.hold_s} for f in faults],
           "windows": rows, "totals": totals, "goal": verdict, "tokens": tokens,
           "failures": [dataclasses.asdict(r) for r in records
                        if r.outcome in ("failed", "cut_silently", "served_revoked")][:200]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    (workdir / "records.json").write_text(json.dumps([dataclasses.asdict(r) for r in records]))
    if args.plot:
        write_timeline(records, windows, probes, args.plot, title=out["command"])
    print(json.dumps({"windows": rows, "goal": verdict, "tokens": tokens}, indent=2))
    return 0 if verdict["met"] and tokens["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
