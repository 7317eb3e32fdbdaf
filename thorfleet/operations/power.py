"""Power: nvpmodel's power mode, set without ever hanging on its reboot prompt, and the clocks
locked at the mode's maximum."""

from __future__ import annotations

import time

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation

from thorfleet import facts
from thorfleet.operations.commands import fail_host, q, sh
from thorfleet.run import pyinfra_hooks
from thorfleet.run.runstate import run_state
from thorfleet.run.snapshot import reads
from thorfleet.settings.layout import BOX_REBOOT_MARKER


@reads(current=lambda **_: (facts.power.PowerMode, {}))
@operation()
def power_mode(mode, allow_reboot=False, reboot_timeout=900, *, current):
    """Set the nvpmodel power mode, never hanging on its reboot prompt.

    Modes that switch live are set at once. A mode that needs a reboot prints a YES/no prompt:
    nvpmodel gets a closed stdin, so it changes nothing, and the host fails with a clear message
    unless ``allow_reboot`` is set; then nvpmodel is answered YES and the box is waited for.

    + mode: the nvpmodel mode id
    + allow_reboot: whether thorfleet may reboot the box for a mode that needs it
    + reboot_timeout: seconds to wait for the box to come back from that reboot

    .. code:: python

        power_mode(name="Set power mode 1 (120 W)", mode=1)
    """
    if current is None:
        yield fail_host("nvpmodel not found: this box is not a Jetson with JetPack")
        return
    if current == mode:
        host.noop(f"power mode is already {mode}")
        return
    # stdin closed: a mode that needs a reboot prints its prompt, reads EOF and changes nothing.
    yield StringCommand(f"nvpmodel -m {q(str(int(mode)))} </dev/null || true")

    def needs_reboot(state, host):
        # after nvpmodel ran: a fresh read, never one from before the command
        if host.get_fact(facts.power.PowerMode) == mode:
            return True
        if not allow_reboot:
            return run_state(state).fail(
                host, f"power mode {mode} needs a reboot and power_allow_reboot is False: set "
                "power_allow_reboot = True to let thorfleet reboot it, or run "
                f"`sudo nvpmodel -m {mode}` and answer YES yourself")
        return _reboot_for_mode(state, host, mode, reboot_timeout)

    yield FunctionCommand(needs_reboot, (), {})


def _reboot_for_mode(state, host, mode, timeout):
    """Answer nvpmodel's prompt with YES (the operator allowed it) and wait for the box."""
    host.run_shell_command(sh("touch", BOX_REBOOT_MARKER), _sudo=True)
    answer = f"(sleep 2; echo YES | nvpmodel -m {q(str(int(mode)))}) </dev/null >/dev/null 2>&1 &"
    host.run_shell_command(sh("sh", "-c", answer), _sudo=True)
    time.sleep(5)
    # /run is emptied by a boot: the marker gone means the box really rebooted
    if pyinfra_hooks.wait_for_reboot(host, lambda h: not h.get_fact(facts.box.RebootMarker), timeout):
        if host.get_fact(facts.power.PowerMode) == mode:
            return True
        return run_state(state).fail(host, f"rebooted but power mode is not {mode}")
    return run_state(state).fail(
        host, f"did not come back within {timeout}s of the reboot for power mode {mode} "
        "(power_reboot_timeout_s)")


@reads(clocks=lambda **_: (facts.power.Clocks, {}))
@operation()
def clocks_locked(*, clocks):
    """Lock the clocks at the power mode's maximum with jetson_clocks, unless they already are.

    .. code:: python

        clocks_locked(name="Lock clocks")
    """
    if clocks is None:
        yield fail_host("jetson_clocks not found: this box is not a Jetson with JetPack")
        return
    if clocks["locked"]:
        host.noop("clocks are already locked")
        return
    yield "jetson_clocks"
