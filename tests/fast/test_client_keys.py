"""One key per client at the door (gateway_clients), however the files are named: two clients
naming one key file (made already or not, spelt alike or not) or two files holding one key are
refused before anything connects, naming both clients; the door's map never lists a digest twice.

Fast: no Docker, no SSH. The edits that break these (each tried once):
laptop.client_keys comparing the files as written (not resolved); it skipping the file check for
a file not made yet (the check after `if not file.exists()`); GatewaySettings.client_keys taking
a key another client holds.
"""

import hashlib

import pytest

from tests.fast.test_gateway_render import client_files, gateway_settings, inventory
from thorfleet.plan import settings_for_inventory
from thorfleet.settings.schema import SettingsError


def refused(tmp_path, clients):
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, gateway_data={"gateway_clients": clients}))
    return error.value.problems


def test_two_clients_naming_one_key_file_not_made_yet_are_refused(tmp_path):
    """The run would make one key for both: revoking one would leave it working as the other."""
    clients = client_files(tmp_path, alice=None)
    file = clients["alice"]
    assert refused(tmp_path, {"alice": file, "bob": file}) == [
        (f"gw-1: gateway_clients['bob']: {file} is client 'alice''s key file too: each client "
         "needs a file (and a key) of its own, or revoking one leaves the key working as the "
         "other; point gateway_clients['bob'] at another file")]
    assert not (tmp_path / "clients" / "alice.key").exists()  # refused before anything was made


def test_one_key_file_spelt_two_ways_is_one_file(tmp_path):
    clients = client_files(tmp_path, alice="alice-key-0123456789abcdef")
    folder = tmp_path / "clients"
    (folder / "link.key").symlink_to(folder / "alice.key")
    for other in (str(folder / "sub" / ".." / "alice.key"), str(folder / "link.key")):
        (folder / "sub").mkdir(mode=0o700, exist_ok=True)
        said = refused(tmp_path, {**clients, "bob": other})
        assert len(said) == 1 and "is client 'alice''s key file too" in said[0], said


def test_two_files_holding_one_key_are_refused_naming_both_clients(tmp_path):
    clients = client_files(tmp_path, alice="same-key-0123456789abcdef",
                           bob="same-key-0123456789abcdef")
    assert refused(tmp_path, clients) == [
        (f"gw-1: gateway_clients['bob']: {clients['bob']} holds the same key as client 'alice': "
         "each client needs a key of its own, or a revocation locks out both")]


def test_the_doors_map_never_lists_one_key_twice(tmp_path):
    """GatewaySettings as another caller may make it, unchecked: the map's maker refuses too."""
    clients = client_files(tmp_path, alice="same-key-0123456789abcdef",
                           bob="same-key-0123456789abcdef")
    g = gateway_settings(tmp_path, gateway_clients=clients)
    with pytest.raises(ValueError, match="client bob's key file .* holds client alice's key"):
        _ = g.clients_map_text
    (tmp_path / "one").mkdir(mode=0o700)
    one = client_files(tmp_path / "one", alice="alice-key-0123456789abcdef")
    g = gateway_settings(tmp_path / "one", gateway_clients=one)
    digest = hashlib.sha256(b"alice-key-0123456789abcdef").hexdigest()
    assert g.clients_map_text == f"{digest} alice\n"
