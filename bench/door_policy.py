"""Benchmark the time to first token that per-client policy and token counting add (issue 51's
first figure: at most 5 ms).

    python -m bench.door_policy --out bench/results/door-policy.json [--requests 300]
        [--chunks 64] [--streams 300]

1. The door (this machine, no sim, no Docker): HAProxy itself on the rendered config, started by
   the fast tests' `running_door`, in front of one stand-in box (a vLLM stand-in that answers a
   streamed chat at once: response headers, then its first SSE event, then the rest), on ::1:
   - (a) today's door before issue 51: no gateway_clients (the fleet's one key), and
   - (b) gateway_clients: three clients (alice, timed: her own max_inflight,
     requests_per_minute, models, priority and three token budgets; bob: batch, a day's budget,
     and over it in the budget map; ci: a bare key file, the fleet's limits and day budget),
     so the door looks the client up, tracks it in the clients and share tables, reads its
     limits, class and budget from the maps and sets X-Thorfleet-Client; alice is over none,
   each for a one-model fleet (one box) and a two-model fleet (the body read and routed by
   `model`; a second box of the long-context profile, never asked, so that `models` renders
   its check); and the four again with HAProxy's own tune.bufsize (16 KB) in place of the
   rendered one (1.1 MB for one model, 4.3 MB with the long-context pool), to show what the
   buffers' size costs, and the policy's own cost without it. All eight in front of the same
   box, each round of requests sent to each door once, in a random order, so the machine's
   drift falls on all alike. The client is a process of its own (the stand-ins are threads of
   this one: sharing their interpreter, it would wait for them at its GIL), its garbage
   collector off while it times. First each request on a new TLS connection (http.client, the
   door's CA, hostname checked), no keep-alive; then each door's requests on one kept-alive
   connection (as the OpenAI SDK's pool keeps them). The time to first token is from the
   request's first byte sent (after the TLS handshake) to the first byte of the answer's body
   (the first SSE event); the handshake is timed apart. HAProxy's CPU time (all its threads)
   and minor page faults over each of the two runs, per request (its health checks included).
2. The box: `thorfleet_usage.Usage` (the middleware vLLM loads) around a minimal ASGI app that
   streams `--chunks` SSE events, each with its usage as vLLM sends them with
   --enable-force-include-usage (and prompt_tokens_details), then [DONE]; against the same app
   without it, `--streams` streams each, alternated, on one event loop. Timed: from the call to
   the first body message reaching the server's `send` (what a first token waits for), each
   later chunk from the app's `send` to the server's, and the end (the journal line, the
   in-flight record closed and removed). The in-flight records and the journal are written to a
   temporary directory on this machine's disk (the page cache, no fsync, as on the box).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import http.client
import json
import os
import platform
import random
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fast.test_client_policy import MIXED
from tests.fast.test_gateway_render import (
    BOX_KEY,
    JsonBox,
    _Box,
    client_files,
    running_door,
    usage_tool,
)
from tests.fast.test_models import chat
from tests.fast.test_usage import chunk, usage
from thorfleet.gateway.config import FLEET_CLIENT
from thorfleet.settings import layout

MODEL = "mistral-small-4"  # the default profile's name: the first pool's
KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdefg",
        "ci": "ci-key-0123456789abcdefgh"}
GOAL_MS = 5.0  # issue 51
DEFAULT_BUFSIZE = 16384  # HAProxy's own tune.bufsize
FIRST_EVENT_GAP_S = 0.002  # the stand-in's pause after its first event: it travels alone


# --- the door ------------------------------------------------------------------------------------

def _events(n=4):
    """The stand-in's stream: chat chunks with their usage so far, as vLLM sends them."""
    return [chunk(c, prompt=1200, cached=1024) for c in range(1, n + 1)] + [b"data: [DONE]\n\n"]


EVENTS = _events()


class _Quiet:
    """A stand-in that does not print the door's resets: its health check hangs up once it has
    the status, and it closes idle kept-alive connections."""

    def handle(self):
        try:
            super().handle()
        except ConnectionResetError:
            pass


class Watchdog(_Quiet, _Box):
    """The box's watchdog (the door's health checks), the fast tests' stand-in."""


class StreamBox(_Quiet, JsonBox):
    """vLLM as the door sees it, streaming: a POST is answered with an SSE stream in HTTP/1.1
    chunks, its first event at once; it notes the client the door named."""

    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # headers and events go out in separate writes: without this, Nagle and the door's
        # delayed ACK would add their 40 ms, the stand-in's and not the door's
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self):
        self.answer({"path": self.path})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.client = self.headers.get(layout.GATEWAY_CLIENT_HEADER)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, event in enumerate(EVENTS):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            if n == 0:
                time.sleep(FIRST_EVENT_GAP_S)
        self.wfile.write(b"0\r\n\r\n")


def policy(folder: Path) -> dict:
    """(b)'s gateway data: three clients, each a policy of its own."""
    files = client_files(folder, **KEYS)
    return {"gateway_clients": {
        "alice": {"key_file": files["alice"], "max_inflight": 4, "requests_per_minute": 100_000,
                  "models": [MODEL], "priority": "interactive", "tokens_per_minute": 50_000,
                  "tokens_per_day": 2_000_000, "tokens_per_month": 40_000_000},
        "bob": {"key_file": files["bob"], "max_inflight": 2, "priority": "batch",
                "tokens_per_day": 1_000_000},
        "ci": files["ci"]},
        "gateway_client_tokens_per_day": 5_000_000}


def _body(model=MODEL) -> bytes:
    return json.dumps({**json.loads(chat(model)), "stream": True,
                       "stream_options": {"include_usage": True}}).encode()


def _connection(door, context):
    return http.client.HTTPSConnection("::1", door, timeout=30, context=context)


def _ask(connection, key, body=None) -> tuple[float, float]:
    """(seconds from the request's first byte sent to the answer's first body byte, seconds to
    the whole answer) of one streamed chat on `connection`, its TLS handshake done."""
    started = time.perf_counter()
    connection.request("POST", "/v1/chat/completions", body=body or _body(),
                       headers={"Content-Type": "application/json",
                                "Authorization": f"Bearer {key}"})
    answer = connection.getresponse()
    first = answer.read(1)
    first_at = time.perf_counter()
    rest = answer.read()
    ended = time.perf_counter()
    if answer.status != 200 or not (first + rest).startswith(EVENTS[0]):
        raise AssertionError(f"the door answered {answer.status}: {first + rest[:300]!r}")
    return first_at - started, ended - started


def timed(door, context, key, body=None) -> tuple[float, float, float]:
    """(seconds of the TCP and TLS handshake, then _ask's two) of one streamed chat on a
    connection of its own."""
    connection = _connection(door, context)
    started = time.perf_counter()
    connection.connect()
    connected = time.perf_counter()
    try:
        return (connected - started, *_ask(connection, key, body))
    finally:
        connection.close()


def status_of(door, context, key, body=None) -> tuple[int, str]:
    """(status, error type) of one chat through the door."""
    connection = _connection(door, context)
    connection.request("POST", "/v1/chat/completions", body=body or _body(),
                       headers={"Content-Type": "application/json",
                                "Authorization": f"Bearer {key}"})
    answer = connection.getresponse()
    text = answer.read()
    connection.close()
    kind = json.loads(text)["error"]["type"] if answer.status != 200 else ""
    return answer.status, kind


def _next_midnight(now: float) -> int:
    return (int(now) // 86400 + 1) * 86400


FLEETS = ("one model", "two models")
BUFSIZES = (None, DEFAULT_BUFSIZE)  # the rendered tune.bufsize, then HAProxy's own
DOORS = tuple((fleet, door, bufsize)  # (fleet, door, tune.bufsize in place of the rendered one)
              for bufsize in BUFSIZES for fleet in FLEETS for door in ("a", "b"))


def door_name(fleet, door, bufsize) -> str:
    return f"{fleet} {door}" + (f", tune.bufsize {bufsize}" if bufsize else "")


def difference_name(fleet, bufsize) -> str:
    return f"{fleet}" + (f", tune.bufsize {bufsize}" if bufsize else "") + ": b minus a"


@contextlib.contextmanager
def doors(root: Path):
    """{door name: (port, its CA file, key of the timed client, HAProxy's pid)} of the doors
    of DOORS, all in front of the first door's stand-ins, and the checks that each applies what
    it renders."""
    found, checks = {}, {}
    with contextlib.ExitStack() as stack:
        thor_1 = thor_2 = None  # the stand-ins (vLLM's, the watchdog's) every door sends to
        for fleet, door, bufsize in DOORS:
            thors, profiles = (1, ()) if fleet == "one model" else (2, MIXED)
            name = door_name(fleet, door, bufsize)
            folder = root / name.replace(" ", "-").replace(",", "")
            folder.mkdir()
            own = [dict(profiles[n]) if n < len(profiles) else {} for n in range(thors)]
            for n, servers in enumerate((thor_1, thor_2)[:thors]):
                if servers:
                    own[n].update(service_port=servers[0].server_address[1],
                                  watchdog_port=servers[1].server_address[1])
            made = []
            port, g, running = stack.enter_context(running_door(
                folder, thors=thors, gateway_data=policy(folder) if door == "b" else None,
                servers_out=made, handlers=[StreamBox] * thors, watchdogs=[Watchdog] * thors,
                thor_data=own))
            thor_1 = thor_1 or made[0:2]
            thor_2 = thor_2 or (made[2:4] if thors > 1 else None)
            if bufsize:  # the same config, HAProxy's buffers at another size
                running.stop()
                text = running.config.read_text()
                if text.count(f"tune.bufsize {g.bufsize}\n") != 1:
                    raise AssertionError("the rendered config's tune.bufsize line is not found")
                running.config.write_text(text.replace(f"tune.bufsize {g.bufsize}\n",
                                                       f"tune.bufsize {bufsize}\n"))
                running.start()
            context = ssl.create_default_context(cafile=g.ca_file)
            key = KEYS["alice"] if door == "b" else BOX_KEY
            checks[name] = {"tune.bufsize": bufsize or g.bufsize,
                            **_check(folder, port, g, context, key, thor_1[0])}
            found[name] = port, g.ca_file, key, running.process.pid
        yield found, checks


def _check(folder, port, g, context, key, box) -> dict:
    """What the door did with a request of each kind: the timed client served and named to the
    box; with clients, bob (in the budget map) refused and, routed, a model alice may not call."""
    seen = {"routed": g.routed, "clients": sorted(g.gateway_clients or ())}
    timed(port, context, key)
    seen["timed client named to the box"] = box.client
    want = "alice" if g.gateway_clients else FLEET_CLIENT
    if box.client != want:
        raise AssertionError(f"the box was told {box.client!r}, not {want!r}")
    if g.gateway_clients:
        budget_map = folder / layout.GATEWAY_BUDGET_MAP.rsplit("/", 1)[1]
        usage_tool().ask(str(folder / "admin.sock"), f"add map {budget_map} bob "
                         f"{_next_midnight(time.time())}:tokens_per_day:1000000")
        seen["bob, over his day's budget"] = status_of(port, context, KEYS["bob"])
        seen["ci"] = status_of(port, context, KEYS["ci"])[0]
        if g.routed:
            seen["alice naming a model not hers"] = status_of(
                port, context, key, _body("mistral-small-4-256k"))
        if seen["bob, over his day's budget"] != (429, "insufficient_quota"):
            raise AssertionError(seen)
    return seen


def stats_ms(seconds) -> dict:
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    return {"p50_ms": round(q[49] * 1000, 3), "p90_ms": round(q[89] * 1000, 3),
            "p99_ms": round(q[98] * 1000, 3), "mean_ms": round(statistics.fmean(seconds) * 1000, 3)}


def median_difference_interval(a, b, rounds=2000, seed=51) -> list[float]:
    """A 95 % bootstrap interval of median(b) - median(a), in ms."""
    rng = random.Random(seed)
    found = sorted(statistics.median(rng.choices(b, k=len(b)))
                   - statistics.median(rng.choices(a, k=len(a))) for _ in range(rounds))
    return [round(found[int(0.025 * rounds)] * 1000, 3), round(found[int(0.975 * rounds)] * 1000, 3)]


MODES = {"new": "a new connection each request", "kept": "one kept-alive connection"}


def client_loop(doors_: list, mode: str, requests: int, warmup: int, seed: int) -> dict:
    """The timing client, in a process of its own (`--client`): the stand-ins are threads of the
    bench's process, and a client sharing their interpreter would wait for them at its GIL.
    {door: {handshake (mode "new" only), ttft, whole: [seconds]}} of `requests` rounds after
    `warmup`, each round every door once in a random order."""
    found = {name: (port, ssl.create_default_context(cafile=ca), key)
             for name, port, ca, key in doors_}
    kept = {name: _connection(port, context) for name, (port, context, _) in found.items()}
    samples = {name: {"handshake": [], "ttft": [], "whole": []} for name in found}
    names = list(found)
    rng = random.Random(seed)
    gc.collect()
    gc.disable()
    for n in range(warmup + requests):
        order = names[:]
        rng.shuffle(order)
        for name in order:
            if mode == "new":
                shake, ttft, whole = timed(*found[name])
            else:
                shake, (ttft, whole) = None, _ask(kept[name], found[name][2])
            if n >= warmup:
                for what, value in (("handshake", shake), ("ttft", ttft), ("whole", whole)):
                    if value is not None:
                        samples[name][what].append(value)
    for connection in kept.values():
        connection.close()
    return samples


def _proc(pid) -> tuple[int, int]:
    """(minor page faults, nanoseconds on a CPU: every thread's) of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ran = sum(int(task.joinpath("schedstat").read_text().split()[0])
              for task in Path(f"/proc/{pid}/task").iterdir())
    return int(fields[7]), ran


def measure_door(requests: int, warmup: int = 20) -> dict:
    """Each door's time to first token and HAProxy's cost a request, on a new connection each
    request then on one kept-alive connection per door; (b) minus (a) of each fleet."""
    result, samples = {}, {}
    with tempfile.TemporaryDirectory() as folder, doors(Path(folder)) as (found, checks):
        result["checks"] = checks
        asked = [[name, port, ca, key] for name, (port, ca, key, _) in found.items()]
        for mode, label in MODES.items():
            before = {name: _proc(pid) for name, (*_, pid) in found.items()}
            client = subprocess.run(
                [sys.executable, "-m", "bench.door_policy", "--client"],
                input=json.dumps({"doors": asked, "mode": mode, "requests": requests,
                                  "warmup": warmup, "seed": 51}),
                capture_output=True, text=True, check=False, timeout=1800)
            after = {name: _proc(pid) for name, (*_, pid) in found.items()}
            if client.returncode != 0:
                raise AssertionError(client.stderr)
            samples[mode] = json.loads(client.stdout)
            sent = warmup + requests  # and the door's health checks meanwhile
            for name in found:
                got = samples[mode][name]
                row = result.setdefault(name, {})[label] = {"ttft": stats_ms(got["ttft"])}
                if got["handshake"]:
                    row["tls_handshake"] = stats_ms(got["handshake"])
                row["whole_answer"] = stats_ms(got["whole"])
                row["haproxy_cpu_ms_per_request"] = round(
                    (after[name][1] - before[name][1]) / 1e6 / sent, 3)
                row["haproxy_minor_page_faults_per_request"] = round(
                    (after[name][0] - before[name][0]) / sent, 1)
    for fleet in FLEETS:
        for bufsize in BUFSIZES:
            for mode, label in MODES.items():
                a = result[door_name(fleet, "a", bufsize)][label]
                b = result[door_name(fleet, "b", bufsize)][label]
                row = {k: round(b["ttft"][k] - a["ttft"][k], 3) for k in a["ttft"]}
                row["p50_interval_95_ms"] = median_difference_interval(
                    samples[mode][door_name(fleet, "a", bufsize)]["ttft"],
                    samples[mode][door_name(fleet, "b", bufsize)]["ttft"])
                row["haproxy_cpu_ms_per_request"] = round(
                    b["haproxy_cpu_ms_per_request"] - a["haproxy_cpu_ms_per_request"], 3)
                result.setdefault(f"{difference_name(fleet, bufsize)}", {})[label] = row
    return result


# --- the box: the usage middleware ----------------------------------------------------------------

def measure_middleware(chunks: int, streams: int, warmup: int = 20) -> dict:
    """Usage around a minimal streaming app against the app alone (see the module's 2.)."""
    parts = [chunk(c, prompt=1200, cached=1024) for c in range(1, chunks)]
    parts.append(chunk(chunks - 1, prompt=1200, cached=1024, choices=False))  # vLLM's last
    parts.append(b"data: [DONE]\n\n")
    stamps, arrived = [], []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for part in parts:
            stamps.append(time.perf_counter_ns())
            await send({"type": "http.response.body", "body": part, "more_body": True})
        stamps.append(time.perf_counter_ns())
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive():
        return {"type": "http.request", "body": _body(), "more_body": False}

    async def server_send(message):
        arrived.append(time.perf_counter_ns())

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [
        (b"host", b"10.0.0.1:8002"), (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {BOX_KEY}".encode()), (b"content-length", b"160"),
        (b"x-forwarded-for", b"10.0.0.50"), (usage.CLIENT_HEADER, b"alice")]}
    with tempfile.TemporaryDirectory() as folder:
        counted = usage.Usage(app, folder)
        found = {"bare": {"first": [], "later": [], "end": [], "whole": []},
                 "usage": {"first": [], "later": [], "end": [], "whole": []}}

        async def run():
            for n in range(warmup + streams):
                for name, handler in (("bare", app), ("usage", counted)):
                    stamps.clear()
                    arrived.clear()
                    started = time.perf_counter_ns()
                    await handler(scope, receive, server_send)
                    ended = time.perf_counter_ns()
                    if n < warmup:
                        continue
                    # arrived[0]: the response start; arrived[1 + i]: what the app sent at
                    # stamps[i]; the last, the empty end of the body
                    row = found[name]
                    row["first"].append(arrived[1] - started)
                    row["later"].extend(arrived[1 + i] - stamps[i] for i in range(1, len(parts)))
                    row["end"].append(ended - arrived[-1])
                    row["whole"].append(ended - started)

        gc.collect()
        asyncio.run(run())
        left = list((Path(folder) / "inflight").iterdir())
        lines = sum(len(p.read_text().splitlines()) for p in Path(folder).glob("*.jsonl"))
    if left or lines != warmup + streams:
        raise AssertionError(f"the middleware left {left} and journalled {lines} lines")

    def us(values) -> dict:
        q = statistics.quantiles(values, n=100, method="inclusive")
        return {"p50_us": round(q[49] / 1000, 1), "p90_us": round(q[89] / 1000, 1),
                "p99_us": round(q[98] / 1000, 1), "mean_us": round(statistics.fmean(values) / 1000, 1)}

    result = {}
    for what, label in (("first", "to the first chunk (call to send of the first body)"),
                        ("later", "each later chunk (app's send to the server's)"),
                        ("end", "the end (after the last body message)"),
                        ("whole", "a whole stream")):
        bare, counting = us(found["bare"][what]), us(found["usage"][what])
        result[label] = {"bare": bare, "with Usage": counting,
                         "added": {k: round(counting[k] - bare[k], 1) for k in bare}}
    whole = result["a whole stream"]["added"]
    result["added per chunk, the whole stream's mean over its chunks_us"] = round(
        whole["mean_us"] / chunks, 1)
    return result


# --- the machine, and the run ----------------------------------------------------------------------

def _filesystem(path: str) -> str:
    best = ("", "?")
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, kind, *_ = line.split()
        if (path + "/").startswith(mount.rstrip("/") + "/") and len(mount) >= len(best[0]):
            best = (mount, kind)
    return best[1]


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    return {"cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "cpu": model, "load_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
            "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True,
                                      check=False).stdout.splitlines()[0],
            "openssl (the client's)": ssl.OPENSSL_VERSION,
            "python": platform.python_version(),
            "temp_dir_filesystem": _filesystem(tempfile.gettempdir())}


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=False).stdout.strip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if argv is None and sys.argv[1:] == ["--client"]:  # measure_door's client, in its process
        asked = json.load(sys.stdin)
        print(json.dumps(client_loop(asked["doors"], asked["mode"], asked["requests"],
                                     asked["warmup"], asked["seed"])))
        return 0
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=300, help="timed, to each door")
    parser.add_argument("--chunks", type=int, default=64, help="SSE events in a box's stream")
    parser.add_argument("--streams", type=int, default=300, help="each way, at the box")
    args = parser.parse_args(argv)
    result = {"as_of": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": _commit(),
              "machine": machine(),
              "inputs": {"requests_per_door": args.requests, "warmup_per_door": 20,
                         "order": "each round every door once, in a random order (seed 51)",
                         "stand_in_events": len(EVENTS),
                         "stand_in_pause_after_first_event_ms": FIRST_EVENT_GAP_S * 1000,
                         "request_bytes": len(_body()),
                         "b_gateway_data": policy_shape(),
                         "b_budget_map": "bob over his tokens_per_day until the next 00:00 UTC",
                         "box_chunks_per_stream": args.chunks, "box_streams_each_way": args.streams,
                         "box_chunk_bytes": len(chunk(1, prompt=1200, cached=1024))}}
    result["door"] = measure_door(args.requests)
    result["box"] = measure_middleware(args.chunks, args.streams)
    result["machine"]["load_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    first = result["box"]["to the first chunk (call to send of the first body)"]["added"]
    result["summary"] = {}
    for fleet in FLEETS:
        for label in MODES.values():
            door = result["door"][difference_name(fleet, None)][label]
            result["summary"][f"{fleet}, {label}"] = {
                "door_added_p50_ms": door["p50_ms"],
                "door_added_p50_interval_95_ms": door["p50_interval_95_ms"],
                "door_added_mean_ms": door["mean_ms"],
                "box_added_p50_ms": round(first["p50_us"] / 1000, 3),
                "box_added_mean_ms": round(first["mean_us"] / 1000, 3),
                # means add (a sum's mean is the sum of the means; its percentiles do not)
                "added_mean_ms": round(door["mean_ms"] + first["mean_us"] / 1000, 3),
                "goal_ms": GOAL_MS}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    _print(result)
    return 0


def policy_shape() -> dict:
    """(b)'s gateway data as the JSON records it: each key file as "a key file"."""
    with tempfile.TemporaryDirectory() as folder:
        data = policy(Path(folder))
    data["gateway_clients"] = {
        name: {**entry, "key_file": "a key file"} if isinstance(entry, dict) else "a key file"
        for name, entry in data["gateway_clients"].items()}
    return data


def _print(result):
    door = result["door"]
    for label in MODES.values():
        print(f"-- {label}")
        for name in (door_name(*d) for d in DOORS):
            row = door[name][label]
            t = row["ttft"]
            print(f"door {name}: TTFT p50/p90/p99/mean {t['p50_ms']}/{t['p90_ms']}/{t['p99_ms']}/"
                  f"{t['mean_ms']} ms; HAProxy {row['haproxy_cpu_ms_per_request']} CPU-ms, "
                  f"{row['haproxy_minor_page_faults_per_request']} page faults a request")
        for fleet, bufsize in ((f, b) for b in BUFSIZES for f in FLEETS):
            d = door[difference_name(fleet, bufsize)][label]
            print(f"door {difference_name(fleet, bufsize)}: {d['p50_ms']}/{d['p90_ms']}/{d['p99_ms']}/{d['mean_ms']} "
                  f"ms (p50's 95 % interval {d['p50_interval_95_ms']}), HAProxy "
                  f"{d['haproxy_cpu_ms_per_request']} CPU-ms a request")
    for label, row in result["box"].items():
        if isinstance(row, dict):
            a = row["added"]
            print(f"box, {label}: added p50/p90/p99/mean {a['p50_us']}/{a['p90_us']}/"
                  f"{a['p99_us']}/{a['mean_us']} us")
    for name, row in result["summary"].items():
        print(f"{name}: added TTFT, mean: the door {row['door_added_mean_ms']} ms + the box "
              f"{row['box_added_mean_ms']} ms = {row['added_mean_ms']} ms (goal {row['goal_ms']} "
              "ms)")


if __name__ == "__main__":
    sys.exit(main())
