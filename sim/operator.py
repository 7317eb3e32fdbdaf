"""Run thorfleet the way an operator does: the pyinfra CLI from the repo root, on an inventory.
Part of the sim's public API: the tests (through tests.helpers) and bench/ use it."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: sim/operator.py
# This process's time in deploy runs (bench/ci_cost.py reads each story group's, through
# tests/conftest.py).
SPENT = {"deploy_s": 0.0}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    marks: list = field(default_factory=list)  # with timed=True: (seconds since start, line)

    @property
    def json(self):
        return json.loads(self.stdout)

    @property
    def changed(self):
        """Operations that changed something, summed over hosts ("success" in pyinfra's JSON);
        for a --dry run, the operations it would change (or might, behind a condition)."""
        if self.json.get("results") is None:
            return sum(len(op["hosts_with_change"]) + len(op["hosts_with_conditional_change"])
                       for op in self.json["plan"])
        return self.json["results"]["totals"]["success"]

    @property
    def failed_hosts(self):
        return self.json["results"].get("failed_hosts", [])


def deploy(inventory, *args, as_json=True, timeout=1800, env=None, root=ROOT, timed=False):
    """`pyinfra -y [--json] INVENTORY deploy.py ARGS`, from the repo root (or another checkout's:
    its own thorfleet package is imported, not the installed one). With `timed`, .marks holds
    each line pyinfra printed with when it came (the benchmark times the deploy's sections)."""
    if root != ROOT:
        env = {**(env or os.environ), "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "pyinfra", "-y", *(["--json"] if as_json else []), *args,
            str(inventory), "deploy.py"]
    started = time.monotonic()
    try:
        return _run(argv, root, env, timeout, timed, started)
    finally:
        SPENT["deploy_s"] += time.monotonic() - started


def _run(argv, root, env, timeout, timed, started):
    if not timed:
        done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL, check=False)
        return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
    proc = subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    out = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()))
    reader.start()
    marks = [(time.monotonic() - started, line) for line in proc.stderr]
    proc.wait()
    reader.join()
    killer.cancel()
    return Run(proc.returncode, "".join(out), "".join(line for _, line in marks),
               time.monotonic() - started, marks)


def edited_checkout(dest, edits):
    """A copy of this checkout's tracked files at `dest` with `edits` made to it: {path: [(old,
    new), ...]}, each `old` found exactly once. How a test shows what an edit to thorfleet breaks."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    for name, changes in edits.items():
        text = (dest / name).read_text()
        for old, new in changes:
            assert text.count(old) == 1, f"{name}: {old!r} found {text.count(old)} times"
            text = text.replace(old, new)
        (dest / name).write_text(text)
    return dest
