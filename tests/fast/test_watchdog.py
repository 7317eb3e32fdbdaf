"""The box's watchdog (files/thor/bin/thorfleet-watchdog): its decision as a table, then the tool end to
end on temporary folders.

The box around it is stood in as for thorfleet-serve (tests/fast/test_thorfleet_serve.py): `systemctl`,
`nvpmodel` and `jetson_clocks` on PATH are one small script keeping the unit's state in a folder,
and vLLM is a local http.server whose completions can hang (a wedged engine: /health stays 200).
The tool runs from a folder of its own with thorfleet/box copied beside it as the package
thorfleet_box, as the box has them (layout.BOX_WATCHDOG, layout.BOX_LIB): the test
runs the import the box runs, not a fallback only a checkout has.

The edits that break the firewall's (in a network namespace): an existing table counted as loaded
however empty; the watchdog only reporting a table gone (not loading it again), or not stopping
the server when it cannot; the firewall unit without ExecReload (`systemctl reload nftables`);
the guard without its nft monitor (a table back only at its next look).
"""

import ast
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from argparse import Namespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tasks.watch import UNIT_TEMPLATE
from tests.fast.test_operations import run as plan_run
from tests.helpers import ROOT, box_package, free_port
from tests.parse_back import PINS, command_words, unit_entries
from thorfleet.box import readings
from thorfleet.facts import gateway as gateway_facts
from thorfleet.gateway.config import firewall_script
from thorfleet.operations import gateway as ops
from thorfleet.settings import layout, schema
from thorfleet.settings.render import Settings

TOOL = ROOT / "files" / "thor" / "bin" / "thorfleet-watchdog"
SERVICE = "thorfleet-vllm"
KEY = "sk-watchdog-key-0123456789"


def load_tool():
    """The tool as a module, its thorfleet_box being this checkout's thorfleet.box."""
    box_package()
    loader = importlib.machinery.SourceFileLoader("thorfleet_watchdog", str(TOOL))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


wd = load_tool()
SETTINGS = Namespace(failures=3, backoff=60, max_restarts_per_hour=3, give_up_after=6,
                     start_timeout=600)
RUNNING, WAITING, GENERATED = wd.RUNNING, wd.WAITING, wd.GENERATED


def idle(ok=True, server="100@1"):
    return {"service": SERVICE, "active": "active", "server": server, "held": None,
            "health": True, "metrics": {RUNNING: 0.0, WAITING: 0.0, GENERATED: 10.0},
            "probe": {"ok": ok, "why": "a 1-token completion answered 200 in 0.1 s" if ok else
                      "a 1-token completion did not answer within 20 s"}}


def busy(tokens, server="100@1", running=2.0):
    return {"service": SERVICE, "active": "active", "server": server, "held": None,
            "health": True, "metrics": {RUNNING: running, WAITING: 0.0, GENERATED: tokens}}


def unit_is(active):
    return {"service": SERVICE, "active": active, "server": "0@0"}


HELD = {"service": SERVICE, "active": "active", "server": "100@1",
        "held": "a thorfleet run holds the box (run.lock)"}


def replay(observations, memory=None, start=10_000.0, step=15.0, settings=SETTINGS):
    """[(action, state)] of each look, `step` seconds apart, and the memory after the last."""
    memory, seen = memory or dict(wd.FRESH), []
    for index, observation in enumerate(observations):
        action, memory = wd.decide(observation, memory, start + index * step, settings)
        seen.append((action, memory["state"]))
    return seen, memory


# --- the decision, as a table ----------------------------------------------------------------------

def test_an_idle_server_that_answers_is_ok():
    seen, memory = replay([idle(), idle()])
    assert seen == [("none", "ok")] * 2
    assert memory["last_check_ok"] is True and memory["failures"] == 0 and memory["checks"] == 2


def test_an_idle_server_that_does_not_answer_is_restarted_after_the_failures():
    seen, memory = replay([idle(ok=False)] * 3)
    assert seen == [("none", "failing"), ("none", "failing"), ("restart", "starting")]
    assert memory["why"] == ("3 checks failed (a 1-token completion did not answer within 20 s, "
                             "nothing running)")
    assert memory["restarts"] == [10_030.0] and memory["failures"] == 0


def test_a_long_answer_with_growing_tokens_is_never_a_wedge():
    seen, memory = replay([busy(100 + 30 * i, running=1) for i in range(40)])
    assert {action for action, _ in seen} == {"none"}
    assert seen[0] == ("none", "unknown")  # the first sample of a busy server is its baseline
    assert {state for _, state in seen[1:]} == {"ok"}
    assert memory["checks"] == 39  # every look after the baseline was a check, and counted
    assert memory["decode_tok_s"] == pytest.approx(2.0)


def prefilling(kv, server="100@1"):
    """One long prompt in prefill: both token counters flat, the KV cache taken chunk by chunk."""
    return {"service": SERVICE, "active": "active", "server": server, "held": None,
            "health": True, "metrics": {RUNNING: 1.0, WAITING: 0.0, GENERATED: 500.0,
                                        wd.PROMPTED: 900.0, wd.KV_USAGE: kv}}


def test_a_256k_prompt_prefilling_for_minutes_is_no_wedge_and_a_freeze_inside_it_is():
    """The 256K profile on a Thor: 262,144 tokens at 8,192 a step (max_num_batched_tokens) is 32
    chunks, minutes of prefill with vLLM's token counters flat (a prefill counts once it ends).
    Checked every 15 s for 8 minutes, the KV cache grows at every look; frozen in the middle of
    it, nothing grows, and the server is restarted after the failures, as any wedge is."""
    kv = [0.01 + 0.027 * i for i in range(33)]
    seen, memory = replay([prefilling(k) for k in kv])
    assert seen[0] == ("none", "unknown")  # the first sample of a busy server is its baseline
    assert {action for action, _ in seen} == {"none"} and {s for _, s in seen[1:]} == {"ok"}
    assert memory["why"] == "1 requests in flight, prefilling: KV cache 84.7 % -> 87.4 % in 15 s"
    frozen, memory = replay([prefilling(kv[-1])] * 3, memory=memory, start=10_000 + 15 * 33)
    assert frozen == [("none", "failing"), ("none", "failing"), ("restart", "starting")]


def test_requests_in_flight_with_no_token_growing_fail():
    seen, memory = replay([busy(500)] * 4)
    assert seen == [("none", "unknown"), ("none", "failing"), ("none", "failing"),
                    ("restart", "starting")]
    assert memory["why"] == "3 checks failed (2 requests in flight, 0 tokens in 45 s)"


def test_a_stopped_service_is_never_restarted():
    for active in ("inactive", "failed", "deactivating"):
        seen, memory = replay([idle(ok=False)] * 2 + [unit_is(active)] * 10)
        assert [a for a, _ in seen] == ["none"] * 12, active
        assert memory["state"] == "stopped" and memory["failures"] == 0, active


def test_a_service_starting_has_no_verdict():
    seen, _ = replay([unit_is("activating")] * 5)
    assert seen == [("none", "starting")] * 5
    # a started unit whose server has not answered /health yet: starting, until --start-timeout
    loading = {**idle(ok=False), "health": False}
    seen, memory = replay([loading] * 45)
    assert seen[:40] == [("none", "starting")] * 40
    assert seen[40] == ("none", "failing")
    assert memory["why"].startswith("no /health answer 600 s after the server started")


def test_a_held_box_is_left_alone_and_its_failures_reset():
    seen, _ = replay([idle(ok=False)] * 2 + [HELD] * 3 + [idle(ok=False)] * 3)
    assert seen == [("none", "failing")] * 2 + [("none", "held")] * 3 + \
        [("none", "failing"), ("none", "failing"), ("restart", "starting")]


def test_restarts_back_off_then_stop_at_the_cap():
    # the server wedges again after every start; each restart gives a new MainPID
    memory, seen, server = dict(wd.FRESH), [], 0
    for index in range(24):
        action, memory = wd.decide(idle(ok=False, server=f"{server}@{server}"), memory,
                                   10_000 + 15 * index, SETTINGS)
        seen.append((action, memory["state"]))
        server += action == "restart"
    actions = [action for action, _ in seen]
    restarts = [10_000 + 15 * i for i, action in enumerate(actions) if action == "restart"]
    # the first after 3 failures; the next 60 s (the backoff) after it, the third 120 s after that
    assert restarts == [10_030, 10_090, 10_210]
    assert actions.count("give_up") == 1 and actions.index("give_up") == 17
    assert memory["state"] == "over_cap" and memory["over_cap"] is True
    assert memory["why"].startswith("3 restarts in the last hour (cap 3); box reported failed")
    assert seen[-1] == ("none", "over_cap")  # said once, not again at every check


def test_a_backoff_is_counted_from_the_last_restart():
    memory = {**wd.FRESH, "restarts": [10_000.0], "server": "1@1", "answered": True}
    seen, memory = replay([idle(ok=False, server="1@1")] * 3, memory=memory, start=10_015)
    assert seen[-1] == ("none", "failing")
    assert "backing off: the next restart may come 15 s from now" in memory["why"]


def test_a_pass_after_give_up_clears_it():
    memory = {**wd.FRESH, "restarts": [9_000.0, 9_500.0, 9_900.0]}
    seen, memory = replay([idle(ok=False)] * 4 + [idle()], memory=memory)
    assert [a for a, _ in seen] == ["none", "none", "give_up", "none", "none"]
    assert seen[-1] == ("none", "ok")
    assert memory["over_cap"] is False and memory["failures"] == 0


@pytest.mark.parametrize(("restarts", "cap", "expected"), [
    ([7_000.0, 7_500.0, 7_900.0], 3, ["none", "none", "none"]),  # still capped: the hour holds 3
    ([7_000.0, 7_500.0, 7_900.0], 10, ["none", "none", "restart"]),  # the cap raised by a deploy
    ([1_000.0, 1_500.0, 1_900.0], 3, ["none", "none", "restart"]),  # the hour gone by
])
def test_a_box_left_capped_restarts_again_once_the_cap_allows(restarts, cap, expected):
    memory = {**wd.FRESH, "restarts": restarts, "over_cap": True, "state": "over_cap",
              "server": "100@1", "answered": True}
    seen, memory = replay([idle(ok=False)] * 3, memory=memory,
                          settings=Namespace(**{**vars(SETTINGS), "max_restarts_per_hour": cap}))
    assert [action for action, _ in seen] == expected
    assert memory["over_cap"] is (expected[-1] == "none")


def test_a_box_that_fails_for_good_is_given_up_after_the_bound_and_the_hour_does_not_clear_it():
    """The hourly cap only paused a box that never recovers (18 restarts in 6 h on the sim): after
    watchdog_give_up_after restarts with no check passing between them, none until one passes."""
    settings = Namespace(**{**vars(SETTINGS), "max_restarts_per_hour": 10, "give_up_after": 2,
                            "backoff": 0})
    seen, memory = replay([idle(ok=False)] * 9, settings=settings)
    assert [a for a, _ in seen] == ["none", "none", "restart", "none", "none", "restart",
                                    "none", "none", "give_up"]
    assert memory["given_up"] and memory["over_cap"] and memory["state"] == "over_cap"
    assert memory["why"].startswith("2 restarts in a row and no check passed since "
                                    "(watchdog_give_up_after 2): given up until a check passes")
    # two hours on, the cap's hour long gone: still given up, said once
    later, memory = replay([idle(ok=False)] * 3, memory=memory, start=10_000 + 7200,
                           settings=settings)
    assert [a for a, _ in later] == ["none"] * 3 and memory["over_cap"]
    # the operator (or a deploy) restarts it and it serves: a pass clears it all
    after, memory = replay([idle(server="7@7")], memory=memory, start=10_000 + 7300,
                           settings=settings)
    assert after == [("none", "ok")] and not memory["given_up"] and memory["unproven"] == 0


def test_restarts_that_come_good_do_not_add_up_to_the_bound():
    settings = Namespace(**{**vars(SETTINGS), "max_restarts_per_hour": 10, "give_up_after": 2,
                            "backoff": 0})
    seen, _ = replay(([idle(ok=False)] * 3 + [idle()]) * 3, settings=settings)
    assert [a for a, _ in seen].count("restart") == 3 and "give_up" not in [a for a, _ in seen]


def test_a_restart_of_the_server_resets_the_token_baseline():
    # the same counter value from a new server (a new MainPID and start time) is no stall
    seen, memory = replay([busy(500)] * 3 + [busy(500, server="200@9"), busy(520, server="200@9")])
    assert seen == [("none", "unknown"), ("none", "failing"), ("none", "failing"),
                    ("none", "unknown"), ("none", "ok")]
    assert memory["failures"] == 0
    assert memory["checks"] == 3  # the count goes on across servers: baselines are no checks


# --- the tool on temporary folders -----------------------------------------------------------------

FAKE_BOX = r"""#!/bin/sh
# systemctl, docker, nvpmodel and jetson_clocks as the watchdog uses them; the unit's state in
# $FAKE_BOX.
box=$FAKE_BOX
echo "$(basename "$0") $*" >> "$box/calls"
case "$(basename "$0")" in
systemctl)
    case "$1" in
    show) cat "$box/unit" ;;
    is-active) sed -n 's/^ActiveState=//p' "$box/unit" ;;
    try-restart)
        # systemd's try-restart: a restart job for a unit active or activating, else nothing
        grep -qE '^ActiveState=(active|activating)$' "$box/unit" || exit 0
        n=$(($(cat "$box/restarts" 2>/dev/null || echo 0) + 1)); echo $n > "$box/restarts"
        printf 'ActiveState=active\nSubState=running\nMainPID=%s\nExecMainStartTimestampMonotonic=%s\n' \
            $((1000 + n)) $n > "$box/unit" ;;
    esac ;;
nvpmodel) printf 'NVPM WARN: fan mode is not set!\nNV Power Mode: 120W\n1\n' ;;
jetson_clocks) cat "$box/clocks" ;;
esac
"""

THOR_LOCKED = """\
cpu0:  Governor=schedutil MinFreq=2601000 MaxFreq=2601000 CurrentFreq=2601000 IdleStates: WFI=0
gpu-gpc-0 MinFreq=1575000000 MaxFreq=1575000000 CurrentFreq=1575000000
EMC MinFreq=665600000 MaxFreq=4266000000 CurrentFreq=4266000000 FreqOverride=1
"""


class FakeVllm(BaseHTTPRequestHandler):
    """vLLM's routes the watchdog reads. `box.hang`: completions never answer (a frozen engine:
    /health stays 200) until the fake unit is restarted; `box.tokens`: the counter /metrics shows
    (`box.grow` added at each read)."""

    box = None

    def do_GET(self):
        box = self.box
        box.keys.add(self.headers.get("Authorization"))
        if self.path == "/health":
            return self.answer(box.health, "")
        if self.path == "/v1/models":
            return self.answer(200, json.dumps({"data": [{"id": "/model"}]}))
        if self.path == "/metrics":
            box.tokens += box.grow
            return self.answer(200, (
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{engine="0",model_name="/model"}} {box.running}\n'
                'vllm:num_requests_waiting{engine="0",model_name="/model"} 0.0\n'
                f'vllm:generation_tokens_total{{engine="0",model_name="/model"}} {box.tokens}\n'
                'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/model"} 400.0\n'
                'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/model"} 300.0\n'))
        self.answer(404, "")

    def do_POST(self):
        box = self.box
        box.keys.add(self.headers.get("Authorization"))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        box.completions.append(body)
        if len(box.completions) == box.stop_at_completion:  # the operator stops it meanwhile
            box.set_unit("inactive", "dead")
        if box.hang and not (box.folder / "restarts").exists():
            box.release.wait(10)  # the engine is frozen: nothing comes back
            return
        self.answer(200, json.dumps({"choices": [{"text": "p"}]}))

    def answer(self, status, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_):
        pass


class Box:
    """A Thor stood in on temporary folders: the layout, the fake unit, vLLM, the tool's folder."""

    def __init__(self, tmp_path, active="active"):
        self.folder = tmp_path / "box"
        self.stubs = tmp_path / "stubs"
        self.bin = tmp_path / "bin"  # layout.BOX_BIN as the deploy fills it
        for folder in (self.folder, self.stubs, self.bin):
            folder.mkdir()
        shutil.copy(TOOL, self.bin / Path(layout.BOX_WATCHDOG).name)
        shutil.copytree(ROOT / "thorfleet" / "box", self.bin / Path(layout.BOX_LIB).name,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for tool in ("systemctl", "docker", "nvpmodel", "jetson_clocks"):
            (self.stubs / tool).write_text(FAKE_BOX)
            (self.stubs / tool).chmod(0o755)
        self.set_unit(active, "dead" if active == "inactive" else "running")
        (self.folder / "clocks").write_text(THOR_LOCKED)
        self.state_dir, self.run_dir = tmp_path / "state", tmp_path / "run"
        self.state_dir.mkdir()
        (self.state_dir / "proven-fingerprint").write_text("f" * 64)
        secrets = tmp_path / "secrets.env"
        secrets.write_text(f"VLLM_API_KEY={KEY}\n")
        self.layout = tmp_path / "layout.env"
        self.layout.write_text(f"STATE_DIR={self.state_dir}\nSECRETS_ENV={secrets}\n"
                               f"RUN_DIR={self.run_dir}\nUSAGE_DIR={tmp_path / 'usage'}\n")
        self.meminfo = tmp_path / "meminfo"
        self.meminfo.write_text("MemTotal: 127534464 kB\nMemAvailable: 99000000 kB\n")
        self.thermal = tmp_path / "thermal"
        (self.thermal / "thermal_zone0").mkdir(parents=True)
        (self.thermal / "thermal_zone0" / "type").write_text("cpu-thermal\n")
        (self.thermal / "thermal_zone0" / "temp").write_text("47250\n")
        self.hang, self.running, self.tokens, self.grow = False, 0.0, 10.0, 0.0
        self.health = 200  # what vLLM's /health answers
        self.stop_at_completion = None  # the unit stopped while this completion hangs
        self.keys, self.completions, self.release = set(), [], threading.Event()
        self.exporter_port = free_port()
        handler = type("Handler", (FakeVllm,), {"box": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.process = None

    def set_unit(self, active, sub="running"):
        (self.folder / "unit").write_text(f"ActiveState={active}\nSubState={sub}\nMainPID=1000\n"
                                          "ExecMainStartTimestampMonotonic=1\n")

    def command(self, *words, named=True):
        """The tool's command line; `named`: told the server's service and port."""
        server = ["--service", SERVICE, "--port", str(self.server.server_port)] if named else []
        return [sys.executable, str(self.bin / "thorfleet-watchdog"), *words,
                "--layout", str(self.layout), *server,
                "--meminfo", str(self.meminfo), "--thermal-root", str(self.thermal)]

    def env(self):
        return {**os.environ, "PATH": f"{self.stubs}:{os.environ['PATH']}",
                "FAKE_BOX": str(self.folder)}

    def run_command(self, *extra):
        """`run` with every value the unit gives it (none has a default of its own)."""
        return self.command("run", "--container", SERVICE, "--interval", "0.5", "--failures", "3",
                            "--timeout", "0.5", "--backoff", "60", "--max-restarts-per-hour", "3",
                            "--give-up-after", "6", "--start-timeout", "1800",
                            "--exporter-address", "127.0.0.1",
                            "--exporter-port", str(self.exporter_port), "--decode-gate", "27",
                            *extra)

    def start(self, *extra):
        self.log = (self.folder / "stdout").open("w")
        self.process = subprocess.Popen(self.run_command(*extra), env=self.env(), stdout=self.log,
                                        stderr=subprocess.STDOUT)

    def status(self):
        done = subprocess.run(self.command("status"), env=self.env(), capture_output=True,
                              text=True, check=True, timeout=30)
        return json.loads(done.stdout)

    def restarts(self):
        calls = (self.folder / "calls").read_text() if (self.folder / "calls").exists() else ""
        return [line for line in calls.splitlines() if line.startswith("systemctl try-restart")]

    def stdout(self):
        return (self.folder / "stdout").read_text()

    def state(self):
        try:
            return json.loads((self.run_dir / "watchdog.json").read_text())["memory"]
        except (OSError, ValueError):
            return {}

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.exporter_port}{path}",
                                        timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def wait_for(self, condition, seconds=10):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            assert self.process.poll() is None, self.stdout()
            time.sleep(0.1)
        raise AssertionError(f"not within {seconds} s; the tool said:\n{self.stdout()}")

    def close(self):
        if self.process:
            self.process.terminate()
            self.process.wait(10)
            self.log.close()
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def box(tmp_path):
    made = Box(tmp_path)
    yield made
    made.close()


def test_a_hung_completion_is_restarted_once_naming_why(box):
    box.hang = True
    box.start()
    box.wait_for(lambda: box.state().get("state") == "failing")
    assert box.get("/healthy")[0] == 200  # one failed check is not yet a verdict
    box.wait_for(lambda: box.restarts())
    box.wait_for(lambda: box.state().get("state") == "ok")  # the fake restart unfroze it
    assert box.restarts() == [f"systemctl try-restart --no-block {SERVICE}"]
    # the wedged container killed first: a stop would wait out vLLM's shutdown_timeout
    calls = (box.folder / "calls").read_text().splitlines()
    assert calls.index(f"docker kill {SERVICE}") < calls.index(box.restarts()[0])
    said = [line for line in box.stdout().splitlines() if line.startswith("restarting")]
    assert said == [(f"restarting {SERVICE}: 3 checks failed (a 1-token completion did not "
                     "answer within 0.5 s, nothing running)")]
    assert box.get("/healthy") == (200, "ok (ok)\n")
    assert box.completions[0] == {"model": "/model", "prompt": "ping", "max_tokens": 1}
    assert box.keys == {f"Bearer {KEY}"}
    assert KEY not in box.stdout() + (box.folder / "calls").read_text()
    assert json.loads((box.state_dir / "watchdog-restarts.json").read_text())["total"] == 1


def test_the_gateway_s_check_needs_vllm_s_own_health_too(box):
    # a server restarting or loading (vLLM's /health not 200) is out of rotation at once, before
    # any check of the watchdog's has failed
    box.start()
    box.wait_for(lambda: box.state().get("state") == "ok")
    assert box.get("/healthy") == (200, "ok (ok)\n")
    box.health = 503
    assert box.get("/healthy") == (503, "ok: vLLM's /health does not answer 200\n")


def test_a_long_answer_is_not_restarted(box):
    box.hang, box.running, box.grow = True, 1.0, 25.0  # one stream, tokens growing
    box.start()
    box.wait_for(lambda: box.state().get("decode_tok_s"))
    time.sleep(2.5)  # five checks: more than --failures
    assert box.restarts() == [] and box.completions == []
    assert box.state()["state"] == "ok" and box.state()["failures"] == 0


def test_a_stopped_service_is_left_stopped(box):
    box.hang = True
    box.set_unit("inactive", "dead")
    box.start()
    box.wait_for(lambda: box.state().get("state") == "stopped")
    time.sleep(2.5)
    assert box.restarts() == [] and box.completions == []
    status, text = box.get("/healthy")
    assert status == 503 and text.startswith(f"stopped: {SERVICE} is inactive (stopped by the ")


def test_a_box_given_up_on_is_out_of_the_gateway_before_the_journal_says_so(box):
    # the hour's restarts already at the cap, and a box whose nvpmodel is slow to answer (the
    # readings gathered after each check): the gateway's check and status say 503 / over_cap by
    # the time the line is in the journal (a story once read 200 "ok (failing)" just after it)
    now = time.time()
    (box.state_dir / "watchdog-restarts.json").write_text(
        json.dumps({"total": 3, "times": [now - 300, now - 200, now - 100]}))
    (box.stubs / "nvpmodel").write_text(
        "#!/bin/sh\nsleep 2\nprintf 'NV Power Mode: 120W\\n1\\n'\n")
    box.hang = True
    box.start("--failures", "1")
    box.wait_for(lambda: "not restarting" in box.stdout(), 30)
    status, text = box.get("/healthy")
    assert status == 503 and text.startswith("over_cap: 3 restarts in the last hour (cap 3)"), text
    assert box.state()["state"] == "over_cap"
    assert box.restarts() == []


def test_a_server_stopped_while_its_last_check_hangs_stays_stopped(box):
    # the third failed check's completion hangs; the operator stops the server meanwhile: the
    # restart that check decided must not start it again (a restart of a stopped unit would)
    box.hang, box.stop_at_completion = True, 3
    box.start()
    box.wait_for(lambda: box.state().get("state") == "stopped")
    time.sleep(1.5)
    calls = (box.folder / "calls").read_text()
    assert "docker kill" not in calls and "restart" not in calls
    assert "ActiveState=inactive" in (box.folder / "unit").read_text()
    assert box.state()["restarts"] == []


def test_a_held_serve_lock_stops_any_action(box):
    box.hang = True
    with open(box.state_dir / "serve.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # thorfleet-serve proving or draining
        box.start()
        box.wait_for(lambda: box.state().get("state") == "held")
        time.sleep(2.5)
        assert box.restarts() == [] and box.completions == []
        assert box.get("/healthy")[0] == 200  # a deploy's hold is no failure
    assert "held: thorfleet-serve holds the box (serve.lock)" in box.stdout()


def exporter_samples(text):
    """{(name, labels): value}, read by prometheus_client's own parser when it is installed (it
    is a vLLM dependency), else by readings' summing parser."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
        return {(name, ()): value for name, value in readings.metric_sums(text, names).items()}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_health_check_that_hangs_up_at_once_leaves_the_journal_quiet(box):
    # HAProxy's check resets the connection once it has read the status: no traceback per check
    import socket
    import struct

    box.start()
    box.wait_for(lambda: box.state().get("state") == "ok")
    for _ in range(20):
        check = socket.create_connection(("127.0.0.1", box.exporter_port))
        check.sendall(b"GET /healthy HTTP/1.0\r\n\r\n")
        check.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        check.close()  # RST, as HAProxy closes a check
    assert box.get("/healthy")[0] == 200
    time.sleep(0.5)
    assert "Traceback" not in box.stdout()


def test_the_exporter_answers_as_prometheus_reads_it(box):
    box.running, box.grow = 1.0, 30.0
    box.start()
    box.wait_for(lambda: box.state().get("decode_tok_s"))
    status, text = box.get("/metrics")
    assert status == 200
    samples = exporter_samples(text)
    names = {name for name, _ in samples}
    expected = {"thorfleet_power_mode", "thorfleet_clocks_locked", "thorfleet_mem_available_bytes",
                "thorfleet_temperature_celsius", "thorfleet_watchdog_check_ok",
                "thorfleet_watchdog_failures", "thorfleet_watchdog_over_cap",
                "thorfleet_watchdog_checks_total", "thorfleet_watchdog_restarts_total",
                "thorfleet_watchdog_last_check_timestamp_seconds",
                "thorfleet_decode_tokens_per_second", "thorfleet_decode_gate_tokens_per_second",
                "thorfleet_serving_info"}
    assert names == expected, names ^ expected
    one = {name: value for (name, _), value in samples.items()}
    assert one["thorfleet_power_mode"] == 1 and one["thorfleet_clocks_locked"] == 1
    assert one["thorfleet_mem_available_bytes"] == 99000000 * 1024
    assert one["thorfleet_watchdog_check_ok"] == 1 and one["thorfleet_watchdog_over_cap"] == 0
    assert one["thorfleet_watchdog_checks_total"] >= 1
    assert one["thorfleet_decode_gate_tokens_per_second"] == 27
    assert one["thorfleet_decode_tokens_per_second"] > 0
    assert 'thorfleet_temperature_celsius{zone="cpu-thermal"} 47.25\n' in text
    assert f'thorfleet_serving_info{{fingerprint="{"f" * 12}"}} 1.0\n' in text
    assert "host=" not in text  # Prometheus's target labels add it


def test_status_prints_the_contracts_json(box):
    box.start()
    box.wait_for(lambda: box.state().get("state") == "ok")
    found = box.status()
    assert set(found) == {"service", "active", "health", "fingerprint", "watchdog", "requests",
                          "decode_tok_s", "eagle_acceptance", "mem_available_bytes",
                          "power_mode", "clocks_locked", "temperatures_c", "firewall_loaded"}
    assert set(found["watchdog"]) == {"running", "state", "last_check_ok", "last_check_at",
                                      "checks", "why", "failures", "restarts_1h", "restarts_24h"}
    assert found["service"] == SERVICE and found["active"] == "active" and found["health"] is True
    assert found["fingerprint"] == "f" * 64
    assert found["watchdog"]["running"] is True and found["watchdog"]["state"] == "ok"
    assert found["watchdog"]["last_check_ok"] is True and found["watchdog"]["restarts_24h"] == 0
    assert found["requests"] == {"running": 0.0, "waiting": 0.0}
    assert found["eagle_acceptance"] == 0.75
    assert found["mem_available_bytes"] == 99000000 * 1024
    assert found["power_mode"] == 1 and found["clocks_locked"] is True
    assert found["temperatures_c"] == {"cpu-thermal": 47.25}
    box.process.terminate()
    box.process.wait(10)
    time.sleep(1.6)  # three intervals with no check
    assert box.status()["watchdog"]["running"] is False


SCRIPT, MARK = firewall_script((8002, 9105), "172.18.0.5")
LISTED = SCRIPT[SCRIPT.rindex("table inet thorfleet {"):].replace("    ", "\t").replace(
    "counter drop", "counter packets 0 bytes 0 drop")  # as `nft list table` says it


@pytest.mark.parametrize("enabled, listed, stdout, expected", [
    ("disabled", 0, "", None),  # no gateway: no firewall expected
    ("enabled", 0, LISTED, True),
    ("enabled", 1, "", False),  # the table did not load: the server is held down, the alert fires
    # there but emptied (`nft flush table`): it closes nothing
    ("enabled", 0, "table inet thorfleet {\n}\n", False),
    ("enabled", 0, "\n".join(x for x in LISTED.splitlines() if " drop " not in x), False),
    # a drop of an older script (the deploy's fact reloads that one; here it is not the mark)
    ("enabled", 0, LISTED.replace(MARK, "thorfleet 0123456789abcdef"), False),
])
def test_the_firewall_reading(monkeypatch, tmp_path, enabled, listed, stdout, expected):
    (tmp_path / "firewall.nft").write_text(SCRIPT)
    monkeypatch.setattr(wd, "FIREWALL_SCRIPT", str(tmp_path / "firewall.nft"))

    def run(*cmd, timeout=30):
        if cmd[:2] == ("systemctl", "is-enabled"):
            assert cmd[2] == layout.FIREWALL_UNIT
            return Namespace(returncode=0, stdout=enabled + "\n")
        assert cmd == ("nft", "list", "table", *layout.FIREWALL_TABLE)
        return Namespace(returncode=listed, stdout=stdout)
    monkeypatch.setattr(wd, "run", run)
    assert wd.firewall_loaded() is expected


def test_a_reload_of_nftables_loads_the_table_again():
    """`systemctl reload nftables` (its `flush ruleset`) reloads thorfleet's unit after it, as a
    restart restarts it; what no unit sees is the watchdog's (below)."""
    unit = (layout.FILES / "thor" / "systemd" / layout.FIREWALL_UNIT).read_text().splitlines()
    assert {"After=nftables.service", "PartOf=nftables.service",
            "ReloadPropagatedFrom=nftables.service"} <= set(unit)
    assert f"ExecReload=/usr/sbin/nft -f {layout.BOX_FIREWALL}" in unit
    assert not any(x.startswith(("Requires=nftables", "BindsTo=nftables")) for x in unit)


@pytest.fixture
def netns():
    """A network namespace of its own (removed after): its name. Root and nft are the fast
    tier's, as the README runs it (.ci/setup installs nftables): without them the tests that use
    it fail, never skip, so CI cannot pass them unproven."""
    assert os.geteuid() == 0 and shutil.which("nft"), "needs root and nft (.ci/setup installs it)"
    name = f"tf-wd-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    yield name
    subprocess.run(["ip", "netns", "delete", name], check=False)


# Debian's /etc/nftables.conf as the package ships it: what `systemctl start|reload nftables`
# and `nft -f /etc/nftables.conf` load, the whole ruleset flushed first
NFTABLES_CONF = """#!/usr/sbin/nft -f
flush ruleset
table inet filter {
    chain input { type filter hook input priority filter; }
    chain forward { type filter hook forward priority filter; }
    chain output { type filter hook output priority filter; }
}
"""


def test_a_ruleset_loaded_by_hand_does_not_open_the_vllm_port(monkeypatch, tmp_path, netns):
    """In a network namespace: thorfleet's table loaded, then the ruleset loaded as nftables
    loads it (`flush ruleset` first): the watchdog's look finds the table gone and loads it again;
    emptied (`flush table`), the same; a table that cannot load stops the server."""
    (tmp_path / "firewall.nft").write_text(SCRIPT)
    (tmp_path / "nftables.conf").write_text(NFTABLES_CONF)
    monkeypatch.setattr(wd, "FIREWALL_SCRIPT", str(tmp_path / "firewall.nft"))
    said, calls = [], []
    monkeypatch.setattr(wd, "say", said.append)

    def nft(*words):
        return subprocess.run(["ip", "netns", "exec", netns, "nft", *words], capture_output=True,
                              text=True, timeout=30, check=False)

    def run(*cmd, timeout=30):
        calls.append(cmd)
        if cmd[0] == "nft":
            return nft(*cmd[1:])
        if cmd[:2] == ("systemctl", "is-enabled"):
            return Namespace(returncode=0, stdout="enabled\n", stderr="")
        if cmd[:2] == ("systemctl", "show"):
            return Namespace(returncode=0, stdout="ActiveState=active\n", stderr="")
        return Namespace(returncode=0, stdout="", stderr="")
    monkeypatch.setattr(wd, "run", run)

    assert nft("-f", str(tmp_path / "firewall.nft")).returncode == 0
    assert wd.keep_firewall(SERVICE, SERVICE) is True and said == []
    for by_hand in (["-f", str(tmp_path / "nftables.conf")],  # as nftables.service loads it
                    ["flush", "table", *layout.FIREWALL_TABLE]):  # there, but empty
        assert nft(*by_hand).returncode == 0
        assert wd.firewall_loaded() is False  # the alert's reading
        assert wd.keep_firewall(SERVICE, SERVICE) is True, said
        assert MARK in nft("list", "table", *layout.FIREWALL_TABLE).stdout
        assert "loaded it again" in said[-1]
    assert not any(c[:2] == ("systemctl", "stop") for c in calls)
    # a script nft refuses: the server is stopped, not left open
    (tmp_path / "firewall.nft").write_text(SCRIPT.replace("accept", "acept"))
    assert nft("-f", str(tmp_path / "nftables.conf")).returncode == 0
    assert wd.keep_firewall(SERVICE, SERVICE) is False
    assert ("docker", "kill", SERVICE) in calls and ("systemctl", "stop", "--no-block",
                                                     SERVICE) in calls
    assert f"stopping {SERVICE}" in said[-1]


def test_the_system_ruleset_loads_thorfleets_table_in_its_own_transaction(monkeypatch, tmp_path,
                                                                             netns):
    """With a gateway the deploy ends Debian's /etc/nftables.conf with an include of thorfleet's
    script (operations/gateway.in_system_ruleset): the `nft -f` of it by hand that empties the
    table fills it again in the same transaction, so the table is there the moment it returns,
    before any look of the watchdog's. The line is added once, found again by the operation's own
    fact, and taken out whole; a box without the file is left alone. Breaks without the include
    (the table is gone at once)."""
    script, conf = tmp_path / "firewall.nft", tmp_path / "nftables.conf"
    script.write_text(SCRIPT)
    conf.write_text(NFTABLES_CONF.rstrip("\n"))  # a last line without its newline, too
    include = f'include "{script}"'
    for module in (ops, gateway_facts):
        monkeypatch.setattr(module, "SYSTEM_RULESET", str(conf))
        monkeypatch.setattr(module, "RULESET_INCLUDE", include)

    def nft(*words):
        return subprocess.run(["ip", "netns", "exec", netns, "nft", *words], capture_output=True,
                              text=True, timeout=30, check=False)

    def converge(present):
        """The operation's commands against what its fact reads, run; its noops."""
        fact = gateway_facts.RulesetIncludes()
        found = fact.process(subprocess.run(["sh", "-c", fact.command()], capture_output=True,
                                            text=True, check=True).stdout.splitlines())
        commands, noops = plan_run(ops.in_system_ruleset, {gateway_facts.RulesetIncludes: found},
                                   present=present)
        for command in commands:
            subprocess.run(["sh", "-c", command], check=True)
        return commands, noops

    assert converge(True)[0] and converge(True) == ([], [f"{conf} includes thorfleet's firewall"])
    assert conf.read_text() == NFTABLES_CONF + include + "\n"
    assert nft("-f", str(script)).returncode == 0  # the unit's load
    loaded = nft("-f", str(conf))
    assert loaded.returncode == 0, loaded.stderr
    assert MARK in nft("list", "table", *layout.FIREWALL_TABLE).stdout  # no look came between
    assert "table inet filter" in nft("list", "ruleset").stdout  # and the system's own is there
    # a script broken by hand fails the system's whole load, naming it; what was loaded stays
    script.write_text(SCRIPT + "table inet thorfleet { oops }\n")
    refused = nft("-f", str(conf))
    assert refused.returncode != 0 and str(script) in refused.stderr, refused.stderr
    assert MARK in nft("list", "table", *layout.FIREWALL_TABLE).stdout
    script.write_text(SCRIPT)
    assert converge(False)[0] and converge(False)[0] == []
    assert conf.read_text() == NFTABLES_CONF
    conf.unlink()  # no nftables package: left alone
    assert converge(True) == ([], [f"no {conf}: thorfleet's unit alone loads its table"])


# The guard as the watchdog runs it (its nft monitor too), in a process of its own inside the
# namespace, so that every nft it runs is the namespace's and the test's end kills them all; the
# server's units and docker answer as for an active server, as above.
GUARD = """
import sys
from argparse import Namespace
sys.path.insert(0, sys.argv[1])
from tests.fast.test_watchdog import wd
wd.FIREWALL_SCRIPT, real_run = sys.argv[2], wd.run
def run(*cmd, timeout=30):
    if cmd[0] == "nft":
        return real_run(*cmd, timeout=timeout)
    answer = "enabled" if cmd[:2] == ("systemctl", "is-enabled") else "ActiveState=active"
    return Namespace(returncode=0, stdout=answer + "\\n", stderr="")
wd.run = run
wd.guard_firewall("thorfleet-vllm", "thorfleet-vllm", float(sys.argv[3]))
"""


def monitor_runs(netns):
    """Whether an `nft monitor` runs in the namespace."""
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                          check=False).stdout.split()
    for pid in pids:
        try:
            if b"monitor" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def test_the_guard_loads_the_table_again_as_the_ruleset_changes(tmp_path, netns):
    """A ruleset loaded by hand while the guard runs: its table is back at once, long before its
    next look (60 s here), because nft monitor wakes it. A look every second still let a LAN
    prober through once (the soak's). The burst (the ruleset's events, then the guard's own
    load's) costs one load."""
    (tmp_path / "firewall.nft").write_text(SCRIPT)
    (tmp_path / "nftables.conf").write_text(NFTABLES_CONF)

    def nft(*words):
        return subprocess.run(["ip", "netns", "exec", netns, "nft", *words], capture_output=True,
                              text=True, timeout=30, check=False)

    def loaded():
        return MARK in nft("list", "table", *layout.FIREWALL_TABLE).stdout

    def within(seconds, condition):
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        return condition()

    assert nft("-f", str(tmp_path / "firewall.nft")).returncode == 0  # the unit's, at boot
    guard = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", GUARD,
                              str(ROOT), str(tmp_path / "firewall.nft"), "60"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)  # its nft monitor in its group: killed too
    try:
        # its monitor subscribed to nftables' events before the load (a guard without one
        # shows below)
        within(15, lambda: monitor_runs(netns))
        time.sleep(0.5)
        assert nft("-f", str(tmp_path / "nftables.conf")).returncode == 0
        assert within(2, loaded), "thorfleet's table not back within 2 s (the poll is 60 s)"
        time.sleep(1)  # the looks its own load wakes find it loaded: no second load
    finally:
        os.killpg(guard.pid, 9)
        said = guard.communicate(timeout=30)[0]
    assert said.count("loaded it again") == 1, said
    assert "nft monitor" not in said, said  # it ran throughout


def test_an_nft_monitor_that_cannot_start_is_tried_again_and_told_once(monkeypatch, tmp_path):
    """No nft to run: tried again every pause, the journal told once, not at every try."""
    monkeypatch.setenv("PATH", str(tmp_path))
    said, pauses = [], []
    monkeypatch.setattr(wd, "say", said.append)

    class Enough(Exception):
        pass

    def sleep(seconds):
        pauses.append(seconds)
        if len(pauses) == 3:
            raise Enough
    monkeypatch.setattr(wd.time, "sleep", sleep)
    with pytest.raises(Enough):
        wd.watch_ruleset(threading.Event(), pause=10)
    assert pauses == [10, 10, 10]
    assert len(said) == 1 and said[0].startswith("nft monitor cannot start"), said


def test_status_without_a_watchdog_run_says_so(box):
    found = box.status()
    assert found["watchdog"]["running"] is False and found["watchdog"]["state"] == "unknown"
    # and, told no server, names what it needs rather than guessing one
    done = subprocess.run(box.command("status", named=False), env=box.env(), capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode != 0 and "name the server with --service and --port" in done.stderr


def test_status_bare_asks_about_the_server_the_running_watchdog_watches(box):
    """`sudo thorfleet-watchdog status` on a box (docs/watching.md) reports the service and port
    the unit gave the watchdog, whatever service_name and service_port are: it has no defaults."""
    box.start()
    box.wait_for(lambda: box.state().get("state") == "ok")
    done = subprocess.run(box.command("status", named=False), env=box.env(), capture_output=True,
                          text=True, timeout=30, check=True)
    found = json.loads(done.stdout)
    assert (found["service"], found["health"]) == (SERVICE, True)


# --- where the deploy puts it, and the unit that runs it --------------------------------------------

def test_the_layout_the_deploy_writes_is_the_one_the_tools_read():
    assert wd.LAYOUT == layout.BOX_LAYOUT_ENV
    assert (wd.FIREWALL_UNIT, wd.FIREWALL_TABLE, wd.FIREWALL_SCRIPT) == (
        layout.FIREWALL_UNIT, layout.FIREWALL_TABLE, layout.BOX_FIREWALL)
    written = dict(line.split("=", 1) for line in layout.layout_env_text().splitlines()
                   if not line.startswith("#"))
    assert set(wd.LAYOUT_KEYS) <= set(written)
    assert written["RUN_DIR"] == layout.BOX_RUN_LOCK_DIR
    assert layout.BOX_WATCHDOG_STATE == f"{written['RUN_DIR']}/watchdog.json"
    serve = next(node.value for node in ast.parse((ROOT / "files/thor/bin/thorfleet-serve").read_text()).body
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "LAYOUT_KEYS")
    # every key written is read by one of the two tools
    assert set(written) == set(wd.LAYOUT_KEYS) | set(ast.literal_eval(serve))
    # the programs import what they share from the package beside them, by its name there
    for program in (layout.BOX_SERVE, layout.BOX_WATCHDOG, layout.BOX_BENCH):
        assert Path(layout.BOX_LIB).parent == Path(program).parent
        assert "from thorfleet_box import common as box" in (
            layout.FILES / "thor" / "bin" / Path(program).name).read_text()
    assert Path(layout.BOX_LIB).name == "thorfleet_box"
    assert layout.BOX_USAGE_CODE == f"{layout.BOX_LIB}/usage.py"


def watchdog_unit(**change):
    values, problems = schema.check({**PINS, **change}, api_key=KEY)
    assert not problems, problems
    return Settings(values, api_key=KEY)


def test_the_servers_own_restarts_are_bounded_too():
    """Restart=on-failure restarted a server that crashes at every start for ever: systemd now
    gives up past twice the watchdog's cap and four more in an hour (a watchdog restart may count
    twice)."""
    s = watchdog_unit(watchdog_max_restarts_per_hour=3)
    entries = {(section, key): value for section, key, value in unit_entries(s.unit_text)}
    assert entries[("Service", "Restart")] == "on-failure"
    limit = {(section, key): value for section, key, value in unit_entries(s.start_limit_text)}
    assert (limit[("Unit", "StartLimitIntervalSec")], limit[("Unit", "StartLimitBurst")]) == \
        ("3600", "10")  # the reset before a deploy's restart: tests/fast/test_thorfleet_serve.py
    # in a drop-in, not the unit: a new cap restarts no server (the watch stories' converge,
    # after the gateway's on the same boxes, restarted three for it)
    assert watchdog_unit(watchdog_max_restarts_per_hour=10).fingerprint == s.fingerprint


def test_the_unit_runs_the_tool_with_the_settings_and_needs_no_server():
    s = watchdog_unit(watchdog_interval_s=7, watchdog_failures=4, watchdog_timeout_s=9,
                      watchdog_restart_backoff_s=30, watchdog_max_restarts_per_hour=2,
                      watchdog_port=9200)
    entries = {(section, key): value
               for section, key, value in unit_entries(s.render(UNIT_TEMPLATE))}
    assert entries[("Service", "Restart")] == "always"
    assert entries[("Service", "RestartSec")] == "5"
    assert entries[("Service", "SyslogIdentifier")] == "thorfleet-watchdog"
    assert entries[("Install", "WantedBy")] == "multi-user.target"
    for key in ("After", "Wants", "Requires", "BindsTo", "PartOf", "Requisite"):
        assert SERVICE not in entries.get(("Unit", key), ""), key
    argv = command_words(entries[("Service", "ExecStart")])
    assert argv[:2] == ["/usr/bin/python3", layout.BOX_WATCHDOG]
    parsed = wd.arguments().parse_args(argv[2:])  # the tool reads the unit's words back
    assert (parsed.command, parsed.service, parsed.port) == ("run", SERVICE, 8002)
    assert (parsed.interval, parsed.failures, parsed.timeout, parsed.backoff) == (7, 4, 9, 30)
    assert (parsed.max_restarts_per_hour, parsed.exporter_port) == (2, 9200)
    assert parsed.give_up_after == 6
    # its port is the socket unit's, held across its restarts
    assert entries[("Unit", "Requires")] == layout.WATCHDOG_SOCKET
    port = {(section, key): value for section, key, value in unit_entries(s.watchdog_socket_text)}
    assert port[("Socket", "ListenStream")] == "0.0.0.0:9200"
    assert port[("Install", "WantedBy")] == "sockets.target"
    # its own start grace, not service_health_timeout_s (a version's, which a roll-back undoes)
    assert (parsed.start_timeout, parsed.decode_gate) == (1800, 27)
    assert KEY not in s.render(UNIT_TEMPLATE)


def test_a_watchdog_setting_never_changes_the_servers_fingerprint():
    assert watchdog_unit().fingerprint == watchdog_unit(watchdog_interval_s=5,
                                                        watchdog_port=9300).fingerprint
    assert watchdog_unit().render(UNIT_TEMPLATE) != \
        watchdog_unit(watchdog_port=9300).render(UNIT_TEMPLATE)


# What systemd does for a socket-activated service: the socket as descriptor 3, LISTEN_PID the
# service's own pid, LISTEN_FDS the count (sd_listen_fds(3)), then the service's command.
SD_PASS = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
           "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
           "os.execv(sys.argv[2], sys.argv[2:])")


def test_a_check_made_while_the_watchdog_restarts_is_answered_on_systemds_port(box):
    """The port is the socket unit's (files/thor/systemd/thorfleet-watchdog.socket.j2), passed as
    descriptor 3: a check that comes between one watchdog and the next waits in the backlog and
    is answered by the next, where a closed port would fail it and take the box out of its pool
    (seen: the mixed fleet's last EAGLE box, its watchdog restarted by the deploy while the other
    drained). The edit that breaks it: the watchdog binding its own port (taken here: it exits)."""
    held = socket.create_server(("127.0.0.1", 0), backlog=16)  # systemd's part
    box.exporter_port = held.getsockname()[1]
    fd = held.fileno()

    def start():
        box.log = (box.folder / "stdout").open("a")
        box.process = subprocess.Popen(
            [sys.executable, "-c", SD_PASS, str(fd), *box.run_command()],
            env=box.env(), stdout=box.log, stderr=subprocess.STDOUT, pass_fds=(fd,))

    try:
        start()
        box.wait_for(lambda: box.get("/healthy")[0] == 200, seconds=20)
        box.process.terminate()  # a restart: the old one gone, the next not yet started
        box.process.wait(10)
        box.log.close()
        answers = []
        meanwhile = threading.Thread(target=lambda: answers.append(box.get("/healthy")))
        meanwhile.start()
        time.sleep(1)
        assert answers == [] and meanwhile.is_alive()  # waiting in the backlog, not refused
        start()
        meanwhile.join(30)
        assert answers and answers[0][0] == 200, (answers, box.stdout())
    finally:
        held.close()


def test_a_taken_exporter_port_is_named(box):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", box.exporter_port))
        taken.listen()
        box.start()
        assert box.process.wait(10) != 0
    assert f"cannot listen on 127.0.0.1:{box.exporter_port}" in box.stdout()
    box.log.close()
    box.process = None
