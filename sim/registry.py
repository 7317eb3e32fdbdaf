"""The site's container registry: Debian's docker-registry (distribution 2.8) in a sim container.

Boxes reach it as thorfleet-registry:5000 (declared insecure in their daemon.json); the host's
dockerd pushes through 127.0.0.1:REGISTRY_LOCAL_PORT (loopback registries need no TLS).
"""

import time
import urllib.request

import docker.errors

from sim import NETWORK, STATE_LABEL, ensure_network, foreign, locked, log, state_dir

NAME = "thorfleet-registry"
REGISTRY_LOCAL_PORT = 25000
BINARY = "/usr/bin/docker-registry"  # from Debian's docker-registry package on the host
CONFIG = """\
# Written by sim/registry.py: plain HTTP, no auth, storage bind-mounted from the sim state.
version: 0.1
storage:
  filesystem:
    rootdirectory: /var/lib/docker-registry
  delete:
    enabled: true
http:
  addr: :5000
"""


def ensure_registry(client, rootfs: str):
    """Start the registry container (from the rootfs image, with the host's binary) if needed;
    one caller at a time (a test and the fleet may both start it)."""
    ensure_network(client)
    with locked("registry"):
        return _ensure_registry(client, rootfs)


def serving(client, rootfs: str) -> bool:
    """True when this state's registry, from this rootfs, is running: nothing to make."""
    try:
        container = client.containers.get(NAME)
    except docker.errors.NotFound:
        return False
    return container.status == "running" and _ours(container, rootfs)


def _ours(container, rootfs: str) -> bool:
    """Made by this state from this rootfs: another state's registry keeps its storage there,
    and ours would be missing our pushes."""
    return rootfs in container.image.tags and not foreign(container)


def _ensure_registry(client, rootfs: str):
    root = state_dir() / "registry"
    (root / "storage").mkdir(parents=True, exist_ok=True)
    (root / "config.yml").write_text(CONFIG)
    try:
        container = client.containers.get(NAME)
        if _ours(container, rootfs):
            if container.status != "running":
                container.start()
            _wait_ready()
            return container
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    log(f"registry: starting {NAME} on 127.0.0.1:{REGISTRY_LOCAL_PORT}")
    container = client.containers.run(
        rootfs, [BINARY, "serve", "/etc/docker/registry/config.yml"],
        name=NAME, hostname=NAME, network=NETWORK, detach=True,
        restart_policy={"Name": "unless-stopped"},
        ports={"5000/tcp": ("127.0.0.1", REGISTRY_LOCAL_PORT)},
        labels={"thorfleet.sim": "registry", STATE_LABEL: str(state_dir())},
        volumes={
            BINARY: {"bind": BINARY, "mode": "ro"},
            str(root / "config.yml"): {"bind": "/etc/docker/registry/config.yml", "mode": "ro"},
            str(root / "storage"): {"bind": "/var/lib/docker-registry", "mode": "rw"},
        },
    )
    _wait_ready()
    return container


def _wait_ready(timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{REGISTRY_LOCAL_PORT}/v2/", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def push(client, local_ref: str, repo_tag: str) -> str:
    """Push a local image as `repo_tag` (e.g. nvidia-ai-iot/vllm:latest-jetson-thor) and return
    the manifest digest (sha256:...) that boxes pull it by."""
    repository, _, tag = repo_tag.rpartition(":")
    local_repository = f"127.0.0.1:{REGISTRY_LOCAL_PORT}/{repository}"
    client.images.get(local_ref).tag(local_repository, tag)
    digest = None
    for event in client.images.push(local_repository, tag, stream=True, decode=True):
        if "error" in event:
            raise RuntimeError(f"push {repo_tag}: {event['error']}")
        digest = event.get("aux", {}).get("Digest", digest)
    if not digest:
        raise RuntimeError(f"push {repo_tag}: the registry returned no digest")
    return digest


def in_sim_ref(repository: str, digest: str) -> str:
    """How a box names a pushed image: by digest, through the registry's name on the network."""
    return f"{NAME}:5000/{repository}@{digest}"
