"""Verification: the service serves the rendered version and passes its checks, the rollout a
batch at a time; then the decode rate measured and held to the fleet's."""

from __future__ import annotations

import json
import statistics
import time

from pyinfra import host
from pyinfra.api import FunctionCommand, operation

from thorfleet import facts
from thorfleet.layout import BOX_BENCH, BOX_SERVE
from thorfleet.operations.commands import sh
from thorfleet.runstate import run_state
from thorfleet.snapshot import reads


@reads(state=lambda s, **_: (
    facts.ServerState, {"service": s.service_name, "port": s.service_port}))
@operation()
def serving(s, wait_for=(), first_install=False, *, state):
    """The service runs the version rendered from group data and passes its checks.

    A different fingerprint (unit, config, secrets, image) or a stopped service is restarted and
    proven, and rolled back to the last good version if the proof fails. A running but unhealthy
    one (still loading after a reboot) is waited for. A healthy one is left alone. When a host of an
    earlier batch (`wait_for`) or a first install failed its start in this run, this one is not
    restarted. With `first_install`, only a host that never proved a version is started: no
    serving capacity is at stake there, so such hosts start together, before the batches.

    .. code:: python

        serving(name="Start the first installs", s=settings, first_install=True)
        serving(name="Serve and prove it", s=settings)
    """
    run = run_state(host.state)
    # before this run restarts anything: a host with no proven version is a first install
    run.proven_before.setdefault(host.name, state.get("proven_fingerprint"))

    def serve(command, *extra):
        return sh("python3", BOX_SERVE, command, "--service", s.service_name,
                  "--port", s.service_port, "--timeout", s.service_health_timeout_s, *extra)

    if first_install:
        # a host that proved a version before (serving, loading after a reboot, or stopped) is
        # restarted or proven in its batch: only a bare one starts here
        if state.get("proven_fingerprint"):
            host.noop("it has proven a version before: its batch restarts or proves it")
            return
        run.first_starts.add(host.name)
        yield _checked(serve("activate", "--fingerprint", s.fingerprint))
        return

    if state.get("proven_fingerprint") == s.fingerprint and state.get("active") == "active":
        if state.get("healthy"):
            host.noop(f"{s.service_name} is serving fingerprint {s.fingerprint[:12]}")
        else:
            yield _checked(serve("prove"))
        return
    stopped_by = sorted(run.failed_restarts.intersection({*wait_for, *run.first_starts}))
    if stopped_by:
        # The new unit and config are already on disk: put the serving version's back, so a crash
        # or reboot before the next run does not start what was never proven. The host is held,
        # not failed: recorded for the report, the run goes on.
        yield _held(f"not restarted: the rollout stopped after {', '.join(stopped_by)} failed")
        yield serve("hold")
        return
    yield _checked(serve("activate", "--fingerprint", s.fingerprint))


def _held(message):
    """A command that records why the host was left as it was, for the report (never fails)."""

    def note(state, host):
        run_state(state).note_error(host.name, message)
        return True

    return FunctionCommand(note, (), {})


def _checked(command):
    """Run a thorfleet-serve command; on failure fail the host with its reason and stop the
    rollout's later batches."""

    def run(state, host):
        ok, output = host.run_shell_command(command, _sudo=True)
        if not ok:
            run_state(state).failed_restarts.add(host.name)
            said = output.stdout_lines or output.stderr_lines  # its reason, or a traceback
            return run_state(state).fail(host, " ".join(said[-3:]),
                                         details=output.stdout_lines + output.stderr_lines)
        return ok

    return FunctionCommand(run, (), {})


def wants_benchmark(when, proven_before):
    """Whether a host is benchmarked: `when` is rollout_benchmark ("always", "never" or
    "first-install"), `proven_before` the fingerprint it had proven before the run (None on a
    first install)."""
    return when == "always" or (when == "first-install" and not proven_before)


@operation()
def benchmark(port, when="always"):
    """Measure the host's decode rate the seed's way (thorfleet-bench: /v1/completions, 512 tokens,
    a warm-up then 3 runs) and record tok/s, time to first token and EAGLE's acceptance for the
    fleet gate and the report, when `when` (rollout_benchmark) asks for it; "first-install" reads
    what `serving`, run before it, found. A benchmark that cannot run fails the host.

    .. code:: python

        benchmark(name="Benchmark the decode rate", port=8002, when="first-install")
    """
    if not wants_benchmark(when, run_state(host.state).proven_before.get(host.name)):
        host.noop(f"not benchmarked: it served a proven version before this run ({when})")
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
                host, "too slow: " + "; ".join(problems) + " (EAGLE not engaged? the seed: "
                "~33.7 tok/s with EAGLE, ~17.5 without)")
        return True

    yield FunctionCommand(gate, (), {})

