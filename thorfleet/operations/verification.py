"""Verification: the service serves the rendered version and passes its checks, the rollout a
batch at a time; then the decode rate measured and held to the fleet's."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import FunctionCommand, operation

from thorfleet import facts
from thorfleet.operations.commands import sh
from thorfleet.run import pyinfra_hooks, rollout
from thorfleet.run.runstate import run_state
from thorfleet.run.snapshot import read, reads
from thorfleet.settings.layout import (
    BOX_BENCH,
    BOX_SERVE,
    GATEWAY_ADMIN_SOCKET,
    GATEWAY_BACKEND,
    GATEWAY_ROTATION,
    GATEWAY_SERVER_STATE,
)


@reads(served=lambda service, port, **_: (
    facts.serving.ServerState, {"service": service, "port": port}))
@operation()
def serving(service, port, fingerprint, health_timeout, earlier=(), canaries=(),
            first_install=False, gateway=None, pool=GATEWAY_BACKEND, drain_timeout=120,
            restart_slots=1, lease=0, *, served):
    """The service runs the version rendered from group data and passes its checks, at this host's
    turn of the rollout. What the turn does (noop, prove, activate or hold) and why is
    rollout.decide's; this reads the box and the run for it and yields the commands it names.

    + service: the systemd unit's name (service_name)
    + port: the port it serves on (service_port)
    + fingerprint: the version rendered from group data (Settings.fingerprint)
    + health_timeout: seconds a start may take to answer /health (service_health_timeout_s)
    + earlier: the hosts whose batch comes before this host's (rollout.Plan.before)
    + canaries: the canary group's hosts (rollout.Plan.canaries)
    + first_install: the first installs' step, before the batches
    + gateway: the gateway hosts' names (one, or the two sharing gateway_virtual_ip), if the
      inventory has any: a restart of a box in their rotation is drained on each first and put
      back once proven; a failed proof leaves it out
    + pool: the box's backend at the gateways (Settings.gateway_pool: one per model served)
    + drain_timeout: how long the gateway waits for the box's sessions (rollout_drain_timeout_s)
    + restart_slots: how many boxes may be out for a restart at once, counted at the gateway
      across every run (rollout_batch)
    + lease: seconds a restart may hold its slot (a killed run's lapses then)

    What the run records (a first start, a failed restart, why a host was held) is recorded by the
    commands, once, when they execute: pyinfra runs this body when it plans and again when it
    executes, and only the second time knows what the earlier turns did.

    .. code:: python

        serving(name="Start the first installs", service="thorfleet-vllm", port=8002,
                fingerprint=s.fingerprint, health_timeout=1200, first_install=True)
        serving(name="Batch 2/3: serve and prove it", service="thorfleet-vllm", port=8002,
                fingerprint=s.fingerprint, health_timeout=1200, earlier=["thor-1"],
                canaries={"thor-1"})
    """
    decision = rollout.decide(served, fingerprint, first_install, _turns_before(earlier),
                              canaries)

    def serve(command, *extra):
        return sh("python3", BOX_SERVE, command, "--service", service, "--port", port,
                        "--timeout", health_timeout, *extra)

    # Where the box stands at the gateway (None: no gateway, or not one of its servers yet).
    gateway = _names(gateway)
    admin = gateway_admin(gateway, host.name) if gateway else None
    rotation = Rotation(gateway, admin, drain_timeout, restart_slots, lease, pool) \
        if gateway else None
    if decision.action == rollout.NOOP:
        if admin == "drain":  # an earlier run's failed proof: it serves what it proved since
            yield rotation_step("ready", gateway, pool)
        else:
            host.noop(decision.why)
    elif decision.action == rollout.PROVE:
        yield _checked(serve("prove"), rotation=rotation)
    elif decision.action == rollout.ACTIVATE:
        yield _checked(serve("activate", "--fingerprint", fingerprint), first_start=first_install,
                       rotation=rotation, restarts=True)
    else:
        yield _record_hold(decision.why)
        yield serve("hold")


def _names(gateway) -> tuple[str, ...]:
    """The gateways as a tuple of host names (one name is one gateway)."""
    return (gateway,) if isinstance(gateway, str) else tuple(gateway or ())


def _turns_before(earlier):
    """{host name: what its turn did} of the turns before this host's in this run, the hosts of
    `earlier` batches and the first installs: FAILED as their commands recorded it, else PASSED
    while pyinfra still runs the host, DROPPED once pyinfra has failed it (it could not connect, or
    an operation before failed), OUTSIDE when it never was in the run (--limit)."""
    state = host.state
    records = run_state(state)
    names = {*earlier, *records.first_starts}
    if not names:
        return {}
    active = {h.name for h in pyinfra_hooks.active_hosts(state)}
    left = {h.name for h in pyinfra_hooks.failed_hosts(state)}

    def did(name):
        if name in records.failed_restarts:
            return rollout.FAILED
        if name in active:
            return rollout.PASSED
        return rollout.DROPPED if name in left else rollout.OUTSIDE

    return {name: did(name) for name in names}


def _record_hold(why):
    """A command that records why the host was not restarted, for the report (never fails)."""

    def record_hold(state, host):
        run_state(state).note_error(host.name, why)
        return True

    return FunctionCommand(record_hold, (), {})


@dataclass(frozen=True)
class Rotation:
    """The gateways a host is served through (their names), the host's admin state there when
    planned (None: not one of their servers yet), how long a drain waits for the host's
    sessions, and the restart slots its drains take (how many, held how long at most), counted at
    the first gateway that answers."""

    gateways: tuple[str, ...]
    admin: str | None
    drain_timeout: int
    slots: int = 1
    lease: int = 0
    backend: str = GATEWAY_BACKEND


def _checked(command, first_start=False, rotation=None, restarts=False):
    """A command that runs thorfleet-serve's `command` (activate or prove); on failure it fails the
    host with its reason and records a failed restart, which stops the rollout's later batches.
    With `first_start`, it first records the host as a first install: one that fails stops every
    batch. With a `rotation`, a box the gateway sends requests to is drained there before it
    `restarts` (activate; a proof restarts nothing), put back once proven, and left out when it
    fails."""

    def serve_and_check(state, host):
        records = run_state(state)
        if first_start:
            records.first_starts.add(host.name)
        if rotation and restarts and rotation.admin == "ready" and \
                not _rotate(state, host, rotation, "drain", rotation.drain_timeout,
                            slot=(rotation.slots, rotation.lease, records.holder)):
            return False
        ok, output = host.run_shell_command(command, _sudo=True)
        if not ok:
            records.failed_restarts.add(host.name)
            said = output.stdout_lines or output.stderr_lines  # its reason, or a traceback
            if rotation and rotation.admin is not None:
                _rotate(state, host, rotation, "pull")
                records.out_of_rotation[host.name] = " ".join(said[-1:]) or "its proof failed"
            return records.fail(host, " ".join(said[-3:]),
                                details=output.stdout_lines + output.stderr_lines)
        if rotation and rotation.admin is not None and (restarts or rotation.admin != "ready"):
            return _rotate(state, host, rotation, "ready")
        return ok

    return FunctionCommand(serve_and_check, (), {})


def _rotate(state, host, rotation, action, timeout=None, slot=None):
    """Set `host` to `action` at each gateway; False (the host failed, saying why) if none could
    (a restart no gateway drained would cut its clients). A drain for a restart takes one of the
    restart `slot`s at the first gateway that answers, waiting while other runs hold them. A
    gateway that cannot be reached while another did it is named in the report: it is not level
    until a run reaches it (its keepalived check keeps it backup meanwhile)."""
    done, missed = [], []
    for gateway in rotation.gateways:
        ok, said = on_gateway(state, gateway, rotation_command(
            action, rotation.backend, host.name, timeout, None if done else slot))
        if not ok:
            missed.append((gateway, said))
            continue
        done.append(gateway)
        host.log_styled(f"thorfleet: {gateway}: {' '.join(said[-1:])}")
        if action == "ready" and any("in maintenance (the operator's)" in line for line in said):
            # the operator's: left out, and the report says so
            run_state(state).out_of_rotation[host.name] = "in maintenance (the operator's)"
        elif action == "ready":
            run_state(state).out_of_rotation.pop(host.name, None)
    if not done:
        gateway, said = missed[0]
        return run_state(state).fail(host, f"the gateway {gateway} could not set it {action}: "
                                           f"{' '.join(said[-2:])}", details=said)
    for gateway, said in missed:
        run_state(state).note_error(gateway, f"not level: could not set {host.name} {action} "
                                             f"here ({' '.join(said[-1:])}); a run that reaches "
                                             "it brings it level")
        host.log_styled(f"thorfleet: {gateway} not reached: {host.name} not set {action} there",
                        fg="yellow")
    return True


# --- the gateway's rotation, around a restart ------------------------------------------------------

def rotation_command(action, backend, server, timeout=None, slot=None):
    """thorfleet-rotation's command line for the gateway box, for `server` of HAProxy's
    `backend`; `slot`: (how many restarts at once, the lease's seconds, this run's name) for a
    restart's drain."""
    words = [GATEWAY_ROTATION, GATEWAY_ADMIN_SOCKET, GATEWAY_SERVER_STATE, action,
             backend, server]
    return sh(*words, *([timeout] if timeout is not None else []), *(slot or ()))


def on_gateway(state, gateway_name, command):
    """(ok, lines) of `command` run on the gateway host as root, from another host's operation:
    the gateway may be outside this run's --limit, then it is connected for this."""
    gateway = state.inventory.get_host(gateway_name)
    try:
        ok, output = pyinfra_hooks.connected(gateway, "to take a box out of rotation"
                                             ).run_shell_command(command, _sudo=True)
    except Exception as error:  # noqa: BLE001 - any connector error: the box is not restarted
        return False, [f"{gateway_name} unreachable: {error}"]
    return ok, output.stdout_lines + output.stderr_lines


def rotation_step(action, gateways, pool=GATEWAY_BACKEND):
    """A command that sets this host `action` (ready, after an earlier run left it out) at the
    gateways, in its `pool` there; one that fails fails the host."""

    def rotate(state, host):
        return _rotate(state, host, Rotation(_names(gateways), None, 0, backend=pool), action)

    return FunctionCommand(rotate, (), {})


def gateway_admin(gateways, server):
    """This host's admin state at the gateway ("ready", "drain", "maint"), read from the first
    gateway this run has connected when planning (None: it has no such server yet, as on a first
    install)."""
    hosts = [host.state.inventory.get_host(name) for name in _names(gateways)]
    gateway = next((h for h in hosts if h.connected), hosts[0])
    found = read(facts.gateway.GatewayServers, gateway)  # as root: the API is
    return (found.get(server) or {}).get("admin")


def wants_benchmark(when, first_install):
    """Whether a host is benchmarked: `when` is rollout_benchmark ("always", "never" or
    "first-install"), `first_install` whether it started in this run without a version it had
    proven before."""
    return when == "always" or (when == "first-install" and first_install)


@operation()
def benchmark(port, when="always", first_installs_step=None):
    """Measure the host's decode rate the recipe's way (thorfleet-bench: /v1/completions, 512
    tokens, a warm-up then 3 runs) and record tok/s, time to first token and EAGLE's acceptance
    for the fleet gate and the report, when `when` (rollout_benchmark) asks for it. A benchmark
    that cannot run fails the host.

    + port: the port the service answers on (service_port)
    + when: "always", "never" or "first-install": a host the first installs' step starts
    + first_installs_step: what serving(first_install=True) returned for this host: it will
      start the host (planned), or it did (executed)

    .. code:: python

        first = serving(name="Start the first installs", ..., first_install=True)
        benchmark(name="Benchmark the decode rate", port=8002, when="first-install",
                  first_installs_step=first)
    """
    step = first_installs_step
    started = step is not None and pyinfra_hooks.changes(step)
    if not wants_benchmark(when, started):
        host.noop(f"not benchmarked: it did not start as a first install in this run ({when})")
        return

    def measure(state, host):
        ok, output = host.run_shell_command(sh("python3", BOX_BENCH, "--port", port),
                                            _sudo=True)
        said = output.stdout_lines + output.stderr_lines
        try:
            result = json.loads(output.stdout_lines[-1])
        except (IndexError, ValueError):
            result = {"error": " / ".join(line.strip() for line in said[-3:]) or "no output"}
        result["as_of"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        run_state(state).benchmarks[host.name] = result
        if not ok or result.get("error"):
            return run_state(state).fail(host, f"benchmark failed: {result.get('error')}",
                                         details=said[-6:])
        acceptance = result.get("eagle_acceptance")
        host.log_styled(f"thorfleet: {result['tok_s']:.1f} tok/s, first token after "
                        f"{result['ttft_s']:.2f}s, EAGLE acceptance "
                        f"{'-' if acceptance is None else f'{acceptance:.2f}'}")
        return True

    yield FunctionCommand(measure, (), {})


def bench_verdict(rate, rates, min_fraction, floor):
    """(fleet median, [why `rate` fails the gate]) for one host's tok/s among the fleet's `rates`:
    below `floor` tok/s, or below `min_fraction` of the median."""
    median = statistics.median(rates)
    problems = []
    if rate < floor:
        problems.append(f"{rate:.1f} tok/s is below the floor of {floor} tok/s "
                        "(rollout_bench_min_toks)")
    if rate < min_fraction * median:
        problems.append(f"{rate:.1f} tok/s is {rate / median:.2f}x the fleet median "
                        f"{median:.1f} tok/s, below {min_fraction} (rollout_bench_min_fraction)")
    return median, problems


@operation()
def benchmark_gate(min_fraction, floor):
    """Fail a benchmarked host that is slower than the fleet: below `floor` tok/s or below
    `min_fraction` of the median of every host benchmarked in this run. Runs after every host's
    benchmark operation (pyinfra runs an operation on all hosts before the next one).

    .. code:: python

        benchmark_gate(name="Fleet benchmark gate", min_fraction=0.8, floor=27)
    """

    if host.name not in run_state(host.state).benchmarks:
        host.noop("not benchmarked in this run: nothing to judge")
        return

    def gate(state, host):
        results = run_state(state).benchmarks
        mine = results.get(host.name) or {}
        rates = [r["tok_s"] for r in results.values() if r.get("tok_s") is not None]
        if mine.get("tok_s") is None or not rates:
            return True
        median, problems = bench_verdict(mine["tok_s"], rates, min_fraction, floor)
        mine.update(fleet_median_tok_s=round(median, 2),
                    vs_median=round(mine["tok_s"] / median, 3) if median else None,
                    gate_problems=problems, passed=not problems)
        if problems:
            return run_state(state).fail(
                host, "too slow: " + "; ".join(problems) + " (EAGLE not engaged? a Thor decodes "
                "~33.7 tok/s with EAGLE, ~17.5 without)")
        return True

    yield FunctionCommand(gate, (), {})

