"""What one vLLM server start costs on the sim's 0.19.0 base, and whether running several at once
on this machine's cores makes each dearer.

    python -m bench.start_cost --out bench/results/start-cost.json [--runs 2] [--profile]

Each start is `vllm serve /model` as the unit runs it (sim/base/testing.py serving: the seed's
config, the nvidia runtime, the vLLM cache folder kept, so vLLM's model classes are known) until
/health answers; its cost is the container's own CPU seconds then (its cgroup, which Docker's
stats read as 0 here: bench/cgroups.py). Measured for 1, 2 and 4 starts at once (the stories run
four workers on two cores), and once more with Python's garbage collector off for the start.
--profile records one start with py-spy (when installed) and reports the share of its samples
under importing modules, under mistral_common loading the tekken vocabulary, and under deep
copies: where a start's CPU goes.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker
from docker.models.containers import ContainerCollection

from bench import cgroups
from sim import state_dir
from sim.base import testing
from sim.rootfs import ensure_rootfs

GC_OFF = ("import gc, runpy, sys; gc.disable(); sys.argv = ['vllm', *sys.argv[1:]]; "
          "runpy.run_path('/opt/venv/bin/vllm', run_name='__main__')")
RUN = ContainerCollection.run
WRAP: dict = {}  # how the next starts' command is wrapped: {"gc": bool, "spy": (binary, out dir)}


def _run(self, image, command, **kwargs):
    """The SDK's run, with the start's `vllm serve` wrapped as WRAP says."""
    if WRAP.get("gc"):
        command = ["python3", "-c", GC_OFF, *command[1:]]
    if WRAP.get("spy"):
        binary, out = WRAP["spy"]
        kwargs["volumes"] = {**kwargs["volumes"], str(binary): {"bind": "/spy", "mode": "ro"},
                             str(out): {"bind": "/out", "mode": "rw"}}
        kwargs["cap_add"] = ["SYS_PTRACE"]
        command = ["/spy", "record", "-r", "200", "-f", "raw", "-o", "/out/start.txt", "--",
                   "python3", "/opt/venv/bin/vllm", *command[1:]]
    return RUN(self, image, command, **kwargs)


def _cpu_s(container) -> float:
    path = next(p for cid, p in cgroups.containers().items() if cid == container.id)
    return round(cgroups.usage_s(path), 2)


def starts(client, image: str, model: Path, at_once: int) -> list[float]:
    """CPU seconds of each of `at_once` starts run together, each to /health."""
    def one(_):
        with testing.serving(client, image, model) as server:
            server.wait_healthy()
            return _cpu_s(server.container)

    with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
        return list(pool.map(one, range(at_once)))


def profile(client, image: str, model: Path) -> dict | None:
    """Shares of one start's py-spy samples, or None without py-spy."""
    binary = shutil.which("py-spy")
    if binary is None:
        return None
    binary = Path(binary).resolve()
    with tempfile.TemporaryDirectory(dir=state_dir()) as out:
        WRAP["spy"] = (binary, Path(out))
        try:
            with testing.serving(client, image, model) as server:
                server.wait_healthy()
                # py-spy writes its samples when the server it runs exits: stop the server
                for row in server.container.top()["Processes"]:
                    if "vllm serve" in row[-1] and "/spy" not in row[-1]:
                        os.kill(int(row[1]), signal.SIGINT)
                server.wait_exit(120)
        finally:
            WRAP.pop("spy")
        lines = (Path(out) / "start.txt").read_text().splitlines()
    under = collections.Counter()
    total = 0
    for line in lines:
        stack, count = line.rsplit(" ", 1)
        total += int(count)
        for name, needle in (("importing modules", "_find_and_load ("),
                             ("mistral_common loading the tekken vocabulary", "Tekkenizer.from_file ("),
                             ("deep copies", "deepcopy (")):
            if needle in stack:
                under[name] += int(count)
    return {"samples": total, "share": {k: round(v / total, 3) for k, v in under.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=2, help="rounds of each measurement")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    client = docker.from_env(timeout=1800)
    image = testing.ensure_base_image(client, ensure_rootfs(client))
    folder = Path(tempfile.mkdtemp(dir=state_dir(), prefix="start-cost-"))
    ContainerCollection.run = _run
    try:
        model = testing.hub_model(client, image, folder / "model")
        starts(client, image, model, 1)  # vLLM learns the model classes once, as on a box
        result = {"command": "python -m bench.start_cost " + " ".join(sys.argv[1:]),
                  "image": image, "cpu_s_per_start": {}}
        for label, at_once, gc_off in (("1 at a time", 1, False), ("2 at once", 2, False),
                                       ("4 at once", 4, False), ("1, GC off", 1, True)):
            WRAP["gc"] = gc_off
            each = [cpu for _ in range(args.runs) for cpu in starts(client, image, model, at_once)]
            WRAP.pop("gc")
            result["cpu_s_per_start"][label] = {"each": each,
                                                "median": round(statistics.median(each), 2)}
            print(f"{label:>12}: {statistics.median(each):5.2f} CPU-s a start (median of "
                  f"{len(each)}: {each})", flush=True)
        if args.profile:
            result["profile"] = profile(client, image, model)
            print("profile:", result["profile"])
        result["measured_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    finally:
        ContainerCollection.run = RUN
        shutil.rmtree(folder, ignore_errors=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
