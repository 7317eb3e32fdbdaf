"""Bad group data is refused with one clear message per problem, before any host is touched."""

import runpy
from pathlib import Path

import pytest

from thorfleet.settings import SettingsError, settings_for

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = {k: v for k, v in runpy.run_path(str(ROOT / "group_data" / "all.py")).items()
            if not k.startswith("_") and k != "os"}
GOOD = {
    **DEFAULTS,
    "weights_model_revision": "4" * 40,
    "weights_draft_revision": "0" * 40,
    "image_base": "registry.example/vllm@sha256:" + "a" * 64,
}


@pytest.fixture
def api_key_file(tmp_path):
    path = tmp_path / "api_key"
    path.write_text("sk-test-key\n")
    return str(path)


def test_good_data_renders(api_key_file):
    s = settings_for({**GOOD, "service_api_key_file": api_key_file})
    assert s.listen_host == "0.0.0.0"
    assert "sk-test-key" not in s.unit_text + s.config_text  # the key only reaches secrets.env
    assert s.secrets_env_text == "VLLM_API_KEY=sk-test-key\n"


BAD_INPUTS = [
    ({"service_profile": "fast"}, "service_profile='fast' is unknown"),
    ({"service_gpu_memory_utilization": 0}, "must be a number in (0, 1]"),
    ({"service_gpu_memory_utilization": 1.2}, "must be a number in (0, 1]"),
    ({"service_gpu_memory_utilization": "0.7"}, "must be a number in (0, 1]"),
    ({"memory_min_available_gib": "95"}, "memory_min_available_gib='95' must be a non-negative"),
    ({"memory_min_available_gib": -1}, "memory_min_available_gib=-1 must be a non-negative"),
    ({"memory_gate_timeout_s": None}, "memory_gate_timeout_s=None must be a non-negative"),
    ({"service_health_timeout_s": -5}, "service_health_timeout_s=-5 must be a non-negative"),
    ({"weights_model_revision": "main"}, "weights_model_revision='main' is not pinned"),
    ({"weights_draft_revision": None}, "weights_draft_revision=None is not pinned"),
    ({"image_base": "ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor"}, "is not pinned by digest"),
    ({"power_mode": 7}, "power_mode=7 is not a T5000 mode"),
    ({"rollout_batch": 0}, "rollout_batch=0 must be at least 1"),
    ({"service_port": 0}, "service_port=0 must be at least 1"),
    ({"preflight_min_l4t_release": "R38"}, "is not a version like 38.0"),
    ({"service_extra_env": {"VLLM_API_KEY": "x"}}, "must not carry secrets"),
]


@pytest.mark.parametrize("change, message", BAD_INPUTS, ids=[str(c) for c, _ in BAD_INPUTS])
def test_bad_input_is_refused_with_a_clear_message(change, message, api_key_file):
    with pytest.raises(SettingsError) as error:
        settings_for({**GOOD, "service_api_key_file": api_key_file, **change})
    assert any(message in p for p in error.value.problems), error.value.problems


def test_no_api_key_needs_an_explicit_setting(monkeypatch):
    monkeypatch.delenv("THORFLEET_API_KEY", raising=False)
    with pytest.raises(SettingsError, match="no API key"):
        settings_for(GOOD)
    s = settings_for({**GOOD, "service_allow_no_api_key": True})
    assert s.listen_host == "127.0.0.1"  # without a key, only localhost unless told otherwise
    with pytest.raises(SettingsError, match="would expose the server"):
        settings_for({**GOOD, "service_allow_no_api_key": True, "service_host": "0.0.0.0"})


def test_every_problem_is_named_at_once(api_key_file):
    with pytest.raises(SettingsError) as error:
        settings_for({**GOOD, "service_api_key_file": api_key_file, "service_profile": "x",
                      "power_mode": 9, "weights_model_revision": "main"})
    assert len(error.value.problems) == 3


def test_a_missing_secrets_file_is_named(tmp_path):
    with pytest.raises(SettingsError, match="cannot read a secrets file"):
        settings_for({**GOOD, "service_api_key_file": str(tmp_path / "nope")})
