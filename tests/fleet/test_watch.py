"""Serving stays proven between runs: the watchdog on every box, `status`, Prometheus and alerts.

The operator converges three boxes behind the gateway (which runs Prometheus). Then, with no
deploy running:
- a box's engine core is frozen (SIGSTOP on the process `docker top` names VLLM::EngineCore, as a
  hung GPU looks to vLLM's API server): /health stays 200, the watchdog restarts the server
  through the memory gate, and a chat succeeds again; the journal says why;
- a 1500-token stream runs through many watchdog intervals and is not restarted;
- a 48K-token prompt behind another, whose wait and prefill outlast a verdict with both token
  counters flat, is answered and not restarted (the KV cache's growth is the progress the watchdog reads);
- an engine that wedges after every start is restarted up to the cap, then left and reported
  failed (status, the gateway's check, the alert) until the operator restarts it;
- a server the operator stopped stays stopped; `status` names it and exits non-zero, and
  Prometheus fires the alert that names it;
- a box rebooted with Debian's nftables enabled keeps thorfleet's table and serves; rebooted with
  a ruleset nft refuses, its server stays down and its watchdog says why, until a deploy.

The edits that break them: the watchdog checking /health only (the frozen engine is never
restarted); every check taken as idle (the long stream is restarted); the KV rule left out of decide()
(the long prefill is restarted); no cap (restarts go on);
a stopped unit taken for a wedge (it is started again); the `host` label left out of the scrape
config (the alert names an address); a watchdog that never checks (the stories where nothing may
happen see no checks counted, or no "stopped" seen).

Uses boxes 10, 11 and 12 and the gateway box gw-1 (with test_gateway: one group).
"""

import concurrent.futures
import json
import subprocess
import sys
import time

import pytest

from tests.helpers import ROLLED_ENV, ROOT, SERVICE, box, deploy, outcome, wait_for
from thorfleet.settings.layout import RULESET_INCLUDE, SYSTEM_RULESET

GATEWAY = "gw-1"
# Short, so a story takes minutes: checks every 5 s, a verdict after 3 failed ones (15 s plus
# the completions' 5 s timeouts), no backoff; at most 2 restarts an hour on the cap's box (its
# host data), 10 on the others (a story re-run within the hour still has restarts left).
WATCHDOG = {"watchdog_interval_s": 5, "watchdog_failures": 3, "watchdog_timeout_s": 5,
            "watchdog_restart_backoff_s": 0, "watchdog_max_restarts_per_hour": 10,
            "monitor_scrape_interval_s": 5,
            "service_extra_env": ROLLED_ENV}  # as the gateway's stories left the servers
CAP = 2
WATCHDOG_UNIT = "thorfleet-watchdog"
# How a start is refused while thorfleet's firewall is not loaded: the server's drop-in
# (files/thor/systemd/thorfleet-vllm-firewall.conf), and the watchdog's guard (thorfleet-watchdog).
REFUSED = ("the server stays down", "so that the vLLM port answers nobody until it loads")
# A verdict (3 checks, each up to interval + timeout) and a start of the server (the stand-in
# loads in about a minute on two busy cores).
RESTART_S = 3 * (5 + 5) + 240


@pytest.fixture(scope="module")
def fleet(sim_fleet, my_boxes, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("watch")
    capped = my_boxes[1]  # the cap's story
    hosts = [(b, {"watchdog_max_restarts_per_hour": CAP}) if b == capped else b for b in my_boxes]
    inventory = sim_fleet.write_inventory(
        workdir / "watch.py", hosts=hosts, gateway=GATEWAY,
        extra_data={"rollout_report_path": str(workdir / "report.json"), **WATCHDOG})
    run = deploy(inventory)
    assert run.returncode == 0, outcome(run, my_boxes[0])
    return Watched(sim_fleet, inventory, (sim_fleet.state / "api_key").read_text().strip())


class Watched:
    def __init__(self, sim_fleet, inventory, key):
        self.sim, self.inventory, self.key = sim_fleet, inventory, key

    def journal(self, host, unit, since):
        """The unit's journal since `since`; a read that fails fails the story (box())."""
        return box(self.sim, host, f"journalctl -q -o cat -u {unit} --since '@{int(since)}' "
                                   "--no-pager")

    def watchdog(self, host):
        """The watchdog's own account (`thorfleet-watchdog status`): its state and how many
        checks it has made, so a story that expects nothing to happen can see it looked."""
        return json.loads(box(self.sim, host, "/opt/thorfleet/bin/thorfleet-watchdog status")
                          )["watchdog"]

    def engine_cores(self, host):
        """Host pids of the server's engine core process, as `docker top` lists them."""
        top = box(self.sim, host, f"docker top {SERVICE} -eo pid,args || true")
        return [line.split()[0] for line in top.splitlines()[1:] if "VLLM::EngineCore" in line]

    def freeze(self, host):
        cores = self.engine_cores(host)
        assert cores, f"no VLLM::EngineCore process on {host}"
        box(self.sim, host, f"kill -STOP {' '.join(cores)}")

    def completion(self, host, max_tokens=8, timeout=60, stream=False, prompt="def fib(n):",
                   body_file="/var/tmp/thorfleet-test-body.json"):
        """(curl's exit status, body) of a completion asked on the box itself (the firewall lets
        only the gateway in from outside)."""
        body = json.dumps({"model": "/model", "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0, "stream": stream,
                           **({"stream_options": {"include_usage": True}} if stream else {})})
        # the body in a file (a long prompt is past one argument's 128 KiB), on the box's disk
        # (Docker writes under a tmpfs like /run, where the box never sees it); the key from the
        # box's root-only secrets file into a root-only header file (printf is the shell's own):
        # never on a command line, where the box's process list would show it
        self.sim.put(host, body_file, body, mode=0o644)
        code, out = self.sim.exec(host, (
            "set -a; . /etc/thorfleet/secrets.env; set +a; umask 077; h=$(mktemp); "
            "printf 'Authorization: Bearer %s\\n' \"$VLLM_API_KEY\" > \"$h\"; "
            f"curl -sS -N -m {timeout} -H @\"$h\" -H 'Content-Type: application/json' "
            f"-d @{body_file} http://127.0.0.1:8002/v1/completions; c=$?; "
            "rm -f \"$h\"; exit $c"), timeout=timeout + 30)
        return code, out

    def healthy(self, host):
        return box(self.sim, host, "curl -s -o /dev/null -w '%{http_code}' "
                                   "http://127.0.0.1:8002/health || true")

    def gateway_check(self, host):
        """What the gateway's health check reads: the watchdog's /healthy."""
        return box(self.sim, host, "curl -s -w ' %{http_code}' http://127.0.0.1:9105/healthy "
                                   "|| true")

    def status(self, *extra):
        return subprocess.run([sys.executable, "-m", "thorfleet", "status", str(self.inventory),
                               *extra], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              check=False)

    def prometheus(self, path):
        return json.loads(box(self.sim, GATEWAY, f"curl -s 'http://127.0.0.1:9090{path}'"))

    def wait(self, what, timeout, every=3):
        return wait_for(what, timeout, every)

    def serves(self, host, timeout=RESTART_S):
        def answers():
            code, out = self.completion(host, timeout=20)
            return code == 0 and '"choices"' in out
        return self.wait(answers, timeout)


def test_a_frozen_engine_is_restarted_through_the_memory_gate(fleet, my_boxes):
    host = my_boxes[0]
    began = time.time()
    fleet.freeze(host)
    try:
        # vLLM's /health asks only whether the engine core died: still 200 with it frozen
        assert fleet.healthy(host) == "200"
        assert fleet.completion(host, timeout=5)[0] != 0  # nothing finishes
        said = fleet.wait(lambda: [line for line in fleet.journal(host, WATCHDOG_UNIT, began)
                                   .splitlines() if line.startswith(f"restarting {SERVICE}")],
                          3 * (5 + 5) + 30)
        assert said and "3 checks failed" in said[0], fleet.journal(host, WATCHDOG_UNIT, began)
    except BaseException:
        # the operator's fix, so no later story (this run's or the next on a kept fleet) meets a
        # frozen engine behind the gateway: a frozen box answers nothing, and HAProxy's
        # requests to it wait out `timeout server`
        box(fleet.sim, host, f"kill -CONT {' '.join(fleet.engine_cores(host))} 2>/dev/null; "
                             f"systemctl restart {SERVICE}")
        raise
    assert fleet.serves(host), fleet.journal(host, SERVICE, began)[-3000:]
    # the restart went through the unit's start, memory gate first
    assert "memory-gate:" in fleet.journal(host, SERVICE, began)
    assert fleet.wait(lambda: fleet.gateway_check(host).endswith(" 200"), 60)


def test_a_long_stream_runs_past_many_checks_and_is_not_restarted(fleet, my_boxes):
    host = my_boxes[0]
    began = time.time()
    checked = fleet.watchdog(host)["checks"]
    # 1500 tokens at the box's 33.7 tok/s: ~45 s, nine watchdog intervals
    code, out = fleet.completion(host, max_tokens=1500, timeout=240, stream=True)
    assert code == 0, out[-2000:]
    # every token streamed (vLLM may put several in one chunk: its usage counts them)
    usage = [json.loads(line[6:])["usage"] for line in out.splitlines()
             if line.startswith("data: {") and '"usage":{' in line.replace(" ", "")]
    assert usage and usage[-1]["completion_tokens"] == 1500, out[-2000:]
    assert '"finish_reason":"length"' in out.replace(" ", "")
    assert time.time() - began > 8 * 5  # eight watchdog intervals and more
    assert "restarting" not in fleet.journal(host, WATCHDOG_UNIT, began)
    # ...and not for want of looking: it checked the growing counters all through, and passed
    watchdog = fleet.watchdog(host)
    assert watchdog["checks"] - checked >= 6, watchdog
    assert watchdog["state"] == "ok" and watchdog["last_check_ok"] is True, watchdog


def test_a_long_prefill_outlasts_a_verdict_and_is_answered_not_restarted(fleet, my_boxes):
    """A 48K-token prompt behind another: at a Thor's prefill pace (sim/base/thor.py: about
    15 s for 48K tokens, 8,192 tokens a step) the second's first token comes after ~30 s, past
    three failed checks' verdict (~15 s), the box holding one request at a time (max_num_seqs 1:
    the second waits). Both token counters stay flat through each prefill; the KV cache fills
    chunk by chunk, and the watchdog reads that as progress."""
    host = my_boxes[0]
    began = time.time()
    checked = fleet.watchdog(host)["checks"]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(fleet.completion, host, max_tokens=4, timeout=180,
                            prompt=" hello" * 48000, body_file="/var/tmp/thorfleet-test-ahead.json")
        time.sleep(2)  # the one ahead is in first
        # another prompt from its first token: none of it in the first one's cached blocks
        code, out = fleet.completion(host, max_tokens=4, timeout=180, prompt=" world" * 48000)
        took = time.time() - began
        ahead_code, ahead_out = ahead.result()
    for c, o in ((ahead_code, ahead_out), (code, out)):
        assert c == 0 and '"choices"' in o, o[-2000:]
        assert json.loads(o)["usage"]["prompt_tokens"] >= 40000, o[-2000:]
    assert took > 3 * 5 + 5, took  # longer than a verdict takes
    assert "restarting" not in fleet.journal(host, WATCHDOG_UNIT, began)
    watchdog = fleet.watchdog(host)
    assert watchdog["checks"] - checked >= 4, watchdog
    assert watchdog["state"] == "ok" and watchdog["last_check_ok"] is True, watchdog


def test_an_engine_that_wedges_at_every_start_is_restarted_up_to_the_cap(fleet, my_boxes):
    host = my_boxes[1]
    began = time.time()
    # the cap counts the last hour's restarts, an earlier run's on this box too
    earlier = json.loads(box(fleet.sim, host, "/opt/thorfleet/bin/thorfleet-watchdog status")
                         )["watchdog"]["restarts_1h"]
    expected = max(0, CAP - earlier)
    # the operator's bad day: whatever starts wedges (a loop on the box freezes each new engine)
    box(fleet.sim, host, (
        "nohup setsid sh -c 'while true; do for p in $(docker top thorfleet-vllm -eo pid,args "
        "2>/dev/null | awk \"/VLLM::EngineCore/ {print \\$1}\"); do kill -STOP $p; done; "
        "sleep 1; done' >/dev/null 2>&1 & echo $! > /run/wedge.pid"))
    try:
        gave_up = fleet.wait(lambda: [line for line in fleet.journal(host, WATCHDOG_UNIT, began)
                                      .splitlines() if line.startswith(f"not restarting {SERVICE}")],
                             3 * RESTART_S, every=5)
        lines = fleet.journal(host, WATCHDOG_UNIT, began).splitlines()
        assert gave_up, "\n".join(lines)
        assert f"{max(earlier, CAP)} restarts in the last hour (cap {CAP})" in gave_up[0]
        assert len([line for line in lines if line.startswith(f"restarting {SERVICE}")]) == expected
        # reported failed: to the gateway, to status
        assert fleet.gateway_check(host).endswith(" 503")
        rows = {row["host"]: row for row in json.loads(fleet.status("--json").stdout)}
        assert rows[host]["watchdog"] == "over_cap" and not rows[host]["serving"], rows[host]
        # a whole verdict's checks more (each failing on the frozen engine), and still no restart
        checked = fleet.watchdog(host)["checks"]
        assert fleet.wait(lambda: fleet.watchdog(host)["checks"] >= checked + 3 + 1, 3 * (5 + 5) + 30,
                          every=5), fleet.watchdog(host)
        assert not [line for line in fleet.journal(host, WATCHDOG_UNIT, began).splitlines()
                    if line.startswith(f"restarting {SERVICE}")][expected:], "restarted past the cap"
        assert fleet.watchdog(host)["state"] == "over_cap"
    finally:
        # the operator's fix: the loop gone, the engine thawed, the server restarted
        box(fleet.sim, host, "kill $(cat /run/wedge.pid) 2>/dev/null; rm -f /run/wedge.pid; "
                             f"kill -CONT {' '.join(fleet.engine_cores(host))} 2>/dev/null; "
                             f"systemctl restart {SERVICE}")
    # a passing check clears the verdict
    assert fleet.serves(host)
    assert fleet.wait(lambda: fleet.gateway_check(host).endswith(" 200"), 60)


def test_a_stopped_server_stays_stopped_and_status_and_an_alert_name_it(fleet, my_boxes):
    # a serving fleet: status exits 0, one row per box
    fleet.wait(lambda: fleet.status().returncode == 0, RESTART_S, every=10)
    run = fleet.status()
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(name in run.stdout for name in my_boxes)
    # every box's vLLM and thorfleet_* series, each named by its box
    for query in ("vllm:num_requests_running", "thorfleet_watchdog_check_ok",
                  "thorfleet_mem_available_bytes"):
        found = fleet.wait(lambda q=query: {r["metric"].get("host") for r in fleet.prometheus(
            f"/api/v1/query?query={q}")["data"]["result"]} >= set(my_boxes), 60)
        assert found, query
    groups = fleet.prometheus("/api/v1/rules")["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules} >= {"ThorfleetBoxDown", "ThorfleetWatchdogOverCap"}
    assert all(r["health"] == "ok" for r in rules), rules

    host = my_boxes[2]
    began = time.time()
    box(fleet.sim, host, f"systemctl stop {SERVICE}")
    try:
        time.sleep(4 * 5)  # four watchdog intervals
        assert box(fleet.sim, host, f"systemctl is-active {SERVICE} || true") == "inactive"
        assert "restarting" not in fleet.journal(host, WATCHDOG_UNIT, began)
        # it looked, and saw the stop for what it is (it said "ok" before)
        watchdog = fleet.watchdog(host)
        assert watchdog["running"] and watchdog["state"] == "stopped", watchdog
        run = fleet.status()
        assert run.returncode != 0 and host in run.stderr, run.stdout + run.stderr
        assert not any(h in run.stderr for h in my_boxes if h != host), run.stderr

        def firing():
            alerts = fleet.prometheus("/api/v1/alerts")["data"]["alerts"]
            return [a for a in alerts if a["labels"].get("alertname") == "ThorfleetBoxDown"
                    and a["state"] == "firing"]

        alerts = fleet.wait(firing, 180, every=5)
        assert [a["labels"]["host"] for a in alerts] == [host], alerts
        assert host in alerts[0]["annotations"]["description"]
    finally:
        box(fleet.sim, host, f"systemctl start {SERVICE}")
    assert fleet.serves(host)


def test_a_firewall_that_fails_at_boot_keeps_the_server_down_and_says_why(fleet, my_boxes):
    """With a gateway the server waits for thorfleet's firewall at every boot: with Debian's
    nftables.service enabled (its /etc/nftables.conf begins `flush ruleset`), and that file the
    operator's own without the deploy's include of thorfleet's script (rewritten by their own
    tooling, say), the table is loaded after it and the box serves; with a broken ruleset the
    server stays down, not open to the LAN, and the watchdog (up, carrying no secret) reports it;
    the deploy puts it right, the include too. The edits that break it: no
    After=nftables.service (the flush removes the table), no drop-in (the server starts open).
    (With the include, a broken script fails the system's whole load as well: the fast test
    test_watchdog.test_the_system_ruleset_loads_thorfleets_table_in_its_own_transaction.)"""
    host = my_boxes[2]
    family, table = "inet", "thorfleet"
    assert box(fleet.sim, host, f"tail -n1 {SYSTEM_RULESET}") == RULESET_INCLUDE
    box(fleet.sim, host, f"sed -i '$d' {SYSTEM_RULESET}")  # the include is the file's last line
    box(fleet.sim, host, "systemctl enable nftables.service")
    try:
        fleet.sim.reboot(host)
        assert "flush ruleset" in box(fleet.sim, host, "cat /etc/nftables.conf")
        assert box(fleet.sim, host, "systemctl is-active nftables.service") == "active"
        box(fleet.sim, host, f"nft list table {family} {table} >/dev/null")  # after the flush
        assert fleet.serves(host)
        # a ruleset nft refuses, at the next boot
        box(fleet.sim, host, "echo 'table inet thorfleet { oops }' >> /etc/thorfleet/firewall.nft")
        booted = time.time()
        fleet.sim.reboot(host)
        assert box(fleet.sim, host, "systemctl is-active thorfleet-firewall || true") == "failed"
        # This boot's start is refused by whichever guard comes first: the drop-in's check, or
        # the watchdog's, which finds the table gone and stops a start already under way (both
        # run within a second of Docker's start). The server's first start comes after Docker's
        # and the clocks', which on a loaded machine is well past a fixed wait: look until then.
        def said():
            return (fleet.journal(host, SERVICE, booted)
                    + fleet.journal(host, WATCHDOG_UNIT, booted))
        refused = fleet.wait(lambda: any(why in said() for why in REFUSED), timeout=180)
        assert refused, said()
        assert box(fleet.sim, host, f"systemctl is-active {SERVICE} || true") != "active"
        # and any later start (a restart, the operator's) is refused by the drop-in itself
        code, _ = fleet.sim.exec(host, f"systemctl start {SERVICE}")
        assert code != 0
        assert REFUSED[0] in fleet.journal(host, SERVICE, booted)
        assert fleet.healthy(host) == "000"  # nothing listens on the vLLM port
        reading = json.loads(box(fleet.sim, host, "/opt/thorfleet/bin/thorfleet-watchdog status"))
        assert reading["firewall_loaded"] is False, reading
        assert "thorfleet_firewall_loaded 0.0" in box(fleet.sim, host,
                                                      "curl -s http://127.0.0.1:9105/metrics")
    finally:
        box(fleet.sim, host, "systemctl disable nftables.service")
        run = deploy(fleet.inventory)  # the operator's fix: the deploy writes and loads it again
    assert run.returncode == 0, outcome(run, host)
    assert fleet.serves(host)
    assert box(fleet.sim, host, f"tail -n1 {SYSTEM_RULESET}") == RULESET_INCLUDE
