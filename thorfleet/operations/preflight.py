"""Preflight: is this box a Thor that can run the model? Reads only; fails the host with every
problem at once."""

from __future__ import annotations

from packaging.version import Version
from pyinfra import host
from pyinfra.api import FunctionCommand, operation
from pyinfra.facts.server import Which

from thorfleet import facts
from thorfleet.operations.commands import fail_host, sh
from thorfleet.run.runstate import run_state
from thorfleet.run.snapshot import reads
from thorfleet.settings.layout import BOX_RUN_LOCK_DIR, RRSYNC

# A holder whose run just ended lets go within the keeper's poll (0.5 s): a run that "stops at
# once" still waits this long, so back-to-back runs never trip on the one before.
LOCK_GRACE_S = 3


@reads(lock=lambda holder, token, **_: (
    facts.lock.RunLock, {"holder": holder, "token": token, "wait_s": LOCK_GRACE_S}))
@operation()
def box_held(holder, token, wait_s=0, *, lock):
    """Hold the box for this run: one thorfleet run at a time on a box (two runs at once would
    kill each other's downloads and leave a proven fingerprint that is not the live files).

    + holder: who this run is, for the run that finds the box held (user@laptop pid N)
    + token: this run's own id (the same at planning and at execution)
    + wait_s: how long to wait for another run that holds the box (0: stop at once)

    Taken before any other fact of the box is read, when the run is planned and again when it
    executes (pyinfra reads the box again then). A box held by another run stops this one at once
    with a line naming that run, or, with `wait_s`, says so and waits for it when executing. The
    lock goes when this run's SSH connection ends: nothing to release.

    .. code:: python

        box_held(name="Hold the box for this run", holder="me@laptop pid 7", token="a1b2", wait_s=0)
    """
    if lock["held"]:
        host.noop(f"held for this run ({holder})")
    elif wait_s > LOCK_GRACE_S:
        host.log_styled(f"thorfleet: {lock['why'].split(' (waited')[0]}: waiting up to "
                        f"{wait_s:g} s (preflight_lock_wait_s)", fg="yellow")
        yield _wait_for_lock(holder, token, wait_s)
    else:
        yield fail_host(lock["why"])


def _wait_for_lock(holder, token, wait_s):
    """A command that waits up to `wait_s` for the run holding the box, then holds it for this
    run; failing the host with the holder's line when the wait runs out."""

    def wait(state, host):
        ok, output = host.run_shell_command(
            sh("python3", f"{BOX_RUN_LOCK_DIR}/thorfleet-run-lock", "take", "--dir",
               BOX_RUN_LOCK_DIR, "--holder", holder, "--token", token, "--wait", wait_s),
            _sudo=True)
        if ok:
            return True
        said = [line.split("thorfleet-run-lock: ", 1)[-1] for line in output.stderr_lines]
        return run_state(state).fail(host, said[-1] if said else "the run lock failed")

    return FunctionCommand(wait, (), {})


# --- each check, pure: the deploy's preflight and `thorfleet doctor` ask the same ---------------

def release_problem(release, min_l4t_release) -> str | None:
    """Why this L4T release (from facts.box.L4TRelease) cannot run the image, or None."""
    if release is None:
        return "/etc/nv_tegra_release is missing: not a Jetson running L4T (JetPack)"
    if Version(release) < Version(str(min_l4t_release)):
        return (f"L4T R{release} is older than R{min_l4t_release}: flash JetPack 7 (L4T r38) or "
                "newer")
    return None


def memory_problem(memory, min_memory_gib) -> str | None:
    if memory < min_memory_gib:
        return (f"{memory:.1f} GiB of memory, the model needs {min_memory_gib} "
                "(preflight_min_memory_gib)")
    return None


def disk_problem(disk, present, min_free_disk_gib, weights_dir) -> str | None:
    # what the pinned weights already take counts as theirs: a converged box passes its re-run
    if disk + present < min_free_disk_gib:
        have = f" + {present:.1f} GiB of the pinned weights already there" if present else ""
        return (f"{disk:.1f} GiB free under {weights_dir}{have}, need {min_free_disk_gib} "
                "(preflight_min_free_disk_gib): free space or point weights_dir at a larger disk")
    return None


def sudo_problem(sudo, user) -> str | None:
    if not sudo:
        return (f"`sudo -n true` fails for {user or 'the SSH user'}: give it passwordless sudo "
                "(thorfleet cannot answer password prompts)")
    return None


def runtime_problem(runtimes) -> str | None:
    if runtimes is None:
        return "docker is not installed: install JetPack's Docker with nvidia-container-toolkit"
    if "nvidia" not in runtimes:
        return (f"Docker offers runtimes {runtimes} but not `nvidia`: install "
                "nvidia-container-toolkit and run `nvidia-ctk runtime configure`")
    return None


def _installed(command):
    """The read of whether `command` is installed, needed only for the fleet copy."""
    return lambda fleet_copy=False, **_: (Which, {"command": command}) if fleet_copy else None


@reads(release=lambda **_: (facts.box.L4TRelease, {}),
       memory=lambda **_: (facts.box.MemTotalGiB, {}),
       disk=lambda weights_dir, **_: (facts.box.FreeDiskGiB, {"path": weights_dir}),
       present=lambda checkpoints, **_: (facts.serving.PinnedWeightsGiB, {"folders": list(checkpoints)}),
       sudo=lambda **_: (facts.box.SudoWorks, {"_sudo": False}),  # as the SSH user, not as root
       runtimes=lambda **_: (facts.box.DockerRuntimes, {}),
       rsync=_installed("rsync"), rrsync=_installed(RRSYNC))
@operation()
def thor_ready(min_l4t_release, min_memory_gib, min_free_disk_gib, weights_dir, checkpoints,
               fleet_copy=False, *, release, memory, disk, present, sudo, runtimes, rsync, rrsync):
    """Refuse a box that cannot run the model: not a Thor, too little memory or disk, no nvidia
    runtime, no sudo. Reads facts only; fails the host with one message per problem.

    + min_l4t_release: the oldest L4T release that runs the image ("38.0": JetPack 7)
    + min_memory_gib: the memory the model needs, in GiB
    + min_free_disk_gib: the disk the weights need under `weights_dir`, in GiB
    + weights_dir: where the weights go
    + checkpoints: the pinned checkpoint folders: what they already take counts as free
    + fleet_copy: whether the weights are copied between boxes (rsync and rrsync needed)

    .. code:: python

        thor_ready(name="Check the box is a Thor ready for the model", min_l4t_release="38.0",
                   min_memory_gib=110, min_free_disk_gib=100, weights_dir=layout.BOX_MODELS,
                   checkpoints=[model_dir, draft_dir])
    """
    problems = [p for p in (
        release_problem(release, min_l4t_release), memory_problem(memory, min_memory_gib),
        disk_problem(disk, present, min_free_disk_gib, weights_dir),
        sudo_problem(sudo, host.data.get("ssh_user")), runtime_problem(runtimes)) if p]
    if fleet_copy:
        missing = [c for c, found in (("rsync", rsync), (RRSYNC, rrsync)) if not found]
        if missing:
            problems.append(f"{' and '.join(missing)} not installed: weights_source copies the "
                            "weights between boxes with them: `apt-get install rsync` on the "
                            "box, or set weights_source = 'hub'")
    if problems:
        yield fail_host("preflight failed:\n  - " + "\n  - ".join(problems))
    else:
        host.noop(f"Thor ready: L4T R{release}, {memory:.0f} GiB, {disk:.0f} GiB free")
