"""Power: the nvpmodel mode and the modes and GPU masks it offers, and the clocks as
`jetson_clocks --show` prints them (read as the box's watchdog reads them:
thorfleet/box/readings.py).
"""

from __future__ import annotations

from pyinfra.api import FactBase

from thorfleet.box import readings


class PowerMode(FactBase[int | None]):
    """The current nvpmodel mode id (readings.power_mode: the last line of `nvpmodel -q`, after any
    NVPM WARN lines)."""

    command = "nvpmodel -q </dev/null"
    requires_command = "nvpmodel"

    def process(self, output):
        return readings.power_mode(output)


class PowerModes(FactBase[dict]):
    """{mode id: name} nvpmodel offers on this release (`nvpmodel -p --verbose`,
    docs/facts.md "The target box")."""

    command = "nvpmodel -p --verbose </dev/null"
    requires_command = "nvpmodel"

    def process(self, output):
        return readings.power_modes(output)


class PowerMasks(FactBase[dict | None]):
    """{mode id: GPU power-gating mask} of /etc/nvpmodel.conf (readings.power_masks), or None
    without the file."""

    command = "! test -f /etc/nvpmodel.conf || cat /etc/nvpmodel.conf"

    def process(self, output):
        return readings.power_masks("\n".join(output))


class Clocks(FactBase[dict | None]):
    """`jetson_clocks --show` read as the box's watchdog reads it (readings.clock_lines): the CPU
    and GPU lines thorfleet knows, "lines" the count of lines it printed, and "locked": every CPU
    and GPU pinned (readings.locked: MinFreq == MaxFreq). None without jetson_clocks. The deploy
    reads "locked", doctor the rest: one command, one fact."""

    command = "jetson_clocks --show </dev/null"
    requires_command = "jetson_clocks"

    def process(self, output):
        kinds = readings.clock_lines(output)
        return {**kinds, "lines": len(output), "locked": readings.locked(kinds)}
