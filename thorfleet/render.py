"""Checked settings turned into what the deploy writes: rendered locally, hashed.

Everything a box receives is rendered here on the laptop, so its hash is known before connecting and
a restart can be decided by comparing hashes rather than by "did this run change a file". Derived
values are computed once per host (and the image's files hashed once per run, by the caller).
"""

from __future__ import annotations

import hashlib
from functools import cached_property

import jinja2

from thorfleet import layout
from thorfleet.recipe import PROFILES, SEED_ENV
from thorfleet.schema import Schema


def image_files_hash(folder=layout.FILES / "image"):
    """The derived image's build context on the laptop, hashed: read once per run, then each host
    adds its base and options to a copy (Settings.image_inputs_hash)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(layout.FILES)).encode() + b"\0" + path.read_bytes())
    return digest


_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(layout.FILES)),
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,
)


class Settings:
    """One host's checked settings (`s.service_port`, ...), with what is derived and rendered."""

    def __init__(self, values: Schema, *, api_key=None, hf_token=None, image_files=None):
        self.values = values
        self.api_key = api_key
        self.hf_token = hf_token
        self._image_files = image_files

    def __getattr__(self, name):
        # A declared setting reads as an attribute: s.service_port. Nothing else does.
        if name in Schema.model_fields:
            return getattr(self.__dict__["values"], name)
        raise AttributeError(name)

    def __repr__(self):  # never the secrets
        return f"Settings({self.values!r})"

    # --- derived values ---------------------------------------------------------------------------
    @cached_property
    def listen_host(self):
        if self.service_host:
            return self.service_host
        return "0.0.0.0" if self.api_key else "127.0.0.1"

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
    def environment(self):
        return {**SEED_ENV, **{k: str(v) for k, v in self.service_extra_env.items()}}

    # --- rendered files ---------------------------------------------------------------------------
    def render(self, template):
        return _templates.get_template(template).render(
            s=self, profile=PROFILES[self.service_profile], layout=layout)

    @cached_property
    def unit_text(self):
        return self.render("systemd/thorfleet-vllm.service.j2")

    @cached_property
    def config_text(self):
        return self.render("vllm.yaml.j2")

    @cached_property
    def secrets_env_text(self):
        return f"VLLM_API_KEY={self.api_key}\n" if self.api_key else ""

    @cached_property
    def fingerprint(self):
        """Hash of everything the running server reads: a different one means restart."""
        parts = (self.unit_text, self.config_text, self.secrets_env_text)
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()
