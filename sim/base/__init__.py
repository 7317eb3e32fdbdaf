"""The stand-ins for the vLLM base images thorfleet builds on: each a real vLLM release from PyPI
whose own API server runs here on CPU with only the engine stood in (vllm_standin.py), laid out as
its real image is.

    ensure_base_image(client, rootfs_ref, name=DEFAULT) -> image tag
    export_v15_tokenizer(client, image_ref, dest_path) -> dest_path
    build_derived(image_ref, tag, think_prefill=True, labels=()) -> CompletedProcess

BASES (`python -m sim bases` lists them, pushed to the sim's registry by digest):
    jetson-0.19.0    ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor: vLLM 0.19.0, transformers
                     4.57.3, mistral_common 1.11.0 in a venv at /opt/venv, first on PATH
    upstream-0.26.0  vllm/vllm-openai:v0.26.0: vLLM 0.26.0, transformers 5.20.2, mistral_common
                     1.11.7 in the system Python's dist-packages, entrypoint `vllm serve`
    upstream-0.26.0-no-flashinfer  vllm/vllm-openai:v0.26.0-no-flashinfer: that image without
                     FlashInfer (vLLM then picks other NVFP4 kernels by itself)
    upstream-0.33.0  vllm/vllm-openai:v0.33.0: vLLM 0.33.0, transformers 5.20.2, mistral_common
                     1.11.7, laid out as upstream-0.26.0
Wheels are downloaded on this machine once per base into the sim state dir and copied into the
build, so no CUDA torch is ever fetched (torch is the CPU build from the machine's local wheel
dir). Each image is tagged by a hash of its inputs: a second call with nothing changed builds
nothing.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import docker.errors

from sim import build_image, locked, log, state_dir

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
IMAGE_CONTEXT = REPO / "files" / "image"  # the derived image's build context (build-image.sh)
REPOSITORY = "thorfleet-sim/vllm-base"
COMMON = ["vllm_standin.py", "standin_core.py", "thor.py", "vllm"]  # every base's stand-in


@dataclass(frozen=True)
class Base:
    name: str
    dockerfile: str  # in this folder
    requirements: str  # the pinned wheels it installs with --no-deps, in this folder
    vllm: str  # the vLLM release, from PyPI
    repo_tag: str  # where the sim's registry serves it: the real image's name
    layout: str  # where its packages are, as the real image has them
    parent: str | None = None  # a base this one changes (dockerfile: FROM its BASE build arg)
    standin: tuple[str, ...] = ()  # stand-in files of its own beside COMMON, in this folder

    @property
    def vllm_version(self) -> str:
        return self.vllm.partition("==")[2]


BASES = {b.name: b for b in (
    Base("jetson-0.19.0", "Dockerfile", "requirements.txt", "vllm==0.19.0",
         "nvidia-ai-iot/vllm:latest-jetson-thor", "/opt/venv", standin=("torch_cuda_standin.py",)),
    # That image with a PyTorch built without Thor's sm_110 (as upstream's v0.19.0-cu130 had no
    # sm_110 kernels): `thorfleet doctor` must say it blocks serving.
    Base("jetson-0.19.0-no-sm110", "variants/no-sm110/Dockerfile", "", "vllm==0.19.0",
         "nvidia-ai-iot/vllm:latest-jetson-thor-no-sm110", "/opt/venv", parent="jetson-0.19.0"),
    Base("upstream-0.26.0", "Dockerfile.upstream", "requirements-0.26.0.txt", "vllm==0.26.0",
         "vllm/vllm-openai:v0.26.0", "system dist-packages", standin=("torchvision_standin",)),
    # A build of that image without FlashInfer (a tag whose build dropped it): vLLM then picks
    # other NVFP4 kernels by itself, and the proof must refuse it.
    Base("upstream-0.26.0-no-flashinfer", "variants/no-flashinfer/Dockerfile", "", "vllm==0.26.0",
         "vllm/vllm-openai:v0.26.0-no-flashinfer", "system dist-packages",
         parent="upstream-0.26.0"),
    Base("upstream-0.33.0", "Dockerfile.upstream", "requirements-0.33.0.txt", "vllm==0.33.0",
         "vllm/vllm-openai:v0.33.0", "system dist-packages", standin=("torchvision_standin",)),
)}
DEFAULT = "jetson-0.19.0"  # the base every fleet story runs on
VLLM_WHEEL = BASES[DEFAULT].vllm


def _inputs_hash(rootfs_ref: str, base: Base) -> str:
    digest = hashlib.sha256(f"{rootfs_ref}\0{base.vllm}\0".encode())
    names = ((base.dockerfile,) if base.parent
             else (base.dockerfile, base.requirements, *COMMON, *base.standin))
    for name in names:
        # a stand-in package is a folder: each of its files, by path
        files = sorted(f for f in (HERE / name).rglob("*") if f.is_file()) \
            if (HERE / name).is_dir() else [HERE / name]
        for path in files:
            digest.update(str(path.relative_to(HERE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_base_image(client, rootfs_ref: str, name: str = DEFAULT) -> str:
    """Return the tag of the stand-in base `name`, building it only when its inputs changed."""
    base = BASES[name]
    # a changed base is built from its parent's tag: the parent's inputs are in that tag
    parent = ensure_base_image(client, rootfs_ref, base.parent) if base.parent else rootfs_ref
    tag = _tag(parent, name)
    with locked(f"vllm-base{_suffix(name)}"):
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        if base.parent:
            build_image(client, f"base image {name}", state_dir() / "logs" /
                        f"vllm-base-{name}.log", path=str((HERE / base.dockerfile).parent),
                        tag=tag, buildargs={"BASE": parent})
        else:
            _build(client, tag, rootfs_ref, _wheels(base), base)
    return tag


def _suffix(name: str) -> str:
    return "" if name == DEFAULT else f"-{name}"


def _tag(parent_ref: str, name: str) -> str:
    return f"{REPOSITORY}:{_inputs_hash(parent_ref, BASES[name])}{_suffix(name)}"


def wheels_ahead(client, rootfs_ref: str, name: str = DEFAULT) -> None:
    """Download the wheels of base `name` (one built from the rootfs) when its image is not
    built: network time that can run while the rootfs is still being built, which the base's
    own build waits for anyway. Where the image is built, nothing."""
    try:
        client.images.get(_tag(rootfs_ref, name))
    except docker.errors.ImageNotFound:
        _wheels(BASES[name])


def _wheels(base: Base) -> Path:
    """Download (once per requirements list) every wheel the image installs, with this machine's
    pip: its find-links dir supplies torch's CPU build."""
    requirements = HERE / base.requirements
    key = hashlib.sha256(requirements.read_bytes() + base.vllm.encode()).hexdigest()[:16]
    cache = state_dir() / "cache" / f"base-wheels-{key}"
    if (cache / ".complete").exists():
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    log(f"base image {base.name}: downloading {base.vllm} and its pinned wheels into {cache} "
        "(once)")
    # This machine's Python is the image's (3.11, x86_64, glibc): its wheels fit the image.
    pip = [sys.executable, "-m", "pip", "download", "-qq", "--dest", str(cache),
           "--only-binary=:all:"]
    # Pinned, so resolving the same list again gives the same wheels; vLLM alone, without deps.
    started = time.monotonic()
    subprocess.run([*pip, "--no-deps", "-r", str(requirements)], check=True)
    subprocess.run([*pip, "--no-deps", base.vllm], check=True)
    shutil.copyfile(requirements, cache / "requirements.txt")
    (cache / ".complete").write_text("")
    took = f"base image {base.name}: wheels downloaded in {time.monotonic() - started:.0f}s"
    log(took)
    # kept beside the build's log, where .ci/run reads each base's times
    (state_dir() / "logs").mkdir(exist_ok=True)
    (state_dir() / "logs" / f"vllm-base-{base.name}-wheels.log").write_text(f"[sim] {took}\n")
    return cache


def _build(client, tag: str, rootfs_ref: str, wheels: Path, base: Base) -> None:
    log_path = state_dir() / "logs" / f"vllm-base-{base.name}.log"
    log_path.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=state_dir(), prefix="vllm-base-") as work:
        context = Path(work)
        for name in (*COMMON, *base.standin):
            if (HERE / name).is_dir():
                shutil.copytree(HERE / name, context / name)
            else:
                shutil.copy2(HERE / name, context / name)
        shutil.copy2(HERE / base.dockerfile, context / "Dockerfile")
        (context / "wheels").mkdir()
        for wheel in wheels.iterdir():
            if wheel.name != ".complete":
                os.link(wheel, context / "wheels" / wheel.name)  # same filesystem: no copy
        build_image(client, f"base image {base.name}", log_path, path=str(context), tag=tag,
                    buildargs={"ROOTFS": rootfs_ref, "STAGE_OF": tag})
    _drop_install_stage(client, tag)


def _drop_install_stage(client, tag: str) -> None:
    """Remove the install stage's images of the build of `tag`: the classic builder keeps them
    (untagged), ~2.5 GB a base, and nothing reads them again, as the base's tag is its cache."""
    for image in client.images.list(filters={"dangling": True,
                                             "label": f"thorfleet.sim.stage-of={tag}"}):
        client.images.remove(image.id)  # and its untagged parents, the stage's other steps


def export_v15_tokenizer(client, image_ref: str, dest_path) -> Path:
    """Write the v15 test tokenizer (files/image/v15_test_tokenizer.py run inside the image, with
    the image's mistral_common) to dest_path; cached next to it by image id and script."""
    dest = Path(dest_path)
    script = IMAGE_CONTEXT / "v15_test_tokenizer.py"
    image_id = client.images.get(image_ref).id
    stamp = hashlib.sha256(image_id.encode() + script.read_bytes()).hexdigest()[:16]
    marker = dest.with_name(dest.name + ".source")
    if dest.exists() and marker.exists() and marker.read_text() == stamp:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as out:
        os.chmod(out, 0o777)
        client.containers.run(
            image_ref, ["python3", "/ctx/v15_test_tokenizer.py", "/out/tekken.json"], remove=True,
            network_mode="none",
            volumes={str(IMAGE_CONTEXT): {"bind": "/ctx", "mode": "ro"}, out: {"bind": "/out", "mode": "rw"}})
        shutil.move(Path(out) / "tekken.json", dest)
    marker.write_text(stamp)
    return dest


def build_derived(image_ref: str, tag: str, think_prefill: bool = True, labels=(),
                  context: Path = IMAGE_CONTEXT) -> subprocess.CompletedProcess:
    """Run files/image/build-image.sh with the host's docker, as the deploy runs it on a box."""
    argv = ["sh", str(context / "build-image.sh"), "--base", image_ref, "--tag", tag,
            "--think-prefill", "1" if think_prefill else "0"]
    for label in labels:
        argv += ["--label", label]
    return subprocess.run(argv, capture_output=True, text=True, check=False)
