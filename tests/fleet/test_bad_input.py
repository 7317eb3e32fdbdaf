"""The operator's bad-input story: a mistake in the inventory or group data is refused before any
host is touched. The run exits non-zero with one line per problem (host, key, fix) and pyinfra
never even connects: thorfleet's config.py checks the inventory right after pyinfra loads it.

(tests/fast/test_settings.py checks each rule on its own; these run the CLI as the operator does.)
"""

import os

import pytest

from tests.helpers import SERVICE, container_started, deploy

REGISTRY_TAG = "thorfleet-registry:5000/nvidia-ai-iot/vllm:latest-jetson-thor"

# (what is wrong, group data changes, host data changes per host position, expected message)
BAD_INPUTS = [
    ("unknown profile", {"service_profile": "turbo"}, None,
     "service_profile='turbo' is unknown"),
    ("gpu_memory_utilization 0", {"service_gpu_memory_utilization": 0}, None,
     "service_gpu_memory_utilization=0 must be a number in (0, 1]"),
    ("gpu_memory_utilization above 1", {"service_gpu_memory_utilization": 1.5}, None,
     "service_gpu_memory_utilization=1.5 must be a number in (0, 1]"),
    ("gpu_memory_utilization as text", {"service_gpu_memory_utilization": "0.7"}, None,
     "service_gpu_memory_utilization='0.7' must be a number in (0, 1]"),
    ("non-numeric threshold", {"memory_min_available_gib": "lots"}, None,
     "memory_min_available_gib='lots' must be a non-negative number"),
    ("negative timeout", {"memory_gate_timeout_s": -5}, None,
     "memory_gate_timeout_s=-5 must be a positive whole number of seconds"),
    ("timeout with a unit", {"service_health_timeout_s": "20m"}, None,
     "service_health_timeout_s='20m' must be a positive number of seconds"),
    ("revision is a branch", {"weights_model_revision": "main"}, None,
     "weights_model_revision='main' is not pinned"),
    ("revision missing", {"weights_draft_revision": None}, None,
     "weights_draft_revision=None is not pinned"),
    ("base image by moving tag", {"image_base": REGISTRY_TAG}, None,
     "is not pinned by digest"),
    ("power mode that does not exist", {"power_mode": 7}, None,
     "power_mode=7 is not a T5000 mode"),
    ("port 0", {"service_port": 0}, None, "service_port=0 must be at least 1"),
    ("misspelt setting", {"service_prot": 8003}, None,
     "service_prot=8003 is not a thorfleet setting: did you mean service_port?"),
    ("canary group that is not in the inventory", {"rollout_canary_group": "canaries"}, None,
     "rollout_canary_group='canaries' is not a group of this inventory"),
    ("weights folder not absolute", {"weights_dir": "models"}, None,
     "weights_dir='models' must be an absolute path on the box"),
    ("unit line injection through the environment",
     {"service_extra_env": {"NCCL_DEBUG": "INFO\nExecStartPre=/bin/true"}}, None,
     "is not safe in a unit line"),
    ("two services on one port", {}, [{}, {"ssh_port": "SAME_AS_FIRST"}],
     "two services cannot share one port"),
    ("no API key", {"service_api_key_file": None}, None, "no API key: set service_api_key_file"),
    ("no API key, listening beyond localhost",
     {"service_api_key_file": None, "service_allow_no_api_key": True, "service_host": "0.0.0.0"},
     None, "service_host='0.0.0.0' without an API key would expose the server"),
    ("API key file missing", {"service_api_key_file": "/nonexistent/api_key"}, None,
     ("service_api_key_file='/nonexistent/api_key' cannot be read (No such file or directory): "
      "make it")),
    ("secret smuggled in the environment", {"service_extra_env": {"VLLM_API_KEY": "x"}}, None,
     "service_extra_env must not carry secrets"),
]


def snapshot(sim_fleet, hosts):
    """What a run would change on the boxes: deployed files, the server's container, sshd's log of
    logins (a connection at all would show there)."""
    files = (f"/etc/systemd/system/{SERVICE}.service /etc/thorfleet/vllm/vllm.yaml "
             "/etc/thorfleet/secrets.env /var/lib/thorfleet/proven-fingerprint")
    found = {}
    for host in hosts:
        _, sums = sim_fleet.exec(host, f"sha256sum {files} 2>&1")
        _, logins = sim_fleet.exec(host, "journalctl --sync && journalctl -u ssh --no-pager -o cat | grep -c Accepted")
        found[host] = (sums, container_started(sim_fleet, host), logins.strip())
    return found


@pytest.fixture(scope="module")
def clean_env():
    """The laptop's environment without secrets, so only the inventory decides."""
    return {k: v for k, v in os.environ.items() if k not in ("THORFLEET_API_KEY", "HF_TOKEN")}


def test_every_bad_input_is_refused_before_any_host_is_touched(sim_fleet, my_boxes, tmp_path,
                                                               clean_env):
    hosts = my_boxes
    before = snapshot(sim_fleet, hosts)
    refused = []
    for what, group, per_host, message in BAD_INPUTS:
        entries = hosts
        if per_host:
            first_port = sim_fleet.ssh_port(hosts[0])
            entries = [(h, {k: (first_port if v == "SAME_AS_FIRST" else v) for k, v in d.items()})
                       for h, d in zip(hosts, per_host, strict=True)]
        inventory = sim_fleet.write_inventory(tmp_path / f"{len(refused)}.py", hosts=entries,
                                              extra_data=group)
        run = deploy(inventory, as_json=False, env=clean_env, timeout=120)
        assert run.returncode != 0, (what, run.stderr[-2000:])
        assert message in run.stderr, (what, run.stderr[-2000:])
        assert "refusing to run" in run.stderr
        assert "Connected" not in run.stderr and "Connecting" not in run.stderr, what
        # one line per problem, naming the host
        problems = [line for line in run.stderr.splitlines() if line.startswith("  - ")]
        assert problems and all(line[4:].startswith(tuple(hosts)) for line in problems), problems
        refused.append(what)
    assert len(refused) == len(BAD_INPUTS) >= 12
    assert snapshot(sim_fleet, hosts) == before
    print(f"\nbad inputs rejected: {len(refused)}/{len(BAD_INPUTS)}")
