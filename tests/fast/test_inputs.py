"""Values that pass the schema must not break out of what thorfleet renders: one story per class.

Each class of issue 19 §1 with its example value: refused with a line naming the key, and where the
value reaches a file or a command, rendered so that it reads back as that value and nothing more
(tests/parse_back.py reads as systemd, sshd's shell, rsync and YAML do). The property test
(tests/fast/test_inputs_property.py) generates the rest of each class.
"""

import ast
import json
import math
import os
import shlex
import subprocess
import sys

import pytest
import yaml
from pyinfra.api import Inventory

from tests.helpers import ROOT
from tests.parse_back import (
    PINS,
    command_words,
    environment_file,
    rsync_words,
    shell_words,
    unit_entries,
)
from thorfleet.plan import settings_for_inventory
from thorfleet.run import peers
from thorfleet.settings import schema
from thorfleet.settings.render import Settings
from thorfleet.settings.schema import SettingsError

KEY = "sk-test-key-0123456789"


def problems_of(change, **check):
    return schema.check({**PINS, **change}, **{"api_key": KEY, **check})[1]


def refused_naming(key, change, **check):
    problems = problems_of(change, **check)
    assert problems, f"{change!r} passes"
    assert len(problems) == 1 and key in problems[0], problems
    return problems[0]


def unchecked(**change):
    """Settings built from values the schema never saw: what the renderers alone make of them."""
    values = schema.Schema.model_construct(**{**schema.Schema(**PINS).model_dump(), **change})
    return Settings(values, api_key=KEY)


def exec_start(s):
    return command_words(next(v for _, k, v in unit_entries(s.unit_text) if k == "ExecStart"))


# --- pattern checks: a whole-value match, never `$` (it matches before a final "\n") ----------

@pytest.mark.parametrize("key, value", [
    ("service_docker_ulimits", {"memlock": "-1\n", "stack": "67108864"}),  # the example
    ("service_extra_env", {"NCCL_DEBUG\n": "INFO"}),
    ("service_host", "thor-1\n"),
    ("preflight_min_l4t_release", "38.0\n"),
])
def test_a_trailing_newline_is_refused(key, value):
    refused_naming(key, {key: value})


def test_every_pattern_of_the_schema_is_a_whole_value_match():
    source = (ROOT / "thorfleet" / "settings" / "schema.py").read_text()
    tree = ast.parse(source)
    calls = [node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr in ("match", "search")]
    assert calls.count("match") == 0, "re.match / .match accepts a trailing newline"
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
               and isinstance(node.value, str)]
    assert not [s for s in strings if s.endswith("$") and s.startswith("^")]
    assert "pattern=" not in source  # pydantic's own patterns: the regex engine decides `$`


def test_a_newline_in_a_ulimit_cannot_end_the_unit_line():
    s = unchecked(service_docker_ulimits={"memlock": "-1\n", "stack": "67108864"})
    argv = exec_start(s)
    assert argv[argv.index("memlock=-1\n") - 1] == "--ulimit"
    assert argv[argv.index("vllm") - 1] == s.image_tag  # the image still ends the options
    assert [k for _, k, _ in unit_entries(s.unit_text)] == \
        [k for _, k, _ in unit_entries(unchecked().unit_text)]


# --- a library more liberal than the file: ipaddress takes anything after an IPv6 `%` -----------

EVIL_HOST = 'fe80::1%x"\napi_key: "weak"\nhost: "0.0.0.0'


def test_an_ipv6_zone_that_is_not_an_interface_name_is_refused():
    assert "service_host=" in refused_naming("service_host", {"service_host": EVIL_HOST})
    assert not problems_of({"service_host": "fe80::1%eth0"})
    assert not problems_of({"service_host": "::1"})


def test_the_config_is_written_by_a_yaml_emitter_whatever_the_host():
    config = yaml.safe_load(unchecked(service_host=EVIL_HOST).config_text)
    assert config["host"] == EVIL_HOST
    assert "api_key" not in config
    assert yaml.safe_load(unchecked().config_text)["host"] == "0.0.0.0"


# --- names and folders that belong to the system ------------------------------------------------

@pytest.mark.parametrize("name", ["ssh", "docker", "nvpmodel", "containerd", "vllm", "vllmx",
                                  "thorfleet-clocks", "thorfleet-fetch-aaaaaaaaaaaa", "thorfleet-"])
def test_a_service_name_the_box_already_has_is_refused(name):
    refused_naming("service_name", {"service_name": name})


@pytest.mark.parametrize("name", ["thorfleet-vllm", "thorfleet-vllm-2", "vllm-2", "vllm_2.mistral"])
def test_thorfleet_s_own_service_names_pass(name):
    assert not problems_of({"service_name": name})


@pytest.mark.parametrize("folder", ["/etc", "/etc/thorfleet", "/usr/local/models", "/var/lib/x",
                                    "/root/models", "/home/ubuntu", "/opt", "/data",
                                    "/opt/thorfleet", "/opt/thorfleet/bin", "/var/lib/thorfleet",
                                    "/opt/thorfleet/image/models"])
def test_a_system_folder_or_one_of_thorfleet_s_others_is_refused_as_weights_dir(folder):
    line = refused_naming("weights_dir", {"weights_dir": folder})
    assert "weights_dir=" in line


@pytest.mark.parametrize("folder", ["/opt/thorfleet/models", "/data/models", "/mnt/nvme/models",
                                    "/home/ubuntu/models", "/srv/thorfleet", "/opt/models"])
def test_a_folder_of_its_own_passes_as_weights_dir(folder):
    assert not problems_of({"weights_dir": folder})


# --- non-finite numbers --------------------------------------------------------------------------

NUMBERS = [k for k, f in schema.FIELDS.items()
           if "Number" in repr(f.annotation) or "float" in repr(f.annotation)]


@pytest.mark.parametrize("key", NUMBERS)
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_inf_and_nan_are_refused_for_every_number(key, value):
    line = refused_naming(key, {key: value})
    assert line.startswith(f"{key}=")


def test_every_timeout_and_interval_is_among_the_numbers_checked():
    timed = {k for k in schema.FIELDS if k.endswith(("_s", "_gib", "_toks", "_fraction"))}
    integers = {"memory_gate_timeout_s", "rollout_drain_timeout_s", "gateway_queue_timeout_s",
                "gateway_check_interval_s", "gateway_retry_after_s", "watchdog_interval_s", "watchdog_timeout_s",
                "watchdog_restart_backoff_s", "watchdog_start_timeout_s",
                "monitor_scrape_interval_s"}  # whole numbers: no inf
    assert timed - integers <= set(NUMBERS), timed - integers - set(NUMBERS)


# --- inventory host data reaching box-side commands ---------------------------------------------

EVIL_PEER = "thor-2:22 -oProxyCommand=touch${IFS}/tmp/owned"


def test_an_ssh_hostname_the_other_boxes_cannot_dial_is_refused_when_they_copy(tmp_path):
    key = tmp_path / "api_key"
    key.write_text(KEY)
    key.chmod(0o600)
    hosts = [("thor-1", {"ssh_hostname": "10.0.0.1"}),
             ("thor-2", {"ssh_hostname": "thor-2 -oProxyCommand=x"})]
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(Inventory((hosts, {**PINS, "service_api_key_file": str(key)})))
    assert error.value.problems == [(
        "thor-2: ssh_hostname 'thor-2 -oProxyCommand=x' is not a host name or IPv4 address the "
        "other boxes can dial for the fleet copy (weights_source, image_source): set "
        "weights_peer_address to one, or weights_source='hub' and image_source='build'")]
    # the image copy dials the same address: the weights from the hub alone are not enough
    hub = {**PINS, "service_api_key_file": str(key), "weights_source": "hub"}
    with pytest.raises(SettingsError):
        settings_for_inventory(Inventory((hosts, hub)))
    apart = Inventory((hosts, {**hub, "image_source": "build"}))
    assert sorted(settings_for_inventory(apart)) == ["thor-1", "thor-2"]  # no copy: never dialled


@pytest.mark.parametrize("address", ["thor-2:99999", "thor-2:0", "10.0.0.300", "thor_2",
                                     "-oProxyCommand=x", EVIL_PEER, "thor-2.:22"])
def test_a_weights_peer_address_that_is_not_a_host_and_port_is_refused(address):
    refused_naming("weights_peer_address", {"weights_peer_address": address})


def test_the_peer_rule_is_one_rule_on_the_laptop_and_the_box():
    tool = ROOT / "files" / "thor" / "bin" / "thorfleet-weights"
    tree = ast.parse(tool.read_text())
    pattern = next(node.value.args[0].value for node in tree.body if isinstance(node, ast.Assign)
                   and getattr(node.targets[0], "id", None) == "PEER")
    assert pattern == schema.PEER.pattern
    assert peers.is_peer_address is schema.is_peer_address


FAKE_RSYNC = """#!/bin/sh
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$CALLS"
exit 1
"""


def test_the_copying_box_refuses_a_peer_address_and_quotes_its_ssh_words(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "rsync").write_text(FAKE_RSYNC)
    (tmp_path / "bin" / "rsync").chmod(0o755)
    revision = "d" * 40
    expected = tmp_path / "expected.json"
    expected.write_text(json.dumps({"files": {"a.json": [revision, "e" * 40]},
                                    "sizes": {"a.json": 2}}))
    root = tmp_path / "box"
    (root / "repo").mkdir(parents=True)
    key = tmp_path / "a key folder" / "peer_key"  # a word with a space: rsync must keep it one
    argv = [sys.executable, str(ROOT / "files" / "thor" / "bin" / "thorfleet-weights"), "copy",
            "--dir", str(root / "repo" / revision), "--revision", revision,
            "--expected", str(expected), "--root", str(root), "--key", str(key),
            "--known-hosts", str(tmp_path / "known_hosts"), "--user", "thorfleet-peer",
            "--peer", EVIL_PEER, "--peer", "thor-3.lan:2203", "--progress-every", "10"]
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "CALLS": str(tmp_path / "calls")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 3, done.stderr
    assert f"refusing peer {EVIL_PEER!r}" in done.stderr
    calls = [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]
    assert len(calls) == 1, calls  # only the good peer was asked
    call = calls[0]
    assert call[-2] == f"thorfleet-peer@thor-3.lan:repo/{revision}/"
    ssh = rsync_words(call[call.index("-e") + 1])
    assert ssh[:3] == ["ssh", "-i", str(key)] and ssh[-2:] == ["-p", "2203"]
    assert f"UserKnownHostsFile={tmp_path / 'known_hosts'}" in ssh


# --- what sshd's forced command runs: the folder is one shell word ------------------------------

def test_the_copy_user_s_forced_command_names_weights_dir_as_one_word():
    source = (ROOT / "tasks" / "weights.py").read_text()
    line = next(ln for ln in source.splitlines() if "{RRSYNC} -ro" in ln)
    assert "shlex.quote(settings.weights_dir)" in line  # files.key_only_user's command=
    command = f"/usr/bin/rrsync -ro {shlex.quote('/data/models (2)')}"
    assert shell_words(command) == ["/usr/bin/rrsync", "-ro", "/data/models (2)"]


# --- unit lines by systemd's quoting rules -------------------------------------------------------

def test_a_value_the_schema_never_saw_reads_back_from_the_unit_as_itself():
    value = 'x y"\\$HOME%n\nExecStartPre=/bin/sh'
    argv = exec_start(unchecked(service_extra_env={"A": value}))
    assert f"A={value}" in argv
    assert [k for _, k, _ in unit_entries(unchecked(service_extra_env={"A": value}).unit_text)] \
        == [k for _, k, _ in unit_entries(unchecked().unit_text)]  # no line more


def test_plain_values_are_written_as_they_are():
    text = unchecked().unit_text
    assert "--ulimit memlock=-1 \\\n" in text and "-e VLLM_API_KEY \\\n" in text
    assert '"' not in text  # nothing of the defaults needs quoting


# --- the env file: one line, the key as it is ---------------------------------------------------

def test_a_key_secrets_env_cannot_hold_as_it_is_is_never_written():
    s = Settings(schema.Schema(**PINS), api_key="sk-a\nFOO=bar")
    with pytest.raises(ValueError, match="secrets.env"):
        s.secrets_env_text  # noqa: B018
    assert environment_file(unchecked().secrets_env_text) == {"VLLM_API_KEY": KEY}
