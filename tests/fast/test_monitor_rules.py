"""thorfleet's alerting rules and Grafana dashboard, checked by Prometheus's own promtool: the
rules pass their unit tests (each alert fires naming its box, and stays quiet for a well one),
and every expression the dashboard uses parses.

Fast: no Docker, no SSH; promtool from Debian's prometheus package (.ci/setup installs it).
"""

import itertools
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
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$host": ".*", "$client": "alice"}
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
# What the door's usage exporter (files/gateway/bin/thorfleet-door-usage, on each gateway at
# 127.0.0.1:9106, job `door`) serves, in its documented names: each series' labels, and each
# label's values. Today's four, and the tokens and budgets it is being extended with (the
# Clients row reads them): tokens so far in the UTC day or month; a budget's tokens left, no
# series for a budget the client does not have.
DOOR_SERIES = {
    "thorfleet_door_requests_total": ("client",),
    "thorfleet_door_answers_total": ("client", "class"),
    "thorfleet_door_refused_total": ("client", "reason"),
    "thorfleet_door_in_flight": ("client",),
    "thorfleet_door_tokens": ("client", "model", "kind", "period"),
    "thorfleet_door_budget_left": ("client", "budget"),
}
DOOR_LABELS = {
    "client": ("alice",),
    "class": ("4xx", "5xx"),
    "reason": ("in_flight", "rate", "budget"),
    "model": ("mistral-small-4",),
    "kind": ("prompt", "cached", "completion"),
    "period": ("day", "month"),
    "budget": ("tokens_per_minute", "tokens_per_day", "tokens_per_month"),
}
SCRAPE_LABELS = ("job", "instance")  # Prometheus's own, on every series it scrapes


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


def dashboard_exprs(per_client=None):
    """Every panel's expressions; per_client True: only those repeated per client (the Clients
    row's), False: only the others."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in panels(dashboard["panels"])
            if per_client is None or (panel.get("repeat") == "client") == per_client
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
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "host")
    assert variable["query"]["query"] == variable["definition"] == "label_values(up, host)"
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    for expr in dashboard_exprs(per_client=False):
        assert 'host=~"$host"' in expr, expr  # every box's panel follows the host picked


def test_the_dashboard_reads_vllm_s_and_the_box_s_names():
    names = {name for expr in dashboard_exprs(per_client=False)
             for name in re.findall(r"\b(vllm:[a-z_]+|thorfleet_[a-z_]+)\{", expr)}
    assert {n for n in names if n.startswith("vllm:")} == VLLM_NAMES
    used = {n for n in names if n.startswith("thorfleet_")}
    assert used <= THORFLEET_NAMES, used - THORFLEET_NAMES
    assert len(used) >= 10


# --- the Clients row: the door's usage, a panel per client -------------------------------------

def clients_row():
    """The panels under the row "Clients", up to the next row."""
    top = json.loads(DASHBOARD.read_text())["panels"]
    at = next(i for i, p in enumerate(top) if p["type"] == "row" and p["title"] == "Clients")
    after = top[at + 1:]
    return after[:next((i for i, p in enumerate(after) if p["type"] == "row"), len(after))]


def test_the_clients_row_repeats_each_figure_per_client():
    dashboard = json.loads(DASHBOARD.read_text())
    variable = next(v for v in dashboard["templating"]["list"] if v["name"] == "client")
    query = "label_values(thorfleet_door_requests_total, client)"
    assert variable["query"]["query"] == variable["definition"] == query
    assert variable["multi"] and variable["includeAll"]  # a repeat shows what it holds: all
    row = clients_row()
    assert [p["title"] for p in row] == [
        "Requests/s: $client", "Tokens today by kind: $client", "Tokens this month: $client",
        "Budget left: $client", "Refusals by reason: $client"]
    for panel in row:
        assert panel["repeat"] == "client", panel["title"]
        for target in panel["targets"]:
            assert 'client=~"$client"' in target["expr"], target  # each copy its own client
    stacked = [p["title"] for p in row
               if p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode")
               == "normal"]
    assert stacked == ["Tokens today by kind: $client", "Tokens this month: $client"]
    ids = [p["id"] for p in panels(dashboard["panels"])]
    assert len(ids) == len(set(ids))  # Grafana tells panels apart by id


def test_the_clients_panels_name_only_the_door_usage_exporter_s_series_and_labels():
    """Each expression of the Clients row: its series are the exporter's documented ones
    (DOOR_SERIES), each matched only by labels that series has, each fixed value one it takes;
    what it sums by and its legend are labels of what it reads."""
    row = clients_row()
    assert row
    for target in (t for p in row for t in p["targets"]):
        expr = target["expr"]
        words = set(re.findall(r"\bthorfleet_\w+", expr))
        selectors = re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", expr)
        assert words and words <= set(DOOR_SERIES), (expr, words - set(DOOR_SERIES))
        assert {name for name, _ in selectors} == words, expr  # none read without a selector
        read = set(SCRAPE_LABELS)
        for name, matchers in selectors:
            has = DOOR_SERIES[name]
            read |= set(has)
            for label, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', matchers):
                assert label in (*has, *SCRAPE_LABELS), (expr, name, label)
                if op == "=":
                    assert value in DOOR_LABELS[label], (expr, label, value)
        by = {label.strip() for group in re.findall(r"\bby\s*\(([^)]*)\)", expr)
              for label in group.split(",")}
        assert by <= read, (expr, by - read)
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target["legendFormat"]))
        assert legend <= (by or read), (expr, target["legendFormat"])


def door_input_series():
    """promtool's input series: every series DOOR_SERIES documents, for each value of each of
    its labels, as the door job scrapes it (a counter growing, a gauge held)."""
    found = []
    for name, labels in DOOR_SERIES.items():
        for values in itertools.product(*(DOOR_LABELS[label] for label in labels)):
            pairs = ", ".join(f'{k}="{v}"' for k, v in
                              {"job": "door", "instance": "127.0.0.1:9106",
                               **dict(zip(labels, values))}.items())
            found.append({"series": f"{name}{{{pairs}}}",
                          "values": "0+7x20" if name.endswith("_total") else "1000x20"})
    return found


def test_each_clients_panel_shows_data_from_the_documented_series(tmp_path):
    """promtool evaluates each expression of the Clients row over the documented series alone
    (door_input_series): each gives a result (absent() of it none), so none reads a series, a
    label or a label value the exporter does not have."""
    exprs = [as_promql(t["expr"]) for p in clients_row() for t in p["targets"]]
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": door_input_series(),
        "promql_expr_test": [{"expr": f"absent({expr})", "eval_time": "10m", "exp_samples": []}
                             for expr in exprs]}]}
    path = tmp_path / "clients.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    checked = promtool("test", "rules", path.name, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
