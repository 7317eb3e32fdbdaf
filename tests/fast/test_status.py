"""`python -m thorfleet status`: each Thor's watchdog answer read into one row per host, the exit
status and stderr an operator scripts against, and every box asked at once over the deploy's own
SSH connection (a local paramiko server stands in for the boxes: no Docker)."""

import io
import json
import shlex
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest
from rich.console import Console

from sim import fleet
from tests.helpers import ROOT, accepting
from thorfleet.__main__ import main
from thorfleet.cli import status
from thorfleet.cli.pin import load_inventory
from thorfleet.plan import settings_for_inventory
from thorfleet.run import pyinfra_hooks
from thorfleet.settings import layout

RENDERED = "3f2a9c0d1e4b" + "5" * 52
KEY = "sk-status-test-0123456789abcdef"


def box(**over):
    """A serving box's `thorfleet-watchdog status`, as the contract spells it; `over` replaces
    top-level keys, `watchdog`/`requests` keys by dotted name (watchdog.state=...)."""
    answer = {"service": "thorfleet-vllm", "active": "active", "health": True,
              "fingerprint": RENDERED,
              "watchdog": {"running": True, "state": "ok", "last_check_ok": True,
                           "last_check_at": 1764600000, "why": "1-token completion in 0.2 s",
                           "failures": 0, "restarts_1h": 0, "restarts_24h": 1},
              "requests": {"running": 2.0, "waiting": 0.0},
              "decode_tok_s": 31.4, "eagle_acceptance": 0.62,
              "mem_available_bytes": 80 * 1024 ** 3, "power_mode": 0, "clocks_locked": True,
              "temperatures_c": {"cpu-thermal": 48.5, "gpu-thermal": 52.25}}
    for key, value in over.items():
        if "." in key:
            outer, inner = key.split(".")
            answer[outer][inner] = value
        else:
            answer[key] = value
    return answer


def one(answer, rendered=RENDERED):
    reply = status.Reply(answer) if isinstance(answer, dict) else status.Reply(None, answer)
    [found] = status.rows({"thor-1": reply}, {"thor-1": rendered})
    return found


def shown(found):
    return dict(zip((header for header, _ in status.COLUMNS), status.cells(found)))


STOPPED = box(active="inactive", health=False, requests=None, decode_tok_s=None,
              # the watchdog keeps its last check from before the stop
              **{"watchdog.state": "stopped", "watchdog.last_check_ok": True,
                 "watchdog.why": "thorfleet-vllm stopped (inactive/dead): not restarting"})
OVER_CAP = box(health=True, **{"watchdog.state": "over_cap", "watchdog.last_check_ok": False,
                               "watchdog.why": "3 restarts in the last hour (cap 3)"})
FAILING = box(**{"watchdog.state": "failing", "watchdog.last_check_ok": False,
                 "watchdog.why": "2 requests in flight, 0 tokens in 30 s"})

# (case, answer, rendered, serving, why, cells the table shows)
CASES = [
    ("serving", box(), RENDERED, True, "serving",
     {"version": "3f2a9c0d1e4b current", "health": "yes", "watchdog": "ok pass",
      "run/wait": "2/0", "tok/s": "31.4", "EAGLE": "0.62", "MemAvail": "80.0",
      "power": "0", "clocks": "yes", "°C": "52", "restarts": "1", "not serving": ""}),
    ("stale version serves", box(), "0" * 64, True, "serving",
     {"version": "3f2a9c0d1e4b stale"}),
    ("nothing proven yet", box(fingerprint=None), RENDERED, True, "serving",
     {"version": "none"}),
    ("stopped", STOPPED, RENDERED, False,
     ("not active (inactive); health false; watchdog stopped: thorfleet-vllm stopped "
     "(inactive/dead): not restarting"),
     {"health": "NO", "watchdog": "stopped", "run/wait": "-/-", "tok/s": "-"}),
    ("over cap", OVER_CAP, RENDERED, False,
     "watchdog over_cap: 3 restarts in the last hour (cap 3)",
     {"health": "yes", "watchdog": "over_cap FAIL"}),
    ("failing checks", FAILING, RENDERED, False,
     "watchdog failing: 2 requests in flight, 0 tokens in 30 s", {"watchdog": "failing FAIL"}),
    ("health false", box(health=False), RENDERED, False, "health false", {"health": "NO"}),
    ("held by a deploy", box(**{"watchdog.state": "held", "watchdog.last_check_ok": True}),
     RENDERED, True, "serving", {"watchdog": "held"}),
    ("watchdog not running", box(**{"watchdog.running": False}), RENDERED, True, "serving",
     {"watchdog": "not running"}),
    ("unreachable", "unreachable: Could not connect (timed out)", RENDERED, False,
     "unreachable: Could not connect (timed out)",
     {"version": "?", "health": "?", "watchdog": "?", "run/wait": "?/?", "tok/s": "?",
      "not serving": "unreachable: Could not connect (timed out)"}),
]


@pytest.mark.parametrize("case, answer, rendered, serves, why, cells", CASES,
                         ids=[c[0] for c in CASES])
def test_each_box_state_is_one_row_that_says_whether_it_serves(case, answer, rendered, serves,
                                                               why, cells):
    found = one(answer, rendered)
    assert tuple(found) == status.ROW_FIELDS
    assert status.serving(found) == (serves, why)
    assert (found["serving"], found["why"]) == (serves, why)
    table = shown(found)
    assert {k: table[k] for k in cells} == cells


def test_an_older_box_script_missing_fields_shows_question_marks_not_a_crash():
    older = {"active": "active", "health": True, "fingerprint": RENDERED,
             "watchdog": {"state": "ok"}, "requests": {"running": 1}}
    found = one(older)
    assert found["serving"] is True
    assert found["unknown"] == ["watchdog_running", "last_check_ok", "watchdog_why", "waiting",
                                "decode_tok_s", "eagle_acceptance", "mem_available_gib",
                                "power_mode", "clocks_locked", "temperature_max_c",
                                "restarts_24h"]
    table = shown(found)
    assert table["run/wait"] == "1/?"
    assert [table[k] for k in ("tok/s", "EAGLE", "MemAvail", "power", "clocks", "°C",
                               "restarts")] == ["?"] * 7
    assert table["watchdog"] == "ok"


def test_status_refuses_what_check_refuses_and_a_watch_of_no_seconds(capsys):
    assert main(["status", "inventory/example.py"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        ("thorfleet: inventory/example.py: no hosts: list your boxes in a group (uncomment the "
        "examples in inventory/example.py)")]
    assert main(["status", "inventory/example.py", "--watch", "0"]) == 2
    assert "--watch 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["status", "inventory/example.py", "--json", "--watch"])  # one or the other


def test_values_of_another_type_are_unknown_too():
    found = one(box(health="yes", power_mode="MAXN", mem_available_bytes=True,
                    temperatures_c={"cpu-thermal": "hot"}, watchdog=[]))
    assert found["health"] is None and "health" in found["unknown"]
    assert found["why"] == "health unknown"
    assert {"power_mode", "mem_available_gib", "watchdog", "restarts_24h"} <= set(
        found["unknown"])
    assert found["temperature_max_c"] is None  # no zone read as a number
    assert shown(found)["power"] == "?"
    assert one({})["unknown"] == list(status.BOX_FIELDS)


@pytest.mark.parametrize("code, out, err, said", [
    (0, json.dumps(box()), "", None),
    (1, json.dumps(box(health=False)), "", None),  # an answer is an answer, whatever the exit
    (1, "", "sudo: a password is required\n",
     ("watchdog status failed (exit 1): sudo: a password is required (ssh_user needs "
     "passwordless sudo, as for a deploy)")),
    (1, "", f"sudo: {layout.BOX_WATCHDOG}: command not found\n",
     (f"watchdog status failed (exit 1): sudo: {layout.BOX_WATCHDOG}: command not found "
     "(no watchdog on the box: deploy first)")),
    (0, "[1, 2]\n", "", "watchdog status failed (exit 0): [1, 2]"),
])
def test_the_boxs_answer_is_its_json_object_or_why_not(code, out, err, said):
    answer = status.reply(code, out, err)
    assert answer.error == said
    assert (answer.status is None) == (said is not None)


# --- the command, per host, from the inventory ---------------------------------------------------


@pytest.fixture
def inventory(tmp_path, monkeypatch):
    """A sim-like inventory (sim write_inventory) of three Thors, the second on its own
    service port, each at 127.0.0.1:<its ssh_port>."""
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path / "state"))
    hub = {"endpoint_in_sim": "http://thorfleet-hub:8000",
           "endpoint_local": "http://127.0.0.1:4711",
           "revisions": {fleet.MODEL_REPO: "a" * 40, fleet.DRAFT_REPO: "b" * 40}}
    fleet._record(["thor-1", "thor-2", "thor-3"], "registry:5000/vllm@sha256:" + "c" * 64, hub,
                  own_inventory=False)
    (tmp_path / "state" / "api_key").write_text(KEY + "\n")
    (tmp_path / "state" / "api_key").chmod(0o600)

    def write(ports=None, **data):
        hosts = [("thor-1", {}), ("thor-2", {"service_port": 8001}), ("thor-3", {})]
        hosts = [(name, {**d, **({"ssh_port": ports[name]} if ports else {})})
                 for name, d in hosts]
        path = fleet.write_inventory(tmp_path / "sim.py", hosts, {"rollout_batch": 1, **data})
        for name in ("id_ed25519", "known_hosts"):  # as `sim up` leaves them: check reads them
            (tmp_path / "state" / name).touch()
        found = load_inventory(path)
        return found, settings_for_inventory(found)

    return write


def test_each_host_is_asked_its_own_service_under_sudo_n_with_no_secret(inventory):
    hosts, settings = inventory()
    lines = {name: status.command(s) for name, s in settings.items()}
    assert lines == {
        name: f"sudo -n /opt/thorfleet/bin/thorfleet-watchdog status --service thorfleet-vllm "
              f"--port {port}" for name, port in (("thor-1", 8002), ("thor-2", 8001),
                                                  ("thor-3", 8002))}
    assert layout.BOX_WATCHDOG == "/opt/thorfleet/bin/thorfleet-watchdog"
    asked = []

    def run(host, line, timeout):
        asked.append((host.name, line))
        return 0, json.dumps(box(fingerprint=settings[host.name].fingerprint)), ""

    out, err = io.StringIO(), io.StringIO()
    assert status.show(hosts, settings, as_json=True, run=run, out=Console(file=out),
                       err=err) == 0
    assert sorted(asked) == sorted(lines.items())
    for name, line in asked:
        assert KEY not in line and settings[name].api_key not in line
        assert shlex.split(line)[:3] == ["sudo", "-n", layout.BOX_WATCHDOG]
    found = json.loads(out.getvalue())
    assert [(r["host"], r["version_state"]) for r in found] == [
        ("thor-1", "current"), ("thor-2", "current"), ("thor-3", "current")]
    assert err.getvalue() == ""


def test_the_exit_status_and_stderr_name_each_host_that_does_not_serve(inventory):
    hosts, settings = inventory()
    answers = {"thor-1": (0, json.dumps(box(fingerprint=settings["thor-1"].fingerprint)), ""),
               "thor-2": (0, json.dumps(STOPPED), "")}

    def run(host, line, timeout):
        if host.name == "thor-3":
            raise OSError("Could not connect ([Errno 111] Connection refused)")
        return answers[host.name]

    out, err = io.StringIO(), io.StringIO()
    code = status.show(hosts, settings, run=run, out=Console(file=out, width=200), err=err)
    assert code == 1
    assert err.getvalue().splitlines() == [
        ("thorfleet: thor-2: not serving: not active (inactive); health false; watchdog stopped: "
        "thorfleet-vllm stopped (inactive/dead): not restarting"),
        ("thorfleet: thor-3: not serving: unreachable: Could not connect ([Errno 111] "
        "Connection refused)")]
    table = out.getvalue()
    assert "thorfleet status: 1/3 serving" in table
    lines = {line.split()[0]: line for line in table.splitlines()[2:] if line.strip()}
    assert "current" in lines["thor-1"] and "stale" in lines["thor-2"]
    assert "unreachable" in lines["thor-3"]


def test_json_prints_every_row_with_every_field(inventory):
    hosts, settings = inventory()

    def run(host, line, timeout):
        return 0, json.dumps(box() if host.name != "thor-2" else OVER_CAP), ""

    out, err = io.StringIO(), io.StringIO()
    assert status.show(hosts, settings, as_json=True, run=run, out=Console(file=out),
                       err=err) == 1
    found = json.loads(out.getvalue())
    assert [tuple(r) for r in found] == [status.ROW_FIELDS] * 3
    assert [r["serving"] for r in found] == [True, False, True]
    assert found[0]["temperature_max_c"] == 52.25 and found[0]["mem_available_gib"] == 80.0
    assert err.getvalue().splitlines() == [
        "thorfleet: thor-2: not serving: watchdog over_cap: 3 restarts in the last hour (cap 3)"]


def test_watch_refreshes_until_ctrl_c_and_exits_with_the_last_refresh(inventory):
    hosts, settings = inventory()
    calls = {"n": 0}
    lock = threading.Lock()

    def run(host, line, timeout):
        with lock:
            calls["n"] += 1
            n = calls["n"]
        if n > 6:  # the third refresh of three hosts: the operator's Ctrl-C
            raise KeyboardInterrupt
        return 0, json.dumps(box() if n <= 3 or host.name != "thor-3" else STOPPED), ""

    out, err = io.StringIO(), io.StringIO()
    code = status.show(hosts, settings, watch=0.01, run=run, out=Console(file=out, width=200),
                       err=err)
    assert code == 1
    assert [line.split(":")[1].strip() for line in err.getvalue().splitlines()] == ["thor-3"]
    assert "thorfleet status: 2/3 serving" in out.getvalue()


def test_every_box_is_asked_at_once():
    hosts = [type("H", (), {"name": f"thor-{i}"})() for i in range(1, 5)]
    lock, now, most = threading.Lock(), [0], [0]
    both = threading.Barrier(4, timeout=5)

    def run(host, line, timeout):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            both.wait()  # returns only once all four are in: asked one after another, it breaks
        except threading.BrokenBarrierError:
            pass
        with lock:
            now[0] -= 1
        return 0, json.dumps(box()), ""

    replies = status.collect(hosts, {h.name: "x" for h in hosts}, run=run, timeout=1)
    assert most[0] == 4
    assert list(replies) == ["thor-1", "thor-2", "thor-3", "thor-4"]
    assert all(r.status for r in replies.values())


def test_one_box_failing_oddly_is_its_row_only():
    hosts = [type("H", (), {"name": n})() for n in ("thor-1", "thor-2")]

    def run(host, line, timeout):
        if host.name == "thor-1":
            raise TimeoutError
        return 0, json.dumps(box()), ""

    replies = status.collect(hosts, {"thor-1": "x", "thor-2": "x"}, run=run, timeout=3)
    assert replies["thor-1"] == status.Reply(None, "unreachable: no answer within 3 s")
    assert replies["thor-2"].status == box()


# --- the real connection: pyinfra's SSH connector against local SSH servers ----------------------


class Box(paramiko.ServerInterface):
    """An SSH server that lets in one user key and answers every command with `answer`."""

    def __init__(self, user_key, answer, commands):
        self.user_key, self.answer, self.commands = user_key, answer, commands

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        ok = username == "thor" and key.get_base64() == self.user_key.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        self.commands.append(command.decode())

        def answer():
            channel.sendall(self.answer.encode())
            channel.send_exit_status(0)
            # end of output, the channel left open: a close could reach the client before the
            # exec request's success reply does (paramiko would say "Channel closed")
            channel.shutdown_write()

        threading.Thread(target=answer, daemon=True).start()
        return True


class Boxes:
    """Local SSH servers, one per host, each with its own host key."""

    def __init__(self, user_key, answer):
        self.user_key, self.answer = user_key, answer
        self.commands, self.ports, self.keys = [], {}, {}
        self.sockets = []

    def start(self, name):
        key = paramiko.RSAKey.generate(1024)
        listener = socket.create_server(("127.0.0.1", 0))
        self.sockets.append(listener)
        self.ports[name], self.keys[name] = listener.getsockname()[1], key

        def handle(conn):
            transport = paramiko.Transport(conn)
            transport.add_server_key(key)
            transport.start_server(server=Box(self.user_key, self.answer, self.commands))

        accepting(listener, handle)

    def known_hosts(self, path: Path, names):
        path.write_text("".join(f"[127.0.0.1]:{self.ports[n]} ssh-rsa "
                                f"{self.keys[n].get_base64()}\n" for n in names))

    def close(self):
        for listener in self.sockets:
            listener.close()


@pytest.fixture
def boxes(tmp_path):
    user = paramiko.RSAKey.generate(1024)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    user.write_private_key_file(str(state / "id_ed25519"))  # the sim's key path, an RSA key
    found = Boxes(user, json.dumps(box()))
    for name in ("thor-1", "thor-2", "thor-3"):
        found.start(name)
    yield found
    found.close()


def test_the_boxes_are_asked_over_ssh_with_the_deploys_host_key_check(inventory, boxes,
                                                                       tmp_path):
    hosts, settings = inventory(ports=boxes.ports)
    # thor-3's host key is not the one the laptop knows: refused before any command is sent
    boxes.known_hosts(tmp_path / "state" / "known_hosts", ["thor-1", "thor-2"])
    known = (tmp_path / "state" / "known_hosts").read_text()
    other = paramiko.RSAKey.generate(1024).get_base64()
    (tmp_path / "state" / "known_hosts").write_text(
        known + f"[127.0.0.1]:{boxes.ports['thor-3']} ssh-rsa {other}\n")
    assert hosts.get_host("thor-1").data.get("ssh_strict_host_key_checking") == "yes"

    out, err = io.StringIO(), io.StringIO()
    began = time.monotonic()
    code = status.show(hosts, settings, as_json=True, timeout=5, out=Console(file=out), err=err)
    assert time.monotonic() - began < 5
    found = {r["host"]: r for r in json.loads(out.getvalue())}
    assert code == 1
    assert found["thor-1"]["serving"] and found["thor-2"]["serving"], found
    assert found["thor-3"]["why"].startswith("unreachable: SSH host key error"), found["thor-3"]
    assert sorted(boxes.commands) == sorted(status.command(settings[n])
                                            for n in ("thor-1", "thor-2"))


def test_a_box_the_laptop_does_not_know_is_not_asked(inventory, boxes, tmp_path):
    hosts, settings = inventory(ports=boxes.ports)
    boxes.known_hosts(tmp_path / "state" / "known_hosts", ["thor-1"])
    replies = status.collect(pyinfra_hooks.connectable(hosts, 5),
                             {n: status.command(s) for n, s in settings.items()}, timeout=5)
    assert replies["thor-1"].status == box()
    for name in ("thor-2", "thor-3"):
        assert replies[name].error.startswith("unreachable: SSH error"), replies[name]
        assert "No host key" in replies[name].error
    assert boxes.commands == [status.command(settings["thor-1"])]


def test_the_command_as_an_operator_runs_it(inventory, boxes, tmp_path):
    inventory(ports=boxes.ports)
    boxes.known_hosts(tmp_path / "state" / "known_hosts", ["thor-1", "thor-2", "thor-3"])
    done = subprocess.run([sys.executable, "-m", "thorfleet", "status", str(tmp_path / "sim.py"),
                           "--timeout", "5"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert "thorfleet status: 3/3 serving" in done.stdout
    lines = [line.split() for line in done.stdout.splitlines()]
    assert [words[:4] for words in lines if words and words[0].startswith("thor-")] == [
        [f"thor-{n}", "mistral-small-4", "3f2a9c0d1e4b", "stale"] for n in (1, 2, 3)]
    assert "model mistral-small-4: 3/3 serving" in done.stdout


@pytest.mark.parametrize("serving, said", [
    ({"a": True, "b": True, "c": True}, ["model m4: 2/2 serving", "model m4-256k: 1/1 serving"]),
    ({"a": False, "b": True, "c": True},
     ["model m4: 1/2 serving (not: a)", "model m4-256k: 1/1 serving"]),
    ({"a": True, "b": True, "c": False},
     ["model m4: 2/2 serving", "model m4-256k: 0/1 serving (not: c)  NONE LEFT"]),
])
def test_status_counts_the_boxes_serving_each_model(serving, said):
    models = {"a": "m4", "b": "m4", "c": "m4-256k"}
    table = [{"host": h, "model": models[h], "serving": up} for h, up in serving.items()]
    assert status.model_lines(table) == said


def test_the_doors_clients_are_a_line_each_or_one_line_saying_why_not():
    answer = status.Reply({"clients": {"alice": {
        "requests": 12, "answers_4xx": 1, "answers_5xx": 0,
        "refused": {"in_flight": 2, "rate": 0, "budget": 3}, "in_flight": 1,
        "tokens": {"today": {"prompt": 1500, "cached": 1200, "completion": 300},
                   "month": {"prompt": 25000, "cached": 9000, "completion": 5000}},
        "budget_left": {"tokens_per_minute": None, "tokens_per_day": 0,
                        "tokens_per_month": 970000}}}})
    assert status.client_lines(answer) == [
        "clients at the door (counted since HAProxy last started):",
        ("  alice: 12 requests, 1 at the door now; answers 4xx 1, 5xx 0; refused over its "
         "limits: 2 at once, 0 a minute, 3 over a budget"),
        ("    tokens today 1,800 (cached 1,200 of prompt 1,500), this month 30,000 (cached 9,000 "
         "of prompt 25,000); left: 0 of its tokens_per_day, 970,000 of its tokens_per_month")]
    # an older usage tool's answer (no tokens, no budget refusals): the line it had, said unknown
    old = status.Reply({"clients": {"bob": {"requests": 1, "answers_4xx": 0, "answers_5xx": 0,
                                            "refused": {"in_flight": 0, "rate": 0},
                                            "in_flight": 0}}})
    assert status.client_lines(old)[1:] == [
        ("  bob: 1 requests, 0 at the door now; answers 4xx 0, 5xx 0; refused over its limits: "
         "0 at once, 0 a minute, ? over a budget")]
    assert status.client_lines(status.Reply({"clients": {}}))[-1] == "  none has asked yet"
    gone = status.reply(1, "", "sudo: /usr/local/sbin/thorfleet-door-usage: command not found",
                        what="thorfleet-door-usage show")
    assert status.client_lines(gone) == [
        ("clients at the door: unknown (thorfleet-door-usage show failed (exit 1): sudo: "
         "/usr/local/sbin/thorfleet-door-usage: command not found (no thorfleet-door-usage on "
         "the box: deploy first))")]
    assert status.door_command() == f"sudo -n {layout.GATEWAY_DOOR_USAGE} show"


HELD, BACKUP = status.Reply({"holds": True}), status.Reply({"holds": False})
GONE = status.Reply(None, "unreachable: no answer within 10 s")


@pytest.mark.parametrize("answers, line, reachable", [
    ({"gw-1": HELD, "gw-2": BACKUP}, "held by gw-1 (gw-2: backup)", True),
    ({"gw-1": GONE, "gw-2": HELD}, "held by gw-2 (gw-1: unreachable: no answer within 10 s)", True),
    ({"gw-1": BACKUP, "gw-2": BACKUP},
     "held by no gateway (gw-1: backup; gw-2: backup): clients cannot reach the fleet", False),
    ({"gw-1": HELD, "gw-2": HELD}, "held by gw-1 and gw-2 at once: the LAN sees it twice", False),
    # unreachable is not "held by no gateway": keepalived's log is not where the fix is
    ({"gw-1": GONE, "gw-2": GONE},
     ("unknown, no gateway answered (gw-1: unreachable: no answer within 10 s; gw-2: "
      "unreachable: no answer within 10 s): reach them over SSH first"), False),
    ({"gw-1": GONE, "gw-2": BACKUP},
     ("held by no gateway that answered (gw-1: unreachable: no answer within 10 s; gw-2: "
      "backup): gw-1 may hold it; reach it over SSH, then see"), False),
])
def test_two_gateways_status_says_which_holds_the_doors_address(answers, line, reachable):
    lines, ok = status.address_lines("10.0.0.50", answers)
    assert len(lines) == 1 and lines[0].startswith(f"the door's address 10.0.0.50: {line}"), lines
    assert ok is reachable


def test_the_holder_is_asked_by_its_interfaces_with_the_address_quoted():
    command = status.holds_command("10.0.0.50")
    assert shlex.split(command)[:2] == ["sh", "-c"]
    for address, holds in (("127.0.0.1", True), ("10.0.0.50", False)):  # on lo here, or not
        done = subprocess.run(status.holds_command(address), shell=True, capture_output=True,
                              text=True, check=False)
        assert json.loads(done.stdout) == {"holds": holds}, done.stderr
