"""Verification: (re)start the server when its inputs changed, prove it serves, and benchmark it.

Hosts that never served a version start first, all together: none of them takes serving capacity
away. Restarts then roll through the fleet: a batch at a time (rollout_batch), the canary group
first; a batch (or a first install) that fails its checks, or a canary that drops out before
proving the change, stops the rollout and the hosts after it keep their current version
(thorfleet/run/rollout.py says what each turn does, and why).

The benchmark (files/thor/bin/thorfleet-bench: /v1/completions, 512 tokens, a warm-up then 3 runs)
runs after the proof when rollout_benchmark asks for it: "always", "never", or "first-install" (the
default: a host with no proven version before this run). Once every such host has measured, the
fleet gate fails those below rollout_bench_min_fraction of the fleet median or below
rollout_bench_min_toks.
"""

from pyinfra import host, inventory
from pyinfra.api import deploy

from thorfleet.operations import files, verification
from thorfleet.run import rollout
from thorfleet.settings.layout import BOX_BENCH, THOR_FILES
from thorfleet.settings.roles import gateways, is_thor


@deploy("Verification")
def run(settings):
    files.whole_file(name="Install the benchmark tool", src=str(THOR_FILES / "bin" / "thorfleet-bench"),
                     path=BOX_BENCH, mode="755")
    service = {"service": settings.service_name, "port": settings.service_port,
               "fingerprint": settings.fingerprint,
               "health_timeout": settings.service_health_timeout_s,
               # with gateways, a restart is drained on each first (the gateway hosts' names)
               "gateway": tuple(h.name for h in gateways(inventory)) or None,
               "pool": settings.gateway_pool,  # its backend there: one per model served
               "drain_timeout": settings.rollout_drain_timeout_s,
               # at most rollout_batch boxes out for a restart, whichever runs restart them
               "restart_slots": settings.rollout_batch,
               # a killed run's slot lapses after a restart's whole time
               "lease": settings.restart_s}
    first_installs = verification.serving(
        name="First installs: start every host that never served a version, together (no "
             "serving capacity at stake)", first_install=True, **service)
    # what each turn does, and what a failed one means for the later batches: rollout.py
    plan = rollout.plan(inventory, settings.rollout_batch, settings.rollout_canary_group,
                        serves=is_thor, model_of=lambda h: h.data.get("service_profile"))
    for index in host.loop(range(len(plan.batches))):
        if host.name in plan.batches[index]:
            verification.serving(
                name=f"Batch {index + 1}/{len(plan.batches)}: serve the rendered version and prove "
                     "it (health, kernels, chat, reasoning, tools)",
                earlier=plan.before(index), canaries=plan.canaries, **service)
    if settings.rollout_benchmark != "never":
        verification.benchmark(
            name="Benchmark the decode rate (the seed's method: /v1/completions, 512 tokens, "
                 "warm-up + 3 runs)",
            port=settings.service_port, when=settings.rollout_benchmark,
            first_installs_step=first_installs)
        verification.benchmark_gate(
            name="Fleet benchmark gate (rollout_bench_min_fraction of the median, "
                 "rollout_bench_min_toks)",
            min_fraction=settings.rollout_bench_min_fraction, floor=settings.rollout_bench_min_toks)
