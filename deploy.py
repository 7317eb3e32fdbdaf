"""thorfleet: turn Jetson AGX Thor boxes into supervised vLLM servers of Mistral Small 4 (NVFP4)
with EAGLE-3 speculative decoding.

    pyinfra inventory/my-fleet.py deploy.py

Every step reads the box first and changes only what differs: a re-run on a converged box changes
nothing, a drifted box is put right.
"""

from pyinfra import config, host

from thorfleet.plan import refuse_outside_the_repository, settings_for_run

# Run elsewhere, pyinfra loads neither config.py (the check before connecting) nor group_data/
# (thorfleet's strict host-key default): stop before anything is planned, saying where to run.
refuse_outside_the_repository()

from tasks import (
    cleanup,
    gateway,
    image,
    memory,
    monitor,
    power,
    preflight,
    service,
    verification,
    watch,
    weights,
)
from thorfleet.run import report
from thorfleet.settings.roles import is_gateway, is_thor

config.SUDO = True  # everything on the box is root's; the deploy user needs passwordless sudo

# Every host's group data is checked (and the secrets read) once per run, before any operation
# is planned (config.py has done it already under the CLI; here for the Python API).
settings = settings_for_run(host.state)[host.name]

# The gateway (inventory group `gateway`) first: HAProxy is in place before any Thor restarts,
# and drains each one through it. Each host's settings name what it renders for each role it has
# (gateway_role, monitor_role: its own settings, the others', or None).
if is_gateway(host):
    gateway.run(settings.gateway_role, lock=not is_thor(host))
    # a change of clients is a run of the gateways alone (--limit gateway): no Thor writes the
    # report, so this says which gateway of a pair the run left behind
    report.name_the_gateways_left_behind(host.state)
# Prometheus on each gateway, or on the host of group `monitor` (which runs nothing else).
if settings.monitor_role is not None:
    monitor.run(settings.monitor_role, lock=not (is_gateway(host) or is_thor(host)))

if is_thor(host):
    preflight.run(settings)
    power.run(settings)
    memory.run(settings)
    image.run(settings)  # first: the weights are fetched with the image's huggingface_hub
    weights.run(settings)
    box_code = service.run(settings)
    gateway.box(settings)  # with a gateway, the vLLM port answers it alone
    # before the proof: the gateway's health check asks the watchdog, and it holds off while this
    # run holds the box
    watch.run(settings, box_code)
    verification.run(settings)
    cleanup.run(settings)  # last: only a host that serves gets its old versions removed

# A table on the terminal and JSON in rollout_report_path (the Thors' setting: the report is
# theirs, the gateway's endpoint in it), written once every host has finished.
if is_thor(host):
    report.install(host.state, settings.rollout_report_path)
    report.observed(name="Record the host's state for the report", settings=settings)
