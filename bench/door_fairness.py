"""Benchmark the door's fairness when a pool is full: a third client's time to first token
while one client holds its share with long answers and a batch client floods, against the same
client alone.

    python -m sim up --hosts 3 --gateway
    python -m bench.door_fairness --hosts 1-3 --out bench/results/door-fairness.json

The boxes thor-<hosts> behind gw-1, default profile (max_num_seqs 1 each: a pool of 3 slots, a
fair share of 2: thorfleet/gateway/policy.py fair_share). Three clients of gateway_clients:
- `heavy` (interactive, max_inflight 2: its share) keeps 2 long answers (LONG tokens) open;
- `robot` (priority batch) keeps FLOOD requests of SHORT tokens open, 429s retried at once;
- `carol` (interactive) sends --requests streams of SHORT tokens one after another: her time to
  first token (the first chunk carrying content) is the figure.
First carol alone (the others idle), then all three. The goal (issue 51): carol's p99 loaded
within one request's service time of her p99 alone, the service time being a robot request's
whole time alone (what carol may wait behind when the one slot that frees is a robot's).
Every client runs on this machine, through the door's address with the fleet CA: both phases
pay the same TLS and network.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from bench.rollout import parse_range
from bench.soak import percentile
from sim import fleet, operator

GATEWAY = "gw-1"
SHORT, LONG = 32, 384  # tokens of carol's and the robot's answers; of heavy's
FLOOD = 6  # the robot's requests open at once


def converge(sim, workdir, hosts, clients):
    report = workdir / "report.json"
    inventory = sim.write_inventory(workdir / "fairness.py", hosts=hosts,
                                    gateway=(GATEWAY, {"gateway_clients": clients}),
                                    extra_data={"rollout_report_path": str(report)})
    run = operator.deploy(inventory)
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    return json.loads(report.read_text())["endpoint"]


class Door:
    """Chat streams through the door with one client's key: (ttft, total, status) each."""

    def __init__(self, endpoint, key):
        self.url, self.key = urlparse(endpoint["url"]), key
        self.tls = ssl.create_default_context(cafile=endpoint["ca_file"])

    def stream(self, max_tokens):
        started = time.monotonic()
        conn = http.client.HTTPSConnection(self.url.hostname, self.url.port, context=self.tls,
                                           timeout=600)
        body = {"model": "mistral-small-4", "stream": True, "max_tokens": max_tokens,
                "ignore_eos": True, "messages": [{"role": "user", "content": "Hello"}]}
        first = None
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={
                "Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
            answer = conn.getresponse()
            if answer.status != 200:
                answer.read()
                return None, time.monotonic() - started, answer.status
            for line in answer:
                if first is None and line.startswith(b"data: {") and b'"content":"' in line:
                    first = time.monotonic() - started
            return first, time.monotonic() - started, 200
        except OSError:
            return None, time.monotonic() - started, 0
        finally:
            conn.close()


class Busy:
    """`threads` requests of `max_tokens` kept open by one client until stopped."""

    def __init__(self, door, threads, max_tokens):
        self.door, self.max_tokens, self.results = door, max_tokens, []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]

    def run(self):
        while not self.stopping.is_set():
            self.results.append(self.door.stream(self.max_tokens))
            if self.results[-1][2] == 429:
                time.sleep(0.05)

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(5)  # the pool full and the queue formed
        return self

    def __exit__(self, *_):
        self.stopping.set()
        for t in self.threads:
            t.join(timeout=600)


def summary(results):
    ttft = [r[0] for r in results if r[0] is not None]
    total = [r[1] for r in results if r[2] == 200]
    return {"n": len(results), "ok": sum(r[2] == 200 for r in results),
            "refused_429": sum(r[2] == 429 for r in results),
            "ttft_p50_s": round(percentile(ttft, 50), 3) if ttft else None,
            "ttft_p99_s": round(percentile(ttft, 99), 3) if ttft else None,
            "total_p50_s": round(percentile(total, 50), 3) if total else None}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1-3")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("bench/results/door-fairness.json"))
    args = parser.parse_args(argv)
    hosts = parse_range(args.hosts)
    sim = fleet.attach()
    workdir = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    keys = {}
    for name in ("heavy", "robot", "carol"):
        path = workdir / f"{name}.key"
        path.write_text(os.urandom(24).hex() + "\n")
        path.chmod(0o600)
        keys[name] = path
    clients = {"heavy": {"key_file": str(keys["heavy"]), "max_inflight": 2},
               "robot": {"key_file": str(keys["robot"]), "priority": "batch",
                         "max_inflight": FLOOD},
               "carol": str(keys["carol"])}
    endpoint = converge(sim, workdir, hosts, clients)
    door = {n: Door(endpoint, p.read_text().strip()) for n, p in keys.items()}
    door["carol"].stream(4)  # warm
    robot_alone = [door["robot"].stream(SHORT) for _ in range(5)]
    alone = [door["carol"].stream(SHORT) for _ in range(args.requests)]
    print(f"alone: {summary(alone)}", file=sys.stderr)
    with Busy(door["heavy"], 2, LONG) as heavy, Busy(door["robot"], FLOOD, SHORT) as robot:
        loaded = [door["carol"].stream(SHORT) for _ in range(args.requests)]
    service_s = summary(robot_alone)["total_p50_s"]
    results = {
        "command": "python -m bench.door_fairness " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "hosts": hosts, "gateway": GATEWAY, "pool_slots": len(hosts), "fair_share": 2,
        "tokens": {"carol": SHORT, "robot": SHORT, "heavy": LONG}, "robot_at_once": FLOOD,
        "robot_alone": summary(robot_alone), "carol_alone": summary(alone),
        "carol_loaded": summary(loaded), "heavy": summary(heavy.results),
        "robot": summary(robot.results), "service_time_s": service_s}
    gap = results["carol_loaded"]["ttft_p99_s"] - results["carol_alone"]["ttft_p99_s"]
    results["goal"] = {"p99_added_s": round(gap, 3), "within_s": service_s,
                       "met": gap <= service_s}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0 if results["goal"]["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
