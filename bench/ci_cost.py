"""Where CI's two cores go: CPU seconds per story group, by kind (vLLM server starts, image builds,
the boxes' own systems and the deploy's commands on them, the laptop's pyinfra runs and test
process), and wall time by phase. `.ci/run` runs both halves:

    python -m bench.ci_cost sample --samples FILE &          # every 2 s, until stopped
    ... the README's two commands ...
    python -m bench.ci_cost report --samples FILE --groups STATE/logs/groups.jsonl \\
        --phases FILE --json bench/results/ci-cost.json

The groups' windows and the laptop side come from tests/conftest.py (logs/groups.jsonl: each group's
boxes, start and end, the worker's CPU and its children's, time in deploys and the fleet's start);
the rest from the cgroups (bench/cgroups.py says where each sits). A container's CPU counts to the
window it was first seen in; one shorter than the sampling interval is in its box's total, as
"short-lived (under the interval)".
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import docker

from bench import cgroups

INTERVAL_S = 2.0
BOX_SYSTEM = "box system (systemd, sshd, its Docker, the deploy's commands)"  # a box's own


# ------------------------------------------------------------------------------------ sampling

def _kind_in_box(path: Path) -> str:
    if "buildkit" in path.parts:
        return "image builds"
    command = cgroups.command_of(path)
    if "vllm" in command and ("serve" in command or "api_server" in command):
        return "vLLM server"
    if "chatfix" in command or "build-image" in command:
        return "image self-check"
    if "thorfleet-weights" in command or "huggingface" in command or "hf_hub" in command:
        return "weights fetch"
    return "other containers: " + (command.split(" | ")[0][:60] or "?")


def _host_container(client, cid: str, path: Path) -> tuple[str, str | None]:
    """(kind, box) of one of this host's containers."""
    if "buildkit" in path.parts:
        return "this host's image builds (the sim's bases, boxes, gateway)", None
    try:
        container = client.containers.get(cid)
    except docker.errors.NotFound:
        return "this host's containers (gone before a look)", None
    name = container.name
    host = name.removeprefix("thorfleet-")
    if host != name and host.startswith(("thor-", "gw-")):
        return BOX_SYSTEM, host
    if "registry" in name or "hub" in name:
        return f"sim {name.removeprefix('thorfleet-')}", None
    command = " ".join(container.attrs["Config"].get("Cmd") or [])
    if command.startswith("/bin/sh -c"):  # a step of a (classic) docker build
        return "this host's image builds (the sim's bases, boxes, gateway)", None
    tags = container.image.tags if container.image else []
    return "this host's throwaway containers: " + (tags[0] if tags else command[:50]), None


def sample(out: Path) -> None:
    client = docker.from_env()
    base = cgroups.root()
    state = {"interval_s": INTERVAL_S, "root": str(base), "started": time.time(),
             "root_cpu_s": [[time.time(), cgroups.usage_s(base)]], "containers": {},
             "parents": {}, "engine_cpu_s": [[time.time(), cgroups.host_engine_s()]]}
    seen = state["containers"]
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    last_write = 0.0
    while True:
        now = time.time()
        for box, path in cgroups.box_parents(base).items():
            series = state["parents"].setdefault(box, [])
            if (cpu := cgroups.usage_s(path)) is not None:
                series.append([round(now, 1), round(cpu, 2)])
        for cid, path in cgroups.containers(base).items():
            cpu = cgroups.usage_s(path)
            if cpu is None:
                continue
            entry = seen.get(cid)
            if entry is None:
                parts = path.relative_to(base).parts
                if parts[0].startswith(cgroups.BOX_PARENT):
                    kind, box = _kind_in_box(path), parts[0][len(cgroups.BOX_PARENT):]
                else:
                    kind, box = _host_container(client, cid, path)
                existed = now - state["started"] < INTERVAL_S  # there before sampling began
                entry = seen[cid] = {"kind": kind, "box": box, "first": round(now, 1),
                                     "from_s": round(cpu, 2) if existed else 0.0}
            elif entry["kind"].startswith("other containers") and entry["box"]:
                entry["kind"] = _kind_in_box(path)  # first seen starting (runc init): look again
            entry["cpu_s"], entry["last"] = round(cpu, 2), round(now, 1)
            if entry["kind"] == BOX_SYSTEM:  # lives across groups: kept over time
                entry.setdefault("series", []).append([round(now, 1), round(cpu, 2)])
        if stop or now - last_write > 30:
            state["root_cpu_s"].append([time.time(), cgroups.usage_s(base)])
            state["engine_cpu_s"].append([time.time(), cgroups.host_engine_s()])
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(out)
            last_write = now
        if stop:
            return
        time.sleep(INTERVAL_S)


# ------------------------------------------------------------------------------------ report

def _at(series: list, t: float) -> float:
    """A cumulative counter's value at time t, from its samples (held between them)."""
    value = series[0][1] if series and series[0][0] >= t else 0.0
    for when, cpu in series:
        if when > t:
            break
        value = cpu
    return value


def _window(samples: dict, start: float, end: float, boxes: list[str] | None) -> dict:
    """CPU seconds by kind of what was first seen in [start, end) on `boxes`, or, without boxes,
    on this host's own Docker (a docker-tier group: shared with any other running beside it),
    with each box's residual: what its containers spent unseen."""
    kinds: dict[str, float] = {}
    starts = 0
    for entry in samples["containers"].values():
        if "series" in entry and entry["box"] in (boxes or []):
            spent = _at(entry["series"], end) - _at(entry["series"], start)  # a box's own, by time
            kinds[entry["kind"]] = kinds.get(entry["kind"], 0.0) + spent
            continue
        if not start <= entry["first"] < end or "series" in entry:
            continue
        if entry["box"] not in (boxes or [None]):
            continue  # a box group counts its boxes'; a group without boxes, this host's
        spent = entry["cpu_s"] - entry["from_s"]
        kinds[entry["kind"]] = kinds.get(entry["kind"], 0.0) + spent
        starts += entry["kind"] == "vLLM server"
    for box in boxes or []:
        series = samples["parents"].get(box, [])
        if not series:
            continue
        total = _at(series, end) - _at(series, start)
        inside = sum(e["cpu_s"] - e["from_s"] for e in samples["containers"].values()
                     if e["box"] == box and start <= e["first"] < end
                     and e["kind"] != BOX_SYSTEM)
        if total - inside > 0.5:
            key = "short-lived containers (under the interval)"
            kinds[key] = kinds.get(key, 0.0) + total - inside
    return {"cpu_s": {k: round(v, 1) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "vllm_server_starts": starts}


def _starts_by_test(samples: dict, group: dict) -> dict:
    """{test: vLLM server starts on the group's boxes} by the test running when each was first
    seen (a module fixture's converge counts to its first test, its teardown to its last)."""
    marks = sorted(group.get("marks", []), key=lambda mark: mark[1])
    counted: dict[str, int] = {}
    for entry in samples["containers"].values():
        if (entry["kind"] != "vLLM server" or entry["box"] not in group["boxes"]
                or not group["started"] <= entry["first"] < group["ended"]):
            continue
        running = [name for name, began in marks if began <= entry["first"]]
        name = running[-1] if running else "(before the first test)"
        counted[name] = counted.get(name, 0) + 1
    return dict(sorted(counted.items(), key=lambda kv: -kv[1]))


def _box_cpu_by_test(samples: dict, group: dict) -> dict:
    """{test: CPU seconds of the group's boxes (their own systems and every container in them)}
    over each test's window, from its start to the next test's (a module fixture's converge
    counts to its first test, its teardown to its last): where a group's cores went, story by
    story. The laptop's side is the group's alone (conftest records it per group)."""
    marks = sorted(group.get("marks", []), key=lambda mark: mark[1])
    series = [samples["parents"][box] for box in group["boxes"] if box in samples["parents"]]
    series += [entry["series"] for entry in samples["containers"].values()
               if "series" in entry and entry["box"] in group["boxes"]]
    spent: dict[str, float] = {}
    for i, (name, began) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else group["ended"]
        spent[name] = spent.get(name, 0.0) + sum(_at(s, end) - _at(s, began) for s in series)
    return {name: round(cpu, 1) for name, cpu in sorted(spent.items(), key=lambda kv: -kv[1])}


def report(samples: dict, groups: list[dict], phases: list[dict]) -> dict:
    out = {"interval_s": samples["interval_s"], "cgroup_root": samples["root"], "phases": [],
           "groups": []}
    root = samples["root_cpu_s"]
    for phase in phases:
        start, end = phase["start"], phase["end"]
        engine = samples.get("engine_cpu_s", [])
        out["phases"].append({"phase": phase["name"], "wall_s": round(end - start),
                              "machine_cpu_s": round(_at(root, end) - _at(root, start)),
                              "host_engine_cpu_s": round(_at(engine, end) - _at(engine, start))})
    for group in sorted(groups, key=lambda g: g["started"]):
        start, end = group["started"], group["ended"]
        boxes = group["boxes"]
        row = {"group": group["group"], "boxes": boxes, "tests": group["tests"],
               "wall_s": round(end - start),
               "wall_by_phase_s": {
                   "fleet start (first test of a worker)": round(group["fleet_up_s"]),
                   "deploy runs": round(group["deploy_s"]),
                   "the rest (waits, probes, docker-tier containers)": round(
                       end - start - group["fleet_up_s"] - group["deploy_s"])},
               **_window(samples, start, end, boxes)}
        row["cpu_s"] = {**row["cpu_s"],
                        "laptop: pyinfra runs and other child processes": group["children_cpu_s"],
                        "laptop: the test process": group["worker_cpu_s"]}
        row["cpu_total_s"] = round(sum(row["cpu_s"].values()))
        row["vllm_server_starts_by_test"] = _starts_by_test(samples, group)
        if boxes:
            row["box_cpu_s_by_test"] = _box_cpu_by_test(samples, group)
        out["groups"].append(row)
    if phases:
        off = _window(samples, phases[0]["start"], phases[-1]["end"], None)
        out["off_the_boxes"] = off["cpu_s"]
    return out


def _print(result: dict) -> None:
    for phase in result["phases"]:
        print(f"{phase['phase']:<16} {phase['wall_s']:>6} s wall, "
              f"{phase['machine_cpu_s']:>7} CPU-s on the machine, "
              f"{phase['host_engine_cpu_s']} of them this host's Docker engine")
    for row in sorted(result["groups"], key=lambda r: -r["cpu_total_s"]):
        top = ", ".join(f"{k} {v:.0f}" for k, v in list(row["cpu_s"].items())[:4])
        print(f"{row['group']:<18} {row['wall_s']:>5} s wall, {row['cpu_total_s']:>5} CPU-s, "
              f"{row['vllm_server_starts']:>2} server starts: {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sample", help="sample the cgroups every 2 s until stopped")
    s.add_argument("--samples", type=Path, required=True)
    r = sub.add_parser("report", help="per group and phase, from the samples and the logs")
    r.add_argument("--samples", type=Path, required=True)
    r.add_argument("--groups", type=Path, required=True, help="the run's logs/groups.jsonl")
    r.add_argument("--phases", type=Path, required=True,
                   help=".ci/run's phases: lines `NAME START END` (epoch seconds)")
    r.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.what == "sample":
        sample(args.samples)
        return
    # a run that stopped before any story group (the fast tier failed) has no groups file
    groups = ([json.loads(line) for line in args.groups.read_text().splitlines() if line.strip()]
              if args.groups.exists() else [])
    phases = [dict(zip(("name", "start", "end"), (n, float(a), float(b)), strict=True))
              for n, a, b in (line.rsplit(" ", 2) for line in
                              args.phases.read_text().splitlines() if line.strip())]
    result = {"command": "python -m bench.ci_cost " + " ".join(sys.argv[1:]),
              **report(json.loads(args.samples.read_text()), groups, phases)}
    _print(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
