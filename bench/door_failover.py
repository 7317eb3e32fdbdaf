"""Benchmark two gateways sharing one address: how long clients lose the door when the gateway
holding it dies, and how many requests fail meanwhile for a client that retries once.

    python -m sim up --hosts 2 --gateways 2
    python -m bench.door_failover --hosts 1-2 --rounds 3 --out bench/results/door-failover.json

The boxes thor-<hosts> behind gw-1 and gw-2 (gateway_virtual_ip: the sim's), converged once.
Then, each round, two clients on this machine send short completions through the shared address
(HTTPS, the fleet CA, hostname checked), each retrying a failed request once after 0.5 s, while
the gateway holding the address is
1. killed (its container: the host dies), then started again, and
2. left up with its HAProxy stopped (`systemctl stop haproxy`), then HAProxy started again.
For each: seconds from the kill until the address is on the other gateway, until the first
request started after the kill succeeds, and the requests that failed after their retry.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.rollout import parse_range
from sim import fleet, operator
from tests.fleet.test_gateway import Front, Load

PAIR = ("gw-1", "gw-2")


def holder(sim, address):
    found = [g for g in PAIR
             if sim.exec(g, f"ip -o -4 addr show | grep -qw {address}")[0] == 0]
    return found[0] if len(found) == 1 else None


def one_failover(sim, front, how):
    """Kill the holder (`how`: "host" or "haproxy") under load; what the clients saw."""
    address = front.host
    was = holder(sim, address)
    other = next(g for g in PAIR if g != was)
    with Load(front, clients=2, max_tokens=4, retries=1) as clients:
        time.sleep(3)
        killed = time.monotonic()
        if how == "host":
            sim.client.containers.get(f"thorfleet-{was}").kill()
        else:
            sim.exec(was, "systemctl stop haproxy")
        moved = None
        while time.monotonic() - killed < 60:
            if holder(sim, address) == other:
                moved = time.monotonic() - killed
                break
            time.sleep(0.2)
        time.sleep(10)
    after = [r for r in clients.results if r[0] >= killed]  # (start, ok, what, end)
    served = [r for r in after if r[1]]
    row = {"how": how, "from": was, "to": other,
           "address_moved_s": round(moved, 2) if moved is not None else None,
           "first_served_s": round(min(r[3] for r in served) - killed, 2) if served else None,
           "requests_after_kill": len(after),
           "failed_after_retry": len([r for r in after if not r[1]]),
           "failed_before_kill": len([r for r in clients.results if r[0] < killed and not r[1]])}
    if how == "host":
        sim.client.containers.get(f"thorfleet-{was}").start()
        sim.wait_booted(was)
    else:
        sim.exec(was, "systemctl start haproxy")
    time.sleep(5)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1-2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/door-failover.json"))
    args = parser.parse_args(argv)
    sim = fleet.attach()
    hosts = parse_range(args.hosts)
    workdir = Path(tempfile.mkdtemp(prefix="door-failover-"))
    report = workdir / "report.json"
    inventory = sim.write_inventory(workdir / "pair.py", hosts=hosts, gateway=list(PAIR),
                                    extra_data={"rollout_report_path": str(report)})
    run = operator.deploy(inventory)
    assert run.returncode == 0, run.stderr[-3000:]
    endpoint = json.loads(report.read_text())["endpoint"]
    key = (sim.state / "api_key").read_text().strip()
    front = Front(None, endpoint, key, hosts)
    rows = []
    for round_ in range(args.rounds):
        for how in ("host", "haproxy"):
            row = one_failover(sim, front, how)
            row["round"] = round_ + 1
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {}
    for how in ("host", "haproxy"):
        mine = [r for r in rows if r["how"] == how]
        summary[how] = {
            "address_moved_s_median": statistics.median(r["address_moved_s"] for r in mine
                                                        if r["address_moved_s"] is not None),
            "first_served_s_median": statistics.median(r["first_served_s"] for r in mine
                                                       if r["first_served_s"] is not None),
            "failed_after_retry": sum(r["failed_after_retry"] for r in mine),
            "requests_after_kill": sum(r["requests_after_kill"] for r in mine)}
    out = {"command": "python -m bench.door_failover " + " ".join(sys.argv[1:] if argv is None else argv),
           "hosts": hosts, "gateways": list(PAIR), "address": endpoint["url"],
           "rounds": rows, "summary": summary}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
