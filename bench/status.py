"""Benchmark `python -m thorfleet status`: the wall time of the whole command, as an operator runs
it, against a deployed fleet (the issue's target: 2 s for 4 boxes on the sim).

    python -m bench.status INVENTORY                 # 20 runs
    python -m bench.status INVENTORY --runs 50 --out bench/results/status.json

Each run is `python -m thorfleet status INVENTORY --json` from the repository root: the
interpreter's start, the inventory's load and settings check, one SSH round trip per box (all at
once) and the JSON. Read-only: it changes nothing on the boxes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0


def one_run(inventory):
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "thorfleet", "status", str(inventory), "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    took = time.perf_counter() - began
    rows = json.loads(done.stdout) if done.stdout.strip() else []
    return {"seconds": round(took, 3), "exit": done.returncode,
            "serving": sum(1 for r in rows if r["serving"]), "hosts": [r["host"] for r in rows]}


def percentile(values, share):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.status", description=__doc__)
    parser.add_argument("inventory")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "status.json"))
    args = parser.parse_args(argv)
    runs = [one_run(args.inventory) for _ in range(args.runs)]
    seconds = [r["seconds"] for r in runs]
    results = {"hosts": runs[-1]["hosts"], "runs": len(runs),
               "as_of": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "median_s": round(statistics.median(seconds), 3),
               "p95_s": round(percentile(seconds, 0.95), 3), "target_s": TARGET_S,
               "every_run_exit_0": all(r["exit"] == 0 for r in runs), "per_run": runs}
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(results['hosts'])} hosts, {len(runs)} runs: median {results['median_s']} s, "
          f"p95 {results['p95_s']} s (target {TARGET_S} s); every run exit 0: "
          f"{results['every_run_exit_0']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
