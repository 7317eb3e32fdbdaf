"""The fleet copy of the weights: which box of the run downloads, whom every box copies from, and
the key the boxes copy with.

    fleet_copy(settings, inventory)  # does this run copy between boxes (weights_source)?
    image_copy(settings, inventory)  # and the derived image (image_source)?
    first_of_run(inventory, state)   # the host that downloads, and builds the shared image
    sources(name, inventory, state)  # peer addresses `name` copies from, best first
    dial_host(h)                     # the host part the gateway and the monitor dial
    key_pair(path, comment)          # (private key, public key line), made on first use

The boxes copy with one shared key that may only run `rrsync -ro <weights_dir>` on the others, so
a box added later (a run limited to it) can copy from boxes this run does not touch. Every copied
byte is checked against the hub's sha256 on arrival (files/thor/bin/thorfleet-weights copy).
"""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

from thorfleet.run import pyinfra_hooks
from thorfleet.run.laptop import write_whole
from thorfleet.run.unreachable import known_hosts_name
from thorfleet.settings.roles import thors
from thorfleet.settings.schema import is_peer_address


def fleet_copy(settings, inventory) -> bool:
    if settings.weights_source == "auto":
        return len(thors(inventory)) > 1
    return settings.weights_source == "fleet"


def image_copy(settings, inventory) -> bool:
    """Does this run ship the derived image between boxes (image_source, no image_registry)?"""
    if settings.image_registry:
        return False
    if settings.image_source == "auto":
        return len(thors(inventory)) > 1
    return settings.image_source == "fleet"


def first_of_run(inventory, state) -> str | None:
    """The first host, in inventory order, that this run reaches (its --limit)."""
    return next((h.name for h in thors(inventory) if pyinfra_hooks.in_limit(state, h)), None)


def peer_address(h) -> str:
    """How the other boxes dial `h`: weights_peer_address, else its SSH address (no port: 22)."""
    return h.data.get("weights_peer_address") or h.data.get("ssh_hostname") or h.name


def dial_host(h) -> str:
    """The host part of how the gateway and the monitor dial `h`: weights_peer_address's (a name
    or IPv4 address, its :port is SSH's), else ssh_hostname or the inventory name as it is (an
    IPv6 address included)."""
    if h.data.get("weights_peer_address"):
        return h.data.get("weights_peer_address").partition(":")[0]
    return h.data.get("ssh_hostname") or h.name


def peer_address_problems(inventory) -> list[str]:
    """One line per host whose address the other boxes could not dial as it is: it lands in the
    copying box's rsync and ssh command lines (run as root), so it must be a host name or IPv4
    address (with an optional :port), nothing more. weights_peer_address is the schema's to check.
    (The image copy dials the same addresses, so the same rule holds for it.)"""
    problems = []
    for h in thors(inventory):
        if h.data.get("weights_peer_address"):
            continue
        key = "ssh_hostname" if h.data.get("ssh_hostname") else "its inventory name"
        address = peer_address(h)
        if not is_peer_address(address):
            problems.append(f"{h.name}: {key} {address!r} is not a host name or IPv4 address the "
                            "other boxes can dial for the fleet copy (weights_source, "
                            "image_source): set weights_peer_address to one, or "
                            "weights_source='hub' and image_source='build'")
    return problems


def image_source_of(inventory, state) -> str | None:
    """How the other boxes dial the run's first host, which builds the image they load."""
    first = first_of_run(inventory, state)
    return next((peer_address(h) for h in thors(inventory) if h.name == first), None)


def sources(name, inventory, state) -> list[str]:
    """Every other box of the inventory, the run's first host first (it downloaded just before),
    then the rest in inventory order; boxes outside --limit too: they may hold it already."""
    first = first_of_run(inventory, state)
    others = [h for h in thors(inventory) if h.name != name]
    others.sort(key=lambda h: h.name != first)  # stable: inventory order otherwise
    return [peer_address(h) for h in others]


def known_hosts_lines(h) -> list[str]:
    """The laptop's known_hosts lines for `h` (its ssh_known_hosts_file, else ~/.ssh/known_hosts),
    as the other boxes dial it: the key pyinfra checked when it connected, under the peer address.
    `ssh-keygen -F` finds hashed entries too."""
    path = Path(h.data.get("ssh_known_hosts_file") or "~/.ssh/known_hosts").expanduser()
    laptop = known_hosts_name(h.data.get("ssh_hostname") or h.name, h.data.get("ssh_port"))
    stamp = path.stat().st_mtime_ns if path.exists() else None
    address, _, port = peer_address(h).partition(":")
    return [f"{known_hosts_name(address, port)} {key}"
            for key in _keys_of(str(path), stamp, laptop)]


@cache
def _keys_of(path: str, stamp, laptop: str) -> tuple[str, ...]:
    """"type key" of each known_hosts entry for `laptop` in `path` as it was at `stamp`: looked up
    once per run, not once per host (every host's deploy renders the whole fleet's file)."""
    found = subprocess.run(["ssh-keygen", "-F", laptop, "-f", path], capture_output=True,
                           text=True, check=False).stdout
    return tuple(" ".join(line.split()[1:3]) for line in found.splitlines()
                 if line.strip() and not line.startswith("#"))


def peer_known_hosts(inventory) -> str:
    """known_hosts for the boxes' copies between them: every box's host key as the laptop knows
    it, so a copy checks each peer strictly, a re-flashed box's new key arrives with the next run
    once the laptop trusts it, and an air-gapped box needs to learn nothing."""
    lines = sorted({line for h in thors(inventory) for line in known_hosts_lines(h)})
    return "".join(f"{line}\n" for line in lines)


@cache
def key_pair(path: str, comment: str = "thorfleet-peer") -> tuple[str, str]:
    """The fleet's copy key at `path` on the laptop (OpenSSH ed25519), made 0600 when missing;
    its public line ends in `comment` (whom the boxes' authorized_keys let in)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    file = Path(path).expanduser()
    if not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        private = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption())
        write_whole(file, private, private=True)
    private = file.read_bytes()
    key = serialization.load_ssh_private_key(private, password=None)
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH).decode()
    return private.decode(), f"{public} {comment}"
