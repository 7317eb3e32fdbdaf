"""Benchmark warm conversations: turns 2-6 of each conversation against its first, through the
door, with prefix caching on and off, on the default profile and the throughput profile.

    python -m sim up --hosts 3 --gateway
    python -m bench.warm_conversations --hosts 1-3 --out bench/results/warm-conversations.json

The boxes thor-<hosts> behind gw-1. Each run converges them on a profile, with prefix caching
and the door's affinity both on (gateway_affinity_balance_factor AFFINITY), caching on and the
door spreading turns (leastconn), or both off (the seed's), then runs `python -m thorfleet bench --conversations N` (the
product's own multi-turn mode, on this machine as a client) with issue 52's shape: each
conversation 6 turns growing from 16K tokens, 64-token answers, 2 s of thought between turns; 3
conversations at once on the default profile (one per box), 8 on the throughput profile. Each
run's whole result (every turn: the box it landed on, its time to first token, the door's wait,
its cached tokens) is kept under `runs`, with the goals checked beside it:
- time to first token of turns 2-6 (median, the door's wait apart) at most a tenth of turn 1's;
- at least 90 % of turns 2-6 served by the box that served the turn before (where the prefix
  is), and no box serving more than 1.5x the mean number of requests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.rollout import parse_range
from sim import fleet, operator

GATEWAY = "gw-1"
RUNS = (("default", 3), ("throughput", 8))  # (profile, conversations at once)
AFFINITY = 150
# (prefix caching, the door's balance factor or None: leastconn)
WAYS = ((True, AFFINITY), (True, None), (False, None))
SHAPE = {"turns": 6, "first_tokens": 16000, "grow_tokens": 300, "answer_tokens": 64,
         "think_s": 2.0}


def converge(sim, workdir: Path, hosts, profile: str, caching: bool, factor) -> Path:
    inventory = sim.write_inventory(
        workdir / f"{profile}-{caching}-{factor}.py", hosts=hosts,
        gateway=(GATEWAY, {"gateway_affinity_balance_factor": factor}),
        extra_data={"service_profile": profile, "service_prefix_caching": caching,
                    "rollout_report_path": str(workdir / "report.json"), "rollout_batch": 3})
    run = operator.deploy(inventory)
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    return inventory


def converse(inventory: Path, out: Path, conversations: int) -> dict:
    words = [sys.executable, "-m", "thorfleet", "bench", str(inventory), "--out", str(out),
             "--conversations", str(conversations),
             *(f"--{key.replace('_', '-')}={value}" for key, value in SHAPE.items())]
    done = subprocess.run(words, text=True, check=False)
    result = json.loads((out / "conversations.json").read_text())
    result["exit"] = done.returncode
    return result


def goals(summary: dict) -> dict:
    return {"later_vs_first_ttft": summary["later_vs_first_ttft"], "at_most": 0.1,
            "later_turns_on_their_box": summary["later_turns_on_their_box"], "at_least": 0.9,
            "busiest_box_vs_mean": summary["busiest_box_vs_mean"], "busiest_at_most": 1.5,
            "met": (summary["later_vs_first_ttft"] or 1) <= 0.1
            and (summary["later_turns_on_their_box"] or 0) >= 0.9
            and (summary["busiest_box_vs_mean"] or 9) <= 1.5 and not summary["failed"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1-3")
    parser.add_argument("--out", type=Path,
                        default=Path("bench/results/warm-conversations.json"))
    parser.add_argument("--profile", action="append", choices=[p for p, _ in RUNS],
                        help="only these (default: each)")
    args = parser.parse_args(argv)
    hosts = parse_range(args.hosts)
    sim = fleet.attach()
    workdir = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    results = {"command": "python -m bench.warm_conversations " + " ".join(
        sys.argv[1:] if argv is None else argv), "hosts": hosts, "gateway": GATEWAY,
        "shape": SHAPE, "runs": []}
    for profile, conversations in RUNS:
        if args.profile and profile not in args.profile:
            continue
        for caching, factor in WAYS:
            print(f"bench: {profile}, prefix caching {'on' if caching else 'off'}, affinity "
                  f"{factor}: converging", file=sys.stderr, flush=True)
            inventory = converge(sim, workdir, hosts, profile, caching, factor)
            run = converse(inventory, workdir / f"{profile}-{caching}-{factor}", conversations)
            run.update(profile=profile, prefix_caching=caching, affinity=factor)
            if caching and factor:
                run["goal"] = goals(run["summary"])
            results["runs"].append(run)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")  # each run as it ends
    met = all(r["goal"]["met"] for r in results["runs"] if "goal" in r)
    for r in results["runs"]:
        s = r["summary"]  # read back from JSON: its turns are keyed "1", "2", ...
        print(f"{r['profile']:>10} caching {'on ' if r['prefix_caching'] else 'off'} affinity "
              f"{r['affinity']}: turn 1 "
              f"{s['turns']['1']['median_ttft_ms']} ms, "
              f"later/first {s['later_vs_first_ttft']}, on their box "
              f"{s['later_turns_on_their_box']}, busiest {s['busiest_box_vs_mean']}x")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
