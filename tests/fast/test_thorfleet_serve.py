"""thorfleet-serve on temporary folders: its proven fingerprint, last-good copies, roll-back and hold.

The box around it is stood in: `systemctl`, `journalctl` and `docker` on PATH are one small script
(below) keeping the unit's state in a folder, and the server is a local http.server answering as
vLLM does. Which version "runs" is the config file the fake systemctl found when it (re)started the
unit: a config saying `marlin` logs the slow-kernel fallback, one saying `crash` fails to start, one
saying `busy` is answering a client for the first two /metrics reads after it starts (the file
`busy` in the fake box counts the reads left that report a running request).
"""

import ast
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT, box_lib_path, box_program
from thorfleet.settings import layout, schema
from thorfleet.settings.render import Settings

TOOL = ROOT / "files" / "thor" / "bin" / "thorfleet-serve"
SERVICE = "thorfleet-vllm"
KEY = "sk-box-key-0123456789"

FAKE_BOX = r"""#!/bin/sh
# systemctl, journalctl and docker as thorfleet-serve uses them; the unit's state in $FAKE_BOX.
box=$FAKE_BOX
tool=$(basename "$0")
echo "$tool $*" >> "$box/calls"
case "$tool" in
systemctl)
    case "$1" in
    restart)
        if grep -q crash "$FAKE_CONFIG"; then
            # Restart=on-failure: systemd waits RestartSec before its own next start, and this
            # fake never gets there (NRestarts stays 0): a crash is seen in the wait or not at all
            echo activating > "$box/active"; echo auto-restart > "$box/substate"; rm -f "$box/running"
            # as vLLM 0.19.0 logs a start-up that fails in the engine core: transformers' harmless
            # probe of /eagle, the engine core's traceback (core.py L1108), the API server's
            # pointer back at it (utils.py L1059)
            printf '%s\n' \
                "WARNING 11-30 09:46:44 [config.py:1220] ValueError: Unrecognized model in /eagle." \
                "ERROR 11-30 09:46:44 [core.py:1108] EngineCore failed to start." \
                "ERROR 11-30 09:46:44 [core.py:1108] Traceback (most recent call last):" \
                "ERROR 11-30 09:46:44 [core.py:1108] ValueError: Selected backend FLASHINFER is not valid for this configuration. Reason: ['MLA not supported']" \
                '    raise RuntimeError("Engine core initialization failed. See root cause above. "' \
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}" \
                > "$box/journal"
        else
            echo active > "$box/active"; echo running > "$box/substate"; cp "$FAKE_CONFIG" "$box/running"
            # the container reads the key when it starts (EnvironmentFile=, `-e VLLM_API_KEY`)
            cp "$FAKE_SECRETS" "$box/running-secrets"
            if grep -q busy "$FAKE_CONFIG"; then echo 2 > "$box/busy"; fi
            # the lines vLLM 0.19.0 logs for its kernel choice (cuda.py, nvfp4_utils.py, oracle)
            if grep -q marlin "$FAKE_CONFIG"; then k=MARLIN; else k=FLASHINFER_CUTLASS; fi
            printf '%s\n' "Using AttentionBackendEnum.TRITON_MLA backend." \
                "Using NvFp4LinearBackend.FLASHINFER_CUTLASS for NVFP4 GEMM" \
                "Using '$k' NvFp4 MoE backend out of potential backends: [...]." > "$box/journal"
            if [ $k = MARLIN ]; then
                echo "[marlin_utils_fp4.py:298] Your GPU does not have native support for FP4" >> "$box/journal"
            fi
        fi ;;
    stop) echo inactive > "$box/active"; echo dead > "$box/substate"; rm -f "$box/running" ;;
    is-active) s=$(cat "$box/active" 2>/dev/null || echo inactive); echo "$s"; [ "$s" = active ] ;;
    is-enabled) echo enabled ;;
    show) case "$*" in
        *NRestarts*) echo 0 ;;
        *SubState*) cat "$box/substate" 2>/dev/null || echo dead ;;
        *) echo "Mon 2026-01-05 10:00:00 UTC" ;;
        esac ;;
    esac ;;
journalctl) cat "$box/journal" 2>/dev/null || true ;;
docker) echo 1 ;;  # the image's thorfleet.think-prefill label
esac
"""


class VLLM(BaseHTTPRequestHandler):
    """Answers as vLLM does while the fake unit runs a version; refuses a wrong API key."""

    box = None

    def log_message(self, *args):
        pass

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        running = (self.box / "running").exists()
        if self.path == "/metrics" and running:
            return self.metrics()
        self.answer(200 if running else 503, {})

    def metrics(self):
        """vLLM's gauges, one label set per engine: a request runs while `busy` counts down."""
        busy_file = self.box / "busy"
        left = int(busy_file.read_text()) if busy_file.exists() else 0
        if left:
            busy_file.write_text(str(left - 1))
        with (self.box / "calls").open("a") as calls:
            calls.write(f"GET /metrics running={int(bool(left))}\n")
        text = "".join(
            f"# TYPE vllm:num_requests_{name} gauge\n"
            f'vllm:num_requests_{name}{{engine="0",model_name="/model"}} {value}\n'
            f'vllm:num_requests_{name}{{engine="1",model_name="/model"}} 0.0\n'
            for name, value in (("running", float(bool(left))), ("waiting", 0.0)))
        counters = json.loads((self.box / "prefix").read_text()) if (
            self.box / "prefix").exists() else {"queries": 0, "hits": 0}
        text += "".join(f'vllm:prefix_cache_{name}_total{{engine="0",model_name="/model"}} '
                        f"{float(value)}\n" for name, value in counters.items())
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        started_with = self.box / "running-secrets"
        key = started_with.read_text().strip().split("=", 1)[1] if started_with.exists() else KEY
        if self.headers.get("Authorization") != f"Bearer {key}":
            return self.answer(401, {"error": "Unauthorized"})
        if not (self.box / "running").exists():
            return self.answer(503, {})
        if self.path == "/v1/chat/completions/render":  # 403 from vLLM 0.30.0 on
            return self.answer(403, {"error": "Scale-out endpoints are disabled."})
        if self.path == "/detokenize":
            if body.get("tokens") != [1, 2, 3]:  # the reasoning answer's prompt_token_ids
                return self.answer(400, {"error": f"not that request's prompt: {body}"})
            return self.answer(200, {"prompt": '[MODEL_SETTINGS]{"reasoning_effort": "high"}'
                                               "[INST]Hello[/INST][THINK]"})
        if body.get("reasoning_effort") == "high" and body.get("return_token_ids"):
            return self.answer(200, {"choices": [{"message": {"content": "Hello!"}}],
                                     "prompt_token_ids": [1, 2, 3]})
        if body.get("cache_salt"):  # the prefix cache's proof: a salt seen before is a hit
            return self.answer(200, self.prefix_answer(body))
        if body.get("tools"):
            call = {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            return self.answer(200, {"choices": [{"message": {"tool_calls": [call]}}]})
        return self.answer(200, {"choices": [{"message": {"content": "Hello!"}, "text": "x"}]})


    def prefix_answer(self, body):
        """As vLLM answers a prompt with return_token_ids, counting prefix cache queries and hits;
        a running config saying `prefix-miss` never hits, one saying `prefix-wrong` answers a hit
        with other tokens."""
        state = self.box / "prefix"
        counters = json.loads(state.read_text()) if state.exists() else {"queries": 0, "hits": 0}
        salts = self.box / "salts"
        seen = salts.read_text().split() if salts.exists() else []
        config = (self.box / "running").read_text()
        cached = 384 if body["cache_salt"] in seen and "prefix-miss" not in config else 0
        salts.write_text(" ".join([*seen, body["cache_salt"]]))
        counters["queries"] += 400
        counters["hits"] += cached
        state.write_text(json.dumps(counters))
        ids = [7] * body["max_tokens"] if cached and "prefix-wrong" in config else \
            list(range(body["max_tokens"]))
        usage = {"prompt_tokens": 400, "completion_tokens": len(ids)}
        if cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return {"choices": [{"text": "201 202", "token_ids": ids}], "usage": usage}


# The tool with every way to change a file's mode after creating it made to do nothing, under
# root's usual umask: each file it writes keeps the mode it was created with, which is what another
# user could read it by until a chmod ran.
NO_CHMOD = """
import os, runpy, shutil, sys
os.umask(0o022)
os.chmod = os.fchmod = os.lchmod = lambda *args, **kwargs: None
shutil.copystat = shutil.copymode = lambda *args, **kwargs: None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.fixture
def box(tmp_path):
    """A box in a temporary folder: the layout file, live unit/config/secrets, the fakes, a port."""
    root = tmp_path / "box"
    paths = {"STATE_DIR": root / "var/lib/thorfleet", "CONFIG": root / "etc/vllm/vllm.yaml",
             "SECRETS_ENV": root / "etc/secrets.env", "UNIT_DIR": root / "etc/systemd/system"}
    for path in (paths["CONFIG"].parent, paths["UNIT_DIR"]):
        path.mkdir(parents=True)
    paths["SECRETS_ENV"].write_text(f"VLLM_API_KEY={KEY}\n")
    (paths["UNIT_DIR"] / f"{SERVICE}.service").write_text("[Service]\nExecStart=v1\n")
    layout_file = root / "layout.env"
    layout_file.write_text("# test box\n" + "".join(f"{k}={v}\n" for k, v in paths.items()))
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "fakebox").write_text(FAKE_BOX)
    (fakes / "fakebox").chmod(0o755)
    for tool in ("systemctl", "journalctl", "docker"):
        (fakes / tool).symlink_to(fakes / "fakebox")
    handler = type("Handler", (VLLM,), {"box": fakes})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    env = {**os.environ, "PATH": f"{fakes}{os.pathsep}{os.environ['PATH']}",
           "FAKE_BOX": str(fakes), "FAKE_CONFIG": str(paths["CONFIG"]),
           "FAKE_SECRETS": str(paths["SECRETS_ENV"]), "PYTHONPATH": box_lib_path()}

    class Box:
        config, unit = paths["CONFIG"], paths["UNIT_DIR"] / f"{SERVICE}.service"
        state_dir, fake = paths["STATE_DIR"], fakes
        proven = paths["STATE_DIR"] / "proven-fingerprint"
        last_good = paths["STATE_DIR"] / "last-good"

        secrets = paths["SECRETS_ENV"]

        def serve(self, command, *args, layout_file=layout_file, no_chmod=False):
            argv = [sys.executable, *(["-c", NO_CHMOD] if no_chmod else []), str(TOOL), command,
                    "--service", SERVICE, "--port", str(server.server_port),
                    "--layout", str(layout_file), *args]
            return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                                  check=False)

        def activate(self, config, fingerprint, **how):
            self.config.write_text(config)
            return self.serve("activate", "--timeout", "30", "--fingerprint", fingerprint, **how)

        def busy(self, reads):
            (fakes / "busy").write_text(str(reads))

        def calls(self):
            path = fakes / "calls"
            return path.read_text().splitlines() if path.exists() else []

    yield Box()
    server.shutdown()
    server.server_close()


def test_a_version_that_proves_itself_becomes_the_last_good_one(box):
    done = box.activate("version: 1\n", "1" * 64)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {"serving": True, "fingerprint": "1" * 64}
    assert box.proven.read_text() == "1" * 64
    assert (box.last_good / "config").read_text() == "version: 1\n"
    assert (box.last_good / "unit").read_text() == box.unit.read_text()
    # where disk hygiene (thorfleet-clean) reads the unit a roll-back would start
    assert layout.BOX_LAST_GOOD_UNIT == f"{layout.BOX_STATE}/last-good/unit"
    assert box.last_good.parent.name == Path(layout.BOX_STATE).name
    # the secrets are not part of a version: no copy of the key in last-good
    assert not (box.last_good / "secrets").exists()
    assert (box.last_good / "timeout").read_text() == "30.0"
    calls = box.calls()
    # a deploy acts: the unit's start limit (a crash loop's bound) counts afresh before its start
    restart = calls.index("systemctl restart thorfleet-vllm")
    assert calls[restart - 1] == "systemctl reset-failed thorfleet-vllm", calls
    state = json.loads(box.serve("state", "--chat").stdout)
    assert state == {"active": "active", "enabled": "enabled", "proven_fingerprint": "1" * 64,
                     "secrets_proven": True, "healthy": True, "chat_ok": True}


@pytest.mark.parametrize("version,why", [
    ("version: 2 marlin\n",
     "FAILED: start-up log shows the slow Marlin FP4 fallback (marlin_utils_fp4)"),
    # seen while systemd waits RestartSec (the fake never starts it again): a roll-back that waited
    # for systemd's own next start would restart the unit while that start's `docker run` creates
    # the container, which then takes the name the last good version needs (CI's load: status 125)
    ("version: 2 crash\n", "FAILED: thorfleet-vllm exited while loading; ValueError: Selected"),
], ids=["slow kernels", "crash while loading"])
def test_a_version_that_fails_is_rolled_back_to_the_last_good_one(box, version, why):
    assert box.activate("version: 1\n", "1" * 64).returncode == 0
    done = box.activate(version, "2" * 64)
    assert done.returncode == 1
    assert why in done.stdout
    assert f"Rolled back: the last good version ({'1' * 12}) serves again" in done.stdout
    assert box.config.read_text() == "version: 1\n"  # the live files are the last good ones again
    assert (box.fake / "running").read_text() == "version: 1\n"
    assert box.proven.read_text() == "1" * 64


PREFIX_ON = "enable_prefix_caching: true\n"


@pytest.mark.parametrize("version,why", [
    (f"version: 2 prefix-miss\n{PREFIX_ON}", "reports no cached tokens"),
    (f"version: 2 prefix-wrong\n{PREFIX_ON}", "uncached answer at token 1 of 16"),
], ids=["no hit", "a wrong hit"])
def test_a_prefix_cache_that_fails_its_proof_is_rolled_back(box, version, why):
    assert box.activate(f"version: 1\n{PREFIX_ON}", "1" * 64).returncode == 0  # one that works
    done = box.activate(version, "2" * 64)
    assert done.returncode == 1
    failed = next(line for line in done.stdout.splitlines() if line.startswith("FAILED: "))
    assert failed.startswith("FAILED: prefix caching: ") and why in failed, done.stdout
    assert failed.endswith("turn service_prefix_caching off for this box (its host data) and "
                           "deploy again")
    assert f"Rolled back: the last good version ({'1' * 12}) serves again" in done.stdout
    assert (box.fake / "running").read_text() == f"version: 1\n{PREFIX_ON}"


def test_a_first_version_that_fails_is_stopped_with_nothing_to_roll_back_to(box):
    done = box.activate("version: 1 crash\n", "1" * 64)
    assert done.returncode == 1
    # the engine core's own error, not the API server's "See root cause above" nor a WARNING
    assert ("thorfleet-vllm exited while loading; ValueError: Selected backend FLASHINFER is not "
            "valid for this configuration. Reason: ['MLA not supported']") in done.stdout
    assert "No earlier good version on this host: thorfleet-vllm stopped." in done.stdout
    assert "systemctl stop thorfleet-vllm" in box.calls()
    assert not box.proven.exists() and not box.last_good.exists()


def test_a_restart_waits_until_vllm_runs_no_request(box):
    assert box.activate("version: 1\nshutdown_timeout: 30\n", "1" * 64).returncode == 0
    box.busy(3)  # a client's answer is streaming: the next three reads see it running
    done = box.activate("version: 2\nshutdown_timeout: 30\n", "2" * 64)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("drain: waiting up to 30s (rollout_drain_timeout_s) for 1 running request(s) "
            "(vllm:num_requests_running + vllm:num_requests_waiting on /metrics) before "
            "restarting thorfleet-vllm") in done.stdout
    assert "drain: no request in flight after" in done.stdout
    calls = box.calls()
    last = len(calls) - calls[::-1].index("systemctl restart thorfleet-vllm") - 1
    polls = [c for c in calls[:last] if c.startswith("GET /metrics")]
    assert polls[-4:] == ["GET /metrics running=1"] * 3 + ["GET /metrics running=0"]
    assert not any(c.startswith("GET /metrics") for c in calls[last:])


def test_a_restart_waits_no_longer_than_the_drain_timeout(box):
    assert box.activate("version: 1\nshutdown_timeout: 1\n", "1" * 64).returncode == 0
    box.busy(1000)  # a request that will not end in time
    done = box.activate("version: 2\nshutdown_timeout: 1\n", "2" * 64)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("drain: 1 request(s) still in flight after 1s (rollout_drain_timeout_s): restarting "
            "thorfleet-vllm anyway") in done.stdout
    assert (box.fake / "running").read_text() == "version: 2\nshutdown_timeout: 1\n"


def test_a_drain_timeout_of_0_restarts_at_once(box):
    assert box.activate("version: 1\nshutdown_timeout: 0\n", "1" * 64).returncode == 0
    box.busy(5)
    done = box.activate("version: 2\nshutdown_timeout: 0\n", "2" * 64)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drain: rollout_drain_timeout_s is 0: requests in flight are cut" in done.stdout
    assert not [c for c in box.calls() if c.startswith("GET /metrics")]


def test_a_first_start_has_nothing_to_drain(box):
    box.busy(5)
    done = box.activate("version: 1\nshutdown_timeout: 30\n", "1" * 64)
    assert done.returncode == 0 and "drain" not in done.stdout
    assert not [c for c in box.calls() if c.startswith("GET /metrics")]


def test_a_roll_back_drains_the_version_that_failed_before_restarting(box):
    assert box.activate("version: 1\nshutdown_timeout: 30\n", "1" * 64).returncode == 0
    # the new version picks the slow kernels but answers a client all the same
    done = box.activate("version: 2 marlin busy\nshutdown_timeout: 30\n", "2" * 64)
    assert done.returncode == 1
    assert "drain: no request in flight, restarting thorfleet-vllm" in done.stdout
    assert "drain: waiting up to 30s (rollout_drain_timeout_s) for 1 running" in done.stdout
    assert f"Rolled back: the last good version ({'1' * 12}) serves again" in done.stdout
    calls = box.calls()
    restarts = [i for i, c in enumerate(calls) if c == "systemctl restart thorfleet-vllm"]
    rollback_polls = [c for c in calls[restarts[-2]:restarts[-1]] if c.startswith("GET /metrics")]
    assert rollback_polls == ["GET /metrics running=1"] * 2 + ["GET /metrics running=0"]


def test_hold_puts_the_proven_files_back_over_untested_ones(box):
    assert box.activate("version: 1\n", "1" * 64).returncode == 0
    box.config.write_text("version: 2\n")  # the deploy wrote the next version; not restarted
    done = box.serve("hold")
    assert done.returncode == 0 and "kept the last good version (111111111111)" in done.stdout
    assert box.config.read_text() == "version: 1\n"
    assert box.calls()[-1] == "systemctl daemon-reload"


@pytest.mark.parametrize("how", ["hold", "roll back"])
def test_the_secrets_are_never_copied_through_a_file_another_user_can_read(box, how):
    box.secrets.chmod(0o600)  # as the deploy installs it
    assert box.activate("version: 1\n", "1" * 64).returncode == 0
    if how == "hold":
        box.config.write_text("version: 2\n")
        done = box.serve("hold", no_chmod=True)
        assert done.returncode == 0 and "kept the last good version" in done.stdout, done.stderr
    else:
        done = box.activate("version: 2 marlin\n", "2" * 64, no_chmod=True)
        assert "Rolled back" in done.stdout, done.stdout + done.stderr
    assert box.secrets.read_text() == f"VLLM_API_KEY={KEY}\n"
    for path in (box.secrets, box.state_dir / "proven-secrets"):
        assert oct(path.stat().st_mode & 0o777) == oct(0o600), path
    assert not list(box.secrets.parent.glob(".*thorfleet-tmp"))


def test_hold_with_nothing_proven_leaves_the_new_files(box):
    box.config.write_text("version: 2\n")
    done = box.serve("hold")
    assert done.returncode == 0 and "nothing proven to hold on to" in done.stdout
    assert box.config.read_text() == "version: 2\n"


def test_state_of_a_box_never_served(box):
    state = json.loads(box.serve("state").stdout)
    assert state == {"active": "inactive", "enabled": "enabled", "proven_fingerprint": None,
                     "secrets_proven": False, "healthy": False}


def test_without_its_layout_file_it_says_so(box, tmp_path):
    done = box.serve("state", layout_file=tmp_path / "missing.env")
    assert done.returncode != 0 and "missing.env" in done.stderr and "run the deploy" in done.stderr
    (tmp_path / "partial.env").write_text("STATE_DIR=/x\n")
    done = box.serve("state", layout_file=tmp_path / "partial.env")
    assert done.returncode != 0 and "lacks CONFIG, SECRETS_ENV, UNIT_DIR" in done.stderr


def _constants(path):
    tree = ast.parse(path.read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, (ast.Constant, ast.Tuple))}


def test_the_layout_the_deploy_writes_is_the_one_the_tool_reads():
    tool = _constants(TOOL)
    assert tool["LAYOUT"] == layout.BOX_LAYOUT_ENV
    written = dict(line.split("=", 1) for line in layout.layout_env_text().splitlines()
                   if not line.startswith("#"))
    # the file serves the watchdog too (RUN_DIR, USAGE_DIR): thorfleet-serve reads its own keys, in order
    assert tuple(key for key in written if key in tool["LAYOUT_KEYS"]) == tool["LAYOUT_KEYS"]
    assert written == {"STATE_DIR": layout.BOX_STATE, "CONFIG": layout.BOX_CONFIG,
                       "SECRETS_ENV": layout.BOX_SECRETS_ENV, "UNIT_DIR": layout.BOX_UNIT_DIR,
                       "RUN_DIR": layout.BOX_RUN_LOCK_DIR, "USAGE_DIR": layout.BOX_USAGE_DIR}


def test_a_roll_back_never_undoes_a_key_rotation(box):
    assert box.activate("version: 1\n", "1" * 64).returncode == 0
    old_unit = box.unit.read_text()
    # the operator rotates a leaked key and changes the config; the new version fails its proof
    box.secrets.write_text("VLLM_API_KEY=sk-rotated\n")
    box.unit.write_text("[Service]\nExecStart=v2\n")
    done = box.activate("version: 2 marlin\n", "2" * 64)
    assert done.returncode == 1
    assert ("its unit and config with the current secrets (a roll-back keeps a rotated key)"
            in done.stdout)
    # the unit and config are the last good ones, the key the rotated one, and proven with it
    assert box.unit.read_text() == old_unit and box.config.read_text() == "version: 1\n"
    assert box.secrets.read_text() == "VLLM_API_KEY=sk-rotated\n"
    state = json.loads(box.serve("state").stdout)
    assert state["proven_fingerprint"] == "1" * 64 and state["secrets_proven"] is True
    # and no file on the box holds the old key any more
    assert not any(KEY in path.read_text(errors="replace")
                   for path in box.state_dir.rglob("*") if path.is_file())


def test_the_box_says_whether_the_live_secrets_are_the_proven_ones_and_nothing_of_them(box):
    assert box.activate("version: 1\n", "1" * 64).returncode == 0
    assert json.loads(box.serve("state").stdout)["secrets_proven"] is True
    box.secrets.write_text("VLLM_API_KEY=sk-rotated\n")  # written by a deploy, not restarted yet
    said = box.serve("state").stdout
    assert json.loads(said)["secrets_proven"] is False
    assert "sk-" not in said


def test_hold_keeps_the_live_secrets(box):
    assert box.activate("version: 1\n", "1" * 64).returncode == 0
    box.config.write_text("version: 2\n")
    box.secrets.write_text("VLLM_API_KEY=sk-rotated\n")
    done = box.serve("hold")
    assert done.returncode == 0 and "the secrets stay the live ones" in done.stdout
    assert box.config.read_text() == "version: 1\n"
    assert box.secrets.read_text() == "VLLM_API_KEY=sk-rotated\n"


# The start-up lines each base's vLLM logs for its kernel choice (seen from the stand-in running
# the real 0.19.0, 0.26.0 and 0.33.0 packages): the proof reads each, and the Marlin fallback in
# each. From 0.26.0 a Thor's MoE is vLLM's CUTLASS (FlashInfer's excludes sm_110).
LOGGED = {
    "0.19.0": ["Using AttentionBackendEnum.TRITON_MLA backend.",
               "Using NvFp4LinearBackend.FLASHINFER_CUTLASS for NVFP4 GEMM",
               "Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend out of potential backends: [...]."],
    "0.26.0": ["INFO 12-01 21:54:22 [cuda.py:422] Using AttentionBackendEnum.TRITON_MLA backend.",
               ("INFO 12-01 21:54:22 [__init__.py:978] Using FlashInferCutlassNvFp4LinearKernel "
                "for NVFP4 GEMM"),
               ("INFO 12-01 21:54:22 [nvfp4.py:239] Using 'VLLM_CUTLASS' NvFp4 MoE backend "
                "out of potential backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', "
                "'FLASHINFER_CUTEDSL_BATCHED', 'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN', "
                "'HUMMING', 'EMULATION'].")],
    "0.33.0": ["INFO 12-02 04:58:10 [cuda.py:448] Using AttentionBackendEnum.TRITON_MLA backend.",
               ("INFO 12-02 04:58:10 [__init__.py:1303] Using FlashInferCutlassNvFp4LinearKernel "
                "for NVFP4 GEMM"),
               ("INFO 12-02 04:58:10 [nvfp4.py:314] Using 'VLLM_CUTLASS' NvFp4 MoE backend "
                "out of potential backends: ['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', "
                "'FLASHINFER_CUTEDSL_BATCHED', 'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN', "
                "'HUMMING', 'EMULATION'].")],
}


def serve_tool():
    return box_program("thorfleet-serve")


def test_a_streamed_tool_call_that_went_astray_is_refused_saying_where_it_went():
    # seen once in CI (a first install, under load): no tool call and no content; where the
    # tokens went (reasoning?) and into how many chunks vLLM merged them is what tells why
    tool = serve_tool()
    chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"delta": {"reasoning": '[TOOL_CALLS]get_weather{"city": "Paris"}'},
                            "finish_reason": "stop"}]}]
    with pytest.raises(tool.NotServing) as refused:
        tool.check_streamed_tool_call(chunks)
    assert ("(tool calls named [], content: '', reasoning: '[TOOL_CALLS]get_weather{\"city\": "
            "\"Paris\"}', in 2 chunks, finish_reason ['stop'])") in str(refused.value)
    # an exception in vLLM's stream generator: one more event, no choices
    cut = [chunks[0], {"error": {"message": "boom", "type": "BadRequestError", "code": 400}}]
    with pytest.raises(tool.NotServing) as refused:
        tool.check_streamed_tool_call(cut)
    assert "in 2 chunks, finish_reason [], errors ['boom'])" in str(refused.value)
    called = {"function": {"name": "get_weather", "arguments": ""}}
    tool.check_streamed_tool_call([{"choices": [{"delta": {"tool_calls": [called]}}]}])


@pytest.mark.parametrize("version", sorted(LOGGED))
def test_the_proof_reads_each_bases_kernel_lines_and_its_marlin_fallback(version):
    tool = serve_tool()
    log = "\n".join(LOGGED[version])
    assert all(pattern.search(log) for pattern in tool.KERNELS.values())
    assert not tool.MARLIN.search(log)
    marlin = log.replace("FlashInferCutlassNvFp4LinearKernel", "MarlinNvFp4LinearKernel").replace(
        "NvFp4LinearBackend.FLASHINFER_CUTLASS", "NvFp4LinearBackend.MARLIN")
    assert tool.MARLIN.search(marlin)
    assert tool.MARLIN.search(re.sub(r"'\w+' NvFp4 MoE", "'MARLIN' NvFp4 MoE", log))
    emulated = re.sub(r"'\w+' NvFp4 MoE", "'EMULATION' NvFp4 MoE", log)  # no CUTLASS MoE
    assert not all(pattern.search(emulated) for pattern in tool.KERNELS.values())


def test_a_base_that_chose_other_kernels_is_refused_naming_what_it_chose(tmp_path, monkeypatch):
    # vLLM 0.26.0 without FlashInfer: its own CUTLASS GEMM, which the proof does not accept (its
    # MoE is vLLM's CUTLASS on a Thor with FlashInfer or without)
    tool = serve_tool()
    log = "\n".join(LOGGED["0.26.0"]).replace(
        "FlashInferCutlassNvFp4LinearKernel", "CutlassNvFp4LinearKernel")
    monkeypatch.setattr(tool, "run", lambda *a, **k: SimpleNamespace(stdout=log))
    with pytest.raises(tool.NotServing) as refused:
        tool.check_startup_log("thorfleet-vllm", "now")
    assert "does not show FLASHINFER_CUTLASS NVFP4 GEMM" in str(refused.value)
    assert "Using CutlassNvFp4LinearKernel for NVFP4 GEMM" in str(refused.value)


@pytest.mark.parametrize("version", sorted(LOGGED))
def test_doctor_reads_the_kernels_with_the_proofs_own_patterns(version):
    # `thorfleet-serve kernels` (what doctor asks a serving box): each kernel's line, or None
    tool = serve_tool()
    found = tool.kernel_lines("\n".join(["INFO starting", *LOGGED[version]]))
    assert all(found["kernels"].values()) and found["marlin"] is None
    assert len(found["chosen"]) == 3
    emulated = tool.kernel_lines(re.sub(r"'\w+' NvFp4 MoE", "'EMULATION' NvFp4 MoE",
                                        "\n".join(LOGGED[version])))
    missing = [what for what, line in emulated["kernels"].items() if line is None]
    assert missing == ["a CUTLASS NVFP4 MoE (FLASHINFER_CUTLASS or VLLM_CUTLASS)"]


# --- what the deploy's proof refuses, and one setting in four places -----------------------------

def test_the_proof_refuses_inline_reasoning_and_a_tool_call_streamed_as_content():
    tool = box_program("thorfleet-serve")
    inline = {"message": {"content": "Thinking it over[/THINK]The answer", "reasoning": None},
              "finish_reason": "stop"}
    with pytest.raises(tool.NotServing, match="reasoning_effort=high did not split"):
        tool.check_reasoning_split(inline)
    tool.check_reasoning_split({"message": {"content": "The answer", "reasoning": "Thinking"}})
    as_content = [{"choices": [{"delta": {"content": "[TOOL_CALLS]get_weather"}}]},
                  {"choices": [{"delta": {"content": '{"city": "Paris"}'}}]}]
    with pytest.raises(tool.NotServing, match="without delta.tool_calls naming get_weather"):
        tool.check_streamed_tool_call(as_content)
    tool.check_streamed_tool_call([{"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"name": "get_weather", "arguments": ""}}]}}]}])


def test_one_setting_gives_vllm_docker_and_systemd_their_times():
    data = {"weights_model_revision": "a" * 40, "weights_draft_revision": "b" * 40,
            "image_base": "r/vllm@sha256:" + "c" * 64, "rollout_drain_timeout_s": 300}
    values, problems = schema.check(data, api_key="k" * 16)
    assert not problems
    s = Settings(values, api_key="k" * 16)
    assert re.search(r"^shutdown_timeout: 300 ", s.config_text, re.MULTILINE)
    assert f"ExecStop=/usr/bin/docker stop -t 330 {SERVICE}\n" in s.unit_text
    assert "\nTimeoutStopSec=360\n" in s.unit_text
    # thorfleet-serve reads the drain time back from the rendered config
    assert int(box_program("thorfleet-serve").SHUTDOWN_TIMEOUT.search(s.config_text)[1]) == 300
    assert schema.check({**data, "rollout_drain_timeout_s": 1.5}, api_key="k" * 16)[1] == [(
        "rollout_drain_timeout_s=1.5 must be a whole number of seconds, 0 or more "
        "(0: a restart cuts answers in flight)")]


@pytest.mark.parametrize("alone, seen, proven", [
    (12, 20, True),    # the picture's [IMG] tokens: vLLM took it as an image
    (12, 12, False),   # the same count: the picture was dropped
    (12, 11, False),
])
def test_a_vision_box_is_proven_by_the_tokens_its_picture_adds(alone, seen, proven, monkeypatch):
    tool = serve_tool()
    asked = []

    def post(port, label, path, body):
        content = body["messages"][0]["content"]
        asked.append(content)
        pictures = [c for c in content if c["type"] == "image_url"]
        return {"usage": {"prompt_tokens": seen if pictures else alone}}

    monkeypatch.setattr(tool, "post", post)
    image = (ROOT / "files" / "thor" / "bin" / "thorfleet-proof.png").read_bytes()
    if proven:
        tool.check_image(8002, image)
    else:
        with pytest.raises(tool.NotServing, match="did not take the picture as an image"):
            tool.check_image(8002, image)
    url = asked[1][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")  # a data: URL: the box fetches nothing


def test_the_proof_sends_a_picture_only_where_the_config_takes_images(tmp_path):
    tool = serve_tool()
    config = tmp_path / "vllm.yaml"
    config.write_text("max_model_len: 65536\nlimit_mm_per_prompt: {image: 4}\n")
    assert tool.takes_images(config)
    config.write_text("max_model_len: 65536\n# limit_mm_per_prompt: {image: 4}\n")
    assert not tool.takes_images(config)
    assert not tool.takes_images(tmp_path / "missing.yaml")
    assert tool.PROOF_IMAGE.name == Path(layout.BOX_PROOF_IMAGE).name
