"""Fixtures and helpers for the tests of the base stand-in and of the chat patches.

Everything package-level runs inside containers of the stand-in base image (or of a variant of
it), never in this machine's Python: the host has huggingface_hub 2.x for the deploy, which
transformers 4.57.3 cannot live with.
"""

import contextlib
import fcntl
import hashlib
import json
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from sim import state_dir
from sim.base import (
    HERE,
    IMAGE_CONTEXT,
    REPO,
    build_derived,
    ensure_base_image,
    export_v15_tokenizer,
)
from thorfleet.settings import layout

VARIANTS = HERE / "variants"
USAGE_CODE = REPO / "thorfleet" / "box" / "usage.py"  # layout.BOX_USAGE_CODE on a box
# As files/thor/systemd/thorfleet-vllm.service.j2 runs it, after `vllm serve /model`.
SERVE_ARGS = ("--config", "/config/vllm.yaml", "--attention-backend", "TRITON_MLA",
              "--language-model-only")
# The seed's container environment (thorfleet/settings/recipe.py RECIPE_ENV, docs/facts.md "The container").
SEED_ENV = {
    "VLLM_USE_FLASHINFER_MOE_FP4": "1", "VLLM_FLASHINFER_MOE_BACKEND": "latency",
    "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass", "VLLM_USE_FUSED_MOE_GROUPED_TOPK": "1",
    "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE": "524288000",
    "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE": "163840", "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "USE_FASTSAFETENSOR": "true", "VLLM_ENABLE_CUDAGRAPH_GC": "0",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True", "HF_HUB_DISABLE_XET": "1",
    "LD_PRELOAD": "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1",
}
# The seed's runtime YAML (docs/facts.md "The container"), on the port the stand-in listens on
# inside its container.
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
    from sim.rootfs import ensure_rootfs

    return ensure_base_image(docker_client, ensure_rootfs(docker_client))


# What the sim hub's params.json must say for vLLM 0.19.0 to read the checkpoint as Mistral Small
# 4 is read (MLA + MoE with a shared expert + llama4 scaling -> MistralLarge3ForCausalLM, and so
# the draft -> EagleMistralLarge3ForCausalLM: transformers_utils/configs/mistral.py L22-52,
# config/speculative.py L346-347). Without these keys vLLM resolves MixtralForCausalLM and refuses
# the draft ("Model architectures ['EagleMistralForCausalLM'] are not supported").
@pytest.fixture(scope="session")
def model_dir(docker_client, base_image) -> Iterator[Path]:
    """The model folder as the hub serves it (sim/hub/repos.py, pinned revision), with the
    v15 test tokenizer; its draft beside it as `<model_dir>.eagle`. One per pytest process: each
    xdist worker has its own session, and a folder shared between them was rewritten under a
    server another worker had just started on it (CI: "Invalid repository ID ... '/model'")."""
    path = Path(tempfile.mkdtemp(dir=state_dir(), prefix="test-model-"))
    yield hub_model(docker_client, base_image, path / "model")
    shutil.rmtree(path, ignore_errors=True)


def hub_model(client, base_image: str, path: Path) -> Path:
    from sim.hub.repos import DRAFT_REPO, MODEL_REPO, build_repos

    root = state_dir() / "test-hub"
    root.mkdir(parents=True, exist_ok=True)
    # The tokenizer and the hub's blobs are shared by every worker: built by one at a time.
    with (state_dir() / "test-hub.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        tekken = export_v15_tokenizer(client, base_image,
                                      state_dir() / "test-tokenizer" / "tekken.json")
        pins = build_repos(root, tekken)
        manifest = json.loads((root / "manifest.json").read_text())
        for repo, dest in ((MODEL_REPO, path), (DRAFT_REPO, path.with_name(path.name + ".eagle"))):
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            for name, entry in manifest["repos"][repo]["commits"][pins[repo]]["files"].items():
                shutil.copyfile(root / "blobs" / entry["sha256"], dest / name)
    return path


def variant(client, base: str, name: str, **buildargs: str) -> str:
    """The base changed as variants/<name>/Dockerfile says (with its build args), cached by its
    inputs."""
    dockerfile = VARIANTS / name / "Dockerfile"
    args = json.dumps(buildargs, sort_keys=True).encode()
    key = hashlib.sha256(base.encode() + dockerfile.read_bytes() + args).hexdigest()[:12]
    tag = f"thorfleet-sim/vllm-base-variant:{name}-{key}"
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        client.images.build(path=str(dockerfile.parent), tag=tag,
                            buildargs={"BASE": base, **buildargs}, rm=True, forcerm=True,
                            network_mode="bridge")
    return tag


def derive(base: str, tag: str, think_prefill: bool = True, labels=()):
    """build-image.sh as the deploy runs it; returns (exit code, all output)."""
    done = build_derived(base, tag, think_prefill=think_prefill, labels=labels)
    return done.returncode, done.stdout + done.stderr


def render(client, image: str) -> dict:
    """`chatfix.py render` in a throwaway container (nvidia runtime: it imports vLLM): each case
    through vLLM's own MistralTokenizer.apply_chat_template, with the v15 test tokenizer."""
    out = client.containers.run(
        image, ["python3", "/ctx/chatfix.py", "render"], remove=True, network_mode="none",
        runtime="nvidia",
        volumes={str(IMAGE_CONTEXT): {"bind": "/ctx", "mode": "ro"}}, stderr=False)
    return json.loads(out.decode().strip().splitlines()[-1])


def run_python(client, image: str, code: str, runtime: str = "nvidia") -> str:
    """python3 -c code in a throwaway container; the nvidia runtime by default, as importing
    torch (and so vLLM) needs libcuda.so.1 on a Jetson."""
    return client.containers.run(image, ["python3", "-c", code], remove=True, runtime=runtime,
                                 network_mode="none").decode()


def run_check(client, base: str, argv: list[str], volumes=None) -> dict:
    """The JSON a check script prints (its last line), run by the python of the sim base `base`
    in a throwaway container: the repo at /repo read-only, no network, the base's entrypoint
    cleared (the upstream image's is `vllm serve`), the nvidia runtime (torch needs libcuda.so.1,
    as on a Thor: docs/facts.md "Thor realities")."""
    from sim.rootfs import ensure_rootfs

    image = ensure_base_image(client, ensure_rootfs(client), base)
    out = client.containers.run(
        image, ["python3", *argv], entrypoint=[], remove=True, runtime="nvidia",
        network_mode="none", working_dir="/",
        volumes={str(REPO): {"bind": "/repo", "mode": "ro"}, **(volumes or {})})
    return json.loads(out.decode().splitlines()[-1])


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

    # Waits that span vLLM's imports: 20 s alone here, but 46 s and more while the suite's four
    # workers share two cores (CI stop 15 ran out of a 120 s wait), so they are long and end early
    # when the container exits.
    def wait_log(self, text: str, timeout: float = 600) -> None:
        started = time.time()
        while text not in self.logs():
            assert time.time() - started < timeout, f"no {text!r} in:\n{self.logs()}"
            self.container.reload()
            assert self.container.status != "exited" or text in self.logs(), \
                f"stand-in exited before {text!r}:\n{self.logs()}"
            time.sleep(0.3)

    def wait_exit(self, timeout: float = 600) -> int:
        return self.container.wait(timeout=timeout)["StatusCode"]

    def wait_healthy(self, timeout: float = 600) -> float:
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

    def request(self, method: str, path: str, body=None, key: str | None = None,
                timeout: float = 60):
        """(status, parsed JSON or text); TimeoutError when no answer comes within `timeout`."""
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode()


GIB = 1 << 30


def meminfo(available_gib: float, total_gib: float = 122) -> str:
    """A /proc/meminfo with the simulated Thor's numbers (122 GiB MemTotal, as
    sim/box/files/thorsim-memory models docs/facts.md "The target box": 128 GB unified memory)."""
    return (f"MemTotal:       {int(total_gib * GIB / 1024)} kB\n"
            f"MemFree:        {int(available_gib * GIB / 1024)} kB\n"
            f"MemAvailable:   {int(available_gib * GIB / 1024)} kB\n"
            "Buffers:               0 kB\nCached:                0 kB\n"
            "SwapTotal:             0 kB\nSwapFree:              0 kB\n")


@contextlib.contextmanager
def serving(client, image: str, model: Path, config: str = SEED_CONFIG, args=SERVE_ARGS, env=None,
            available_gib: float = 117, draft: bool = True, thorsim: Path | None = None,
            runtime: str = "nvidia"):
    """Run `vllm serve /model --config /config/vllm.yaml ...` in a container of `image` as the
    product's unit does (--runtime nvidia, /model and /eagle read-only, a vLLM cache kept across
    starts); remove it afterwards. /proc/meminfo shows a Thor with `available_gib` free (on a box
    the runtime mounts the box's); `thorsim` is mounted as /run/thorsim (holds, cache) when given."""
    # The unit's cache volume (layout.BOX_VLLM_CACHE): there vLLM keeps what it learnt of the
    # model's class (registry.py _save_modelinfo_to_cache, keyed by the model file's hash), which
    # otherwise costs each start two subprocesses that import vLLM (12 of a start's 22 CPU-s here).
    cache = state_dir() / "vllm-cache"
    cache.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=state_dir(), prefix="standin-") as tmp:
        (Path(tmp) / "vllm.yaml").write_text(config)
        (Path(tmp) / "meminfo").write_text(meminfo(available_gib))
        volumes = {str(model): {"bind": "/model", "mode": "ro"},
                   tmp: {"bind": "/config", "mode": "ro"},
                   str(Path(tmp) / "meminfo"): {"bind": "/proc/meminfo", "mode": "ro"},
                   str(cache): {"bind": "/root/.cache/vllm", "mode": "rw"}}
        # the unit's usage middleware (vllm.yaml names it): its code on PYTHONPATH, its journal
        (Path(tmp) / "usage").mkdir()
        volumes[str(Path(tmp) / "usage")] = {"bind": layout.BOX_USAGE_DIR, "mode": "rw"}
        volumes[str(USAGE_CODE)] = {"bind": layout.IMAGE_USAGE_CODE,
                                    "mode": "ro"}
        if draft:
            volumes[str(model.with_name(model.name + ".eagle"))] = {"bind": "/eagle", "mode": "ro"}
        if thorsim is not None:
            volumes[str(thorsim)] = {"bind": "/run/thorsim", "mode": "rw"}
        container = client.containers.run(
            image, ["vllm", "serve", "/model", *args], detach=True, runtime=runtime,
            environment={"THORFLEET_SIM_LOAD_SECONDS": "2",
                         "PYTHONPATH": layout.IMAGE_USAGE_HOME, **(env or {})},
            volumes=volumes, ports={"8002/tcp": ("127.0.0.1", None)})
        try:
            yield StandIn(container)
        finally:
            container.remove(force=True)


def derived_tag(base_id: str, context: Path = IMAGE_CONTEXT) -> str:
    """The shared derived image's tag: a digest of the base's image ID and every file of the
    build context (name and bytes), so any change to either names another image."""
    digest = hashlib.sha256(base_id.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()
                       and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"thorfleet-test/derived:{digest.hexdigest()[:16]}"


def derived_image(client, base: str):
    """The derived image build-image.sh makes of `base` with the deploy's default options, built
    once and kept under a tag named for everything it is made of (the base's ID and every file of
    the build context), so the modules that only serve or probe it share one build: each is a
    self-check that imports vLLM (issue 32). A changed patch or base is a new tag, built again;
    test_patches builds its own, as it tests the build."""
    tag = derived_tag(client.images.get(base).id)
    with (state_dir() / "derived-image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers: one builds, the others wait for it
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            code, output = derive(base, tag)
            assert code == 0, output
    return tag
