"""Every thorfleet setting, declared once: its type, its range or allowed values, its meaning and its
default. The checks are derived from the declaration (pydantic, strict: "0.7" is not a number).

group_data/all.py is the defaults file pyinfra reads; tests/test_settings.py holds it to this schema
key by key (default and comment), both ways.

A problem is one line naming the key, the value and the fix; settings.py prefixes the host.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from thorfleet.layout import BOX_MODELS
from thorfleet.recipe import PROFILES, SECRET_ENV

# Group data keys with these prefixes are thorfleet's: one no setting has is a typo, not a choice.
PREFIXES = ("preflight_", "power_", "memory_", "weights_", "image_", "service_", "rollout_")


class SettingsError(ValueError):
    """Bad group data; `problems` holds one message per problem."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# --- value types ------------------------------------------------------------------------------
# A number stays the type the operator wrote (7 renders as 7, not 7.0): the rendered files, and so
# the fingerprint, do not change when the schema is applied.
Number = StrictInt | StrictFloat
NonNegative = Annotated[Number, Field(ge=0)]
Positive = Annotated[Number, Field(gt=0)]

_HEX40 = r"^[0-9a-f]{40}$"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_IMAGE_NAME = rf"^{_REPOSITORY}$"
_IMAGE_BY_DIGEST = rf"^{_REPOSITORY}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?@sha256:[0-9a-f]{{64}}$"
# systemd unit names and Docker container names both accept these (the intersection).
_SERVICE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_HF_REPO = r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$"
# Goes into a unit's ExecStart and a docker -v: no spaces, quotes, $, %, \ or ':'.
_BOX_PATH = r"^(/[A-Za-z0-9_.+-]+)+$"
_URL = r"^https?://[^\s\"'$%\\]+$"
_GPUS = r"^(all|[1-9][0-9]*|device=[A-Za-z0-9,-]+)$"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# systemd expands $ and % in ExecStart, splits on whitespace, and unquotes quotes and backslashes.
_UNSAFE_IN_UNIT = re.compile(r"[\s\"'\\$%]|[\x00-\x1f\x7f]")
_ULIMIT_VALUE = re.compile(r"^-?[0-9]+(:-?[0-9]+)?$")
# docker run --ulimit accepts these names (docker/go-units ulimit.go).
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile",
           "nproc", "rss", "rtprio", "rttime", "sigpending", "stack")


def _refuse(*problems):
    """Raise the given whole-line problems from inside a validator."""
    raise PydanticCustomError("thorfleet", "{problems}", {"problems": list(problems)})


def _version(value):
    try:
        Version(str(value))
    except InvalidVersion:
        raise ValueError("not a version") from None
    return value


def _no_dotdot(path):
    if "/../" in f"{path}/" or "/./" in f"{path}/":
        raise ValueError("relative parts")
    return path


def _listen_address(host):
    if host is not None:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$", host):
                raise ValueError("not an address") from None
    return host


def _extra_env(env):
    problems = []
    secrets = sorted(name for name in env if name in SECRET_ENV)
    if secrets:
        problems.append(f"service_extra_env must not carry secrets ({', '.join(secrets)}): "
                        "use service_api_key_file / weights_hf_token_file")
    for name, value in env.items():
        if name in SECRET_ENV:
            continue
        if not _ENV_NAME.match(name):
            problems.append(f"service_extra_env has {name!r}, not an environment variable name: "
                            "use letters, digits and _, not starting with a digit")
        elif isinstance(value, bool) or not isinstance(value, (str, int, float)):
            problems.append(f"service_extra_env[{name!r}]={value!r} must be a string or a number")
        elif _UNSAFE_IN_UNIT.search(str(value)):
            problems.append(f"service_extra_env[{name!r}]={value!r} is not safe in a unit line: "
                            "no spaces, newlines, quotes, backslashes, $ or % (systemd would "
                            "split or expand them)")
    if problems:
        _refuse(*problems)
    return env


def _ulimits(limits):
    problems = []
    for name, value in limits.items():
        if name not in ULIMITS:
            near = difflib.get_close_matches(str(name), ULIMITS, n=1)
            hint = f"did you mean {near[0]}?" if near else f"use one of {', '.join(ULIMITS)}"
            problems.append(f"service_docker_ulimits has {name!r}, not a ulimit docker knows: {hint}")
        elif isinstance(value, bool) or not _ULIMIT_VALUE.match(str(value)):
            problems.append(f"service_docker_ulimits[{name!r}]={value!r} must be a number, -1 for "
                            "unlimited, or SOFT:HARD")
    if problems:
        _refuse(*problems)
    return limits


def setting(default, meaning, must, **constraints):
    """A setting: its default, its one-line meaning (the comment in group_data/all.py), and what a
    bad value is told ("<key>=<value> <must>")."""
    return Field(default, description=meaning, json_schema_extra={"must": must}, **constraints)


# A peer's address as another box dials it: a DNS name or IPv4 address, optionally :port.
_PEER = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?$"

# Both checkpoints are pinned the same way, and refused with the same fix.
UNPINNED_REVISION = ("is not pinned: set the 40-hex commit hash you tested "
                     "(python -m thorfleet pin INVENTORY looks it up)")

class Schema(BaseModel):
    """One host's thorfleet settings, checked."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, validate_default=True)

    # --- ssh: how the laptop reaches the boxes ---------------------------------------------------
    ssh_strict_host_key_checking: Literal["yes", "accept-new", "ask", "no", "off"] = setting(
        "yes", "refuse unknown or changed host keys (pyinfra's own default accepts new ones)",
        "is not one of pyinfra's values: use 'yes', 'accept-new', 'ask', 'no' or 'off'")
    ssh_keepalive_interval_s: NonNegative = setting(
        30, "SSH keepalive while a restart is proven, so NAT keeps the idle session",
        "must be a non-negative number of seconds (0: no keepalives)")

    # --- preflight: refuse boxes that cannot run the model ---------------------------------------
    preflight_min_l4t_release: Annotated[StrictStr | Number, AfterValidator(_version)] = setting(
        "38.0", "oldest L4T release accepted, from /etc/nv_tegra_release (JetPack 7)",
        "is not a version like 38.0")
    preflight_min_memory_gib: NonNegative = setting(
        100, "least total memory (MemTotal) a box must have; a Thor has ~122 GiB",
        "must be a non-negative number (GiB)")
    preflight_min_free_disk_gib: NonNegative = setting(
        100, "least free disk under weights_dir for weights (~71 GB) and image",
        "must be a non-negative number (GiB)")
    preflight_lock_wait_s: NonNegative = setting(
        0, "how long a run waits for another thorfleet run holding a box (0: stop at once)",
        "must be a non-negative number of seconds")

    # --- power: nvpmodel mode and locked clocks --------------------------------------------------
    power_mode: Annotated[StrictInt, Field(ge=0, le=3)] = setting(
        1, "nvpmodel mode; on the T5000 0=MAXN, 1=120W (the seed), 2=90W, 3=70W",
        "is not a T5000 mode (0, 1, 2, 3)")
    power_allow_reboot: StrictBool = setting(
        False, "allow a reboot when the mode needs one (2 and 3); otherwise fail clearly",
        "must be True or False")
    power_reboot_timeout_s: Positive = setting(
        900, "how long to wait for a box to come back from that reboot",
        "must be a positive number of seconds")

    # --- memory: the page-cache gate run before every start of the server ------------------------
    memory_min_available_gib: NonNegative | None = setting(
        None, "MemAvailable a start needs; None: gpu_memory_utilization x MemTotal + margin",
        "must be a non-negative number, or None to derive it from service_gpu_memory_utilization")
    memory_gate_margin_gib: NonNegative = setting(
        7, "derived gate's headroom: 0.72 x 122 + 7 = 94.8 GiB, the seed's 95",
        "must be a non-negative number (GiB)")
    # memory-gate compares it with sh's integer test: a whole number.
    memory_gate_timeout_s: Annotated[StrictInt, Field(gt=0)] = setting(
        300, "give up waiting for the page cache to drain after this long",
        "must be a positive whole number of seconds")
    memory_gate_interval_s: Annotated[Number, Field(ge=1)] = setting(
        5, "seconds between drop_caches attempts",
        "must be a number of seconds, at least 1")

    # --- weights: huggingface_hub downloads on the box -------------------------------------------
    weights_dir: Annotated[StrictStr, Field(pattern=_BOX_PATH), AfterValidator(_no_dotdot)] = setting(
        BOX_MODELS, "where checkpoints live on the box, one folder per revision",
        f"must be an absolute path on the box like {BOX_MODELS} (letters, digits, _ . + - and /; "
        "no spaces, quotes, $, %, : or ..)")
    weights_model_repo: Annotated[StrictStr, Field(pattern=_HF_REPO)] = setting(
        "mistralai/Mistral-Small-4-119B-2603-NVFP4", "the NVFP4 checkpoint (~71 GB)",
        "is not a Hugging Face repo id like owner/name")
    weights_model_revision: Annotated[StrictStr, Field(pattern=_HEX40)] = setting(
        None, "REQUIRED: 40-hex commit of the checkpoint to serve (pin it)",
        UNPINNED_REVISION)
    weights_draft_repo: Annotated[StrictStr, Field(pattern=_HF_REPO)] = setting(
        "mistralai/Mistral-Small-4-119B-2603-eagle", "the EAGLE-3 draft (~0.4 GB)",
        "is not a Hugging Face repo id like owner/name")
    weights_draft_revision: Annotated[StrictStr, Field(pattern=_HEX40)] = setting(
        None, "REQUIRED: 40-hex commit of the draft to serve (pin it)",
        UNPINNED_REVISION)
    weights_hf_endpoint: Annotated[StrictStr, Field(pattern=_URL)] | None = setting(
        None, "hub or site mirror the boxes download from",
        "must be an http(s) URL of the hub or a mirror, or None for huggingface.co")
    weights_hf_token_file: Annotated[StrictStr, Field(min_length=1)] | None = setting(
        None, "laptop path of a file holding HF_TOKEN (else env HF_TOKEN); never logged",
        "must be a file path on the laptop, or None")
    weights_source: Literal["auto", "hub", "fleet"] = setting(
        "auto", "hub: every box downloads; fleet: the run's first box does, the others copy from "
        "boxes that have it (rsync over SSH); auto: fleet for 2+ hosts",
        "is not 'auto', 'hub' or 'fleet' (a site mirror is weights_hf_endpoint)")
    weights_peer_address: Annotated[StrictStr, Field(pattern=_PEER)] | None = setting(
        None, "host[:port] the other boxes reach this one at over SSH (None: its ssh_hostname)",
        "is not a host name or address with an optional :port")
    weights_progress_interval_s: Positive = setting(
        10, "seconds between the progress lines of a weights transfer (done, rate, time left)",
        "must be a number of seconds above 0")
    weights_peer_key_file: Annotated[StrictStr, Field(min_length=1)] = setting(
        "~/.config/thorfleet/peer_ed25519", "laptop path of the boxes' shared copy key (may only "
        "read weights_dir); made when missing", "must be a file path on the laptop")

    # --- image: the derived vLLM image with the chat patches -------------------------------------
    image_base: Annotated[StrictStr, Field(pattern=_IMAGE_BY_DIGEST)] = setting(
        None, "REQUIRED: base vLLM image pinned by digest, e.g. ghcr.io/nvidia-ai-iot/vllm@sha256:…",
        "is not pinned by digest: use REPO@sha256:<64 hex> (the tag moves; python -m thorfleet "
        "pin INVENTORY looks it up)")
    image_name: Annotated[StrictStr, Field(pattern=_IMAGE_NAME)] = setting(
        "thorfleet/mistral-small4", "local name of the derived image; the tag is a hash of its inputs",
        "is not a Docker repository name: lowercase, like thorfleet/mistral-small4, without a tag "
        "(thorfleet tags it with a hash of its inputs)")
    image_registry: Annotated[StrictStr, Field(pattern=_IMAGE_NAME)] | None = setting(
        None, "registry the image is shared through: the run's first host builds and pushes, the "
        "others pull (None: every box builds)",
        "is not a registry path like registry.site:5000/thorfleet (no tag), or None")
    image_think_prefill: StrictBool = setting(
        True, "open [THINK] for reasoning_effort=high (this checkpoint does not by itself)",
        "must be True or False")

    # --- service: the systemd-supervised vLLM container ------------------------------------------
    service_name: Annotated[StrictStr, Field(pattern=_SERVICE_NAME)] = setting(
        "thorfleet-vllm", "systemd unit and container name",
        "is not a name both systemd and Docker accept: up to 63 letters, digits, _ . -, starting "
        "with a letter or digit, like thorfleet-vllm")
    service_profile: Literal[tuple(PROFILES)] = setting(
        "default", "\"default\": EAGLE-3, 64K context; \"no-eagle\": no speculation, 256K",
        f"is unknown: use one of {sorted(PROFILES)}")
    service_host: Annotated[StrictStr | None, AfterValidator(_listen_address)] = setting(
        None, "listen address; None: 0.0.0.0 with an API key, 127.0.0.1 without one",
        "must be an IP address or host name to listen on, or None")
    service_port: Annotated[StrictInt, Field(ge=1, le=65535)] = setting(
        8002, "port vLLM listens on",
        "must be at least 1 and at most 65535 (a TCP port)")
    service_gpu_memory_utilization: Annotated[Number, Field(gt=0, le=1)] = setting(
        0.72, "share of unified memory vLLM may take (~96 GB on a Thor)",
        "must be a number in (0, 1]")
    service_api_key_file: Annotated[StrictStr, Field(min_length=1)] | None = setting(
        None, "laptop path of a file holding the API key (else env THORFLEET_API_KEY)",
        "must be a file path on the laptop, or None")
    service_allow_no_api_key: StrictBool | Literal["anywhere"] = setting(
        False, "explicitly serve without an API key (then binds 127.0.0.1 unless set)",
        "must be True, False or 'anywhere'")
    service_health_timeout_s: Positive = setting(
        1200, "how long a (re)start may take to answer /health (seed: 20 min)",
        "must be a positive number of seconds")
    service_docker_gpus: Annotated[StrictStr, Field(pattern=_GPUS)] = setting(
        "all", "value of docker run --gpus",
        "is not a docker --gpus value: 'all', a count like '1', or 'device=0,1'")
    service_docker_ulimits: Annotated[dict[StrictStr, Any], AfterValidator(_ulimits)] = setting(
        {"memlock": "-1", "stack": "67108864"}, "docker run --ulimit, as the seed",
        "must be a dict of ulimit name: value, like {'memlock': '-1'}")
    service_extra_env: Annotated[dict[StrictStr, Any], AfterValidator(_extra_env)] = setting(
        {}, "extra environment for the container, merged over the seed's",
        "must be a dict of NAME: value")

    # --- rollout: how a fleet is converged -------------------------------------------------------
    rollout_batch: Annotated[StrictInt, Field(ge=1)] = setting(
        1, "hosts restarted at once; each batch must serve before the next starts",
        "must be at least 1 (a whole number of hosts)")
    rollout_canary_group: Annotated[StrictStr, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = setting(
        None, "inventory group restarted (and proven) before everyone else",
        "must be the name of a group of the inventory, or None")
    # vLLM's --shutdown-timeout is an int; the unit adds its margins to it.
    rollout_drain_timeout_s: Annotated[StrictInt, Field(ge=0)] = setting(
        120, "before a restart, wait this long for answers in flight; vLLM's shutdown_timeout too",
        "must be a whole number of seconds, 0 or more (0: a restart cuts answers in flight)")
    rollout_benchmark: Literal["first-install", "always", "never"] = setting(
        "first-install", "benchmark after the proof: on a first install, always or never",
        "must be 'first-install', 'always' or 'never'")
    rollout_bench_min_fraction: Annotated[Number, Field(ge=0, le=1)] = setting(
        0.8, "a host below this share of the fleet's median tok/s fails the run",
        "must be a number in [0, 1] (0: no median check)")
    rollout_bench_min_toks: NonNegative = setting(
        27, "a host below this many tok/s fails the run (seed: 33.7 EAGLE, 17.5 base)",
        "must be a non-negative number of tokens per second (0: no floor)")
    rollout_report_path: Annotated[StrictStr, Field(min_length=1)] = setting(
        "thorfleet-report.json", "laptop path of the JSON report of the last run",
        "must be a file path on the laptop")


FIELDS = Schema.model_fields
# Defaults that are REQUIRED: None means "not set", and the check refuses it.
REQUIRED = tuple(k for k, f in FIELDS.items() if f.description.startswith("REQUIRED"))


def must(key):
    """What a bad value of `key` is told."""
    return FIELDS[key].json_schema_extra["must"]


def _nearest(key):
    """The setting `key` was probably meant to be: the same prefix, the rest spelt nearly alike
    (the shared prefix alone would make service_colour "near" service_port)."""
    prefix = next(p for p in PREFIXES if key.startswith(p))
    rests = {k[len(prefix):]: k for k in FIELDS if k.startswith(prefix)}
    near = difflib.get_close_matches(key[len(prefix):], list(rests), n=1, cutoff=0.6)
    return rests[near[0]] if near else None


def _unknown_keys(data):
    problems = []
    for key in sorted(data):
        if key.startswith(PREFIXES) and key not in FIELDS:
            fix = f"did you mean {near}?" if (near := _nearest(key)) else \
                "see group_data/all.py for every setting"
            problems.append(f"{key}={data[key]!r} is not a thorfleet setting: {fix}")
    return problems


def _messages(error: ValidationError, data):
    found = []
    for detail in error.errors(include_url=False):
        key = detail["loc"][0]
        if detail["type"] == "thorfleet":
            lines = detail["ctx"]["problems"]
        else:
            lines = [f"{key}={data.get(key, FIELDS[key].default)!r} {must(key)}"]
        found += [line for line in lines if line not in found]
    return found


def check(data, *, api_key=None, groups=None):
    """(Schema, []) for one host's data, or (None, problems): every problem, one line each.

    `api_key`: whether the laptop has one for this host (the file or env var was read);
    `groups`: the inventory's group names, for rollout_canary_group (None: not checked).
    """
    problems = _unknown_keys(data)
    values = None
    try:
        values = Schema.model_validate({k: data[k] for k in FIELDS if k in data})
    except ValidationError as error:
        problems += _messages(error, data)
    # Rules across keys.
    if not api_key:
        if not data.get("service_allow_no_api_key"):
            problems.append("no API key: set service_api_key_file (or env THORFLEET_API_KEY), "
                            "or service_allow_no_api_key=True to serve without one")
        host = data.get("service_host")
        if host not in (None, "127.0.0.1", "localhost", "::1") and \
                data.get("service_allow_no_api_key") != "anywhere":
            problems.append(f"service_host={host!r} without an API key would expose the server: "
                            "set an API key, or service_allow_no_api_key='anywhere' if you "
                            "really mean it")
    canary = data.get("rollout_canary_group")
    if groups is not None and isinstance(canary, str) and canary not in groups:
        names = sorted(g for g in groups if g != "all")
        problems.append(f"rollout_canary_group={canary!r} is not a group of this inventory: "
                        f"use one of {names} or None")
    return (None if problems else values), problems
