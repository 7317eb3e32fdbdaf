"""Run thorfleet the way an operator does: the pyinfra CLI from the repo root, on an inventory."""

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

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


def deploy(inventory, *args, as_json=True, timeout=1800, env=None):
    """`pyinfra -y [--json] INVENTORY deploy.py ARGS`, from the repo root."""
    argv = [sys.executable, "-m", "pyinfra", "-y", *(["--json"] if as_json else []), *args,
            str(inventory), "deploy.py"]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
