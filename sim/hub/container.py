"""Run the stand-in hub in the `thorfleet-hub` container on the sim network.

The container runs server.py from the sim's bookworm rootfs with the state dir's hub/ folder
mounted read-only: the repos, a copy of server.py and the token file. The server re-reads the
manifest and the token file, so rebuilt repos or a new token need no restart; only a new server.py,
rootfs or network does.
"""

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import docker.errors

from sim import NETWORK, ensure_network, locked, log
from sim import state_dir as default_state_dir
from sim.hub.repos import build_repos

CONTAINER = "thorfleet-hub"
PORT = 8000
SERVER = Path(__file__).with_name("server.py")
MOUNT = "/srv/hub"
CONFIG_LABEL = "thorfleet.hub.config"


def start(
    client,
    network: str = NETWORK,
    state_dir: Path | None = None,
    rootfs_ref: str | None = None,
    *,
    token: str | None = None,
    tekken_json: Path | None = None,
) -> dict:
    """Build the repos and make sure the hub container runs the current server; return
    {"endpoint_in_sim", "endpoint_local", "revisions"}. A running, current container is kept."""
    hub_dir = Path(state_dir or default_state_dir()) / "hub"
    with locked("hub"):
        log(f"hub: the stand-in model repos under {hub_dir / 'repos'} (made once per input)")
        revisions = build_repos(hub_dir / "repos", tekken_json)
        _copy_if_changed(SERVER, hub_dir / "server.py")
        set_token(hub_dir.parent, token)
        if rootfs_ref is None:
            from sim.rootfs import ensure_rootfs

            rootfs_ref = ensure_rootfs(client)
        config = hashlib.sha256(
            json.dumps([SERVER.read_text(), rootfs_ref, network, str(hub_dir)]).encode()
        )
        container = _current(client, config.hexdigest()[:16])
        if container is None:
            log(f"hub: starting {CONTAINER} on {network}")
            container = _run(client, network, hub_dir, rootfs_ref, config.hexdigest()[:16])
        local = f"http://127.0.0.1:{_published_port(container)}"
        _wait_healthy(container, local)
    return {
        "endpoint_in_sim": f"http://{CONTAINER}:{PORT}",
        "endpoint_local": local,
        "revisions": revisions,
    }


def stop(client) -> None:
    """Remove the hub container (the repos stay in the state dir for the next start)."""
    try:
        client.containers.get(CONTAINER).remove(force=True)
    except docker.errors.NotFound:
        pass


def set_token(state_dir: Path, token: str | None, client: str | None = None) -> None:
    """Require `token` from now on (None: no token needed), of `client` (a box's address) alone
    or of every client. Takes effect on the next request."""
    path = Path(state_dir) / "hub" / "token"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_token(path, token, client)


def write_token(path: Path, token: str | None, client: str | None = None) -> None:
    """The hub's token file (server.py reads it) with `client`'s line (or the all-clients one)
    set to `token`, or removed when None."""
    key = client or "*"
    tokens = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                name, _, value = line.strip().rpartition(" ")
                tokens[name or "*"] = value
    tokens.pop(key, None)
    if token:
        tokens[key] = token
    text = "".join(f"{value}\n" if name == "*" else f"{name} {value}\n"
                   for name, value in sorted(tokens.items()))
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # the server re-reads it at every request: never half a file


def _copy_if_changed(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists() or dest.read_bytes() != src.read_bytes():
        tmp = dest.with_suffix(".tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)


def _current(client, config: str):
    """The existing container if it runs this very configuration; otherwise remove it."""
    try:
        container = client.containers.get(CONTAINER)
    except docker.errors.NotFound:
        return None
    if container.status == "running" and container.labels.get(CONFIG_LABEL) == config:
        return container
    container.remove(force=True)
    return None


def _run(client, network: str, hub_dir: Path, rootfs_ref: str, config: str):
    if network == NETWORK:
        ensure_network(client)
    else:
        try:
            client.networks.get(network)
        except docker.errors.NotFound:
            client.networks.create(network, driver="bridge")
    return client.containers.run(
        rootfs_ref,
        entrypoint=["python3", f"{MOUNT}/server.py"],
        command=["--root", f"{MOUNT}/repos", "--port", str(PORT), "--token-file", f"{MOUNT}/token"],
        name=CONTAINER,
        hostname=CONTAINER,
        network=network,
        ports={f"{PORT}/tcp": ("127.0.0.1", None)},
        volumes={str(hub_dir): {"bind": MOUNT, "mode": "ro"}},
        environment={"PYTHONUNBUFFERED": "1"},
        labels={CONFIG_LABEL: config},
        restart_policy={"Name": "unless-stopped"},
        detach=True,
    )


def _published_port(container) -> int:
    for _ in range(50):
        container.reload()
        bindings = (container.attrs["NetworkSettings"]["Ports"] or {}).get(f"{PORT}/tcp")
        if bindings:
            return int(bindings[0]["HostPort"])
        time.sleep(0.1)
    raise RuntimeError(f"{CONTAINER}: port {PORT} was not published")


def _wait_healthy(container, endpoint: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{endpoint}/_sim/health", timeout=2):
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.2)
    logs = container.logs(tail=30).decode(errors="replace")
    raise RuntimeError(f"{CONTAINER} did not answer on {endpoint} within {timeout}s:\n{logs}")
