"""The fleet copy of the weights: a box copies what other boxes verified, over the fleet's own
network (rsync over SSH, read-only on the giving box), checks every file against the hub's sha256,
and asks the hub only for what no box gives.

Boxes 1 and 7 (tests/conftest.py BOXES), converged by tests/fleet/test_deploy.py, where 7 already
copied its weights from 1. Each story runs the deploy limited to box 7, as an operator adding a
box does (without -v: a transfer's lines, the box-side tool's and its progress, are shown as they
come), and reads the hub's log of what it sent box 7.
"""

import re
import threading
import time

import pytest

from tests.helpers import SERVICE, SHARD, box, deploy, downloads, hub, model_dir, serves
from thorfleet.settings.layout import BOX_WEIGHTS

FLIP = ("python3 -c 'import os, sys; p = sys.argv[1]; s = os.stat(p); f = open(p, \"r+b\"); "
        "f.seek(s.st_size // 2); b = f.read(16); f.seek(s.st_size // 2); "
        "f.write(bytes(x ^ 0x5A for x in b)); f.close(); os.utime(p, ns=(s.st_atime_ns, "
        "s.st_mtime_ns))' {}")  # bit rot: the bytes change, size and mtime do not


@pytest.fixture(scope="module")
def pair(sim_fleet, my_boxes, tmp_path_factory):
    seed, late = my_boxes
    folder = tmp_path_factory.mktemp("fleet-weights")
    inventory = sim_fleet.write_inventory(folder / "pair.py", hosts=my_boxes, extra_data={
        "rollout_report_path": str(folder / "report.json"), "weights_progress_interval_s": 1})
    run = deploy(inventory)
    assert run.returncode == 0, run.stderr[-4000:]
    return seed, late, inventory


def complete(sim_fleet, host):
    revision = model_dir(sim_fleet).rsplit("/", 1)[-1]
    return '"complete": true' in box(sim_fleet, host, f"python3 {BOX_WEIGHTS} verify --dir "
                                                      f"{model_dir(sim_fleet)} --revision {revision}")


def never_had_it(sim_fleet, host):
    """The box as it comes to the fleet: no server running, no checkpoint."""
    box(sim_fleet, host, f"systemctl stop {SERVICE} && rm -rf {model_dir(sim_fleet)}")


def test_a_box_added_later_copies_from_the_fleet_not_the_hub(sim_fleet, pair):
    _, late, inventory = pair
    never_had_it(sim_fleet, late)
    faults = hub(sim_fleet, late)
    faults.forget_requests()
    run = deploy(inventory, "--limit", late)
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"complete and verified in {model_dir(sim_fleet)}, copied from the fleet" in run.stderr
    assert downloads(faults) == []  # the file list only: no byte of weights from the hub
    assert complete(sim_fleet, late) and serves(sim_fleet, late, timeout=30)


def test_a_corrupted_peer_copy_is_refused_and_fetched_from_the_hub(sim_fleet, pair):
    seed, late, inventory = pair
    shard = SHARD.format(5)
    rotten = f"{model_dir(sim_fleet)}/{shard}"
    box(sim_fleet, late, f"rm {rotten}")
    box(sim_fleet, seed, FLIP.format(rotten))
    faults = hub(sim_fleet, late)
    faults.forget_requests()
    try:
        run = deploy(inventory, "--limit", late)
    finally:
        box(sim_fleet, seed, FLIP.format(rotten))  # flipped back: the seed's own copy is whole
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"{shard} from thorfleet-{seed} does not match its sha256" in run.stderr
    assert downloads(faults) == [shard]  # every other file was had from the seed
    assert complete(sim_fleet, late)


def test_a_seed_that_fails_mid_copy_does_not_stall_the_box(sim_fleet, pair):
    seed, late, inventory = pair
    never_had_it(sim_fleet, late)
    parent, revision = model_dir(sim_fleet).rsplit("/", 1)
    staging = f"{parent}/.{revision}.partial"  # where the copy lands until all of it is verified
    # A slow link out of the seed (1 Mbit/s), so the copy is under way when the seed goes.
    box(sim_fleet, seed, "tc qdisc add dev eth0 root tbf rate 1mbit burst 32kbit latency 400ms")
    faults = hub(sim_fleet, late)
    faults.forget_requests()
    result = []
    worker = threading.Thread(target=lambda: result.append(deploy(inventory, "--limit", late)))
    worker.start()
    copied = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and len(copied) < 3:
            out = sim_fleet.exec(late, f"ls {staging} 2>/dev/null")[1]
            copied = [name for name in out.split() if name.startswith("consolidated-")]
            time.sleep(0.5)
        assert len(copied) >= 3, "the copy from the seed never got going"
        sim_fleet.cut(seed)  # the seed stops answering mid-copy
        worker.join(600)
    finally:
        sim_fleet.heal(seed)
        sim_fleet.exec(seed, "tc qdisc del dev eth0 root")
    run = result[0]
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"rsync from thorfleet-{seed} stopped" in run.stderr
    # the operator saw it going, under the box's name: done, total, rate (and time left)
    progress = re.compile(rf"\[{late}\]\s+thorfleet: \S+ from thorfleet-{seed} "
                          r"[\d.]+ of [\d.]+ MB \(\d+%\), [\d.]+ MB/s")
    assert progress.search(run.stderr), run.stderr[-4000:]
    assert complete(sim_fleet, late) and serves(sim_fleet, late, timeout=60)
    fetched = downloads(faults)
    assert fetched, "the hub gave nothing: the seed was not cut mid-copy"
    # rsync copies in name order, in place: the last file listed may have been in flight (the hub
    # then sends it whole); those before it were whole, and are not fetched again
    whole = sorted(copied)[:-1]
    assert not set(whole) & set(fetched), (whole, fetched)
