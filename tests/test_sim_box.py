"""The simulated Thor behaves like the real one, as FACTS.md describes it.

Each test quotes the FACTS.md line it models. Tests that change a box put it back as they found it,
because the fleet is shared with the deploy tests of the same session.
"""

import json
import re
import subprocess
import time
import urllib.request

import pytest

from tests.sim import fleet as sim
from tests.sim import registry
from tests.sim.rootfs import ensure_rootfs

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def box(sim_fleet):
    """The box these tests play with: the last one, so thor-1 stays as the deploy left it."""
    return sim_fleet.hosts[-1]


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"rc={result.returncode}\n{result.stdout}{result.stderr}"
    return result.stdout


def power_mode(sim_fleet, box) -> int:
    return int(ok(sim_fleet.ssh(box, "nvpmodel -q")).splitlines()[-1])


def clocks_locked(sim_fleet, box) -> bool:
    """Locked = the GPU's MinFreq is pinned to its MaxFreq, read as an operator reads --show."""
    show = ok(sim_fleet.ssh(box, "sudo jetson_clocks --show"))
    gpu = re.search(r"^GPU MinFreq=(\d+) MaxFreq=(\d+)", show, re.MULTILINE)
    return gpu[1] == gpu[2]


@pytest.fixture
def restore_power(sim_fleet, box):
    """Put the box back into its power mode and clock lock (a reboot if the mode needs it)."""
    before, was_locked = power_mode(sim_fleet, box), clocks_locked(sim_fleet, box)
    # A box a deploy already reached locks its clocks at boot (thorfleet-clocks.service): these
    # stories are about the bare stand-ins, so take the box back to unlocked, no boot unit.
    # (the server's unit Wants= the clocks unit, so it goes too, for the length of the story)
    units = "thorfleet-clocks.service thorfleet-vllm.service"
    boot_unit = sim_fleet.ssh(box, "systemctl is-enabled thorfleet-clocks.service").returncode == 0
    serving = sim_fleet.ssh(box, "systemctl is-active thorfleet-vllm.service").returncode == 0
    ok(sim_fleet.ssh(box, f"sudo systemctl disable -q --now {units} 2>/dev/null; "
                          "sudo rm -f /run/jetson_clocks/state.json"))
    yield
    if power_mode(sim_fleet, box) != before:
        sim_fleet.ssh(box, f"sudo nvpmodel -m {before}", input="YES\n")
        sim_fleet.wait_booted(box)
    if boot_unit:
        ok(sim_fleet.ssh(box, f"sudo systemctl enable -q {units}"))
    if serving:
        ok(sim_fleet.ssh(box, "sudo systemctl start thorfleet-clocks.service thorfleet-vllm.service"))
    ok(sim_fleet.ssh(box, "sudo jetson_clocks" if was_locked
                     else "sudo rm -f /run/jetson_clocks/state.json"))
    assert power_mode(sim_fleet, box) == before


# "Ubuntu 24.04, systemd, Docker with the `nvidia` runtime"
def test_systemd_reaches_running_on_every_box(sim_fleet):
    for host in sim_fleet.hosts:
        assert ok(sim_fleet.ssh(host, "systemctl is-system-running")).strip() == "running"


# "JetPack 7 / L4T r38 (`/etc/nv_tegra_release` starts with `# R38`)"
def test_the_box_says_it_runs_l4t_r38(sim_fleet, box):
    assert ok(sim_fleet.ssh(box, "head -c 5 /etc/nv_tegra_release")) == "# R38"


def test_thor_logs_in_with_the_key_only_and_has_passwordless_sudo(sim_fleet, box):
    assert ok(sim_fleet.ssh(box, "sudo -n id -u")).strip() == "0"
    by_password = subprocess.run(
        ["ssh", "-p", str(sim_fleet.ssh_port(box)), "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={sim_fleet.known_hosts}", "-o", "PubkeyAuthentication=no",
         "-o", "PreferredAuthentications=password,keyboard-interactive", "thor@127.0.0.1", "true"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False)
    assert by_password.returncode == 255 and "Permission denied" in by_password.stderr


# "`nvpmodel -q` prints optional `NVPM WARN ...` lines, then `NV Power Mode: <NAME>`, then the mode
# id alone on the last line"
def test_nvpmodel_query_format(sim_fleet, box):
    lines = ok(sim_fleet.ssh(box, "nvpmodel -q")).splitlines()
    assert all(line.startswith("NVPM WARN") for line in lines[:-2])
    assert re.fullmatch(r"NV Power Mode: \S+", lines[-2])
    assert re.fullmatch(r"\d+", lines[-1])


# "0 = MAXN, 1 = 120W, 2 = 90W, 3 = 70W ... `nvpmodel -p --verbose` lists
# `POWER_MODEL: ID=n NAME=x`"
def test_nvpmodel_lists_the_t5000_modes(sim_fleet, box):
    listing = ok(sim_fleet.ssh(box, "nvpmodel -p --verbose"))
    modes = dict(re.findall(r"POWER_MODEL: ID=(\d+) NAME=(\S+)", listing))
    assert modes == {"0": "MAXN", "1": "120W", "2": "90W", "3": "70W"}


# "Modes 0 and 1 switch live"
def test_mode_1_switches_live_without_a_reboot(sim_fleet, box, restore_power):
    ok(sim_fleet.ssh(box, "sudo nvpmodel -m 0 && sudo touch /run/not-rebooted"))
    switched = sim_fleet.ssh(box, "sudo nvpmodel -m 1")
    assert ok(switched) == ""
    assert ok(sim_fleet.ssh(box, "nvpmodel -q")).splitlines()[-2:] == ["NV Power Mode: 120W", "1"]
    ok(sim_fleet.ssh(box, "test -e /run/not-rebooted"))


# "`nvpmodel -m N` for a mode that needs a reboot prints `NVPM WARN: Reboot required ...` and
# `... enter YES/yes to confirm:` and waits on stdin ... anything else leaves the mode unchanged
# (`NVPM ERROR: bad input!`)"
def test_mode_2_asks_to_reboot_and_no_leaves_the_mode(sim_fleet, box, restore_power):
    before = power_mode(sim_fleet, box)
    answer = sim_fleet.ssh(box, "sudo nvpmodel -m 2", input="no\n")
    assert answer.returncode != 0
    assert "NVPM WARN: Reboot required for changing to this power mode: 2" in answer.stdout
    assert "NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:" in answer.stdout
    assert "NVPM ERROR: bad input!" in answer.stdout
    assert power_mode(sim_fleet, box) == before


# "never leave stdin open": with stdin closed the prompt reads EOF and gives up at once
def test_mode_2_with_stdin_closed_does_not_hang(sim_fleet, box, restore_power):
    before = power_mode(sim_fleet, box)
    answer = sim_fleet.ssh(box, "sudo nvpmodel -m 2", timeout=30)  # stdin is /dev/null
    assert "NVPM ERROR: bad input!" in answer.stdout
    assert power_mode(sim_fleet, box) == before


# "A batch job with stdin open hangs there."
def test_mode_2_with_stdin_left_open_hangs(sim_fleet, box, restore_power):
    argv = ["ssh", "-i", str(sim_fleet.key), "-p", str(sim_fleet.ssh_port(box)), "-o",
            f"UserKnownHostsFile={sim_fleet.known_hosts}", "thor@127.0.0.1", "sudo nvpmodel -m 2"]
    job = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(5)
        assert job.poll() is None, "nvpmodel returned although nobody answered"
    finally:
        job.stdin.close()  # the EOF lets it go: bad input, mode unchanged
        job.wait(timeout=30)
    assert "NVPM ERROR: bad input!" in job.stdout.read()


# "`YES` reboots the box" ... "The nvpmodel mode persists across reboots."
def test_yes_reboots_into_the_new_mode(sim_fleet, box, restore_power):
    ok(sim_fleet.ssh(box, "sudo touch /run/not-rebooted"))
    sim_fleet.ssh(box, "sudo nvpmodel -m 3", input="YES\n", timeout=60)
    sim_fleet.wait_booted(box)
    assert ok(sim_fleet.ssh(box, "nvpmodel -q")).splitlines()[-2:] == ["NV Power Mode: 70W", "3"]
    assert sim_fleet.ssh(box, "test -e /run/not-rebooted").returncode != 0


# "The nvpmodel mode persists across reboots. `jetson_clocks` ... does NOT survive a reboot"
def test_mode_persists_across_reboot_but_clocks_do_not(sim_fleet, box, restore_power):
    ok(sim_fleet.ssh(box, "sudo nvpmodel -m 1 && sudo jetson_clocks"))
    assert clocks_locked(sim_fleet, box)
    sim_fleet.reboot(box)
    assert power_mode(sim_fleet, box) == 1
    assert not clocks_locked(sim_fleet, box)
    # and nvpmodel.service applied the stored mode at boot, as JetPack's does
    assert ok(sim_fleet.ssh(box, "systemctl is-active nvpmodel.service")).strip() == "active"


# "Set the mode first, then jetson_clocks": a mode change resets the lock
def test_a_mode_change_undoes_jetson_clocks(sim_fleet, box, restore_power):
    ok(sim_fleet.ssh(box, "sudo nvpmodel -m 0 && sudo jetson_clocks && sudo nvpmodel -m 1"))
    assert not clocks_locked(sim_fleet, box)


# "`--store [file]` saves the current (unlocked) state, `--restore [file]` brings it back;
# `--fan` writes `$HOME/.jetsonclocks_fan.txt`"
def test_jetson_clocks_store_restore_and_fan(sim_fleet, box, restore_power):
    ok(sim_fleet.ssh(box, "sudo jetson_clocks --store /tmp/l4t_dfs.conf && sudo jetson_clocks"))
    assert clocks_locked(sim_fleet, box)
    ok(sim_fleet.ssh(box, "sudo jetson_clocks --restore /tmp/l4t_dfs.conf"))
    assert not clocks_locked(sim_fleet, box)
    ok(sim_fleet.ssh(box, "sudo -H jetson_clocks --fan"))
    ok(sim_fleet.ssh(box, "sudo test -s /root/.jetsonclocks_fan.txt"))
    assert "hwmon0_pwm1=255" in ok(sim_fleet.ssh(box, "sudo jetson_clocks --show"))
    assert sim_fleet.ssh(box, "jetson_clocks").returncode != 0, "jetson_clocks needs root"


# "`sync; sysctl -w vm.drop_caches=3`, then loop ... until the `available` column of `free -g`"
def test_drop_caches_is_writable_and_memory_is_the_real_one(sim_fleet, box):
    ok(sim_fleet.ssh(box, "sync; sudo sysctl -w vm.drop_caches=3"))
    free = ok(sim_fleet.ssh(box, "free -g")).splitlines()
    assert free[0].split()[-1] == "available"
    in_box = int(free[1].split()[-1])
    on_host = int(subprocess.run(["free", "-g"], capture_output=True, text=True, check=True)
                  .stdout.splitlines()[1].split()[-1])
    assert abs(in_box - on_host) <= 2  # the host's /proc/meminfo, not a fake one


@pytest.fixture(scope="module")
def probe_image(sim_fleet):
    """A small runnable image in the site registry, by digest (the rootfs: the base image's first
    layer, so pulling it also warms the boxes for the deploy)."""
    rootfs = ensure_rootfs(sim_fleet.client)
    repository = "thorfleet-sim/rootfs"
    digest = registry.push(sim_fleet.client, rootfs, f"{repository}:{rootfs.partition(':')[2]}")
    return registry.in_sim_ref(repository, digest)


# "pin it by digest": a box pulls from the site registry by digest
def test_a_box_pulls_from_the_registry_by_digest(sim_fleet, box, probe_image):
    ok(sim_fleet.ssh(box, f"sudo docker pull -q {probe_image}", timeout=300))
    digests = ok(sim_fleet.ssh(box, "sudo docker image inspect --format "
                                    f"'{{{{json .RepoDigests}}}}' {probe_image}"))
    assert probe_image in json.loads(digests)


# "`docker run --runtime nvidia --gpus all ... --network host`"
def test_a_gpu_container_on_host_network_serves_on_box_localhost(sim_fleet, box, probe_image):
    runtimes = ok(sim_fleet.ssh(box, "sudo docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in json.loads(runtimes)
    ok(sim_fleet.ssh(box, f"sudo docker pull -q {probe_image}", timeout=300))
    sim_fleet.ssh(box, "sudo docker rm -f probe")
    ok(sim_fleet.ssh(box, "sudo docker run -d --name probe --runtime nvidia --gpus all "
                          f"--network host --ipc=host {probe_image} python3 -m http.server 18080"))
    try:
        wait_for_server = ("for i in $(seq 30); do curl -fsS -o /dev/null http://127.0.0.1:18080/"
                           " && exit 0; sleep 1; done; exit 1")
        ok(sim_fleet.ssh(box, wait_for_server, timeout=60))
    finally:
        sim_fleet.ssh(box, "sudo docker rm -f probe")


def test_cut_stops_answering_without_closing_and_heal_brings_it_back(sim_fleet, box):
    # An open session keeps printing ticks; cutting must leave it hanging, not closed.
    argv = ["ssh", "-i", str(sim_fleet.key), "-p", str(sim_fleet.ssh_port(box)), "-o",
            f"UserKnownHostsFile={sim_fleet.known_hosts}", "-o", "BatchMode=yes",
            "thor@127.0.0.1", "while true; do echo tick; sleep 1; done"]
    session = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        assert session.stdout.readline() == "tick\n"
        sim_fleet.cut(box)
        try:
            try:
                fresh = sim_fleet.ssh(box, "true", timeout=20, connect_timeout=5)
                assert fresh.returncode == 255
            except subprocess.TimeoutExpired:
                pass  # no answer at all: as good as a timeout
            assert session.poll() is None, "the open session was closed instead of hanging"
        finally:
            sim_fleet.heal(box)
        assert ok(sim_fleet.ssh(box, "echo back")).strip() == "back"
    finally:
        session.kill()
        session.wait()


# The operator's entry point: pyinfra over real SSH, strict host keys, against a grown fleet.
def test_up_adds_a_box_and_pyinfra_reaches_all_three(sim_fleet, tmp_path):
    before = {c.name: c.id for c in sim.boxes(sim_fleet.client).values()}
    grown = sim.up(len(sim_fleet.hosts) + 1, inventory=tmp_path / "inventory.py",
                   client=sim_fleet.client)
    try:
        after = {c.name: c.id for c in sim.boxes(sim_fleet.client).values()}
        assert {name: after[name] for name in before} == before, "existing boxes were recreated"
        run = subprocess.run(["pyinfra", str(grown.inventory), "exec", "--",
                              "systemctl", "is-system-running"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                             check=False)
        output = run.stdout + run.stderr  # pyinfra reports on stderr
        assert run.returncode == 0, output
        for host in grown.hosts:
            assert f"[{host}] running" in output
    finally:
        sim.up(len(sim_fleet.hosts), inventory=sim_fleet.inventory, client=sim_fleet.client)


def test_the_hub_answers_from_inside_the_sim(sim_fleet, box):
    if not sim_fleet.hub:
        pytest.skip("tests.sim.hub is not there yet")
    url = f"{sim_fleet.hub['endpoint_in_sim']}/api/models/{sim.MODEL_REPO}"
    ok(sim_fleet.ssh(box, f"curl -fsS -o /dev/null {url}"))
    with urllib.request.urlopen(sim_fleet.hub["endpoint_local"] + "/api/models/"
                                + sim.MODEL_REPO, timeout=10):
        pass
