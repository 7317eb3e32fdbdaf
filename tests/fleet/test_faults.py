"""The operator's fault story: boxes crash, lose their network, hubs break downloads, disks fill,
bases move, a new version does not start. Each time the host ends up serving a known-good version
or stopped with a clear reason, never half-way, and a re-run finishes the job.

Faults are done to this module's box (tests/conftest.py BOXES), and the box that is down is one
no other story uses; every test leaves its box converged. Hub faults and the hub's request log
are this box's alone (by its address), so stories on other boxes run meanwhile.
"""

import json
import subprocess
import sys
import time

import pytest

from sim import fleet as sim
from sim import registry
from sim.base import ensure_base_image
from sim.base.testing import variant
from sim.rootfs import ensure_rootfs
from tests.helpers import (
    ROOT,
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


@pytest.fixture(scope="module")
def fault_box(sim_fleet, my_boxes, tmp_path_factory):
    """The second simulated host, converged; `inventory(**data)` writes one for it alone."""
    host = my_boxes[0]
    folder = tmp_path_factory.mktemp("faults")
    report = folder / "report.json"

    def inventory(host_data=None, **group):
        return sim_fleet.write_inventory(
            folder / "faults.py", hosts=[(host, host_data or {})],
            extra_data={"rollout_report_path": str(report), **group})

    first = deploy(inventory())
    assert first.returncode == 0, first.stderr[-4000:]
    return host, inventory, report


def failed_alone(run, host):
    """The run failed on `host` (with one host, pyinfra ends with "No hosts remaining" and no JSON)."""
    assert run.returncode != 0
    if run.stdout.strip():
        assert run.failed_hosts == [host]
    else:
        assert "No hosts remaining" in run.stderr
    return True


def converge(inventory):
    """The operator's re-run after the fault is gone: it must converge the host."""
    run = deploy(inventory)
    assert run.returncode == 0, run.stderr[-4000:]
    return run


def proven(sim_fleet, host):
    return box(sim_fleet, host, "cat /var/lib/thorfleet/proven-fingerprint")


LIVE = (f"/etc/systemd/system/{SERVICE}.service", "/etc/thorfleet/vllm/vllm.yaml",
        "/etc/thorfleet/secrets.env")


def lose_the_session(sim_fleet, host):
    """The laptop's connection is gone: packets dropped (a cut), and the box's sshd gives up on
    the session (what it does once TCP or its ClientAlive probes time out): the session's
    processes lose their channel."""
    sim_fleet.cut(host)
    sim_fleet.exec(host, "pkill -KILL -f 'sshd: thor'")


def background_deploy(inventory):
    argv = [sys.executable, "-m", "pyinfra", "-y", str(inventory), "deploy.py"]
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)


WATCHER = """\
import ctypes, os, struct, subprocess, sys
IN_MODIFY, IN_CREATE = 0x2, 0x100
libc = ctypes.CDLL("libc.so.6", use_errno=True)
fd = libc.inotify_init()
libc.inotify_add_watch(fd, b"/home/thor/.thorfleet-upload", IN_CREATE)
for path in sys.argv[2:]:
    libc.inotify_add_watch(fd, path.encode(), IN_MODIFY)
os.read(fd, 4096)  # blocks until the first write of a new version
subprocess.run(["pkill", "-STOP", "-u", "thor"])
subprocess.run(["iptables", "-I", *sys.argv[1].split()])
subprocess.run(["pkill", "-KILL", "-f", "sshd: thor"])
subprocess.run(["pkill", "-KILL", "-u", "thor"])
open("/run/thorfleet-test-cut", "w").close()
"""


def test_ssh_cut_while_the_live_files_are_replaced_leaves_each_whole(sim_fleet, fault_box):
    host, inventory, _ = fault_box
    # Drift the unit, the config and the secrets: the run must replace all three.
    box(sim_fleet, host, f"echo '# drifted' >> {LIVE[0]}; "
                         f"sed -i 's/max_num_seqs: 1/max_num_seqs: 4/' {LIVE[1]}; "
                         f"echo 'DRIFT=1' >> {LIVE[2]}")
    drifted = box(sim_fleet, host, f"sha256sum {' '.join(LIVE)}").splitlines()
    # A watcher on the box, woken by the kernel (inotify) at the first write of a new version
    # anywhere: a file created in thorfleet's staging folder or, for a writer that is not atomic,
    # a live file itself modified (opened with O_TRUNC: already empty). At that instant it freezes
    # the deploy user's processes, drops the link and has sshd give up on the session.
    sim_fleet.exec(host, "install -d -o thor -g thor -m 700 /home/thor/.thorfleet-upload; "
                         "rm -f /run/thorfleet-test-cut")
    box(sim_fleet, host, f"cat > /run/thorfleet-test-watch.py <<'EOF'\n{WATCHER}EOF")
    subprocess.Popen(["docker", "exec", sim.box_name(sim.index_of(host)), "python3",
                      "/run/thorfleet-test-watch.py", " ".join(sim.CUT_RULE), *LIVE],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = background_deploy(inventory())
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and sim_fleet.exec(host, "test -e /run/thorfleet-test-cut")[0]:
            time.sleep(0.5)
        assert sim_fleet.exec(host, "test -e /run/thorfleet-test-cut")[0] == 0, "never cut"
        time.sleep(3)
        run.kill()  # the operator gives up on the hung run
        run.wait()
        # Every live file is whole: the drifted one, or the new one (checked after the re-run).
        at_cut = box(sim_fleet, host, f"sha256sum {' '.join(LIVE)}").splitlines()
    finally:
        sim_fleet.exec(host, "pkill -f thorfleet-test-watch")
        sim_fleet.heal(host)
    converge(inventory())
    converged = box(sim_fleet, host, f"sha256sum {' '.join(LIVE)}").splitlines()
    for line, before, after in zip(at_cut, drifted, converged):
        assert line in (before, after), f"half-written at the cut: {line}"
    assert changed_on(converge(inventory()), host) == []
    assert serves(sim_fleet, host, timeout=5)


def test_ssh_lost_during_the_health_wait_the_box_finishes_and_the_rerun_converges(
        sim_fleet, fault_box):
    host, inventory, _ = fault_box
    change = inventory(service_extra_env={"VLLM_LOGGING_LEVEL": "INFO"})
    started = container_started(sim_fleet, host)
    run = background_deploy(change)
    try:
        # the new version has started and is loading: /health not answering yet
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (
                container_started(sim_fleet, host) not in ("", started)
                and sim_fleet.exec(host, "pgrep -f 'thorfleet-serve activate'")[0] == 0
                and sim_fleet.exec(host, "curl -sf http://127.0.0.1:8002/health")[0] != 0):
            time.sleep(0.3)
        assert time.monotonic() < deadline, "the restart was never caught loading"
        lose_the_session(sim_fleet, host)
        run.kill()
        run.wait()
    finally:
        sim_fleet.heal(host)
    # The operator re-runs at once, while the box is still proving the new version on its own:
    # the re-run waits for that, finds it proven and serving, and restarts nothing.
    again = converge(change)
    assert not [n for n in changed_on(again, host) if "serve the rendered version" in n], \
        changed_on(again, host)
    assert serves(sim_fleet, host, timeout=5)
    assert changed_on(converge(inventory()), host)  # back to the fixture's version
    assert changed_on(converge(inventory()), host) == []


def test_idle_ssh_sessions_send_keepalives(sim_fleet, fault_box):
    host, inventory, _ = fault_box
    # sshd logs each keepalive request it receives at DEBUG1
    box(sim_fleet, host, "echo 'LogLevel DEBUG1' > /etc/ssh/sshd_config.d/zz-test-debug.conf && "
                         "systemctl reload ssh")
    try:
        since = box(sim_fleet, host, "date '+%Y-%m-%d %H:%M:%S'")
        converge(inventory(ssh_keepalive_interval_s=1, service_extra_env={"VLLM_LOGGING_LEVEL": "INFO"}))
        log = box(sim_fleet, host, f"journalctl --sync && journalctl -u ssh --since '{since}' --no-pager -o cat")
        assert "keepalive@lag.net" in log, log[-2000:]
    finally:
        sim_fleet.exec(host, "rm -f /etc/ssh/sshd_config.d/zz-test-debug.conf && systemctl reload ssh")
    converge(inventory())


def test_a_host_down_at_the_start_is_named_and_the_others_converge(sim_fleet, my_boxes, fault_box,
                                                                   tmp_path):
    up, down = my_boxes
    inventory = sim_fleet.write_inventory(tmp_path / "two.py", hosts=[up, down], extra_data={
        "rollout_report_path": str(tmp_path / "report.json"), "ssh_connect_timeout": 5})
    box(sim_fleet, up, "sed -i 's/max_num_seqs: 1/max_num_seqs: 2/' /etc/thorfleet/vllm/vllm.yaml")
    sim_fleet.cut(down)
    try:
        run = deploy(inventory, timeout=300)
    finally:
        sim_fleet.heal(down)
    assert run.returncode != 0
    assert down in run.failed_hosts and up not in run.failed_hosts
    # one line for it, naming the fix, in place of pyinfra's and paramiko's tracebacks
    said = [line for line in run.stderr.splitlines() if f"[{down}]" in line]
    assert len(said) == 1 and "thorfleet: could not connect over SSH" in said[0], run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    assert any("runtime config" in name for name in changed_on(run, up))  # repaired anyway
    report = json.loads((tmp_path / "report.json").read_text())
    assert "could not connect" in report["hosts"][down]["error"]
    # The down box stays bare (a first install there is the deploy story's); this one is whole.
    converge(sim_fleet.write_inventory(tmp_path / "up.py", hosts=[up], extra_data={
        "rollout_report_path": str(tmp_path / "up.json")}))


@pytest.mark.parametrize("mode", ["cut", "bad-sha"])
def test_a_broken_download_never_puts_a_damaged_file_in_place(sim_fleet, fault_box, mode):
    host, inventory, _ = fault_box
    folder, shard = model_dir(sim_fleet), SHARD.format(9)
    box(sim_fleet, host, f"rm {folder}/{shard}")
    others = box(sim_fleet, host, f"cd {folder} && stat -c '%i %Y %n' *.safetensors")
    started = container_started(sim_fleet, host)
    faults = hub(sim_fleet, host)
    try:
        faults.add(mode, path=shard)
        run = deploy(inventory())
    finally:
        faults.clear()
    assert failed_alone(run, host)
    assert "Fetch and verify the checkpoint" in run.stderr
    reason = "does not match its sha256" if mode == "bad-sha" else "was interrupted"
    assert reason in run.stderr and "Traceback" not in run.stderr, run.stderr[-3000:]
    # Nothing damaged in the served folder; the good shards and the server untouched.
    assert sim_fleet.exec(host, f"test -e {folder}/{shard}")[0] != 0
    assert box(sim_fleet, host, f"cd {folder} && stat -c '%i %Y %n' *.safetensors") == others
    assert container_started(sim_fleet, host) == started and serves(sim_fleet, host, timeout=5)
    # The re-run finishes the job, fetching only that shard.
    faults.forget_requests()
    again = converge(inventory())
    assert downloads(faults) == [shard]
    assert [n for n in changed_on(again, host) if "Fetch" not in n] == []


def test_a_full_disk_says_so_and_leaves_the_weights_in_place_untouched(sim_fleet, fault_box):
    host, inventory, _ = fault_box
    tiny = "/mnt/thorfleet-tiny"
    revision_dir = model_dir(sim_fleet).split("/models/", 1)[1]
    folder, shard = f"{tiny}/{revision_dir}", SHARD.format(4)
    # A small disk holding the checkpoint with one shard gone, then filled up.
    box(sim_fleet, host, f"mkdir -p {tiny} && mount -t tmpfs -o size=32m tmpfs {tiny} && "
                         f"cp -a /opt/thorfleet/models/. {tiny}/ && rm {folder}/{shard} && "
                         f"(dd if=/dev/zero of={tiny}/filler bs=64k 2>/dev/null; true)")
    try:
        before = box(sim_fleet, host, f"cd {folder} && sha256sum * | sort")
        started = container_started(sim_fleet, host)
        run = deploy(inventory(weights_dir=tiny, preflight_min_free_disk_gib=0))
        assert failed_alone(run, host)
        assert "disk full under" in run.stderr and "weights in place are untouched" in run.stderr, \
            run.stderr[-3000:]
        assert box(sim_fleet, host, f"cd {folder} && sha256sum * | sort") == before
        # the failed host stopped before its unit changed: the server still serves the old folder
        assert container_started(sim_fleet, host) == started and serves(sim_fleet, host, timeout=5)
    finally:
        sim_fleet.exec(host, f"umount {tiny}")
    assert changed_on(converge(inventory()), host) == []


def test_a_base_the_patches_do_not_fit_fails_the_build_and_the_old_image_keeps_serving(
        sim_fleet, fault_box):
    host, inventory, _ = fault_box
    client = sim_fleet.client
    moved = variant(client, ensure_base_image(client, ensure_rootfs(client)), "moved-code")
    digest = registry.push(client, moved, "nvidia-ai-iot/vllm:moved-code")
    tag, image_id = image_ref(sim_fleet, host)
    started = container_started(sim_fleet, host)
    run = deploy(inventory(image_base=registry.in_sim_ref("nvidia-ai-iot/vllm", digest)))
    assert failed_alone(run, host)
    assert "no longer has the code" in run.stderr, run.stderr[-3000:]
    assert image_ref(sim_fleet, host) == (tag, image_id)
    assert container_started(sim_fleet, host) == started and serves(sim_fleet, host, timeout=5)
    # the failed host kept everything; the next good run removes the failed build's context
    assert changed_on(converge(inventory()), host) == [
        "Cleanup | Remove old revisions, images and build contexts"]
    assert changed_on(deploy(inventory()), host) == []


# A new version that fails its checks: the previous one is put back and serves again. Each is
# reached the way an operator could (a setting), never by a switch only the simulation has.
BAD_VERSIONS = [
    # vLLM picks Marlin for NVFP4 when told to (the stand-in reads the same env var vLLM does)
    ("marlin fallback", {"service_extra_env": {"VLLM_NVFP4_GEMM_BACKEND": "marlin"}},
     ["marlin_utils_fp4", "Rolled back"]),
    # loading takes longer than the operator allowed (a Thor takes minutes; the sim seconds)
    ("health not up in time", {"service_health_timeout_s": 1,
                               "service_extra_env": {"VLLM_LOGGING_LEVEL": "INFO"}},
     ["/health did not answer within 1", "Rolled back"]),
]
# Memory held by another process (the gate times out naming both numbers) is a story of its own:
# tests/fleet/test_thor_says_no.py.


@pytest.mark.parametrize("what,data,reasons", BAD_VERSIONS, ids=[b[0] for b in BAD_VERSIONS])
def test_a_version_that_fails_its_checks_is_rolled_back(sim_fleet, fault_box, what, data, reasons):
    host, inventory, report = fault_box
    previous, unit = proven(sim_fleet, host), box(sim_fleet, host, f"systemctl cat {SERVICE}")
    started = time.monotonic()
    run = deploy(inventory(**data))
    assert time.monotonic() - started < 240  # bounded: no endless waiting
    assert failed_alone(run, host)
    for reason in reasons:
        assert reason in run.stderr, (reason, run.stderr[-3000:])
    assert json.loads(report.read_text())["hosts"][host]["error"]  # the report says it failed
    # The last good version serves again, from its own unit, config and secrets.
    assert proven(sim_fleet, host) == previous
    assert box(sim_fleet, host, f"systemctl cat {SERVICE}") == unit
    assert serves(sim_fleet, host, timeout=5)
    assert changed_on(converge(inventory()), host) == []


def test_a_key_rotated_then_a_version_that_fails_keeps_the_rotated_key(sim_fleet, fault_box,
                                                                      tmp_path):
    # The operator rotates a leaked key and, in the same run, a change that fails its proof: the
    # roll-back puts back the last good unit and config, never the leaked key.
    host, inventory, report = fault_box
    old_key = sim_fleet.exec(host, "sed -n 's/^VLLM_API_KEY=//p' /etc/thorfleet/secrets.env")[1]
    rotated = tmp_path / "rotated_key"
    rotated.write_text("sk-rotated-" + "r" * 32 + "\n")
    rotated.chmod(0o600)
    previous, unit = proven(sim_fleet, host), box(sim_fleet, host, f"systemctl cat {SERVICE}")
    run = deploy(inventory(service_api_key_file=str(rotated), **BAD_VERSIONS[0][1]))
    assert failed_alone(run, host)
    assert "a roll-back keeps a rotated key" in run.stderr, run.stderr[-3000:]
    # the report says so
    assert "a roll-back keeps a rotated key" in json.loads(report.read_text())["hosts"][host]["error"]
    assert proven(sim_fleet, host) == previous
    assert box(sim_fleet, host, f"systemctl cat {SERVICE}") == unit
    assert serves(sim_fleet, host, timeout=30)

    def models(key):
        return box(sim_fleet, host, "curl -s -o /dev/null -w '%{http_code}' -H "
                                    f"'Authorization: Bearer {key.strip()}' "
                                    "http://127.0.0.1:8002/v1/models")

    assert models(rotated.read_text()) == "200"
    assert models(old_key) == "401"
    # the fingerprint shown has nothing of either key in it, and the re-run changes nothing
    assert changed_on(converge(inventory(service_api_key_file=str(rotated))), host) == []
    # back to the fleet's own key for the stories after this one
    assert converge(inventory()).returncode == 0
    assert models(old_key) == "200"
