# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""The stand-in for ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor says no wherever a real Thor
would (issue 9): vLLM 0.19.0's own API server answers (auth, routes, the unpatched 400, tool calls
only through its own parser, streaming), kernels are chosen by vLLM's rules for sm_110 from the
same env vars, the model and the draft are read, vLLM's memory check runs against a Thor's
memory, and torch needs the nvidia runtime's libcuda.so.1.
"""

import json
import os
import re
import signal
import threading
import time

import pytest

from sim.base.testing import (  # noqa: F401
    SEED_CONFIG,
    SEED_ENV,
    SERVE_ARGS,
    base_image,
    derived_image,
    docker_client,
    model_dir,
    run_python,
    serving,
)

CHAT = {"model": "/model", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64,
        "temperature": 0}
TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
KEY = "s3cret"


@pytest.fixture(scope="module")
def derived(docker_client, base_image):
    return derived_image(docker_client, base_image)


def test_jetson_base_torch_needs_the_runtimes_libcuda(docker_client, base_image):
    # docs/facts.md "Thor realities" (dusty-nv/jetson-containers#1397): without --runtime nvidia,
    # importing torch (so vLLM) fails; with it the real packages are there in /opt/venv.
    out = run_python(docker_client, base_image, (
        "import importlib.metadata as m, shutil, sys; import vllm.entrypoints.openai.api_server; "
        "print(sys.executable, shutil.which('vllm'), "
        "*(m.version(p) for p in ('vllm', 'transformers', 'mistral_common', 'torch')))"))
    assert out.split() == ["/opt/venv/bin/python3", "/opt/venv/bin/vllm",
                           "0.19.0", "4.57.3", "1.11.0", "2.13.0+cpu"]
    plain = docker_client.containers.run(
        base_image, ["sh", "-c", "python3 -c 'import torch' 2>&1; echo rc=$?"], remove=True,
        network_mode="none").decode()
    assert "libcuda.so.1: cannot open shared object file" in plain and "rc=1" in plain
    # mistral_common alone (what export_v15_tokenizer runs, without the runtime) still works.
    assert run_python(docker_client, base_image, "import mistral_common; print('ok')",
                      runtime="runc").strip() == "ok"


def test_serves_with_the_seed_environment(docker_client, base_image, model_dir):
    env = {**SEED_ENV, "VLLM_API_KEY": KEY, "THORFLEET_SIM_LOAD_SECONDS": "8"}
    with serving(docker_client, base_image, model_dir, env=env) as server:
        server.wait_log("for NVFP4 GEMM")
        assert server.refuses_inside()  # loading: the port refuses (docs/facts.md "The container")
        server.wait_healthy()
        log = server.logs()
        # platforms/cuda.py L274; nvfp4_utils.py L85; flashinfer_utils.py L111 ("latency" is
        # TRT-LLM, family 100 only, so CUTLASS on sm_110); oracle/nvfp4.py L185.
        assert "[cuda.py:274] Using AttentionBackendEnum.TRITON_MLA backend." in log
        assert "Using NvFp4LinearBackend.FLASHINFER_CUTLASS for NVFP4 GEMM" in log
        assert "Flashinfer TRTLLM MOE backend is only supported on SM100" in log
        assert "Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend" in log
        assert "marlin_utils_fp4" not in log
        # the text model inside Pixtral's wrapper (the checkpoint has a vision encoder), its
        # images off (--language-model-only): multimodal/registry.py L126
        assert "Resolved architecture: PixtralForConditionalGeneration" in log
        assert "running in text-only mode" in log
        # vLLM's own auth middleware: /v1/* only (docs/facts.md "Thor realities", server_utils.py
        # ~L38-80).
        assert server.request("GET", "/v1/models") == (401, {"error": "Unauthorized"})
        assert server.request("GET", "/version") == (200, {"version": "0.19.0"})
        status, models = server.request("GET", "/v1/models", key=KEY)
        assert status == 200 and models["data"][0]["id"] == "/model"
        completion = {"model": "/model", "prompt": "def fib(n):", "max_tokens": 16,
                      "temperature": 0}
        status, body = server.request("POST", "/v1/completions", key=KEY, body=completion)
        assert status == 200 and body["usage"]["completion_tokens"] == 16
        assert body["choices"][0]["finish_reason"] == "length"  # runs to max_tokens
        # /invocations (SageMaker router) answers without the key (vllm #58144).
        status, body = server.request("POST", "/invocations", body=completion)
        assert status == 200 and body["usage"]["completion_tokens"] == 16
        # The unpatched chat 400, word for word (docs/facts.md "The chat-template bug").
        status, body = server.request("POST", "/v1/chat/completions", body=CHAT, key=KEY)
        assert (status, body) == (400, {"error": {
            "message": "Kwargs ['reasoning_effort'] are not supported by "
                       "`MistralCommonTokenizer.apply_chat_template`.",
            "type": "BadRequestError", "param": None, "code": 400}})
        # Streaming: the tokens in chunks as they come, then [DONE]. Not one chunk per token: the
        # output handler hands on everything a request produced since its last read
        # (v1/engine/output_processor.py RequestOutputCollector.put merges), so on a loaded
        # machine two tokens can share a chunk (CI saw ' token token').
        status, events = server.request("POST", "/v1/completions", key=KEY,
                                        body={**completion, "max_tokens": 5, "stream": True})
        chunks = [json.loads(line[6:]) for line in events.splitlines()
                  if line.startswith("data: {")]
        texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
        assert status == 200 and events.rstrip().endswith("data: [DONE]")
        assert "".join(texts) == " token" * 5 and len(texts) > 1, texts
        status, metrics = server.request("GET", "/metrics")
        assert status == 200 and re.search(r"vllm:generation_tokens_total\{[^}]*\} 3[67]\.0",
                                           metrics), metrics
        # EAGLE: the scheduler's draft counters, 1.87 accepted per step of 3 drafted (0.62, fitted
        # to the seed's 33.7 tok/s: bench/results/standin-model.json); a few steps, so roughly
        counts = {name: float(value) for name, value in re.findall(
            r"^vllm:spec_decode_(num_drafts|num_draft_tokens|num_accepted_tokens)_total\{[^}]*\} "
            r"(\S+)$", metrics, re.MULTILINE)}
        assert counts["num_drafts"] > 0, metrics
        assert 0.55 < counts["num_accepted_tokens"] / counts["num_draft_tokens"] < 0.7, counts
        # the seed's `enable_prefix_caching: false` is dropped by --config (utils/argparse_utils.py
        # L502-504), so vLLM 0.19.0 caches by default: prompts are looked up (too short to hit)
        cache = prefix_cache(metrics)
        assert cache["queries"] > 0 and cache["hits"] == 0, metrics


def test_marlin_only_the_way_an_operator_reaches_it(docker_client, base_image, model_dir):
    # VLLM_NVFP4_GEMM_BACKEND=marlin (nvfp4_utils.py L66) and VLLM_TEST_FORCE_FP8_MARLIN
    # (oracle/nvfp4.py L240): the MoE warning comes from marlin_utils_fp4.py L298.
    env = {**SEED_ENV, "VLLM_NVFP4_GEMM_BACKEND": "marlin", "VLLM_USE_FLASHINFER_MOE_FP4": "0",
           "VLLM_TEST_FORCE_FP8_MARLIN": "1"}
    with serving(docker_client, base_image, model_dir, env=env) as server:
        server.wait_log("Loading weights took")
        log = server.logs()
    assert "Using NvFp4LinearBackend.MARLIN for NVFP4 GEMM" in log
    assert "[marlin_utils_fp4.py:298] Your GPU does not have native support for FP4" in log
    assert "Using 'MARLIN' NvFp4 MoE backend" in log


# The MLA error, vLLM's memory message, the missing /eagle and the kernels vLLM picks without the
# seed's env are the fleet's stories (tests/fleet/test_thor_says_no.py), through a real deploy.
@pytest.mark.parametrize("case", ["shard", "option"])
def test_start_up_fails_as_vllm_does(docker_client, base_image, model_dir, tmp_path, case):
    kwargs, expect, code = {}, "", 1
    if case == "shard":
        model = tmp_path / "model"
        model.mkdir()
        for f in model_dir.iterdir():
            if "00009-of" not in f.name:
                (model / f.name).write_bytes(f.read_bytes())
        (tmp_path / "model.eagle").symlink_to(model_dir.with_name(model_dir.name + ".eagle"))
        kwargs["model"] = model
        expect = "ValueError: Following weights were not initialized from checkpoint"
    elif case == "option":  # an option vLLM does not know: usage error, exit 2
        kwargs["config"] = SEED_CONFIG + "no_such_key: 1\n"
        expect, code = "unrecognized arguments", 2
    model = kwargs.pop("model", model_dir)
    with serving(docker_client, base_image, model, **kwargs) as server:
        assert server.wait_exit() == code, server.logs()
        log = server.logs()
    assert expect in log, log
    if case == "shard":
        assert "EngineCore failed to start." in log


def test_memory_held_and_page_cache_filled_on_a_box(docker_client, base_image, model_dir,
                                                    tmp_path):
    """The box's memory protocol (/run/thorsim): the server holds 0.72 x MemTotal for its life,
    and reading the model leaves index total_size + draft bytes in the page cache."""
    thorsim = tmp_path / "thorsim"
    (thorsim / "holds").mkdir(parents=True)
    (thorsim / "cache").mkdir()
    thorsim.chmod(0o777)
    with serving(docker_client, base_image, model_dir, thorsim=thorsim) as server:
        server.wait_healthy()
        holds = list((thorsim / "holds").iterdir())
        assert len(holds) == 1
        assert int(holds[0].read_text().splitlines()[0]) == -(-(122 * (1 << 30)) * 72 // 100)
        _, out = server.container.exec_run(["python3", "-c", (
            "import fcntl, sys; f = open(sys.argv[1]); "
            "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)"), f"/run/thorsim/holds/{holds[0].name}"])
        assert b"BlockingIOError" in out  # still locked by the server
        index = model_dir / "consolidated.safetensors.index.json"
        st = index.stat()
        cached = int((thorsim / "cache" / f"{st.st_dev}-{st.st_ino}").read_text().split()[0])
        draft = model_dir.with_name(model_dir.name + ".eagle")
        total = json.loads(index.read_text())["metadata"]["total_size"]
        assert cached == total + sum(f.stat().st_size for f in draft.iterdir() if f.is_file())


def test_tool_calls_only_through_vllms_parser(docker_client, derived, model_dir):
    with serving(docker_client, derived, model_dir) as server:
        server.wait_healthy()
        status, body = server.request("POST", "/v1/chat/completions",
                                      body={**CHAT, "tools": [TOOL]})
        assert status == 200, body
        call = body["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
        status, body = server.request("POST", "/v1/chat/completions",
                                      body={**CHAT, "reasoning_effort": "high"})
        assert status == 200, body
        # The prompt ends in [THINK] (prefilled by the patch), so the output has [/THINK] without
        # [THINK]: 0.19.0's MistralReasoningParser (mistral_reasoning_parser.py L144-153) drops
        # the [/THINK] and returns trace + answer as content, with no reasoning field.
        message = body["choices"][0]["message"]
        assert message["content"].startswith("Thinking it over") and "[/THINK]" not in message[
            "content"], message
        # temperature > 0: sometimes the model answers in text instead.
        answers = {bool(server.request("POST", "/v1/chat/completions", body={
            **CHAT, "tools": [TOOL], "temperature": 1.0, "seed": seed})[1]["choices"][0]
            ["message"]["tool_calls"]) for seed in range(8)}
        assert answers == {True, False}
        # An answer that ended no longer runs: vLLM's gauge is the scheduler's count
        # (v1/metrics/loggers.py), and the drain before a restart reads it.
        status, metrics = server.request("GET", "/metrics")
        assert re.search(r"^vllm:num_requests_running\{[^}]*\} 0\.0$", metrics, re.MULTILINE), metrics
    # Without the parser options no parser runs and the call is plain content: the fleet's
    # story "drop the tool-call parser options" (tests/fleet/test_thor_says_no.py).


def test_shutdown_finishes_answers_in_flight_for_shutdown_timeout(docker_client, base_image,
                                                                   model_dir):
    # entrypoints/launcher.py L95-115 (docs/facts.md "Thor realities"): on SIGTERM, vLLM calls
    # the engine's shutdown with --shutdown-timeout; requests in flight are finished for up to that
    # long, then aborted. 0 (the default) aborts them at once.

    env = {**SEED_ENV, "VLLM_API_KEY": KEY}
    stream = {"model": "/model", "prompt": "def fib(n):", "max_tokens": 100, "temperature": 0,
              "stream": True}
    for timeout, finish in ((30, "length"), (0, "abort")):
        args = (*SERVE_ARGS, "--shutdown-timeout", str(timeout))
        with serving(docker_client, base_image, model_dir, env=env, args=args) as server:
            server.wait_healthy()
            got = {}

            def read(server=server, got=got):
                try:
                    got["answer"] = server.request("POST", "/v1/completions", key=KEY, body=stream)
                except OSError as error:
                    got["answer"] = (None, str(error))

            reader = threading.Thread(target=read)
            reader.start()
            time.sleep(1)  # ~30 of the 100 tokens at 33.7 tok/s
            server.container.stop(timeout=60)  # docker stop: SIGTERM, then the shutdown
            reader.join(timeout=60)
            _, events = got["answer"]
            chunks = [c["choices"][0] for c in (json.loads(line[6:]) for line in
                      str(events).splitlines() if line.startswith("data: {")) if c["choices"]]
            finishes = [c["finish_reason"] for c in chunks]
            # A client that falls behind gets several tokens in one chunk (vLLM's own
            # OutputProcessor runs here: v1/engine/output_processor.py L45, RequestOutputCollector
            # merges deltas): count the text, not the lines (loaded CI saw 100 tokens in 92).
            tokens = "".join(c["text"] for c in chunks).count(" token")
            if finish == "length":
                assert finishes[-1] == "length" and tokens == 100, events[-500:]
            else:
                assert "length" not in finishes and tokens < 100, events[-500:]


def test_max_num_seqs_decode_at_once_and_the_rest_wait(docker_client, base_image, model_dir):
    # The seed's max_num_seqs: 1 (SEED_CONFIG): three requests at once run one after another,
    # the two behind counted in vllm:num_requests_waiting as vLLM's scheduler reports them
    # (v1/core/sched/scheduler.py L568, L1957).
    # With prefix caching off as thorfleet's vllm.yaml turns it off: no lookup is counted.
    env = {**SEED_ENV, "VLLM_API_KEY": KEY}
    body = {"model": "/model", "prompt": "def fib(n):", "max_tokens": 34, "temperature": 0}
    config = SEED_CONFIG + "no-enable-prefix-caching: true\n"
    with serving(docker_client, base_image, model_dir, env=env, config=config) as server:
        server.wait_healthy()
        ended = []

        def one(server=server):
            server.request("POST", "/v1/completions", key=KEY, body=body)
            ended.append(time.monotonic())

        began = time.monotonic()
        threads = [threading.Thread(target=one) for _ in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        _, metrics = server.request("GET", "/metrics")
        for thread in threads:
            thread.join(timeout=30)
        _, after = server.request("GET", "/metrics")
    assert prefix_cache(after) == {"queries": 0.0, "hits": 0.0}, after
    gauge = {name: float(value) for name, value in re.findall(
        r"^vllm:num_requests_(running|waiting)\{[^}]*\} (\S+)$", metrics, re.MULTILINE)}
    assert gauge == {"running": 1.0, "waiting": 2.0}, metrics
    # 34 tokens at 33.7 tok/s is ~1 s each: one after another they end ~1, ~2 and ~3 s in
    assert [round(t - began) for t in sorted(ended)] == [1, 2, 3], ended


def test_a_frozen_engine_core_looks_like_a_hung_gpu(docker_client, base_image, model_dir):
    # vLLM V1 runs its engine core as a process of its own titled VLLM::EngineCore
    # (v1/engine/core.py L1054-1055): an operator finds it with `docker top` and freezes it with
    # SIGSTOP. The API server then answers /health 200 (AsyncLLM.check_health asks only whether
    # the engine core died, v1/engine/async_llm.py L874-877) while no request finishes.
    env = {**SEED_ENV, "VLLM_API_KEY": KEY}
    body = {"model": "/model", "prompt": "ping", "max_tokens": 1}
    with serving(docker_client, base_image, model_dir, env=env) as server:
        server.wait_healthy()
        top = server.container.top(ps_args="-eo pid,args")
        cores = [int(pid) for pid, args in top["Processes"] if args.startswith("VLLM::EngineCore")]
        assert len(cores) == 1, top
        assert server.request("POST", "/v1/completions", key=KEY, body=body, timeout=10)[0] == 200
        os.kill(cores[0], signal.SIGSTOP)
        try:
            assert server.request("GET", "/health", timeout=10)[0] == 200
            with pytest.raises(TimeoutError):
                server.request("POST", "/v1/completions", key=KEY, body=body, timeout=5)
        finally:
            os.kill(cores[0], signal.SIGCONT)
        # thawed, it answers again
        assert server.request("POST", "/v1/completions", key=KEY, body=body, timeout=30)[0] == 200


def prefix_cache(metrics: str) -> dict:
    return {name: float(value) for name, value in re.findall(
        r"^vllm:prefix_cache_(queries|hits)_total\{[^}]*\} (\S+)$", metrics, re.MULTILINE)}


def test_prefix_cache_hits_whole_blocks_as_vllm_reports_them(docker_client, base_image,
                                                             model_dir):
    """enable_prefix_caching on (what thorfleet's service_prefix_caching renders): the same long
    prompt twice, the second's usage says how many of its tokens came from the cache, in whole
    16-token blocks less the last token's block and, with the seed's EAGLE draft, one more
    (standin_core.py cites vLLM's rules); vLLM's counters count every prompt token looked up and
    every one found. THORFLEET_SIM_HIT_ANSWERS_DIFFER answers the hit with other tokens."""
    config = SEED_CONFIG.replace("enable_prefix_caching: false", "enable_prefix_caching: true") \
        + "enable_prompt_tokens_details: true\n"
    env = {**SEED_ENV, "THORFLEET_SIM_HIT_ANSWERS_DIFFER": "1"}
    body = {"model": "/model", "prompt": "def fib(n):\n" + "    # the same long preamble\n" * 40,
            "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    with serving(docker_client, base_image, model_dir, config=config, env=env) as server:
        server.wait_healthy()
        answers = [server.request("POST", "/v1/completions", body=body) for _ in range(2)]
        _, metrics = server.request("GET", "/metrics")
        # a prompt longer than the context that starts with the cached one: vLLM's 400 all the
        # same (its token ids, so the length is exact and nothing is tokenized)
        ids = answers[0][1]["choices"][0]["prompt_token_ids"]
        too_long = server.request("POST", "/v1/completions", body={
            **body, "prompt": ids + ids[-1:] * 70000})
    assert too_long[0] == 400 and "context length" in json.dumps(too_long[1]), too_long
    (status1, first), (status2, second) = answers
    assert status1 == status2 == 200, answers
    prompt = first["usage"]["prompt_tokens"]
    assert prompt > 100 and first["usage"].get("prompt_tokens_details") is None, first
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == ((prompt - 1) // 16 - 1) * 16, (prompt, second["usage"])
    assert prefix_cache(metrics) == {"queries": 2.0 * prompt, "hits": float(cached)}, metrics
    # temperature 0: the same answer, unless the knob says a hit changes it
    assert first["choices"][0]["text"] == " token" * 4
    assert second["choices"][0]["text"] == " cached" * 4
