"""thorfleet: turn Jetson AGX Thor boxes into supervised vLLM servers of Mistral Small 4 (NVFP4)
with EAGLE-3 speculative decoding.

    pyinfra inventory/my-fleet.py deploy.py

Every step reads the box first and changes only what differs: a re-run on a converged box changes
nothing, a drifted box is put right.
"""

from pyinfra import config, host, state

from tasks import cleanup, image, memory, power, preflight, service, verification, weights
from thorfleet import report
from thorfleet.settings import settings_for_run

config.SUDO = True  # everything on the box is root's; the deploy user needs passwordless sudo

# Every host's group data is checked (and the secrets read) once per run, before any operation
# is planned (config.py has done it already under the CLI; here for the Python API).
pyinfra_state = state._get_module()  # this run's State: it holds the settings and the run state
s = settings_for_run(pyinfra_state)[host.name]

preflight.run(s)
power.run(s)
memory.run(s)
image.run(s)  # first: the weights are fetched with the image's huggingface_hub
weights.run(s)
service.run(s)
verification.run(s)
cleanup.run(s)  # last: only a host that serves gets its old versions removed

# A table on the terminal and JSON in rollout_report_path, written once every host has finished.
report.install(pyinfra_state, s.rollout_report_path)
report.observed(name="Record the host's state for the report", s=s)
