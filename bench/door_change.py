"""Benchmark a change of the team's clients, live, and how far a client goes past its budget.

    python -m sim up --hosts 3 --gateways 2
    python -m bench.door_change --hosts 1-3 --out bench/results/door-change.json

The boxes thor-<hosts> behind the pair gw-1 and gw-2 (gateway_virtual_ip), with gateway_clients.
1. A key revoked, --rounds times: the documented command (`pyinfra INVENTORY deploy.py --limit
   gateway`, the client's entry removed) started, and from that instant each gateway asked on its
   own address every 0.2 s with the revoked key until it answers 401: seconds to 401 on each
   gateway, and the command's own time (issue 51: within 30 s of the command's start). Then the
   key given back the same way.
2. A day's budget overshot: a client with tokens_per_day BUDGET keeps its max_inflight requests
   of ANSWER tokens open (as a busy robot does) until the door refuses it; then, its in-flight
   answers done and counted, the tokens each gateway counts for it against BUDGET.
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
from sim import fleet, operator

PAIR = ("gw-1", "gw-2")
BUDGET, ANSWER, AT_ONCE = 5000, 400, 4


class Bench:
    def __init__(self, sim, hosts, workdir):
        self.sim, self.hosts, self.workdir, self.runs = sim, hosts, workdir, 0
        self.keys = {}
        for name in ("alice", "sam", "robot"):
            path = workdir / f"{name}.key"
            path.write_text(os.urandom(24).hex() + "\n")
            path.chmod(0o600)
            self.keys[name] = path
        self.endpoint = None

    def clients(self, without=()):
        entries = {"alice": str(self.keys["alice"]), "sam": str(self.keys["sam"]),
                   "robot": {"key_file": str(self.keys["robot"]), "tokens_per_day": BUDGET,
                             "max_inflight": AT_ONCE}}
        return {n: e for n, e in entries.items() if n not in without}

    def inventory(self, clients):
        self.runs += 1
        report = self.workdir / f"{self.runs:02d}-report.json"
        return self.sim.write_inventory(
            self.workdir / f"{self.runs:02d}.py", hosts=self.hosts,
            gateway=[(g, {"gateway_clients": clients}) for g in PAIR],
            extra_data={"rollout_report_path": str(report)}), report

    def converge(self, clients, *args):
        inventory, report = self.inventory(clients)
        run = operator.deploy(inventory, *args)
        if run.returncode != 0:
            raise RuntimeError(run.stderr[-3000:])
        if report.exists():
            self.endpoint = json.loads(report.read_text()).get("endpoint") or self.endpoint
        return run

    def status(self, gateway, key, path="/v1/models"):
        """The HTTP status `gateway` answers on its own address (its certificate names the
        shared one: the CA checked, the name not)."""
        tls = ssl.create_default_context(cafile=self.endpoint["ca_file"])
        tls.check_hostname = False
        conn = http.client.HTTPSConnection(self.sim.ip(gateway), urlparse(
            self.endpoint["url"]).port, context=tls, timeout=5)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
            answer = conn.getresponse()
            answer.read()
            return answer.status
        except OSError:
            return 0
        finally:
            conn.close()

    def counted(self, client):
        found = {}
        for g in PAIR:
            _, out = self.sim.exec(g, "/usr/local/sbin/thorfleet-door-usage show", timeout=30)
            month = json.loads(out)["clients"].get(client, {}).get("tokens", {}).get("month", {})
            found[g] = month.get("prompt", 0) + month.get("completion", 0)
        return found


def revoke_round(bench):
    key = bench.keys["sam"].read_text().strip()
    assert all(bench.status(g, key) == 200 for g in PAIR)
    refused_at, started = {}, time.monotonic()

    def watch(gateway):
        while time.monotonic() - started < 120:
            if bench.status(gateway, key) == 401:
                refused_at[gateway] = round(time.monotonic() - started, 2)
                return
            time.sleep(0.2)

    watchers = [threading.Thread(target=watch, args=(g,), daemon=True) for g in PAIR]
    for w in watchers:
        w.start()
    run = bench.converge(bench.clients(without=("sam",)), "--limit", "gateway")
    command_s = round(time.monotonic() - started, 2)
    for w in watchers:
        w.join()
    bench.converge(bench.clients(), "--limit", "gateway")  # given back
    return {"command_s": command_s, "refused_after_s": refused_at, "run_s": round(run.seconds, 2)}


def overshoot(bench):
    url = urlparse(bench.endpoint["url"])
    tls = ssl.create_default_context(cafile=bench.endpoint["ca_file"])
    key = bench.keys["robot"].read_text().strip()
    stopping, codes, received = threading.Event(), [], []

    def robot():
        while not stopping.is_set():
            conn = http.client.HTTPSConnection(url.hostname, url.port, context=tls, timeout=300)
            body = {"model": "mistral-small-4", "max_tokens": ANSWER, "ignore_eos": True,
                    "messages": [{"role": "user", "content": "Write."}]}
            try:
                conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={
                    "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
                answer = conn.getresponse()
                text = answer.read()
                codes.append(answer.status)
                if answer.status == 200:
                    usage = json.loads(text)["usage"]
                    received.append(usage["prompt_tokens"] + usage["completion_tokens"])
                else:
                    stopping.set()
            except OSError:
                codes.append(0)
            finally:
                conn.close()

    before = bench.counted("robot")
    threads = [threading.Thread(target=robot, daemon=True) for _ in range(AT_ONCE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    time.sleep(6)  # the usage services' next polls
    after = bench.counted("robot")
    counted = {g: after[g] - before[g] for g in PAIR}
    return {"budget": BUDGET, "answer_tokens": ANSWER, "at_once": AT_ONCE,
            "served": sum(c == 200 for c in codes), "refused_429": sum(c == 429 for c in codes),
            "received": sum(received), "counted": counted,
            "over_budget": {g: n - BUDGET for g, n in counted.items()}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1-3")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/door-change.json"))
    args = parser.parse_args(argv)
    sim = fleet.attach()
    bench = Bench(sim, parse_range(args.hosts), Path(tempfile.mkdtemp(prefix="bench-change-")))
    for g in PAIR:
        sim.heal(g)
    bench.converge(bench.clients())
    rounds = [revoke_round(bench) for _ in range(args.rounds)]
    print(json.dumps(rounds), file=sys.stderr)
    over = overshoot(bench)
    worst = max(max(r["refused_after_s"].values(), default=999) for r in rounds)
    results = {"command": "python -m bench.door_change " + " ".join(
                   sys.argv[1:] if argv is None else argv),
               "hosts": bench.hosts, "gateways": list(PAIR), "revoke_rounds": rounds,
               "revoked_401_on_both_within_s": worst,
               "goal": {"within_s": 30, "met": worst <= 30 and all(
                   len(r["refused_after_s"]) == len(PAIR) for r in rounds)},
               "overshoot": over}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0 if results["goal"]["met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
