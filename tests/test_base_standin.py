# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""The stand-in for ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor behaves as FACTS.md says the
real image does: same packages and versions in /opt/venv, `vllm serve` reading the same YAML and
flags, the same start-up log, the memory gate, the port closed while loading, /v1/* behind the
key, and chat failing with 400 on the unpatched image but working on the derived one.
"""

import json

import pytest

from tests.sim.base.testing import (  # noqa: F401
    base_image,
    derive,
    docker_client,
    model_dir,
    run_python,
    serving,
)

CHAT = {"model": "/model", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64}
TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
GIB = 1 << 30


def meminfo(available_gib: float, total_gib: float = 122) -> str:
    return (f"MemTotal: {int(total_gib * GIB / 1024)} kB\n"
            f"MemFree: {int(available_gib * GIB / 1024)} kB\n"
            f"MemAvailable: {int(available_gib * GIB / 1024)} kB\n")


# Thor after a clean start: ~117 GB usable, well above 0.72 x total.
ROOMY = {"THORFLEET_SIM_MEMINFO": "/sim/meminfo"}


@pytest.fixture(scope="module")
def derived(docker_client, base_image):
    tag = "thorfleet-test/standin:patched"
    code, output = derive(base_image, tag)
    assert code == 0, output
    yield tag
    docker_client.images.remove(tag, force=True)


def test_base_has_the_real_packages_in_opt_venv(docker_client, base_image):
    out = run_python(docker_client, base_image, (
        "import importlib.metadata as m, shutil, sys; "
        "import vllm.tokenizers.mistral, vllm.reasoning.mistral_reasoning_parser; "
        "print(sys.executable, shutil.which('vllm'), "
        "*(m.version(p) for p in ('vllm', 'transformers', 'mistral_common', 'torch')))"))
    assert out.split() == ["/opt/venv/bin/python3", "/opt/venv/bin/vllm",
                           "0.19.0", "4.57.3", "1.11.0", "2.13.0+cpu"]


def test_v15_test_tokenizer(docker_client, base_image, model_dir):
    tekken = json.loads((model_dir / "tekken.json").read_text())
    assert tekken["config"]["version"] == "v15"
    tokens = {t["token_str"] for t in tekken["special_tokens"]}
    assert {"[THINK]", "[/THINK]", "[MODEL_SETTINGS]", "[/MODEL_SETTINGS]", "[INST]"} <= tokens
    # mistral_common itself takes it for a v15 tokenizer with model settings.
    out = docker_client.containers.run(
        base_image, ["python3", "-c", (
            "from mistral_common.tokens.tokenizers.mistral import MistralTokenizer as T; "
            "t = T.from_file('/model/tekken.json').instruct_tokenizer.tokenizer; "
            "print(t.version.value, t.model_settings_builder is not None)")],
        remove=True, network_mode="none",
        volumes={str(model_dir): {"bind": "/model", "mode": "ro"}}).decode()
    assert out.split() == ["v15", "True"]


def test_serves_after_loading_with_the_thor_log(docker_client, base_image, model_dir):
    env = {**ROOMY, "VLLM_API_KEY": "s3cret", "THORFLEET_SIM_LOAD_SECONDS": "14"}
    with serving(docker_client, base_image, model_dir, env=env,
                 files={"meminfo": meminfo(117)}) as server:
        # Kernels chosen, weights still "loading": nothing listens on the port yet.
        server.wait_log("for NVFP4 GEMM")
        assert server.refuses_inside()
        assert server.wait_healthy() > 1
        log = server.logs()
        assert "Using AttentionBackendEnum.TRITON_MLA backend." in log
        assert "Using NvFp4LinearBackend.FLASHINFER_CUTLASS for NVFP4 GEMM" in log
        assert "Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend" in log
        assert "marlin_utils_fp4" not in log
        # Open endpoints; /v1/* only with the key.
        assert server.request("GET", "/version") == (200, {"version": "0.19.0"})
        status, metrics = server.request("GET", "/metrics")
        assert status == 200 and "vllm:num_requests_running" in metrics
        assert server.request("GET", "/v1/models") == (401, {"error": "Unauthorized"})
        status, models = server.request("GET", "/v1/models", key="s3cret")
        assert status == 200 and models["data"][0]["id"] == "/model"
        # Completions work on the base image; chat fails exactly as on a Thor.
        status, body = server.request("POST", "/v1/completions", key="s3cret", body={
            "model": "/model", "prompt": "def fib(n):", "max_tokens": 16})
        assert status == 200 and body["usage"]["completion_tokens"] == 16
        status, body = server.request("POST", "/v1/chat/completions", body=CHAT, key="s3cret")
        assert status == 400
        assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400
        assert "Kwargs ['reasoning_effort'] are not supported" in body["error"]["message"]


def test_marlin_fallback_shows_in_the_log(docker_client, base_image, model_dir):
    with serving(docker_client, base_image, model_dir, env={**ROOMY, "THORFLEET_SIM_MARLIN": "1"},
                 files={"meminfo": meminfo(117)}) as server:
        server.wait_healthy()
        assert "marlin_utils_fp4" in server.logs()


def test_refuses_to_start_without_free_memory(docker_client, base_image, model_dir):
    # The previous container's weights still in the page cache: 26 GiB available of 122.
    with serving(docker_client, base_image, model_dir, env=ROOMY,
                 files={"meminfo": meminfo(26)}) as server:
        assert server.wait_exit() != 0
        log = server.logs()
    assert ("ValueError: Free memory on device cuda:0 (26.0/122.0 GiB) on startup is less than "
            "desired GPU memory utilization (0.72, 87.84 GiB)") in log


@pytest.mark.parametrize("args, config_extra", [
    (["--no-such-option", "1"], ""),
    ([], "no_such_key: 1\n"),
])
def test_unknown_options_are_refused_as_vllm_does(docker_client, base_image, model_dir,
                                                  args, config_extra):
    from tests.sim.base.testing import SEED_CONFIG

    with serving(docker_client, base_image, model_dir, config=SEED_CONFIG + config_extra,
                 args=args, env=ROOMY, files={"meminfo": meminfo(117)}) as server:
        assert server.wait_exit() == 2
        assert "unrecognized arguments" in server.logs()


def test_patched_image_answers_chat(docker_client, derived, model_dir):
    with serving(docker_client, derived, model_dir, env=ROOMY,
                 files={"meminfo": meminfo(117)}) as server:
        server.wait_healthy()
        status, body = server.request("POST", "/v1/chat/completions", body=CHAT)
        assert status == 200, body
        assert "[/THINK]" not in body["choices"][0]["message"]["content"]
        status, body = server.request("POST", "/v1/chat/completions",
                                      body={**CHAT, "reasoning_effort": "high"})
        assert status == 200, body
        assert "[/THINK]" in body["choices"][0]["message"]["content"]  # trace lands inline
        status, body = server.request("POST", "/v1/chat/completions",
                                      body={**CHAT, "tools": [TOOL]})
        assert status == 200, body
        call = body["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Paris"}
        status, events = server.request("POST", "/v1/chat/completions",
                                        body={**CHAT, "stream": True})
        assert status == 200 and events.rstrip().endswith("data: [DONE]"), events
        status, body = server.request("POST", "/v1/chat/completions",
                                      body={**CHAT, "reasoning_effort": "low"})
        assert status == 400 and "not supported by Mistral models" in body["error"]["message"]
