"""The run lock: a box held by one thorfleet run at a time. The one fact that takes something
rather than only reading it: RunLock says why it stays a fact.
"""

from __future__ import annotations

from shlex import quote as q

from pyinfra.api import FactBase

from thorfleet.settings.layout import (
    BOX_RUN_LOCK_DIR,
    THOR_FILES,
)


class RunLock(FactBase):
    """Take the box for this run, or say who has it: {"held": True} or {"held": False, "why":
    the line naming the run that holds it}. The lock's tool (files/thor/bin/thorfleet-run-lock) is
    sent with the command, so a bare box is held before anything else is read or sent; its
    keeper holds the lock until this run's SSH connection ends. Taking it again with the same
    token (pyinfra runs an operation's body once to plan and once to execute) is a no-op.

    A fact that takes a lock, on purpose: pyinfra reads facts while it plans, before any operation
    runs, and a second run's reads (a half-written file, a fingerprint mid-restart) would plan
    from a box another run is changing. A fact's command is the only thing pyinfra runs on a box
    at plan time, so the lock is taken by the first one read."""

    batched = False  # read alone, before the one-round-trip read of everything else (snapshot.py)

    def command(self, holder, token, wait_s):
        tool = f"{BOX_RUN_LOCK_DIR}/thorfleet-run-lock"
        source = (THOR_FILES / "bin" / "thorfleet-run-lock").read_text()
        take = " ".join(q(str(word)) for word in (
            "python3", tool, "take", "--dir", BOX_RUN_LOCK_DIR, "--holder", holder,
            "--token", token, "--wait", wait_s))
        return (f"mkdir -p -m 755 {q(BOX_RUN_LOCK_DIR)} && "
                f"cat > {q(tool)}.new <<'THORFLEET_RUN_LOCK'\n{source}THORFLEET_RUN_LOCK\n"
                f"mv -f {q(tool)}.new {q(tool)} && {take} 2>&1; echo \"rc=$?\"")

    def process(self, output):
        status = output[-1] if output and output[-1].startswith("rc=") else "rc=?"
        if status == "rc=0":
            return {"held": True, "why": None}
        said = [line for line in output[:-1] if "thorfleet-run-lock:" in line]
        why = said[-1].split("thorfleet-run-lock: ", 1)[-1] if said else \
            f"the run lock failed ({status}): {' / '.join(output[-3:])}"
        return {"held": False, "why": why}
