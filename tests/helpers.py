"""Helpers the operator's stories share: run thorfleet as an operator does (re-exported from the
sim's public `sim.operator`), read a box, and read pyinfra's --json results."""

import socket
import subprocess
import threading
import time

from sim import fleet as sim
from sim.hub import HubFaults
from sim.operator import ROOT, Run, deploy, edited_checkout  # noqa: F401 - re-exported
from thorfleet.settings import layout

# Where thorfleet's programs are: a Thor's, then a gateway's.
BINS = (layout.THOR_FILES / "bin", layout.GATEWAY_FILES / "bin")

SERVICE = "thorfleet-vllm"
SHARD = "consolidated-{:05d}-of-00013.safetensors"
# The server change the gateway's rolling story makes on boxes 10-12 (vLLM's default level, so
# nothing else differs). The watch stories, next on those boxes, converge with it too: their
# converge then restarts only the watchdog, not three servers (issue 32).
ROLLED_ENV = {"VLLM_LOGGING_LEVEL": "INFO"}


def accepting(listener, handle) -> None:
    """Each connection `listener` accepts, given to `handle` in turn by one thread of its own,
    until the listener is closed: a stand-in server for a test."""

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            handle(conn)

    threading.Thread(target=serve, daemon=True).start()


def wait_for(what, timeout, every=0.5):
    """`what()` once it is true, polled every `every` s for `timeout` s; else its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(every)
    return what()


def changed_on(run, host):
    """Names of the operations that changed something on `host` (pyinfra's "success")."""
    return [op["name"] for op in run.json["results"]["operations"] if host in op["success"]]


def outcome(run, host):
    """For a failed assertion: each operation's outcome on `host` in pyinfra's --json results, and
    the end of what the run printed."""
    rows = [f"{next((k for k in ('success', 'no_change', 'error') if host in op[k]), 'absent')}: "
            f"{op['name']}" for op in run.json["results"]["operations"]]
    return "\n".join([*rows, "--- stderr:", run.stderr[-3000:]])


def failed_on(run, host):
    return [op["name"] for op in run.json["results"]["operations"] if host in op["error"]]


def box(sim_fleet, host, command):
    code, out = sim_fleet.exec(host, command)
    assert code == 0, out
    return out.strip()


def container_started(sim_fleet, host):
    """When the server's container started (changes with every restart), or "" when none runs."""
    return sim_fleet.exec(host, f"docker inspect -f '{{{{.State.StartedAt}}}}' {SERVICE}")[1].strip()


def image_ref(sim_fleet, host):
    """The image the unit runs, and its id."""
    unit = box(sim_fleet, host, f"cat /etc/systemd/system/{SERVICE}.service")
    tag = next(line.split()[0] for line in unit.splitlines() if "thorfleet/mistral-small4:" in line)
    return tag, sim_fleet.exec(host, f"docker image inspect -f '{{{{.Id}}}}' {tag}")[1].strip()


def model_dir(sim_fleet):
    revision = sim.sim_group_data()["weights_model_revision"]
    return f"/opt/thorfleet/models/{sim.MODEL_REPO.split('/')[-1]}/{revision}"


def hub(sim_fleet, host):
    """The hub's knobs and request log for `host` alone: stories on other boxes share the hub."""
    return HubFaults(sim_fleet.hub["endpoint_local"], client=sim_fleet.ip(host))


def downloads(faults):
    """Files the hub sent since forget_requests() (GETs with a body; metadata API calls excluded)."""
    return sorted({r["path"].rsplit("/", 1)[-1] for r in faults.requests()
                   if r["method"] == "GET" and ("/resolve/" in r["path"] or "/_sim/lfs/" in r["path"])
                   and r["bytes"]})


def serves(sim_fleet, host, timeout=120):
    """True once the server answers /health on the box (it may still be loading)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, out = sim_fleet.exec(host, "curl -s -o /dev/null -w '%{http_code}' "
                                         "http://127.0.0.1:8002/health")
        if out.strip() == "200":
            return True
        time.sleep(2)
    return False


def box_lib_path() -> str:
    """A folder holding `thorfleet_box` (this checkout's thorfleet/box, linked), for a PYTHONPATH:
    a Thor's program run from files/thor/bin finds its package as it does beside it on a box."""
    import tempfile
    from pathlib import Path

    global _BOX_LIB
    if _BOX_LIB is None:
        _BOX_LIB = tempfile.mkdtemp(prefix="thorfleet-box-lib-")
        (Path(_BOX_LIB) / Path(layout.BOX_LIB).name).symlink_to(ROOT / "thorfleet" / "box")
    return _BOX_LIB


_BOX_LIB = None


def box_package():
    """thorfleet/box as a Thor's programs import it (`thorfleet_box`, layout.BOX_LIB): this
    checkout's own modules, so a test and the program it loads share one copy of each."""
    import sys

    import thorfleet.box
    from thorfleet.box import common, readings, usage  # noqa: F401 - its modules, for `from`

    return sys.modules.setdefault("thorfleet_box", thorfleet.box)


def box_program(name: str):
    """A program of a Thor's or a gateway's (files/thor/bin, files/gateway/bin: thorfleet-serve,
    thorfleet-door-usage, ...) as a module: each runs nothing on import."""
    import importlib.machinery
    import importlib.util

    box_package()
    path = next(folder / name for folder in BINS if (folder / name).exists())
    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"), str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


class Clients:
    """Client threads, each running `loop(*its args)` until the block ends (`with Load(...)`).
    `loop` checks self.stopping between requests; the block's end waits for each to finish."""

    def __init__(self, loop, each_args):
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=loop, args=args, daemon=True)
                        for args in each_args]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=120)


def known_hosts(path, *names, hashed=False):
    """A known_hosts file at `path` with a new host key for each of `names`, as ssh-keyscan writes
    them (and HashKnownHosts, Ubuntu's default, with `hashed`): what `check` asks of the laptop."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def public_key():
        return Ed25519PrivateKey.generate().public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()

    path.write_text("".join(f"{name} {public_key()}\n" for name in names))
    if hashed:
        subprocess.run(["ssh-keygen", "-H", "-f", str(path)], check=True, capture_output=True)
        assert not any(name in path.read_text() for name in names)
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` (IPv4 or IPv6): taken, then let go."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as held:
        held.bind((host, 0))
        return held.getsockname()[1]
