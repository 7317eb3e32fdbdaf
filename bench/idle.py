"""What a converged, idle box costs the machine: each box's CPU time over a window with no request
and no run, read from its container's cgroup (cpuacct), as a share of one core.

    python -m tests.sim up --hosts 2 --inventory /tmp/sim.py && pyinfra -y /tmp/sim.py deploy.py
    python -m bench.idle --seconds 60 --json bench/results/idle-box.json

CI keeps up to twelve boxes up on two cores, so what each costs doing nothing is CPU the stories
do not get (README, "CI time").
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import docker

from tests.sim import fleet


def cpu_seconds(container) -> float:
    """The container's cgroup CPU time so far, in seconds. Read from the cgroup itself (v1,
    Docker's cgroupfs driver, as this machine runs it): Docker's own stats answer 0 for it here."""
    usage = Path("/sys/fs/cgroup/cpuacct/docker") / container.id / "cpuacct.usage"
    if not usage.exists():
        raise SystemExit(f"{usage} is missing: this reads cgroup v1's cpuacct, as Docker's "
                         "cgroupfs driver lays it out")
    return int(usage.read_text()) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60, help="length of the idle window")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    client = docker.from_env()
    running = {fleet.host_name(i): c for i, c in sorted(fleet.boxes(client).items())
               if c.status == "running"}
    if not running:
        raise SystemExit("no box is running: bring a fleet up and converge it first (see above)")
    before = {host: cpu_seconds(c) for host, c in running.items()}
    started = time.monotonic()
    time.sleep(args.seconds)
    after = {host: cpu_seconds(c) for host, c in running.items()}
    window = time.monotonic() - started
    share = {host: round(100 * (after[host] - before[host]) / window, 2) for host in running}
    results = {"window_s": round(window, 1), "percent_of_a_core": share}
    for host, percent in share.items():
        print(f"{host}: {percent:.2f} % of a core over {window:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
