"""`check` finds, offline, a box whose host key the laptop does not hold while SSH checks host keys
strictly (group_data's default): the first deploy would fail on it after check had passed. The key
is looked up as pyinfra's SSH looks it up (paramiko's HostKeys: hashed entries too) under the name
SSH dials, `[host]:port` for a port other than 22.

`check` asks it; the settings check every deploy runs does not (a box the laptop does not know
fails its own connection, with this fix, and the others go on), nor do status and doctor, whose
row of that box says it.

Fast: no SSH. The edits that break them (each seen failing once): cmd_check not asking for the
host keys (check passes an empty known_hosts again); missing_host_key looking up the bare address
whatever the port; a text match of the file's host names in place of HostKeys.lookup (hashed
entries missed); keyscan leaving out -p; host_key_problems reading ssh_hostname and ssh_port
itself rather than pyinfra's ssh_destination (an ssh_config alias refused).
"""

import pytest
from paramiko import HostKeys
from pyinfra.api import Inventory

from tests.fast.test_gateway_render import PINS
from tests.helpers import known_hosts
from thorfleet import plan
from thorfleet.__main__ import main
from thorfleet.plan import host_key_problems, settings_for_inventory
from thorfleet.settings.schema import SettingsError


@pytest.mark.parametrize("entries, hashed, address, port, fix", [
    (["10.0.0.1"], False, "10.0.0.1", 22, None),
    (["10.0.0.1"], True, "10.0.0.1", 22, None),  # hashed: looked up as SSH looks it up
    (["[127.0.0.1]:22001"], False, "127.0.0.1", 22001, None),
    (["[127.0.0.1]:22001"], True, "127.0.0.1", 22001, None),
    (["thor-02.lan"], True, "thor-02.lan", 22, None),
    ([], False, "10.0.0.1", 22, "ssh-keyscan 10.0.0.1 >> KH, once"),
    (["10.0.0.2"], True, "10.0.0.1", 22, "ssh-keyscan 10.0.0.1 >> KH, once"),
    # the box's key on port 22 is not the key of another sshd on another port
    (["127.0.0.1"], False, "127.0.0.1", 22001, "ssh-keyscan -p 22001 127.0.0.1 >> KH, once"),
    (["[127.0.0.1]:22002"], True, "127.0.0.1", 22001,
     "ssh-keyscan -p 22001 127.0.0.1 >> KH, once"),
])
def test_a_host_key_is_looked_up_by_the_name_ssh_dials(tmp_path, entries, hashed, address, port,
                                                        fix):
    path = known_hosts(tmp_path / "kh", *entries, hashed=hashed)
    found = plan.missing_host_key(address, port, str(path), [HostKeys(str(path))])
    if fix is None:
        assert found is None
    else:
        assert found.endswith(fix.replace("KH", str(path))), found
        assert found.startswith(f"ssh_known_hosts_file={str(path)!r} holds no host key for "
                                f"{address if port == 22 else f'[{address}]:{port}'}")


def test_a_known_hosts_file_that_cannot_be_read_says_so():
    unread = PermissionError(13, "Permission denied")
    found = plan.missing_host_key("10.0.0.1", 22, "/kh", [unread])
    assert found.startswith("ssh_known_hosts_file='/kh' cannot be read (Permission denied)")


def fleet(tmp_path, strict="yes", **thor_1):
    key = tmp_path / "api_key"
    key.write_text("sk-test-the-boxes-own-0123456789\n")
    key.chmod(0o600)
    return Inventory(
        ([("thor-1", {"ssh_hostname": "127.0.0.1", "ssh_port": 22001, **thor_1}),
          ("thor-2", {"ssh_hostname": "10.0.0.2"})], {}),
        thors=(["thor-1", "thor-2"], {**PINS, "service_api_key_file": str(key),
                                      "ssh_known_hosts_file": str(tmp_path / "kh"),
                                      "ssh_strict_host_key_checking": strict}))


def test_a_box_whose_host_key_the_laptop_lacks_is_named_with_the_keyscan(tmp_path):
    """What an operator met: check passed with an empty known_hosts, the first deploy failed on
    it (strict host key checking)."""
    (tmp_path / "kh").touch()
    kh = tmp_path / "kh"
    settings_for_inventory(fleet(tmp_path))  # a setting of none: status, doctor still ask
    assert host_key_problems(fleet(tmp_path)) == [
        (f"thor-1: ssh_known_hosts_file={str(kh)!r} holds no host key for [127.0.0.1]:22001, and "
         "ssh_strict_host_key_checking='yes' refuses a box it does not know: "
         f"ssh-keyscan -p 22001 127.0.0.1 >> {kh}, once"),
        (f"thor-2: ssh_known_hosts_file={str(kh)!r} holds no host key for 10.0.0.2, and "
         "ssh_strict_host_key_checking='yes' refuses a box it does not know: "
         f"ssh-keyscan 10.0.0.2 >> {kh}, once")]
    known_hosts(kh, "[127.0.0.1]:22001", "10.0.0.2", hashed=True)  # the fixes, as Ubuntu keeps them
    assert host_key_problems(fleet(tmp_path)) == []
    # accept-new (pyinfra's own default) learns the key on the first connection: nothing to lack
    (tmp_path / "kh").write_text("")
    assert host_key_problems(fleet(tmp_path, strict="accept-new")) == []


def test_a_missing_known_hosts_file_is_said_once_with_the_port(tmp_path):
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(fleet(tmp_path))
    kh = tmp_path / "kh"
    assert error.value.problems == [
        (f"thor-1: ssh_known_hosts_file={str(kh)!r} does not exist on this machine: "
         f"ssh-keyscan -p 22001 127.0.0.1 >> {kh}, once"),
        (f"thor-2: ssh_known_hosts_file={str(kh)!r} does not exist on this machine: "
         f"ssh-keyscan 10.0.0.2 >> {kh}, once")]
    assert host_key_problems(fleet(tmp_path)) == []  # said once: not again as a key it lacks


def test_the_ssh_config_decides_where_ssh_dials_as_pyinfra_reads_it(tmp_path):
    """A host whose ssh_config names another HostName, Port and known_hosts file: the key is
    looked up where pyinfra's SSH will look it up, not refused for the alias."""
    kh = known_hosts(tmp_path / "kh", "[10.0.0.21]:2222", hashed=True)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host thor-01\n    HostName 10.0.0.21\n    Port 2222\n"
                      f"    UserKnownHostsFile {kh}\n")
    data = {"ssh_hostname": "thor-01", "ssh_config_file": str(config),
            "ssh_strict_host_key_checking": "yes"}
    assert host_key_problems(Inventory(([("thor-1", data)], {}))) == []
    # ssh_port beats the config's Port, as in pyinfra's connect
    assert host_key_problems(Inventory(([("thor-1", {**data, "ssh_port": 22})], {}))) == [
        (f"thor-1: {kh} (SSH's own: ssh_known_hosts_file is not set) holds no host key for "
         f"10.0.0.21, and ssh_strict_host_key_checking='yes' refuses a box it does not know: "
         f"ssh-keyscan 10.0.0.21 >> {kh}, once")]


def test_check_says_it_before_any_host_is_contacted_beside_the_settings(tmp_path, capsys):
    (tmp_path / "kh").touch()
    path = tmp_path / "inv.py"
    key = tmp_path / "api_key"
    key.write_text("sk-test-the-boxes-own-0123456789\n")
    key.chmod(0o600)
    path.write_text(f"thors = ([('thor-1', {{'ssh_hostname': '10.0.0.1'}})], "
                    f"{{**{PINS!r}, 'service_api_key_file': {str(key)!r}, "
                    f"'ssh_known_hosts_file': {str(tmp_path / 'kh')!r}}})\n")
    assert main(["check", str(path)]) == 2  # group_data/all.py: strict
    out = capsys.readouterr().out
    assert out == (f"thor-1: ssh_known_hosts_file={str(tmp_path / 'kh')!r} holds no host key for "
                   "10.0.0.1, and ssh_strict_host_key_checking='yes' refuses a box it does not "
                   f"know: ssh-keyscan 10.0.0.1 >> {tmp_path / 'kh'}, once\n")
    key.chmod(0o644)  # a setting refused too: both said at once
    assert main(["check", str(path)]) == 2
    assert len(capsys.readouterr().out.splitlines()) == 2
    key.chmod(0o600)
    known_hosts(tmp_path / "kh", "10.0.0.1")
    assert main(["check", str(path)]) == 0, capsys.readouterr()
