"""The image is built once per run and shipped to the other boxes: through the registry the
operator names (issue 12, item 2), or without one from the run's first box over SSH (issue 22).
The run's first host builds, the others pull or load it, check it on arrival (inputs label, and
the ID the first host built) and tag it; a box that has it gets nothing; every box ends with the
same image ID; a transfer cut short leaves the box building its own.

Uses the rollout boxes (3-5), last in their group, and leaves them on the second image (the think
prefill off): every story before it converges them itself, and going back would cost CI a rolling
restart of three boxes. The edits that break it: no
image_registry handling in tasks/image.py (every box builds); for a box added later, a first host
that never pushes an image it already has (that box builds its own); no image copy without a
registry (every box builds); a load whose failure is not followed by a build (the cut box has no
image); a load that sends the layers the box has (the whole image travels).
"""

import re

from tests.helpers import SERVICE, box, changed_on, deploy, serves

# The sim's registry, where the boxes already pull the base from.
REGISTRY = "thorfleet-registry:5000/thorfleet"
# Inputs none of the stories before these gave the boxes: a new image, without it in any registry.
SECOND_IMAGE = {"image_think_prefill": False}
# The cut link: the builder's `docker save` killed once it has written CUT_BYTES (its wchar in
# /proc), so the transfer stops mid-way and not before its first byte; the count at the kill is
# left in /run/cut-at for the story to check.
CUT_BYTES = 64 << 20
CUT_SAVE = f"""#!/bin/sh
for i in $(seq 3000); do
    for p in $(pgrep -f '^docker save'); do
        written=$(awk '/^wchar/ {{print $2}}' /proc/$p/io 2>/dev/null)
        if [ "${{written:-0}}" -ge {CUT_BYTES} ]; then
            echo "$written" > /run/cut-at; kill -9 "$p"; exit 0
        fi
    done
    sleep 0.1
done
"""


def image_of(sim_fleet, host):
    unit = box(sim_fleet, host, f"cat /etc/systemd/system/{SERVICE}.service")
    return next(word for word in unit.split() if word.startswith("thorfleet/mistral-small4:"))


def test_one_box_builds_the_others_pull_the_same_image_and_a_rerun_changes_nothing(sim_fleet,
                                                                                 my_boxes, tmp_path):
    hosts = my_boxes
    report = {"rollout_report_path": str(tmp_path / "report.json")}
    # new inputs (the think prefill off): an image none of the three boxes has yet
    shared = sim_fleet.write_inventory(tmp_path / "shared.py", hosts=hosts, extra_data={
        **report, "image_registry": REGISTRY, **SECOND_IMAGE})
    run = deploy(shared)
    assert run.returncode == 0, run.stderr[-4000:]
    changed = {h: " ".join(changed_on(run, h)) for h in hosts}
    assert [h for h in hosts if "Image | Build" in changed[h]] == [hosts[0]], changed
    assert [h for h in hosts if "Image | Pull" in changed[h]] == hosts[1:], changed
    tag = image_of(sim_fleet, hosts[0])
    ids = {h: box(sim_fleet, h, f"docker images -q --no-trunc {tag}") for h in hosts}
    # one image, by ID: a box that fell back to building its own would have another
    assert len(set(ids.values())) == 1 and "" not in ids.values(), ids
    # and each box checked that ID on arrival: the one the first host pushed in this run
    for h in hosts[1:]:
        assert f"{tag} pulled from {REGISTRY}, ID {ids[h][7:19]}" in run.stderr, run.stderr[-3000:]
    assert all(serves(sim_fleet, h, timeout=5) for h in hosts)
    again = deploy(shared)
    assert [changed_on(again, h) for h in hosts] == [[], [], []]

    # A registry that does not have it (the fleet was converged before image_registry was
    # set), and a box without the image (a box added later): the first host, which has it,
    # pushes it for that box, which pulls it; nobody builds.
    later = sim_fleet.write_inventory(tmp_path / "later.py", hosts=hosts, extra_data={
        **report, "image_registry": f"{REGISTRY}-later", **SECOND_IMAGE})
    box(sim_fleet, hosts[2], f"docker rmi -f {tag} >/dev/null")  # its server keeps running
    run = deploy(later)
    assert run.returncode == 0, run.stderr[-4000:]
    changed = {h: " ".join(changed_on(run, h)) for h in hosts}
    assert "Image | Build" in changed[hosts[0]] and changed[hosts[1]] == "", changed
    assert changed[hosts[2]].startswith("Image | Pull"), changed  # nothing restarted
    assert f"pushed to {REGISTRY}-later for {hosts[2]}" in run.stderr, run.stderr[-3000:]
    assert f"{tag} pulled from {REGISTRY}-later, ID {ids[hosts[0]][7:19]}" in run.stderr
    assert "==> building" not in run.stderr
    assert box(sim_fleet, hosts[2], f"docker images -q --no-trunc {tag}") == ids[hosts[0]]


def test_without_a_registry_a_box_that_lacks_the_image_loads_it_from_the_first_box(sim_fleet,
                                                                                   my_boxes,
                                                                                   tmp_path):
    # (A bare fleet's first install building once and loading twice: tests/fleet/test_bases.py.)
    hosts = my_boxes
    inventory = sim_fleet.write_inventory(tmp_path / "fleet.py", hosts=hosts, extra_data={
        "rollout_report_path": str(tmp_path / "report.json"), **SECOND_IMAGE})
    converged = deploy(inventory)  # as the story above left them (no restart): no registry now
    assert converged.returncode == 0, converged.stderr[-4000:]
    tag = image_of(sim_fleet, hosts[0])
    built = box(sim_fleet, hosts[0], f"docker images -q --no-trunc {tag}")

    # a box added later (here: one whose image went; its server runs on, untagged): it alone
    # loads it from the run's first host, checked against that host's ID; the others get nothing
    box(sim_fleet, hosts[2], f"docker rmi -f {tag} >/dev/null")
    run = deploy(inventory)
    assert run.returncode == 0, run.stderr[-4000:]
    changed = {h: " ".join(changed_on(run, h)) for h in hosts}
    assert changed[hosts[0]] == changed[hosts[1]] == "", changed
    assert changed[hosts[2]].startswith("Image | Load"), changed
    assert re.search(rf"loaded {re.escape(tag)} from \S+, ID {built[7:19]}", run.stderr), \
        run.stderr[-4000:]
    # only what it lacks travels: it still holds the layers its running server stands on
    assert "of its layers are here already" in run.stderr, run.stderr[-4000:]
    sent, size = map(int, re.search(r"thorfleet-image: sent (\d+) bytes of \S+ \(image (\d+) "
                                    r"bytes\)", run.stderr).groups())
    assert sent < size / 100, (sent, size)
    assert "==> building" not in run.stderr
    assert box(sim_fleet, hosts[2], f"docker images -q --no-trunc {tag}") == built
    again = deploy(inventory)
    assert [changed_on(again, h) for h in hosts] == [[], [], []]

    # the link drops while the image streams (the first box's save is killed once it has written
    # 64 MiB, so bytes did arrive): the box throws away what arrived, builds its own, and serves
    box(sim_fleet, hosts[2], f"docker rmi -f {tag} >/dev/null")
    # (run by sh: the box's /run is a tmpfs Docker mounts noexec)
    box(sim_fleet, hosts[0], f"rm -f /run/cut-at; cat > /run/cut-save <<'EOF'\n{CUT_SAVE}EOF\n"
                             "nohup setsid sh /run/cut-save >/dev/null 2>&1 &")
    try:
        run = deploy(inventory)
    finally:
        box(sim_fleet, hosts[0], "pkill -f '^sh /run/cut-save' || true")
    cut_at = int(box(sim_fleet, hosts[0], "cat /run/cut-at"))
    size = int(box(sim_fleet, hosts[0], f"docker image inspect -f '{{{{.Size}}}}' {tag}"))
    assert CUT_BYTES <= cut_at < size, (cut_at, size)  # mid-way: after the first bytes, before all
    assert run.returncode == 0, run.stderr[-4000:]
    assert f"{tag} not loaded: the transfer from" in run.stderr, run.stderr[-4000:]
    assert f"building {tag} here instead" in run.stderr
    assert run.stderr.count("==> built ") == 1
    assert box(sim_fleet, hosts[2], f"docker images -q {tag}") != ""
    assert serves(sim_fleet, hosts[2], timeout=5)
