"""Two gateways, one address (issue 36, part 4), as rendered on the laptop: the pair is checked
before anything connects, both render one HAProxy config and one certificate naming the shared
address, each its keepalived config that keepalived's own parser accepts, and the check that keeps
a gateway which missed a run from taking the address.

Fast: no Docker, no SSH; haproxy, keepalived, nft and curl from Debian's packages (.ci/setup
installs them) and network namespaces (CI runs as root): a missing one fails the test that needs
it, as a broken machine, never a skip.

The edits that break them: the keepalived template without its track_script, or tracking only
the level check (the address stays on a gateway whose HAProxy is down: keepalived -t takes a
config without one); no `check_unicast_src` (any LAN host's advert is taken); the door-check
reading its own level from the file a run writes before the reload, or taking the level file's
body without the running config's digest (x-thorfleet-level); the gateways' VRRP accept rule
without its source address; the level check's keepalived timeout no longer above its HTTP calls'
max times together (a second spare), `fall 1`, or a curl in it without `--max-time` (a silent
other gateway then holds the check until keepalived kills it); the peers section listing a
gateway's own peer alone (gw-2 holds no row of alice's: `assert None == 3`).
"""

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from tests.fast.test_gateway_render import client_files, haproxy_check, inventory, planned
from tests.helpers import box_program
from thorfleet.gateway.config import (
    GATEWAY_FIREWALL,
    GATEWAY_FIREWALL_DROPIN,
    GATEWAY_FIREWALL_TABLE,
    VRRP_STARTUP_DELAY_S,
    firewall_script,
    keepalived_word,
)
from thorfleet.settings import layout
from thorfleet.settings.schema import SettingsError

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "files" / "gateway" / "bin" / "thorfleet-door-check"
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


def root():
    """Network namespaces need root: CI runs as root, so without it this machine is not CI's."""
    if os.geteuid() != 0:
        pytest.fail("needs root (a network namespace): run as CI does", pytrace=False)


def pair(tmp_path, gateway_data=VIP, gateway_hosts=PAIR):
    return planned(inventory(tmp_path, gateway_data=gateway_data, gateway_hosts=gateway_hosts))


def test_two_gateways_render_one_door_named_by_the_shared_address(tmp_path):
    settings = pair(tmp_path)
    g1, g2 = settings["gw-1"], settings["gw-2"]
    # clients use the shared address: first in the certificate and the report's URL
    assert g1.names == g2.names == ["10.0.0.50", "10.0.0.9", "10.0.0.8"]
    assert g1.endpoint == g2.endpoint == {"url": "https://10.0.0.50:8443",
                                          "ca_file": str(tmp_path / "ca" / "fleet-ca.pem")}
    # one config but each one's own peer line (the conversations' homes go to the other), one
    # certificate: a failover changes nothing a client sees
    assert g1.config_text.replace("localpeer gateway-1", "localpeer gateway-2") == g2.config_text
    assert g1.pem == g2.pem
    assert g1.level_digest == g2.level_digest
    assert (g1.vrrp_priority, g2.vrrp_priority) == (150, 100)
    assert (g1.peers, g2.peers) == ([("gw-2", "10.0.0.8")], [("gw-1", "10.0.0.9")])
    # each Thor lets both in, and nobody else
    assert settings["thor-1"].gateway_sources == ("10.0.0.9", "10.0.0.8")
    script, _ = firewall_script((8002, 9105), *settings["thor-1"].gateway_sources)
    assert "ip saddr 10.0.0.9" in script and "ip saddr 10.0.0.8" in script, script
    # the level frontend answers the pair only, and haproxy -c takes the config
    level = tmp_path / "level"
    level.write_text("1 ab\n")
    g1.__dict__["config_text"] = g1.config_text.replace(layout.GATEWAY_LEVEL, str(level))
    assert "{ src 10.0.0.9 10.0.0.8 }" in g1.config_text
    checked = haproxy_check(tmp_path, g1)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_two_gateways_with_clients_send_each_other_the_clients_table(tmp_path):
    """Each gateway's HAProxy is a peer of the other's: one peers section on both, each
    gateway's own line at its own address; `localpeer`, the one line that differs, is left out
    of the level both claim; the peers port answers the other gateway only."""
    clients = client_files(tmp_path, alice="alice-key-0123456789abcdef")
    settings = pair(tmp_path, gateway_data={**VIP, "gateway_clients": clients})
    g1, g2 = settings["gw-1"], settings["gw-2"]
    port = layout.GATEWAY_PEERS_PORT
    for g, own in ((g1, "gateway-1"), (g2, "gateway-2")):
        lines = [line.strip() for line in g.config_text.splitlines()]
        assert {f"peer gateway-1 10.0.0.9:{port}", f"peer gateway-2 10.0.0.8:{port}",
                f"localpeer {own}"} <= set(lines), own
    assert g1.config_text.replace("localpeer gateway-1", "localpeer gateway-2") == g2.config_text
    assert g1.level_digest == g2.level_digest
    assert f"ip saddr 10.0.0.8 tcp dport {{ {layout.GATEWAY_LEVEL_PORT}, {port} }} accept" in (
        g1.peer_firewall)
    assert "10.0.0.9" not in g1.peer_firewall
    level = tmp_path / "level"
    level.write_text("1 ab\n")
    g1.__dict__["config_text"] = g1.config_text.replace(layout.GATEWAY_LEVEL, str(level))
    checked = haproxy_check(tmp_path, g1)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_one_gateway_renders_as_before(tmp_path):
    g = planned(inventory(tmp_path))["gw-1"]
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


def _secure(text):
    """A check script holding `text` where keepalived's script security accepts it (no folder on
    its path writable by others: not under /tmp); yields its path, then removes it."""
    folder = Path(tempfile.mkdtemp(dir=Path.home()))
    os.chmod(folder, 0o755)
    (folder / "thorfleet-door-check").write_text(text)
    os.chmod(folder / "thorfleet-door-check", 0o755)
    yield folder / "thorfleet-door-check"
    shutil.rmtree(folder)


@pytest.fixture
def secure_check():
    """thorfleet's check script, for keepalived's parser's config test."""
    yield from _secure(CHECK.read_text())


def test_each_gateways_keepalived_config_passes_keepalived_t(tmp_path, secure_check, monkeypatch):
    keepalived = tool("keepalived", "keepalived")
    monkeypatch.setattr(layout, "GATEWAY_DOOR_CHECK", str(secure_check))
    settings = pair(tmp_path)
    # an interface this machine has (keepalived checks it is there; VRRP takes no loopback)
    interface = next(n for n in sorted(os.listdir("/sys/class/net")) if n != "lo")
    for name, peer in (("gw-1", "10.0.0.8"), ("gw-2", "10.0.0.9")):
        text = settings[name].keepalived_text(interface)
        assert f"unicast_peer {{\n        {peer}\n    }}" in text, text
        # adverts are taken from that peer only: any other LAN host's is dropped (finding 8)
        instance = text[text.index("vrrp_instance"):]
        assert "    check_unicast_src\n" in instance, instance
        assert f"unicast_src_ip {settings[name].own_address}\n" in instance
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



@pytest.fixture
def passing_check():
    """A check that always passes: the election alone is under test, not HAProxy or the level."""
    yield from _secure("#!/bin/sh\nexit 0\n")


def test_two_gateways_started_at_once_elect_the_first_of_the_inventory(tmp_path, passing_check,
                                                                        monkeypatch):
    """Each gateway's rendered config in its own network namespace, the two joined by a veth
    pair; the second of the inventory's keepalived started 2 s before the first's (a first
    run starts both in parallel, in no set order): the first holds the address, the second
    stands by. Breaks with: no vrrp_startup_delay on the second (elected first, it keeps the
    address: nopreempt)."""
    keepalived = tool("keepalived", "keepalived")
    root()
    monkeypatch.setattr(layout, "GATEWAY_DOOR_CHECK", str(passing_check))
    settings = pair(tmp_path)
    tag = f"{os.getpid() % 100000}"
    spaces = {"gw-1": f"tf-first-{tag}", "gw-2": f"tf-second-{tag}"}
    links = {"gw-1": f"tfa{tag}", "gw-2": f"tfb{tag}"}
    started = []

    def run(name, *cmd):
        return subprocess.run(["ip", "-n", spaces[name], *cmd], capture_output=True, text=True,
                              timeout=30, check=False)

    def holds(name):
        return "10.0.0.50/24" in run(name, "addr", "show", "dev", links[name]).stdout

    try:
        for space in spaces.values():
            subprocess.run(["ip", "netns", "add", space], check=True)
        subprocess.run(["ip", "link", "add", links["gw-1"], "netns", spaces["gw-1"], "type",
                        "veth", "peer", "name", links["gw-2"], "netns", spaces["gw-2"]],
                       check=True)
        for name, data in PAIR:
            for step in (("addr", "add", f"{data['ssh_hostname']}/24", "dev", links[name]),
                         ("link", "set", links[name], "up"), ("link", "set", "lo", "up")):
                assert run(name, *step).returncode == 0
        for name in ("gw-2", "gw-1"):  # the second first
            config = tmp_path / f"{name}.conf"
            config.write_text(settings[name].keepalived_text(links[name]))
            pids = [f"--{kind}={tmp_path / f'{name}.{kind}'}" for kind in ("pid", "vrrp_pid")]
            started.append(subprocess.Popen(
                ["ip", "netns", "exec", spaces[name], keepalived, "--dont-fork", "--log-console",
                 "--vrrp", "-f", str(config), *pids],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            time.sleep(2)  # a head start the second would win by without its delay (seen)
        deadline = time.monotonic() + 30
        while not (holds("gw-1") or holds("gw-2")) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(VRRP_STARTUP_DELAY_S + 3)  # the second's VRRP has started and looked
        assert (holds("gw-1"), holds("gw-2")) == (True, False)
    finally:
        for process in started:
            process.terminate()
            process.wait(10)
        for space in spaces.values():
            subprocess.run(["ip", "netns", "delete", space], check=False)

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


def level_vrrp_script(g):
    """The vrrp_script of gateway `g`'s rendered keepalived config that runs the level check:
    {keyword: words}, "command" its script's words."""
    scripts = [{key: said for key, said, _ in body}
               for keyword, _, body in keepalived_blocks(g.keepalived_text("eth0"))
               if keyword == "vrrp_script"]
    [level] = [{**s, "command": shlex.split(s["script"][0])} for s in scripts
               if shlex.split(s["script"][0])[1:2] == ["level"]]
    return level


def test_one_slow_level_check_never_moves_the_address(tmp_path):
    """In the full story run (four workers on two cores) the preferred gateway lost the address,
    most likely to its level check: two HTTP calls of up to 1 s each in keepalived's 2 s, and one
    failure (fall 1) gave the address up. keepalived's timeout now exceeds the check's calls' max
    times together, a second to spare for the shell, and it takes two failures in a row."""
    calls = [line for line in CHECK.read_text().splitlines()
             if re.search(r"\bcurl\b", line.split("#")[0])]
    # one call site (level_at), run once for each URL of the command: this gateway's, the other's
    assert len(calls) == 1, calls
    max_time = re.search(r"--max-time ([0-9.]+)(?:\s|$)", calls[0])
    assert max_time, f"a curl with no --max-time waits as long as keepalived lets it: {calls[0]}"
    for name in ("gw-1", "gw-2"):
        level = level_vrrp_script(pair(tmp_path)[name])
        urls = [word for word in level["command"] if word.startswith("http://")]
        assert len(urls) == 2, level["command"]
        calls_at_most = float(max_time.group(1)) * len(urls)
        assert float(level["timeout"][0]) >= calls_at_most + 1, (name, level, calls_at_most)
        assert int(level["fall"][0]) >= 2, (name, level)


@pytest.mark.parametrize("value", ["eth 0", "eth0;", "a{b", "x\"y", "#x", "!x", ""])
def test_keepalived_refuses_what_would_be_more_than_a_word(value):
    with pytest.raises(ValueError):
        keepalived_word(value)


class _Levels(BaseHTTPRequestHandler):
    """A gateway's level frontend as HAProxy answers it: the level file as the process read it,
    and the digest its config carries in x-thorfleet-level (`answers`: path -> (body, header))."""

    answers: ClassVar[dict] = {}

    def do_GET(self):
        if self.path not in self.answers:
            self.send_error(404)
            return
        body, header = self.answers[self.path]
        self.send_response(200)
        if header is not None:
            self.send_header("x-thorfleet-level", header)
        self.send_header("Content-Length", str(len(body) + 1))
        self.end_headers()
        self.wfile.write(body.encode() + b"\n")

    def log_message(self, *_):
        pass


@pytest.fixture(scope="module")
def levels():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Levels)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def answer(level):
    """What a running HAProxy answers whose level file and config agree (None: no answer)."""
    return None if level is None else (level, level.split(" ")[-1])


def level_check(tmp_path, levels, own, other, seen=None):
    """thorfleet-door-check level's exit code: `own` this gateway's level (None: its HAProxy does
    not say), `other` what the other answers (None: it does not answer), `seen` what it said
    before; a level is "<since> <digest>", or (body, header) as answered."""
    seen_file = tmp_path / "peer-level"
    seen_file.unlink(missing_ok=True)
    if seen is not None:
        seen_file.write_text(seen + "\n")
    _Levels.answers = {path: value if isinstance(value, tuple) else answer(value)
                       for path, value in (("/own", own), ("/other", other))
                       if value is not None}
    return subprocess.run(["sh", str(CHECK), "level", str(seen_file), f"{levels}/own",
                           f"{levels}/other"], capture_output=True, text=True,
                          check=False).returncode


@pytest.mark.parametrize("own, other, seen, level", [
    ("100 aa", "100 aa", None, True),        # set by the same run
    ("100 aa", "200 aa", None, True),        # one run set it here, a later one there: alike
    ("200 bb", "100 aa", None, True),        # the other is behind, not this one
    ("100 aa", "200 bb", None, False),       # a later run set something this one missed
    ("100 aa", None, "200 bb", False),       # ...learnt before the other went away
    ("100 aa", None, None, True),            # never heard from the other: nothing says behind
    ("100 aa", ("<html>", None), "100 aa", True),  # an answer that is no level is not one
    (None, "100 aa", None, False),           # this gateway's HAProxy says no level
    # a file that is not what the config carries dates nothing: "0 <the config's digest>", so
    # that gateway is the one behind (its HAProxy restarted on a config a run had replaced)
    (("200 bb", "aa"), "100 bb", None, False),
    ("100 aa", ("300 cc", "bb"), None, True),
])
def test_a_gateway_behind_the_other_fails_its_level_check(tmp_path, curl, levels, own, other,
                                                          seen, level):
    assert (level_check(tmp_path, levels, own, other, seen) == 0) is level


def test_what_the_other_said_is_kept_until_a_run_brings_this_one_level(tmp_path, curl, levels):
    assert level_check(tmp_path, levels, "100 aa", "200 bb") == 1
    # the other goes away: still behind, from what it said last
    assert level_check(tmp_path, levels, "100 aa", None,
                       seen=(tmp_path / "peer-level").read_text().strip()) == 1
    # a run reaches this gateway: level again
    assert level_check(tmp_path, levels, "300 bb", None, seen="200 bb") == 0


def test_a_silent_other_gateway_costs_the_check_a_bounded_wait(tmp_path, curl, levels):
    """The other gateway takes the connection and never answers (its HAProxy stalled on a loaded
    host): the check waits out its max time, well inside keepalived's timeout, and passes on what
    it knows (a missed read says nothing: this one is not behind)."""
    timeout = float(level_vrrp_script(pair(tmp_path)["gw-1"])["timeout"][0])
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nothing ever reads the request
        _Levels.answers = {"/own": answer("100 aa")}
        started = time.monotonic()
        done = subprocess.run(["sh", str(CHECK), "level", str(tmp_path / "peer-level"),
                               f"{levels}/own", f"http://127.0.0.1:{silent.getsockname()[1]}/"],
                              capture_output=True, text=True, timeout=timeout, check=False)
        took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < timeout - 1, f"{took:.1f} s of keepalived's {timeout:g} s"


@pytest.fixture
def netns(tmp_path):
    """A network namespace of its own with the pair's addresses on its loopback; yields
    (run, start): a command run in it, a process started in it (stopped at the end)."""
    root()
    tool("ip", "iproute2")
    name = f"tf-pair-{os.getpid()}-{tmp_path.name[-12:]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    started = []

    def run(*cmd, **kwargs):
        return subprocess.run(["ip", "netns", "exec", name, *cmd], capture_output=True,
                              text=True, timeout=30, check=False, **kwargs)

    def start(*cmd):
        started.append(subprocess.Popen(["ip", "netns", "exec", name, *cmd],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True))
        return started[-1]

    try:
        assert run("ip", "link", "set", "lo", "up").returncode == 0
        for _, address in PAIR:
            assert run("ip", "addr", "add", f"{address['ssh_hostname']}/32",
                       "dev", "lo").returncode == 0
        yield run, start
    finally:
        for process in started:
            process.terminate()
            process.wait(10)
        subprocess.run(["ip", "netns", "delete", name], check=False)


def gateway_files(folder, g, since, address):
    """gateway `g`'s HAProxy config and level file as a run writes them, in `folder`, its
    sockets bound to `address` only (two HAProxys share the namespace). Returns the config."""
    folder.mkdir(exist_ok=True)
    (folder / "gateway.pem").write_text(g.pem)
    (folder / "level").write_text(f"{since} {g.level_digest}\n")
    config = g.config_text
    for path, text in g.maps.items():  # the door's maps, as the run writes them
        (folder / path.rsplit("/", 1)[1]).write_text(text)
        config = config.replace(path, str(folder / path.rsplit("/", 1)[1]))
    for path in g.runtime_maps:  # ...and the ones it makes empty when missing
        (folder / path.rsplit("/", 1)[1]).touch()
        config = config.replace(path, str(folder / path.rsplit("/", 1)[1]))
    for path, mine in ((layout.GATEWAY_PEM, "gateway.pem"), (layout.GATEWAY_LEVEL, "level"),
                       (layout.GATEWAY_ADMIN_SOCKET, "admin.sock"),
                       (layout.GATEWAY_SERVER_STATE, "server-state")):
        config = config.replace(path, str(folder / mine))
    config = config.replace("    log /dev/log local0\n", "").replace(
        "    chroot /var/lib/haproxy\n", "").replace("    bind :", f"    bind {address}:")
    (folder / "haproxy.cfg").write_text(config)
    return folder / "haproxy.cfg"


def test_the_level_a_gateway_claims_is_the_one_its_haproxy_runs(tmp_path, curl, netns):
    """A run changes the door (X to Y) on gw-1, then dies on gw-2 after writing its level file
    and config, before the reload: gw-2's HAProxy still runs X with the old keys, and its check
    must say so (it read the file before, and passed)."""
    tool("haproxy", "haproxy")
    run, start = netns
    old = pair(tmp_path)
    new = pair(tmp_path, {**VIP, "gateway_queue_timeout_s": 45})  # the change the run brings
    assert old["gw-2"].level_digest != new["gw-2"].level_digest
    assert f"hdr x-thorfleet-level {new['gw-2'].level_digest}" in new["gw-2"].config_text
    gw1 = gateway_files(tmp_path / "gw-1", new["gw-1"], 200, "10.0.0.9")
    gw2 = gateway_files(tmp_path / "gw-2", old["gw-2"], 100, "10.0.0.8")
    haproxys = [start("haproxy", "-db", "-f", str(config)) for config in (gw1, gw2)]
    check = [str(CHECK), "level", str(tmp_path / "peer-level")]
    gw2_check = [*check, "http://10.0.0.8:9107/", "http://10.0.0.9:9107/"]

    def answering(*addresses):
        for _ in range(50):
            if all(run("curl", "-fs", f"http://{a}:9107/").returncode == 0 for a in addresses):
                return
            time.sleep(0.1)
        raise AssertionError([h.stderr.read() if h.poll() is not None else "up" for h in haproxys])

    answering("10.0.0.8", "10.0.0.9")
    # the run dies on gw-2 after writing Y's level and config, before the reload
    gateway_files(tmp_path / "gw-2", new["gw-2"], 200, "10.0.0.8")
    done = run("sh", *gw2_check)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"own: 100 {old['gw-2'].level_digest};" in done.stdout, done.stdout
    # gw-1, which has Y, is not held back by the stale one
    done = run("sh", *check, "http://10.0.0.9:9107/", "http://10.0.0.8:9107/")
    assert done.returncode == 0, done.stdout + done.stderr
    # HAProxy restarted on the old config (a reboot before the next run) with Y's level file:
    # still X, and undated
    gateway_files(tmp_path / "gw-2", old["gw-2"], 100, "10.0.0.8").with_name("level").write_text(
        f"200 {new['gw-2'].level_digest}\n")
    haproxys[1].terminate()
    haproxys[1].wait(10)
    haproxys[1] = start("haproxy", "-db", "-f", str(gw2))
    answering("10.0.0.8")
    (tmp_path / "peer-level").unlink()
    done = run("sh", *gw2_check)
    assert done.returncode == 1 and f"own: 0 {old['gw-2'].level_digest};" in done.stdout, \
        done.stdout + done.stderr
    # the next run reaches gw-2 and reloads it: level
    gateway_files(tmp_path / "gw-2", new["gw-2"], 200, "10.0.0.8")
    haproxys[1].terminate()
    haproxys[1].wait(10)
    haproxys[1] = start("haproxy", "-db", "-f", str(gw2))
    answering("10.0.0.8")
    done = run("sh", *gw2_check)
    assert done.returncode == 0 and f"own: 200 {new['gw-2'].level_digest};" in done.stdout, \
        done.stdout + done.stderr


SEND_VRRP = """import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, 112)
s.bind((sys.argv[1], 0))
s.sendto(bytes([0x21, 51, 255, 1, 0, 1, 0, 0]) + socket.inet_aton("10.0.0.50"), ("10.0.0.9", 0))
"""


def vrrp_dropped(run):
    listed = run("nft", "list", "table", *GATEWAY_FIREWALL_TABLE).stdout
    line = next(x for x in listed.splitlines() if "l4proto" in x and "drop" in x)
    return int(line.split("packets ")[1].split()[0])


def test_vrrp_reaches_a_gateway_from_the_other_only(tmp_path, netns):
    """gw-1's own table, in a network namespace: an advert at priority 255 from a third LAN
    host is dropped, the peer's passes; nft -c takes the script, the unit loads the file the
    deploy writes (keepalived's drop-in)."""
    tool("nft", "nftables")
    run, _ = netns
    g = pair(tmp_path)["gw-1"]
    (tmp_path / "firewall.nft").write_text(g.peer_firewall)
    assert "ip saddr 10.0.0.8 meta l4proto { 112 } accept" in g.peer_firewall
    assert "10.0.0.9" not in g.peer_firewall  # the peer's only, not its own
    checked = run("nft", "-c", "-f", str(tmp_path / "firewall.nft"))
    assert checked.returncode == 0, checked.stderr
    assert run("nft", "-f", str(tmp_path / "firewall.nft")).returncode == 0
    assert run("ip", "addr", "add", "10.0.0.7/32", "dev", "lo").returncode == 0
    sent = run(sys.executable, "-c", SEND_VRRP, "10.0.0.7")  # a third host on the LAN
    assert sent.returncode == 0, sent.stderr
    assert vrrp_dropped(run) == 1
    sent = run(sys.executable, "-c", SEND_VRRP, "10.0.0.8")  # the other gateway
    assert sent.returncode == 0 and vrrp_dropped(run) == 1
    dropin = (layout.FILES / "gateway" / "systemd" / GATEWAY_FIREWALL_DROPIN).read_text().splitlines()
    assert {f"ExecStartPre=/usr/sbin/nft -f {GATEWAY_FIREWALL}",
            f"ExecReload=/usr/sbin/nft -f {GATEWAY_FIREWALL}",
            f"ExecStopPost=-/usr/sbin/nft delete table {' '.join(GATEWAY_FIREWALL_TABLE)}"
            } <= set(dropin)


def test_the_other_gateway_holds_each_clients_counts_for_a_failover(tmp_path, curl, netns):
    """Two HAProxys as the pair runs them, in a network namespace: alice's requests through
    gw-1's door are in gw-2's clients table too, so the gateway that takes the shared address
    goes on from her counts (her in-flight count is each process's own: HAProxy learns no
    conn_cur from a peer)."""
    tool("haproxy", "haproxy")
    run, start = netns
    key = "alice-key-0123456789abcdef"
    clients = client_files(tmp_path, alice=key)
    gateways = pair(tmp_path, {**VIP, "gateway_clients": clients})
    configs = [gateway_files(tmp_path / name, gateways[name], 100, address)
               for name, address in (("gw-1", "10.0.0.9"), ("gw-2", "10.0.0.8"))]
    haproxys = [start("haproxy", "-db", "-f", str(config)) for config in configs]
    door = ["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "-H",
            f"Authorization: Bearer {key}", "https://10.0.0.9:8443/v1/models"]
    for _ in range(50):  # gw-1's door answers (503: no box is reachable from here)
        if run(*door).stdout not in ("", "000"):
            break
        time.sleep(0.1)
    for _ in range(2):
        assert run(*door).stdout == "503", [h.poll() for h in haproxys]
    usage = box_program("thorfleet-door-usage")
    for _ in range(100):
        rows = usage.rows(usage.ask(str(tmp_path / "gw-2" / "admin.sock"),
                                    f"show table {layout.GATEWAY_CLIENT_TABLE}"))
        if rows.get("alice", {}).get("http_req_cnt", 0) >= 3:
            break
        time.sleep(0.1)
    assert rows.get("alice", {}).get("http_req_cnt") == 3, rows  # the first try, and two
    assert rows["alice"]["http_req_rate(60000)"] == 3 and rows["alice"]["conn_cur"] == 0
