"""Service: the runtime config, secrets and systemd unit of the vLLM container.

Nothing here restarts the server: the verification step does, only when what the server reads
differs from what it last proved to serve.
"""

from io import StringIO

from pyinfra.api import deploy
from pyinfra.operations import systemd

from thorfleet.operations import files
from thorfleet.settings.layout import (
    BOX_CONFIG,
    BOX_CONFIG_DIR,
    BOX_FORMER_LIB,
    BOX_LAYOUT_ENV,
    BOX_LIB,
    BOX_PROOF_IMAGE,
    BOX_SECRETS_ENV,
    BOX_SERVE,
    BOX_STATE,
    BOX_UNIT_DIR,
    BOX_USAGE_DIR,
    BOX_VLLM_CACHE,
    ROOT,
    START_LIMIT_DROPIN,
    THOR_FILES,
    box_unit,
    layout_env_text,
)


@deploy("Service")
def run(settings):
    """The server's unit, config and secrets, and the box's programs; returns the operation that
    installs what those programs share."""
    files.directory(name="Create the config folder mounted into the container",
                    path=BOX_CONFIG_DIR, mode="755")
    files.directory(name="Create the vLLM cache folder", path=BOX_VLLM_CACHE, mode="755")
    files.directory(name="Create thorfleet's state folder", path=BOX_STATE, mode="700")
    # Every file is replaced whole (temporary name, then rename): never half-written, even on a cut.
    files.whole_file(name=f"Write the vLLM runtime config ({settings.service_profile} profile)",
                     src=StringIO(settings.config_text), path=BOX_CONFIG, mode="644")
    files.secret_file(name="Write the service secrets (root-only)", path=BOX_SECRETS_ENV,
                      src=StringIO(settings.secrets_env_text))
    # thorfleet-serve spells no path of the box: it reads them here (thorfleet/settings/layout.py's).
    files.whole_file(name="Write the box layout the start/prove/roll-back tool reads",
                     src=StringIO(layout_env_text()), path=BOX_LAYOUT_ENV, mode="644")
    # first: thorfleet-serve (and the watchdog, the benchmark) import it from beside them. With it
    # the token counter the server loads (its code is in the fingerprint: a new one restarts it).
    box_code = files.tree(name="Install the Python the box's programs share (one package)",
                          src=str(ROOT / "thorfleet" / "box"), dest=BOX_LIB)
    for former in BOX_FORMER_LIB:
        files.absent(name=f"No {former} (now in the package)", path=former)
    # Each client's tokens: the journal the server's middleware writes and the watchdog reads.
    files.directory(name="Create the folder of each client's tokens (root-only)",
                    path=BOX_USAGE_DIR, mode="700")
    files.whole_file(name="Install the start/prove/roll-back tool",
                     src=str(THOR_FILES / "bin" / "thorfleet-serve"), path=BOX_SERVE, mode="755")
    files.whole_file(name="Install the picture the proof shows a vision box",
                     src=str(THOR_FILES / "bin" / "thorfleet-proof.png"), path=BOX_PROOF_IMAGE,
                     mode="644")
    unit = files.whole_file(name=f"Write the {settings.service_name} unit",
                            src=StringIO(settings.unit_text),
                            path=box_unit(settings.service_name), mode="644")
    dropin_dir = f"{BOX_UNIT_DIR}/{settings.service_name}.service.d"
    files.directory(name="Create the server unit's drop-in folder", path=dropin_dir, mode="755")
    limit = files.whole_file(
        name=f"Bound the server's own restarts: {2 * settings.watchdog_max_restarts_per_hour + 4} "
             "starts an hour (a drop-in: a new cap restarts no server)",
        src=StringIO(settings.start_limit_text), path=f"{dropin_dir}/{START_LIMIT_DROPIN}",
        mode="644")
    systemd.daemon_reload(name="Reload systemd after the unit or its drop-in changed",
                          _if=lambda: unit.did_change() or limit.did_change())
    # Enabled only: starting it is the verification step's job, which proves what it starts.
    files.unit_enabled(name=f"Enable {settings.service_name} at boot",
                       unit=f"{settings.service_name}.service")
    return box_code  # the watchdog imports it: a new one restarts it (tasks/watch.py)
