"""The operator rolls changes through a fleet that is serving.

Restarts go a batch at a time (the canary group first), each batch proven before the next; a batch
that fails stops the rollout, puts the failed host back on its last good version and leaves the
others serving what they had. A prober inside every box watches /health all the while. At the end a
report names every host, even one that dropped out early and one that could not be reached.

Uses the boxes beyond the first two (the deploy and drift stories use those), at most three. They
are converged when the module starts and left as its last story leaves them: the story after these
(tests/fleet/test_shared_image.py) rolls them onto a new image itself, so going back first would
cost CI a rolling restart of three boxes for nothing.
"""

import json

import pytest

from sim.prober import Prober
from tests.helpers import deploy
from thorfleet.run.report import FIELDS

UNREACHABLE = "thor-99"  # nothing listens on its SSH port (22099)


@pytest.fixture(scope="module")
def hosts(sim_fleet, my_boxes):
    mine = my_boxes
    if len(mine) < 2:
        pytest.skip("the rollout stories need at least two boxes beyond the first two")
    return mine


@pytest.fixture(scope="module")
def roll(sim_fleet, hosts, tmp_path_factory):
    """roll(name, hosts=..., canary=[...], **group_data) -> (run, report): one deploy as the
    operator runs it. The module's boxes start converged (whatever an earlier story left)."""
    workdir = tmp_path_factory.mktemp("rollout")

    def run(name, on=None, canary=(), **group_data):
        report_path = workdir / f"{name}-report.json"
        inventory = sim_fleet.write_inventory(
            workdir / f"{name}.py", hosts=on or hosts,
            extra_data={"rollout_report_path": str(report_path), **group_data})
        if canary:
            with inventory.open("a") as f:
                f.write(f"canary = {list(canary)!r}\n")
        done = deploy(inventory)
        report = json.loads(report_path.read_text())["hosts"] if report_path.exists() else None
        return done, report

    first, _ = run("converge")
    assert first.returncode == 0, first.stderr[-4000:]
    return run


def batches(done):
    """[[hosts restarted or proven in batch 1], [... batch 2], ...] from pyinfra's JSON results."""
    ops = [op for op in done.json["results"]["operations"] if "| Batch " in op["name"]]
    return [sorted(op["success"] + op["error"]) for op in ops]


def since_active(sim_fleet, host):
    """When the server's current process started (a restart changes it)."""
    return sim_fleet.exec(host, "systemctl show -p ActiveEnterTimestampMonotonic --value "
                                "thorfleet-vllm")[1].strip()


def test_a_change_rolls_two_hosts_at_a_time_and_never_more_are_down(roll, hosts):
    with Prober(hosts) as probe:
        done, report = roll("batch-of-two", rollout_batch=2,
                            service_extra_env={"THORFLEET_ROLLOUT_TEST": "two-at-a-time"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert batches(done) == [sorted(hosts[i:i + 2]) for i in range(0, len(hosts), 2)]
    # Every host went down once (its restart) and came back; never more than a batch at once.
    down = {o.host for o in probe.outages()}
    assert down == set(hosts), probe.outages()
    assert all(o.recovered for o in probe.outages())
    assert probe.most_down_at_once() <= 2
    fingerprints = {report[h]["serving_fingerprint"] for h in hosts}
    assert len(fingerprints) == 1 and None not in fingerprints
    assert all(report[h]["health"] and report[h]["chat"] and not report[h]["error"] for h in hosts)


def test_the_canary_goes_first_then_one_host_at_a_time(roll, hosts):
    canary = hosts[-1]
    with Prober(hosts) as probe:
        done, _ = roll("canary-then-one", canary=[canary], rollout_batch=1,
                       rollout_canary_group="canary",
                       service_extra_env={"THORFLEET_ROLLOUT_TEST": "canary-first"})
    assert done.returncode == 0, done.stderr[-4000:]
    assert batches(done) == [[canary]] + [[h] for h in hosts[:-1]]
    assert {o.host for o in probe.outages()} == set(hosts)
    assert probe.most_down_at_once() == 1
    # The canary was back up before anyone else went down.
    canary_up = max(o.end for o in probe.outages() if o.host == canary)
    assert all(o.start >= canary_up for o in probe.outages() if o.host != canary)


def test_a_failing_canary_stops_the_rollout_and_the_report_names_every_host(
        sim_fleet, roll, hosts):
    canary, others = hosts[0], hosts[1:]
    dropped = others[-1]  # fails its preflight: drops out before anything changes
    serving = others[:-1] or []
    before = {h: since_active(sim_fleet, h) for h in hosts}
    proven = {h: sim_fleet.exec(h, "cat /var/lib/thorfleet/proven-fingerprint")[1] for h in hosts}

    inventory_hosts = [canary, *serving, (dropped, {"preflight_min_free_disk_gib": 10**6}),
                       UNREACHABLE]
    # The change makes vLLM pick the slow Marlin FP4 GEMM (an operator's env override): the canary's
    # proof must refuse it.
    done, report = roll("failing-canary", on=inventory_hosts, canary=[canary],
                        rollout_canary_group="canary",
                        service_extra_env={"VLLM_NVFP4_GEMM_BACKEND": "marlin"})
    assert done.returncode != 0
    assert "marlin_utils_fp4" in done.stderr

    # The canary is back on its last good version, serving; nobody else was restarted.
    assert sim_fleet.exec(canary, "cat /var/lib/thorfleet/proven-fingerprint")[1] == \
        proven[canary], done.stderr[-3000:]
    assert since_active(sim_fleet, canary) != before[canary]
    for host in serving + [dropped]:
        assert since_active(sim_fleet, host) == before[host], f"{host} was restarted"
        assert sim_fleet.exec(host, "cat /var/lib/thorfleet/proven-fingerprint")[1] == proven[host]
    # A host the rollout did not reach keeps its proven files live: a crash or reboot before the
    # next run restarts what it serves, not the untested change.
    for host in serving:
        _, unit = sim_fleet.exec(host, "grep -c VLLM_NVFP4_GEMM_BACKEND=marlin "
                                       "/etc/systemd/system/thorfleet-vllm.service")
        assert unit.strip() == "0", f"{host} has the unproven unit live"

    # The report: every field for every host, and each host's story in its error.
    assert set(report) == {*hosts, UNREACHABLE}
    for host, row in report.items():
        assert set(row) == set(FIELDS), host
    assert "marlin_utils_fp4" in report[canary]["error"]
    assert report[canary]["health"] and report[canary]["chat"]
    assert report[canary]["service"] == "active"
    for host in serving:
        assert "not restarted" in report[host]["error"] and canary in report[host]["error"]
        assert report[host]["health"] and report[host]["chat"]
    assert "preflight" in report[dropped]["error"]
    assert report[dropped]["l4t_release"] and report[dropped]["health"]  # read after dropping out
    assert report[dropped]["changed"] == []
    assert "could not connect" in report[UNREACHABLE]["error"]
    # nothing was read from it: only the run's own bookkeeping (when, not stale) is filled in
    assert all(report[UNREACHABLE][f] is None for f in FIELDS
               if f not in ("changed", "error", "stale", "as_of"))


def test_a_canary_that_drops_out_before_its_restart_stops_the_rollout(sim_fleet, roll, hosts):
    # As seen on a fleet: the canary's Docker lost its nvidia runtime, so it failed its preflight
    # and left the run before anything was restarted. It never proved the change: nobody else
    # may be restarted into it. (Here its disk threshold is out of reach: the same drop-out.)
    canary, others = hosts[0], hosts[1:]
    before = {h: since_active(sim_fleet, h) for h in hosts}
    proven = {h: sim_fleet.exec(h, "cat /var/lib/thorfleet/proven-fingerprint")[1] for h in hosts}

    done, report = roll("canary-drops-out",
                        on=[(canary, {"preflight_min_free_disk_gib": 10**6}), *others],
                        canary=[canary], rollout_canary_group="canary", rollout_batch=1,
                        service_extra_env={"THORFLEET_ROLLOUT_TEST": "canary-drops-out"})
    assert done.returncode != 0
    assert "preflight" in report[canary]["error"]
    for host in hosts:
        assert since_active(sim_fleet, host) == before[host], f"{host} was restarted"
        assert sim_fleet.exec(host, "cat /var/lib/thorfleet/proven-fingerprint")[1] == proven[host]
    for host in others:
        assert "not restarted" in report[host]["error"], report[host]["error"]
        assert f"canary {canary} dropped out" in report[host]["error"], report[host]["error"]
        assert report[host]["health"] and report[host]["chat"]
        # held: its proven unit is live again, not the change nothing proved
        _, unit = sim_fleet.exec(host, "grep -c THORFLEET_ROLLOUT_TEST=canary-drops-out "
                                       "/etc/systemd/system/thorfleet-vllm.service")
        assert unit.strip() == "0", f"{host} has the unproven unit live"
