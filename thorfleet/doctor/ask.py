"""What `thorfleet doctor` asks each host: one SSH command, read only.

    queries = thor_queries(settings) | gateway_queries(settings)   # {key: (FactClass, {args})}
    line = command(queries)        # sudo -n the reads at once (snapshot.script), else as the user
    answers = answers(queries, code, stdout)   # {key: Answer}: the fact's value, or why not

The reads are facts of thorfleet/facts, the deploy's own and those only doctor asks for, run in
parallel on the box by the script that batches a converged run's reads (run/snapshot.py). Whether
`sudo -n` works is asked first, as the SSH user: without it the reads run as that user, and those
that need root say so.
"""

from __future__ import annotations

from shlex import quote as q
from typing import Any, NamedTuple

from thorfleet import facts
from thorfleet.run import pyinfra_hooks, snapshot

SUDO_MARK = "@@thorfleet-doctor sudo"


class Answer(NamedTuple):
    """One read: its value, or why there is none (exit status and the output's last line)."""

    value: Any = None
    error: str | None = None


def thor_queries(s) -> dict:
    """What doctor reads on a Thor, for its settings `s`."""
    return {
        "release": (facts.box.L4TRelease, {}),
        "memory": (facts.box.MemTotalGiB, {}),
        "disk": (facts.box.FreeDiskGiB, {"path": s.weights_dir}),
        "present": (facts.serving.PinnedWeightsGiB, {"folders": [s.model_dir, s.draft_dir]}),
        "swaps": (facts.box.Swaps, {}),
        "drop_caches": (facts.box.DropCachesWritable, {}),
        "modes": (facts.power.PowerModes, {}),
        "masks": (facts.power.PowerMasks, {}),
        "mode": (facts.power.PowerMode, {}),
        "clocks": (facts.power.Clocks, {}),
        "docker": (facts.box.DockerServerVersion, {}),
        "runtimes": (facts.box.DockerRuntimes, {}),
        "cdi": (facts.box.CdiDevices, {}),
        "probe": (facts.box.ContainerProbe, {"image": s.image_base,
                                                "gpus": s.service_docker_gpus}),
        "weights": (facts.serving.WeightsState, {"folder": s.model_dir,
                                         "revision": s.weights_model_revision}),
        "draft": (facts.serving.WeightsState, {"folder": s.draft_dir,
                                       "revision": s.weights_draft_revision}),
        "kernels": (facts.serving.ServerKernels, {"service": s.service_name,
                                                 "port": s.service_port}),
        "metrics": (facts.serving.ServerMetrics, {"port": s.service_port}),
        "thermal": (facts.box.ThermalReadings, {}),
    }


def gateway_queries(pair: bool) -> dict:
    """What doctor reads on a gateway host; keepalived's version only for two gateways."""
    found = {"haproxy": (facts.gateway.HaproxyBuild, {}), "mirror": (facts.box.AptMirror, {})}
    if pair:
        found["keepalived"] = (facts.gateway.KeepalivedVersion, {})
    return found


def command(queries: dict) -> str:
    """The one command: whether `sudo -n` works (a MARK line), then every read at once, as root
    when it does."""
    script = snapshot.script(list(queries.values()))
    return (f"if sudo -n true 2>/dev/null; then echo {q(SUDO_MARK + ' yes')}; "
            f"sudo -n sh -c {q(script)}; "
            f"else echo {q(SUDO_MARK + ' no')}; sh -c {q(script)}; fi")


def answers(queries: dict, stdout: str) -> tuple[bool | None, dict]:
    """(whether sudo worked, {key: Answer}) from the command's output. A read that exited non-zero
    or whose fact could not read its output is an Answer with the error; one that printed
    nothing is its fact's default (pyinfra's rule: absence)."""
    lines = stdout.splitlines()
    sudo = None
    if lines and lines[0].startswith(SUDO_MARK + " "):
        sudo = lines.pop(0).endswith(" yes")
    outputs = snapshot.outputs(lines)
    found = {}
    for index, (key, (fact, _)) in enumerate(queries.items()):
        status, output = outputs.get(index, ("?", []))
        if status == "127":
            found[key] = Answer(error="command not found on the box")
        elif status != "0":
            said = next((ln.strip() for ln in reversed(output) if ln.strip()), "no output")
            found[key] = Answer(error=f"exit {status}: {said[:200]}")
        else:
            try:
                found[key] = Answer(pyinfra_hooks.fact_value(fact, output))
            except Exception as error:  # noqa: BLE001 - a box's answer we cannot read is a row
                found[key] = Answer(error=f"unreadable answer: {error or type(error).__name__}")
    return sudo, found
