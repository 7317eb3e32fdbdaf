"""Every setting, generated: a value is refused with a line naming its key, or every file and command
it reaches reads back as exactly that value and nothing more (issue 19 §1).

For each string, number and mapping setting hypothesis draws values around the valid ones (each
with what breaks a file appended or prepended: a newline, a quote, a %, a $, a space, an
unprintable character...) and arbitrary ones. An accepted value is rendered and read back as its
readers read it (tests/parse_back.py): the unit as systemd does, vllm.yaml with PyYAML (what vLLM's
--config loads), secrets.env as systemd and thorfleet-serve do, the copy's ssh words as rsync does,
the copy user's forced command as sh does. Bounded (derandomized, a few dozen examples a key) to
stay in the fast set. A refusal alone proves nothing (a schema refusing every value would pass):
each key's valid values are asserted taken and read back, and the vision run must take some of
the non-empty domain lists it draws.

The edits that break them: a value rendered unquoted or unescaped into a file it reaches (it
reads back as something else); a refusal that does not name its key; the schema refusing what is
valid (every non-empty service_media_domains, every gateway_virtual_ip).
"""

import math
import shlex
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT
from tests.parse_back import (
    PINS,
    command_words,
    environment_file,
    rsync_words,
    shell_words,
    unit_entries,
)
from thorfleet.gateway.monitor import MonitorSettings, Target
from thorfleet.settings import layout, schema
from thorfleet.settings.recipe import NO_MEDIA_DOMAIN, PROFILES, RECIPE_ENV
from thorfleet.settings.render import Settings

KEY = "sk-0123456789-Az09-._~+/="
GROUPS = {"all", "canary", "sim_thors"}
BOUND = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# What breaks a unit line, a YAML scalar, a shell word or an option out of its place.
BREAKERS = ["\n", "\r", "\n[Service]\nExecStartPre=/bin/sh", '"\napi_key: weak\nx: "', " ", "\t",
            '"', "'", "\\", "$", "${HOME}", "%", "%n", "`id`", ";", " ; ", "#", ":", "::", "/..",
            "..", "\x00", "\x7f", "\x1b", "\u2028", "\x85", "\ufeff", "é", " -oProxyCommand=x",
            "@", "=", ",", "*", "~", "-"]
VALID = {
    "ssh_strict_host_key_checking": ["yes", "accept-new"],
    "preflight_min_l4t_release": ["38.0", "38.2.1"],
    "weights_dir": ["/opt/thorfleet/models", "/data/models", "/mnt/nvme_0/a.b+c-d"],
    "weights_model_repo": ["mistralai/Mistral-Small-4-119B-2603-NVFP4", "a/b", "o.r_g/n-a.m_e"],
    "weights_draft_repo": ["mistralai/Mistral-Small-4-119B-2603-eagle"],
    "weights_model_revision": ["a" * 40, "0123456789abcdef" * 2 + "01234567"],
    "weights_draft_revision": ["b" * 40],
    "weights_hf_endpoint": ["https://huggingface.co", "http://hub.internal:8080",
                            "https://[fd00::5]:8443/mirror/", "http://10.0.0.9/hf"],
    "weights_hf_token_file": ["~/.config/thorfleet/hf_token"],
    "weights_source": ["auto", "hub", "fleet"],
    "weights_peer_address": ["thor-2", "10.0.0.2:2222", "thor-2.lan:22"],
    "weights_peer_key_file": ["~/.config/thorfleet/peer_ed25519"],
    "image_base": ["r/vllm@sha256:" + "c" * 64,
                   "registry:5000/nvidia-ai-iot/vllm:latest-jetson-thor@sha256:" + "d" * 64],
    "image_name": ["thorfleet/mistral-small4", "registry.local:5000/team/m"],
    "image_registry": ["registry.site:5000/thorfleet"],
    "image_source": ["auto", "build", "fleet"],
    "image_peer_key_file": ["~/.config/thorfleet/image_ed25519"],
    "service_name": ["thorfleet-vllm", "vllm_2.mistral", "thorfleet-vllm-2"],
    "service_profile": ["default", "no-eagle"],
    "service_host": ["0.0.0.0", "127.0.0.1", "::1", "fe80::1%eth0", "thor-1.lan"],
    "service_api_key_file": ["~/.config/thorfleet/api_key"],
    "service_allow_no_api_key": ["anywhere"],
    "service_docker_gpus": ["all", "1", "device=0,1"],
    "rollout_canary_group": ["canary", "sim_thors"],
    "rollout_benchmark": ["first-install", "always", "never"],
    "rollout_report_path": ["thorfleet-report.json"],
    "gateway_tls_cert_file": ["~/.config/thorfleet/gateway.pem"],
    "gateway_tls_key_file": ["~/.config/thorfleet/gateway.key"],
    "gateway_ca_dir": ["~/.config/thorfleet/fleet-ca"],
    "gateway_fleet_address": ["10.0.0.5", "fd00::5"],
    "gateway_virtual_ip": ["10.0.0.50/24", "192.168.1.250/16"],
    "monitor_fleet_address": ["10.0.0.6", "fd00::6"],
    "monitor_retention": ["15d", "1w2d", "90m", "1y2w3d4h5m6s7ms"],
}
STRINGS = sorted(VALID)
# A valid value of each number setting whose default is None (not set).
UNSET_NUMBERS = {"memory_min_available_gib": 1.0,
                 **{key: 2_000_000 for key in schema.CLIENT_BUDGETS.values()}}
NUMBERS = sorted(k for k, f in schema.FIELDS.items()
                 if isinstance(f.default, (int, float)) and not isinstance(f.default, bool)
                 or k in UNSET_NUMBERS)
MAPPINGS = ["service_docker_ulimits", "service_extra_env"]


def around(valid):
    """Valid values, each with breakers around or inside it, and arbitrary text."""
    base = st.sampled_from(valid)
    breaker = st.sampled_from(["", *BREAKERS])
    return st.one_of(
        base,
        st.builds(lambda v, a, b: a + v + b, base, breaker, breaker),
        st.builds(lambda v, i, b: v[:i] + b + v[i:], base, st.integers(0, 60), breaker),
        st.text(max_size=30),
    )


NUMBER = st.one_of(st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([math.inf, -math.inf, math.nan, 0, 0.0, 1, 1.5, 1e-05, 1e16,
                                    True, "5", None]))
SCALAR = st.one_of(st.text(max_size=12), st.integers(-(2**70), 2**70), st.floats(),
                   st.booleans(), st.none(), st.sampled_from(["-1", "8388608", "65536:65536"]))
MAPPING = {
    "service_docker_ulimits": st.one_of(
        st.dictionaries(st.sampled_from([*schema.ULIMITS, "memlok"]),
                        st.one_of(around(["-1", "67108864", "1024:2048"]), SCALAR), max_size=3),
        st.dictionaries(st.text(max_size=8), SCALAR, max_size=2)),
    "service_extra_env": st.one_of(
        st.dictionaries(around(["VLLM_LOGGING_LEVEL", "A_B", "_X1"]),
                        st.one_of(around(["DEBUG", "x:y=z,w/v", "3", "é"]), SCALAR), max_size=3),
        st.dictionaries(st.text(max_size=8), SCALAR, max_size=2)),
}


def weights_tool():
    loader = SourceFileLoader("thorfleet_weights", str(ROOT / "files/thor/bin/thorfleet-weights"))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


WEIGHTS = weights_tool()


# --- what each file must read back as --------------------------------------------------------

def pairs(argv, flag):
    return [argv[i + 1] for i, word in enumerate(argv) if word == flag]


def exec_lines(s):
    entries = unit_entries(s.unit_text)
    return {key: [command_words(v) for _, k, v in entries if k == key]
            for key in ("ExecStartPre", "ExecStart", "ExecStop")}, entries


def unit_reads_back(s):
    lines, entries = exec_lines(s)
    eagle = PROFILES[s.service_profile]["eagle"]
    # no line more or less than the template has
    assert [(section, key) for section, key, _ in entries] == SKELETON[eagle]
    (remove, gate), (start,), (stop,) = lines["ExecStartPre"], lines["ExecStart"], lines["ExecStop"]
    assert remove == ["/usr/bin/docker", "rm", "-f", s.service_name]
    flags = dict(zip(gate[1::2], gate[2::2], strict=True))
    expected = {"--gpu-memory-utilization": s.service_gpu_memory_utilization,
                "--margin-gib": s.memory_gate_margin_gib, "--timeout": s.memory_gate_timeout_s,
                "--interval": s.memory_gate_interval_s}
    if s.memory_min_available_gib is not None:
        expected["--min-gib"] = s.memory_min_available_gib
    assert gate[0] == layout.BOX_MEMORY_GATE
    assert {f: float(v) for f, v in flags.items()} == {f: float(v) for f, v in expected.items()}
    assert start[start.index("--name") + 1] == s.service_name
    assert start[start.index("--gpus") + 1] == s.service_docker_gpus
    assert pairs(start, "--ulimit") == [f"{k}={v}" for k, v in
                                        sorted(s.service_docker_ulimits.items())]
    mounts = [f"{s.model_dir}:/model:ro", *([f"{s.draft_dir}:/eagle:ro"] if eagle else []),
              f"{layout.BOX_VLLM_CACHE}:/root/.cache/vllm", f"{layout.BOX_CONFIG_DIR}:/config:ro",
              f"{layout.BOX_USAGE_DIR}:{layout.BOX_USAGE_DIR}",
              f"{layout.BOX_USAGE_CODE}:{layout.IMAGE_USAGE_HOME}/thorfleet_usage.py:ro"]  # vllm.yaml's
    assert pairs(start, "-v") == mounts
    env = {**RECIPE_ENV, **{k: str(v) for k, v in s.service_extra_env.items()}}
    assert pairs(start, "-e") == [f"PYTHONPATH={layout.IMAGE_USAGE_HOME}"] + [
        f"{k}={v}" for k, v in sorted(env.items())] + ["VLLM_API_KEY"]
    assert start[start.index("vllm") - 1] == s.image_tag
    assert without_values(start) == START_SKELETON
    assert stop == ["/usr/bin/docker", "stop", "-t", str(s.rollout_drain_timeout_s + 30),
                    s.service_name]


def without_values(argv):
    """ExecStart's words with every value (and its flag) taken out: the template's own words."""
    out, skip = [], 0
    for i, word in enumerate(argv):
        if skip:
            skip -= 1
            continue
        if word in ("--ulimit", "-v", "-e", "--name", "--gpus"):
            skip = 1
            continue
        if i + 1 < len(argv) and argv[i + 1] == "vllm":
            continue  # the image
        out.append(word)
    return out


def config_reads_back(s):
    config = yaml.safe_load(s.config_text)
    profile = PROFILES[s.service_profile]
    expected = {**BASE_CONFIG, "host": s.listen_host, "port": s.service_port,
                "gpu_memory_utilization": s.service_gpu_memory_utilization,
                "max_model_len": profile["max_model_len"],
                "max_num_seqs": profile["max_num_seqs"],
                "served_model_name": [profile["model"],
                                      *([s.weights_model_repo] if s.service_profile == "default"
                                        else []),
                                      "/model"],
                "shutdown_timeout": s.rollout_drain_timeout_s}
    if profile["eagle"]:
        expected["speculative_config"] = {**BASE_CONFIG["speculative_config"],
                                          "max_model_len": profile["max_model_len"]}
    else:
        expected.pop("speculative_config")
    assert config == expected
    for key in ("host", "port", "gpu_memory_utilization", "shutdown_timeout"):
        assert type(config[key]) is type(expected[key]), key  # 7 stays 7, "7" stays "7"


def secrets_read_back(s):
    assert environment_file(s.secrets_env_text) == {"VLLM_API_KEY": KEY}
    # thorfleet-serve's own reading (files/thor/bin/thorfleet-serve api_key)
    line = next(ln for ln in s.secrets_env_text.splitlines() if ln.startswith("VLLM_API_KEY="))
    assert line.split("=", 1)[1] == KEY


def commands_read_back(s):
    # the copy user's forced command (tasks/weights.py), as sshd's shell runs it
    forced = f"{layout.RRSYNC} -ro {shlex.quote(s.weights_dir)}"
    assert shell_words(forced) == [layout.RRSYNC, "-ro", s.weights_dir]
    if s.weights_peer_address:
        address, _, port = s.weights_peer_address.partition(":")
        assert WEIGHTS.peer_parts(s.weights_peer_address) == (address, port)
        words = ["ssh", "-i", layout.BOX_PEER_KEY, "-o", "BatchMode=yes",
                 *(["-p", port] if port else [])]
        assert rsync_words(WEIGHTS.remote_shell(words)) == words
    if s.weights_hf_endpoint:
        assert shlex.split(shlex.join(["--endpoint", s.weights_hf_endpoint])) == \
            ["--endpoint", s.weights_hf_endpoint]


def monitor_reads_back(values):
    """Prometheus's files on the monitor host: the scrape interval, the exporter's port and the
    retention read back as themselves."""
    m = MonitorSettings(values, "gw-1", [Target("thor-1", "10.0.0.1", 8002, values.watchdog_port)])
    config = yaml.safe_load(m.config_text)
    assert config["global"]["scrape_interval"] == f"{values.monitor_scrape_interval_s}s"
    box_job = config["scrape_configs"][1]
    assert box_job["static_configs"][0]["targets"] == [f"10.0.0.1:{values.watchdog_port}"]
    [assignment] = [line for line in m.defaults_text.splitlines() if not line.startswith("#")]
    name, _, args = shlex.split(assignment)[0].partition("=")
    assert name == "ARGS"
    assert f"--storage.tsdb.retention.time={values.monitor_retention}" in args.split()


def outcome(key, value) -> bool:
    """Refused naming `key` (False), or accepted and read back as itself everywhere it lands
    (True). A schema that refuses everything passes this alone: accepted() says what must pass."""
    values, problems = schema.check({**PINS, key: value}, api_key=KEY, groups=GROUPS)
    if problems:
        assert any(key in line for line in problems), problems
        assert all("\n" not in line.replace("\\n", "") for line in problems), problems
        return False
    assert getattr(values, key) == value and type(getattr(values, key)) is type(value)
    if isinstance(value, float):
        assert math.isfinite(value)
    s = Settings(values, api_key=KEY)
    unit_reads_back(s)
    config_reads_back(s)
    secrets_read_back(s)
    commands_read_back(s)
    monitor_reads_back(values)
    return True


def accepted(key, value):
    """`value` is valid: it is taken, and reads back."""
    _, problems = schema.check({**PINS, key: value}, api_key=KEY, groups=GROUPS)
    assert problems == [], (key, value, problems)
    assert outcome(key, value)


DEFAULT = Settings(schema.check(PINS, api_key=KEY)[0], api_key=KEY)
BASE_CONFIG = yaml.safe_load(DEFAULT.config_text)
SKELETON = {
    eagle: [(section, key) for section, key, _ in unit_entries(Settings(
        schema.check({**PINS, "service_profile": name}, api_key=KEY)[0], api_key=KEY).unit_text)]
    for name, eagle in (("default", True), ("no-eagle", False))}
START_SKELETON = without_values(exec_lines(DEFAULT)[0]["ExecStart"][0])


def test_the_defaults_read_back():
    outcome("service_name", "thorfleet-vllm")
    assert START_SKELETON[:3] == ["/usr/bin/docker", "run", "--rm"]
    assert START_SKELETON[-8:] == ["vllm", "serve", "/model", "--config", "/config/vllm.yaml",
                                   "--attention-backend", "TRITON_MLA", "--language-model-only"]


def test_every_setting_is_generated():
    assert set(STRINGS) | set(NUMBERS) | set(MAPPINGS) | {
        "power_allow_reboot", "image_think_prefill", "weights_hf_allow_plain_http",
        "power_mode", "service_port", "memory_gate_timeout_s", "rollout_batch",
        "rollout_drain_timeout_s", "gateway_serves_model", "gateway_names",
        "gateway_queue_timeout_s", "gateway_check_interval_s", "watchdog_port",
        "monitor_scrape_interval_s",
        "gateway_clients",  # names and key files: tests/fast/test_gateway_render.py
        "gateway_affinity_balance_factor",  # tests/fast/test_door_affinity.py
        "service_media_domains",  # a list: test_a_vision_box_reads_back_its_images_and_domains
        "service_prefix_caching",  # tests/fast/test_prefix_caching.py
    } >= set(schema.FIELDS), set(schema.FIELDS) - set(STRINGS)


def vision_reads_back(s):
    """A vision box: its image limit and domains in vllm.yaml, the images on in the unit (no
    --language-model-only) and redirects never followed."""
    config = yaml.safe_load(s.config_text)
    assert config["limit_mm_per_prompt"] == {"image": s.service_images_per_prompt}
    assert config["allowed_media_domains"] == (s.service_media_domains or [NO_MEDIA_DOMAIN])
    start = exec_lines(s)[0]["ExecStart"][0]
    assert start[-7:] == ["vllm", "serve", "/model", "--config", "/config/vllm.yaml",
                          "--attention-backend", "TRITON_MLA"]
    assert "VLLM_MEDIA_URL_ALLOW_REDIRECTS=0" in pairs(start, "-e")


DOMAINS = st.one_of(st.lists(around(["images.example.com", "cdn-2.example.org", "a.b"]),
                             max_size=3),
                    # valid lists, drawn on their own: among the mixed ones a bounded run drew none
                    st.lists(st.sampled_from(["images.example.com", "cdn-2.example.org", "a.b"]),
                             min_size=1, max_size=3),
                    st.lists(st.text(max_size=12), max_size=2),
                    st.sampled_from(["images.example.com", None, [None], [1], {}]))


def vision_outcome(domains, images) -> bool:
    """Refused naming the key that is wrong (False), or accepted and read back (True)."""
    data = {**PINS, "service_profile": "vision", "service_media_domains": domains,
            "service_images_per_prompt": images}
    values, problems = schema.check(data, api_key=KEY, groups=GROUPS)
    if problems:
        # each line names the key it refuses: the domains only when they are not a list of
        # domain names, the images only when they are not a count
        for line in problems:
            assert "service_media_domains" in line or "service_images_per_prompt" in line, line
            assert "\n" not in line.replace("\\n", ""), line
        return False
    assert values.service_media_domains == domains and values.service_images_per_prompt == images
    vision_reads_back(Settings(values, api_key=KEY))
    return True


# Domain lists vLLM's check takes (whole lowercase names): each must be accepted.
GOOD_DOMAINS = [[], ["images.example.com"], ["images.example.com", "cdn-2.example.org"], ["a.b"],
                ["xn--bcher-kva.example"], ["a" * 63 + ".example.com"]]


@pytest.mark.parametrize("domains", GOOD_DOMAINS)
def test_a_vision_box_takes_every_list_of_domain_names(domains):
    assert vision_outcome(domains, 4), domains


def test_a_vision_box_reads_back_its_images_and_domains():
    taken = []

    @BOUND
    @given(DOMAINS, st.one_of(st.integers(-2, 70), st.sampled_from([4, "4", 4.0, True, None])))
    def check(domains, images):
        if vision_outcome(domains, images) and domains:
            taken.append(domains)

    check()
    # the run drew valid non-empty lists (around() keeps the valid ones): some were taken
    assert taken, "every non-empty list of domains was refused"


@pytest.mark.parametrize("key", STRINGS)
def test_a_string_setting_is_refused_or_reads_back(key):
    @BOUND
    @given(around(VALID[key]))
    def check(value):
        outcome(key, value)

    check()


@pytest.mark.parametrize("key", STRINGS)
def test_each_valid_string_is_taken_and_reads_back(key):
    """What the property tests' refusals are measured against: a schema refusing everything
    would pass them."""
    for value in VALID[key]:
        accepted(key, value)


@pytest.mark.parametrize("key", NUMBERS)
def test_each_numbers_default_is_taken_and_reads_back(key):
    default = schema.FIELDS[key].default
    accepted(key, UNSET_NUMBERS[key] if default is None else default)


@pytest.mark.parametrize("key, value", [("service_docker_ulimits", {"memlock": "-1"}),
                                        ("service_extra_env", {"VLLM_LOGGING_LEVEL": "DEBUG"})])
def test_a_valid_mapping_is_taken_and_reads_back(key, value):
    accepted(key, value)


@pytest.mark.parametrize("key", STRINGS)
def test_every_breaker_around_and_inside_every_valid_string(key):
    """The sweep hypothesis may not draw in a bounded run: each breaker before, after and inside
    each valid value."""
    for value in VALID[key]:
        for breaker in BREAKERS:
            for changed in (value + breaker, breaker + value,
                            value[:len(value) // 2] + breaker + value[len(value) // 2:]):
                outcome(key, changed)


@pytest.mark.parametrize("key", MAPPINGS)
def test_every_breaker_in_a_mapping_s_names_and_values(key):
    name, value = {"service_docker_ulimits": ("memlock", "-1"),
                   "service_extra_env": ("VLLM_LOGGING_LEVEL", "DEBUG")}[key]
    for breaker in BREAKERS:
        for changed in ({name: value + breaker}, {name: breaker + value}, {name + breaker: value},
                        {breaker + name: value}):
            outcome(key, changed)


@pytest.mark.parametrize("key", NUMBERS)
def test_a_number_setting_is_refused_or_reads_back(key):
    @BOUND
    @given(NUMBER)
    def check(value):
        outcome(key, value)

    check()


@pytest.mark.parametrize("key", MAPPINGS)
def test_a_mapping_setting_is_refused_or_reads_back(key):
    @settings(BOUND, max_examples=150)
    @given(MAPPING[key])
    def check(value):
        outcome(key, value)

    check()
