"""Group data turned into what the deploy writes: checked first, rendered locally, hashed.

Everything a box receives is rendered here on the laptop, so its hash is known before connecting and
a restart can be decided by comparing hashes rather than by "did this run change a file".
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "files"

# Serving profiles of the seed recipe: EAGLE-3 limits the context to 64K, without it 256K fits.
PROFILES = {
    "default": {"eagle": True, "max_model_len": 65536},
    "no-eagle": {"eagle": False, "max_model_len": 262144},
}

# The seed's container environment (FACTS.md "The container"); service_extra_env is merged over it.
SEED_ENV = {
    "VLLM_USE_FLASHINFER_MOE_FP4": "1",
    "VLLM_FLASHINFER_MOE_BACKEND": "latency",
    "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass",
    "VLLM_USE_FUSED_MOE_GROUPED_TOPK": "1",
    "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE": "524288000",
    "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE": "163840",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "USE_FASTSAFETENSOR": "true",
    "VLLM_ENABLE_CUDAGRAPH_GC": "0",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    "HF_HUB_DISABLE_XET": "1",
    "LD_PRELOAD": "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1",
}

# Where things live on the box.
BOX_BIN = "/opt/thorfleet/bin"
BOX_VENV = "/opt/thorfleet/venv"
BOX_IMAGE_CONTEXT = "/opt/thorfleet/image"
BOX_ETC = "/etc/thorfleet"
BOX_CONFIG = f"{BOX_ETC}/vllm/vllm.yaml"
BOX_SECRETS_ENV = f"{BOX_ETC}/secrets.env"
BOX_HF_TOKEN = f"{BOX_ETC}/hf_token"
BOX_VLLM_CACHE = "/var/cache/thorfleet/vllm"
CLOCKS_UNIT = "thorfleet-clocks.service"

_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


class SettingsError(ValueError):
    """Bad group data; `problems` holds one message per problem."""

    def __init__(self, problems):
        self.problems = problems
        super().__init__("\n".join(problems))


def _read_secret(path, env_name):
    if path:
        return Path(path).expanduser().read_text().strip() or None
    return os.environ.get(env_name) or None


@dataclass
class Settings:
    data: dict
    api_key: str | None = field(repr=False, default=None)
    hf_token: str | None = field(repr=False, default=None)

    def __getattr__(self, name):
        # Group data keys read as attributes: settings.service_port
        try:
            return self.__dict__["data"][name]
        except KeyError:
            raise AttributeError(name) from None

    # --- derived values -------------------------------------------------------------------------
    @property
    def listen_host(self):
        if self.data.get("service_host"):
            return self.data["service_host"]
        return "0.0.0.0" if self.api_key else "127.0.0.1"

    def checkpoint_dir(self, repo, revision):
        return f"{self.weights_dir}/{repo.split('/')[-1]}/{revision}"

    @property
    def model_dir(self):
        return self.checkpoint_dir(self.weights_model_repo, self.weights_model_revision)

    @property
    def draft_dir(self):
        return self.checkpoint_dir(self.weights_draft_repo, self.weights_draft_revision)

    @property
    def image_inputs_hash(self):
        digest = hashlib.sha256()
        for path in sorted((FILES / "image").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(FILES)).encode() + b"\0" + path.read_bytes())
        digest.update(f"base={self.image_base}\0think={bool(self.image_think_prefill)}".encode())
        return digest.hexdigest()

    @property
    def image_tag(self):
        return f"{self.image_name}:{self.image_inputs_hash[:12]}"

    @property
    def environment(self):
        return {**SEED_ENV, **{k: str(v) for k, v in (self.service_extra_env or {}).items()}}

    # --- rendered files ---------------------------------------------------------------------------
    def render(self, template):
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(FILES)),
            keep_trailing_newline=True,
            undefined=jinja2.StrictUndefined,
        )
        return env.get_template(template).render(s=self, profile=PROFILES[self.service_profile])

    @property
    def unit_text(self):
        return self.render("systemd/thorfleet-vllm.service.j2")

    @property
    def config_text(self):
        return self.render("vllm.yaml.j2")

    @property
    def secrets_env_text(self):
        return f"VLLM_API_KEY={self.api_key}\n" if self.api_key else ""

    @property
    def fingerprint(self):
        """Hash of everything the running server reads: a different one means restart."""
        parts = (self.unit_text, self.config_text, self.secrets_env_text)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def problems(data, api_key, hf_token):
    """Every problem with one host's data, as messages that say how to fix it."""
    found = []

    def check(ok, message):
        if not ok:
            found.append(message)

    check(data.get("service_profile") in PROFILES,
          f"service_profile={data.get('service_profile')!r} is unknown: use one of {sorted(PROFILES)}")
    gmu = data.get("service_gpu_memory_utilization")
    check(isinstance(gmu, (int, float)) and not isinstance(gmu, bool) and 0 < gmu <= 1,
          f"service_gpu_memory_utilization={gmu!r} must be a number in (0, 1]")
    if data.get("memory_min_available_gib") is not None:  # None: derived on the box from MemTotal
        value = data["memory_min_available_gib"]
        check(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
              f"memory_min_available_gib={value!r} must be a non-negative number, or None to "
              "derive it from service_gpu_memory_utilization")
    for key in ("ssh_keepalive_interval_s", "memory_gate_margin_gib", "memory_gate_timeout_s",
                "memory_gate_interval_s", "service_health_timeout_s", "power_reboot_timeout_s", "preflight_min_memory_gib",
                "preflight_min_free_disk_gib", "service_port", "rollout_batch"):
        value = data.get(key)
        check(isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0,
              f"{key}={value!r} must be a non-negative number")
    for key in ("service_port", "rollout_batch", "memory_gate_interval_s"):
        value = data.get(key)
        check(not isinstance(value, (int, float)) or value >= 1, f"{key}={value!r} must be at least 1")
    check(data.get("power_mode") in (0, 1, 2, 3),
          f"power_mode={data.get('power_mode')!r} is not a T5000 mode (0, 1, 2, 3)")
    for key in ("weights_model_revision", "weights_draft_revision"):
        value = data.get(key)
        check(isinstance(value, str) and bool(_HEX40.match(value)),
              f"{key}={value!r} is not pinned: set the 40-hex commit hash you tested")
    base = data.get("image_base")
    check(isinstance(base, str) and bool(_DIGEST.search(base)),
          f"image_base={base!r} is not pinned by digest: use REPO@sha256:<64 hex> (the tag moves)")
    try:
        Version(str(data.get("preflight_min_l4t_release")))
    except InvalidVersion:
        found.append(f"preflight_min_l4t_release={data.get('preflight_min_l4t_release')!r} "
                     "is not a version like 38.0")
    if not api_key:
        check(bool(data.get("service_allow_no_api_key")),
              "no API key: set service_api_key_file (or env THORFLEET_API_KEY), "
              "or service_allow_no_api_key=True to serve without one")
        host = data.get("service_host")
        check(host in (None, "127.0.0.1", "localhost", "::1") or data.get("service_allow_no_api_key")
              == "anywhere",
              f"service_host={host!r} without an API key would expose the server: set an API key, "
              "or service_allow_no_api_key='anywhere' if you really mean it")
    extra_env = data.get("service_extra_env") or {}
    check(isinstance(extra_env, dict), "service_extra_env must be a dict of NAME: value")
    check("VLLM_API_KEY" not in extra_env and "HF_TOKEN" not in extra_env,
          "service_extra_env must not carry secrets: use service_api_key_file / weights_hf_token_file")
    return found


def settings_for(data):
    """Settings for one host's data, or SettingsError naming every problem."""
    data = dict(data)
    try:
        api_key = _read_secret(data.get("service_api_key_file"), "THORFLEET_API_KEY")
        hf_token = _read_secret(data.get("weights_hf_token_file"), "HF_TOKEN")
    except OSError as error:
        raise SettingsError([f"cannot read a secrets file: {error}"]) from error
    found = problems(data, api_key, hf_token)
    if found:
        raise SettingsError(found)
    return Settings(data=data, api_key=api_key, hf_token=hf_token)


_checked = {}


def settings_for_inventory(inventory):
    """Settings for every host of the inventory, or SettingsError naming each host's problems.

    Checked once per run, on the first host's turn, so that bad data stops the whole run before any
    operation is planned on any host.
    """
    key = id(inventory)
    if key not in _checked:
        found, settings, boxes = [], {}, {}
        for h in inventory:
            data = h.data.dict()
            try:
                settings[h.name] = settings_for(data)
            except SettingsError as error:
                found += [f"{h.name}: {p}" for p in error.problems]
            address = (data.get("ssh_hostname") or h.name, data.get("ssh_port") or 22,
                       data.get("service_port"))
            boxes.setdefault(address, []).append(h.name)
        for (addr, ssh_port, port), names in boxes.items():
            if len(names) > 1:
                found.append(f"{', '.join(names)}: the same box ({addr}:{ssh_port}) twice with "
                             f"service_port={port}: two services cannot share one port")
        _checked[key] = SettingsError(found) if found else settings
    result = _checked[key]
    if isinstance(result, SettingsError):
        raise result
    return result
