"""Bad group data is refused with one clear message per problem, before any host is touched.

Fast: no Docker, no SSH. The schema (thorfleet/settings/schema.py) against group_data/all.py, every rule
refusing a bad value with its message, a typo'd key told the real one, a good inventory passing.

The edits that break the API key's length test (tried once):
schema.API_KEY_MIN lowered below 16; the length's problem naming the key itself.
"""

import ast
import runpy
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from thorfleet.plan import settings_for, settings_for_inventory, settings_for_run
from thorfleet.run import rollout
from thorfleet.settings import layout, render
from thorfleet.settings.layout import BOX_MODELS
from thorfleet.settings.schema import FIELDS, PREFIXES, REQUIRED, SettingsError

ROOT = Path(__file__).resolve().parents[2]
ALL_PY = ROOT / "group_data" / "all.py"



def imported_names(path) -> set[str]:
    """The names a file's import statements bind: pyinfra leaves them out of group data."""
    return {alias.asname or alias.name.split(".")[0]
            for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names}


def all_py_defaults(monkeypatch=None):
    """group_data/all.py as pyinfra reads it (imported names are not data)."""
    values = runpy.run_path(str(ALL_PY))
    return {k: v for k, v in values.items()
            if not k.startswith("_") and k not in imported_names(ALL_PY)}


DEFAULTS = all_py_defaults()
GOOD = {
    **DEFAULTS,
    "weights_hf_endpoint": None,
    "weights_model_revision": "4" * 40,
    "weights_draft_revision": "5" * 40,
    "image_base": "registry.example/vllm@sha256:" + "a" * 64,
}


@pytest.fixture
def api_key_file(tmp_path):
    path = tmp_path / "api_key"
    path.write_text("sk-test-key-0123456789\n")
    path.chmod(0o600)
    return str(path)


def refused(change, api_key_file):
    with pytest.raises(SettingsError) as error:
        settings_for({**GOOD, "service_api_key_file": api_key_file, **change})
    return error.value.problems


# --- group_data/all.py hands pyinfra the schema's defaults -------------------------------------

def test_group_data_gives_pyinfra_every_setting_at_the_schemas_default(monkeypatch):
    """Every key pyinfra's host data holds by default is a setting, at its one declared default
    (HF_ENDPOINT unset: the one the file takes from the laptop's environment)."""
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    found = all_py_defaults()
    assert set(found) == set(FIELDS), "group_data/all.py sets a key thorfleet does not know"
    for key, field in FIELDS.items():
        assert found[key] == field.default, key
        assert type(found[key]) is type(field.default), key  # 7 stays 7, not 7.0
    found["service_media_domains"].append("example.com")  # each host's its own copy
    assert all_py_defaults()["service_media_domains"] == []


def test_group_data_takes_the_hub_from_the_laptops_environment(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example")
    assert all_py_defaults()["weights_hf_endpoint"] == "https://hub.example"


def test_every_setting_has_a_prefix_and_a_fix():
    for key, field in FIELDS.items():
        assert key.startswith((*PREFIXES, "ssh_")), key
        assert field.json_schema_extra["must"], key


def test_the_default_weights_dir_is_the_layouts():
    assert FIELDS["weights_dir"].default == BOX_MODELS


def test_only_the_pins_have_no_usable_default():
    assert set(REQUIRED) == {"weights_model_revision", "weights_draft_revision", "image_base"}
    problems = refused({k: FIELDS[k].default for k in REQUIRED}, None)
    assert len([p for p in problems if "not pinned" in p]) == 3, problems


# --- good data ------------------------------------------------------------------------------------

def test_good_data_renders(api_key_file):
    s = settings_for({**GOOD, "service_api_key_file": api_key_file})
    assert s.listen_host == "0.0.0.0"
    assert "sk-test-key-0123456789" not in s.unit_text + s.config_text  # the key only reaches secrets.env
    assert s.secrets_env_text == "VLLM_API_KEY=sk-test-key-0123456789\n"
    assert "sk-test-key-0123456789" not in repr(s)
    assert s.service_port == 8002 and s.memory_gate_margin_gib == 7
    assert "--margin-gib 7 " in s.unit_text  # a number renders as written


def test_the_shared_image_is_the_local_tag_under_the_registry(api_key_file):
    s = settings_for({**GOOD, "service_api_key_file": api_key_file})
    assert s.image_shared_ref is None  # no registry: every box builds its own
    shared = settings_for({**GOOD, "service_api_key_file": api_key_file,
                           "image_registry": "registry.site:5000/thorfleet"})
    assert shared.image_shared_ref == ("registry.site:5000/thorfleet/mistral-small4:"
                                       + shared.image_tag.rsplit(":", 1)[1])
    assert shared.image_tag == s.image_tag  # the registry is transport, not an input


def test_only_declared_settings_read_as_attributes(api_key_file):
    s = settings_for({**GOOD, "service_api_key_file": api_key_file, "ssh_user": "ops"})
    with pytest.raises(AttributeError):
        s.ssh_user  # noqa: B018  (pyinfra's own data is not a thorfleet setting)


def test_derived_values_are_computed_once(api_key_file, monkeypatch):
    s = settings_for({**GOOD, "service_api_key_file": api_key_file})
    assert s.fingerprint is s.fingerprint and s.unit_text is s.unit_text
    monkeypatch.setattr(render, "image_files_hash", lambda: pytest.fail("files read again"))
    assert s.image_tag == s.image_tag
    tag, s2 = s.image_tag, settings_for({**GOOD, "service_api_key_file": api_key_file})
    monkeypatch.undo()
    assert s2.image_tag == tag


GOOD_VALUES = [
    {"service_port": 65535}, {"service_gpu_memory_utilization": 1},
    {"memory_min_available_gib": 95}, {"memory_min_available_gib": 0},
    {"ssh_keepalive_interval_s": 0}, {"ssh_strict_host_key_checking": "accept-new"},
    {"preflight_min_l4t_release": "38.2"}, {"preflight_min_l4t_release": 38.0},
    {"power_mode": 0}, {"power_mode": 3}, {"memory_gate_interval_s": 1.5},
    {"weights_dir": "/data/models"}, {"weights_hf_endpoint": "http://hub.internal:8080"},
    {"image_base": "thorfleet-registry:5000/nvidia-ai-iot/vllm:latest-jetson-thor@sha256:" + "b" * 64},
    {"image_name": "registry.local:5000/team/mistral-small4"},
    {"image_registry": "registry.site:5000/thorfleet"}, {"image_registry": None},
    {"service_name": "vllm_2.mistral"}, {"service_profile": "no-eagle"},
    {"service_profile": "vision", "service_images_per_prompt": 10,
     "service_media_domains": ["images.example.com", "cdn.example.org"]},
    {"service_host": "::1"}, {"service_host": "thor-1.lan"}, {"service_allow_no_api_key": "anywhere"},
    {"service_docker_gpus": "1"}, {"service_docker_gpus": "device=0,1"},
    {"service_docker_ulimits": {"memlock": -1, "nofile": "65536:65536"}},
    {"service_extra_env": {"VLLM_LOGGING_LEVEL": "DEBUG", "NCCL_P2P_LEVEL": 3, "A_B": "x:y=z,w/v"}},
    {"rollout_batch": 3}, {"rollout_canary_group": "canary"}, {"ssh_user": "anything: not ours"},
    {"weights_hf_endpoint": "https://[fd00::5]:8443/mirror/"}, {"weights_hf_endpoint": None},
    {"weights_hf_allow_plain_http": True}, {"service_host": "fe80::1%eth0"},
    {"weights_dir": "/home/ubuntu/models"}, {"weights_dir": "/opt/thorfleet/models/site"},
    {"weights_peer_address": "10.0.0.7:2222"}, {"service_name": "thorfleet-vllm-2"},
    {"service_extra_env": {"A": "é,ü;#!"}},
]


@pytest.mark.parametrize("change", GOOD_VALUES, ids=[str(c) for c in GOOD_VALUES])
def test_good_values_pass(change, api_key_file):
    settings_for({**GOOD, "service_api_key_file": api_key_file, **change})


# --- every rule refuses a bad value, saying key, value and fix ----------------------------------

BAD_INPUTS = [
    ({"gateway_serves_model": "yes"}, "gateway_serves_model='yes' must be True or False"),
    ({"gateway_port": 0}, "gateway_port=0 must be at least 1 and at most 65535"),
    ({"gateway_names": ["gw.lan", "gw lan"]}, "['gw lan'] is not a DNS name or IP address"),
    ({"gateway_names": "gw.lan"}, "gateway_names='gw.lan' must be a list of DNS names"),
    ({"gateway_tls_cert_file": ""}, "gateway_tls_cert_file='' must be a file path on the laptop"),
    ({"gateway_tls_key_file": 5}, "gateway_tls_key_file=5 must be a file path on the laptop"),
    ({"gateway_ca_dir": None}, "gateway_ca_dir=None must be a folder path on the laptop"),
    ({"gateway_fleet_address": "10.0.0.5/24"}, "gateway_fleet_address='10.0.0.5/24' must be an IP"),
    ({"gateway_fleet_address": "gw.lan"}, "gateway_fleet_address='gw.lan' must be an IP address"),
    ({"gateway_virtual_ip": "10.0.0.50"}, "gateway_virtual_ip='10.0.0.50' is not an IPv4 address with"),
    ({"gateway_virtual_ip": "10.0.0.050/24"}, "gateway_virtual_ip='10.0.0.050/24' is not an IPv4"),
    ({"gateway_virtual_ip": "10.0.0.255/24"}, "is its network's own or broadcast address"),
    ({"gateway_virtual_ip": "fd00::50/64"}, "gateway_virtual_ip='fd00::50/64' is not an IPv4"),
    ({"gateway_vrrp_router_id": 256}, "gateway_vrrp_router_id=256 must be a whole number from 1"),
    ({"monitor_fleet_address": "mon.lan"}, "monitor_fleet_address='mon.lan' must be an IP address"),
    ({"gateway_queue_timeout_s": 0.5}, "gateway_queue_timeout_s=0.5 must be a whole number"),
    ({"gateway_check_interval_s": 0}, "gateway_check_interval_s=0 must be a whole number"),
    ({"gateway_retry_after_s": 0}, "gateway_retry_after_s=0 must be a whole number"),
    ({"gateway_affinity_balance_factor": 99},
     "gateway_affinity_balance_factor=99 must be a whole number from 100 to 1000"),
    ({"gateway_clients": {"Al ice": "~/alice.key"}}, "gateway_clients has 'Al ice', not a client name"),
    ({"gateway_clients": ["~/alice.key"]}, "must be a dict of client name: key file path"),
    ({"gateway_client_max_inflight": 0}, "gateway_client_max_inflight=0 must be a whole number"),
    ({"gateway_client_requests_per_minute": 1.5},
     "gateway_client_requests_per_minute=1.5 must be a whole number"),
    ({"gateway_client_tokens_per_minute": 999},
     "gateway_client_tokens_per_minute=999 must be a whole number of tokens, at least 1000"),
    ({"gateway_client_tokens_per_day": 2.5e6},
     "gateway_client_tokens_per_day=2500000.0 must be a whole number of tokens"),
    ({"gateway_client_tokens_per_month": True},
     "gateway_client_tokens_per_month=True must be a whole number of tokens"),
    ({"ssh_strict_host_key_checking": "strict"},
     "ssh_strict_host_key_checking='strict' is not one of pyinfra's values: use 'yes'"),
    ({"ssh_keepalive_interval_s": -1}, "ssh_keepalive_interval_s=-1 must be a non-negative number"),
    ({"preflight_min_l4t_release": "R38"}, "preflight_min_l4t_release='R38' is not a version like 38.0"),
    ({"preflight_min_memory_gib": "100G"}, "preflight_min_memory_gib='100G' must be a non-negative"),
    ({"preflight_min_free_disk_gib": -1}, "preflight_min_free_disk_gib=-1 must be a non-negative"),
    ({"preflight_lock_wait_s": -5}, "preflight_lock_wait_s=-5 must be a non-negative number"),
    ({"power_mode": 7}, "power_mode=7 is not a T5000 mode (0, 1, 2, 3)"),
    ({"power_mode": True}, "power_mode=True is not a T5000 mode"),
    ({"power_mode": "1"}, "power_mode='1' is not a T5000 mode"),
    ({"power_allow_reboot": "yes"}, "power_allow_reboot='yes' must be True or False"),
    ({"power_reboot_timeout_s": 0}, "power_reboot_timeout_s=0 must be a positive number of seconds"),
    ({"memory_min_available_gib": "95"}, "memory_min_available_gib='95' must be a non-negative"),
    ({"memory_min_available_gib": -1}, ("memory_min_available_gib=-1 must be a non-negative number, "
                                        "or None to derive it from service_gpu_memory_utilization")),
    ({"memory_gate_margin_gib": -1}, "memory_gate_margin_gib=-1 must be a non-negative number"),
    ({"memory_gate_timeout_s": None}, "memory_gate_timeout_s=None must be a positive whole number"),
    ({"memory_gate_timeout_s": -5}, "memory_gate_timeout_s=-5 must be a positive whole number"),
    ({"memory_gate_timeout_s": 0}, "memory_gate_timeout_s=0 must be a positive whole number"),
    ({"memory_gate_timeout_s": 2.5}, "memory_gate_timeout_s=2.5 must be a positive whole number"),
    ({"memory_gate_interval_s": 0}, "memory_gate_interval_s=0 must be a number of seconds, at least 1"),
    ({"weights_dir": "models"}, "weights_dir='models' must be an absolute path on the box"),
    ({"weights_dir": "/data/my models"}, "weights_dir='/data/my models' must be an absolute path"),
    ({"weights_dir": "/data/../etc"}, "weights_dir='/data/../etc' must be an absolute path"),
    ({"weights_dir": "/data/m:rw"}, "weights_dir='/data/m:rw' must be an absolute path"),
    ({"weights_model_repo": "Mistral-Small-4"},
     "weights_model_repo='Mistral-Small-4' is not a Hugging Face repo id like owner/name"),
    ({"weights_draft_repo": None}, "weights_draft_repo=None is not a Hugging Face repo id"),
    ({"weights_model_revision": "main"}, "weights_model_revision='main' is not pinned"),
    ({"weights_model_revision": "A" * 40}, "is not pinned: set the 40-hex commit hash"),
    ({"weights_draft_revision": None}, "weights_draft_revision=None is not pinned"),
    ({"weights_hf_endpoint": "hub.internal"},
     "weights_hf_endpoint='hub.internal' must be an http(s) URL"),
    ({"weights_hf_token_file": ""}, "weights_hf_token_file='' must be a file path on the laptop"),
    ({"weights_hf_allow_plain_http": "yes"},
     "weights_hf_allow_plain_http='yes' must be True or False"),
    ({"weights_hf_endpoint": "http://hub.internal\n"}, "must be an http(s) URL"),
    ({"weights_hf_endpoint": "http://hub internal"}, "must be an http(s) URL"),
    ({"weights_hf_endpoint": "http://hub.internal:99999"}, "must be an http(s) URL"),
    ({"weights_hf_endpoint": "https://user@hub.internal"}, "must be an http(s) URL"),
    ({"weights_dir": "/etc"}, "weights_dir='/etc' is not a folder of its own (it is inside /etc"),
    ({"weights_dir": "/opt/thorfleet"}, "it is or holds thorfleet's /opt/thorfleet"),
    ({"weights_dir": "/home/thor/.cache/huggingface"}, "is inside a hidden folder (.cache)"),
    ({"weights_dir": "/data/.snapshots/models"}, "is inside a hidden folder (.snapshots)"),
    ({"service_port": 22}, "service_port=22 is this host's SSH port (ssh_port 22)"),
    ({"ssh_port": 2222, "service_port": 2222}, "service_port=2222 is this host's SSH port"),
    ({"watchdog_port": 22}, "watchdog_port=22 is this host's SSH port"),
    ({"weights_model_repo": "mistralai/.."}, "is not a Hugging Face repo id"),
    ({"weights_model_repo": "mistralai/a--b"}, "is not a Hugging Face repo id"),
    ({"service_name": "ssh"}, ("service_name='ssh' is not a name both systemd and Docker accept "
                              "that is thorfleet's own")),
    ({"service_name": "thorfleet-clocks"}, "is a name thorfleet uses for something else"),
    ({"service_name": "thorfleet-watchdog"}, "is a name thorfleet uses for something else"),
    ({"service_name": "thorfleet-firewall"}, "is a name thorfleet uses for something else"),
    ({"service_name": "thorfleet-image"}, "is a name thorfleet uses for something else"),
    ({"service_name": "thorfleet-fetch-0123"}, "is a name thorfleet uses for something else"),
    ({"service_host": "fe80::1%x y"}, "must be an IP address or host name"),
    ({"service_host": "thor..lan"}, "must be an IP address or host name"),
    ({"service_docker_ulimits": {"nofile": 1.5}}, "service_docker_ulimits['nofile']=1.5 must be"),
    ({"service_extra_env": {"A": float("nan")}}, "service_extra_env['A']=nan must be a string or"),
    ({"service_extra_env": {"A": "x\u2028y"}}, "is not safe in a unit line"),
    ({"memory_gate_timeout_s": 10**30},
     "memory_gate_timeout_s=1000000000000000000000000000000 is more than 1000000000 seconds"),
    ({"rollout_drain_timeout_s": 2**40}, "rollout_drain_timeout_s=1099511627776 is more than"),
    ({"image_name": "registry.example/vllm"},
     "image_name='registry.example/vllm' is image_base's own repository"),
    ({"memory_gate_interval_s": float("inf")},
     "memory_gate_interval_s=inf must be a number of seconds, at least 1, not inf or nan"),
    ({"memory_min_available_gib": float("nan")},
     ("memory_min_available_gib=nan must be a non-negative number, or None to derive it from "
     "service_gpu_memory_utilization, not inf or nan")),
    ({"weights_source": "mirror"}, "weights_source='mirror' is not 'auto', 'hub' or 'fleet'"),
    ({"weights_peer_address": "thor-2:22 "}, "weights_peer_address='thor-2:22 ' is not a host"),
    ({"weights_peer_key_file": ""}, "weights_peer_key_file='' must be a file path on the laptop"),
    ({"image_source": "registry"}, "image_source='registry' is not 'auto', 'build' or 'fleet'"),
    ({"image_peer_key_file": ""}, "image_peer_key_file='' must be a file path on the laptop"),
    ({"weights_progress_interval_s": 0},
     "weights_progress_interval_s=0 must be a number of seconds above 0"),
    ({"image_base": "ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor"}, "is not pinned by digest"),
    ({"image_registry": "registry.site:5000/thorfleet:latest"},
     "image_registry='registry.site:5000/thorfleet:latest' is not a registry path"),
    ({"image_base": "vllm@sha256:abc"}, "image_base='vllm@sha256:abc' is not pinned by digest"),
    ({"image_base": "Bad Name@sha256:" + "a" * 64}, "is not pinned by digest"),
    ({"image_name": "Thorfleet/Mistral"}, "image_name='Thorfleet/Mistral' is not a Docker repository"),
    ({"image_name": "thorfleet/mistral:v1"}, "without a tag"),
    ({"image_think_prefill": 1}, "image_think_prefill=1 must be True or False"),
    ({"service_name": "thor vllm"}, "service_name='thor vllm' is not a name both systemd and Docker"),
    ({"service_name": "-vllm"}, "service_name='-vllm' is not a name both systemd and Docker accept"),
    ({"service_name": "vllm@1"}, "is not a name both systemd and Docker accept"),
    ({"service_profile": "fast"}, "service_profile='fast' is unknown: use one of ['default', "),
    ({"service_images_per_prompt": 0}, "service_images_per_prompt=0 must be a whole number from"),
    ({"service_prefix_caching": "on"},
     "service_prefix_caching='on' must be True, False, or None for the profile's default"),
    ({"service_prefix_caching": 1}, "service_prefix_caching=1 must be True, False, or None"),
    ({"service_images_per_prompt": "4"}, "service_images_per_prompt='4' must be a whole number"),
    # 11 images of 3,080 tokens are more than half of the vision profile's 64K
    ({"service_images_per_prompt": 11},
     "service_images_per_prompt=11 does not fit the vision profile's context"),
    ({"service_media_domains": "images.example.com"},
     "service_media_domains='images.example.com' must be a list of domain names"),
    ({"service_media_domains": ["https://images.example.com"]}, "is not a domain name"),
    ({"service_media_domains": ["images.example.com/cats"]}, "is not a domain name"),
    ({"service_media_domains": ["*.example.com"]}, "is not a domain name"),
    ({"service_media_domains": ["10.0.0.5"]}, "is not a domain name"),
    ({"service_media_domains": ["fd00::5"]}, "is not a domain name"),
    ({"service_media_domains": ["Images.example.com"]}, "is not a domain name"),
    ({"service_media_domains": ["images.example.com:8080"]}, "is not a domain name"),
    ({"service_media_domains": ["images.example.com\n"]}, "is not a domain name"),
    ({"service_host": "0.0.0.0\nport: 1"}, "must be an IP address or host name"),
    ({"service_port": 0}, "service_port=0 must be at least 1"),
    ({"service_port": 70000}, "service_port=70000 must be at least 1 and at most 65535"),
    ({"service_port": "8002"}, "service_port='8002' must be at least 1 and at most 65535"),
    ({"service_gpu_memory_utilization": 0}, "must be a number in (0, 1]"),
    ({"service_gpu_memory_utilization": 1.2}, "must be a number in (0, 1]"),
    ({"service_gpu_memory_utilization": "0.7"},
     "service_gpu_memory_utilization='0.7' must be a number in (0, 1]"),
    ({"service_allow_no_api_key": "yes"}, "service_allow_no_api_key='yes' must be True, False or"),
    ({"service_health_timeout_s": -5}, "service_health_timeout_s=-5 must be a positive number"),
    ({"service_health_timeout_s": "20m"}, "service_health_timeout_s='20m' must be a positive number"),
    ({"service_docker_gpus": "everything"}, "service_docker_gpus='everything' is not a docker --gpus"),
    ({"service_docker_ulimits": {"memlok": "-1"}},
     "service_docker_ulimits has 'memlok', not a ulimit docker knows: did you mean memlock?"),
    ({"service_docker_ulimits": {"stack": "big"}},
     "service_docker_ulimits['stack']='big' must be a number, -1 for unlimited, or SOFT:HARD"),
    ({"service_docker_ulimits": ["memlock=-1"]}, "must be a dict of ulimit name: value"),
    ({"service_extra_env": {"VLLM_API_KEY": "x"}}, "service_extra_env must not carry secrets"),
    ({"service_extra_env": {"HF_TOKEN": "x"}}, "service_extra_env must not carry secrets (HF_TOKEN)"),
    ({"service_extra_env": {"1BAD": "x"}},
     "service_extra_env has '1BAD', not an environment variable name"),
    ({"service_extra_env": {"BAD-NAME": "x"}}, "not an environment variable name"),
    ({"service_extra_env": {"A": "x\nExecStartPre=/bin/sh"}},
     "service_extra_env['A']='x\\nExecStartPre=/bin/sh' is not safe in a unit line"),
    ({"service_extra_env": {"A": "$HOME"}}, "is not safe in a unit line"),
    ({"service_extra_env": {"A": "100%"}}, "is not safe in a unit line"),
    ({"service_extra_env": {"A": 'say "hi"'}}, "is not safe in a unit line"),
    ({"service_extra_env": {"A": "two words"}}, "is not safe in a unit line"),
    ({"service_extra_env": {"A": None}}, "service_extra_env['A']=None must be a string or a number"),
    ({"service_extra_env": "A=1"}, "service_extra_env='A=1' must be a dict of NAME: value"),
    ({"rollout_batch": 0}, "rollout_batch=0 must be at least 1"),
    ({"rollout_batch": 1.5}, "rollout_batch=1.5 must be at least 1 (a whole number of hosts)"),
    ({"rollout_canary_group": "canary thors"}, "must be the name of a group of the inventory"),
    ({"rollout_report_path": ""}, "rollout_report_path='' must be a file path on the laptop"),
    ({"rollout_drain_timeout_s": -1}, "rollout_drain_timeout_s=-1 must be a whole number of seconds"),
    ({"rollout_drain_timeout_s": 1.5}, "rollout_drain_timeout_s=1.5 must be a whole number of"),
    ({"rollout_benchmark": "sometimes"}, "rollout_benchmark='sometimes' must be 'first-install'"),
    ({"rollout_bench_min_fraction": 1.5}, "rollout_bench_min_fraction=1.5 must be a number in [0, 1]"),
    ({"rollout_bench_min_toks": "27"}, "rollout_bench_min_toks='27' must be a non-negative number"),
    ({"watchdog_interval_s": 0}, "watchdog_interval_s=0 must be a whole number of seconds, at least 1"),
    ({"watchdog_interval_s": 7.5}, "watchdog_interval_s=7.5 must be a whole number of seconds"),
    ({"watchdog_failures": 0}, "watchdog_failures=0 must be a whole number of checks, at least 1"),
    ({"watchdog_timeout_s": "20"}, "watchdog_timeout_s='20' must be a whole number of seconds"),
    ({"watchdog_restart_backoff_s": -1}, "watchdog_restart_backoff_s=-1 must be a whole number"),
    ({"watchdog_max_restarts_per_hour": 0}, "watchdog_max_restarts_per_hour=0 must be a whole"),
    ({"watchdog_give_up_after": 0}, "watchdog_give_up_after=0 must be a whole"),
    ({"watchdog_start_timeout_s": 0}, "watchdog_start_timeout_s=0 must be a whole number of seconds"),
    ({"watchdog_port": 70000}, "watchdog_port=70000 must be at least 1 and at most 65535"),
    ({"watchdog_port": 8002}, "watchdog_port=8002 is service_port too"),
    ({"watchdog_port": 0}, "watchdog_port=0 must be at least 1 and at most 65535"),
    ({"monitor_scrape_interval_s": 0}, "monitor_scrape_interval_s=0 must be a whole number"),
    ({"monitor_scrape_interval_s": 1.5}, "monitor_scrape_interval_s=1.5 must be a whole number"),
    ({"monitor_retention": "15 days"}, "monitor_retention='15 days' is not a Prometheus duration"),
    ({"monitor_retention": "1d15m2h"}, "monitor_retention='1d15m2h' is not a Prometheus duration"),
    ({"monitor_retention": "0"}, "monitor_retention='0' is not a Prometheus duration"),
    ({"monitor_retention": ""}, "monitor_retention='' is not a Prometheus duration"),
    ({"monitor_retention": "15d\n"}, "monitor_retention='15d\\n' is not a Prometheus duration"),
    ({"monitor_retention": "300000000y"}, "monitor_retention='300000000y' is not a Prometheus"),
]


@pytest.mark.parametrize("change, message", BAD_INPUTS, ids=[str(c) for c, _ in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_message(change, message, api_key_file):
    problems = refused(change, api_key_file)
    assert any(message in p for p in problems), problems
    assert len(problems) == 1, problems  # one line for one mistake
    assert all("\n" not in p.replace("\\n", "") for p in problems)


def test_every_declared_setting_has_a_bad_value_above():
    tried = {key for change, _ in BAD_INPUTS for key in change} - {"ssh_port"}  # pyinfra's own
    assert tried == set(FIELDS) - {"service_api_key_file"}, set(FIELDS) - tried


def test_a_typo_in_a_thorfleet_key_is_told_the_real_one(api_key_file):
    problems = refused({"service_prot": 8002}, api_key_file)
    assert problems == ["service_prot=8002 is not a thorfleet setting: did you mean service_port?"]
    problems = refused({"memory_gate_timout_s": 60, "rollout_canary": "c"}, api_key_file)
    assert "memory_gate_timout_s=60 is not a thorfleet setting: did you mean " \
           "memory_gate_timeout_s?" in problems
    assert "rollout_canary='c' is not a thorfleet setting: did you mean rollout_canary_group?" \
        in problems
    problems = refused({"service_colour": "blue"}, api_key_file)
    assert problems == [("service_colour='blue' is not a thorfleet setting: see docs/settings.md "
                         "for every setting")]


def test_keys_without_a_thorfleet_prefix_are_left_to_pyinfra(api_key_file):
    settings_for({**GOOD, "service_api_key_file": api_key_file, "ssh_user": "ops",
                  "ssh_port": 2222, "my_own_note": "x"})


def test_no_api_key_needs_an_explicit_setting(monkeypatch):
    monkeypatch.delenv("THORFLEET_API_KEY", raising=False)
    with pytest.raises(SettingsError, match="no API key"):
        settings_for(GOOD)
    s = settings_for({**GOOD, "service_allow_no_api_key": True})
    assert s.listen_host == "127.0.0.1"  # without a key, only localhost unless told otherwise
    with pytest.raises(SettingsError, match="would expose the server"):
        settings_for({**GOOD, "service_allow_no_api_key": True, "service_host": "0.0.0.0"})
    s = settings_for({**GOOD, "service_allow_no_api_key": "anywhere", "service_host": "0.0.0.0"})
    assert s.listen_host == "0.0.0.0"


def test_a_token_is_not_sent_to_a_plain_http_hub_unless_allowed(tmp_path, api_key_file):
    token = tmp_path / "hf_token"
    token.write_text("hf_" + "x" * 30 + "\n")
    token.chmod(0o600)
    data = {**GOOD, "service_api_key_file": api_key_file, "weights_hf_token_file": str(token),
            "weights_hf_endpoint": "http://hub.internal:8080"}
    with pytest.raises(SettingsError) as error:
        settings_for(data)
    assert error.value.problems == [
        ("weights_hf_endpoint='http://hub.internal:8080' is plain HTTP and a Hugging Face token is "
        "set: the token, and the code the model runs (trust_remote_code), would travel "
        "unencrypted; use https://, or set weights_hf_allow_plain_http=True if you trust that "
        "network")]
    settings_for({**data, "weights_hf_allow_plain_http": True})
    settings_for({**data, "weights_hf_endpoint": "https://hub.internal:8443"})
    settings_for({**data, "weights_hf_token_file": None})  # nothing to send: a site mirror


def test_secrets_that_their_files_cannot_hold_as_they_are_are_refused(tmp_path):
    key = tmp_path / "api_key"
    for bad in ("sk key", "sk'key", 'sk"key', "sk\\key", "sk$key", "sk`key", "sk\x01key",
                "sk\nFOO=bar"):
        key.write_text(bad + "\n")
        key.chmod(0o600)
        with pytest.raises(SettingsError) as error:
            settings_for({**GOOD, "service_api_key_file": str(key)})
        assert len(error.value.problems) == 1 and "the API key" in error.value.problems[0]
        assert bad not in error.value.problems[0]  # never the key itself
    key.write_text("sk-" + "Az09-._~+/=" * 3 + "\n")
    key.chmod(0o600)
    assert settings_for({**GOOD, "service_api_key_file": str(key)}).secrets_env_text.count("\n") == 1
    token = tmp_path / "hf_token"
    token.write_text("hf_abc\nhf_def\n")
    token.chmod(0o600)
    with pytest.raises(SettingsError, match="the Hugging Face token"):
        settings_for({**GOOD, "service_api_key_file": str(key), "weights_hf_token_file": str(token)})


def test_every_problem_is_named_at_once(api_key_file):
    problems = refused({"service_profile": "x", "power_mode": 9, "weights_model_revision": "main",
                        "service_prot": 1}, api_key_file)
    assert len(problems) == 4, problems


def test_a_missing_secrets_file_is_named_with_its_key_and_fix_and_hides_nothing(tmp_path):
    """A newcomer's first check: the key file not made yet. It is one problem among the others,
    named by its key with the fix, not the only one reported (nor 'no API key')."""
    with pytest.raises(SettingsError) as error:
        settings_for({**GOOD, "service_api_key_file": str(tmp_path / "nope"), "power_mode": 9,
                      "weights_hf_token_file": str(tmp_path / "no-token")})
    problems = error.value.problems
    assert problems[0].startswith(f"service_api_key_file={str(tmp_path / 'nope')!r} cannot be "
                                  "read (No such file or directory): make it: mkdir"), problems
    assert problems[1].startswith("weights_hf_token_file="), problems
    assert any(p.startswith("power_mode=9") for p in problems), problems
    assert not any(p.startswith("no API key") for p in problems), problems


@pytest.mark.parametrize("key, value", [
    ("weights_model_revision", "0" * 40), ("weights_draft_revision", "0" * 40),
    ("image_base", "ghcr.io/nvidia-ai-iot/vllm@sha256:" + "0" * 64),
])
def test_a_placeholder_pin_is_refused(api_key_file, key, value):
    """All zeros has the shape of a pin and is none: refused, pointing at `pin`."""
    said = f"{key}={value!r} is a placeholder, not a pin: python -m thorfleet pin looks the real one up"
    assert refused({key: value}, api_key_file) == [said]


# --- a whole inventory ----------------------------------------------------------------------------

def inventory(api_key_file, hosts=("thor-1", "thor-2"), **group_data):
    return Inventory((list(hosts), {**GOOD, "service_api_key_file": api_key_file}),
                     canary=(["thor-1"], group_data))


def test_a_good_inventory_passes(api_key_file):
    settings = settings_for_inventory(inventory(api_key_file, rollout_canary_group="canary"))
    assert sorted(settings) == ["thor-1", "thor-2"]
    assert settings["thor-1"].fingerprint == settings["thor-2"].fingerprint


def test_problems_name_the_host(api_key_file):
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(api_key_file, service_prot=8003))
    assert error.value.problems == [
        "thor-1: service_prot=8003 is not a thorfleet setting: did you mean service_port?"]


def test_the_canary_group_must_exist(api_key_file):
    inv = Inventory((["thor-1", "thor-2"], {**GOOD, "service_api_key_file": api_key_file,
                                             "rollout_canary_group": "canaries"}),
                    canary=(["thor-1"], {}))
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    assert error.value.problems == [
        f"{h}: rollout_canary_group='canaries' is not a group of this inventory: use one of "
        "['canary'] or None" for h in ("thor-1", "thor-2")]


def test_two_services_on_one_port_of_one_box(api_key_file):
    hosts = [("thor-1", {"ssh_hostname": "10.0.0.5"}), ("thor-1b", {"ssh_hostname": "10.0.0.5"})]
    with pytest.raises(SettingsError, match="two services cannot share one port"):
        settings_for_inventory(inventory(api_key_file, hosts=hosts))


def test_the_image_files_are_read_once_per_inventory(api_key_file, monkeypatch):
    reads = []
    real = render.image_files_hash
    monkeypatch.setattr("thorfleet.plan.image_files_hash", lambda: reads.append(1) or real())
    settings = settings_for_inventory(inventory(api_key_file, hosts=[f"thor-{i}" for i in range(5)]))
    assert len({s.image_tag for s in settings.values()}) == 1 and len(reads) == 1


def test_the_run_holds_its_checked_settings(api_key_file):
    class Run:  # stands in for pyinfra's State: it holds the inventory
        pass

    run = Run()
    run.inventory = inventory(api_key_file)
    assert settings_for_run(run) is settings_for_run(run)
    bad = Run()
    bad.inventory = inventory(api_key_file, power_mode=5)
    with pytest.raises(SettingsError, match="thor-1: power_mode=5"):
        settings_for_run(bad)
    with pytest.raises(SettingsError, match="thor-1: power_mode=5"):
        settings_for_run(bad)


# --- one restart order for the whole run (thorfleet.run.rollout.plan) ---------------------------------

def test_a_canary_group_named_in_its_own_group_data_orders_every_host(api_key_file):
    # group_data/canary.py (or the inventory's canary group) is where an operator names it
    hosts = (["thor-1", "thor-2", "thor-3"], {**GOOD, "service_api_key_file": api_key_file})
    inv = Inventory(hosts, canary=(["thor-3"], {"rollout_canary_group": "canary"}))
    settings = settings_for_inventory(inv)
    plans = {name: rollout.plan(inv, s.rollout_batch, s.rollout_canary_group)
             for name, s in settings.items()}
    for name, plan in plans.items():
        assert plan.batches == [["thor-3"], ["thor-1"], ["thor-2"]], name
        assert plan.canaries == {"thor-3"}, name


def test_hosts_that_name_different_canary_groups_are_refused(api_key_file):
    inv = Inventory((["thor-1", "thor-2", "thor-3"], {**GOOD, "service_api_key_file": api_key_file}),
                    canary=(["thor-1"], {"rollout_canary_group": "canary"}),
                    early=(["thor-2", "thor-3"], {"rollout_canary_group": "early"}))
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    assert error.value.problems == [(
        "thor-1: rollout_canary_group='canary' but thor-2, thor-3: rollout_canary_group='early': "
        "the restart order is one plan for the whole run: name one canary group (in "
        "group_data/all.py, or in that group's own data)")]


def test_hosts_with_different_batch_sizes_are_refused(api_key_file):
    inv = Inventory((["thor-1", "thor-2", "thor-3"], {**GOOD, "service_api_key_file": api_key_file}),
                    canary=(["thor-1"], {"rollout_batch": 2}))
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    assert error.value.problems == [(
        "thor-1: rollout_batch=2 but thor-2, thor-3: rollout_batch=1: the restart order is one "
        "plan for the whole run: set rollout_batch once (in group_data/all.py, or in the data "
        "of a group every host is in)")]


def test_the_fingerprint_holds_nothing_derived_from_the_key(tmp_path):
    # it is shown in the report, pyinfra's output and the box's process list: with the key in
    # its hash, a short key could be brute-forced from it and the unit and config (readable on
    # the box). Whether the server runs the live key is compared on the box instead.
    prints = set()
    for key in ("sk-first-key-0123456789", "sk-rotated-key-0123456789"):
        path = tmp_path / key
        path.write_text(key + "\n")
        path.chmod(0o600)
        s = settings_for({**GOOD, "service_api_key_file": str(path)})
        assert key in s.secrets_env_text
        prints.add(s.fingerprint)
    assert len(prints) == 1


def test_every_unit_container_and_user_thorfleet_installs_is_refused_as_service_name(
        api_key_file):
    """The class, not its examples: each unit file thorfleet ships (but the server's own template)
    and each user and container it makes is in layout.BOX_OWN_NAMES, which service_name may not
    take (a new unit file without it fails here)."""
    units = {path.name.split(".service")[0] for path in (ROOT / "files").glob("*/systemd/*")
             if ".service" in path.name}  # not the drop-ins (.conf); a Thor may be the gateway
    assert units - {"thorfleet-vllm"} <= set(layout.BOX_OWN_NAMES), units
    assert {layout.PEER_USER, layout.IMAGE_USER, layout.FETCH_CONTAINER} <= set(layout.BOX_OWN_NAMES)
    for name in layout.BOX_OWN_NAMES:
        problems = refused({"service_name": name}, api_key_file)
        assert any("is a name thorfleet uses for something else" in p for p in problems), name


def test_an_api_key_shorter_than_a_client_key_is_refused_without_showing_it(tmp_path,
                                                                              monkeypatch):
    """The boxes' key opens every box (and the door, without gateway_clients): at least 16
    characters, as a client key (gateway.config.CLIENT_KEY), from the file or the environment."""
    key = tmp_path / "api_key"
    for short in ("sk-12345678901", "x" * 15):
        key.write_text(short + "\n")
        key.chmod(0o600)
        inv = Inventory((["thor-1"], {**GOOD, "service_api_key_file": str(key)}))
        with pytest.raises(SettingsError) as error:
            settings_for_inventory(inv)
        assert error.value.problems == [
            (f"thor-1: the API key (service_api_key_file or THORFLEET_API_KEY) is {len(short)} "
             "characters, under 16: anyone who can reach a box could guess it; make a longer one: "
             "(umask 077; openssl rand -hex 24 > FILE)")]
        assert short not in str(error.value)
    monkeypatch.setenv("THORFLEET_API_KEY", "sk-short")
    with pytest.raises(SettingsError, match="is 8 characters, under 16"):
        settings_for({**GOOD, "service_api_key_file": None})
    key.write_text("x" * 16 + "\n")
    settings_for({**GOOD, "service_api_key_file": str(key)})


def test_a_laptop_secret_others_can_read_or_replace_is_refused(tmp_path, api_key_file):
    """The class: every secret file thorfleet reads on the laptop (the API key, the hub token;
    the gateway's TLS key is held to the same in tests/fast/test_gateway_render.py)."""
    token = tmp_path / "hf_token"
    token.write_text("hf_" + "x" * 30 + "\n")
    token.chmod(0o640)
    assert refused({"weights_hf_token_file": str(token)}, api_key_file) == [
        (f"weights_hf_token_file={str(token)!r} can be read by other users (mode 640): "
         f"chmod 600 {token}")]
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone may swap the file for their own key
    key = shared / "api_key"
    key.write_text("sk-test-key-0123456789\n")
    key.chmod(0o600)
    assert refused({"service_api_key_file": str(key)}, api_key_file) == [
        (f"service_api_key_file={str(key)!r} is in {shared}, which other users can write (mode "
         f"777): they could replace it; chmod go-w {shared}")]
    # sticky, as /tmp: the file cannot be renamed away, but anyone may put theirs there before
    # thorfleet makes one (a client's key, the fleet CA's): the folder that holds a secret is
    # never one others can write (tests/fast/test_laptop_secrets.py holds the rest of the family)
    shared.chmod(0o1777)
    assert refused({"service_api_key_file": str(key)}, api_key_file) == [
        (f"service_api_key_file={str(key)!r} is in {shared}, which other users can write (mode "
         f"1777): they could replace it; chmod go-w {shared}")]
    shared.chmod(0o700)
    settings_for({**GOOD, "service_api_key_file": str(key)})
