"""Two gateways, one address (issue 36, part 4), as rendered on the laptop: the pair is checked
before anything connects, both render one HAProxy config and one certificate naming the shared
address, each its keepalived config that keepalived's own parser accepts, and the check that keeps
a gateway which missed a run from taking the address.

Fast: no Docker, no SSH; haproxy, keepalived and curl from Debian's packages (.ci/setup installs
them): a missing one fails the test that needs it, as a broken machine, never a skip.

The edits that break them: the keepalived template without its track_script, or tracking only
the level check (the address stays on a gateway whose HAProxy is down: keepalived -t takes a
config without one); a level check that takes a gateway behind the other for level.
"""

import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.fast.test_gateway_render import haproxy_check, inventory
from thorfleet.gateway.config import firewall_script, keepalived_word
from thorfleet.settings import layout
from thorfleet.settings.hosts import SettingsError, settings_for_inventory

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "files" / "bin" / "thorfleet-door-check"
PAIR = [("gw-1", {"ssh_hostname": "10.0.0.9"}), ("gw-2", {"ssh_hostname": "10.0.0.8"})]
VIP = {"gateway_virtual_ip": "10.0.0.50/24"}


def tool(name, package):
    """`name`'s path. Missing, the test fails (pytrace off, the fix said): CI's machine is set up
    by .ci/setup, and a skip there would pass without checking anything."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: .ci/setup installs it (apt-get install "
                    f"--no-install-recommends {package})", pytrace=False)
    return found


@pytest.fixture
def curl():
    return tool("curl", "curl")  # the level check asks the other gateway with curl


def pair(tmp_path, gateway_data=VIP, gateway_hosts=PAIR):
    return settings_for_inventory(inventory(tmp_path, gateway_data=gateway_data,
                                            gateway_hosts=gateway_hosts))


def test_two_gateways_render_one_door_named_by_the_shared_address(tmp_path):
    settings = pair(tmp_path)
    g1, g2 = settings["gw-1"], settings["gw-2"]
    # clients use the shared address: first in the certificate and the report's URL
    assert g1.names == g2.names == ["10.0.0.50", "10.0.0.9", "10.0.0.8"]
    assert g1.endpoint == g2.endpoint == {"url": "https://10.0.0.50:8443",
                                          "ca_file": str(tmp_path / "ca" / "fleet-ca.pem")}
    # one config, one certificate: a failover changes nothing a client sees
    assert g1.config_text == g2.config_text and g1.pem == g2.pem
    assert g1.level_digest == g2.level_digest
    assert (g1.vrrp_priority, g2.vrrp_priority) == (150, 100)
    assert (g1.peers, g2.peers) == ([("gw-2", "10.0.0.8")], [("gw-1", "10.0.0.9")])
    # each Thor lets both in, and nobody else
    assert settings["thor-1"].gateway == ("10.0.0.9", "10.0.0.8")
    script, _ = firewall_script((8002, 9105), *settings["thor-1"].gateway)
    assert "ip saddr 10.0.0.9" in script and "ip saddr 10.0.0.8" in script, script
    # the level frontend answers the pair only, and haproxy -c takes the config
    level = tmp_path / "level"
    level.write_text("1 ab\n")
    g1.__dict__["config_text"] = g1.config_text.replace(layout.GATEWAY_LEVEL, str(level))
    assert "{ src 10.0.0.9 10.0.0.8 }" in g1.config_text
    checked = haproxy_check(tmp_path, g1)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_one_gateway_renders_as_before(tmp_path):
    g = settings_for_inventory(inventory(tmp_path))["gw-1"]
    assert g.names == ["10.0.0.9"] and g.peers == [] and "frontend level" not in g.config_text


@pytest.mark.parametrize("gateway_data, gateway_hosts, refused", [
    ({}, PAIR, "gw-1 and gw-2: two gateways need gateway_virtual_ip"),
    ({"gateway_virtual_ip": "10.0.1.50/24"}, PAIR,
     "gw-1: gateway_virtual_ip 10.0.1.50/24 is not on its network: its address 10.0.0.9"),
    ({"gateway_virtual_ip": "10.0.0.8/24"}, PAIR,
     "gw-2: gateway_virtual_ip 10.0.0.8/24 is the gateway's own address"),
    (VIP, [("gw-1", {"ssh_hostname": "10.0.0.9"}),
           ("gw-2", {"ssh_hostname": "10.0.0.8", "gateway_port": 9443})],
     "gw-1 and gw-2: gateway_port differs between the two gateways (8443 and 9443)"),
    (VIP, [("gw-1", {"ssh_hostname": "10.0.0.9"}), ("gw-2", {"ssh_hostname": "10.0.0.9"})],
     "gw-1 and gw-2: both connect from 10.0.0.9"),
    (VIP, [*PAIR, ("gw-3", {"ssh_hostname": "10.0.0.7"})],
     "gw-1, gw-2, gw-3: group `gateway` holds one host, or two that share gateway_virtual_ip"),
    ({"gateway_virtual_ip": "10.0.0.50"}, PAIR,
     "gateway_virtual_ip='10.0.0.50' is not an IPv4 address with its network's prefix length"),
])
def test_a_pair_that_cannot_share_an_address_is_refused_naming_it(tmp_path, gateway_data,
                                                                    gateway_hosts, refused):
    with pytest.raises(SettingsError) as error:
        pair(tmp_path, gateway_data, gateway_hosts)
    assert any(refused in problem for problem in error.value.problems), error.value.problems


@pytest.fixture
def secure_check():
    """The check script where keepalived's script security accepts it (no folder on its path
    writable by others: not under /tmp), for its parser's config test."""
    folder = Path(tempfile.mkdtemp(dir=Path.home()))
    os.chmod(folder, 0o755)
    shutil.copy(CHECK, folder / "thorfleet-door-check")
    os.chmod(folder / "thorfleet-door-check", 0o755)
    yield folder / "thorfleet-door-check"
    shutil.rmtree(folder)


def test_each_gateways_keepalived_config_passes_keepalived_t(tmp_path, secure_check, monkeypatch):
    keepalived = tool("keepalived", "keepalived")
    monkeypatch.setattr(layout, "GATEWAY_DOOR_CHECK", str(secure_check))
    settings = pair(tmp_path)
    # an interface this machine has (keepalived checks it is there; VRRP takes no loopback)
    interface = next(n for n in sorted(os.listdir("/sys/class/net")) if n != "lo")
    for name, peer in (("gw-1", "10.0.0.8"), ("gw-2", "10.0.0.9")):
        text = settings[name].keepalived_text(interface)
        assert f"unicast_peer {{\n        {peer}\n    }}" in text, text
        assert f"10.0.0.50/24 dev {interface}" in text and "nopreempt" in text
        config = tmp_path / f"{name}.conf"
        config.write_text(text)
        done = subprocess.run([keepalived, "--config-test", "-f", str(config)],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    # and a config it refuses is refused (an interface that is not there)
    config.write_text(text.replace(interface, "no-such-if"))
    done = subprocess.run([keepalived, "--config-test", "-f", str(config)],
                          capture_output=True, text=True, check=False)
    assert done.returncode != 0, done.stdout + done.stderr


def keepalived_blocks(text):
    """keepalived's config as its parser reads it: [(keyword, words, [children])], a `{` at a
    line's end opening a block and a `}` alone closing it, `#` and `!` starting comments, a
    quoted string one word."""
    root = []
    stack = [root]
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True)
        lexer.whitespace_split, lexer.commenters = True, "#!"
        words = list(lexer)
        if words == ["}"]:
            stack.pop()
        elif words:
            opens = words[-1] == "{"
            node = (words[0], words[1:-1] if opens else words[1:], [])
            stack[-1].append(node)
            if opens:
                stack.append(node[2])
    assert stack == [root], "a block left open"
    return root


def test_the_address_is_given_up_when_haproxy_stops(tmp_path, secure_check, monkeypatch):
    """keepalived -t takes a config with no track_script (it is optional): what makes the
    address leave a gateway whose HAProxy died is the instance tracking the script that checks
    HAProxy. Read from the rendered config, each gateway's; the script run as keepalived runs it."""
    keepalived = tool("keepalived", "keepalived")
    monkeypatch.setattr(layout, "GATEWAY_DOOR_CHECK", str(secure_check))
    settings = pair(tmp_path)
    interface = next(n for n in sorted(os.listdir("/sys/class/net")) if n != "lo")
    for name in ("gw-1", "gw-2"):
        text = settings[name].keepalived_text(interface)
        config = tmp_path / f"{name}.conf"
        config.write_text(text)
        done = subprocess.run([keepalived, "--config-test", "-f", str(config)],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        blocks = keepalived_blocks(text)
        scripts = {words[0]: {key: said for key, said, _ in body}
                   for keyword, words, body in blocks if keyword == "vrrp_script"}
        [instance] = [body for keyword, _, body in blocks if keyword == "vrrp_instance"]
        tracked = [[key for key, _, _ in body] for keyword, _, body in instance
                   if keyword == "track_script"]
        assert len(tracked) == 1, f"{name}: no track_script in its vrrp_instance"
        # among the tracked: the script that checks HAProxy, `thorfleet-door-check up`
        checks_haproxy = [s for s in tracked[0]
                          if shlex.split(scripts.get(s, {}).get("script", [""])[0])
                          == [str(secure_check), "up"]]
        assert checks_haproxy, (name, tracked[0], scripts)
    # and that script passes while a process named haproxy runs (pidof): a copy of sleep, so
    # HAProxy's own absence here says nothing (another test may run one: no check of "down")
    fake = tmp_path / "haproxy"
    shutil.copy(shutil.which("sleep"), fake)
    running = subprocess.Popen([str(fake), "30"])
    try:
        time.sleep(0.1)
        command = shlex.split(scripts[checks_haproxy[0]]["script"][0])
        assert subprocess.run(command, check=False).returncode == 0
    finally:
        running.kill()
        running.wait()


@pytest.mark.parametrize("value", ["eth 0", "eth0;", "a{b", "x\"y", "#x", "!x", ""])
def test_keepalived_refuses_what_would_be_more_than_a_word(value):
    with pytest.raises(ValueError):
        keepalived_word(value)


def level_check(tmp_path, own, other, seen=None):
    """thorfleet-door-check level's exit code: `own` this gateway's level (None: never set),
    `other` what the other answers (None: it does not answer), `seen` what it said before."""
    own_file, seen_file = tmp_path / "level", tmp_path / "peer-level"
    for path, text in ((own_file, own), (seen_file, seen)):
        path.unlink(missing_ok=True)
        if text is not None:
            path.write_text(text + "\n")
    url = "file://" + str(tmp_path / "answers")
    (tmp_path / "answers").unlink(missing_ok=True)
    if other is not None:
        (tmp_path / "answers").write_text(other + "\n")
    return subprocess.run(["sh", str(CHECK), "level", str(own_file), str(seen_file), url],
                          capture_output=True, text=True, check=False).returncode


@pytest.mark.parametrize("own, other, seen, level", [
    ("100 aa", "100 aa", None, True),        # set by the same run
    ("100 aa", "200 aa", None, True),        # one run set it here, a later one there: alike
    ("200 bb", "100 aa", None, True),        # the other is behind, not this one
    ("100 aa", "200 bb", None, False),       # a later run set something this one missed
    ("100 aa", None, "200 bb", False),       # ...learnt before the other went away
    ("100 aa", None, None, True),            # never heard from the other: nothing says behind
    ("100 aa", "<html>", "100 aa", True),    # an answer that is no level is not taken for one
    (None, "100 aa", None, False),           # never set by a run
])
def test_a_gateway_behind_the_other_fails_its_level_check(tmp_path, curl, own, other, seen,
                                                          level):
    assert (level_check(tmp_path, own, other, seen) == 0) is level


def test_what_the_other_said_is_kept_until_a_run_brings_this_one_level(tmp_path, curl):
    assert level_check(tmp_path, "100 aa", "200 bb") == 1
    # the other goes away: still behind, from what it said last
    assert level_check(tmp_path, "100 aa", None, seen=(tmp_path / "peer-level").read_text()
                       .strip()) == 1
    # a run reaches this gateway: level again
    assert level_check(tmp_path, "300 bb", None, seen="200 bb") == 0
