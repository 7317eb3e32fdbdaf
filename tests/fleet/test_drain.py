"""A rollout does not cut an answer that is streaming: the box drains before it restarts.

The operator rolls a config change through a box while a client's answer streams. thorfleet-serve
reads vLLM's /metrics until no request runs, up to rollout_drain_timeout_s, and only then restarts;
vLLM itself is told the same time as its shutdown_timeout, and docker stop / systemd give it that
plus their margins. The stream ends with its finish_reason, and the restart comes after it.

The edit that breaks it: a thorfleet that neither waits nor gives the server time to finish
(thorfleet-serve restarting at once, no `shutdown_timeout`, and `docker stop -t 2`). On the real
0.19.0 server code uvicorn's own graceful shutdown keeps an open stream going after SIGTERM (its
handler replaces the launcher's), so what cuts an answer is docker stop's SIGKILL: the time
thorfleet gives the stop (rollout_drain_timeout_s + 30 s) and its own wait are what protect it.

The stream is a streamed /v1/completions: on the stand-in a chat answer is a fixed ~25 tokens,
only a raw completion runs to max_tokens (400 tokens, ~12 s at the EAGLE rate of 33.7 tok/s), one
SSE chunk per token through vLLM 0.19.0's own serving code. It is sent from inside the box.

The moment is made certain with thorfleet-serve's own lock: once the deploy has written the new
unit, the test holds the box's serve.lock; the deploy's serving step blocks on it; the stream
starts and shows on /metrics; the lock is let go, and thorfleet-serve finds the request running.

Uses the sixth box only, and leaves its server stopped (tests/fleet/test_sim_box.py wants it bare).
"""

import json
import re
import threading
import time

import pytest

from tests.helpers import SERVICE, deploy, edited_checkout

MAX_TOKENS = 400
PORT = 8002
LOCK = "/var/lib/thorfleet/serve.lock"
UNIT = f"/etc/systemd/system/{SERVICE}.service"
STREAM_SCRIPT = "/tmp/thorfleet-drain-stream.py"
LOCK_LOG = "/tmp/thorfleet-drain-lock.log"

# A client on the box: a streamed completion, read chunk by chunk (times on CLOCK_MONOTONIC, the
# clock systemd's *TimestampMonotonic use), one JSON line at the end.
STREAM = r'''
import http.client, json, sys, time
key = next((line.split("=", 1)[1].strip() for line in open("/etc/thorfleet/secrets.env")
            if line.startswith("VLLM_API_KEY=")), "")
body = {"model": "/model", "prompt": "def fib(n):", "max_tokens": int(sys.argv[1]),
        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
out = {"start": time.monotonic(), "first": None, "chunks": 0, "chars": 0, "finish_reason": None,
       "tokens": None, "done": False, "error": None}
try:
    conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[2]), timeout=300)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json", "Authorization": "Bearer " + key})
    response = conn.getresponse()
    out["status"] = response.status
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            out["done"] = True
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):  # the last chunk: how many tokens were streamed
            out["tokens"] = chunk["usage"]["completion_tokens"]
        choices = chunk["choices"]
        if not choices:
            continue
        choice = choices[0]
        out["chunks"] += 1
        out["first"] = out["first"] or time.monotonic()
        out["chars"] += len(choice.get("text") or "")
        out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
        out["last"] = time.monotonic()
except Exception as error:
    out["error"] = type(error).__name__ + ": " + str(error)
out["end"] = time.monotonic()
print(json.dumps(out))
'''

HOLD_LOCK = ("import fcntl, time; f = open('" + LOCK + "', 'w'); "
             "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('held', flush=True); "
             "time.sleep(600)")


# --- fleet: the story -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def host(sim_fleet, my_boxes):
    host = my_boxes[0]
    yield host
    # tests/fleet/test_sim_box.py plays with this box bare: no server holding its memory
    sim_fleet.exec(host, f"systemctl disable -q --now {SERVICE}", timeout=300)


@pytest.fixture(scope="module")
def roll(sim_fleet, host, tmp_path_factory):
    """roll(name, root=checkout, **group_data) -> Run: one deploy of the sixth box. The box
    starts converged."""
    workdir = tmp_path_factory.mktemp("drain")

    def run(name, **kwargs):
        root = kwargs.pop("root", None)
        inventory = sim_fleet.write_inventory(
            workdir / f"{name}.py", hosts=[host],
            extra_data={"rollout_report_path": str(workdir / f"{name}-report.json"),
                        "rollout_benchmark": "never", **kwargs})
        return deploy(inventory, **({"root": root} if root else {}))

    first = run("converge")
    assert first.returncode == 0, first.stderr[-4000:]
    code, out = sim_fleet.exec(host, ["sh", "-c", f"cat > {STREAM_SCRIPT} <<'EOF'\n{STREAM}EOF"])
    assert code == 0, out
    return run


def in_flight(sim_fleet, host):
    """vLLM's own gauges on the box's /metrics, summed over label sets."""
    _, text = sim_fleet.exec(host, f"curl -s http://127.0.0.1:{PORT}/metrics")
    counts = {}
    for name, value in re.findall(r"^(vllm:num_requests_(?:running|waiting))(?:\{.*\})?\s+(\S+)",
                                  text, re.MULTILINE):
        counts[name] = counts.get(name, 0) + float(value)
    return counts


def unit_times(sim_fleet, host):
    """(when the last stop began, when the server last became active), CLOCK_MONOTONIC s."""
    _, out = sim_fleet.exec(host, "systemctl show -p ActiveExitTimestampMonotonic "
                                  f"-p ActiveEnterTimestampMonotonic {SERVICE}")
    found = dict(line.split("=", 1) for line in out.split())
    return (int(found["ActiveExitTimestampMonotonic"]) / 1e6,
            int(found["ActiveEnterTimestampMonotonic"]) / 1e6)


def said_since(sim_fleet, host, epoch):
    """What thorfleet-serve logged to the box's journal since `epoch` (box clock)."""
    return sim_fleet.exec(host, f"journalctl -t thorfleet-serve -o cat --no-pager "
                                f"--since @{epoch}")[1]


def wait_for(what, check, timeout, deploying):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not deploying.is_alive():
            pytest.fail(f"the deploy ended before {what}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def roll_while_streaming(sim_fleet, host, roll, name, **kwargs):
    """Roll the box with a config change while a 400-token answer streams; returns (the deploy,
    the stream's JSON, the stand-in's gauges seen while it streamed, the unit's times)."""
    value = f"drain-{name}-{time.time_ns()}"
    began = int(sim_fleet.exec(host, "date +%s")[1].strip()) - 1
    done, stream = {}, {}
    deploying = threading.Thread(target=lambda: done.update(
        run=roll(name, service_extra_env={"THORFLEET_DRAIN_TEST": value}, **kwargs)))
    deploying.start()
    holder = None
    try:
        # The new unit is on the box: the deploy is executing, its plan (and its reads) done.
        wait_for("the new unit", lambda: sim_fleet.exec(host, f"grep -q {value} {UNIT}")[0] == 0,
                 900, deploying)
        _, out = sim_fleet.exec(host, f"setsid python3 -c \"{HOLD_LOCK}\" > {LOCK_LOG} 2>&1 & "
                                      "echo $!")
        holder = out.strip()
        wait_for("the test to hold serve.lock",
                 lambda: "held" in sim_fleet.exec(host, f"cat {LOCK_LOG}")[1], 30, deploying)
        # The serving step reads the box's state through thorfleet-serve, which waits for the lock.
        wait_for("the serving step to wait for the lock",
                 lambda: sim_fleet.exec(host, "pgrep -f 'thorfleet-serv[e] (state|activate)'")[0]
                 == 0, 600, deploying)
        def client():
            _, out = sim_fleet.exec(host, f"python3 {STREAM_SCRIPT} {MAX_TOKENS} {PORT}",
                                    timeout=300)
            try:
                stream.update(json.loads(out.splitlines()[-1]))
            except (ValueError, IndexError):
                stream.update(error=f"the client said: {out[-2000:]}")

        streaming = threading.Thread(target=client)
        streaming.start()
        seen = {}
        wait_for("the stream to show on /metrics", lambda: seen.update(
            in_flight(sim_fleet, host)) or seen.get("vllm:num_requests_running", 0) >= 1,
                 30, deploying)
    finally:
        if holder:
            sim_fleet.exec(host, f"kill {holder}")
    streaming.join(timeout=300)
    deploying.join(timeout=900)
    return (done["run"], stream, seen, unit_times(sim_fleet, host),
            said_since(sim_fleet, host, began))


def test_a_rollout_without_the_drain_cuts_the_stream(sim_fleet, host, roll, tmp_path):
    """The edit that breaks it: thorfleet-serve restarts at once. Known to cut the answer."""
    edited = edited_checkout(tmp_path / "no-drain", {
        "files/thor/bin/thorfleet-serve": [(
            '    if unit_state(service) != "active":\n        return 0\n',
            ("    if True:  # the edit: restart without waiting for requests in flight\n"
             "        return 0\n"))],
        # ...and a stop that does not wait for the answer: vLLM 0.19.0's uvicorn finishes open
        # streams on SIGTERM by itself, so only docker stop's SIGKILL cuts one
        "files/thor/vllm.yaml.j2": [("shutdown_timeout: {{ s.rollout_drain_timeout_s }}", "#")],
        "files/thor/systemd/thorfleet-vllm.service.j2": [
            ("docker stop -t {{ s.stop_timeout_s }}", "docker stop -t 2")]})
    run, stream, seen, (stop_began, _), said = roll_while_streaming(
        sim_fleet, host, roll, "no-drain", root=edited)
    assert run.returncode == 0, run.stderr[-4000:]
    assert seen["vllm:num_requests_running"] == 1, seen
    assert stream["start"] < stop_began < stream["end"], (stream, stop_began)
    assert stream["finish_reason"] != "length" and stream["chunks"] < MAX_TOKENS, stream
    assert "drain: waiting" not in said, said


def test_a_stream_survives_a_rollout_and_the_restart_comes_after_it(sim_fleet, host, roll):
    run, stream, seen, (stop_began, restarted), said = roll_while_streaming(
        sim_fleet, host, roll, "drained")
    measured = {"stream_s": stream["end"] - stream["start"],
                "stop_after_stream_end_s": stop_began - stream["end"],
                "active_after_stream_end_s": restarted - stream["end"],
                "chunks": stream["chunks"], "finish_reason": stream["finish_reason"],
                "metrics_while_streaming": seen, "thorfleet_serve_said": said}
    print(f"drain story: {json.dumps(measured)}")
    assert run.returncode == 0, run.stderr[-4000:]
    # The stand-in counts its running request with vLLM's own gauge (one label set per engine).
    assert seen["vllm:num_requests_running"] == 1 and seen["vllm:num_requests_waiting"] == 0, seen
    # The whole answer, every token (vLLM may put several in one chunk when the client lags:
    # its usage counts them), ended by its finish_reason and [DONE].
    assert stream["error"] is None and stream["status"] == 200, stream
    assert stream["finish_reason"] == "length" and stream["done"], stream
    assert stream["tokens"] == MAX_TOKENS, stream
    # The restart began after the stream ended, and the new server came after that.
    assert stream["end"] <= stop_began < restarted, measured
    # thorfleet-serve said what it waited for (journalctl -t thorfleet-serve on the box)
    assert re.search(r"drain: waiting up to 120s \(rollout_drain_timeout_s\) for 1 running "
                     r"request\(s\)", said), said
    assert "drain: no request in flight after" in said, said
