"""The simulated Thor fleet: Docker containers that behave like Jetson AGX Thor boxes.

Shared names (the contract between the sim's parts): the docker network, where sim state lives.
"""

import contextlib
import fcntl
import os
from pathlib import Path

NETWORK = "thorfleet-sim"


def state_dir() -> Path:
    """Where the sim keeps keys, registry storage, each box's /var/lib/docker and caches."""
    path = Path(os.environ.get("THORFLEET_SIM_STATE", "/var/tmp/thorfleet-sim"))
    path.mkdir(parents=True, exist_ok=True)
    return path


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


def ensure_network(client) -> None:
    """The sim's network, made once: Docker allows two networks of one name, and then neither
    can be named (the registry, the hub and the fleet may each be the first to want it)."""
    with locked("network"):
        if not client.networks.list(names=[NETWORK]):
            client.networks.create(NETWORK, driver="bridge", labels={"thorfleet.sim": "network"})
