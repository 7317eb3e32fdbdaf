"""The run's shared state: what the hosts' operations record and the end-of-run report reads.

    records = run_state(state)   # one RunState per pyinfra run, kept on pyinfra's State
    records.fail(host, "why")    # the one way a host fails: logged in red, recorded, False

One object per run (it holds the run's plan too: plan.settings_for_run), not module globals:
two runs in one process (the Python API, the tests) never see each other's failures.
"""

from __future__ import annotations

import getpass
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from pyinfra import logger


@dataclass
class RunState:
    # The rollout's record (rollout.decide reads it, through operations.serving), written by the
    # serving commands as they execute: hosts whose activate or prove failed in this run, and
    # hosts started as first installs (they never proved a version).
    failed_restarts: set[str] = field(default_factory=set)
    first_starts: set[str] = field(default_factory=set)
    # Why each host failed, in the words the operator reads in the report.
    errors: dict[str, list[str]] = field(default_factory=dict)
    # What each host looked like at the end of the run (report.observe).
    observed: dict[str, dict] = field(default_factory=dict)
    # Each benchmarked host's figures (operations.benchmark), then the fleet gate's verdict on them.
    benchmarks: dict[str, dict] = field(default_factory=dict)
    # What each host's operations read, declared as they are planned, and the answers read in one
    # round trip, per stage (snapshot.py).
    planned_reads: dict[str, dict] = field(default_factory=dict)
    held_reads: dict[str, dict] = field(default_factory=dict)
    # The ID of each derived image tag as the run's first host built or holds it (operations.
    # derived_image with push): the other hosts check what they pull against it.
    image_ids: dict[str, str] = field(default_factory=dict)
    # With a gateway: hosts left out of its rotation by this run, and why (a failed proof).
    out_of_rotation: dict[str, str] = field(default_factory=dict)
    # The run's plan (thorfleet/plan.py settings_for_run): {host name: its settings}, or the
    # SettingsError that refused it; None until it is built.
    settings: dict | Exception | None = None
    # Where the report is written once the run ends (None until report.install).
    report_path: str | None = None
    # A run of the gateways alone says at its end which of a pair it left behind (report.py).
    gateways_told: bool = False
    # The CLI was given --dry (read as the inventory loads: a run that stopped while connecting
    # writes its report, or under --dry its plan).
    dry_run: bool = False
    # This run as the run lock names it to a run that finds a box held, and its own id there.
    holder: str = field(default_factory=lambda: (
        f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"))
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    # When this run began (epoch seconds): what it sets on the gateways is dated by it, so one
    # that missed a run can tell it is behind (operations.gateway.level_recorded).
    started: int = field(default_factory=lambda: int(time.time()))

    def planned(self) -> dict:
        """{host name: settings} of the run's plan; what refused it, raised; KeyError before."""
        if self.settings is None:
            raise KeyError("the run's plan is not built yet")
        if isinstance(self.settings, Exception):
            raise self.settings
        return self.settings

    def note_error(self, host_name, message):
        """Record why `host_name` failed, for the report (without failing it)."""
        self.errors.setdefault(host_name, []).append(message)

    def fail(self, host, message, details=()):
        """Fail `host`: log `message` (and any `details` lines) in red under its name, record the
        message in the report. Returns False, what a FunctionCommand returns to fail the host."""
        self.note_error(host.name, message)
        for line in (message, *details):
            host.log_styled(f"thorfleet: {line}", fg="red", log_func=logger.error)
        return False


def run_state(state) -> RunState:
    """The RunState of this pyinfra run (`state`: pyinfra's State), created on first use."""
    records = getattr(state, "thorfleet_run", None)
    if records is None:
        records = RunState()
        state.thorfleet_run = records
    return records
