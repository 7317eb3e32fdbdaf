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
For each, timed on this machine's clock, as a client sees it:
- `door_lost_s`: the longest time between two successful answers of a probe client around the
  kill: a completion of one token, a new one started every PROBE_EVERY_S on its own thread
  (whatever the others do; PROBE_TIMEOUT_S each), the gap from the last success before the outage
  to the first success after it, each taken when its answer arrived; `baseline_gap_s` the same
  measure before the kill (what the gap is with nothing wrong);
- `first_served_s`: from the kill to the first success of a probe started after it;
- `address_moved_s`: [after, by]: the address was still on the old holder `after` seconds after
  the kill and on the other `by` seconds after (read with `ip addr` on both through docker exec,
  each read ~0.1-0.5 s: a bracket, not a moment);
- the load's requests that failed after their retry.
Figures are rounded to RESOLUTION_S, the probe's spacing: no figure is known better than that (the
moment the door came back lies somewhere in the probe that first succeeded, or the one before it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.rollout import parse_range
from sim import fleet, operator
from tests.fleet.test_gateway import COMPLETION, Front, Load

PAIR = ("gw-1", "gw-2")


PROBE_EVERY_S = 0.25  # a probe request starts this often, each on its own thread
PROBE_TIMEOUT_S = 5.0  # a probe not answered in this is a failure (a dead holder drops packets)
RESOLUTION_S = PROBE_EVERY_S  # what every figure is rounded to


def holder(sim, address):
    found = [g for g in PAIR
             if sim.exec(g, f"ip -o -4 addr show | grep -qw {address}")[0] == 0]
    return found[0] if len(found) == 1 else None


def rounded(seconds, step=RESOLUTION_S):
    """`seconds` to the nearest `step` (None stays None): a figure no finer than it is known."""
    if seconds is None:
        return None
    return round(round(seconds / step) * step, 6)


def outage(probes, killed):
    """What the probe client saw, from its (start, end, ok) on one clock: the longest gap between
    two successive successes (answer times) from the last success before the kill on (the door
    lost), the same before the kill (the baseline), and the first success of a probe started
    after the kill, from the kill. Unrounded; None where there is nothing to measure."""
    ends = sorted(end for start, end, ok in probes if ok)
    before = [e for e in ends if e <= killed]
    after_kill = [e for e in ends if e > killed]
    around = before[-1:] + after_kill
    lost = max((b - a for a, b in itertools.pairwise(around)), default=None)
    baseline = max((b - a for a, b in itertools.pairwise(before)), default=None)
    started_after = [end for start, end, ok in probes if ok and start >= killed]
    return {"door_lost_s": lost if before and after_kill else None,
            "baseline_gap_s": baseline,
            "first_served_s": min(started_after) - killed if started_after else None}


def moved_between(polls, killed, other):
    """[after, by] seconds from the kill: the last poll that did not see the address on `other`,
    the first that did; `polls` (when the read began, when it ended, holder)."""
    seen = [(began, ended) for began, ended, who in polls if who == other]
    if not seen:
        return None
    first_began, first_ended = seen[0]
    not_yet = [ended for began, ended, who in polls if who != other and began < first_began]
    after = (max(not_yet) if not_yet else killed) - killed
    return [after, first_ended - killed]


class Probe:
    """The door asked every PROBE_EVERY_S for a completion of one token, each request on its own
    thread, no retry: (start, end, ok) on time.monotonic(), taken here, on the client's side."""

    def __init__(self, front):
        self.front, self.results, self.threads = front, [], []
        self.stopping = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)

    def _one(self):
        started = time.monotonic()
        try:
            status, _ = self.front.request("POST", "/v1/completions",
                                           {**COMPLETION, "max_tokens": 1},
                                           timeout=PROBE_TIMEOUT_S)
            ok = status == 200
        except OSError:
            ok = False
        self.results.append((started, time.monotonic(), ok))

    def _tick(self):
        due = time.monotonic()
        while not self.stopping.is_set():
            thread = threading.Thread(target=self._one, daemon=True)
            thread.start()
            self.threads.append(thread)
            due += PROBE_EVERY_S
            self.stopping.wait(max(0.0, due - time.monotonic()))

    def __enter__(self):
        self.ticker.start()
        return self

    def __exit__(self, *_):
        self.stopping.set()
        self.ticker.join()
        for thread in self.threads:
            thread.join(timeout=PROBE_TIMEOUT_S + 5)


def one_failover(sim, front, how):
    """Kill the holder (`how`: "host" or "haproxy") under load; what the clients saw."""
    address = front.host
    was = holder(sim, address)
    other = next(g for g in PAIR if g != was)
    polls = []  # (read began, read ended, holder), from the kill
    with Load(front, clients=2, max_tokens=4, retries=1) as clients, Probe(front) as probe:
        time.sleep(3)
        killed = time.monotonic()
        if how == "host":
            sim.client.containers.get(f"thorfleet-{was}").kill()
        else:
            sim.exec(was, "systemctl stop haproxy")
        while time.monotonic() - killed < 60:
            began = time.monotonic()
            who = holder(sim, address)
            polls.append((began, time.monotonic(), who))
            if who == other:
                break
            time.sleep(0.2)
        time.sleep(10)
    after = [r for r in clients.results if r[0] >= killed]  # (start, ok, what, end)
    seen = outage(probe.results, killed)
    moved = moved_between(polls, killed, other)
    row = {"how": how, "from": was, "to": other, "resolution_s": RESOLUTION_S,
           **{name: rounded(value) for name, value in seen.items()},
           "address_moved_s": [rounded(s) for s in moved] if moved else None,
           "probes": len(probe.results),
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


def summarised(rows):
    """Medians over the rounds (each at RESOLUTION_S), and the failures summed."""
    def median(name):
        values = [r[name] for r in rows if r[name] is not None]
        return rounded(statistics.median(values)) if values else None

    return {"resolution_s": RESOLUTION_S, "door_lost_s_median": median("door_lost_s"),
            "baseline_gap_s_median": median("baseline_gap_s"),
            "first_served_s_median": median("first_served_s"),
            "failed_after_retry": sum(r["failed_after_retry"] for r in rows),
            "requests_after_kill": sum(r["requests_after_kill"] for r in rows)}


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
        summary[how] = summarised(mine)
    out = {"command": "python -m bench.door_failover " + " ".join(sys.argv[1:] if argv is None else argv),
           "hosts": hosts, "gateways": list(PAIR), "address": endpoint["url"],
           "rounds": rows, "summary": summary}
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
