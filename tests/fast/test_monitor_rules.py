"""thorfleet's alerting rules and Grafana dashboard, checked by Prometheus's own promtool: the
rules pass their unit tests (each alert fires naming its box, and stays quiet for a well one),
and every expression the dashboard uses parses.

Fast: no Docker, no SSH; promtool from Debian's prometheus package (.ci/setup installs it).
"""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from thorfleet.settings import layout

MONITOR = layout.FILES / "monitor"
ALERTS = MONITOR / "alerts.yml"
ALERT_TESTS = MONITOR / "alerts.test.yml"
DASHBOARD = MONITOR / "grafana-dashboard.json"
# Grafana's own variables, as the dashboard's queries use them, set to what a query gets.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$host": ".*"}
# The vLLM 0.19.0 names the panels read (vllm/v1/metrics/loggers.py PrometheusStatLogger and
# vllm/v1/spec_decode/metrics.py SpecDecodingProm; prometheus_client adds _total to a counter,
# _bucket to a histogram's buckets).
VLLM_NAMES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total"}
# What the box exporter (thorfleet-watchdog) serves, in the contract's names.
THORFLEET_NAMES = {
    "thorfleet_power_mode", "thorfleet_clocks_locked", "thorfleet_mem_available_bytes",
    "thorfleet_temperature_celsius", "thorfleet_watchdog_check_ok", "thorfleet_watchdog_failures",
    "thorfleet_watchdog_over_cap", "thorfleet_watchdog_restarts_total",
    "thorfleet_watchdog_last_check_timestamp_seconds", "thorfleet_decode_tokens_per_second",
    "thorfleet_decode_gate_tokens_per_second", "thorfleet_serving_info"}


def promtool(*args, cwd=None):
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: .ci/setup installs Debian's prometheus package "
                    "(apt-get install --no-install-recommends prometheus)")
    return subprocess.run([found, *map(str, args)], cwd=cwd, check=False, capture_output=True,
                          text=True)


# The label an alert is about, and names first in each annotation: the box's inventory name, or
# for the door's alerts the client's (the door's series have no host: either gateway's
# Prometheus reads the same).
SUBJECT = {"ClientOverBudget": "client"}


def subject(alert):
    return SUBJECT.get(alert, "host")


def alerts():
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule]


def test_the_rules_pass_promtool_check_rules():
    checked = promtool("check", "rules", ALERTS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout


def test_the_rules_pass_their_unit_tests():
    checked = promtool("test", "rules", ALERT_TESTS.name, cwd=MONITOR)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_alerts_each_name_the_box_and_have_a_severity():
    assert [rule["alert"] for rule in alerts()] == [
        "ThorfleetBoxDown", "ThorfleetWatchdogDown", "ThorfleetFirewallNotLoaded",
        "ThorfleetNotGenerating", "ThorfleetDecodeSlow",
        "ThorfleetEagleAcceptanceLow", "ThorfleetMemAvailableLow", "ThorfleetWatchdogOverCap",
        "ClientOverBudget"]
    for rule in alerts():
        # info: a limit at work (a client's budget), seen at /alerts, nothing to mend
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        for text in rule["annotations"].values():
            assert text.startswith(f"{{{{ $labels.{subject(rule['alert'])} }}}}"), rule["alert"]


def test_every_alert_fires_naming_its_host_and_stays_quiet_otherwise():
    """The unit tests hold each alert to a firing case whose labels keep `host` (the client, for
    the door's: an aggregation that dropped it would fail there) and to a case with no alert at
    all."""
    cases = [case for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
             for case in test.get("alert_rule_test", [])]
    for rule in alerts():
        name = rule["alert"]
        fired = [a for case in cases if case["alertname"] == name for a in case["exp_alerts"]]
        assert fired, f"{name} has no firing case"
        for alert in fired:
            host = alert["exp_labels"].get(subject(name))
            assert host, f"{name}: an alert without the {subject(name)} label"
            assert host in alert["exp_annotations"]["description"], name
        assert any(case["alertname"] == name and case["exp_alerts"] == [] for case in cases), \
            f"{name} has no case where it stays quiet"


# --- the dashboard ------------------------------------------------------------------------------

def panels(items):
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard_exprs():
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in panels(dashboard["panels"])
            for target in panel.get("targets", [])]


def as_promql(expr):
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def test_every_dashboard_expression_parses_in_promtool(tmp_path):
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"thorfleet_dashboard:expr_{i}", "expr": as_promql(expr)}
        for i, expr in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_is_grafana_10_s_with_a_host_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] == 38  # Grafana 10.0's
    [variable] = dashboard["templating"]["list"]
    assert variable["name"] == "host"
    assert variable["query"]["query"] == variable["definition"] == "label_values(up, host)"
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    for expr in dashboard_exprs():
        assert 'host=~"$host"' in expr, expr  # every panel follows the host picked


def test_the_dashboard_reads_vllm_s_and_the_box_s_names():
    names = {name for expr in dashboard_exprs()
             for name in re.findall(r"\b(vllm:[a-z_]+|thorfleet_[a-z_]+)\{", expr)}
    assert {n for n in names if n.startswith("vllm:")} == VLLM_NAMES
    used = {n for n in names if n.startswith("thorfleet_")}
    assert used <= THORFLEET_NAMES, used - THORFLEET_NAMES
    assert len(used) >= 10
