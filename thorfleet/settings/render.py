"""Checked settings turned into what the deploy writes: rendered locally, hashed.

Everything a box receives is rendered here on the laptop, so its hash is known before connecting and
a restart can be decided by comparing hashes rather than by "did this run change a file". Derived
values are computed once per host (and the image's files hashed once per run, by the caller).
"""

from __future__ import annotations

import hashlib
import math
import re
from functools import cached_property

import jinja2
import yaml

from thorfleet.settings import layout
from thorfleet.settings.recipe import (
    NO_MEDIA_DOMAIN,
    PROFILES,
    RECIPE_ENV,
    prefix_caching,
    served_names,
)
from thorfleet.settings.schema import API_KEY, Frozen, Schema


def image_files_hash(folder=layout.FILES / "image"):
    """The derived image's build context on the laptop, hashed: read once per run, then each host
    adds its base and options to a copy (Settings.image_inputs_hash)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(layout.FILES)).encode() + b"\0" + path.read_bytes())
    return digest


def systemd_word(value):
    """`value` written so that a unit's command line gives it to the command as it is
    (systemd.service(5), "Command lines"): % and $ doubled (systemd expands specifiers and
    variables), and anything beyond plain characters double-quoted with C escapes, so no value can
    split a word, end the line or start another. Plain values are written as they are.

    (A value that is a whole word by itself, such as service_name, can never be a lone `;`, which
    systemd reads as a command separator: the schema holds those to their own patterns.)"""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{value!r} has no unit spelling")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} in a unit")
        return str(value)
    text = str(value)
    if _SYSTEMD_PLAIN.fullmatch(text):
        return text
    text = text.replace("%", "%%").replace("$", "$$")
    return '"' + "".join(_SYSTEMD_ESCAPES.get(c) or (f"\\x{ord(c):02x}" if c < " " or c == "\x7f"
                                                   else c) for c in text) + '"'


_SYSTEMD_PLAIN = re.compile(r"[A-Za-z0-9_@+=:,./-]*")
_SYSTEMD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}


def yaml_scalar(value):
    """`value` as one YAML scalar, written by PyYAML's emitter (a string always double-quoted, so
    it can hold nothing that ends it, the line or the comment it is in); a list of strings as one
    flow sequence of them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} in the config")
    strings = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    style = '"' if isinstance(value, str) or strings else None
    text = yaml.safe_dump(value, default_style=style, default_flow_style=True, width=math.inf,
                          allow_unicode=False)
    return text.removesuffix("\n...\n").removesuffix("\n")


def _environment(finalize):
    # Every {{ value }} of a template passes through `finalize`: the emitter of the file it lands in.
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(layout.FILES)),
                              keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
                              finalize=finalize)


_templates = {".yaml.j2": _environment(yaml_scalar), ".service.j2": _environment(systemd_word),
              ".socket.j2": _environment(systemd_word),
              ".conf.j2": _environment(systemd_word)}  # a unit's drop-in: systemd's words too


class Settings(Frozen):
    """One host's checked settings (`s.service_port`, ...), with what is derived and rendered."""

    def __init__(self, values: Schema, *, api_key=None, hf_token=None, image_files=None):
        self.hold(values)  # a declared setting reads as an attribute: s.service_port
        self.api_key = api_key
        self.hf_token = hf_token
        self._image_files = image_files
        # With a gateway (thorfleet/plan.py sets them): the IPs the gateways connect from (one, or the
        # two sharing gateway_virtual_ip), which the box's firewall lets alone reach the vLLM port;
        # and, on a Thor that is a gateway too, its GatewaySettings.
        self.gateway_sources = None
        self.gateway_pool = layout.GATEWAY_BACKEND  # its HAProxy backend there (one per model)
        self.gateway_role = None
        self.monitor_role = None  # a gateway serving the model too, as the monitor: MonitorSettings
        self.monitor_source = None  # a monitor host of its own: the IP it scrapes this box from

    def __repr__(self):  # never the secrets
        return f"Settings({self.values!r})"

    # --- derived values ---------------------------------------------------------------------------
    @cached_property
    def listen_host(self):
        if self.service_host:
            return self.service_host
        return "0.0.0.0" if self.api_key else "127.0.0.1"

    @property
    def stop_timeout_s(self):
        """How long `docker stop` waits for the server: vLLM's own drain (shutdown_timeout,
        rollout_drain_timeout_s) and 30 s to exit; then SIGKILL."""
        return self.rollout_drain_timeout_s + 30

    @property
    def restart_s(self):
        """The longest a restart takes (thorfleet-serve activate): its wait for requests in
        flight, the stop, the memory gate, the start to /health, and 5 minutes for the proof. A
        killed run's restart slot at the gateway lapses after it."""
        return (self.rollout_drain_timeout_s + self.stop_timeout_s + self.memory_gate_timeout_s
                + self.service_health_timeout_s + 300)

    def checkpoint_dir(self, repo, revision):
        return f"{self.weights_dir}/{repo.split('/')[-1]}/{revision}"

    @cached_property
    def model_dir(self):
        return self.checkpoint_dir(self.weights_model_repo, self.weights_model_revision)

    @cached_property
    def draft_dir(self):
        return self.checkpoint_dir(self.weights_draft_repo, self.weights_draft_revision)

    @cached_property
    def image_inputs_hash(self):
        digest = (self._image_files or image_files_hash()).copy()
        digest.update(f"base={self.image_base}\0think={bool(self.image_think_prefill)}".encode())
        return digest.hexdigest()

    @cached_property
    def image_tag(self):
        return f"{self.image_name}:{self.image_inputs_hash[:12]}"

    @cached_property
    def image_shared_ref(self):
        """Where the image is shared through image_registry (None: each box builds its own)."""
        if not self.image_registry:
            return None
        return f"{self.image_registry}/{self.image_name.rsplit('/', 1)[-1]}:{self.image_inputs_hash[:12]}"

    @cached_property
    def served_names(self):
        """The model names this box answers to (vLLM's served_model_name), its profile's first."""
        return served_names(self.service_profile, self.weights_model_repo)

    @cached_property
    def environment(self):
        # A box that may fetch image URLs never follows a redirect: an allowed domain's redirect
        # would reach any host (vLLM's default follows them: envs.py VLLM_MEDIA_URL_ALLOW_REDIRECTS).
        vision = {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"} if self.vision else {}
        return {**RECIPE_ENV, **vision, **{k: str(v) for k, v in self.service_extra_env.items()}}

    @property
    def vision(self) -> bool:
        """Whether this box takes images (its profile's `vision`)."""
        return bool(PROFILES[self.service_profile].get("vision"))

    @property
    def prefix_caching(self) -> bool:
        """Whether vLLM caches prompt prefixes on this box: service_prefix_caching, or its
        profile's default."""
        return prefix_caching(self.service_profile, self.service_prefix_caching)

    @property
    def image_limit(self) -> dict:
        """vLLM's limit_mm_per_prompt for a vision box."""
        return {"image": self.service_images_per_prompt}

    @property
    def media_domains(self) -> list[str]:
        """vLLM's allowed_media_domains for a vision box: the operator's, or one name that never
        resolves (recipe.NO_MEDIA_DOMAIN: vLLM reads an empty list as any domain)."""
        return list(self.service_media_domains) or [NO_MEDIA_DOMAIN]

    # --- rendered files ---------------------------------------------------------------------------
    def render(self, template):
        """The file `template` (its name under files/) renders to with these settings, each value
        by the emitter of the file it lands in. What is not in the fingerprint is rendered by
        its operation (operations/files.template): the watchdog's unit, whose settings changed
        restart the watchdog, never the server."""
        emitter = next(e for suffix, e in _templates.items() if template.endswith(suffix))
        return emitter.get_template(template).render(
            s=self, profile=PROFILES[self.service_profile], layout=layout)

    @cached_property
    def unit_text(self):
        return self.render("thor/systemd/thorfleet-vllm.service.j2")

    @cached_property
    def start_limit_text(self):
        """The server unit's drop-in bounding its own restarts (from watchdog_max_restarts_per_hour).
        Not part of the fingerprint: systemd reads it at a daemon-reload, without a restart."""
        return self.render("thor/systemd/thorfleet-start-limit.conf.j2")

    @cached_property
    def watchdog_socket_text(self):
        """The watchdog's port, held by systemd across its restarts (watchdog_port)."""
        return self.render("thor/systemd/thorfleet-watchdog.socket.j2")

    @cached_property
    def config_text(self):
        return self.render("thor/vllm.yaml.j2")

    @cached_property
    def secrets_env_text(self):
        # systemd's EnvironmentFile and thorfleet-serve both read the value unquoted, as it is
        if self.api_key and not API_KEY.fullmatch(self.api_key):
            raise ValueError("the API key cannot be written to secrets.env as it is")
        return f"VLLM_API_KEY={self.api_key}\n" if self.api_key else ""

    @cached_property
    def fingerprint(self):
        """Hash of the files the running server reads but the secrets (unit and config, and through
        the unit the image and weights): a different one means restart. It is shown in the report,
        pyinfra's output and the box's process list, so it holds nothing derived from a secret:
        whether the server runs the live secrets is compared on the box (thorfleet-serve state's
        `secrets_proven`), so a key cannot be guessed offline from the fingerprint."""
        # and the token counter vLLM loads (a new one is only read by a new server)
        parts = (self.unit_text, self.config_text,
                 (layout.ROOT / "thorfleet" / "box" / "usage.py").read_text())
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()
