"""The secrets thorfleet keeps on the laptop, each held where no other user of the laptop can put
their own in its place: the fleet CA's folder (gateway_ca_dir), the client keys' folders, the API
key's, the boxes' copy keys', and every folder above them up to the user's home (else up to /),
refused by `python -m thorfleet check` with the chmod that fixes it.

Fast: no Docker, no SSH. The edits that break these (each tried once):
private_folder_problems taking a sticky folder (1777) as safe again; it checking the secret's own
folder only, not the ones above; it skipping a folder not made yet; _the_gateway not asking it of
gateway_ca_dir; _peer_key_problems not called.
"""

import os
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from tests.fast.test_gateway_render import PINS, client_files, inventory
from tests.helpers import known_hosts
from thorfleet.__main__ import main
from thorfleet.plan import settings_for_inventory
from thorfleet.run.laptop import private_folder_problems
from thorfleet.settings.schema import SettingsError


def refused(inv):
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    return error.value.problems


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_fleet_ca_folder_others_can_write_is_refused(tmp_path, mode):
    """Anyone who can write the CA's folder can put a CA key there before the first run: every
    client would then trust a certificate they sign. Sticky (1777) or not."""
    ca = tmp_path / "ca"
    ca.mkdir()
    ca.chmod(mode)
    assert refused(inventory(tmp_path)) == [
        (f"gw-1: gateway_ca_dir={str(ca)!r} is in {ca}, which other users can write (mode "
         f"{mode:o}): they could replace it; chmod go-w {ca}")]
    ca.chmod(0o700)
    settings_for_inventory(inventory(tmp_path))


def test_a_fleet_ca_folder_under_a_folder_others_can_write_is_refused(tmp_path):
    """The folder above it: another user renames the CA's folder away and puts theirs there."""
    shared = tmp_path / "shared"
    (shared / "ca").mkdir(parents=True, mode=0o700)
    shared.chmod(0o777)
    data = {"gateway_ca_dir": str(shared / "ca")}
    assert refused(inventory(tmp_path, gateway_data=data)) == [
        (f"gw-1: gateway_ca_dir={str(shared / 'ca')!r}: {shared}, above it, can be written by "
         f"other users (mode 777): they could swap {shared / 'ca'} for their own; "
         f"chmod go-w {shared}")]
    # sticky above a folder of ours that is there already: nobody else can rename it
    shared.chmod(0o1777)
    settings_for_inventory(inventory(tmp_path, gateway_data=data))


def test_a_fleet_ca_folder_not_made_yet_in_a_sticky_folder_is_refused(tmp_path):
    """/tmp-like: anyone may make the folder first (and their CA key in it)."""
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    data = {"gateway_ca_dir": str(sticky / "fleet" / "ca")}
    assert refused(inventory(tmp_path, gateway_data=data)) == [
        (f"gw-1: gateway_ca_dir={str(sticky / 'fleet' / 'ca')!r}: {sticky / 'fleet'} is not there "
         f"yet, and other users can write {sticky} (mode 1777): one could make it first and hold "
         f"what thorfleet puts there; mkdir -m 700 {sticky / 'fleet'} yourself now, or keep it "
         "under your home")]
    (sticky / "fleet").mkdir(mode=0o700)  # the fix it names
    settings_for_inventory(inventory(tmp_path, gateway_data=data))


def test_a_client_key_folder_others_can_write_is_refused_before_its_key_is_made(tmp_path):
    clients = client_files(tmp_path, alice=None)  # made by the run, in a folder others may fill
    folder = tmp_path / "clients"
    folder.chmod(0o1777)
    assert refused(inventory(tmp_path, gateway_data={"gateway_clients": clients})) == [
        (f"gw-1: gateway_clients['alice']={clients['alice']!r} is in {folder}, which other users "
         f"can write (mode 1777): they could replace it; chmod go-w {folder}")]
    assert not (folder / "alice.key").exists()  # refused before anything was made


def test_the_boxes_copy_keys_folder_is_held_to_the_same(tmp_path):
    shared = tmp_path / "keys"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    key = tmp_path / "api_key"
    key.write_text("sk-test-the-boxes-own-0123456789\n")
    key.chmod(0o600)
    inv = Inventory(([("thor-1", {"ssh_hostname": "10.0.0.1"}),
                      ("thor-2", {"ssh_hostname": "10.0.0.2"})],
                     {**PINS, "service_api_key_file": str(key),
                      "weights_peer_key_file": str(shared / "peer_ed25519"),
                      "image_peer_key_file": str(tmp_path / "image_ed25519")}))
    assert refused(inv) == [
        (f"thor-1, thor-2: weights_peer_key_file={str(shared / 'peer_ed25519')!r} is in "
         f"{shared}, which other users can write (mode 777): they could replace it; "
         f"chmod go-w {shared}")]


def test_a_folder_of_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("giving a folder to another user needs root")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 4242, -1)
    assert private_folder_problems("gateway_ca_dir", str(folder), folder) == [
        (f"gateway_ca_dir={str(folder)!r}: {folder} belongs to another user (uid 4242), who could "
         "replace what it holds: keep the secret in a folder of yours, like ~/.config/thorfleet")]


def test_the_walk_stops_at_the_home_folder(tmp_path, monkeypatch):
    """Up to the user's home, as OpenSSH's StrictModes: above it is the system's business."""
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True, mode=0o700)
    tmp_path.chmod(0o777)  # above the home: not asked
    try:
        monkeypatch.setenv("HOME", str(home))
        assert private_folder_problems("k", "x", home / ".config") == []
        monkeypatch.setenv("HOME", "/nonexistent")
        assert private_folder_problems("k", "x", home / ".config") != []
    finally:
        tmp_path.chmod(0o700)


def test_check_says_it_before_any_host_is_contacted(tmp_path, capsys):
    """What the operator runs: `python -m thorfleet check INVENTORY` lists the refusal."""
    key = tmp_path / "api_key"
    key.write_text("sk-test-the-boxes-own-0123456789\n")
    key.chmod(0o600)
    ca = tmp_path / "ca"
    ca.mkdir(mode=0o700)
    ca.chmod(0o777)
    path = tmp_path / "inv.py"
    kh = known_hosts(tmp_path / "known_hosts", "10.0.0.1", "10.0.0.9")  # check asks for them too
    path.write_text(
        f"thors = ([('thor-1', {{'ssh_hostname': '10.0.0.1'}})], "
        f"{{**{PINS!r}, 'service_api_key_file': {str(key)!r}, "
        f"'ssh_known_hosts_file': {str(kh)!r}}})\n"
        f"gateway = ([('gw-1', {{'ssh_hostname': '10.0.0.9'}})], "
        f"{{'gateway_ca_dir': {str(ca)!r}, 'ssh_known_hosts_file': {str(kh)!r}}})\n")
    assert main(["check", str(path)]) == 2
    out = capsys.readouterr().out
    assert f"gw-1: gateway_ca_dir={str(ca)!r} is in {ca}" in out and f"chmod go-w {ca}" in out
    ca.chmod(0o700)
    assert main(["check", str(path)]) == 0, capsys.readouterr()


def test_a_secret_under_the_home_is_not_refused_for_its_own_sake():
    """The defaults (~/.config/thorfleet/...) pass on an ordinary home."""
    home = Path.home()
    if os.stat(home).st_mode & 0o022:
        pytest.skip("this home is writable by others")
    assert private_folder_problems("gateway_ca_dir", "~/.config/thorfleet/fleet-ca",
                                   "~/.config/thorfleet/fleet-ca") == []
