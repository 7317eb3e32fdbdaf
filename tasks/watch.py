"""Watch: the box's watchdog proves the server keeps generating between runs.

vLLM's /health stays 200 on a wedged engine (it asks only whether the engine core died), so the
watchdog (files/thor/bin/thorfleet-watchdog, a unit of its own) checks that the server generates:
a 1-token completion when idle, growing token counters while requests run. After
watchdog_failures failed checks it restarts the server through its unit (the memory gate runs, as
at any start), with backoff and a cap per hour; never a server the operator stopped, never while
a deploy holds the box. Its /healthy is what the gateway's health check asks, and its /metrics
the box's figures Prometheus scrapes.

Installed before the verification step: the gateway's health check asks the watchdog, so a box
is in rotation as soon as its proven server answers; the watchdog does nothing while this run
holds the box. A watchdog setting changed restarts the watchdog, never the server; its port is a
socket unit's, so a restart never closes it (files/thor/systemd/thorfleet-watchdog.socket.j2).
"""

from io import StringIO

from pyinfra.api import deploy
from pyinfra.operations import systemd

from thorfleet.operations import files, system
from thorfleet.settings.layout import (
    BOX_UNIT_DIR,
    BOX_WATCHDOG,
    THOR_FILES,
    WATCHDOG_SOCKET,
    WATCHDOG_UNIT,
)

# The watchdog's unit, rendered with the host's settings by its operation (files.template).
UNIT_TEMPLATE = "thor/systemd/thorfleet-watchdog.service.j2"


@deploy("Watchdog")
def run(settings, box_code=None):
    """`box_code`: the operation that installed what the box's programs share (tasks/service.py:
    with the parsers the laptop's facts use too), which the watchdog imports: a change restarts
    it."""
    tool = files.whole_file(name="Install the watchdog",
                            src=str(THOR_FILES / "bin" / "thorfleet-watchdog"), path=BOX_WATCHDOG,
                            mode="755")
    unit = files.template(name="Write the watchdog's unit (its watchdog_* settings)",
                          src=UNIT_TEMPLATE,
                          path=f"{BOX_UNIT_DIR}/{WATCHDOG_UNIT}", settings=settings)
    port = files.whole_file(
        name=f"Write the watchdog's socket: port {settings.watchdog_port}, held across its restarts",
        src=StringIO(settings.watchdog_socket_text), path=f"{BOX_UNIT_DIR}/{WATCHDOG_SOCKET}",
        mode="644")
    systemd.daemon_reload(name="Reload systemd after the watchdog's unit or socket changed",
                          _if=lambda: unit.did_change() or port.did_change())
    files.unit_enabled(name="Enable the watchdog's port at boot", unit=WATCHDOG_SOCKET)
    files.unit_enabled(name="Enable the watchdog at boot", unit=WATCHDOG_UNIT)
    system.listening_anew(name="Listen on the watchdog's new port", socket=WATCHDOG_SOCKET,
                          service=WATCHDOG_UNIT, _if=port.did_change)
    system.reloaded(name="Restart the watchdog for its new code or unit (the server stays up)",
                     unit=WATCHDOG_UNIT, restart=True,
                     _if=lambda: any(op.did_change() for op in (tool, unit, port, box_code) if op))
    system.running(name="The watchdog's port is held", unit=WATCHDOG_SOCKET)
    system.running(name="The watchdog is running", unit=WATCHDOG_UNIT)
