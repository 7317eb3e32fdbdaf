"""Who copies weights from whom (thorfleet/run/peers.py), and the fleet's copy key on the laptop."""

import stat
import subprocess
from types import SimpleNamespace

import pytest

from thorfleet.run import peers


def host(name, **data):
    return SimpleNamespace(name=name, data=data)


INVENTORY = [host("thor-1", ssh_hostname="10.0.0.1"), host("thor-2", ssh_hostname="10.0.0.2"),
             host("thor-3", ssh_hostname="10.0.0.3", ssh_port=2203,
                  weights_peer_address="thor-3.lan:22")]


def limited_to(*names):
    return SimpleNamespace(is_host_in_limit=lambda h: not names or h.name in names)


@pytest.mark.parametrize("source, hosts, expected", [
    ("auto", INVENTORY, True), ("auto", INVENTORY[:1], False),
    ("hub", INVENTORY, False), ("fleet", INVENTORY[:1], True),
])
def test_auto_copies_between_boxes_when_there_are_several(source, hosts, expected):
    assert peers.fleet_copy(SimpleNamespace(weights_source=source), hosts) is expected


def test_the_first_host_of_the_run_goes_first_and_the_rest_follow_in_inventory_order():
    run = limited_to()
    assert peers.sources("thor-2", INVENTORY, run) == ["10.0.0.1", "thor-3.lan:22"]
    assert peers.sources("thor-1", INVENTORY, run) == ["10.0.0.2", "thor-3.lan:22"]


def test_the_run_s_first_host_is_asked_first_even_when_not_first_in_the_inventory():
    run = limited_to("thor-2", "thor-3")  # thor-1 is outside the run: it may have it, asked last
    assert peers.sources("thor-3", INVENTORY, run) == ["10.0.0.2", "10.0.0.1"]


def test_a_box_added_later_copies_from_boxes_outside_its_limit():
    run = limited_to("thor-3")  # `--limit thor-3`: thor-3 is the run's first and only host
    assert peers.first_of_run(INVENTORY, run) == "thor-3"
    assert peers.sources("thor-3", INVENTORY, run) == ["10.0.0.1", "10.0.0.2"]


def test_the_copy_key_is_made_once_private_to_its_owner_and_then_reused(tmp_path):
    path = tmp_path / "cfg" / "peer_ed25519"
    private, public = peers.key_pair(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public.startswith("ssh-ed25519 ") and public.endswith(" thorfleet-peer")
    peers.key_pair.cache_clear()
    assert peers.key_pair(str(path)) == (private, public)


def test_the_copy_checks_each_peer_by_the_key_the_laptop_trusts(tmp_path):
    # the laptop's known_hosts as ssh-keyscan and HashKnownHosts leave it: one box on a port of
    # its own, one hashed; the boxes dial them by their peer addresses on port 22
    key_a = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    key_b = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:22001 {key_a}\nthor-02.lan {key_b}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)
    assert "thor-02.lan" not in known.read_text()  # hashed, as Ubuntu's default leaves it

    def box(name, **data):
        return SimpleNamespace(name=name, data={"ssh_known_hosts_file": str(known), **data})

    fleet = [box("thor-1", ssh_hostname="127.0.0.1", ssh_port=22001,
                 weights_peer_address="thorfleet-thor-1"),
             box("thor-02.lan"),
             box("thor-3", ssh_hostname="10.0.0.9", weights_peer_address="10.0.0.9:2222")]
    assert peers.peer_known_hosts(fleet) == (f"thor-02.lan {key_b}\n"
                                             f"thorfleet-thor-1 {key_a}\n")
