"""The simulated Thor fleet: Docker containers that behave like Jetson AGX Thor boxes.

Shared names (the contract between the sim's parts): the docker network, where sim state lives.
"""

import contextlib
import fcntl
import ipaddress
import json
import os
import subprocess
import time
from pathlib import Path

NETWORK = "thorfleet-sim"
# Which state dir made a container: its keys, its disks and its registry storage are that state's.
STATE_LABEL = "thorfleet.state"


def state_dir() -> Path:
    """Where the sim keeps keys, registry storage, each box's /var/lib/docker and caches."""
    path = Path(os.environ.get("THORFLEET_SIM_STATE", "/var/tmp/thorfleet-sim"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def foreign(container) -> str | None:
    """The state dir another sim made this container from (`unlabelled` for one made before the
    label), or None when it is this state's. Its names and ports are the same as ours but its
    keys are not: a box of another state refuses this state's SSH key."""
    made_by = (container.labels or {}).get(STATE_LABEL)
    if made_by == str(state_dir()):
        return None
    return made_by or "unlabelled"


@contextlib.contextmanager
def locked(name: str):
    """Hold an exclusive file lock in the state dir: two processes (or two engineers' test runs)
    building the same image wait for each other instead of building it twice."""
    lock_dir = state_dir() / "locks"
    lock_dir.mkdir(exist_ok=True)
    with open(lock_dir / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# Subnets the sim's network may take, the first that no Docker network and no route of this
# machine already uses. Docker hands out addresses from the lower half only (DYNAMIC): the upper
# half is for addresses that must not move, as a LAN's are (the gateways' own, which their
# keepalived configs name, and their shared one), since a container started again may otherwise
# get another address.
SUBNETS = ("172.30.0.0/16", "172.29.0.0/16", "172.28.0.0/16", "10.213.0.0/16", "10.214.0.0/16")


def ensure_network(client) -> None:
    """The sim's network, made once: Docker allows two networks of one name, and then neither
    can be named (the registry, the hub and the fleet may each be the first to want it)."""
    import docker.types

    with locked("network"):
        if client.networks.list(names=[NETWORK]):
            return
        subnet = _free_subnet(client)
        dynamic = next(ipaddress.ip_network(subnet).subnets())  # the lower half
        pool = docker.types.IPAMPool(subnet=subnet, iprange=str(dynamic))
        client.networks.create(NETWORK, driver="bridge", labels={"thorfleet.sim": "network"},
                               ipam=docker.types.IPAMConfig(pool_configs=[pool]))


def _free_subnet(client) -> str:
    used = [ipaddress.ip_network(c["Subnet"]) for n in client.networks.list()
            for c in (n.attrs.get("IPAM") or {}).get("Config") or [] if c.get("Subnet")]
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True,
                            check=False).stdout.split()
    used += [ipaddress.ip_network(w, strict=False) for w in routes
             if "/" in w and w[0].isdigit()]
    for subnet in map(ipaddress.ip_network, SUBNETS):
        if not any(subnet.overlaps(other) for other in used if other.version == 4):
            return str(subnet)
    raise RuntimeError(f"no free subnet for the sim's network among {', '.join(SUBNETS)}")


def network_of(client):
    """(the sim network's subnet, whether Docker keeps to its lower half: a network made before
    the sim fixed addresses has no such range)."""
    pool = client.networks.get(NETWORK).attrs["IPAM"]["Config"][0]
    return ipaddress.ip_network(pool["Subnet"]), bool(pool.get("IPRange"))


def fixed_address(client, index: int) -> str:
    """The address that never moves of the sim network's `index`th fixed host (1-based): from
    the top of its upper half, below the gateways' shared one (fleet.virtual_ip)."""
    network, _ = network_of(client)
    return str(network.broadcast_address - 16 + index)


def log(message: str) -> None:
    """A progress line of the sim's, on stdout as it happens."""
    print(f"[sim] {message}", flush=True)


def build_image(client, what: str, log_path: Path, **build) -> None:
    """`docker build` (the SDK's low-level build, `build` its arguments) with each Dockerfile step
    shown as it starts (`what: Step 3/9 : RUN ...`) and the whole output kept in `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log(f"{what}: docker build {build.get('tag', '')} (full output: {log_path})")
    with open(log_path, "w") as out:
        for event in client.api.build(decode=True, rm=True, forcerm=True, **build):
            text = event.get("stream")
            out.write(text if text is not None else json.dumps(event) + "\n")
            if text and text.startswith("Step "):
                log(f"{what}: {_shorten(text.strip())}")
            if "error" in event:
                raise RuntimeError(f"{what}: build failed: {event['error']} (see {log_path})")
        done = f"{what}: built in {time.monotonic() - started:.0f}s"
        out.write(f"[sim] {done}\n")  # the log's last line too: .ci/run prints it from there
    log(done)


def run_logged(what: str, argv: list, log_path: Path, shown=lambda line: False) -> None:
    """Run a long command with its output kept in `log_path`, showing the lines `shown` picks."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    log(f"{what}: {' '.join(argv[:2])} ... (full output: {log_path})")
    with open(log_path, "w") as out, subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        for line in process.stdout:
            out.write(line)
            if shown(line):
                log(f"{what}: {_shorten(line.strip())}")
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, argv[:2],
                                            f"see {log_path}")
    log(f"{what}: done in {time.monotonic() - started:.0f}s")


def _shorten(line: str, width: int = 110) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."
