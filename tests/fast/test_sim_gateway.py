"""The simulated fleet's gateway box, as the inventory and the sim's own names see it (no Docker).

The box itself (sshd, systemd, known_hosts) is checked by the fleet stories that use it.
"""

import json
import re
import runpy

import pytest

from sim import __main__ as sim_cli
from sim import fleet
from thorfleet.cli.pin import load_inventory
from thorfleet.settings import roles, schema

BASE = "thorfleet-registry:5000/nvidia-ai-iot/vllm@sha256:" + "c" * 64
HUB = {"endpoint_in_sim": "http://thorfleet-hub:8000", "endpoint_local": "http://127.0.0.1:4711",
       "revisions": {fleet.MODEL_REPO: "a" * 40, fleet.DRAFT_REPO: "b" * 40}}
ADDRESS = "172.30.0.9"
VIRTUAL = "172.30.255.250/16"
THORS = ["thor-1", ("thor-2", {"service_port": 8001})]


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A sim state whose last `up` had two Thors and the gateway box at ADDRESS."""
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path / "state"))
    fleet._record(["thor-1", "thor-2"], BASE, HUB, own_inventory=True,
                  gateways={fleet.GATEWAY_HOST: ADDRESS}, virtual=VIRTUAL)
    return tmp_path / "state"


def test_an_inventory_without_the_gateway_has_the_thors_only(state, tmp_path):
    path = fleet.write_inventory(tmp_path / "sim.py", THORS, {"rollout_batch": 2})
    assert "gateway" not in runpy.run_path(str(path))
    inventory = load_inventory(path)
    assert [h.name for h in inventory] == ["thor-1", "thor-2"]
    assert roles.gateway_of(inventory) is None


def test_the_gateway_is_a_group_of_its_own_with_the_ssh_and_gateway_keys_only(state, tmp_path):
    plain = fleet.write_inventory(tmp_path / "plain.py", THORS, {"rollout_batch": 2})
    path = fleet.write_inventory(tmp_path / "sim.py", THORS, {"rollout_batch": 2},
                                 gateway=fleet.GATEWAY_HOST)
    [(name, host_data)], group = runpy.run_path(str(path))["gateway"]
    assert name == "gw-1"
    assert host_data == {"ssh_hostname": "127.0.0.1", "ssh_port": 22100,
                         "gateway_fleet_address": ADDRESS}
    assert group == {"ssh_user": "thor", "ssh_key": str(state / "id_ed25519"),
                     "ssh_known_hosts_file": str(state / "known_hosts"),
                     "gateway_port": 28443, "gateway_ca_dir": str(state / "fleet-ca")}
    # the Thors' group is the one an inventory without the gateway has
    assert runpy.run_path(str(path))["sim_thors"] == runpy.run_path(str(plain))["sim_thors"]

    inventory = load_inventory(path)
    gateway = inventory.get_host("gw-1")
    assert roles.gateway_of(inventory) is gateway
    assert [h.name for h in roles.thors(inventory)] == ["thor-1", "thor-2"]
    values, problems = schema.check_gateway(gateway.data.dict())
    assert problems == []
    assert values.gateway_port == 28443 and values.gateway_fleet_address == ADDRESS
    # none of the Thors' sim settings: only group_data/all.py's defaults reach it
    for key in ("image_base", "weights_hf_endpoint", "service_api_key_file",
                "weights_model_revision"):
        assert gateway.data.get(key) is None, key
    assert inventory.get_host("thor-1").data.get("image_base") == BASE


def test_the_gateways_own_data_overrides_the_sims(state, tmp_path):
    path = fleet.write_inventory(tmp_path / "sim.py", ["thor-1"], gateway=(
        "gw-1", {"gateway_fleet_address": "172.30.0.10", "gateway_queue_timeout_s": 5}))
    [(_, host_data)], _ = runpy.run_path(str(path))["gateway"]
    assert host_data["gateway_fleet_address"] == "172.30.0.10"
    assert host_data["gateway_queue_timeout_s"] == 5


def test_an_inventory_with_a_gateway_that_is_not_up_is_refused(state, tmp_path):
    fleet._record(["thor-1"], BASE, HUB, own_inventory=False)
    with pytest.raises(RuntimeError, match="sim up --gateway"):
        fleet.write_inventory(tmp_path / "sim.py", ["thor-1"], gateway="gw-1")
    with pytest.raises(ValueError, match="gw-1"):
        fleet.write_inventory(tmp_path / "sim.py", ["thor-1"], gateway="thor-2")


def test_fleet_json_keeps_the_gateways_address_while_it_restarts_and_drops_it_when_gone(state):
    fleet._record(["thor-1"], BASE, HUB, own_inventory=False,
                  gateways={"gw-1": None})  # stopped: Docker shows no address
    assert json.loads((state / "fleet.json").read_text())["gateway_address"] == ADDRESS
    assert fleet.attach(client=object()).gateway == "gw-1"
    fleet._record(["thor-1"], BASE, HUB, own_inventory=False)
    recorded = json.loads((state / "fleet.json").read_text())
    assert recorded["gateway"] is None and "gateway_address" not in recorded
    assert fleet.attach(client=object()).gateway is None


def test_gw_1_is_the_gateways_container_and_port_and_no_thor():
    assert [fleet.index_of(h) for h in ("thor-2", "thorfleet-thor-12", "3", 4)] == [2, 12, 3, 4]
    for name in ("gw-1", "thorfleet-gw-1", "thor-", "thor-1x"):
        with pytest.raises(ValueError):
            fleet.index_of(name)
    assert fleet.container_of("gw-1") == fleet.container_of("thorfleet-gw-1") == "thorfleet-gw-1"
    assert fleet.container_of("thor-3") == fleet.container_of(3) == "thorfleet-thor-3"
    assert fleet.ssh_port_of("gw-1") == 22100
    assert fleet.container_of("gw-2") == "thorfleet-gw-2" and fleet.ssh_port_of("gw-2") == 22101
    assert fleet.is_gateway("thorfleet-gw-3") and not fleet.is_gateway("gw-0")
    assert fleet.ssh_port_of("thor-3") == 22003


def test_the_gateway_image_is_built_from_the_account_files_and_no_thor_stand_in():
    context = fleet.gateway_context()
    dockerfile = context["Dockerfile"].read_text()
    copied = {source for line in dockerfile.splitlines() if line.startswith("COPY ")
              for source in line.split()[1:-1]}
    assert copied and copied <= set(context), copied - set(context)
    assert {path.name for path in context.values()} == {
        "Dockerfile", "sudoers-thor", "sshd-thorfleet.conf", "ssh-hostkeys.service", "environment"}
    for stand_in in ("nvpmodel", "jetson_clocks", "nv_tegra_release", "thorsim-memory", "nvidia",
                     "docker.service"):
        enabled = re.search(rf"systemctl enable [^\n]*{stand_in}", dockerfile)
        assert stand_in not in " ".join(copied) and not enabled, stand_in


@pytest.mark.parametrize("argv, gateway, gateways", [
    (["up"], False, None), (["up", "--gateway"], True, None), (["up", "--gateways", "2"], False, 2)])
def test_up_brings_the_gateways_only_when_asked(argv, gateway, gateways, monkeypatch):
    calls = []
    monkeypatch.setattr(sim_cli.docker, "from_env", lambda: "client")
    monkeypatch.setattr(sim_cli.fleet, "up", lambda *a, **kw: calls.append(kw))
    assert sim_cli.main(argv) == 0
    assert calls == [{"client": "client", "gateway": gateway, "gateways": gateways}]


def test_two_gateways_are_one_group_sharing_the_sims_virtual_address(state, tmp_path):
    fleet._record(["thor-1"], BASE, HUB, own_inventory=False,
                  gateways={"gw-1": ADDRESS, "gw-2": "172.30.0.10"}, virtual=VIRTUAL)
    path = fleet.write_inventory(tmp_path / "sim.py", ["thor-1"], gateway=["gw-1", "gw-2"])
    hosts, group = runpy.run_path(str(path))["gateway"]
    assert hosts == [("gw-1", {"ssh_hostname": "127.0.0.1", "ssh_port": 22100,
                               "gateway_fleet_address": ADDRESS}),
                     ("gw-2", {"ssh_hostname": "127.0.0.1", "ssh_port": 22101,
                               "gateway_fleet_address": "172.30.0.10"})]
    assert group["gateway_virtual_ip"] == VIRTUAL
    # one gateway: no shared address
    _, group = runpy.run_path(str(fleet.write_inventory(tmp_path / "one.py", ["thor-1"],
                                                        gateway="gw-1")))["gateway"]
    assert "gateway_virtual_ip" not in group


def test_known_hosts_has_the_gateways_keys_and_keeps_them_while_it_cannot_be_read(state,
                                                                                  monkeypatch):
    keys = {"thorfleet-thor-1": "ssh-ed25519 AAAAthor1 root@thor-1",
            "thorfleet-gw-1": "ssh-ed25519 AAAAgw1 root@gw-1"}
    monkeypatch.setattr(fleet, "boxes", lambda client: {1: "thor-1's container"})
    monkeypatch.setattr(fleet, "gateway_containers", lambda client: {"gw-1": "its container"})
    monkeypatch.setattr(fleet, "box_exec", lambda client, host, command: (
        (0, keys[fleet.container_of(host)] + "\n") if fleet.container_of(host) in keys else (1, "")))
    path = fleet._write_known_hosts(client=None)
    assert path.read_text() == ("[127.0.0.1]:22001 ssh-ed25519 AAAAthor1\n"
                                "[127.0.0.1]:22100 ssh-ed25519 AAAAgw1\n")
    del keys["thorfleet-gw-1"]  # rebooting: its lines stay
    assert fleet._write_known_hosts(client=None).read_text().endswith(
        "[127.0.0.1]:22100 ssh-ed25519 AAAAgw1\n")
