"""Benchmark thorfleet on the simulated fleet: converge times and what a rolling change costs.

    python -m bench.rollout                      # thor-3..thor-6, fresh boxes, ~15 min
    python -m bench.rollout --hosts 3-6 --keep-boxes --batches 1 2

1. First converge of fresh boxes and a no-change re-run, for one host and for all of them
   (the boxes are re-created: their containers and disks are removed, then `up`). For each first
   converge: the bytes the hub served, as a multiple of one copy of the two pinned checkpoints,
   and how many boxes built the derived image (--image-registry shares it; --wan-rate puts one
   uplink of that many bytes/s in front of the hub, shared by every box's download, the stand-in
   hub's "uplink" knob; the LAN unthrottled), and where the time went: each deploy section's
   share, from when pyinfra started its operations.
2. A rolling config change through all of them per --batches value, while a prober inside each box
   hits /health every 0.5 s: the most hosts down at once, and each host's outage against its own
   restart (systemd stopping the service -> thorfleet-serve writing the proven fingerprint).

Never touches boxes outside --hosts (other engineers test on thor-1 and thor-2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import docker

from bench import latency
from sim import fleet, operator
from sim.hub.faults import HubFaults
from sim.prober import Prober, restart_window


def parse_range(text):
    first, _, last = text.partition("-")
    return [f"thor-{i}" for i in range(int(first), int(last or first) + 1)]


def recreate(client, hosts, up_to):
    """Fresh boxes: remove the containers and their disks, then bring the fleet back up."""
    existing = fleet.boxes(client)
    for host in hosts:
        index = fleet.index_of(host)
        if index in existing:
            fleet.remove_box(existing[index], index)
    return fleet.up(up_to, inventory=Path(tempfile.gettempdir()) / "thorfleet-bench-all.py",
                    client=client)


def weights_bytes(sim):
    """Bytes of one copy of the two pinned checkpoints, as the hub lists them."""
    total = 0
    for repo, revision in sim.hub["revisions"].items():
        url = f"{sim.hub['endpoint_local']}/api/models/{repo}/tree/{revision}"
        with urllib.request.urlopen(url, timeout=30) as response:
            total += sum(e["size"] for e in json.loads(response.read()) if e["type"] == "file")
    return total


def hub_bytes(hub):
    """Body bytes of the files the hub served since forget_requests(): small files from
    /resolve/, LFS files from where /resolve/ redirects them (the stand-in's /_sim/lfs/)."""
    return sum(r["bytes"] or 0 for r in hub.requests()
               if r["method"] == "GET" and ("/resolve/" in r["path"] or "/lfs/" in r["path"]))


def built_on(run, hosts):
    """The hosts whose run built the derived image (its Build operation changed something)."""
    return [h for h in hosts if any(op["name"].startswith("Image | Build") and h in op["success"]
                                    for op in run.json["results"]["operations"])]


SENT = re.compile(r"\[(?P<host>[^\]\s]+)\].*thorfleet-image: sent (?P<bytes>\d+) bytes of \S+ "
                  r"\(image (?P<image>\d+) bytes\)")


def image_moved(run):
    """{host: {"bytes": sent to it, "image_bytes": the image's size}} from the lines the first
    host's thorfleet-image prints as it finishes each send, shown under the loading host's name
    (ssh passes the sender's stderr on)."""
    return {m["host"]: {"bytes": int(m["bytes"]), "image_bytes": int(m["image"])}
            for m in map(SENT.search, run.stderr.splitlines()) if m}


def deploy(inventory, env=None):
    """`pyinfra -y --json INVENTORY deploy.py`, each operation timed from its "--> Starting
    operation" line: .sections is {deploy section: seconds}, with "start" the time before the
    first operation (start-up, connecting, planning); .cpu_s is the CPU pyinfra used on this
    machine (the laptop's side: the boxes' reads run in their containers, not counted)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = operator.deploy(inventory, timed=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    run.cpu_s = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    run.sections = sections(run.marks, run.seconds)
    return run


def sections(lines, total):
    """{deploy section: seconds} from pyinfra's stderr `lines` as (seconds since start, line):
    each operation lasts until the next one starts (the last one until `total`), and counts
    toward the section before " | " in its name ("other" without one); "start" is the time
    before the first operation."""
    marks = []
    for at, line in lines:
        if line.startswith("--> Starting operation: "):
            name = line.split(": ", 1)[1].strip()
            marks.append((at, name.split(" | ")[0] if " | " in name else "other"))
    split = {"start": round(marks[0][0] if marks else total, 1)}
    ends = [t for t, _ in marks[1:]] + [total] if marks else []
    for (begun, section), end in zip(marks, ends, strict=True):
        split[section] = round(split.get(section, 0) + end - begun, 1)
    return split


def timed_deploy(sim, workdir, name, hosts, extra=None, env=None):
    inventory = sim.write_inventory(workdir / f"{name}.py", hosts=hosts, extra_data={
        "rollout_report_path": str(workdir / f"{name}-report.json"), **(extra or {})})
    run = deploy(inventory, env=env)
    if run.returncode != 0:
        raise SystemExit(f"{name}: deploy failed ({run.returncode}):\n{run.stderr[-3000:]}")
    print(f"[bench] {name}: {run.seconds:.1f} s, {run.changed} changed operations", flush=True)
    return run


def reruns(sim, workdir, group, extra, count, mode):
    """`count` no-change re-runs of `group` (a few: one run's figure moves by tenths of a second
    with whatever else the machine does), the median reported; keys `rerun_*` for the batched
    snapshot, `rerun_each_*` with each read its own fact command."""
    env = {**os.environ, "THORFLEET_BATCH_READS": "1" if mode == "batched" else "0"}
    again = [timed_deploy(sim, workdir, f"rerun-{len(group)}-{mode}", group, extra, env=env)
             for _ in range(count)]
    key = "rerun" if mode == "batched" else "rerun_each"
    return {f"{key}_s": round(statistics.median(r.seconds for r in again), 1),
            f"{key}_samples_s": [round(r.seconds, 2) for r in again],
            f"{key}_laptop_cpu_s": round(statistics.median(r.cpu_s for r in again), 2),
            f"{key}_changed": max(r.changed for r in again),
            f"{key}_changed_samples": [r.changed for r in again]}


@contextlib.contextmanager
def delayed(sim, workdir, group, rtt_ms):
    """(the hosts as inventory entries, extra group data) that reach `group` with a round trip
    of `rtt_ms` (bench/latency.py's proxies; their ports in a known_hosts of their own), or the
    hosts as they are with rtt_ms 0."""
    if not rtt_ms:
        yield group, {}
        return
    with latency.round_trip({h: sim.ssh_port(h) for h in group}, rtt_ms) as ports:
        lines = sim.known_hosts.read_text().splitlines()
        known = workdir / f"known_hosts-rtt{rtt_ms}"
        known.write_text("".join(
            line.replace(f"[127.0.0.1]:{sim.ssh_port(h)} ", f"[127.0.0.1]:{ports[h]} ") + "\n"
            for h in group for line in lines if line.startswith(f"[127.0.0.1]:{sim.ssh_port(h)} ")))
        yield [(h, {"ssh_port": ports[h]}) for h in group], {"ssh_known_hosts_file": str(known)}


def rolling_change(sim, workdir, hosts, batch, value):
    """Roll a config change (an extra env value: a new fingerprint) through `hosts`, probing."""
    since = time.time()
    with Prober(hosts) as probe:
        time.sleep(1)  # a few samples of the serving fleet first
        run = timed_deploy(sim, workdir, f"rolling-batch{batch}", hosts, {
            "rollout_batch": batch, "service_extra_env": {"THORFLEET_BENCH_CHANGE": value}})
        time.sleep(1)
    windows = {h: restart_window(h, since) for h in hosts}
    outages = probe.outages()
    per_host = {}
    for host in hosts:
        mine = [o for o in outages if o.host == host]
        start, end = windows[host] or (None, None)
        per_host[host] = {
            "down_s": round(sum(o.seconds for o in mine), 1),
            "restart_s": round(end - start, 1) if start else None,
            "outages": len(mine),
            "inside_restart": all(start and start - 0.6 <= o.start and o.end <= end + 0.6
                                  for o in mine),
        }
    return {"batch": batch, "seconds": round(run.seconds, 1), "most_down_at_once":
            probe.most_down_at_once(), "samples": sum(len(s) for s in probe.samples.values()),
            "hosts": per_host}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="3-6", help="box range, e.g. 3-6 (never 1-2 while "
                        "others test)")
    parser.add_argument("--keep-boxes", action="store_true",
                        help="skip the fresh-box converges (measure re-runs and rollouts only)")
    parser.add_argument("--image-registry", help="share the image through this registry path "
                        "(in the sim: thorfleet-registry:5000/thorfleet)")
    parser.add_argument("--image-base", help="the sim base to converge on (python -m "
                        "sim bases), e.g. upstream-0.26.0 (default: the group data's)")
    parser.add_argument("--wan-rate", type=int, help="bytes/s of the one uplink every hub "
                        "response shares (an office's WAN)")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 2],
                        help="rollout_batch values to roll a change through (one run each)")
    parser.add_argument("--reruns", type=int, default=3,
                        help="no-change re-runs per group (the median is reported)")
    parser.add_argument("--rtt-ms", type=int, default=0,
                        help="a round trip of this many ms between the laptop and each box for "
                             "the re-runs (a delaying proxy, bench/latency.py: a WAN or a VPN)")
    parser.add_argument("--reads", choices=["batched", "each", "both"], default="batched",
                        help="re-runs with the batched snapshot (one round trip per box), with "
                             "each read its own fact command (THORFLEET_BATCH_READS=0), or both")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    hosts = parse_range(args.hosts)
    up_to = max(fleet.index_of(h) for h in hosts)
    client = docker.from_env()
    workdir = Path(tempfile.mkdtemp(prefix="thorfleet-bench-"))
    extra = {"image_registry": args.image_registry} if args.image_registry else {}
    if args.image_base:
        extra["image_base"] = {n: ref for n, ref, _ in fleet.bases(client)}[args.image_base]
    results = {"hosts": hosts, "image_registry": args.image_registry,
               "image_base": args.image_base, "wan_rate": args.wan_rate,
               "rtt_ms": args.rtt_ms, "converge": {}, "rollouts": []}
    modes = ["batched", "each"] if args.reads == "both" else [args.reads]

    sim = fleet.up(up_to, inventory=workdir / "all.py", client=client)
    hub = HubFaults(sim.hub["endpoint_local"])
    one_copy = weights_bytes(sim)
    for group in ([hosts[0]], hosts):
        label = f"{len(group)} host{'s' * (len(group) > 1)}"
        if not args.keep_boxes:
            sim = recreate(client, group, up_to)
            hub.forget_requests()
            if args.wan_rate:
                hub.add("uplink", path="*", rate=args.wan_rate)
            try:
                first = timed_deploy(sim, workdir, f"first-{len(group)}", group, extra)
            finally:
                hub.clear()
            served = hub_bytes(hub)
            results["converge"].setdefault(label, {}).update({
                "first_s": round(first.seconds, 1), "hub_bytes": served,
                "hub_copies": round(served / one_copy, 2),
                "image_built_on": built_on(first, group),
                "image_moved": image_moved(first),
                "first_sections_s": first.sections})
        with delayed(sim, workdir, group, args.rtt_ms) as (entries, reach):
            for mode in modes:
                results["converge"].setdefault(label, {}).update(
                    reruns(sim, workdir, entries, {**extra, **reach}, args.reruns, mode))

    for number, batch in enumerate(args.batches):
        results["rollouts"].append(rolling_change(sim, workdir, hosts, batch, f"bench-{number}"))
    print_table(results)
    if args.json:  # before the restore below: what was measured is kept whatever it does
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    # Leave the boxes on the group data's own version, as other runs expect.
    timed_deploy(sim, workdir, "restore", hosts, {"rollout_batch": 2})


def print_table(results):
    from rich.console import Console
    from rich.table import Table

    console = Console(width=120)
    rtt = f", {results['rtt_ms']} ms round trip" if results.get("rtt_ms") else ""
    table = Table(title=f"Converge wall time (pyinfra CLI, simulated Thors{rtt})")
    for column in ("hosts", "first converge", "no-change re-run", "re-run, each read alone",
                   "pyinfra CPU in re-run", "changed ops in re-run", "hub bytes (x one copy)",
                   "boxes that built the image"):
        table.add_column(column)

    def cell(row, key, unit=" s"):
        return f"{row[key]}{unit}" if key in row else "-"

    for label, row in results["converge"].items():
        table.add_row(label, cell(row, "first_s"), cell(row, "rerun_s"),
                      cell(row, "rerun_each_s"), cell(row, "rerun_laptop_cpu_s"),
                      str(row.get("rerun_changed", row.get("rerun_each_changed"))),
                      cell(row, "hub_copies", "x"),
                      str(len(row["image_built_on"])) if "image_built_on" in row else "-")
    console.print(table)
    split = {label: row["first_sections_s"] for label, row in results["converge"].items()
             if "first_sections_s" in row}
    if split:
        table = Table(title="Where each first converge went (s, from pyinfra's operation starts)")
        table.add_column("section")
        for label in split:
            table.add_column(label)
        for section in dict.fromkeys(name for row in split.values() for name in row):
            table.add_row(section, *(str(row.get(section, "-")) for row in split.values()))
        console.print(table)
    if not results["rollouts"]:  # --batches with no value: converges only
        return
    table = Table(title="Rolling config change, /health probed every 0.5 s in every box")
    for column in ("rollout_batch", "wall time", "most down at once", "host", "down",
                   "its restart", "outage inside restart"):
        table.add_column(column)
    for roll in results["rollouts"]:
        for i, (host, row) in enumerate(roll["hosts"].items()):
            table.add_row(*(str(roll["batch"]), f"{roll['seconds']} s",
                            str(roll["most_down_at_once"])) if i == 0 else ("", "", ""),
                          host, f"{row['down_s']} s", f"{row['restart_s']} s",
                          "yes" if row["inside_restart"] else "NO")
    console.print(table)


if __name__ == "__main__":
    main()
