"""The simulated Thor fleet: boxes, registry, hub and the pyinfra inventory that points at them.

A box is a container `thorfleet-thor-<i>` (hostname `thor-<i>`) running systemd, sshd and its own
Docker engine; its SSH port is published on 127.0.0.1:22000+i. "Reboot" restarts the container:
systemd boots again, /run starts empty, the disk (container filesystem, /var/lib/docker) stays.

The gateway box (`up(gateway=True)`) is a container `thorfleet-gw-1` (hostname `gw-1`): systemd
and sshd only, SSH on 127.0.0.1:22100, its HTTPS port 28443 published on 127.0.0.1:28443.
`up(gateways=N)` brings up gw-1 ... gw-N (SSH on 22100 + i - 1; only gw-1's HTTPS is published):
two of them share the inventory's gateway_virtual_ip, an address of the sim network that this
machine reaches through Docker's bridge, held by whichever gateway keepalived says.
"""

import concurrent.futures
import hashlib
import importlib
import importlib.util
import io
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from sim import (
    NETWORK,
    STATE_LABEL,
    build_image,
    ensure_network,
    fixed_address,
    foreign,
    locked,
    log,
    network_of,
    registry,
    state_dir,
)
from sim.rootfs import ensure_rootfs, rootfs_tag

BOX_DIR = Path(__file__).parent / "box"
THOR_REPOSITORY = "thorfleet-sim/thor"
BOX_PREFIX = "thorfleet-thor-"
SSH_PORT_BASE = 22000
GATEWAY_DIR = Path(__file__).parent / "gateway"
GATEWAY_REPOSITORY = "thorfleet-sim/gateway"
# The operator's account on the gateway is the Thors': these files of the box's, and no others.
GATEWAY_BOX_FILES = ("sudoers-thor", "sshd-thorfleet.conf", "ssh-hostkeys.service", "environment")
GATEWAY_HOST = "gw-1"
GATEWAY_CONTAINER = "thorfleet-gw-1"
GATEWAY_SSH_PORT = 22100  # above the Thors' 22000+i; gw-i's is 22100 + i - 1
GATEWAY_NAME = re.compile(r"(?:thorfleet-)?gw-([1-9][0-9]?)")
# The same port inside and out, so the gateway's URL on the laptop is the one it serves.
GATEWAY_HTTPS_PORT = 28443
BASE_REPO_TAG = "nvidia-ai-iot/vllm:latest-jetson-thor"
MODEL_REPO = "mistralai/Mistral-Small-4-119B-2603-NVFP4"
DRAFT_REPO = "mistralai/Mistral-Small-4-119B-2603-eagle"
CUT_RULE = ["INPUT", "-p", "tcp", "--dport", "22", "-m", "comment", "--comment",
            "thorfleet-sim-cut", "-j", "DROP"]
# What a box needs to run systemd and its own dockerd here (--privileged and --cap-add ALL fail).
# The docker CLI, not the SDK: the SDK cannot express `systempaths=unconfined` (writable /proc/sys,
# for vm.drop_caches).
BOX_RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW",
    "--cap-add", "SYS_PTRACE", "--cap-add", "MKNOD", "--cap-add", "SYS_MODULE",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--security-opt", "systempaths=unconfined",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    # `nvpmodel -m 2` answered YES runs `systemctl reboot`: systemd exits, Docker starts it again.
    "--restart", "unless-stopped",
]
# The gateway runs systemd and sshd, no Docker engine and no Thor memory model: systemd's mounts
# (SYS_ADMIN), and iptables for `cut` (NET_ADMIN, NET_RAW).
GATEWAY_RUN_FLAGS = [
    "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "NET_RAW",
    "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
    "--tmpfs", "/run", "--tmpfs", "/run/lock", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
    "--restart", "unless-stopped",
]


# ---------------------------------------------------------------- images

def ensure_thor_image(client) -> str:
    """Build the simulated Thor image from the rootfs and sim/box/, cached by input hash."""
    rootfs = ensure_rootfs(client)
    digest = hashlib.sha256(rootfs.encode())
    files = (p for p in BOX_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in sorted(files):
        digest.update(str(path.relative_to(BOX_DIR)).encode() + b"\0")
        digest.update(path.read_bytes())
    tag = f"{THOR_REPOSITORY}:{digest.hexdigest()[:16]}"
    with locked("thor-image"):
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            with tempfile.TemporaryDirectory(prefix="thor-box-") as context:
                shutil.copytree(BOX_DIR, context, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
                log("box image: compiling the stub libcuda.so.1 the box's nvidia runtime mounts")
                build_libcuda_stub(Path(context) / "files" / "libcuda.so.1")
                build_image(client, "box image", state_dir() / "logs" / "thor-image.log",
                            path=context, tag=tag, buildargs={"ROOTFS": rootfs})
    return tag


def ensure_gateway_image(client) -> str:
    """Build the gateway image from the rootfs, sim/gateway/ and the box's account files,
    cached by input hash as the Thor image is."""
    rootfs = ensure_rootfs(client)
    inputs = gateway_context()
    digest = hashlib.sha256(rootfs.encode())
    for name, path in sorted(inputs.items()):
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes())
    tag = f"{GATEWAY_REPOSITORY}:{digest.hexdigest()[:16]}"
    with locked("gateway-image"):
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            with tempfile.TemporaryDirectory(prefix="thor-gateway-") as context:
                for name, path in inputs.items():
                    (Path(context) / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, Path(context) / name)
                build_image(client, "gateway image", state_dir() / "logs" / "gateway-image.log",
                            path=context, tag=tag, buildargs={"ROOTFS": rootfs})
    return tag


def gateway_context() -> dict:
    """{path in the build context: file} of the gateway image: sim/gateway/, and the box's
    account files under files/ as the Thor image has them."""
    inputs = {path.relative_to(GATEWAY_DIR).as_posix(): path for path in GATEWAY_DIR.rglob("*")
              if path.is_file() and "__pycache__" not in path.parts}
    inputs.update({f"files/{name}": BOX_DIR / "files" / name for name in GATEWAY_BOX_FILES})
    return inputs


def build_libcuda_stub(out: Path) -> Path:
    """The stub libcuda.so.1 the box's nvidia runtime mounts (sim/box/files/libcuda_stub.c),
    compiled here: the box's rootfs has no compiler. The same command as .ci/setup's for the host."""
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", str(out),
                    str(BOX_DIR / "files" / "libcuda_stub.c")], check=True)
    return out


# ---------------------------------------------------------------- secrets and keys

def ssh_key() -> Path:
    """The operator's SSH key for the sim (ed25519, generated once), and its authorized_keys dir."""
    key = state_dir() / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "thorfleet-sim",
                        "-f", str(key)], check=True)
    authorized = state_dir() / "authorized_keys"
    authorized.mkdir(exist_ok=True)
    (authorized / "thor").write_bytes(key.with_suffix(".pub").read_bytes())
    return key


def api_key_file() -> Path:
    """The vLLM API key the deploy installs: random, generated once, readable by root only."""
    path = state_dir() / "api_key"
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32) + "\n")
    return path


# ---------------------------------------------------------------- boxes

def box_name(index: int) -> str:
    return f"{BOX_PREFIX}{index}"


def host_name(index: int) -> str:
    return f"thor-{index}"


def ssh_port(index: int) -> int:
    return SSH_PORT_BASE + index


def index_of(host) -> int:
    """Accept `thor-2`, `thorfleet-thor-2` or `2`; refuse anything else (`gw-1` is no Thor)."""
    found = re.fullmatch(rf"(?:thor-|{BOX_PREFIX})?([0-9]+)", str(host))
    if found:
        return int(found.group(1))
    raise ValueError(f"{host!r} is not a Thor of the sim (thor-<i>, {BOX_PREFIX}<i> or <i>)")


def is_gateway(host) -> bool:
    return GATEWAY_NAME.fullmatch(str(host)) is not None


def gateway_index(host) -> int:
    """1 for `gw-1` or `thorfleet-gw-1`, 2 for gw-2, ..."""
    return int(GATEWAY_NAME.fullmatch(str(host))[1])


def gateway_host(index: int) -> str:
    return f"gw-{index}"


def container_of(host) -> str:
    """The container of a box: `gw-<i>` a gateway's, any other a Thor's (as index_of reads it)."""
    return f"thorfleet-gw-{gateway_index(host)}" if is_gateway(host) else box_name(index_of(host))


def ssh_port_of(host) -> int:
    """The box's SSH port on 127.0.0.1: a gateway's, or a Thor's (as index_of reads it)."""
    if is_gateway(host):
        return GATEWAY_SSH_PORT + gateway_index(host) - 1
    return ssh_port(index_of(host))


def boxes(client) -> dict:
    """{index: container} of the boxes that exist, running or not."""
    found = client.containers.list(all=True, filters={"label": "thorfleet.sim=box"})
    return {int(c.labels["thorfleet.index"]): c for c in found}


def gateway_container(client, host=GATEWAY_HOST):
    """A gateway box's container (gw-1's by default), running or not, or None."""
    try:
        return client.containers.get(container_of(host))
    except docker.errors.NotFound:
        return None


def gateway_containers(client) -> dict:
    """{gateway host: container} of the gateway boxes that exist, running or not."""
    found = client.containers.list(all=True, filters={"label": "thorfleet.sim=gateway"})
    return {gateway_host(gateway_index(c.name)): c for c in found if is_gateway(c.name)}


def _has_fixed_half(client) -> bool:
    return network_of(client)[1]


def virtual_ip(client) -> str:
    """The address two gateways share in a sim inventory (gateway_virtual_ip): near the top of
    the sim network, which Docker hands out from the bottom, with the network's prefix."""
    network, _ = network_of(client)
    return f"{network.broadcast_address - 5}/{network.prefixlen}"


def address(container) -> str | None:
    """A container's address on the sim network (None while it is stopped)."""
    networks = container.attrs["NetworkSettings"].get("Networks") or {}
    return (networks.get(NETWORK) or {}).get("IPAddress") or None


def box_data_dir(index: int) -> Path:
    """The box's disk for Docker: bind-mounted at /var/lib/docker (overlay2 needs a real fs)."""
    return state_dir() / "boxes" / host_name(index) / "docker"


def _start_box(client, image: str, index: int, warm: Path | None = None) -> None:
    data = box_data_dir(index)
    if warm is not None and not data.exists():
        _seed_disk(warm, data)
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run([
        "docker", "run", "--detach", "--name", box_name(index), "--hostname", host_name(index),
        "--network", NETWORK, "--publish", f"127.0.0.1:{ssh_port(index)}:22",
        "--label", "thorfleet.sim=box", "--label", f"thorfleet.index={index}",
        "--label", f"{STATE_LABEL}={state_dir()}",
        *BOX_RUN_FLAGS,
        "-v", f"{data}:/var/lib/docker",
        "-v", f"{state_dir() / 'authorized_keys'}:/etc/ssh/authorized_keys:ro",
        image,
    ], check=True, stdout=subprocess.DEVNULL)
    if warm is not None:
        _seed_modelinfos(client, warm.parent / "vllm", box_name(index))


def _start_gateway(client, image: str, host: str = GATEWAY_HOST) -> None:
    # Only gw-1's HTTPS is published: two gateways are reached at their shared address.
    https = (["--publish", f"127.0.0.1:{GATEWAY_HTTPS_PORT}:{GATEWAY_HTTPS_PORT}"]
             if host == GATEWAY_HOST else [])
    # A gateway's address never moves, as a LAN host's does not: its keepalived config names it
    # and the other's (a network made before the sim fixed them has no upper half: Docker picks).
    fixed = (["--ip", fixed_address(client, gateway_index(host))]
             if _has_fixed_half(client) else [])
    subprocess.run([
        "docker", "run", "--detach", "--name", container_of(host), "--hostname", host,
        "--network", NETWORK, *fixed, "--publish", f"127.0.0.1:{ssh_port_of(host)}:22", *https,
        "--label", "thorfleet.sim=gateway", "--label", f"{STATE_LABEL}={state_dir()}",
        *GATEWAY_RUN_FLAGS,
        "-v", f"{state_dir() / 'authorized_keys'}:/etc/ssh/authorized_keys:ro",
        image,
    ], check=True, stdout=subprocess.DEVNULL)


# A warm box's disk holds the base image already, as on a Thor where the operator pulled it
# beforehand: its first install builds the derived image but pulls no base. Pulled once per sim
# state by a box's own Docker (a box container that is never a host), then shared by hard links:
# a pull here is 27-31 CPU-seconds of a box's Docker, a linked copy a fraction of one.
# Only the image store is shared: Docker writes its metadata by rename (a new inode) and never
# writes an image layer's files (overlayfs copies up into the container's own layer); the engine's
# own files (engine-id, the network and build databases) are each box's, made at its first start.
WARM_PARTS = ("image", "overlay2")
WARM_BOX = "thorfleet-warm"
# A warm box also holds what the base's vLLM learnt of the sim checkpoint's model classes, in the
# unit's cache folder, as a Thor that served this base before would: vLLM keeps it there
# (vllm/model_executor/models/registry.py _save_modelinfo_to_cache: VLLM_CACHE_ROOT/modelinfos,
# one file per class, keyed by the hash of the class's module), and otherwise learns it at the
# first start in two subprocesses that each import vLLM: 16 CPU-seconds a box (issue 32). The
# cold boxes' first installs still pay it, as a new Thor does. Learnt once per sim state by
# vLLM itself, in the warm disk's box, for the classes vLLM resolves for the sim's checkpoint
# and its draft (its log: "Resolved architecture: ..."); a class it no longer resolves is only
# a cache miss, which vLLM fills as before.
MODEL_CLASSES = ("PixtralForConditionalGeneration", "EagleMistralLarge3ForCausalLM")
WARM_VLLM_CACHE = "/var/lib/thorfleet-warm-vllm"  # in the warm disk's box, the folder it fills
LEARN_MODEL_CLASSES = (
    "from vllm.model_executor.models.registry import ModelRegistry\n"
    f"for arch in {MODEL_CLASSES!r}:\n"
    "    assert ModelRegistry._try_inspect_model_cls(arch) is not None, arch\n")


def warm_disk(client, image: str, image_base: str) -> Path:
    """A box disk holding `image_base`, pulled by a box of `image`: made once, then kept."""
    key = hashlib.sha256(f"{client.images.get(image).id} {image_base} {MODEL_CLASSES}"
                         .encode()).hexdigest()[:16]
    root = state_dir() / "warm" / key
    if (root / "ready").exists():
        return root / "docker"
    with locked("warm"):
        if (root / "ready").exists():
            return root / "docker"
        subprocess.run(["rm", "-rf", str(state_dir() / "warm")], check=False)
        (root / "docker").mkdir(parents=True)
        (root / "vllm").mkdir()
        log(f"warm disk: {image_base} pulled once by a box's own Docker, for the warm boxes")
        subprocess.run(["docker", "rm", "-f", WARM_BOX], capture_output=True, check=False)
        subprocess.run([
            "docker", "run", "--detach", "--name", WARM_BOX, "--hostname", "thor-warm",
            "--network", NETWORK, "--label", "thorfleet.sim=warm",
            "--label", f"{STATE_LABEL}={state_dir()}",
            *[flag for flag in BOX_RUN_FLAGS if flag not in ("--restart", "unless-stopped")],
            "-v", f"{root / 'docker'}:/var/lib/docker",
            "-v", f"{root / 'vllm'}:{WARM_VLLM_CACHE}", image,
        ], check=True, stdout=subprocess.DEVNULL)
        try:
            _in_warm_box("until docker info >/dev/null 2>&1; do sleep 1; done", timeout=180)
            _in_warm_box(f"docker pull -q {shlex.quote(image_base)}", timeout=900)
            # as the unit runs vLLM: the nvidia runtime (torch needs libcuda.so.1), the cache
            # folder at /root/.cache/vllm
            _in_warm_box(shlex.join([
                "docker", "run", "--rm", "--runtime", "nvidia", "--network", "none",
                "--entrypoint", "python3", "-v", f"{WARM_VLLM_CACHE}:/root/.cache/vllm",
                image_base, "-c", LEARN_MODEL_CLASSES]), timeout=600)
            _in_warm_box("systemctl stop docker.socket docker.service", timeout=120)
        finally:
            subprocess.run(["docker", "rm", "-f", WARM_BOX], capture_output=True, check=False)
        (root / "ready").touch()
    return root / "docker"


def _in_warm_box(command: str, timeout: float) -> None:
    done = subprocess.run(["docker", "exec", WARM_BOX, "sh", "-c", command], capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"warm disk: `{command}` failed ({done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")


def _seed_disk(warm: Path, data: Path) -> None:
    """A box's new disk: the warm disk's image store, hard-linked (directories are its own)."""
    data.mkdir(parents=True)
    for part in WARM_PARTS:
        subprocess.run(["cp", "-al", str(warm / part), str(data / part)], check=True)


def _seed_modelinfos(client, learnt: Path, container: str) -> None:
    """The warm disk's vLLM model-class cache, put into a new box at the unit's cache folder
    (thorfleet's layout.BOX_VLLM_CACHE, what the unit mounts at /root/.cache/vllm), every folder
    on the way root's and 755, as the deploy makes it."""
    from thorfleet.settings.layout import BOX_VLLM_CACHE

    target = Path(BOX_VLLM_CACHE)
    top = target.parent.parent  # /var/cache: the box's image has it
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for folder in reversed(target.relative_to(top).parents[:-1]):  # thorfleet/
            tar.addfile(_root_owned(tarfile.TarInfo(str(folder)), directory=True))
        tar.add(learnt, arcname=str(target.relative_to(top)),
                filter=lambda info: _root_owned(info, info.isdir()))
    client.containers.get(container).put_archive(str(top), archive.getvalue())


def _root_owned(info: tarfile.TarInfo, directory: bool) -> tarfile.TarInfo:
    if directory:
        info.type = tarfile.DIRTYPE
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755 if directory else 0o644
    info.mtime = info.mtime or int(time.time())
    return info


def remove_box(container, index: int) -> None:
    container.remove(force=True)
    # The inner dockerd's files belong to root and may be busy for a moment after the stop.
    subprocess.run(["rm", "-rf", str(box_data_dir(index).parent)], check=False)


def retire(client, hosts) -> None:
    """Remove boxes whose stories are done, with their disks. A converged box holds its base
    image (1.8 GB; the newer-base boxes hold three bases), and fifteen of them at once outgrow a
    CI machine's free disk. `up` starts a bare box again in its place if asked for it, but an
    `up` that leaves the fleet as it is (leave_existing) does not: its stories are done."""
    with locked("fleet"):
        found = boxes(client)
        for host in hosts:
            index = index_of(host)
            if index in found:
                log(f"retiring {host_name(index)}: its stories are done")
                remove_box(found[index], index)
        _replace(_retired_file(), json.dumps(sorted(set(_retired()) | {index_of(h) for h in hosts})))


def _retired_file() -> Path:
    return state_dir() / "retired.json"


def _retired() -> list[int]:
    return json.loads(_retired_file().read_text()) if _retired_file().exists() else []


def renew(client, host) -> None:
    """Replace a box with a bare one (a new container and disk, same name and port), booted and in
    known_hosts: for a story that must start from a first install, whatever ran there before."""
    index = index_of(host)
    with locked("fleet"):
        found = boxes(client).get(index)
        if found is not None:
            remove_box(found, index)
        _start_box(client, ensure_thor_image(client), index)
    wait_booted(client, index)
    _write_known_hosts(client)


def box_exec(client, host, command, user: str = "root", timeout: float = 120) -> tuple[int, str]:
    """Run a command in a box through Docker (works even when the box is cut off from SSH)."""
    argv = ["docker", "exec", "--user", user, container_of(host)]
    argv += ["sh", "-c", command] if isinstance(command, str) else list(command)
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return done.returncode, done.stdout + done.stderr


def wait_booted(client, host, timeout: float = 180) -> None:
    """Wait until systemd says `running` and sshd answers with a banner on the published port."""
    deadline = time.monotonic() + timeout
    state = "?"
    # the units a deploy installs: thorfleet's own, and on the gateway HAProxy's
    deploy_units = ("thorfleet", "haproxy") if is_gateway(host) else ("thorfleet",)
    while time.monotonic() < deadline:
        try:
            _, out = box_exec(client, host, "systemctl is-system-running", timeout=20)
            state = out.strip()
        except subprocess.TimeoutExpired:
            state = "timeout"
        if state == "running" and _ssh_banner(ssh_port_of(host)):
            return
        if state == "degraded":
            _, failed = box_exec(client, host, "systemctl --failed --no-legend")
            # The box itself booted; a unit a deploy installed may have failed (that is the
            # deploy's business), but a failed unit of the box's own is a broken simulation.
            if any(not line.split()[0].startswith(deploy_units) for line in
                   failed.strip().replace("●", "").splitlines() if line.split()):
                raise RuntimeError(f"{host} booted degraded:\n{failed}")
            if _ssh_banner(ssh_port_of(host)):
                log(f"{host} booted; failed deploy units: {failed.strip()}")
                return
        time.sleep(1)
    raise TimeoutError(f"{host} did not boot within {timeout:.0f}s (systemd: {state})")


def _ssh_banner(port: int) -> bool:
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.settimeout(2)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def reboot(client, host, wait: bool = True) -> None:
    """Reboot a box: a clean systemd shutdown (SIGRTMIN+3), then a fresh boot of the same disk."""
    client.containers.get(container_of(host)).restart(timeout=30)
    if wait:
        wait_booted(client, host)
        _write_known_hosts(client)


def cut(client, host) -> None:
    """The box stops answering on SSH, without closing open connections (packets are dropped)."""
    code, _ = box_exec(client, host, ["iptables", "-C", *CUT_RULE])
    if code != 0:
        code, out = box_exec(client, host, ["iptables", "-I", *CUT_RULE])
        if code != 0:
            raise RuntimeError(f"cut {host}: {out}")


def heal(client, host) -> None:
    while box_exec(client, host, ["iptables", "-C", *CUT_RULE])[0] == 0:
        box_exec(client, host, ["iptables", "-D", *CUT_RULE])


def is_cut(client, host) -> bool:
    return box_exec(client, host, ["iptables", "-C", *CUT_RULE])[0] == 0


def _write_known_hosts(client) -> Path:
    """known_hosts for strict checking, read from each box's own host keys. A box that cannot be
    read just now (another story is rebooting it) keeps its lines; the file is replaced whole, so
    stories on other boxes never read it half written."""
    path = state_dir() / "known_hosts"
    with locked("known_hosts"):
        kept = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    kept.setdefault(line.split()[0], []).append(line)
        lines = []
        found = sorted(boxes(client)) + sorted(gateway_containers(client))
        for host in found:
            where = f"[127.0.0.1]:{ssh_port_of(host)}"
            code, out = box_exec(client, host, "cat /etc/ssh/ssh_host_*_key.pub")
            if code == 0:
                lines += [f"{where} {' '.join(line.split()[:2])}"
                          for line in out.splitlines() if line.strip()]
            else:
                lines += kept.get(where, [])
        _replace(path, "\n".join(lines) + "\n")
    return path


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


# ------------------------------------------------------- base image and hub (others' parts)

def _optional(module: str, function: str):
    """A function of a sim part another engineer writes, or None (with a note) until it lands."""
    spec = importlib.util.find_spec(module)
    found = getattr(importlib.import_module(module), function, None) if spec else None
    if found is None:
        log(f"{module}.{function} is not there yet: skipped")
    return found


def _wheels_ahead(rootfs: str) -> None:
    if (wheels_ahead := _optional("sim.base", "wheels_ahead")) is not None:
        wheels_ahead(docker.from_env(), rootfs)  # a client of its own: the SDK's is not shared


def _ensure_base(client, rootfs: str) -> tuple[str | None, str | None]:
    """(the in-sim reference by digest, the local image) of the base vLLM stand-in."""
    ensure_base_image = _optional("sim.base", "ensure_base_image")
    if ensure_base_image is None:
        return None, None
    local = ensure_base_image(client, rootfs)
    digest = registry.push(client, local, BASE_REPO_TAG)
    return registry.in_sim_ref(BASE_REPO_TAG.partition(":")[0], digest), local


def bases(client=None, names=None) -> list[tuple[str, str, str]]:
    """(name, the in-sim reference by digest, vLLM version) of every stand-in base
    (sim/base BASES), or of those named, each built once (cached by its inputs) and pushed to
    the sim's registry under its real image's name, so a box pulls it as it would the real one."""
    from sim.base import BASES

    names = list(names or BASES)
    if unknown := sorted(set(names) - set(BASES)):
        raise ValueError(f"no stand-in base {', '.join(unknown)}: the bases are {', '.join(BASES)}")
    client = client or docker.from_env()
    rootfs = _registry_ready(client)

    def one(name):
        own = docker.from_env()  # a client per thread: the SDK's is not shared
        return name, _push_base(own, rootfs, name), BASES[name].vllm_version

    # Side by side: a build is mostly one core (pip unpacking wheels, Docker committing a layer),
    # and a base whose parent is building waits for it on the parent's lock (ensure_base_image).
    with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(one, names))


def base(name: str, client=None) -> str:
    """The in-sim reference by digest of one stand-in base (sim/base BASES), built once (cached by
    its inputs) and pushed to the sim's registry under its real image's name."""
    client = client or docker.from_env()
    return _push_base(client, _registry_ready(client), name)


def _registry_ready(client) -> str:
    """The rootfs image, with the sim's network and registry up to push bases to. Where `up` has
    made all three already, without waiting for it: it holds the fleet's lock for minutes
    (building the default base, booting the boxes), and a base needs none of that."""
    if registry.serving(client, rootfs := rootfs_tag()):
        return rootfs
    with locked("fleet"):  # a story may call this while other workers bring their boxes up
        rootfs = ensure_rootfs(client)
        ensure_network(client)
        registry.ensure_registry(client, rootfs)
    return rootfs


def _push_base(client, rootfs, name):
    from sim.base import BASES, ensure_base_image

    repo_tag = BASES[name].repo_tag
    digest = registry.push(client, ensure_base_image(client, rootfs, name), repo_tag)
    return registry.in_sim_ref(repo_tag.partition(":")[0], digest)


def _test_tokenizer(client, base_local: str | None) -> Path | None:
    """The v15 test tokenizer the hub serves as the model's tekken.json, made by the base image's
    own mistral_common (cached per base image)."""
    export = _optional("sim.base", "export_v15_tokenizer")
    if export is None or base_local is None:
        return None
    image_id = client.images.get(base_local).id.split(":")[-1][:16]
    path = state_dir() / "tokenizer" / image_id / "tekken.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        log("base image: exporting the v15 test tokenizer with its own mistral_common")
        export(client, base_local, path)
    return path


def _ensure_hub(client, rootfs: str, tekken_json: Path | None) -> dict | None:
    start = _optional("sim.hub", "start")
    if start is None:
        return None
    return start(client, network=NETWORK, state_dir=state_dir(), rootfs_ref=rootfs,
                 tekken_json=tekken_json)


# ---------------------------------------------------------------- the fleet

@dataclass
class Fleet:
    """What `up` made: the hosts, where the inventory is, and how to act on a box."""
    client: object
    hosts: list
    inventory: Path
    image_base: str | None = None
    hub: dict | None = None
    gateway: str | None = None  # the gateway box's host name (`gw-1`) when it is up
    state: Path = field(default_factory=state_dir)

    @property
    def key(self) -> Path:
        return self.state / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state / "known_hosts"

    def ssh_port(self, host) -> int:
        return ssh_port_of(host)

    def ip(self, host) -> str:
        """The box's address on the sim network: what the hub, the registry and (for the
        gateway's) the Thors see it come from."""
        container = self.client.containers.get(container_of(host))
        return container.attrs["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]

    def exec(self, host, command, user: str = "root", timeout: float = 120) -> tuple[int, str]:
        return box_exec(self.client, host, command, user=user, timeout=timeout)

    def put(self, host, path: str, text: str, mode: int = 0o600) -> None:
        """A root-owned file on the box, written through Docker (no command line carries it)."""
        data = text.encode()
        info = tarfile.TarInfo(Path(path).name)
        info.size, info.mode = len(data), mode
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.addfile(info, io.BytesIO(data))
        container = self.client.containers.get(container_of(host))
        assert container.put_archive(str(Path(path).parent), archive.getvalue()), path

    def ssh(self, host, command: str, timeout: float = 60, input: str | None = None,
            connect_timeout: int = 10) -> subprocess.CompletedProcess:
        """Run a command as the operator would: `ssh thor@box`, strict host key checking.
        Without `input`, stdin is closed (/dev/null), as a batch job's should be."""
        argv = ["ssh", "-i", str(self.key), "-p", str(self.ssh_port(host)),
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}",
                "-o", "LogLevel=ERROR", "thor@127.0.0.1", command]
        stdin = None if input is not None else subprocess.DEVNULL
        return subprocess.run(argv, input=input, stdin=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False)

    def reboot(self, host, wait: bool = True) -> None:
        reboot(self.client, host, wait=wait)

    def wait_booted(self, host, timeout: float = 180) -> None:
        wait_booted(self.client, host, timeout=timeout)
        _write_known_hosts(self.client)

    def renew(self, host) -> None:
        renew(self.client, host)

    def cut(self, host) -> None:
        cut(self.client, host)

    def heal(self, host) -> None:
        heal(self.client, host)

    def write_inventory(self, path, hosts=None, extra_data=None, gateway=None) -> Path:
        """As write_inventory; the gateway's address on the sim network read from Docker now."""
        def live(one):  # a stopped gateway has no address on the network: the last one read
            name, data = (one, {}) if isinstance(one, str) else one
            known = _recorded().get("gateways") or {}
            fixed = (fixed_address(self.client, gateway_index(name))
                     if _has_fixed_half(self.client) else None)
            return name, {"gateway_fleet_address": self.ip(name) or known.get(name) or fixed,
                          **data}

        if isinstance(gateway, list):
            gateway = [live(g) for g in gateway]
        elif gateway is not None:
            gateway = live(gateway)
        return write_inventory(path, self.hosts if hosts is None else hosts, extra_data, gateway)


def up(hosts: int = 2, inventory: Path | None = None, client=None,
       leave_existing: bool = False, gateway: bool = False,
       gateway_in_inventory: bool | None = None, warm: tuple[int, ...] = (),
       gateways: int | None = None) -> Fleet:
    """Bring the fleet to `hosts` booted boxes plus registry, base image and hub; write the
    inventory. Quick when nothing changed: images are cached, current boxes are kept.
    leave_existing=True starts, waits for and heals only new boxes: stories running on the
    others may have cut or be rebooting theirs on purpose.
    gateway=True brings the gateway box up too; the inventory lists it (group `gateway`) when
    gateway_in_inventory says so (default: as gateway). Without it a gateway box that exists is
    left as it is (a story may be using it) and the inventory has none. gateways=N brings up
    gw-1 ... gw-N (gateway=True is gateways=1); two or more in the inventory share
    gateway_virtual_ip (virtual_ip()).
    The boxes numbered in `warm`, when started on a new disk, hold the base image (warm_disk)."""
    client = client or docker.from_env()
    inventory = Path(inventory or state_dir() / "inventory.py")
    with locked("fleet"), concurrent.futures.ThreadPoolExecutor(1) as ahead:
        started = time.monotonic()
        # on a fresh machine the base's wheels download (network) while debootstrap builds the
        # rootfs, which the base's build waits for
        wheels = ahead.submit(_wheels_ahead, rootfs_tag())
        rootfs = ensure_rootfs(client)
        image = ensure_thor_image(client)
        ensure_network(client)
        ssh_key()
        api_key_file()
        registry.ensure_registry(client, rootfs)
        log("base image: the vLLM stand-in, pushed to the sim's registry")
        wheels.result()
        image_base, base_local = _ensure_base(client, rootfs)
        hub = _ensure_hub(client, rootfs, _test_tokenizer(client, base_local))

        existing = boxes(client)
        current_id = client.images.get(image).id
        for index, container in sorted(existing.items()):
            why = stale(container, index, hosts, current_id)
            if why:
                log(f"removing {host_name(index)} ({why})")
                if foreign(container):  # its disk is in the other state's dir: that one's to keep
                    container.remove(force=True)
                else:
                    remove_box(container, index)
                existing.pop(index)
        # A box retired by its finished stories stays retired for an `up` that leaves the fleet
        # as it is (a story growing the fleet while others retire theirs); a full `up` revives it.
        retired = set(_retired()) if leave_existing else set()
        if not leave_existing:
            _retired_file().unlink(missing_ok=True)
        started_now = []
        new_warm = {i for i in warm if i <= hosts} - set(existing) - retired
        seed = warm_disk(client, image, image_base) if new_warm else None
        for index in range(1, hosts + 1):
            if index in retired and index not in existing:
                continue
            if index not in existing:
                log(f"starting {host_name(index)} on 127.0.0.1:{ssh_port(index)}"
                    + (" (warm: the base pulled)" if index in warm else ""))
                _start_box(client, image, index, seed if index in warm else None)
                started_now.append(index)
            elif leave_existing:
                continue
            elif existing[index].status != "running":
                existing[index].start()
                started_now.append(index)
            else:
                heal(client, index)  # a box left cut by an interrupted test answers again
                started_now.append(index)
        count = gateways if gateways is not None else int(gateway)
        for g in range(1, count + 1):
            host = gateway_host(g)
            started_now += [host] if _ensure_gateway(client, leave_existing, host) else []
        if started_now:
            log(f"waiting for {', '.join(map(_host, started_now))} to boot (systemd, sshd)")
        for host in started_now:
            wait_booted(client, host)
        _write_known_hosts(client)

        names = [host_name(i) for i in range(1, hosts + 1)]
        # every gateway box there is, asked for or not (an `up` that grows or retires Thors
        # asks for none, and a story may be using gw-2 meanwhile: its address stays recorded)
        found = gateway_containers(client)
        _record(names, image_base, hub, own_inventory=inventory == state_dir() / "inventory.py",
                gateways={h: address(c) for h, c in found.items()}, virtual=virtual_ip(client))
        in_inventory = bool(count) if gateway_in_inventory is None else gateway_in_inventory
        listed = [gateway_host(g) for g in range(1, count + 1)] if in_inventory else []
        write_inventory(inventory, names, gateway=listed or None)
        said = {0: "", 1: " and the gateway"}.get(count, f" and {count} gateways")
        log(f"{hosts} box(es){said} up in {time.monotonic() - started:.0f}s; inventory: "
            f"{inventory}")
    first = GATEWAY_HOST if GATEWAY_HOST in found else None
    return Fleet(client, names, inventory, image_base, hub, first)


def stale(container, index: int, hosts: int, current_image: str) -> str | None:
    """Why `up` replaces a box it found, or None to keep it: beyond --hosts, made from an older
    image, or made by another sim state (keys mounted from there: ours would be refused)."""
    if index > hosts:
        return "beyond --hosts"
    made_by = foreign(container)
    if made_by:
        return f"made by sim state {made_by}"
    if container.image.id != current_image:
        return "image changed"
    return None


def _host(host) -> str:
    return host if is_gateway(host) else host_name(index_of(host))


def _ensure_gateway(client, leave_existing: bool, host: str = GATEWAY_HOST) -> bool:
    """Start a gateway box unless it runs the current image; whether it is to be waited for."""
    image = ensure_gateway_image(client)
    found = gateway_container(client, host)
    why = found is not None and stale(found, 1, 1, client.images.get(image).id)
    if why:
        log(f"removing {host} ({why})")
        found.remove(force=True)
        found = None
    if found is None:
        https = f" (HTTPS 127.0.0.1:{GATEWAY_HTTPS_PORT})" if host == GATEWAY_HOST else ""
        log(f"starting {host} on 127.0.0.1:{ssh_port_of(host)}{https}")
        _start_gateway(client, image, host)
    elif leave_existing:
        return False
    elif found.status != "running":
        found.start()
    else:
        heal(client, host)  # left cut by an interrupted test
    return True


def _record(names: list, image_base: str | None, hub: dict | None, own_inventory: bool,
            gateways: dict | None = None, virtual: str | None = None) -> None:
    """fleet.json, what every inventory's group data is written from (sim_group_data): the base
    image and the hub as this `up` found them, whatever inventory it writes (the hub's published
    port may have moved). The host list is the fleet's own, attach()'s: only an `up` that writes
    the fleet's own inventory replaces it, not a story's view of the fleet. The gateway box as
    it is now, and its address on the sim network (the last one read, while it restarts); each
    gateway box's, by host, under `gateways`."""
    path = state_dir() / "fleet.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    if own_inventory or "hosts" not in record:
        record["hosts"] = names
    gateways = gateways or {}
    gateway = GATEWAY_HOST if GATEWAY_HOST in gateways else None
    record["virtual_ip"] = virtual
    record.update(image_base=image_base, hub=hub, gateway=gateway)
    kept = record.get("gateways", {})
    # an address read while a gateway restarts is None: the last one read stands
    record["gateways"] = {h: a or kept.get(h) for h, a in gateways.items()}
    if gateway is None:
        record.pop("gateway_address", None)
    elif record["gateways"].get(GATEWAY_HOST):
        record["gateway_address"] = record["gateways"][GATEWAY_HOST]
    _replace(path, json.dumps(record, indent=2) + "\n")


def attach(client=None) -> Fleet:
    """The fleet the last `up` made, as it recorded it (fleet.json), without touching a box."""
    data = _recorded()
    return Fleet(client or docker.from_env(), data["hosts"], state_dir() / "inventory.py",
                 data.get("image_base"), data.get("hub"), data.get("gateway"))


def up_for_run(hosts: int, run: str, gateways: int = 1, warm: tuple[int, ...] = ()) -> Fleet:
    """The fleet for one test run: the first of the run's processes brings it up, the others
    (pytest-xdist workers) attach to it, so no box is healed or rewritten under a running story.
    The gateway boxes (gw-1 ... gw-<gateways>) are up for every run (sshd and systemd: small); a
    story that wants one in an inventory asks write_inventory(..., gateway=sim_fleet.gateway)."""
    marker = state_dir() / "run"
    with locked("run"):
        if marker.exists() and marker.read_text() == run:
            return attach()
        sim = up(hosts, gateways=gateways, gateway_in_inventory=False, warm=warm)
        _replace(marker, run)
        return sim


def end_run(run: str) -> bool:
    """Whether `run` brought the fleet up (then it is the one to take it down)."""
    marker = state_dir() / "run"
    with locked("run"):
        if marker.exists() and marker.read_text() == run:
            marker.unlink()
            return True
    return False


def down(client=None, keep_registry: bool = False) -> None:
    """Remove the boxes (and their disks), the hub, the registry and the network. Keys, the API
    key, registry storage and caches stay in the state dir. keep_registry=True leaves the registry
    and the network up: CI's bases may still be pushing when the first command's boxes go."""
    client = client or docker.from_env()
    with locked("fleet"):
        removals = []
        for index, container in sorted(boxes(client).items()):
            log(f"removing {host_name(index)}")
            removals.append(lambda c=container, i=index: remove_box(c, i))
        for host, gateway in sorted(gateway_containers(client).items()):
            log(f"removing {host}")
            removals.append(lambda g=gateway: g.remove(force=True))
        # all at once: each waits for its systemd to shut down, then a box's disk is deleted
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(removals))) as pool:
            list(pool.map(lambda remove: remove(), removals))
        hub = importlib.util.find_spec("sim.hub") and importlib.import_module("sim.hub")
        if hub and hasattr(hub, "stop"):
            hub.stop(client)
        # the warm disk's box too, if a killed `up` left it (warm_disk removes it itself)
        for name in (("thorfleet-hub", WARM_BOX) if keep_registry
                     else ("thorfleet-hub", WARM_BOX, registry.NAME)):
            try:
                client.containers.get(name).remove(force=True)
                log(f"removed {name}")
            except docker.errors.NotFound:
                pass
        for network in [] if keep_registry else client.networks.list(names=[NETWORK]):
            network.remove()


def status(client=None) -> list[str]:
    client = client or docker.from_env()
    lines = []
    for index, container in sorted(boxes(client).items()):
        state = container.status
        if state == "running":
            state = box_exec(client, index, "systemctl is-system-running")[1].strip()
            state += ", ssh cut" if is_cut(client, index) else ""
        lines.append(f"{host_name(index)}  127.0.0.1:{ssh_port(index)}  {state}")
    for host, gateway in sorted(gateway_containers(client).items()):
        state = gateway.status
        if state == "running":
            state = box_exec(client, host, "systemctl is-system-running")[1].strip()
            state += ", ssh cut" if is_cut(client, host) else ""
        https = f"https://127.0.0.1:{GATEWAY_HTTPS_PORT}  " if host == GATEWAY_HOST else ""
        lines.append(f"{host}  127.0.0.1:{ssh_port_of(host)}  {https}{state}")
    for name in (registry.NAME, "thorfleet-hub"):
        try:
            container = client.containers.get(name)
            ports = container.attrs["NetworkSettings"]["Ports"] or {}
            published = ", ".join(f"{b['HostIp']}:{b['HostPort']}" for v in ports.values() if v
                                  for b in v)
            lines.append(f"{name}  {container.status}  {published}")
        except docker.errors.NotFound:
            lines.append(f"{name}  absent")
    return lines or ["no fleet"]


# ---------------------------------------------------------------- inventory

def _recorded() -> dict:
    """fleet.json: what the last `up` made."""
    fleet_file = state_dir() / "fleet.json"
    if not fleet_file.exists():  # an inventory without the hub and pins would be refused later
        raise FileNotFoundError(f"{fleet_file}: no fleet recorded here: `python -m sim up`")
    return json.loads(fleet_file.read_text())


def sim_ssh_data() -> dict:
    """How the operator logs in to every sim box, Thor or gateway."""
    state = state_dir()
    return {
        "ssh_user": "thor",
        "ssh_key": str(state / "id_ed25519"),
        "ssh_known_hosts_file": str(state / "known_hosts"),
        # host keys are checked by thorfleet's own default (group_data/all.py), not set here
    }


def sim_gateway_data() -> dict:
    """The gateway group's data: how to log in and its own settings, none of the Thors'."""
    return {**sim_ssh_data(), "gateway_port": GATEWAY_HTTPS_PORT,
            "gateway_ca_dir": str(state_dir() / "fleet-ca")}


def sim_group_data() -> dict:
    """The Thors' group data a sim inventory carries, from the last `up` (fleet.json)."""
    state = state_dir()
    fleet = _recorded()
    data = sim_ssh_data()
    if fleet.get("image_base"):
        data["image_base"] = fleet["image_base"]
    hub = fleet.get("hub")
    if hub:
        revisions = hub.get("revisions", {})
        data["weights_hf_endpoint"] = hub["endpoint_in_sim"]
        # The sim's hub is plain HTTP on the sim's own network, and the stories that make it ask
        # for a token (tests/fleet/test_security.py) give the boxes one: allowed here, as a site would.
        data["weights_hf_allow_plain_http"] = True
        for key, repo in (("weights_model_revision", MODEL_REPO),
                          ("weights_draft_revision", DRAFT_REPO)):
            if repo in revisions:
                data[key] = revisions[repo]
    data["service_api_key_file"] = str(state / "api_key")
    # The boxes' shared copy key (weights_source): made by the first deploy that copies, kept here
    # rather than in the operator's ~/.config.
    data["weights_peer_key_file"] = str(state / "peer_ed25519")
    data["image_peer_key_file"] = str(state / "image_ed25519")  # the image copy's, likewise
    # Memory: none of thorfleet's memory settings are overridden. The box reports a Thor's unified
    # memory (MemTotal 122 GiB, sim/box/files/thorsim-memory), so the real defaults apply.
    # The disk is this machine's, smaller than a Thor's NVMe.
    data.update({
        "preflight_min_free_disk_gib": 10,
        # Half the product's 20 minutes, so a version that never answers fails a story sooner; not
        # less: a first start on this machine, with four groups pulling and loading images into
        # twelve boxes at once, once went past 5 minutes (disk-bound, the cores 30-65 % idle).
        "service_health_timeout_s": 600,
        # The decode benchmark costs a minute per first install; tests/fleet/test_benchmark.py turns it
        # on where it is the story (thorfleet's own default benchmarks every first install).
        "rollout_benchmark": "never",
        # This machine cannot raise the memlock hard limit (no CAP_SYS_RESOURCE): 8 MiB, not -1.
        "service_docker_ulimits": {"memlock": "8388608", "stack": "67108864"},
    })
    return data


def write_inventory(path, hosts, extra_data: dict | None = None, gateway=None) -> Path:
    """Write a pyinfra inventory with the group `sim_thors`, and `gateway` when one is given.

    hosts: names (`thor-1`) or (name, host_data) pairs. extra_data overrides the Thors' group
    data; a key set to None is left out (a test can drop a setting to see the deploy's default).
    gateway: `gw-1` or (`gw-1`, host_data): the gateway box, its own group and data
    (sim_gateway_data); host_data overrides it, e.g. another gateway_port. Its address on the sim
    network is the one the last `up` recorded unless host_data gives gateway_fleet_address. A
    list of them: several gateways in the group, which then shares gateway_virtual_ip (the sim
    network's, virtual_ip()) unless the group data below says otherwise.
    """
    entries = []
    for host in hosts:
        name, data = (host, {}) if isinstance(host, str) else host
        # The laptop reaches a box through its published port; the other boxes by its name on the
        # sim network, as boxes on one LAN reach each other.
        data = {"ssh_hostname": "127.0.0.1", "ssh_port": ssh_port(index_of(name)),
                "weights_peer_address": box_name(index_of(name)), **data}
        entries.append(f"        ({name!r}, {data!r}),")
    group = {**sim_group_data(), **(extra_data or {})}
    groups = _group_text("sim_thors", entries, group)
    listed = [] if gateway is None else gateway if isinstance(gateway, list) else [gateway]
    if listed:
        data = sim_gateway_data()
        if len(listed) > 1:
            data["gateway_virtual_ip"] = _recorded().get("virtual_ip")
        groups += _group_text("gateway", [f"        {_gateway_entry(g)!r}," for g in listed], data)
    said = {0: "", 1: " and the gateway box"}.get(len(listed), f" and {len(listed)} gateway boxes")
    text = "\n".join([
        (f"# Written by `python -m sim up`: {len(entries)} simulated Thors{said}. Rewritten by "
         "every `up`."),
        *groups,
        "",
    ])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _replace(path, text)
    return path


def _gateway_entry(gateway) -> tuple:
    name, data = (gateway, {}) if isinstance(gateway, str) else gateway
    if not is_gateway(name):
        raise ValueError(f"gateway={name!r}: the sim's gateway boxes are gw-1, gw-2, ...")
    name = gateway_host(gateway_index(name))
    recorded = _recorded()
    known = recorded.get("gateways") or {GATEWAY_HOST: recorded.get("gateway_address")}
    data = {"ssh_hostname": "127.0.0.1", "ssh_port": ssh_port_of(name),
            "gateway_fleet_address": known.get(name), **data}
    if data["gateway_fleet_address"] is None:
        raise RuntimeError(f"{name}: no address recorded (is it up?): "
                           "`python -m sim up --gateways N`")
    return name, data


def _group_text(name: str, entries: list, group: dict) -> list:
    """The lines of one group: `name = ([hosts], {group data})`, a key set to None left out."""
    return [
        f"{name} = (",
        "    [",
        *entries,
        "    ],",
        "    {",
        *(f"        {key!r}: {value!r}," for key, value in group.items() if value is not None),
        "    },",
        ")",
    ]
