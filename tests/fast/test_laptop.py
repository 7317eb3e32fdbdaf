"""The laptop's one file writer (thorfleet/run/laptop.py): the report, the fleet CA's files and
the copy keys are each written whole or not at all; and the run makes them in one step before any
host is planned (plan.make_laptop_files), which `check` never takes. The edits that break it:
writing in place (a cut leaves half), a key made with the umask's mode before its chmod, the
run's step left out (seen: the files then wait for the tasks)."""

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fast.test_gateway_render import client_files, inventory
from thorfleet.plan import settings_for_inventory, settings_for_run
from thorfleet.run import laptop


def test_a_private_file_is_0600_and_a_public_one_keeps_its_mode(tmp_path):
    key, report = tmp_path / "key", tmp_path / "report.json"
    laptop.write_whole(key, b"secret", private=True)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_bytes() == b"secret"
    report.write_text("old")
    report.chmod(0o640)
    laptop.write_whole(report, "new")
    assert stat.S_IMODE(report.stat().st_mode) == 0o640 and report.read_text() == "new"


def test_a_symlink_stays_a_link_to_the_file_it_names(tmp_path):
    (tmp_path / "reports").mkdir()
    target, link = tmp_path / "reports" / "last.json", tmp_path / "report.json"
    target.write_text("old")
    link.symlink_to(target)
    laptop.write_whole(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_cut_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    path.write_text("old")

    def cut(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        laptop.write_whole(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]


def test_check_makes_no_file_and_the_run_makes_each_before_any_host_is_planned(tmp_path, capsys):
    clients = client_files(tmp_path, alice=None)  # her key: not made yet
    peer, image = tmp_path / "keys" / "peer", tmp_path / "keys" / "image"
    own = {"weights_peer_key_file": str(peer), "image_peer_key_file": str(image)}
    inv = inventory(tmp_path, gateway_data={"gateway_clients": clients}, thor_hosts=[
        ("thor-1", {"ssh_hostname": "10.0.0.1", **own}),
        ("thor-2", {"ssh_hostname": "10.0.0.2", **own})])  # two boxes: they copy
    made = [tmp_path / "ca" / "fleet-ca.pem", Path(clients["alice"]), peer, image]
    settings_for_inventory(inv)  # what check, status and doctor plan with
    assert [p.exists() for p in made] == [False] * 4
    settings_for_run(SimpleNamespace(inventory=inv))  # the deploy's, before it plans a host
    assert [p.exists() for p in made] == [True] * 4
    assert [stat.S_IMODE(p.stat().st_mode) for p in made[1:]] == [0o600] * 3
    assert f"made a key for client alice at {clients['alice']}" in capsys.readouterr().err



def test_the_doors_certificate_is_only_read_where_it_is_asked(tmp_path):
    """GatewaySettings.pem reads what the run's step made: asked before it (as `check`, status
    and doctor plan), it says the fix and makes nothing. Breaks with: pem making the CA or the
    certificate itself, as it did (the planning then had a side effect `check` never saw)."""
    inv = inventory(tmp_path)
    ca = tmp_path / "ca"
    door = settings_for_inventory(inv)["gw-1"]
    with pytest.raises(ValueError, match="is not made yet: a deploy makes it before it plans"):
        door.pem  # noqa: B018 - asked, as the deploy's gateway task asks it
    assert not ca.exists()
    planned = settings_for_run(SimpleNamespace(inventory=inv))["gw-1"]
    made = sorted(p.relative_to(ca).as_posix() for p in ca.rglob("*") if p.is_file())
    assert made == [".lock", "fleet-ca.key", "fleet-ca.pem", "gateways/gw-1.key",
                    "gateways/gw-1.pem"]
    assert planned.pem.startswith("-----BEGIN CERTIFICATE-----")
