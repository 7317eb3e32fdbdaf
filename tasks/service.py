"""Service: the runtime config, secrets and systemd unit of the vLLM container.

Nothing here restarts the server: the verification step does, only when what the server reads
differs from what it last proved to serve.
"""

from io import StringIO

from pyinfra.api import deploy
from pyinfra.operations import files, systemd

from thorfleet import operations as thor
from thorfleet.layout import BOX_BIN, BOX_CONFIG, BOX_SECRETS_ENV, BOX_VLLM_CACHE, FILES


@deploy("Service")
def run(s):
    files.directory(name="Create the config folder mounted into the container",
                    path="/etc/thorfleet/vllm", mode="755")
    files.directory(name="Create the vLLM cache folder", path=BOX_VLLM_CACHE, mode="755")
    files.directory(name="Create thorfleet's state folder", path="/var/lib/thorfleet", mode="700")
    # Every file is replaced whole (temporary name, then rename): never half-written, even on a cut.
    thor.whole_file(name=f"Write the vLLM runtime config ({s.service_profile} profile)",
                    src=StringIO(s.config_text), path=BOX_CONFIG, mode="644")
    thor.secret_file(name="Write the service secrets (root-only)", path=BOX_SECRETS_ENV,
                     content=s.secrets_env_text)
    thor.whole_file(name="Install the start/prove/roll-back tool",
                    src=str(FILES / "bin" / "thorfleet-serve"), path=f"{BOX_BIN}/thorfleet-serve",
                    mode="755")
    unit = thor.whole_file(name=f"Write the {s.service_name} unit", src=StringIO(s.unit_text),
                           path=f"/etc/systemd/system/{s.service_name}.service", mode="644")
    systemd.daemon_reload(name="Reload systemd after the unit changed", _if=unit.did_change)
    # Enabled only: starting it is the verification step's job, which proves what it starts.
    systemd.service(name=f"Enable {s.service_name} at boot", service=f"{s.service_name}.service",
                    enabled=True, running=None)
