"""The operator's first story: one command takes bare Thors to serving; a re-run changes nothing."""

import json
import warnings

import pytest

from tests.helpers import SERVICE, changed_on, deploy, downloads, hub, outcome

CHAT = json.dumps({"model": "/model", "max_tokens": 16,
                   "messages": [{"role": "user", "content": "Hello"}]})


def ask(sim_fleet, host, path="/v1/chat/completions", body=CHAT, key=True):
    """HTTP status of a request made on the box itself (a GET without a body), with the API key
    from the secrets file (read by the shell, so it never lands in a process's arguments) in a
    root-only header file that goes with the request (tests/fleet/test_security.py found it left
    readable by anyone when it was /run/thorfleet-test-header)."""
    header = ('. /etc/thorfleet/secrets.env; printf "Authorization: Bearer %s" "$VLLM_API_KEY" '
              '> "$h"; ' if key else "")
    _code, out = sim_fleet.exec(host, (
        f"sh -c 'umask 077; h=$(mktemp); {header}curl -s -o /dev/null -w %{{http_code}} -H @\"$h\" "
        f"-H \"Content-Type: application/json\" {'-d @-' if body else ''} "
        f"http://127.0.0.1:8002{path}; c=$?; rm -f \"$h\"; exit $c' <<'EOF'\n{body}\nEOF"))
    return out.strip()[-3:]


@pytest.fixture(scope="module")
def converged(sim_fleet, my_boxes, tmp_path_factory):
    inventory = sim_fleet.write_inventory(
        tmp_path_factory.mktemp("deploy") / "fleet.py", hosts=my_boxes,
        extra_data={"rollout_report_path": str(tmp_path_factory.mktemp("report") / "report.json")})
    for host in my_boxes:  # the story is a first install, whatever ran on these boxes before
        _, there = sim_fleet.exec(host, f"ls -d /etc/systemd/system/{SERVICE}.service "
                                        "/var/lib/thorfleet /opt/thorfleet 2>/dev/null; true")
        if there.strip():
            warnings.warn(f"{host} was not bare before the first install ({' '.join(there.split())})"
                          ": replaced with a bare box", stacklevel=1)
            sim_fleet.renew(host)
    logs = {host: hub(sim_fleet, host) for host in my_boxes}
    for log in logs.values():
        log.forget_requests()
    first = deploy(inventory)
    assert first.returncode == 0, first.stderr[-4000:]
    first.fetched = {host: downloads(log) for host, log in logs.items()}
    return inventory, first


def test_first_run_converges_every_host_and_they_answer_chat(sim_fleet, my_boxes, converged):
    _, first = converged
    assert first.failed_hosts == []
    for host in my_boxes:
        assert ask(sim_fleet, host) == "200"
        assert ask(sim_fleet, host, key=False) == "401"  # the API key guards /v1/*
        assert ask(sim_fleet, host, path="/health", body="") == "200"
        # bare boxes serve nothing, so there is nothing to roll: they start together, not by batch
        started = changed_on(first, host)
        assert any("| First installs: start" in op for op in started), outcome(first, host)
        assert not any("| Batch " in op for op in started), outcome(first, host)


def test_the_weights_cross_the_wan_once(my_boxes, converged):
    _, first = converged
    # the run's first host fetched every file; the other copied them all from it
    assert first.fetched[my_boxes[0]] and first.fetched[my_boxes[1]] == [], (
        first.fetched, first.stderr[-3000:])


def test_second_run_changes_nothing(converged):
    inventory, _ = converged
    again = deploy(inventory)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.failed_hosts == []
    assert again.changed == 0, again.stdout


def test_dry_run_on_a_converged_fleet_reports_nothing_to_change(converged):
    inventory, _ = converged
    dry = deploy(inventory, "--dry")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert dry.changed == 0, dry.stdout
