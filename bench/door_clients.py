"""Benchmark the door's client keys: what the key check and the limits cost a request's first
token, and what a client over its limit costs another.

    python -m bench.door_clients --hosts 1-3 --out bench/results/door-clients.json

The boxes thor-<hosts> behind gw-1 (max_num_seqs 1 each, as the seed). The client runs on the
gateway box (bench/gateway_client.py, as bench/gateway.py does), so only HAProxy's work differs:
1. Time to first token and the gap between tokens, `--requests` streams of 64 tokens one after
   another: the door without gateway_clients (today's one key), then with two clients (alice,
   bob) and their limits (the key's SHA-256 looked up in a map, a stick table, the box key set).
2. alice streams the same while bob, from this machine, keeps 8 requests open at once against a
   limit of 1 (gateway_client_max_inflight=1: 7 of every 8 refused with 429 at the door), and
   again while bob sends 1 at a time, at his limit. alice's first-token time and gap between chunks
   in each, against alice alone: a client over its limit takes no box's slot from another.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from bench.gateway import CLIENT, ON_GATEWAY, on_gateway
from bench.rollout import parse_range
from sim import fleet, operator

GATEWAY = "gw-1"
THROUGH = f"https://127.0.0.1:{fleet.GATEWAY_HTTPS_PORT}"
CA_ON_GATEWAY = "/tmp/fleet-ca.pem"


def converge(sim, workdir, name, hosts, **gateway_data):
    report = workdir / f"{name}-report.json"
    inventory = sim.write_inventory(workdir / f"{name}.py", hosts=hosts,
                                    gateway=(GATEWAY, gateway_data),
                                    extra_data={"rollout_report_path": str(report)})
    run = operator.deploy(inventory)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(report.read_text())


class Noisy:
    """bob, from this machine: `at_once` requests open at all times, each 32 tokens."""

    def __init__(self, endpoint, key, at_once):
        self.url, self.key = urlparse(endpoint["url"]), key
        self.context = ssl.create_default_context(cafile=endpoint["ca_file"])
        self.stopping, self.codes = threading.Event(), []
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(at_once)]

    def run(self):
        while not self.stopping.is_set():
            conn = http.client.HTTPSConnection(self.url.hostname, self.url.port,
                                               context=self.context, timeout=120)
            body = {"model": "/model", "prompt": "def fib(n):", "max_tokens": 32}
            try:
                conn.request("POST", "/v1/completions", body=json.dumps(body), headers={
                    "Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
                answer = conn.getresponse()
                answer.read()
                self.codes.append(answer.status)
            except OSError:
                self.codes.append(0)
            finally:
                conn.close()
            if self.codes[-1] == 429:
                time.sleep(0.05)  # a client that will not listen: back at once

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        time.sleep(2)
        return self

    def __exit__(self, *_):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=120)


def alice(key, n):
    """alice's streams: first-token time and the mean gap between streamed chunks (her decode
    rate: each chunk one EAGLE step's tokens, two at the seed's acceptance)."""
    return on_gateway("stream", THROUGH, key, CA_ON_GATEWAY, n, 64)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1-3")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("bench/results/door-clients.json"))
    args = parser.parse_args(argv)
    hosts = parse_range(args.hosts)
    sim = fleet.up(max(fleet.index_of(h) for h in hosts), gateway=True,
                   inventory=Path(tempfile.gettempdir()) / "thorfleet-bench-door.py")
    workdir = Path(tempfile.mkdtemp(prefix="bench-door-"))
    fleet_key = (sim.state / "api_key").read_text().strip()
    keys = {}
    for name in ("alice", "bob"):
        path = workdir / f"{name}.key"
        path.write_text(os.urandom(24).hex() + "\n")
        path.chmod(0o600)
        keys[name] = str(path)

    endpoint = converge(sim, workdir, "one-key", hosts)["endpoint"]
    subprocess.run(["docker", "cp", str(CLIENT), f"{fleet.GATEWAY_CONTAINER}:{ON_GATEWAY}"],
                   check=True)
    subprocess.run(["docker", "cp", endpoint["ca_file"],
                    f"{fleet.GATEWAY_CONTAINER}:{CA_ON_GATEWAY}"], check=True)
    on_gateway("stream", THROUGH, fleet_key, CA_ON_GATEWAY, 2, 16)  # warm
    results = {"hosts": hosts, "gateway": GATEWAY, "max_num_seqs": 1, "requests": args.requests,
               "command": "python -m bench.door_clients "
                          + " ".join(sys.argv[1:] if argv is None else argv)}
    results["one_key"] = alice(fleet_key, args.requests)

    converge(sim, workdir, "clients", hosts, gateway_clients=keys, gateway_client_max_inflight=1)
    key_of = {name: Path(path).read_text().strip() for name, path in keys.items()}
    on_gateway("stream", THROUGH, key_of["alice"], CA_ON_GATEWAY, 2, 16)  # warm
    results["client_keys"] = alice(key_of["alice"], args.requests)
    results["ttft_added_ms"] = round(results["client_keys"]["ttft_ms_median"]
                                     - results["one_key"]["ttft_ms_median"], 2)
    for label, at_once in (("bob_at_his_limit", 1), ("bob_over_his_limit", 8)):
        with Noisy(endpoint, key_of["bob"], at_once) as bob:
            found = alice(key_of["alice"], args.requests)
        found["bob"] = {"requests": len(bob.codes), "answered": bob.codes.count(200),
                        "refused_429": bob.codes.count(429),
                        "other": len(bob.codes) - bob.codes.count(200) - bob.codes.count(429)}
        results[label] = found
    converge(sim, workdir, "leave", hosts)  # the door as before: the fleet's one key
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
