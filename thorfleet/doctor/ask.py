"""What `thorfleet doctor` asks each host: one SSH command, read only.

    queries = thor_queries(settings) | gateway_queries(settings)   # {key: (FactClass, {args})}
    line = command(queries)        # sudo -n the reads at once (snapshot.script), else as the user
    answers = answers(queries, code, stdout)   # {key: Answer}: the fact's value, or why not

The reads are the deploy's own facts (thorfleet/facts.py) and doctor's (doctor/reads.py), run in
parallel on the box by the script that batches a converged run's reads (run/snapshot.py). Whether
`sudo -n` works is asked first, as the SSH user: without it the reads run as that user, and those
that need root say so.
"""

from __future__ import annotations

from shlex import quote as q
from typing import Any, NamedTuple

from thorfleet import facts
from thorfleet.doctor import reads as doctor_reads
from thorfleet.run import pyinfra_hooks, snapshot

SUDO_MARK = "@@thorfleet-doctor sudo"


class Answer(NamedTuple):
    """One read: its value, or why there is none (exit status and the output's last line)."""

    value: Any = None
    error: str | None = None


def thor_queries(s) -> dict:
    """What doctor reads on a Thor, for its settings `s`."""
    return {
        "release": (facts.L4TRelease, {}),
        "memory": (facts.MemTotalGiB, {}),
        "disk": (facts.FreeDiskGiB, {"path": s.weights_dir}),
        "present": (facts.PinnedWeightsGiB, {"folders": [s.model_dir, s.draft_dir]}),
        "swaps": (doctor_reads.Swaps, {}),
        "drop_caches": (doctor_reads.DropCachesWritable, {}),
        "modes": (doctor_reads.PowerModes, {}),
        "masks": (doctor_reads.PowerMasks, {}),
        "mode": (facts.PowerMode, {}),
        "clocks": (doctor_reads.ClockLines, {}),
        "docker": (doctor_reads.DockerServerVersion, {}),
        "runtimes": (facts.DockerRuntimes, {}),
        "cdi": (doctor_reads.CdiDevices, {}),
        "probe": (doctor_reads.ContainerProbe, {"image": s.image_base,
                                                "gpus": s.service_docker_gpus}),
        "weights": (facts.WeightsState, {"folder": s.model_dir,
                                         "revision": s.weights_model_revision}),
        "draft": (facts.WeightsState, {"folder": s.draft_dir,
                                       "revision": s.weights_draft_revision}),
        "kernels": (doctor_reads.ServerKernels, {"service": s.service_name,
                                                 "port": s.service_port}),
        "metrics": (doctor_reads.ServerMetrics, {"port": s.service_port}),
        "thermal": (doctor_reads.ThermalReadings, {}),
    }


def gateway_queries(pair: bool) -> dict:
    """What doctor reads on a gateway host; keepalived's version only for two gateways."""
    found = {"haproxy": (doctor_reads.HaproxyBuild, {}), "mirror": (doctor_reads.AptMirror, {})}
    if pair:
        found["keepalived"] = (doctor_reads.KeepalivedVersion, {})
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
