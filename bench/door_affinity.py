"""Benchmark the door keeping conversations on their box: where turns land, how load spreads,
and what reading the body for the conversation's name costs.

    python -m bench.door_affinity --out bench/results/door-affinity.json

The door alone (this machine, no sim): HAProxy itself on the rendered config of a one-model
fleet of BOXES stand-in boxes on 127.0.0.1 (SLOTS requests each, as max_num_seqs), each
recording which request it answered, once with gateway_affinity_balance_factor None (leastconn,
no body read) and once with FACTOR:
1. `--conversations` conversations of 6 turns (a shared system prompt, then each one's own
   question), THREADS at once, each turn after the last answered and held DELAY_S at its box:
   the share of turns 2-6 answered by the box of turn 1, and requests per box (max / mean).
2. A hot conversation: HOT requests at once under one X-Session-Token: the most one box held
   at once (the bound keeps it from taking them all).
3. The door's added time: `--requests` POSTs one after another on one TLS connection, answered
   at once, bodies of 2 KB and 1 MB (the messages first, `model` last): median and p99.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import ThreadingHTTPServer
from pathlib import Path

from bench import door_routing
from thorfleet.gateway.config import Backend, GatewaySettings
from thorfleet.settings.schema import check_gateway

KEY = "bench-the-fleets-key-0123456789"
BOXES, SLOTS, FACTOR = 4, 4, 150
THREADS, DELAY_S, HOT = 8, 0.02, 16
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 40}


class _Box(door_routing.Box):
    """door_routing's stand-in box, counting the requests it holds at once and in all."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        server = self.server
        with server.lock:
            server.now += 1
            server.peak = max(server.peak, server.now)
            server.answered += 1
        time.sleep(float(self.headers.get("x-bench-delay", "0")))
        with server.lock:
            server.now -= 1
        self._answer(json.dumps({"box": server.server_address[1]}).encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Box)
        self.lock, self.now, self.peak, self.answered = threading.Lock(), 0, 0, 0


class Door:
    """HAProxy on the rendered config of BOXES boxes of SLOTS each, gateway_affinity_balance_factor
    `factor`."""

    def __init__(self, workdir: Path, factor):
        self.servers = [_Server() for _ in range(2 * BOXES)]
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        self.port = door_routing.free_port()
        values, problems = check_gateway({"gateway_ca_dir": str(workdir / "ca"),
                                          "gateway_port": self.port,
                                          "gateway_affinity_balance_factor": factor})
        assert not problems, problems
        boxes = [Backend(f"thor-{n}", "127.0.0.1", self.servers[2 * n].server_address[1], SLOTS,
                         self.servers[2 * n + 1].server_address[1]) for n in range(BOXES)]
        g = GatewaySettings(values, "gw-1", "127.0.0.1", boxes, box_key=KEY)
        self.process = door_routing.haproxy(g, workdir)
        self.context = ssl.create_default_context(cafile=g.ca_file)
        self.boxes = self.servers[0::2]
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2.5)  # the first health checks: every box in rotation

    def connection(self):
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context,
                                           timeout=60)

    def post(self, connection, body, headers=()):
        connection.request("POST", "/v1/chat/completions", body=body, headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {KEY}", **dict(headers)})
        answer = connection.getresponse()
        got = answer.read()
        assert answer.status == 200, (answer.status, got)
        return json.loads(got)["box"]

    def stop(self):
        self.process.terminate()
        self.process.wait(10)
        for server in self.servers:
            server.shutdown()


def _body(messages, pad=0):
    if pad:
        messages = [*messages[:-1], {"role": "user", "content": "lorem ipsum " * (pad // 12)}]
    return json.dumps({"messages": messages, "model": "mistral-small-4"}).encode()


def conversation(door, c):
    """The boxes that answered turns 1-6 of conversation `c`, on one kept-alive connection."""
    connection, said, boxes = door.connection(), [SYSTEM], []
    for turn in range(1, 7):
        said.append({"role": "user", "content": f"conversation {c}, question {turn}"})
        boxes.append(door.post(connection, _body(said), {"x-bench-delay": str(DELAY_S)}))
        said.append({"role": "assistant", "content": f"answer {turn} " * 20})
    connection.close()
    return boxes


def spread(door, conversations):
    before = [b.answered for b in door.boxes]
    with ThreadPoolExecutor(THREADS) as pool:
        landed = list(pool.map(lambda c: conversation(door, c), range(conversations)))
    per_box = [b.answered - a for b, a in zip(door.boxes, before)]
    later = [box == turns[0] for turns in landed for box in turns[1:]]
    stayed = [box == turns[n - 1] for turns in landed for n, box in enumerate(turns) if n]
    return {"conversations": conversations, "turns": 6, "at_once": THREADS,
            "turns_2_6_on_box_of_turn_before": round(sum(stayed) / len(stayed), 3),
            "turns_2_6_on_box_of_turn_1": round(sum(later) / len(later), 3),
            "requests_per_box": per_box,
            "max_over_mean": round(max(per_box) / statistics.mean(per_box), 3)}


def hot(door):
    for box in door.boxes:
        box.peak = 0

    def one(_):
        connection = door.connection()
        door.post(connection, _body([{"role": "user", "content": "the same"}]),
                  {"X-Session-Token": "hot", "x-bench-delay": "0.3"})
        connection.close()

    with ThreadPoolExecutor(HOT) as pool:
        list(pool.map(one, range(HOT)))
    return {"requests_at_once": HOT, "one_token": True,
            "most_at_once_on_one_box": max(b.peak for b in door.boxes),
            "boxes_used": sum(b.peak > 0 for b in door.boxes)}


def timed(door, size, n):
    connection = door.connection()
    said = [SYSTEM, {"role": "user", "content": "x"}]
    body = _body(said, pad=size)
    for _ in range(5):  # warm
        door.post(connection, body)
    took = []
    for _ in range(n):
        started = time.perf_counter()
        door.post(connection, body)
        took.append(time.perf_counter() - started)
    connection.close()
    took.sort()
    return {"bytes": len(body), "median_ms": round(statistics.median(took) * 1000, 3),
            "p99_ms": round(took[int(0.99 * (len(took) - 1))] * 1000, 3)}


# Bodies timed: a short chat, a 16K-token conversation's (issue 52's first turn, ~4 bytes a
# token), and a megabyte (a long-context prompt).
SIZES = {"2KB": 2_000, "64KB": 64_000, "1MB": 1_000_000}


def measure(conversations: int, requests: int) -> dict:
    found = {}
    for name, factor in (("leastconn", None), (f"affinity {FACTOR}", FACTOR)):
        with tempfile.TemporaryDirectory() as folder:
            door = Door(Path(folder), factor)
            try:
                found[name] = {"spread": spread(door, conversations), "hot": hot(door),
                               **{size: timed(door, n, requests) for size, n in SIZES.items()}}
            finally:
                door.stop()
    off, on = found["leastconn"], found[f"affinity {FACTOR}"]
    found["added_by_affinity_ms"] = {size: round(on[size]["median_ms"] - off[size]["median_ms"], 3)
                                     for size in SIZES}
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/door-affinity.json"))
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args(argv)
    cpu = time.process_time()
    result = {"as_of": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "command": "python -m bench.door_affinity " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True,
                                        check=False).stdout.splitlines()[0],
              "boxes": BOXES, "slots_per_box": SLOTS,
              "door": measure(args.conversations, args.requests)}
    result["bench_cpu_s"] = round(time.process_time() - cpu, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
