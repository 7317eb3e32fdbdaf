"""Fixtures and helpers for the tests of the base stand-in and of the chat patches.

Everything package-level runs inside containers of the stand-in base image (or of a variant of
it), never in this machine's Python: the host has huggingface_hub 2.x for the deploy, which
transformers 4.57.3 cannot live with.
"""

import contextlib
import hashlib
import json
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.sim import state_dir
from tests.sim.base import (
    HERE,
    IMAGE_CONTEXT,
    build_derived,
    ensure_base_image,
    export_v15_tokenizer,
)

VARIANTS = HERE / "variants"
SERVE = ["vllm", "serve", "/model", "--config", "/config/vllm.yaml",
         "--attention-backend", "TRITON_MLA", "--language-model-only"]
# The seed's runtime YAML (FACTS.md), on the port the stand-in listens on inside its container.
SEED_CONFIG = """\
host: 0.0.0.0
port: 8002
gpu_memory_utilization: 0.72
max_model_len: 65536
max_num_seqs: 1
max_num_batched_tokens: 8192
enable_chunked_prefill: true
quantization: compressed-tensors
kv_cache_dtype: auto
tokenizer_mode: mistral
reasoning_parser: mistral
enable_auto_tool_choice: true
tool_call_parser: mistral
trust_remote_code: true
enable_prefix_caching: false
speculative_config: {model: /eagle, method: eagle, num_speculative_tokens: 3, max_model_len: 65536}
compilation_config: {cudagraph_mode: PIECEWISE, cudagraph_capture_sizes: [4, 8, 12]}
"""


@pytest.fixture(scope="session")
def docker_client():
    client = docker.from_env(timeout=1800)
    client.ping()
    return client


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    from tests.sim.rootfs import ensure_rootfs

    return ensure_base_image(docker_client, ensure_rootfs(docker_client))


@pytest.fixture(scope="session")
def model_dir(docker_client, base_image) -> Path:
    """A model dir as the hub serves it, as far as the stand-in reads it: the v15 tekken.json."""
    path = state_dir() / "test-model"
    export_v15_tokenizer(docker_client, base_image, path / "tekken.json")
    return path


def variant(client, base: str, name: str) -> str:
    """The base changed as variants/<name>/Dockerfile says, cached by its inputs."""
    dockerfile = VARIANTS / name / "Dockerfile"
    key = hashlib.sha256(base.encode() + dockerfile.read_bytes()).hexdigest()[:12]
    tag = f"thorfleet-sim/vllm-base-variant:{name}-{key}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        client.images.build(path=str(dockerfile.parent), tag=tag, buildargs={"BASE": base},
                            rm=True, forcerm=True, network_mode="bridge")
    return tag


def derive(base: str, tag: str, think_prefill: bool = True, labels=()):
    """build-image.sh as the deploy runs it; returns (exit code, all output)."""
    done = build_derived(base, tag, think_prefill=think_prefill, labels=labels)
    return done.returncode, done.stdout + done.stderr


def render(client, image: str) -> dict:
    """`chatfix.py render` in a throwaway container: each case through vLLM's own
    MistralTokenizer.apply_chat_template, with the v15 test tokenizer."""
    out = client.containers.run(
        image, ["python3", "/ctx/chatfix.py", "render"], remove=True, network_mode="none",
        volumes={str(IMAGE_CONTEXT): {"bind": "/ctx", "mode": "ro"}}, stderr=False)
    return json.loads(out.decode().strip().splitlines()[-1])


def run_python(client, image: str, code: str) -> str:
    return client.containers.run(image, ["python3", "-c", code], remove=True,
                                 network_mode="none").decode()


class StandIn:
    """One `vllm serve` stand-in container, published on 127.0.0.1."""

    def __init__(self, container):
        self.container = container

    @property
    def url(self) -> str:
        self.container.reload()
        port = self.container.attrs["NetworkSettings"]["Ports"]["8002/tcp"][0]["HostPort"]
        return f"http://127.0.0.1:{port}"

    def logs(self) -> str:
        return self.container.logs().decode(errors="replace")

    def refuses_inside(self) -> bool:
        """Whether port 8002 refuses connections inside the container (as while loading)."""
        probe = ("import socket; s = socket.socket(); "
                 "print(s.connect_ex(('127.0.0.1', 8002)))")
        _, out = self.container.exec_run(["python3", "-c", probe])
        return out.decode().strip() != "0"

    def wait_log(self, text: str, timeout: float = 120) -> None:
        started = time.time()
        while text not in self.logs():
            assert time.time() - started < timeout, f"no {text!r} in:\n{self.logs()}"
            time.sleep(0.3)

    def wait_exit(self, timeout: float = 120) -> int:
        return self.container.wait(timeout=timeout)["StatusCode"]

    def wait_healthy(self, timeout: float = 120) -> float:
        started = time.time()
        while time.time() - started < timeout:
            self.container.reload()
            if self.container.status == "exited":
                raise AssertionError(f"stand-in exited:\n{self.logs()}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return time.time() - started
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"stand-in not healthy after {timeout}s:\n{self.logs()}")

    def request(self, method: str, path: str, body=None, key: str | None = None):
        """(status, parsed JSON or text)."""
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()


@contextlib.contextmanager
def serving(client, image: str, model: Path, config: str = SEED_CONFIG, args=(), env=None,
            files=None):
    """Run `vllm serve /model --config ...` in a container of `image`; remove it afterwards.
    `files` maps container paths to text written into a read-only mounted dir (/sim)."""
    with tempfile.TemporaryDirectory(dir=state_dir(), prefix="standin-") as tmp:
        (Path(tmp) / "vllm.yaml").write_text(config)
        sim = Path(tmp) / "sim"
        sim.mkdir()
        for name, text in (files or {}).items():
            (sim / name).write_text(text)
        container = client.containers.run(
            image, [*SERVE, *args], detach=True,
            environment={"THORFLEET_SIM_LOAD_SECONDS": "3", "THORFLEET_SIM_DECODE_TOKS": "2000",
                         **(env or {})},
            volumes={str(model): {"bind": "/model", "mode": "ro"},
                     tmp: {"bind": "/config", "mode": "ro"},
                     str(sim): {"bind": "/sim", "mode": "ro"}},
            ports={"8002/tcp": ("127.0.0.1", None)})
        try:
            yield StandIn(container)
        finally:
            container.remove(force=True)
