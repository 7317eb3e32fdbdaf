"""Disk hygiene on a converged box (issue 12, item 4): what nothing serves any more is removed, the
last good version is kept, and a box whose disk is mostly its own weights still passes preflight.

Uses the first box (converged by tests/fleet/test_deploy.py, left serving the same version).
"""


from tests.helpers import SERVICE, box, changed_on, deploy, serves

OLD = "1" * 40
OLD_TAG = "000000000000"


def live_unit(sim_fleet, host):
    return box(sim_fleet, host, f"cat /etc/systemd/system/{SERVICE}.service")


def mounted(unit, target):
    return next(line.split()[1].split(":")[0] for line in unit.splitlines()
                if line.strip().startswith("-v ") and f":{target}:" in line)


def test_old_revisions_images_and_contexts_are_removed_and_the_served_ones_kept(sim_fleet, my_boxes,
                                                                                   tmp_path):
    host = my_boxes[0]
    inventory = sim_fleet.write_inventory(tmp_path / "hygiene.py", hosts=[host], extra_data={
        "rollout_report_path": str(tmp_path / "report.json")})
    assert deploy(inventory).returncode == 0
    unit = live_unit(sim_fleet, host)
    model, image = mounted(unit, "/model"), next(
        word for word in unit.split() if word.startswith("thorfleet/mistral-small4:"))
    repo = model.rsplit("/", 1)[0]
    context = box(sim_fleet, host, "ls -d /opt/thorfleet/image/*/").split()
    # what an earlier version left: its revision (and a cut download of it), its image, its context
    old = [f"{repo}/{OLD}", f"{repo}/.{OLD}.partial", f"/opt/thorfleet/image/{OLD_TAG}"]
    box(sim_fleet, host, " && ".join(f"mkdir -p {d} && echo x > {d}/f" for d in old)
        + f" && docker tag {image} thorfleet/mistral-small4:{OLD_TAG}")
    run = deploy(inventory)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Remove old revisions, images and build contexts" in " ".join(changed_on(run, host))
    assert box(sim_fleet, host, " ; ".join(f"test -e {d} && echo {d}" for d in old) + "; true") == ""
    assert box(sim_fleet, host, f"docker images -q thorfleet/mistral-small4:{OLD_TAG}") == ""
    # the served version is untouched and still serves
    assert box(sim_fleet, host, f"test -d {model} && docker images -q {image}") != ""
    assert box(sim_fleet, host, "ls -d /opt/thorfleet/image/*/").split() == context
    assert serves(sim_fleet, host, timeout=5)
    assert changed_on(deploy(inventory), host) == []


def test_a_converged_box_on_a_small_disk_passes_its_rerun(sim_fleet, my_boxes, tmp_path):
    """A 64 MiB disk for weights_dir and a threshold of 0.05 GiB (the sim's weights are ~15 MiB,
    the real ones 66 GiB of a 100 GiB threshold): after the first converge less than the threshold
    is free, and only the weights already there make up the difference."""
    host = my_boxes[0]
    disk = "/srv/thorfleet-small-disk"
    box(sim_fleet, host, f"mkdir -p {disk} && mount -t tmpfs -o size=64m tmpfs {disk}")
    small = sim_fleet.write_inventory(tmp_path / "small.py", hosts=[host], extra_data={
        "rollout_report_path": str(tmp_path / "report.json"), "weights_dir": disk,
        "preflight_min_free_disk_gib": 0.05})
    try:
        first = deploy(small)
        assert first.returncode == 0, first.stderr[-3000:]
        free_mib = int(box(sim_fleet, host, f"df -Pk {disk} | awk 'NR==2 {{print $4}}'")) / 1024
        assert free_mib < 0.05 * 1024, free_mib  # a rule on free space alone would refuse it now
        rerun = deploy(small)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert changed_on(rerun, host) == []
    finally:
        back = deploy(sim_fleet.write_inventory(tmp_path / "back.py", hosts=[host], extra_data={
            "rollout_report_path": str(tmp_path / "report.json")}))
        sim_fleet.exec(host, f"umount {disk}")
        assert back.returncode == 0, back.stderr[-3000:]
