"""The stand-in for the base image `ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor`.

    ensure_base_image(client, rootfs_ref) -> image tag
    export_v15_tokenizer(client, image_ref, dest_path) -> dest_path
    build_derived(image_ref, tag, think_prefill=True, labels=()) -> CompletedProcess

The image holds the real vLLM 0.19.0, transformers 4.57.3 and mistral_common 1.11.0 from PyPI in
/opt/venv (first on PATH) and a `vllm` command standing in for `vllm serve` (vllm_standin.py).
Wheels are downloaded on this machine once into the sim state dir and copied into the build,
so no CUDA torch is ever fetched (torch is the CPU build from the machine's local wheel dir).
The image is tagged by a hash of its inputs: a second call with nothing changed builds nothing.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import docker.errors

from tests.sim import build_image, locked, log, state_dir

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
IMAGE_CONTEXT = REPO / "files" / "image"  # the derived image's build context (build-image.sh)
REPOSITORY = "thorfleet-sim/vllm-base"
VLLM_WHEEL = "vllm==0.19.0"
INPUTS = ["Dockerfile", "requirements.txt", "vllm_standin.py", "standin_core.py", "vllm"]


def _inputs_hash(rootfs_ref: str) -> str:
    digest = hashlib.sha256(f"{rootfs_ref}\0{VLLM_WHEEL}\0".encode())
    for name in INPUTS:
        digest.update(name.encode() + b"\0" + (HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def ensure_base_image(client, rootfs_ref: str) -> str:
    """Return the tag of the stand-in base image, building it only when its inputs changed."""
    tag = f"{REPOSITORY}:{_inputs_hash(rootfs_ref)}"
    with locked("vllm-base"):
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        wheels = _wheels()
        _build(client, tag, rootfs_ref, wheels)
    return tag


def _wheels() -> Path:
    """Download (once per requirements.txt) every wheel the image installs, with this machine's
    pip: its find-links dir supplies torch's CPU build."""
    requirements = HERE / "requirements.txt"
    key = hashlib.sha256(requirements.read_bytes() + VLLM_WHEEL.encode()).hexdigest()[:16]
    cache = state_dir() / "cache" / f"base-wheels-{key}"
    if (cache / ".complete").exists():
        return cache
    cache.mkdir(parents=True, exist_ok=True)
    log(f"base image: downloading {VLLM_WHEEL} and its pinned wheels into {cache} (once)")
    # This machine's Python is the image's (3.11, x86_64, glibc): its wheels fit the image.
    pip = [sys.executable, "-m", "pip", "download", "-qq", "--dest", str(cache),
           "--only-binary=:all:"]
    # Pinned, so resolving the same list again gives the same wheels; vLLM alone, without deps.
    subprocess.run([*pip, "--no-deps", "-r", str(requirements)], check=True)
    subprocess.run([*pip, "--no-deps", VLLM_WHEEL], check=True)
    shutil.copyfile(requirements, cache / "requirements.txt")
    (cache / ".complete").write_text("")
    return cache


def _build(client, tag: str, rootfs_ref: str, wheels: Path) -> None:
    log_path = state_dir() / "logs" / "vllm-base.log"
    log_path.parent.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=state_dir(), prefix="vllm-base-") as work:
        context = Path(work)
        for name in INPUTS:
            shutil.copy2(HERE / name, context / name)
        (context / "wheels").mkdir()
        for wheel in wheels.iterdir():
            if wheel.name != ".complete":
                os.link(wheel, context / "wheels" / wheel.name)  # same filesystem: no copy
        build_image(client, "base image", log_path, path=str(context), tag=tag,
                    buildargs={"ROOTFS": rootfs_ref})


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
