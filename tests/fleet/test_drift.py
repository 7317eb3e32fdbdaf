"""The operator's drift story: something changed on a converged Thor; one re-run puts it right and
redoes only the part that drifted (no re-download of good shards, no rebuild of a good image, no
restart of a healthy server whose inputs did not change).

Each scenario drifts the first simulated host, re-runs the deploy on it alone, and checks from
pyinfra's --json output which operations changed, and from the box that the server kept running
(same container start), the image was not rebuilt (same id) and the hub served only what was
damaged. The scenarios run in order on the same box: each starts from the one before it, so each
also proves the previous re-run left the box converged.
"""

import json
from dataclasses import dataclass, field

import pytest

from tests.helpers import (
    SERVICE,
    SHARD,
    box,
    changed_on,
    container_started,
    deploy,
    downloads,
    hub,
    image_ref,
    model_dir,
    serves,
)
from thorfleet.facts.power import Clocks

# ------------------------------------------------------------------ the scenarios

@dataclass
class Drift:
    name: str
    command: str  # run as root on the box; {model} is the checkpoint folder
    redone: set  # operations (name fragments) the re-run must change, and nothing else...
    may_redo: set = field(default_factory=set)  # ...except these, which it may change
    restart: bool = False  # the re-run restarts the server
    fetched: list = field(default_factory=list)  # the only files the hub may send
    shown: str = ""  # a line the operator sees (without -v) while it is put right


# a sudoers rule of the test's own, removed after it: sudo logs what the SSH user sends to a file
SUDO_LOG_RULE = "/etc/sudoers.d/zz-thorfleet-test-log"
VERIFY = "serve the rendered version and prove it"
DRIFTS = [
    Drift("power mode changed", "nvpmodel -m 0 </dev/null",
          {"Set power mode", "Lock clocks again for the new power mode"},
          may_redo={"Lock clocks with jetson_clocks"}),
    Drift("clocks unlocked", "rm -rf /run/jetson_clocks/*", {"Lock clocks with jetson_clocks"}),
    Drift("unit file edited", f"sed -i 's/RestartSec=10/RestartSec=99/' "
          f"/etc/systemd/system/{SERVICE}.service",
          {f"Write the {SERVICE} unit", "Reload systemd after the unit or its drop-in changed"}),
    # the bound on the server's own restarts is a drop-in: put back with a reload, no restart
    Drift("restart bound edited",
          f"sed -i 's/StartLimitBurst=.*/StartLimitBurst=99/' "
          f"/etc/systemd/system/{SERVICE}.service.d/thorfleet-start-limit.conf",
          {"Bound the server's own restarts", "Reload systemd after the unit or its drop-in"}),
    Drift("runtime config edited",
          "sed -i 's/max_num_seqs: 1/max_num_seqs: 8/' /etc/thorfleet/vllm/vllm.yaml",
          {"Write the vLLM runtime config"}),
    Drift("secrets file mode and owner changed",
          "chmod 644 /etc/thorfleet/secrets.env && chown thor:thor /etc/thorfleet/secrets.env",
          {"Write the service secrets"}),
    Drift("service disabled", f"systemctl disable {SERVICE}", {f"Enable {SERVICE} at boot"}),
    Drift("config folder opened to all", "chmod 777 /etc/thorfleet",
          {"Create /etc/thorfleet"}),
    Drift("build context edited", "for f in /opt/thorfleet/image/*/Dockerfile; do echo '# drift' >> $f; done",
          {"Upload the image build context"}),
    Drift("derived image deleted", "docker rmi -f {image}", {"unless it exists"},
          shown="==> self-check of thorfleet-candidate"),
    Drift("weight shard deleted", "rm {model}/" + SHARD.format(3), {"Fetch and verify the checkpoint"},
          fetched=[SHARD.format(3)], shown="complete and verified in"),
    Drift("weight shard truncated", "truncate -s 1000 {model}/" + SHARD.format(5),
          {"Fetch and verify the checkpoint"}, fetched=[SHARD.format(5)]),
    Drift("weight shard corrupted",
          "printf 'XXXXXXXX' | dd of={model}/" + SHARD.format(7) + " bs=1 seek=4096 conv=notrunc",
          {"Fetch and verify the checkpoint"}, fetched=[SHARD.format(7)]),
    # Drift of kind: what is there is no longer the kind of thing thorfleet put there.
    Drift("unit file replaced by a link to a copy",
          f"cp /etc/systemd/system/{SERVICE}.service /root/unit-copy && "
          f"ln -sf /root/unit-copy /etc/systemd/system/{SERVICE}.service",
          {f"Write the {SERVICE} unit", "Reload systemd after the unit or its drop-in changed"},
          may_redo={f"Enable {SERVICE} at boot"}),
    Drift("runtime config replaced by a link to a copy",
          "cp /etc/thorfleet/vllm/vllm.yaml /root/config-copy && "
          "ln -sf /root/config-copy /etc/thorfleet/vllm/vllm.yaml",
          {"Write the vLLM runtime config"}),
    Drift("build context given to another user",
          "chown thor:thor /opt/thorfleet/image/*/Dockerfile", {"Upload the image build context"}),
    Drift("weight shard made unreadable to the other boxes",
          "chmod 600 {model}/" + SHARD.format(2) + " && chown thor {model}/" + SHARD.format(2),
          {"Fetch and verify the checkpoint"}),
    Drift("service enabled for this boot only",
          f"systemctl disable {SERVICE} && systemctl enable --runtime {SERVICE}",
          {f"Enable {SERVICE} at boot"}),
    # systemd's own mask: a link to /dev/null where the unit file was (`systemctl mask` refuses
    # while thorfleet's file is there; a runtime mask in /run is outranked by it)
    Drift("service masked and stopped",
          f"systemctl stop {SERVICE} && rm /etc/systemd/system/{SERVICE}.service && "
          f"systemctl mask {SERVICE}",
          {f"Write the {SERVICE} unit", "Reload systemd after the unit or its drop-in changed", VERIFY},
          may_redo={f"Enable {SERVICE} at boot"}, restart=True),
    Drift("service stopped", f"systemctl stop {SERVICE}", {VERIFY}, restart=True),
]


@pytest.fixture(scope="module")
def drift_box(sim_fleet, my_boxes, tmp_path_factory):
    """The first simulated host, converged, with an inventory of its own."""
    host = my_boxes[0]
    inventory = sim_fleet.write_inventory(
        tmp_path_factory.mktemp("drift") / "drift.py", hosts=[host],
        extra_data={"rollout_report_path": str(tmp_path_factory.mktemp("report") / "r.json")})
    first = deploy(inventory)
    assert first.returncode == 0, first.stderr[-4000:]
    return host, inventory


def test_a_converged_rerun_reads_the_box_in_one_round_trip(sim_fleet, drift_box):
    # every command the SSH user sends goes through sudo: count them in a log of sudo's own, which
    # sudo writes before it runs the command (its syslog lines reach the journal later, and under
    # CI's load one was once still missing 15 s after the run)
    host, inventory = drift_box
    log = "/var/log/thorfleet-test-sudo.log"
    box(sim_fleet, host, f"rm -f {log} && printf '%s\\n' 'Defaults:thor logfile={log}, !loglinelen'"
                         f" > {SUDO_LOG_RULE} && chmod 0440 {SUDO_LOG_RULE} && visudo -c >/dev/null")
    try:
        run = deploy(inventory)
        logged = box(sim_fleet, host, f"cat {log}")
    finally:
        box(sim_fleet, host, f"rm -f {SUDO_LOG_RULE} {log}")
    assert run.returncode == 0 and changed_on(run, host) == [], run.stderr[-4000:]
    sent = [line.split("COMMAND=", 1)[1][:160] for line in logged.splitlines() if "COMMAND=" in line]
    # the run lock (taken before anything is read); the operations' reads in one command;
    # `sudo -n true`, the preflight's check of sudo itself
    assert len(sent) == 3 and "/usr/bin/true" in sent, "\n".join(sent)
    assert sum("thorfleet-run-lock" in command for command in sent) == 1, "\n".join(sent)


def test_a_lone_box_lets_no_box_read_it(sim_fleet, drift_box):
    # one box, so no fleet copy: what an earlier fleet run left (copy key, authorization) goes
    host, inventory = drift_box
    access = "/etc/thorfleet/peer_key /var/lib/thorfleet-peer/.ssh/authorized_keys"
    box(sim_fleet, host, f"mkdir -p /var/lib/thorfleet-peer/.ssh && touch {access}")
    run = deploy(inventory)
    changed = changed_on(run, host)
    assert len(changed) == 2 and all("(the copy is off)" in name for name in changed), changed
    assert box(sim_fleet, host, f"ls {access} 2>&1 || true").count("No such file") == 2


def rerun_after(sim_fleet, drift_box, drift):
    """Drift the box, re-run once; return the run and what the box looked like before and after."""
    host, inventory = drift_box
    tag, image_id = image_ref(sim_fleet, host)
    started = container_started(sim_fleet, host)
    box(sim_fleet, host, drift.command.format(model=model_dir(sim_fleet), image=tag))
    faults = hub(sim_fleet, host)
    faults.forget_requests()
    run = deploy(inventory)
    return run, {"started": started, "image_id": image_id, "fetched": downloads(faults)}


@pytest.mark.parametrize("drift", DRIFTS, ids=[d.name for d in DRIFTS])
def test_one_rerun_repairs_only_what_drifted(sim_fleet, drift_box, drift):
    host, _ = drift_box
    run, before = rerun_after(sim_fleet, drift_box, drift)
    assert run.returncode == 0, run.stderr[-4000:]
    changed = changed_on(run, host)
    for fragment in drift.redone:
        assert any(fragment in name for name in changed), (fragment, changed)
    extra = [n for n in changed if not any(f in n for f in drift.redone | drift.may_redo)]
    assert extra == [], f"{drift.name}: the re-run also changed {extra}"
    # The box: serving, the image not rebuilt, the server not restarted unless it had to be.
    assert serves(sim_fleet, host, timeout=5)
    if "image" not in drift.name:
        assert image_ref(sim_fleet, host)[1] == before["image_id"]
    if drift.restart:
        assert container_started(sim_fleet, host) != before["started"]
    else:
        assert container_started(sim_fleet, host) == before["started"]
    assert before["fetched"] == drift.fetched
    assert drift.shown in run.stderr


def test_container_removed_behind_systemds_back_comes_back_by_itself(sim_fleet, drift_box):
    host, inventory = drift_box
    started = container_started(sim_fleet, host)
    restarts = box(sim_fleet, host, f"systemctl show -p NRestarts --value {SERVICE}")
    box(sim_fleet, host, f"docker rm -f {SERVICE}")
    # systemd alone (Restart=on-failure, memory gate first), before any re-run:
    assert serves(sim_fleet, host, timeout=120), sim_fleet.exec(host, f"journalctl -u {SERVICE} -n 30")
    assert container_started(sim_fleet, host) not in ("", started)
    assert int(box(sim_fleet, host, f"systemctl show -p NRestarts --value {SERVICE}")) > int(restarts)
    run = deploy(inventory)
    assert run.returncode == 0, run.stderr[-4000:]
    assert changed_on(run, host) == []


def test_a_reboot_is_repaired_by_the_box_itself_and_a_rerun_changes_nothing(sim_fleet, drift_box):
    host, inventory = drift_box
    _, image_id = image_ref(sim_fleet, host)
    sim_fleet.reboot(host)
    # clocks are locked again by thorfleet-clocks.service; the server starts at boot
    # (read as thorfleet reads it: every cpuN and GPU devfreq line pinned; EMC never is on a Thor)
    show = box(sim_fleet, host, "jetson_clocks --show")
    assert Clocks().process(show.splitlines())["locked"], show
    run = deploy(inventory)
    assert run.returncode == 0, run.stderr[-4000:]
    # a server still loading is waited for and proven: that is the only thing a re-run may do
    assert [n for n in changed_on(run, host) if VERIFY not in n] == []
    assert serves(sim_fleet, host, timeout=5)
    assert image_ref(sim_fleet, host)[1] == image_id
    again = deploy(inventory)
    assert changed_on(again, host) == [], json.dumps(again.json["results"]["totals"])
