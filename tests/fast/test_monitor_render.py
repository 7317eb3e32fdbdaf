"""Prometheus on the monitor host as rendered on the laptop: its config passes `promtool check
config`, every Thor is scraped in both jobs under its inventory name, its arguments are plain
words both of Debian's readers take, and the inventory's monitor is checked before connecting.

Fast: no Docker, no SSH; promtool from Debian's prometheus package (.ci/setup installs it).
"""

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from pyinfra.api import Inventory

from thorfleet.gateway.monitor import (
    LISTEN,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DEFAULTS,
    PROMETHEUS_RULES,
    MonitorSettings,
    Target,
    defaults_text,
    plain_word,
    target,
)
from thorfleet.plan import settings_for_inventory
from thorfleet.settings import layout
from thorfleet.settings.roles import is_thor, monitors_of, thors
from thorfleet.settings.schema import SettingsError, check_monitor

PINS = {"weights_model_revision": "4" * 40, "weights_draft_revision": "5" * 40,
        "image_base": "registry.example/vllm@sha256:" + "a" * 64}
THORS = [("thor-1", {"ssh_hostname": "10.0.0.1"}), ("thor-2", {"ssh_hostname": "thor-2.lan"})]
GATEWAY = [("gw-1", {"ssh_hostname": "10.0.0.9"})]
PAIR = [*GATEWAY, ("gw-2", {"ssh_hostname": "10.0.0.8"})]
VIP = {"gateway_virtual_ip": "10.0.0.50/24"}
# Debian 12's prometheus package: how its unit reads /etc/default/prometheus.
DEBIAN_UNIT = Path("/lib/systemd/system/prometheus.service")


def promtool(*args):
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: .ci/setup installs Debian's prometheus package "
                    "(apt-get install --no-install-recommends prometheus)")
    return subprocess.run([found, *map(str, args)], check=False, capture_output=True, text=True)


def inventory(tmp_path, thor_hosts=THORS, monitor_hosts=None, gateway_data=None, monitor_data=None,
              with_gateway=False, gateway_hosts=GATEWAY):
    """Thors, and a gateway (the monitor by default) or, with `monitor_hosts`, a monitor group."""
    key = tmp_path / "api_key"
    key.write_text("sk-test-0123456789\n")
    key.chmod(0o600)
    groups = {"thors": ([n for n, _ in thor_hosts], {**PINS, "service_api_key_file": str(key)})}
    hosts = list(thor_hosts)
    if monitor_hosts is None or with_gateway:
        hosts += gateway_hosts
        groups["gateway"] = ([n for n, _ in gateway_hosts], {"gateway_ca_dir": str(tmp_path / "ca"),
                                                             **(gateway_data or {})})
    if monitor_hosts is not None:
        hosts += monitor_hosts
        groups["monitor"] = ([n for n, _ in monitor_hosts], monitor_data or {})
    return Inventory((hosts, {}), **groups)


def config_check(tmp_path, m):
    """promtool check config on m's config, its rule file (which check config reads too) the
    shipped alerts.yml, copied beside it."""
    rules = tmp_path / "rules" / "thorfleet.yml"
    rules.parent.mkdir(exist_ok=True)
    shutil.copy(layout.FILES / "monitor" / "alerts.yml", rules)
    config = yaml.safe_load(m.config_text)
    assert config["rule_files"] == [PROMETHEUS_RULES]
    config["rule_files"] = [str(rules)]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return promtool("check", "config", path)


def scraped(m):
    """{job: [(target, labels)]} of m's config, read back."""
    config = yaml.safe_load(m.config_text)
    return {job["job_name"]: [(t, c.get("labels")) for c in job["static_configs"]
                              for t in c["targets"]]
            for job in config["scrape_configs"]}


def test_the_gateway_is_the_monitor_and_its_config_passes_promtool_check_config(tmp_path):
    settings = settings_for_inventory(inventory(tmp_path, gateway_data={
        "monitor_scrape_interval_s": 30, "monitor_retention": "30d"}))
    m = settings["gw-1"].monitor_role
    assert isinstance(m, MonitorSettings) and m.name == "gw-1"
    checked = config_check(tmp_path, m)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout  # the rules it names were read
    assert scraped(m) == {
        "vllm": [("10.0.0.1:8002", {"host": "thor-1"}), ("thor-2.lan:8002", {"host": "thor-2"})],
        "thorfleet": [("10.0.0.1:9105", {"host": "thor-1"}),
                      ("thor-2.lan:9105", {"host": "thor-2"})]}
    config = yaml.safe_load(m.config_text)
    assert config["global"] == {"scrape_interval": "30s", "scrape_timeout": "10s",
                                "evaluation_interval": "30s"}
    assert [job["metrics_path"] for job in config["scrape_configs"]] == ["/metrics", "/metrics"]
    assert "--storage.tsdb.retention.time=30d" in m.defaults_text


def test_a_short_scrape_interval_keeps_the_timeout_within_it(tmp_path):
    # Prometheus refuses a scrape timeout longer than the interval (its default timeout is 10s)
    m = MonitorSettings(check_monitor({"monitor_scrape_interval_s": 5})[0], "mon",
                        [Target("thor-1", "10.0.0.1", 8002, 9105)])
    assert yaml.safe_load(m.config_text)["global"]["scrape_timeout"] == "5s"
    checked = config_check(tmp_path, m)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_config_promtool_refuses_is_seen_as_refused(tmp_path):
    # the breaking edit a test of the check needs: the same config with a key Prometheus lacks
    m = MonitorSettings(check_monitor({})[0], "mon", [Target("thor-1", "10.0.0.1", 8002, 9105)])
    m.__dict__["config_text"] = m.config_text.replace("scrape_interval:", "scrape_intervall:", 1)
    assert config_check(tmp_path, m).returncode != 0


def test_each_box_s_own_ports_and_an_ipv6_address_in_brackets(tmp_path):
    # a monitor of its own and no gateway: no firewall, so both families may be dialled
    settings = settings_for_inventory(inventory(tmp_path, thor_hosts=[
        ("thor-1", {"ssh_hostname": "fd00::1", "service_port": 8010, "watchdog_port": 9200,
                    # the fleet copies dial IPv4 and names only
                    "weights_source": "hub", "image_source": "build"}),
        ("thor-2", {"ssh_hostname": "10.0.0.2", "weights_peer_address": "thor-2.fleet:2222",
                    "weights_source": "hub", "image_source": "build"})],
        monitor_hosts=[("mon-1", {"ssh_hostname": "10.0.0.7"})]))
    m = settings["mon-1"].monitor_role
    assert scraped(m)["vllm"] == [("[fd00::1]:8010", {"host": "thor-1"}),
                                  ("thor-2.fleet:8002", {"host": "thor-2"})]
    assert scraped(m)["thorfleet"][0] == ("[fd00::1]:9200", {"host": "thor-1"})
    checked = config_check(tmp_path, m)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- where Prometheus runs ------------------------------------------------------------------------

def test_the_monitor_group_overrides_the_gateway_and_serves_no_model(tmp_path):
    inv = inventory(tmp_path, monitor_hosts=[("mon-1", {"ssh_hostname": "10.0.0.7"})],
                    monitor_data={"monitor_retention": "1w"})
    h = inv.get_host("mon-1")
    assert monitors_of(inv) == [h] and not is_thor(h)
    assert [t.name for t in thors(inv)] == ["thor-1", "thor-2"]
    m = settings_for_inventory(inv)["mon-1"]
    assert m.monitor_role is m and m.gateway_role is None
    assert [t.name for t in m.targets] == ["thor-1", "thor-2"]
    assert "--storage.tsdb.retention.time=1w" in m.defaults_text


def test_no_gateway_and_no_monitor_group_is_no_monitor(tmp_path):
    key = tmp_path / "api_key"
    key.write_text("sk-test-0123456789\n")
    key.chmod(0o600)
    inv = Inventory((THORS, {**PINS, "service_api_key_file": str(key)}))
    assert monitors_of(inv) == []
    assert all(s.monitor_role is None for s in settings_for_inventory(inv).values())


# (each host's role groups, where Prometheus runs): a monitor host of its own wins, else every
# gateway runs one, so losing either of a pair loses neither usage nor alerts
MONITORS = [
    ({"thor-1": ()}, []),
    ({"thor-1": (), "gw-1": ("gateway",)}, ["gw-1"]),
    ({"thor-1": (), "gw-1": ("gateway",), "gw-2": ("gateway",)}, ["gw-1", "gw-2"]),
    ({"thor-1": (), "mon-1": ("monitor",)}, ["mon-1"]),
    ({"thor-1": (), "gw-1": ("gateway",), "mon-1": ("monitor",)}, ["mon-1"]),
    ({"thor-1": (), "gw-1": ("gateway",), "gw-2": ("gateway",), "mon-1": ("monitor",)}, ["mon-1"]),
    ({"thor-1": (), "gw-1": ("gateway",), "gw-2": ("gateway", "monitor")}, ["gw-2"]),
    # refused by the settings, naming both (the next test)
    ({"thor-1": (), "mon-1": ("monitor",), "mon-2": ("monitor",)}, ["mon-1", "mon-2"]),
]


@pytest.mark.parametrize(("roles", "expected"), MONITORS)
def test_where_prometheus_runs(roles, expected):
    groups = {}
    for name, own in roles.items():
        for group in own:
            groups.setdefault(group, []).append(name)
    inv = Inventory((list(roles), {}), **{g: (names, {}) for g, names in groups.items()})
    assert [h.name for h in monitors_of(inv)] == expected


def test_two_gateways_each_run_one_prometheus_scraping_every_box_and_its_own_door(tmp_path):
    """No monitor host: each gateway of a pair scrapes every Thor and its own door's usage on
    loopback, from one config (the same labels on both: a reader of either sees one fleet)."""
    from tests.fast.test_gateway_render import client_files

    clients = client_files(tmp_path, alice="alice-key-0123456789abcdef")
    settings = settings_for_inventory(inventory(tmp_path, gateway_hosts=PAIR, gateway_data={
        **VIP, "gateway_clients": clients}))
    m1, m2 = settings["gw-1"].monitor_role, settings["gw-2"].monitor_role
    assert (m1.name, m2.name) == ("gw-1", "gw-2")
    assert m1.config_text == m2.config_text
    assert scraped(m2) == {
        "vllm": [("10.0.0.1:8002", {"host": "thor-1"}), ("thor-2.lan:8002", {"host": "thor-2"})],
        "thorfleet": [("10.0.0.1:9105", {"host": "thor-1"}),
                      ("thor-2.lan:9105", {"host": "thor-2"})],
        "door": [("127.0.0.1:9106", None)]}
    checked = config_check(tmp_path, m2)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the boxes' firewall lets in both gateways, so both Prometheus reach them
    assert settings["thor-1"].gateway_sources == ("10.0.0.9", "10.0.0.8")
    assert settings["thor-1"].monitor_source is None


def test_a_monitor_host_stays_the_one_prometheus_beside_two_gateways(tmp_path):
    settings = settings_for_inventory(inventory(
        tmp_path, gateway_hosts=PAIR, gateway_data=VIP, with_gateway=True,
        monitor_hosts=[("mon-1", {"ssh_hostname": "10.0.0.7"})]))
    assert settings["gw-1"].monitor_role is None and settings["gw-2"].monitor_role is None
    assert settings["mon-1"].monitor_role is settings["mon-1"]
    assert settings["thor-1"].monitor_source == "10.0.0.7"


def test_two_gateways_scraping_at_other_intervals_are_refused_naming_both(tmp_path):
    # their rules would see other samples, and fire at other times
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, gateway_data=VIP, gateway_hosts=[
            GATEWAY[0], ("gw-2", {"ssh_hostname": "10.0.0.8", "monitor_scrape_interval_s": 30})]))
    assert error.value.problems == [
        ("gw-1 and gw-2: monitor_scrape_interval_s differs between the two gateways (15 and 30): "
         "set it once, in the group `gateway`'s data")]


def test_two_monitors_and_a_monitor_s_bad_setting_are_refused_in_one_line_each(tmp_path):
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, monitor_hosts=[
            ("mon-1", {"ssh_hostname": "10.0.0.7"}), ("mon-2", {"ssh_hostname": "10.0.0.8"})]))
    assert error.value.problems == [
        "mon-1, mon-2: group `monitor` holds one host (one Prometheus scrapes the whole fleet)"]
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, monitor_hosts=[("mon-1", {})],
                                         monitor_data={"monitor_retention": "2 weeks"}))
    assert error.value.problems == [
        ("mon-1: monitor_retention='2 weeks' is not a Prometheus duration: digits and units y w d "
         "h m s ms in that order, like 15d or 1w2d")]
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, monitor_hosts=[("mon-1", {})], thor_hosts=[
            ("thor-1\nthor-2", {"ssh_hostname": "10.0.0.1"})]))
    assert error.value.problems == [
        ("'thor-1\\nthor-2': Prometheus labels each box's series and alerts with its inventory "
         "name (host), which an alert's one line cannot show with a newline or a control "
         "character in it: rename the host in the inventory")]


# --- values that reach prometheus.yml, any of them -------------------------------------------------

BREAKERS = [" ", "\n", "#", "'", '"', "\\", "$", "{{", "}", ": ", "- ", "&", "*", "!", "%", "\t",
            "\x00", "\u2028", "é", ":", "[", ","]
VALID = {"name": "thor-1", "address": "thor-1.lan"}


def broken(valid):
    return [valid[:at] + b + valid[at:] for b in BREAKERS
            for at in (0, len(valid) // 2, len(valid))]


CASES = [(key, value) for key, valid in VALID.items() for value in [valid, *broken(valid)]]


def test_any_inventory_value_is_refused_in_one_line_or_lands_as_itself(tmp_path):
    """A host's name (its `host` label: any printable text) and address (a host name or an IP
    address) through the monitor group (the gateway would hold names to HAProxy's rule first)."""
    landed = 0
    for key, value in CASES:
        v = {**VALID, key: value}
        inv = inventory(tmp_path, monitor_hosts=[("mon-1", {"ssh_hostname": "10.0.0.7"})],
                        thor_hosts=[(v["name"], {"ssh_hostname": "10.0.0.1",
                                                 "weights_peer_address": v["address"]})])
        try:
            m = settings_for_inventory(inv)["mon-1"]
        except SettingsError as error:
            assert all("\n" not in p.replace("\\n", "") for p in error.problems), error.problems
            continue
        landed += 1
        assert scraped(m) == {job: [(f"{v['address']}:{port}", {"host": v["name"]})]
                              for job, port in (("vllm", 8002), ("thorfleet", 9105))}, (key, value)
    assert landed > len(VALID)  # the valid values and the names a label takes land
    with pytest.raises(ValueError):
        target("10.0.0.1%eth0", 8002)
    with pytest.raises(ValueError):
        target("10.0.0.1", True)


# --- /etc/default/prometheus ---------------------------------------------------------------------

def test_the_arguments_are_plain_words_both_debian_readers_take(tmp_path):
    text = defaults_text("15d")
    words = [f"--config.file={PROMETHEUS_CONFIG}", f"--web.listen-address={LISTEN}",
             "--storage.tsdb.retention.time=15d"]
    # Debian's /etc/init.d/prometheus sources the file and runs `prometheus ... $ARGS`
    path = tmp_path / "prometheus"
    path.write_text(text)
    read = subprocess.run(["sh", "-c", f'. {shlex.quote(str(path))}; printf "%s\\n" $ARGS'],
                          check=True, capture_output=True, text=True)
    assert read.stdout.splitlines() == words
    # its prometheus.service: EnvironmentFile= and `$ARGS` split at whitespace
    assert DEBIAN_UNIT.exists(), "Debian's prometheus package is missing: .ci/setup installs it"
    unit = DEBIAN_UNIT.read_text().splitlines()
    assert f"EnvironmentFile={PROMETHEUS_DEFAULTS}" in unit
    assert "ExecStart=/usr/bin/prometheus $ARGS" in unit
    assert LISTEN == "127.0.0.1:9090"  # loopback only: the laptop comes through SSH
    for word in ("a b", "'x'", "$HOME", "", "a\nb"):
        with pytest.raises(ValueError):
            plain_word(word)


# --- the task, planned against a bare monitor host and a converged one ---------------------------

def planned_commands(tmp_path, box, monkeypatch):
    """{operation name: [command text]} of tasks/monitor.run planned and executed (bodies only:
    no box contacted) against `box`'s facts."""
    from io import StringIO

    from pyinfra.api import Config, State
    from pyinfra.api.state import StateStage
    from pyinfra.context import ctx_host, ctx_inventory, ctx_state

    from tasks import monitor as task

    monkeypatch.setenv("THORFLEET_BATCH_READS", "0")  # each read from the table, no round trip
    inv = inventory(tmp_path, monitor_hosts=[("mon-1", {"ssh_hostname": "10.0.0.7"})])
    m = settings_for_inventory(inv)["mon-1"]
    config_sha = __import__("hashlib").sha256(m.config_text.encode()).hexdigest()
    state = State(check_for_changes=False)
    state.init(inv, Config())
    state.current_stage = StateStage.Prepare
    h = inv.get_host("mon-1")
    h.get_fact = lambda fact, **_: box(fact, config_sha, **_)
    with ctx_state.use(state), ctx_inventory.use(inv), ctx_host.use(h):
        task.run(m)
        found = {}
        for op_hash in state.get_op_order():
            if op_hash in state.ops[h]:
                op = state.ops[h][op_hash]
                names = ", ".join(state.op_meta[op_hash].names).removeprefix("Monitor | ")
                found[names] = [str(getattr(c, "value", c)) if not isinstance(
                    getattr(c, "src", None), StringIO) else "upload"
                    for c in op.command_generator()]
    return found


def test_the_task_installs_checks_and_reloads_only_what_changed(tmp_path, monkeypatch):
    import hashlib

    from thorfleet import facts

    alerts_sha = hashlib.sha256((layout.FILES / "monitor" / "alerts.yml").read_bytes()).hexdigest()

    def bare(fact, config_sha, **_):  # as the package leaves it: installed, disabled
        table = {facts.lock.RunLock: {"held": True, "why": None}, facts.system.UnitEnabled: "disabled"}
        return table[fact] if fact in table else fact().default()

    commands = planned_commands(tmp_path, bare, monkeypatch)
    install = "Install Prometheus and promtool (the distribution's package, keeping those arguments)"
    assert any("apt-get install" in c and "prometheus" in c and "--force-confold" in c
               for c in commands[install])
    # its loopback-only arguments are in place before the package starts it the first time
    names = list(commands)
    assert names.index(next(n for n in names if n.startswith("Write Prometheus's arguments"))) \
        < names.index(install)
    text = "\n".join(c for cs in commands.values() for c in cs)
    assert "promtool check rules /etc/prometheus/rules/thorfleet.yml.thorfleet-tmp" in text
    assert "promtool check config /etc/prometheus/prometheus.yml.thorfleet-tmp" in text
    assert commands["Enable Prometheus at boot"] == ["systemctl enable prometheus.service"]

    def right(fact, config_sha, path=None, **_):
        m = MonitorSettings(check_monitor({})[0], "mon-1", [])
        sha = {PROMETHEUS_RULES: alerts_sha, PROMETHEUS_CONFIG: config_sha,
               PROMETHEUS_DEFAULTS: hashlib.sha256(m.defaults_text.encode()).hexdigest()}
        table = {facts.lock.RunLock: {"held": True, "why": None},
                 facts.system.DebInstalled: ["prometheus"], facts.system.UnitEnabled: "enabled",
                 facts.system.UnitActive: "active",
                 facts.system.PathState: {"type": "directory", "mode": "755", "user": "root",
                                   "group": "root"},
                 facts.system.FileState: {"type": "regular file", "sha256": sha.get(path), "mode": "644",
                                   "user": "root", "group": "root"}}
        return table[fact] if fact in table else fact().default()

    commands = planned_commands(tmp_path, right, monkeypatch)
    changing = {name: cs for name, cs in commands.items() if cs and "Reload" not in name
                and "Restart" not in name}
    assert changing == {}, changing  # a converged monitor host: nothing to do but the gated


def test_behind_a_gateway_a_monitor_of_the_other_family_than_a_box_is_refused(tmp_path):
    """The boxes' firewall (there with a gateway) lets the monitor's address in: Prometheus
    dialling an IPv6 box from its IPv4 address would be dropped."""
    with pytest.raises(SettingsError) as error:
        settings_for_inventory(inventory(tmp_path, thor_hosts=[
            ("thor-1", {"ssh_hostname": "fd00::1", "weights_source": "hub",
                        "image_source": "build"})],
            monitor_hosts=[("mon-1", {"ssh_hostname": "10.0.0.7"})], with_gateway=True,
            gateway_data={"gateway_fleet_address": "fd00::9"}))
    assert ("thor-1: the monitor dials it at fd00::1 (IPv6) while its firewall would let in "
            "10.0.0.7 (IPv4): set monitor_fleet_address to the monitor's address in the family "
            "it dials the boxes with") in error.value.problems
