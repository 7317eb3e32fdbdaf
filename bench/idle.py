"""What a converged, idle box costs the machine: each box's CPU time over a window with no request
and no run, as a share of one core: its own container's cgroup (cpuacct: systemd, the watchdog,
the box's Docker engine, the memory model) and the cgroups of the containers the box's Docker
runs (the vLLM server). Those sit beside the box's, not under it (the box's engine uses the host's
cgroupfs: bench/cgroups.py), so each is read on its own and added.

    python -m sim up --hosts 2 --inventory /tmp/sim.py && pyinfra -y /tmp/sim.py deploy.py
    python -m bench.idle --seconds 60 --json bench/results/idle-box.json

CI keeps up to twelve boxes up on two cores, so what each costs doing nothing is CPU the stories
do not get (bench/README.md, "CI time").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import docker

from bench import cgroups
from sim import fleet


def cpu_seconds(container_id: str) -> float:
    """A container's cgroup CPU time so far, in seconds (bench/cgroups.py: where each sits)."""
    path = cgroups.containers().get(container_id)
    if path is None:
        raise SystemExit(f"no cgroup for container {container_id[:12]} under {cgroups.root()}")
    return cgroups.usage_s(path)


def inner_containers(container) -> dict[str, str]:
    """{full ID: name} of the containers the box's own Docker runs."""
    code, out = container.exec_run(["docker", "ps", "--no-trunc", "--format", "{{.ID}} {{.Names}}"])
    if code != 0:
        raise SystemExit(f"docker ps in {container.name} failed: {out.decode()[-300:]}")
    return dict(line.split(" ", 1) for line in out.decode().splitlines() if line.strip())


def readings(container) -> dict[str, float]:
    """CPU seconds so far of the box itself ("box") and of each container its Docker runs."""
    return {"box": cpu_seconds(container.id),
            **{name: cpu_seconds(cid) for cid, name in inner_containers(container).items()}}


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
    before = {host: readings(c) for host, c in running.items()}
    started = time.monotonic()
    time.sleep(args.seconds)
    after = {host: readings(c) for host, c in running.items()}
    window = time.monotonic() - started
    parts = {}
    for host in running:
        if after[host].keys() != before[host].keys():
            raise SystemExit(f"{host}: its containers changed during the window "
                             f"({sorted(before[host])} -> {sorted(after[host])}): not idle")
        parts[host] = {name: round(100 * (after[host][name] - before[host][name]) / window, 2)
                       for name in after[host]}
    share = {host: round(sum(p.values()), 2) for host, p in parts.items()}
    results = {"command": "python -m bench.idle " + " ".join(sys.argv[1:]),
               "window_s": round(window, 1), "percent_of_a_core": share,
               "percent_of_a_core_by_container": parts}
    for host, percent in share.items():
        each = ", ".join(f"{name} {p:.2f}" for name, p in parts[host].items())
        print(f"{host}: {percent:.2f} % of a core over {window:.0f} s ({each})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
