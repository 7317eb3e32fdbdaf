"""The gateway as rendered on the laptop: HAProxy's config and a Thor's firewall pass their own
parsers (haproxy -c, nft -c), every value lands as one word, and the inventory's gateway is
checked before anything connects.

Fast: no Docker, no SSH; haproxy and nft from Debian's packages (.ci/setup installs them).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pyinfra.api import Inventory

from tests.helpers import box_program, free_port
from thorfleet import plan
from thorfleet.gateway.config import (
    FLEET_CLIENT,
    Backend,
    GatewaySettings,
    firewall_script,
    haproxy_word,
    nft_word,
)
from thorfleet.plan import make_door_files, make_laptop_files, settings_for_inventory
from thorfleet.run.laptop import client_keys
from thorfleet.settings import layout, schema
from thorfleet.settings.clients import TOKEN_BUDGETS
from thorfleet.settings.roles import gateway_of, is_gateway, is_thor, thors
from thorfleet.settings.schema import CLIENT_KEY, SettingsError, check_gateway

PINS = {"weights_model_revision": "4" * 40, "weights_draft_revision": "5" * 40,
        "image_base": "registry.example/vllm@sha256:" + "a" * 64}
BOX_KEY = "sk-test-the-boxes-own-0123456789"  # a bearer token: the door may send it on


def gateway_settings(tmp_path, **data):
    values, problems = check_gateway({"gateway_ca_dir": str(tmp_path / "ca"), **data})
    assert not problems, problems
    # its clients' keys made and read as a deploy's plan does (the problems are the plan's)
    keyed, _ = client_keys(values.client_policies, {BOX_KEY}, CLIENT_KEY, make=True)
    g = GatewaySettings(values, "gw-1", "127.0.0.1", [
        Backend("thor-1", "thorfleet-thor-1", 8002, 1, 9105),
        Backend("thor-2", "10.0.0.3", 8002, 1, 9105)], box_key=BOX_KEY, policies=keyed)
    make_door_files(g)  # its certificate, as the deploy makes it before it plans a host
    return g


def planned(inv):
    """Every host's settings as a deploy plans them: checked, then the laptop's files made
    (the fleet CA, the door's certificate, client keys) before any host is rendered."""
    settings = settings_for_inventory(inv, make=True)
    make_laptop_files(settings, inv)
    return settings


def local_config(tmp_path, g) -> str:
    """g's haproxy.cfg reading its certificate and maps from `tmp_path`, where they are written
    as the deploy writes them beside the config."""
    config = g.config_text
    for path, text in {layout.GATEWAY_PEM: g.pem, **g.maps}.items():
        here = tmp_path / path.rsplit("/", 1)[1]
        here.write_text(text)
        config = config.replace(path, str(here))
    for path in g.runtime_maps:  # the door's programs keep them: made empty when missing
        here = tmp_path / path.rsplit("/", 1)[1]
        here.touch()
        config = config.replace(path, str(here))
    return config


def haproxy_check(tmp_path, g):
    config = tmp_path / "haproxy.cfg"
    config.write_text(local_config(tmp_path, g))
    return subprocess.run([shutil.which("haproxy") or "haproxy", "-c", "-f", str(config)],
                          check=False, capture_output=True, text=True)


def test_the_rendered_config_passes_haproxy_c(tmp_path):
    g = gateway_settings(tmp_path, gateway_queue_timeout_s=45)
    checked = haproxy_check(tmp_path, g)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = [line.strip() for line in g.config_text.splitlines()]
    # each box takes max_num_seqs at a time; the rest queue 45 s at the gateway
    assert "server thor-1 thorfleet-thor-1:8002 port 9105 maxconn 1 id 1" in lines
    assert "timeout queue 45s" in lines
    # a request that failed before its answer began is tried on another box (retry-on's events
    # all come before a response is forwarded); a 500 or a timeout is not
    assert {"retries 3", "option redispatch 1",
            "retry-on conn-failure empty-response junk-response 502 503"} <= set(lines)
    # connections bounded at the door, with room above them for the runtime API
    assert f"maxconn {g.maxconn}" in lines and f"maxconn {g.global_maxconn}" in lines
    assert g.maxconn < g.global_maxconn
    # in rotation while the watchdog (on the check port) says the box generates
    assert "http-check send meth GET uri /healthy" in lines
    assert f"bind :{g.gateway_port} ssl crt {layout.GATEWAY_PEM} alpn http/1.1" in lines


def test_a_config_haproxy_refuses_is_seen_as_refused(tmp_path):
    # the breaking edit a test of the check needs: the same config with a word HAProxy lacks
    g = gateway_settings(tmp_path)
    g.__dict__["config_text"] = g.config_text.replace("balance leastconn", "balance fastest")
    assert haproxy_check(tmp_path, g).returncode != 0


@pytest.mark.parametrize("value, word", [
    (8002, "8002"), ("thor-1", "thor-1"), ("10.0.0.3", "10.0.0.3"), ("fd00::5", "fd00::5"),
    ("/etc/haproxy/x.pem", "/etc/haproxy/x.pem"), ("a b", "'a b'"), ("a#b", "'a#b'"),
    ("$HOME", "'$HOME'"), ('a"b', "'a\"b'"),
])
def test_haproxy_words(value, word):
    assert haproxy_word(value) == word


@pytest.mark.parametrize("value", ["it's", "a\nb", "a\rb", "\x00", "é", True, None])
def test_haproxy_refuses_what_would_be_more_than_a_word(value):
    with pytest.raises((ValueError, TypeError)):
        haproxy_word(value)


@pytest.mark.parametrize("value", ['a"b', "a\nb", "é", None])
def test_nft_refuses_what_would_be_more_than_a_word(value):
    with pytest.raises((ValueError, TypeError)):
        nft_word(value)


@pytest.mark.parametrize("gateway", ["172.18.0.5", "fd00::5"])
def test_the_firewall_passes_nft_c_and_names_only_the_gateway(tmp_path, gateway):
    script, mark = firewall_script((8002, 9105), gateway)
    path = tmp_path / "firewall.nft"
    path.write_text(script)
    checked = subprocess.run([shutil.which("nft") or "nft", "-c", "-f", str(path)],
                             check=False, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    family = "ip" if "." in gateway else "ip6"
    # vLLM's port and the watchdog's (the gateway's health check) answer the gateway only
    assert f"{family} saddr {gateway} tcp dport {{ 8002, 9105 }} accept" in script
    assert f'tcp dport {{ 8002, 9105 }} counter drop comment "{mark}"' in script
    assert 'iifname "lo" tcp dport { 8002, 9105 } accept' in script
    # the mark names this version: another port or gateway, another mark
    assert firewall_script((8003, 9105), gateway)[1] != mark
    assert firewall_script((8002, 9105), "172.18.0.6")[1] != mark


@pytest.mark.parametrize("port", [0, 65536, True, "8002", "8002 accept"])
def test_the_firewall_takes_only_tcp_ports(port):
    with pytest.raises(ValueError):
        firewall_script((port,), "172.18.0.5")


def test_the_firewall_unit_loads_the_file_the_deploy_writes():
    unit = (layout.FILES / "thor" / "systemd" / layout.FIREWALL_UNIT).read_text().splitlines()
    assert f"ExecStart=/usr/sbin/nft -f {layout.BOX_FIREWALL}" in unit
    # after Debian's nftables.service (its `flush ruleset`), and again whenever it restarts
    assert {"After=nftables.service", "PartOf=nftables.service"} <= set(unit)
    family, table = layout.FIREWALL_TABLE
    assert (f"ExecStartPost=/bin/sh -c '/usr/sbin/nft -s list table {family} {table} | sha256sum "
            f"> {layout.BOX_FIREWALL_LISTED}'") in unit


def test_the_server_waits_for_the_firewall_and_a_failed_load_keeps_it_down():
    dropin = (layout.FILES / "thor" / "systemd" / "thorfleet-vllm-firewall.conf").read_text().splitlines()
    assert {"After=thorfleet-firewall.service", "Wants=thorfleet-firewall.service"} <= set(dropin)
    check = next(x for x in dropin if x.startswith("ExecStartPre="))
    command = check.removeprefix("ExecStartPre=/bin/sh -c '").removesuffix("'")
    # in a network namespace of its own: no table, the start is refused saying why; loaded, passes
    refused = subprocess.run(["unshare", "--net", "sh", "-c", command], capture_output=True,
                             text=True, timeout=30, check=False)
    assert refused.returncode == 1 and "the server stays down" in refused.stderr
    script, _ = firewall_script((8002, 9105), "172.18.0.5")
    loaded = subprocess.run(["unshare", "--net", "sh", "-c", f"nft -f - && {command}"],
                            input=script, capture_output=True, text=True, timeout=30, check=False)
    assert loaded.returncode == 0, loaded.stderr


def test_a_rule_added_by_hand_is_seen_as_drift_not_only_a_changed_mark(tmp_path):
    """The fact compares the whole table as nft lists it with what the unit recorded at load (its
    comment mark alone missed a rule added to thorfleet's table). In a network namespace."""
    from thorfleet.facts.gateway import FirewallMark

    script, mark = firewall_script((8002, 9105), "172.18.0.5")
    (tmp_path / "firewall.nft").write_text(script)
    family, table = layout.FIREWALL_TABLE
    unit = (layout.FILES / "thor" / "systemd" / layout.FIREWALL_UNIT).read_text().splitlines()
    record = next(x for x in unit if x.startswith("ExecStartPost=/bin/sh -c '"))
    record = record.removeprefix("ExecStartPost=/bin/sh -c '").removesuffix("'")
    fact = FirewallMark()
    listed = str(tmp_path / "firewall.listed")

    def look(after_load=""):
        steps = [f"nft -f {tmp_path / 'firewall.nft'}",
                 record.replace(layout.BOX_FIREWALL_LISTED, listed), after_load,
                 fact.command().replace(layout.BOX_FIREWALL_LISTED, listed)]
        done = subprocess.run(["unshare", "--net", "sh", "-c", "; ".join(x for x in steps if x)],
                              capture_output=True, text=True, timeout=30, check=False)
        return fact.process(done.stdout.splitlines())

    assert look() == mark
    assert look(f"nft add rule {family} {table} input tcp dport 22 accept") == "changed"
    assert look(f"nft delete table {family} {table}") == "no table"


# --- the inventory's gateway, checked before connecting ------------------------------------------

def inventory(tmp_path, gateway_data=None, gateway_hosts=None, thor_hosts=None):
    key = tmp_path / "api_key"
    key.write_text(BOX_KEY + "\n")
    key.chmod(0o600)
    thor_hosts = thor_hosts or [("thor-1", {"ssh_hostname": "10.0.0.1"}),
                                ("thor-2", {"ssh_hostname": "10.0.0.2"})]
    gateway_hosts = gateway_hosts or [("gw-1", {"ssh_hostname": "10.0.0.9"})]
    return Inventory(
        (thor_hosts + gateway_hosts, {}),
        thors=([n for n, _ in thor_hosts], {**PINS, "service_api_key_file": str(key)}),
        gateway=([n for n, _ in gateway_hosts],
                 {"gateway_ca_dir": str(tmp_path / "ca"), **(gateway_data or {})}))


def test_the_plans_settings_are_not_changed_once_built(tmp_path):
    """Breaks with: the plan not freezing what it built (plan.settings_for_inventory)."""
    settings = settings_for_inventory(inventory(tmp_path))
    for held in (settings["thor-1"], settings["gw-1"]):
        with pytest.raises(AttributeError, match="not changed after the run's plan built them"):
            held.gateway_sources = ("10.0.0.66",)
    assert settings["thor-1"].gateway_sources == ("10.0.0.9",)
    assert settings["thor-1"].fingerprint  # a cached value is still kept

def test_the_gateway_is_checked_with_its_own_settings_and_each_thor_told_its_address(tmp_path):
    inv = inventory(tmp_path)
    assert [h.name for h in thors(inv)] == ["thor-1", "thor-2"] and gateway_of(inv).name == "gw-1"
    settings = settings_for_inventory(inv)
    g = settings["gw-1"]
    assert isinstance(g, GatewaySettings) and [b.name for b in g.backends] == ["thor-1", "thor-2"]
    assert g.endpoint == {"url": "https://10.0.0.9:8443",
                          "ca_file": str(tmp_path / "ca" / "fleet-ca.pem")}
    assert settings["thor-1"].gateway_sources == ("10.0.0.9",)


def test_without_a_gateway_the_thors_have_none(tmp_path):
    key = tmp_path / "api_key"
    key.write_text("sk-test-0123456789\n")
    key.chmod(0o600)
    inv = Inventory(([("thor-1", {"ssh_hostname": "10.0.0.1"})],
                     {**PINS, "service_api_key_file": str(key)}))
    assert settings_for_inventory(inv)["thor-1"].gateway_sources is None


def test_a_gateway_named_by_dns_needs_the_address_the_boxes_see(tmp_path):
    inv = inventory(tmp_path, gateway_hosts=[("gw-1", {"ssh_hostname": "gw.lan"})])
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    assert error.value.problems == [
        ("gw-1: gateway_fleet_address is not set and ssh_hostname 'gw.lan' is not an IP address: "
        "set gateway_fleet_address to the IP the boxes see the gateway connect from (their "
        "firewall lets only it in)")]
    fixed = inventory(tmp_path, gateway_hosts=[
        ("gw-1", {"ssh_hostname": "gw.lan", "gateway_fleet_address": "10.0.0.9"})])
    assert settings_for_inventory(fixed)["thor-2"].gateway_sources == ("10.0.0.9",)


def test_two_gateways_without_a_shared_address_and_a_name_haproxy_cannot_take_are_refused(
        tmp_path):
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, gateway_hosts=[
            ("gw-1", {"ssh_hostname": "10.0.0.9"}), ("gw-2", {"ssh_hostname": "10.0.0.8"})]))
    assert error.value.problems[0].startswith("gw-1 and gw-2: two gateways need "
                                              "gateway_virtual_ip")
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, thor_hosts=[
            ("thor 1", {"ssh_hostname": "10.0.0.1"})]))
    assert any(p.startswith("'thor 1': the gateway names each box by its inventory name")
               for p in error.value.problems), error.value.problems


def test_a_gateway_of_its_own_needs_none_of_the_thors_pins(tmp_path):
    values, problems = check_gateway({"gateway_port": 28443, "ssh_user": "thor"})
    assert problems == [] and values.gateway_port == 28443
    _, problems = check_gateway({"gateway_tls_cert_file": "/x.pem"})
    assert problems == [("gateway_tls_cert_file and gateway_tls_key_file go together: set both "
                        "(your certificate and its key), or neither (the fleet CA signs one)")]
    # HAProxy on the gateway's own SSH port would take the operator's way in
    _, problems = check_gateway({"gateway_port": 2200, "ssh_port": 2200})
    assert problems == [("gateway_port=2200 is this host's SSH port (ssh_port 2200): thorfleet "
                         "would listen there, and on a Thor its firewall lets only the gateway "
                         "reach service_port, closing your way in; use another port, like 8443")]


def test_a_gateway_that_serves_the_model_is_a_thor_too(tmp_path):
    inv = inventory(tmp_path, gateway_data={"gateway_serves_model": True, **PINS},
                    gateway_hosts=[("thor-1", {"ssh_hostname": "10.0.0.1"})],
                    thor_hosts=[("thor-1", {"ssh_hostname": "10.0.0.1"}),
                                ("thor-2", {"ssh_hostname": "10.0.0.2"})])
    h = inv.get_host("thor-1")
    assert is_gateway(h) and is_thor(h)
    settings = settings_for_inventory(inv)
    assert settings["thor-1"].gateway_role.name == "thor-1"
    assert [b.name for b in settings["thor-1"].gateway_role.backends] == ["thor-2", "thor-1"]


# --- values that reach haproxy.cfg and the firewall, any of them -----------------------------------

BREAKERS = [" ", "\n", "#", "'", '"', "\\", "$", "${X}", ";", "\t", "é", ":", "%", "\x00", "*"]
VALID = {"name": "thor-1", "address": "thor-1.lan", "names": "gw.lan", "fleet": "10.0.0.9"}


def broken(valid):
    """`valid` with each breaker before, inside and after it."""
    return [valid[:at] + b + valid[at:] for b in BREAKERS
            for at in (0, len(valid) // 2, len(valid))]


CASES = [(key, value) for key, valid in VALID.items() for value in [valid, *broken(valid)]]


def test_any_inventory_value_is_refused_or_lands_as_itself(tmp_path):
    landed = 0
    for key, value in CASES:
        v = {**VALID, key: value}
        inv = inventory(tmp_path, thor_hosts=[(v["name"], {"ssh_hostname": "10.0.0.1",
                                                           "weights_peer_address": v["address"]})],
                        gateway_data={"gateway_names": [v["names"]],
                                      "gateway_fleet_address": v["fleet"]})
        try:
            settings = settings_for_inventory(inv)
        except SettingsError as error:
            assert all("\n" not in p for p in error.problems), error.problems
            continue
        landed += 1
        g = settings["gw-1"]
        servers = [line.split() for line in g.config_text.splitlines()
                   if line.strip().startswith("server ")]
        assert servers == [["server", v["name"], f"{v['address']}:8002", "port", "9105",
                            "maxconn", "1", "id", "1"]], (key, value, servers)
        script, _ = firewall_script((8002,), *settings[v["name"]].gateway_sources)
        assert f"ip saddr {v['fleet']} tcp dport {{ 8002 }} accept" in script, (key, value)
        assert g.names == ["10.0.0.9", v["names"].lower()], (key, value, g.names)
    assert landed >= len(VALID)  # the valid values, at least, land


def test_the_gateways_tls_key_readable_by_others_is_refused(tmp_path):
    """The operator's own certificate key is a laptop secret like the API key (the class's test
    in tests/fast/test_settings.py): another user who reads it can be the gateway."""
    from thorfleet.gateway.tls import gateway_pair  # a real pair, so only the mode is wrong
    cert, key = gateway_pair(tmp_path / "other-ca", "gw-1", ["10.0.0.9"])
    (tmp_path / "gw.pem").write_bytes(cert)
    key_file = tmp_path / "gw.key"
    key_file.write_bytes(key)
    key_file.chmod(0o644)
    own = {"gateway_tls_cert_file": str(tmp_path / "gw.pem"), "gateway_tls_key_file": str(key_file)}
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, gateway_data=own))
    assert error.value.problems == [(f"gw-1: gateway_tls_key_file={str(key_file)!r} can be read "
                                     f"by other users (mode 644): chmod 600 {key_file}")]
    key_file.chmod(0o600)
    settings_for_inventory(inventory(tmp_path, gateway_data=own))


# --- IPv6: rendered as HAProxy reads it, and dialled for real ------------------------------------

class JsonBox(BaseHTTPRequestHandler):
    """A stand-in's handler: `answer` sends a JSON body as vLLM does, and no access log is kept."""

    def answer(self, value, status=200):
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


class _Box(JsonBox):
    """A Thor as the gateway sees one: the watchdog's /healthy and vLLM's routes, answering 200."""

    def do_GET(self):
        self.server.asked = getattr(self.server, "asked", 0) + 1
        if "slow" in self.path:  # an answer that takes a while, as a long generation does
            time.sleep(2)
        seen = {"box": self.server.server_address[0], "path": self.path}
        status = 200
        if self.headers["Authorization"]:  # what the door sent on (its own key, with clients)
            seen["auth"] = self.headers["Authorization"]
            status = 200 if seen["auth"] == f"Bearer {BOX_KEY}" else 401  # as vLLM's key check
        self.answer(seen, status)

    def do_POST(self):
        """A completion: says which box took it, the model its body names and the body's length
        as it arrived (chunked or not), so a cut body shows. `completions` counts these alone:
        the door's health checks (GETs) come when they will."""
        self.server.asked = getattr(self.server, "asked", 0) + 1
        self.server.completions = getattr(self.server, "completions", 0) + 1
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        self.answer({"box": self.server.server_address[1], "path": self.path,
                     "length": len(body), "model": json.loads(body).get("model")})


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def keyed(url, key=BOX_KEY):
    """A GET of `url` with `key` as its bearer: the fleet's opens the door without clients."""
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})


def test_an_ipv6_thor_and_gateway_render_as_haproxy_reads_them(tmp_path):
    own = {"weights_source": "hub", "image_source": "build"}  # the fleet copy dials IPv4 only
    inv = inventory(tmp_path, thor_hosts=[("thor-1", {"ssh_hostname": "2001:db8::5", **own}),
                                          ("thor-2", {"ssh_hostname": "thor-2.lan", **own})],
                    gateway_hosts=[("gw-1", {"ssh_hostname": "2001:db8::9"})])
    g = planned(inv)["gw-1"]
    checked = haproxy_check(tmp_path, g)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    lines = [line.strip() for line in g.config_text.splitlines()]
    # the whole address, bracketed: `2001:8002` (its first group read as an IPv4 number) once
    assert "server thor-1 [2001:db8::5]:8002 port 9105 maxconn 1 id 1" in lines
    assert "server thor-2 thor-2.lan:8002 port 9105 maxconn 1 id 2" in lines
    # a client name is IPv6: the door listens on both families (it was IPv4 only)
    assert "bind :::8443 v4v6 ssl crt /etc/haproxy/thorfleet/gateway.pem alpn http/1.1" in lines
    assert g.url == "https://[2001:db8::9]:8443"


def test_a_gateway_that_dials_a_family_its_firewall_source_is_not_is_refused(tmp_path):
    inv = inventory(tmp_path, thor_hosts=[("thor-1", {"ssh_hostname": "10.0.0.1"})],
                    gateway_hosts=[("gw-1", {"ssh_hostname": "fd00::9"})])
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    assert error.value.problems == [
        ("thor-1: the gateway dials it at 10.0.0.1 (IPv4) while its firewall would let in fd00::9 "
         "(IPv6): set gateway_fleet_address to the gateway's address in the family it dials the "
         "boxes with")]
    fixed = inventory(tmp_path, thor_hosts=[("thor-1", {"ssh_hostname": "10.0.0.1"})],
                      gateway_hosts=[("gw-1", {"ssh_hostname": "fd00::9",
                                               "gateway_fleet_address": "10.0.0.9"})])
    assert settings_for_inventory(fixed)["thor-1"].gateway_sources == ("10.0.0.9",)


@contextlib.contextmanager
def running_door(tmp_path, thors=1, gateway_data=None, servers_out=None, thor_data=(),
                 handlers=(), watchdogs=()):
    """HAProxy itself on the rendered config of a gateway at ::1 in front of `thors` Thors at ::1
    (stand-ins answering on their vLLM and watchdog ports; `thor_data`: each one's own host data,
    in order; `handlers`, `watchdogs`: each one's vLLM and watchdog stand-in, _Box where none):
    yields (the door's port, its settings, the running HAProxy)."""
    own = [handlers, watchdogs]
    servers = [_Server6(("::1", 0), own[n % 2][n // 2] if n // 2 < len(own[n % 2]) else _Box)
               for n in range(2 * thors)]
    if servers_out is not None:
        servers_out.extend(servers)
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    # a free port can be taken by a test beside this one before HAProxy binds it: then again,
    # on other ports (HAProxy says so and exits; nothing else is retried)
    for attempt in range(3):
        door = free_port("::1")
        inv = inventory(tmp_path, thor_hosts=[(f"thor-{n + 1}", {
            "ssh_hostname": "::1", "service_port": servers[2 * n].server_address[1],
            "watchdog_port": servers[2 * n + 1].server_address[1],
            # more than one box at ::1: none can fetch from another
            **({"weights_source": "hub", "image_source": "build"} if thors > 1 else {}),
            **(thor_data[n] if n < len(thor_data) else {})})
            for n in range(thors)],
            gateway_hosts=[("gw-1", {"ssh_hostname": "::1"})],
            gateway_data={"gateway_port": door, **(gateway_data or {})})
        g = planned(inv)["gw-1"]
        config = local_config(tmp_path, g)
        config = config.replace(layout.GATEWAY_ADMIN_SOCKET, str(tmp_path / "admin.sock"))
        config = config.replace(layout.GATEWAY_SERVER_STATE, str(tmp_path / "server-state"))
        config = config.replace("    log /dev/log local0\n", "").replace(
            "    chroot /var/lib/haproxy\n", "")
        # the clients table's local peer on a port of this test's own (tests run side by side)
        config = config.replace(f"127.0.0.1:{layout.GATEWAY_PEERS_PORT}",
                                f"127.0.0.1:{free_port()}")
        (tmp_path / "haproxy.cfg").write_text(config)
        running = _Haproxy(tmp_path / "haproxy.cfg", door,
                           ssl.create_default_context(cafile=g.ca_file))
        try:
            running.start()
            break
        except AssertionError as error:
            if "Address already in use" not in str(error) or attempt == 2:
                for server in servers:
                    server.shutdown()
                raise
    try:
        yield door, g, running
    finally:
        running.stop()
        for server in servers:
            server.shutdown()


def test_a_door_port_taken_before_haproxy_binds_it_is_tried_again_on_another(tmp_path,
                                                                              monkeypatch):
    """The harness's own race (tests run side by side): the port free_port gave is listened on
    by someone else when HAProxy binds; the door comes up on another, and answers."""
    taken = socket.socket(socket.AF_INET6)
    taken.bind(("::1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    given = iter([port])
    real = free_port
    monkeypatch.setattr(sys.modules[__name__], "free_port",
                        lambda host="127.0.0.1": next(given, None) or real(host))
    try:
        with running_door(tmp_path) as (door, g, _):
            assert door != port
            status, _ = ask(door, g, "/v1/models", BOX_KEY)
            assert status == 200
    finally:
        taken.close()


class _Haproxy:
    """HAProxy in the foreground on a config, restartable (a new process reads the state file)."""

    def __init__(self, config, door, context):
        self.config, self.door, self.context, self.process = config, door, context, None

    def start(self, *words):
        self.process = subprocess.Popen([shutil.which("haproxy") or "haproxy", "-db", "-f",
                                         str(self.config), *words], stderr=subprocess.PIPE,
                                        text=True)
        self._answering()

    def reload(self):
        """A reload as HAProxy's master makes one (Debian's `systemctl reload`): a new process on
        the config, told to take over from this one (-sf), which ends once its connections do
        and it has handed on its tables."""
        old = self.process
        self.start("-sf", str(old.pid))
        old.wait(30)

    def _answering(self):
        for _ in range(50):
            if self.process.poll() is not None:
                break  # HAProxy exited: it says why
            try:
                urllib.request.urlopen(f"https://[::1]:{self.door}/health", timeout=5,
                                       context=self.context)
                return
            except urllib.error.HTTPError:
                return  # the door answers (a 503 with every box drained is an answer)
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        self.process.terminate()
        raise AssertionError(self.process.communicate(timeout=10)[1])

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def test_a_client_reaches_an_ipv6_thor_through_a_gateway_on_both_families(tmp_path):
    """A client at the gateway's IPv6 name, verified by the fleet CA, is answered by the box
    listening on ::1 alone; IPv4 reaches the door too."""
    with running_door(tmp_path) as (door, g, _):
        context = ssl.create_default_context(cafile=g.ca_file)
        answer = urllib.request.urlopen(keyed(f"https://[::1]:{door}/v1/models"), timeout=5,
                                        context=context)
        assert json.loads(answer.read()) == {"box": "::1", "path": "/v1/models",
                                             "auth": f"Bearer {BOX_KEY}"}
        loose = ssl.create_default_context(cafile=g.ca_file)
        loose.check_hostname = False  # the certificate names ::1; this asks only that v4 answers
        answer = urllib.request.urlopen(keyed(f"https://127.0.0.1:{door}/v1/models"), timeout=5,
                                        context=loose)
        assert json.loads(answer.read())["box"] == "::1"


ROUTES = [
    ("/v1/models", 200), ("/v1/chat/completions", 200), ("/invocations", 200), ("/health", 200),
    ("/metrics", 404), ("/load", 404), ("/version", 404), ("/ping", 404), ("/tokenize", 404),
    ("/v1", 404), ("/metrics?/v1/", 404), ("//v1/models", 404),
]


def test_only_the_routes_clients_need_go_through_the_door(tmp_path):
    """vLLM answers /metrics, /load and /version without a key (tests/docker/test_api_auth.py): they are
    the boxes' own (Prometheus reads the boxes directly), not the clients'. One door, each route."""
    got = {}
    with running_door(tmp_path) as (door, g, _):
        context = ssl.create_default_context(cafile=g.ca_file)
        for path, _ in ROUTES:
            try:
                got[path] = urllib.request.urlopen(keyed(f"https://[::1]:{door}{path}"),
                                                   timeout=5, context=context).status
            except urllib.error.HTTPError as error:
                got[path] = error.code
    assert got == dict(ROUTES)


def test_the_doors_own_errors_are_json_a_client_can_act_on(tmp_path):
    """An OpenAI client reads `error.message` from JSON; HAProxy's own answers were HTML pages. A
    route not served is a JSON 404; with no box in rotation, a JSON 503 with Retry-After
    (gateway_retry_after_s)."""
    with running_door(tmp_path) as (door, g, _):
        context = ssl.create_default_context(cafile=g.ca_file)

        def ask(path):
            try:
                urllib.request.urlopen(keyed(f"https://[::1]:{door}{path}"), timeout=10,
                                       context=context)
            except urllib.error.HTTPError as error:
                return error.code, error.headers, json.loads(error.read())
            raise AssertionError(f"{path} answered 200")

        code, headers, body = ask("/metrics")
        assert (code, headers["Content-Type"]) == (404, "application/json")
        assert body["error"]["code"] == 404 and "/v1/" in body["error"]["message"], body
        subprocess.run(["socat", "-t", "5", "stdio", f"UNIX-CONNECT:{tmp_path / 'admin.sock'}"],
                       input=f"set server {layout.GATEWAY_BACKEND}/thor-1 state maint\n",
                       capture_output=True, text=True, timeout=30, check=True)
        code, headers, body = ask("/v1/models")
        assert (code, headers["Content-Type"], headers["Retry-After"]) == (
            503, "application/json", str(g.gateway_retry_after_s))
        assert body == {"error": {"message": f"no box was free within "
                                             f"{g.gateway_queue_timeout_s} s; try again later",
                                  "type": "service_unavailable", "param": None, "code": 503}}


# --- the boxes' rotation states: thorfleet-rotation on a real HAProxy --------------------------------

ROTATION = layout.FILES / "gateway" / "bin" / "thorfleet-rotation"
DROPIN = layout.FILES / "gateway" / "haproxy-state.conf"


def test_the_rotation_state_last_set_survives_a_restart_and_maintenance_is_the_operators(
        tmp_path):
    """A state set through thorfleet-rotation is saved at once, and the drop-in's save at
    HAProxy's stop keeps one set by hand: a restarted HAProxy comes back with the last one set.
    A box the operator put in maintenance is left there by a run's drain and ready."""
    socket_path, state = tmp_path / "admin.sock", tmp_path / "server-state"

    def rotation(*words, timeout=30):
        return subprocess.run(["sh", str(ROTATION), str(socket_path), str(state), *words],
                              capture_output=True, text=True, timeout=timeout, check=False)

    def api(command):
        return subprocess.run(["socat", "-t", "5", "stdio", f"UNIX-CONNECT:{socket_path}"],
                              input=command + "\n", capture_output=True, text=True, timeout=30,
                              check=True).stdout

    def admin():
        rows = [line.split() for line in api(f"show servers state {layout.GATEWAY_BACKEND}")
                .splitlines() if line[:1].isdigit()]  # the first, "1", is the format's version
        return {f[3]: int(f[6]) for f in rows if len(f) > 6}["thor-1"]

    def stop_as_the_dropin_does(running):
        # the drop-in's ExecStop line, on this test's paths
        line = next(x for x in DROPIN.read_text().splitlines() if x.startswith("ExecStop="))
        words = line.removeprefix("ExecStop=").lstrip("-").split()
        assert words[:2] == ["/usr/bin/flock", layout.GATEWAY_STATE_LOCK], words
        assert words[2:] == [layout.GATEWAY_ROTATION, layout.GATEWAY_ADMIN_SOCKET,
                             layout.GATEWAY_SERVER_STATE, "save"], words
        subprocess.run(["flock", f"{state}.lock", "sh", str(ROTATION), str(socket_path),
                        str(state), "save"], check=True, timeout=30)
        running.stop()

    with running_door(tmp_path) as (_, _, running):
        assert admin() == 0
        done = rotation("pull", layout.GATEWAY_BACKEND, "thor-1")
        assert done.returncode == 0 and "out of rotation" in done.stdout, done.stderr
        running.stop()  # a crash, even: the state was saved when it was set
        running.start()
        assert admin() & 0x08, "the drain was lost by the restart"
        assert rotation("ready", layout.GATEWAY_BACKEND, "thor-1").returncode == 0
        running.stop()
        running.start()
        assert admin() == 0, "the box came back drained"
        # the operator's maintenance, set by hand: kept by the stop's save, left by a run
        api(f"set server {layout.GATEWAY_BACKEND}/thor-1 state maint")
        stop_as_the_dropin_does(running)
        running.start()
        assert admin() & 0x01
        for action in ("drain", "ready"):
            done = rotation(action, layout.GATEWAY_BACKEND, "thor-1", "5")
            assert done.returncode == 0 and "in maintenance (the operator's)" in done.stdout
            assert admin() & 0x01, action
        # a state is set under the lock a reload holds: it waits for it
        with open(f"{state}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            waiting = subprocess.Popen(["sh", str(ROTATION), str(socket_path), str(state), "pull",
                                        layout.GATEWAY_BACKEND, "thor-2"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(1)
            assert waiting.poll() is None, waiting.communicate()
        assert waiting.wait(30) != 0  # thor-2 is no server of this door's: said, after the lock


def test_two_runs_together_restart_no_more_boxes_than_the_batch(tmp_path):
    """Restart slots at the gateway: run A's drain of thor-1 for a restart takes the one slot of
    rollout_batch 1; run B's drain of thor-2 waits, saying who holds it, until A puts thor-1
    back; a lease left by a killed run lapses after its time; a slot never freed in time fails
    the drain, naming the holder (thorfleet-rotation's take_slot)."""
    socket_path, state = tmp_path / "admin.sock", tmp_path / "server-state"
    backend = layout.GATEWAY_BACKEND

    def rotation(*words):
        return subprocess.Popen(["sh", str(ROTATION), str(socket_path), str(state), *words],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def done(process, timeout=30):
        out, err = process.communicate(timeout=timeout)
        return process.returncode, out + err

    def drained():
        out = subprocess.run(["socat", "-t", "5", "stdio", f"UNIX-CONNECT:{socket_path}"],
                             input=f"show servers state {backend}\n", capture_output=True,
                             text=True, timeout=30, check=True).stdout
        rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
        return {f[3] for f in rows if len(f) > 6 and int(f[6]) & 0x08}

    with running_door(tmp_path, thors=3):
        code, out = done(rotation("drain", backend, "thor-1", "5", "1", "60", "run A"))
        assert code == 0 and drained() == {"thor-1"}, out
        waiting = rotation("drain", backend, "thor-2", "5", "1", "60", "run B")
        time.sleep(3)
        assert waiting.poll() is None and drained() == {"thor-1"}, done(waiting)
        assert done(rotation("ready", backend, "thor-1"))[0] == 0  # A's restart is over
        code, out = done(waiting)
        assert code == 0 and drained() == {"thor-2"}, out
        assert "waits for a restart slot: 1 of 1 taken: thor-1 (run A)" in out, out
        # B is killed before it puts thor-2 back: its lease (here 60 s) holds, then lapses
        code, out = done(rotation("drain", backend, "thor-3", "5", "1", "4", "run C"))
        assert code == 1 and "thor-3 not restarted: 1 box(es) already restarting" in out, out
        assert "thor-2 (run B)" in out and drained() == {"thor-2"}, out
        lease = tmp_path / "server-state.restarting" / "thor-2"
        lease.write_text(f"{int(time.time()) + 2} run B\n")
        code, out = done(rotation("drain", backend, "thor-3", "5", "1", "30", "run C"))
        assert code == 0 and drained() == {"thor-2", "thor-3"}, out
        # a pull (a failed proof leaves the box out) ends its restart too: the slot is free
        assert done(rotation("pull", backend, "thor-3"))[0] == 0
        code, out = done(rotation("drain", backend, "thor-1", "5", "1", "4", "run D"))
        assert code == 0 and drained() == {"thor-1", "thor-2", "thor-3"}, out


@pytest.mark.parametrize("group, refused", [
    ("gateways", True), ("Gateway", True), ("gatway", True), ("monitors", True), ("monitr", True),
    ("boxes", False), ("gateway_lab", False), ("edge", False), ("gw", False),
])
def test_a_group_named_nearly_as_a_role_is_refused_not_taken_for_thors(tmp_path, group, refused):
    """A role is its group's exact name: `gateways` made the gateway one more Thor, silently."""
    inv = Inventory(
        ([("thor-1", {"ssh_hostname": "10.0.0.1"}), ("gw-1", {"ssh_hostname": "10.0.0.9"})], {}),
        thors=(["thor-1"], {**PINS, "service_api_key_file": str(api_key(tmp_path))}),
        **{group: (["gw-1"], {**PINS, "service_api_key_file": str(api_key(tmp_path))})})
    if not refused:
        settings_for_inventory(inv)
        return
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    assert (f"group {group!r}: nearly the role group "
            f"{'monitor' if group.lower().startswith('mon') else 'gateway'!r}") in \
        error.value.problems[0]


def test_ssh_files_that_do_not_exist_are_named_for_every_host_the_gateway_too(tmp_path):
    """pyinfra would fail the connection only once the run started; check names each, with the
    fix, beside the other problems."""
    key = tmp_path / "id_ed25519"
    inv = inventory(tmp_path, thor_hosts=[("thor-1", {"ssh_hostname": "10.0.0.1",
                                                       "ssh_key": str(key)})],
                    gateway_hosts=[("gw-1", {"ssh_hostname": "10.0.0.9", "gateway_port": 0,
                                             "ssh_known_hosts_file": str(tmp_path / "kh")})])
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    problems = error.value.problems
    assert f"thor-1: ssh_key={str(key)!r} does not exist on this machine: make one (ssh-keygen " \
           f"-t ed25519 -f {key}) or point ssh_key at yours" in problems, problems
    assert f"gw-1: ssh_known_hosts_file={str(tmp_path / 'kh')!r} does not exist on this " \
           f"machine: ssh-keyscan 10.0.0.9 >> {tmp_path / 'kh'}, once" in problems, problems
    assert any(p.startswith("gw-1: gateway_port=0") for p in problems), problems
    key.touch()
    (tmp_path / "kh").touch()
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    assert not any("does not exist" in p for p in error.value.problems), error.value.problems


def api_key(tmp_path):
    key = tmp_path / "api_key"
    key.write_text("sk-test-0123456789\n")
    key.chmod(0o600)
    return key


@pytest.mark.parametrize("gateway_data, refused", [
    ({}, True),  # the ssh_* data put in the Thors' group alone
    ({"ssh_user": "admin"}, False),
])
def test_a_gateway_left_without_the_thors_ssh_user_is_named(tmp_path, gateway_data, refused):
    inv = inventory(tmp_path, thor_hosts=[("thor-1", {"ssh_hostname": "10.0.0.1",
                                                       "ssh_user": "ubuntu"})],
                    gateway_hosts=[("gw-1", {"ssh_hostname": "10.0.0.9", **gateway_data})])
    found = [p for p in plan.ssh_file_problems(inv) if "ssh_user" in p]
    expected = ("gw-1: no ssh_user, while the Thors log in as 'ubuntu': set ssh_user (and ssh_key, "
                "ssh_known_hosts_file) in gw-1's group data too; the Thors' group data does not "
                "reach it")
    assert found == ([expected] if refused else [])


# --- a key per client at the door (gateway_clients) -----------------------------------------------

def client_files(tmp_path, **keys):
    """{name: path} of client key files holding `keys` (0600); a key of None: no file yet."""
    folder = tmp_path / "clients"
    folder.mkdir(mode=0o700, exist_ok=True)
    for name, key in keys.items():
        if key is not None:
            (folder / f"{name}.key").write_text(key + "\n")
            (folder / f"{name}.key").chmod(0o600)
    return {name: str(folder / f"{name}.key") for name in keys}


def ask(door, g, path, key=None, headers=None):
    """(status, JSON body) of a GET through the door, with `key` as the bearer; `headers`, a
    dict, gets the answer's (names in lower case)."""
    request = urllib.request.Request(f"https://[::1]:{door}{path}", headers={
        "Authorization": f"Bearer {key}"} if key else {})
    context = ssl.create_default_context(cafile=g.ca_file)
    try:
        answer = urllib.request.urlopen(request, timeout=10, context=context)
        got = answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        answer, got = error, (error.code, json.loads(error.read()))
    if headers is not None:
        headers.update({name.lower(): value for name, value in answer.headers.items()})
    return got


def test_each_client_opens_the_door_with_its_own_key_and_the_boxes_get_the_doors(tmp_path,
                                                                                 capsys):
    alice = "alice-key-0123456789abcdef"
    clients = client_files(tmp_path, alice=alice, bob=None)  # bob's key is made by the run
    boxes = []
    with running_door(tmp_path, gateway_data={"gateway_clients": clients},
                      servers_out=boxes) as (door, g, _):
        made = capsys.readouterr().err
        bob = (tmp_path / "clients" / "bob.key").read_text().strip()
        assert f"made a key for client bob at {tmp_path / 'clients' / 'bob.key'}" in made
        assert (tmp_path / "clients" / "bob.key").stat().st_mode & 0o777 == 0o600
        assert bob not in made
        for key in (alice, bob):
            status, body = ask(door, g, "/v1/models", key)
            assert status == 200 and body["auth"] == f"Bearer {BOX_KEY}", body
        asked = boxes[0].asked
        # no key, a key nobody holds, the boxes' own key, a key's digest: 401 at the door
        for key in (None, "mallory-key-0123456789abcdef", BOX_KEY,
                    hashlib.sha256(alice.encode()).hexdigest()):
            status, body = ask(door, g, "/v1/models", key)
            assert status == 401 and body["error"]["type"] == "invalid_api_key", (key, body)
        assert boxes[0].asked == asked  # ...and no box was asked
        health = urllib.request.urlopen(f"https://[::1]:{door}/health", timeout=10,
                                        context=ssl.create_default_context(cafile=g.ca_file))
        assert health.status == 200  # liveness needs no key: the door's own answer
        assert boxes[0].asked == asked
    # the door holds digests, never a key
    assert alice not in g.config_text + g.clients_map_text and bob not in g.clients_map_text
    assert hashlib.sha256(alice.encode()).hexdigest() in g.clients_map_text


def test_without_clients_the_door_opens_to_the_fleets_key_alone(tmp_path):
    """No gateway_clients: the clients map holds the fleet key's digest alone, under a name no
    client can have (the map holds it only without clients, too); the door refuses any other
    key from the headers, before the body, and counts no client."""
    g = gateway_settings(tmp_path)
    assert g.clients_map_text == f"{hashlib.sha256(BOX_KEY.encode()).hexdigest()} {FLEET_CLIENT}\n"
    assert g.box_key_map_text == f"box {BOX_KEY}\n" and BOX_KEY not in g.config_text
    assert not schema.CLIENT_NAME.fullmatch(FLEET_CLIENT)
    lines = [line.strip() for line in g.config_text.splitlines()]
    refused = lines.index("http-request deny deny_status 401 unless { var(txn.client) -m found }")
    assert refused < next(n for n, line in enumerate(lines) if "wait-for-body" in line)
    assert "track-sc0" not in g.config_text
    assert f"backend {layout.GATEWAY_CLIENT_TABLE}" not in g.config_text


def test_without_clients_the_fleets_key_opens_the_door_and_no_other_key_does(tmp_path):
    """The fleet's key is served, with the boxes' key sent on; no key, a wrong one, or the
    digest the map holds: 401 from the door, as JSON, and no box asked."""
    boxes = []
    with running_door(tmp_path, servers_out=boxes) as (door, g, _):
        status, body = ask(door, g, "/v1/models", BOX_KEY)
        assert status == 200 and body["auth"] == f"Bearer {BOX_KEY}", body
        digest = hashlib.sha256(BOX_KEY.encode()).hexdigest()
        for key in (None, "mallory-key-0123456789abcdef", digest):
            status, body = ask(door, g, "/v1/models", key)
            assert status == 401 and body["error"]["type"] == "invalid_api_key", (key, body)
        assert boxes[0].asked == 1


@pytest.mark.parametrize("thor_2", [
    {"service_api_key_file": "OTHER"},  # a key of its own: the door would open to one of two
    {"service_api_key_file": "ODD"},  # no bearer token: not one word of the header and the map
    {"service_api_key_file": None, "service_allow_no_api_key": "anywhere",
     "service_host": "0.0.0.0"},  # no key at all: a door open to anyone
], ids=["another-key", "not-a-bearer-token", "no-key"])
def test_without_clients_the_thors_share_one_bearer_key_or_are_refused(tmp_path, thor_2):
    keys = {"OTHER": "sk-test-another-0123456789", "ODD": "sk-test!odd#0123456789"}
    for name, key in keys.items():
        (tmp_path / name).write_text(key + "\n")
        (tmp_path / name).chmod(0o600)
    data = {k: str(tmp_path / v) if v in keys else v for k, v in thor_2.items()}
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, thor_hosts=[
            ("thor-1", {"ssh_hostname": "10.0.0.1"}),
            ("thor-2", {"ssh_hostname": "10.0.0.2", **data})]))
    assert [p for p in error.value.problems if "service_api_key_file" in p] == [
        ("gw-1: service_api_key_file: the door opens to the fleet's key (or to each client's, "
         "gateway_clients) and sends the boxes theirs, one for all: give every Thor the same one, "
         "of 16 to 512 letters, digits and -._~+/= (openssl rand -hex 24)")], error.value.problems


KEY_A, KEY_B = "sk-test-the-boxes-own-0123456789", "sk-test-another-0123456789"


@pytest.mark.parametrize("box_keys, said", [
    (set(), False),  # no Thor passed its own check: each one's line says why
    ({KEY_A}, False),
    ({KEY_A, KEY_B}, True),
    ({None}, True),  # a Thor that passed without a key: a door open to anyone
    ({"sk-test!odd#0123456789"}, True),
])
def test_the_gateway_speaks_of_the_thors_keys_only_from_thors_that_passed(box_keys, said):
    """Breaks with: box_key_problems taking no key at all (every Thor refused on its own) for
    keys that differ."""
    assert bool(plan.box_key_problems(box_keys)) is said


@pytest.mark.parametrize("thors_data", [
    {"weights_model_revision": None},  # only the pin missing
    {"mode": 0o644},  # only the API key file readable by others
], ids=["unpinned", "key-readable-by-others"])
def test_a_thor_setting_refused_is_not_also_blamed_on_the_gateway(tmp_path, thors_data):
    """What an operator saw: with only weights_model_revision missing (or a world-readable API key
    file) the gateway's line said "give every Thor the same one". Breaks with: box_key_problems
    taking no key at all for keys that differ."""
    inv = inventory(tmp_path)
    if "mode" in thors_data:
        (tmp_path / "api_key").chmod(thors_data["mode"])
    else:
        for h in thors(inv):
            h.data.weights_model_revision = None
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inv)
    problems = error.value.problems
    assert [p.split(":")[0] for p in problems] == ["thor-1", "thor-2"], problems


@pytest.mark.parametrize("keys, mode, fix", [
    ({"alice": "alice-key-0123456789abcdef"}, 0o644, "chmod 600"),
    ({"alice": "short"}, 0o600, "holds no key"),
    ({"alice": "has a space 0123456789abcdef"}, 0o600, "holds no key"),
    ({"alice": BOX_KEY}, 0o600, "holds the boxes' own key"),
    ({"alice": "same-key-0123456789abcdef", "bob": "same-key-0123456789abcdef"}, 0o600,
     "same key as client 'alice'"),
])
def test_a_client_key_the_door_cannot_trust_is_refused_naming_its_file(tmp_path, keys, mode, fix):
    clients = client_files(tmp_path, **keys)
    for path in clients.values():
        os.chmod(path, mode)
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, gateway_data={"gateway_clients": clients}))
    said = "\n".join(error.value.problems)
    assert fix in said and "gateway_clients[" in said, said
    assert not any(key in said for key in keys.values() if key != BOX_KEY or "boxes'" not in fix)


@pytest.mark.parametrize("clients, fix", [
    ({"Alice": "/k"}, "not a client name"),
    ({"a b": "/k"}, "not a client name"),
    ({"alice\nx": "/k"}, "not a client name"),
    ({}, "gateway_clients is empty"),
])
def test_a_client_name_that_would_break_out_is_refused(tmp_path, clients, fix):
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, gateway_data={"gateway_clients": clients}))
    assert any(fix in p for p in error.value.problems), error.value.problems


def test_a_client_over_its_limits_gets_429_and_another_is_still_served(tmp_path):
    clients = client_files(tmp_path, alice="alice-key-0123456789abcdef",
                           bob="bob-key-0123456789abcdef")
    keys = {name: Path(path).read_text().strip() for name, path in clients.items()}
    limits = {"gateway_clients": clients, "gateway_client_max_inflight": 1,
              "gateway_client_requests_per_minute": 4}
    with running_door(tmp_path, gateway_data=limits) as (door, g, _):
        slow = []
        first = threading.Thread(target=lambda: slow.append(ask(door, g, "/v1/slow",
                                                                keys["alice"])))
        first.start()
        time.sleep(0.5)
        headers = {}
        status, body = ask(door, g, "/v1/models", keys["alice"], headers)  # her second at once
        assert (status, headers["retry-after"]) == (429, str(g.gateway_retry_after_s)), body
        assert body["error"]["type"] == "rate_limit_exceeded"
        assert "gateway_client_max_inflight" in body["error"]["message"]
        assert ask(door, g, "/v1/models", keys["bob"])[0] == 200  # bob is served meanwhile
        first.join(10)
        assert slow[0][0] == 200
        # alice has started 2 this minute: the 5th is one too many
        answers = [ask(door, g, "/v1/models", keys["alice"], headers) for _ in range(3)]
        assert [status for status, _ in answers] == [200, 200, 429], answers
        assert headers["retry-after"] == "60"
        assert "gateway_client_requests_per_minute" in answers[-1][1]["error"]["message"]
        assert ask(door, g, "/v1/models", keys["bob"])[0] == 200


# --- each client's usage at the door: files/gateway/bin/thorfleet-door-usage on HAProxy's own table -----

USAGE = layout.FILES / "gateway" / "bin" / "thorfleet-door-usage"


def usage_tool():
    return box_program("thorfleet-door-usage")


def test_the_usage_tool_reads_where_the_deploy_puts_things():
    tool = usage_tool()
    unit = (layout.FILES / "gateway" / "systemd" / layout.GATEWAY_DOOR_USAGE_UNIT).read_text()
    host, port = layout.GATEWAY_DOOR_USAGE_LISTEN
    assert (tool.SOCKET, tool.TABLE) == (layout.GATEWAY_ADMIN_SOCKET, layout.GATEWAY_CLIENT_TABLE)
    assert (tool.CONFIG, tool.STATE, tool.MAP) == (
        layout.GATEWAY_DOOR_USAGE_CONFIG, layout.GATEWAY_DOOR_USAGE_STATE,
        layout.GATEWAY_BUDGET_MAP)
    assert tool.BUDGETS == TOKEN_BUDGETS
    assert f"{layout.GATEWAY_DOOR_USAGE} serve --listen {host}:{port}" in unit
    # its state folder, the one it may write (ProtectSystem=strict), is systemd's to make
    assert f"StateDirectory={layout.GATEWAY_DOOR_USAGE_STATE.removeprefix('/var/lib/')}" in unit
    assert tool.CLIENT.pattern == schema.CLIENT_NAME.pattern


def test_each_clients_usage_is_counted_at_the_door_and_exported(tmp_path):
    clients = client_files(tmp_path, alice="alice-key-0123456789abcdef",
                           bob="bob-key-0123456789abcdef")
    keys = {name: Path(path).read_text().strip() for name, path in clients.items()}
    limits = {"gateway_clients": clients, "gateway_client_max_inflight": 1}
    with running_door(tmp_path, gateway_data=limits) as (door, g, _):
        slow = threading.Thread(target=ask, args=(door, g, "/v1/slow", keys["alice"]))
        slow.start()
        time.sleep(0.5)
        assert ask(door, g, "/v1/models", keys["alice"])[0] == 429  # over her limit
        shown = subprocess.run([sys.executable, str(USAGE), "show", "--socket",
                                str(tmp_path / "admin.sock"), "--config",
                                str(tmp_path / "none.json"), "--state", str(tmp_path / "none")],
                               capture_output=True, text=True, check=True, timeout=30)
        slow.join(10)
        assert ask(door, g, "/v1/nothing-here", keys["bob"])[0] == 200  # the stand-in answers all
        text = usage_tool().ask(str(tmp_path / "admin.sock"), "show table clients")
    usage = json.loads(shown.stdout)["clients"]
    nothing = {"prompt": 0, "cached": 0, "completion": 0}
    assert usage["alice"] == {"requests": 2, "answers_4xx": 0, "answers_5xx": 0,
                              "refused": {"in_flight": 1, "rate": 0, "budget": 0},
                              "in_flight": 1, "tokens": {"today": nothing, "month": nothing},
                              "budget_left": dict.fromkeys(TOKEN_BUDGETS)}, usage
    assert set(usage) == {"alice"}  # bob had not asked yet
    tool = usage_tool()
    exported = tool.metrics(tool.rows(text))
    assert 'thorfleet_door_requests_total{client="alice"} 2' in exported, exported
    assert 'thorfleet_door_refused_total{client="alice",reason="in_flight"} 1' in exported
    assert 'thorfleet_door_requests_total{client="bob"} 1' in exported
    assert exported.count("# TYPE ") == 4 and len(exported.splitlines()) == 4 * 2 + 7 * 2


def test_prometheus_scrapes_the_doors_usage_only_where_it_runs_beside_it(tmp_path):
    clients = client_files(tmp_path, alice="alice-key-0123456789abcdef")
    with_clients = settings_for_inventory(inventory(tmp_path, gateway_data={
        "gateway_clients": clients}))["gw-1"].monitor_role.config_text
    assert "job_name: door" in with_clients and "127.0.0.1:9106" in with_clients, with_clients
    without = settings_for_inventory(inventory(tmp_path))["gw-1"].monitor_role.config_text
    assert "door" not in without


def test_each_answer_names_its_box_and_the_time_it_waited_at_the_door(tmp_path):
    """The box's answer with the door's two headers: the box (HAProxy's server name, the host's)
    and the wait for a slot: a second request behind a 2 s one on a box of one slot waits ~2 s."""
    with running_door(tmp_path) as (door, g, _):
        context = ssl.create_default_context(cafile=g.ca_file)
        url = f"https://[::1]:{door}/v1/models"

        def ask(path):
            with urllib.request.urlopen(keyed(url + path), timeout=30, context=context) as answer:
                return (answer.headers[layout.GATEWAY_BOX_HEADER],
                        int(answer.headers[layout.GATEWAY_QUEUED_HEADER]))

        assert ask("") == ("thor-1", 0)
        first = threading.Thread(target=ask, args=("?slow=1",))
        first.start()
        time.sleep(0.5)
        box, waited = ask("?slow=2")
        first.join()
        assert box == "thor-1" and 1000 <= waited <= 2500, waited
