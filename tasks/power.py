"""Power: the nvpmodel mode from group data, and clocks locked now and at every boot."""

from pyinfra.api import deploy
from pyinfra.operations import server, systemd

from thorfleet.operations import files, power
from thorfleet.settings.layout import BOX_UNIT_DIR, CLOCKS_UNIT, THOR_FILES


@deploy("Power")
def run(settings):
    mode = power.power_mode(
        name=f"Set power mode {settings.power_mode} (nvpmodel, never waiting on its reboot prompt)",
        mode=settings.power_mode,
        allow_reboot=settings.power_allow_reboot,
        reboot_timeout=settings.power_reboot_timeout_s,
    )
    # jetson_clocks does not survive a reboot: a oneshot unit ordered after nvpmodel.service does.
    unit = files.whole_file(
        name="Install the unit that locks clocks at every boot",
        src=str(THOR_FILES / "systemd" / CLOCKS_UNIT),
        path=f"{BOX_UNIT_DIR}/{CLOCKS_UNIT}",
        mode="644",
    )
    systemd.daemon_reload(name="Reload systemd after the clocks unit changed", _if=unit.did_change)
    files.unit_enabled(name="Enable the clocks unit", unit=CLOCKS_UNIT)
    power.clocks_locked(name="Lock clocks with jetson_clocks")
    # A new mode has new maximum clocks: lock them again after a mode change.
    server.shell(name="Lock clocks again for the new power mode", commands=["jetson_clocks"],
                 _if=mode.did_change)
