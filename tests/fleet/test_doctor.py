"""`thorfleet doctor` on a simulated Thor (issue 38): a converged box passes and is left exactly as
it was; each assumption broken on the box, the way an operator or a new release would break it,
gets the verdict a real box would.

The box is the sixth, converged by the air-gapped story before this module (its route back). What
is broken here is put back before the next case, and none of it restarts the server. The edits
to thorfleet that break these: the release check back to "R38 only"; doctor reading the mode ids
and not their names; the nvidia runtime taken from `docker info` but the probe run with runc;
PyTorch's arch list not read; /proc/swaps not read; an unreadable zone skipped as the watchdog
skips it; doctor pulling image_base.
"""

import hashlib
import json
import subprocess
import sys

import pytest

from sim import fleet as sim
from tests.helpers import ROOT, box, container_started
from thorfleet.settings import layout

# What doctor must not touch: thorfleet's files on the box, the images, the server's start. The
# usage journal is not among them: it grows with every answer, the watchdog's probes' too.
STATE = ("cat /var/lib/thorfleet/proven-fingerprint; "
         "find /etc/thorfleet /etc/systemd/system /opt/thorfleet/bin /var/lib/thorfleet "
         f"-maxdepth 2 -path {layout.BOX_USAGE_DIR} -prune -o -type f ! -name '*.lock' -print0 "
         "2>/dev/null | sort -z | "
         "xargs -0 sha256sum; docker image ls -q --no-trunc | sort; docker ps -aq | wc -l")


@pytest.fixture(scope="module")
def host(my_boxes):
    return my_boxes[0]


@pytest.fixture(scope="module")
def doctor(sim_fleet, host, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("doctor")

    def run(name="doctor", **group_data):
        inventory = sim_fleet.write_inventory(workdir / f"{name}.py", hosts=[host],
                                              extra_data=group_data)
        done = subprocess.run([sys.executable, "-m", "thorfleet", "doctor", str(inventory),
                               "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                              check=False)
        return done, {r["check"]: r for r in json.loads(done.stdout)}

    return run


def state(sim_fleet, host):
    return hashlib.sha256(box(sim_fleet, host, STATE).encode()).hexdigest()


def test_a_converged_box_passes_and_doctor_changes_nothing(sim_fleet, host, doctor):
    before, started = state(sim_fleet, host), container_started(sim_fleet, host)
    done, rows = doctor()
    assert done.returncode == 0, done.stderr
    assert not [r for r in rows.values() if r["verdict"] == "blocks"], done.stderr
    for check in ("passwordless sudo", "L4T release", "memory total", "free disk",
                  "swap and zram", "page-cache drop", "nvpmodel modes", "mode change",
                  "jetson_clocks format", "clocks locked", "Docker", "nvidia runtime",
                  "GPU in a container", "PyTorch arch list", "checkpoint", "EAGLE draft",
                  "kernels", "server metrics", "thermal zones"):
        assert rows[check]["verdict"] == "ok", rows[check]
    assert rows["GPU in a container"]["found"] == "NVIDIA Thor, capability 11.0"
    assert "sm_110" in rows["PyTorch arch list"]["found"]
    assert "TRITON_MLA" in rows["kernels"]["found"]
    # nothing installed, written, pulled, restarted; the probe's container is gone
    assert state(sim_fleet, host) == before
    assert container_started(sim_fleet, host) == started


def test_a_newer_release_other_mode_names_swap_and_a_dead_sensor(sim_fleet, host, doctor):
    box(sim_fleet, host, "cp /etc/nv_tegra_release /etc/nvpmodel.conf /root/")
    try:
        # JetPack 7.2 (docs/facts.md "Thor realities": R39 must be accepted); a release whose
        # mode 1 has another name; a swap file turned on; a thermal zone whose temp cannot be read
        box(sim_fleet, host, "sed -i 's/^# R38 (release), REVISION: [0-9.]*/# R39 (release), "
                             "REVISION: 2.0/' /etc/nv_tegra_release")
        box(sim_fleet, host, "sed -i 's/ID=1 NAME=120W/ID=1 NAME=MAXN_SUPER/' /etc/nvpmodel.conf")
        box(sim_fleet, host, "dd if=/dev/zero of=/var/tmp/swapfile bs=1M count=64 status=none && "
                             "chmod 600 /var/tmp/swapfile && mkswap /var/tmp/swapfile >/dev/null && "
                             "swapon /var/tmp/swapfile")
        box(sim_fleet, host, "rm /sys/class/thermal/thermal_zone2/temp")
        done, rows = doctor("changed")
        assert done.returncode == 0, done.stderr  # each differs, none blocks serving
        assert (rows["L4T release"]["verdict"], rows["L4T release"]["found"]) == ("ok", "R39.2.0")
        modes = rows["nvpmodel modes"]
        assert modes["verdict"] == "copes" and "mode 1 is MAXN_SUPER here" in modes["fix"], modes
        swap = rows["swap and zram"]
        assert swap["verdict"] == "copes" and "/var/tmp/swapfile (file" in swap["found"], swap
        heat = rows["thermal zones"]
        assert heat["verdict"] == "copes" and "thermal_zone2" in heat["found"], heat
    finally:
        box(sim_fleet, host, "mv /root/nv_tegra_release /root/nvpmodel.conf /etc/")
        box(sim_fleet, host, "swapoff /var/tmp/swapfile; rm -f /var/tmp/swapfile")
        box(sim_fleet, host, "systemctl restart thorsim-thermal")


def test_without_the_nvidia_runtime_serving_is_blocked_and_said_why(sim_fleet, host, doctor):
    box(sim_fleet, host, "cp /etc/docker/daemon.json /root/daemon.json.kept")
    try:
        # what an `apt upgrade` can do to the NVIDIA container runtime (docs/facts.md "Checked again
        # in December 2026"): Docker no longer offers it; dockerd reloads its runtimes on SIGHUP,
        # the server keeps running
        box(sim_fleet, host, "python3 -c \"import json; p='/etc/docker/daemon.json'; "
                             "c=json.load(open(p)); c['runtimes'].pop('nvidia'); "
                             "json.dump(c, open(p, 'w'))\" && systemctl reload docker")
        done, rows = doctor("no-runtime")
        assert done.returncode == 1
        assert rows["nvidia runtime"]["verdict"] == "blocks"
        assert "nvidia-ctk runtime configure" in rows["nvidia runtime"]["fix"]
        gpu = rows["GPU in a container"]
        assert gpu["verdict"] == "blocks" and "did not run" in gpu["found"], gpu
        assert f"thorfleet: {host}: nvidia runtime blocks serving" in done.stderr
    finally:
        box(sim_fleet, host, "mv /root/daemon.json.kept /etc/docker/daemon.json && "
                             "systemctl reload docker")


def test_a_base_whose_pytorch_lacks_sm_110_blocks_and_one_not_on_the_box_is_not_checked(
        sim_fleet, host, doctor):
    ref = sim.base("jetson-0.19.0-no-sm110")
    done, rows = doctor("not-here", image_base=ref)
    assert rows["PyTorch arch list"]["verdict"] == "not checked yet"  # doctor pulls nothing
    assert box(sim_fleet, host, f"docker image inspect {ref} >/dev/null 2>&1 || echo absent") \
        == "absent"
    box(sim_fleet, host, f"docker pull -q {ref}")  # the operator pulls it
    try:
        done, rows = doctor("no-sm110", image_base=ref)
        assert done.returncode == 1
        arch = rows["PyTorch arch list"]
        assert arch["verdict"] == "blocks" and "sm_110" not in arch["found"].split(" (")[0], arch
        assert "image built for Thor" in arch["fix"]
    finally:
        box(sim_fleet, host, f"docker rmi -f {ref} >/dev/null")
