"""A newcomer's path: the README's first command, an inventory with no hosts, a fresh sim state.

The first command itself runs in CI (.ci/run, read from the README, on a fresh sim state); these
check what it relies on, in seconds.
"""

import json
import os
import runpy
import shlex
import subprocess
import sys

import docker.errors
import pytest

from sim import fleet
from tests.readme_commands import ROOT, try_it_commands


def test_the_readme_first_command_deploys_to_the_inventory_it_brings_up():
    first, test = try_it_commands((ROOT / "README.md").read_text())
    steps = [shlex.split(part) for part in first.split("&&")]
    assert steps[0] == ["bash", ".ci/setup"]
    up = next(words for words in steps if words[:4] == ["python", "-m", "sim", "up"])
    deploy = steps[-1]
    assert deploy[0] == "pyinfra" and deploy[-1] == "deploy.py", first
    assert up[up.index("--inventory") + 1] == deploy[-2], "the deploy must use the inventory up wrote"
    assert "pytest" in test and "-m fast" in test


def _stderr_line(argv):
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)
    lines = [line for line in done.stderr.splitlines() if line.startswith("thorfleet: ")]
    return done.returncode, lines


def test_the_example_inventory_as_shipped_refuses_the_deploy_as_check_does():
    check_code, check_lines = _stderr_line([sys.executable, "-m", "thorfleet", "check",
                                            "inventory/example.py"])
    deploy_code, deploy_lines = _stderr_line(["pyinfra", "-y", "inventory/example.py",
                                              "deploy.py"])
    assert check_code == 2
    assert check_lines == [("thorfleet: inventory/example.py: no hosts: list your boxes in a "
                            "group (uncomment the examples in inventory/example.py)")]
    assert deploy_code == 2, deploy_lines
    assert deploy_lines == check_lines


HUB = {"endpoint_in_sim": "http://thorfleet-hub:8000", "endpoint_local": "http://127.0.0.1:4711",
       "revisions": {fleet.MODEL_REPO: "a" * 40, fleet.DRAFT_REPO: "b" * 40}}


def test_an_up_with_its_own_inventory_on_a_fresh_state_writes_the_pins(tmp_path, monkeypatch):
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path / "state"))
    fleet._record(["thor-1", "thor-2"], "registry:5000/vllm@sha256:" + "c" * 64, HUB,
                  own_inventory=False)
    inventory = fleet.write_inventory(tmp_path / "sim.py", ["thor-1", "thor-2"])
    data = runpy.run_path(str(inventory))["sim_thors"][1]
    assert data["weights_hf_endpoint"] == HUB["endpoint_in_sim"]
    assert data["weights_model_revision"] == "a" * 40
    assert data["weights_draft_revision"] == "b" * 40
    assert data["image_base"].endswith("@sha256:" + "c" * 64)


def test_an_up_with_another_inventory_refreshes_the_hub_but_keeps_the_fleets_hosts(
        tmp_path, monkeypatch):
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path))
    fleet._record(["thor-1", "thor-2", "thor-3"], None, HUB, own_inventory=True)
    moved = {**HUB, "endpoint_local": "http://127.0.0.1:4712"}
    fleet._record(["thor-1"], None, moved, own_inventory=False)
    recorded = json.loads((tmp_path / "fleet.json").read_text())
    assert recorded["hub"]["endpoint_local"] == "http://127.0.0.1:4712"
    assert recorded["hosts"] == ["thor-1", "thor-2", "thor-3"]


def test_an_inventory_with_no_fleet_recorded_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="sim up"):
        fleet.write_inventory(tmp_path / "sim.py", ["thor-1"])


def test_a_run_from_another_folder_is_refused_saying_where_to_run(tmp_path):
    inventory = tmp_path / "local.py"
    inventory.write_text('hosts = ["@local"]\n')
    done = subprocess.run(["pyinfra", "-y", str(inventory), str(ROOT / "deploy.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr[-2000:]
    assert (f"thorfleet: run pyinfra from the repository root, not {tmp_path.resolve()}: "
            f"cd {ROOT} && pyinfra INVENTORY deploy.py") in done.stderr


def test_inventories_in_inventory_check_host_keys_strictly_wherever_pyinfra_runs(tmp_path):
    # pyinfra connects before deploy.py can refuse: the strict default must come with the
    # inventory, from the group data pyinfra reads beside it
    inventory = ROOT / "inventory" / f"test-{os.getpid()}.py"
    inventory.write_text('thors = ["@local"]\n')
    try:
        done = subprocess.run(["pyinfra", str(inventory), "debug-inventory"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, check=False)
    finally:
        inventory.unlink()
    assert '"ssh_strict_host_key_checking": "yes"' in done.stdout + done.stderr, done.stdout


def test_the_rootfs_build_shows_debootstraps_phases_not_a_line_per_package():
    from sim.rootfs import _new_phase

    said = ["I: Retrieving InRelease", "I: Retrieving libc6 2.36", "I: Validating libc6 2.36",
            "I: Retrieving zlib1g 1:1.2.13", "I: Validating zlib1g 1:1.2.13",
            "I: Extracting adduser...", "I: Extracting zlib1g...", "I: Installing core packages...",
            "I: Unpacking required packages...", "I: Unpacking libc6...",
            "W: Failure trying to run: chroot", "I: Base system installed successfully."]
    shown = _new_phase()
    assert [line for line in said if shown(line)] == [
        "I: Retrieving InRelease", "I: Validating libc6 2.36", "I: Extracting adduser...",
        "I: Installing core packages...", "I: Unpacking required packages...",
        "W: Failure trying to run: chroot", "I: Base system installed successfully."]


class _Found:
    """A container `up` found, as far as `stale` reads it."""

    def __init__(self, labels, image="sha256:current"):
        self.labels, self.image = labels, type("Image", (), {"id": image})()


@pytest.mark.parametrize(("index", "labels", "image", "why"), [
    (1, {"ours": True}, "sha256:current", None),
    (3, {"ours": True}, "sha256:current", "beyond --hosts"),
    (1, {"ours": True}, "sha256:older", "image changed"),
    (1, {"thorfleet.state": "/var/tmp/thorfleet-sim"}, "sha256:current",
     "made by sim state /var/tmp/thorfleet-sim"),
    (1, {}, "sha256:current", "made by sim state unlabelled"),
])
def test_up_replaces_a_box_another_sim_state_made(tmp_path, monkeypatch, index, labels, image,
                                                  why):
    """CI's first command on a fresh state found thor-1 and thor-2 of an earlier run running
    (same names, same ports) and kept them: their authorized_keys were the other state's, and
    the deploy's SSH was refused on both."""
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path / "fresh"))
    if labels.pop("ours", False):
        labels["thorfleet.state"] = str(tmp_path / "fresh")
    assert fleet.stale(_Found(labels, image), index, 2, "sha256:current") == why


class _Engine:
    """The Docker engine as `down` sees it: the sim's containers by name, its network."""

    def __init__(self, names):
        engine = self
        self.removed, self.networks_removed = [], []

        class Container:
            def __init__(self, name, labels=None):
                self.name, self.labels = name, labels or {}

            def remove(self, force=False):
                engine.removed.append(self.name)

        class Containers:
            def list(self, all=False, filters=None):
                kind = (filters or {}).get("label", "").removeprefix("thorfleet.sim=")
                prefix = {"box": "thorfleet-thor-", "gateway": "thorfleet-gw-"}[kind]
                return [Container(n, {"thorfleet.index": n.rpartition("-")[2]})
                        for n in names if n.startswith(prefix)]

            def get(self, name):
                if name not in names or name in engine.removed:
                    raise docker.errors.NotFound(name)
                return Container(name)

        class Network:
            def remove(self):
                engine.networks_removed.append(fleet.NETWORK)

        self.containers = Containers()
        self.networks = type("Networks", (), {"list": lambda _, names=None: [Network()]})()


@pytest.mark.parametrize(("keep_registry", "removed", "network_removed"), [
    (False, ["thorfleet-hub", "thorfleet-registry"], True),
    (True, ["thorfleet-hub"], False),
])
def test_down_between_ci_steps_keeps_the_registry_the_bases_are_pushing_to(
        tmp_path, monkeypatch, keep_registry, removed, network_removed):
    """.ci/run takes the first command's boxes down while the newer bases may still be pushing:
    with the registry gone, a push breaks mid-layer and the stories that need that base fail."""
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path))
    monkeypatch.setattr(fleet, "remove_box", lambda container, index: container.remove())
    engine = _Engine(["thorfleet-thor-1", "thorfleet-thor-2", "thorfleet-gw-1", "thorfleet-hub",
                      "thorfleet-registry"])
    fleet.down(engine, keep_registry=keep_registry)
    assert sorted(engine.removed) == sorted(
        ["thorfleet-thor-1", "thorfleet-thor-2", "thorfleet-gw-1", *removed])
    assert bool(engine.networks_removed) == network_removed
