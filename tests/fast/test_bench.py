"""The benchmark's arithmetic (files/thor/bin/thorfleet-bench against a local http.server standing in for
vLLM) and the fleet gate (operations.verification: bench_verdict, benchmark_gate)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from pyinfra.api import FunctionCommand
from pyinfra.api.operation import OperationMeta
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host

from tests.helpers import box_program
from thorfleet.operations import verification
from thorfleet.run.runstate import run_state
from thorfleet.settings import layout

KEY = "sk-bench-test"


def load_bench():
    return box_program("thorfleet-bench")


bench = load_bench()


class FakeVllm:
    """/v1/completions streamed as vLLM does (a chunk per token at `rate` after `ttft` seconds, a
    usage chunk, [DONE]); /metrics with spec-decode counters that grow by `accepted`/`drafted`
    per request (omitted with spec=False). Requests without the API key answer 401."""

    def __init__(self, tokens=20, rate=200.0, ttft=0.05, spec=True, accepted=30, drafted=48):
        self.tokens, self.rate, self.ttft, self.spec = tokens, rate, ttft, spec
        self.accepted, self.drafted, self.requests, self.bodies = accepted, drafted, 0, []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                lines = ["# HELP vllm:num_requests_running Number of requests.",
                         'vllm:num_requests_running{engine="0",model_name="/model"} 0.0']
                if fake.spec:
                    n = fake.requests
                    lines += [
                        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {n * fake.accepted}.0',
                        f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {n * fake.drafted}.0',
                        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {n}.0',
                        "vllm:spec_decode_num_accepted_tokens_created{engine=\"0\"} 1.7e9",
                    ]
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.headers.get("Authorization") != f"Bearer {KEY}":
                    self.send_error(401)
                    return
                fake.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                time.sleep(fake.ttft)
                for i in range(body["max_tokens"] if fake.tokens is None else fake.tokens):
                    if i:
                        time.sleep(1 / fake.rate)
                    chunk = {"choices": [{"index": 0, "text": " tok", "finish_reason": None}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                fake.requests += 1
                usage = {"choices": [], "usage": {"completion_tokens": fake.tokens}}
                self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def layout_file(tmp_path):
    secrets = tmp_path / "secrets.env"
    secrets.write_text(f"VLLM_API_KEY={KEY}\n")
    path = tmp_path / "layout.env"
    path.write_text(f"# test layout\nSTATE_DIR={tmp_path}\nSECRETS_ENV={secrets}\n")
    return path


def test_the_bench_looks_for_the_layout_where_the_deploy_writes_it():
    assert bench.LAYOUT == layout.BOX_LAYOUT_ENV


def test_rate_counts_the_whole_request_and_ttft_the_first_token(layout_file, capsys):
    with FakeVllm(tokens=20, rate=200.0, ttft=0.05) as fake:
        assert bench.main(["--port", str(fake.port), "--layout", str(layout_file),
                           "--max-tokens", "20"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert fake.requests == 4  # one warm-up, three runs
    assert all(b["temperature"] == 0 and b["stream"] and b["max_tokens"] == 20
               and "red-black tree" in b["prompt"] for b in fake.bodies)
    assert [r["tokens"] for r in result["runs"]] == [20, 20, 20]
    for run in result["runs"]:
        assert run["tok_s"] == pytest.approx(run["tokens"] / run["seconds"], rel=0.01)
    # 20 tokens in 0.05 s + 19/200 s = 0.145 s: ~138 tok/s, not the 200 of the decode alone
    assert 90 < result["tok_s"] < 145
    assert 0.045 < result["ttft_s"] < 0.1
    # 3 runs x 30 accepted over 3 x 48 drafted, the warm-up's left out
    assert result["eagle_acceptance"] == pytest.approx(0.625)
    assert result["spec_decode_metrics"] is True


def test_no_spec_decode_counters_means_no_acceptance(layout_file, capsys):
    with FakeVllm(tokens=3, ttft=0, spec=False) as fake:
        assert bench.main(["--port", str(fake.port), "--layout", str(layout_file)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["eagle_acceptance"] is None and result["spec_decode_metrics"] is False


def test_counters_that_never_move_mean_no_acceptance(layout_file, capsys):
    with FakeVllm(tokens=3, ttft=0, accepted=0, drafted=0) as fake:
        assert bench.main(["--port", str(fake.port), "--layout", str(layout_file)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["eagle_acceptance"] is None and result["spec_decode_metrics"] is True


def test_acceptance_reads_prometheus_text():
    before = bench.counters('vllm:spec_decode_num_accepted_tokens_total{engine="0"} 10.0\n'
                            'vllm:spec_decode_num_accepted_tokens_total{engine="1"} 5.0\n'
                            "vllm:spec_decode_num_draft_tokens_total 30\n")
    after = bench.counters('vllm:spec_decode_num_accepted_tokens_total{engine="0"} 40.0\n'
                           'vllm:spec_decode_num_accepted_tokens_total{engine="1"} 15.0\n'
                           "vllm:spec_decode_num_draft_tokens_total 90\n")
    assert bench.acceptance(before, after) == pytest.approx(40 / 60)
    assert bench.acceptance({}, after) is None


def test_a_wrong_key_is_an_error_line_and_a_failure(tmp_path, capsys):
    layout_file = tmp_path / "layout.env"
    (tmp_path / "secrets.env").write_text("VLLM_API_KEY=wrong\n")
    layout_file.write_text(f"SECRETS_ENV={tmp_path / 'secrets.env'}\n")
    with FakeVllm() as fake:
        assert bench.main(["--port", str(fake.port), "--layout", str(layout_file)]) == 1
    assert "401" in json.loads(capsys.readouterr().out)["error"]


# --- the fleet gate -------------------------------------------------------------------------

def test_the_gate_fails_below_the_median_fraction_or_the_floor():
    fleet = [33.7, 33.5, 33.6]
    assert verification.bench_verdict(33.5, fleet, 0.8, 27) == (33.6, [])
    median, problems = verification.bench_verdict(17.5, [*fleet, 17.5], 0.8, 27)
    assert median == pytest.approx(33.55)
    assert len(problems) == 2 and "floor of 27" in problems[0] and "0.52x" in problems[1]
    # a fleet all slow passes the median check but not the floor
    assert verification.bench_verdict(17.5, [17.5, 17.6], 0.8, 27)[1] == [
        "17.5 tok/s is below the floor of 27 tok/s (rollout_bench_min_toks)"]
    # fast enough for the floor, but a fifth below the others
    assert "rollout_bench_min_fraction" in verification.bench_verdict(28.0, [36.0, 36.0, 28.0], 0.8, 27)[1][0]


class GateHost(SimpleNamespace):
    def log_styled(self, message, **kwargs):
        self.logged.append(message)


def gate(results, name):
    state = SimpleNamespace()
    run_state(state).benchmarks.update(results)
    fake = GateHost(name=name, state=state, logged=[], noop=lambda message: None)
    with ctx_host.use(fake):
        commands = list(verification.benchmark_gate._inner(min_fraction=0.8, floor=27))
    if not commands:  # not benchmarked in this run
        return None, run_state(state)
    (command,) = commands
    assert isinstance(command, FunctionCommand)
    return command.function(state, fake), run_state(state)


def test_the_gate_operation_fails_the_slow_host_and_records_why():
    results = {"thor-3": {"tok_s": 33.7}, "thor-4": {"tok_s": 33.6}, "thor-5": {"tok_s": 17.5}}
    ok, run = gate(results, "thor-5")
    assert ok is False
    assert "too slow" in run.errors["thor-5"][0] and "0.52x the fleet median 33.6" in \
        run.errors["thor-5"][0]
    assert run.benchmarks["thor-5"]["passed"] is False
    ok, run = gate(results, "thor-3")
    assert ok is True and run.benchmarks["thor-3"]["vs_median"] == pytest.approx(1.003, abs=1e-3)
    assert gate(results, "thor-9")[0] is None  # not benchmarked: nothing to judge, no command


def test_a_first_install_is_benchmarked_unless_told_otherwise():
    assert verification.wants_benchmark("first-install", True)
    assert not verification.wants_benchmark("first-install", False)
    assert verification.wants_benchmark("always", False)
    assert not verification.wants_benchmark("never", True)


def test_first_install_benchmarks_the_hosts_the_first_installs_step_starts():
    # pyinfra's own result of that step: what it will do when planned, what it did once executed
    def planned(starts):
        return OperationMeta("first-installs", is_change=starts)

    def executed(started):  # planned to start it: executed, it found nothing to do
        step = OperationMeta("first-installs", is_change=True)
        step.set_complete(True, ["activate"] if started else [], CommandOutput([]))
        return step

    for step, benchmarked in ((planned(True), True), (planned(False), False),
                              (executed(True), True), (executed(False), False), (None, False)):
        fake = GateHost(name="thor-1", state=SimpleNamespace(), logged=[], noop=lambda _: None)
        with ctx_host.use(fake):
            commands = list(verification.benchmark._inner(port=8002, when="first-install",
                                                  first_installs_step=step))
        assert bool(commands) == benchmarked, step


def test_the_latency_proxy_delays_each_way_and_keeps_the_bytes_in_order():
    import socket
    import threading
    import time

    from bench.latency import DelayProxy

    server = socket.create_server(("127.0.0.1", 0))

    def echo():
        connection, _ = server.accept()
        with connection:
            data = connection.recv(65536)
            while data:
                connection.sendall(data)
                data = connection.recv(65536)

    threading.Thread(target=echo, daemon=True).start()
    proxy = DelayProxy(server.getsockname()[1], one_way_ms=60)
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
            started = time.monotonic()
            client.sendall(b"ping-" * 1000)
            got = b""
            while len(got) < 5000:
                got += client.recv(65536)
            took = time.monotonic() - started
        assert got == b"ping-" * 1000
        assert took >= 0.12, took  # one round trip: 60 ms there, 60 ms back
    finally:
        proxy.close()
        server.close()
