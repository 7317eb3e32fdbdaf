# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""reasoning_effort "high" answers with the trace in `reasoning_content` and the answer in
`content`, and a streamed tool call arrives as `tool_calls`, through vLLM 0.19.0's own serving code.

The derived image is built from the stand-in base (build-image.sh, as the deploy runs it) and
served with the config thorfleet renders from files/thor/vllm.yaml.j2 with default settings, which
names thorfleet's reasoning parser plugin (files/image/thorfleet_reasoning.py). vLLM's real
`setup_server` imports the plugin, its real chat serving builds one parser per request and calls
it as on a Thor; only the engine stands in (sim/base/vllm_standin.py): for a prompt that
ends in [THINK] it writes `trace[/THINK]answer`, with tools offered `[TOOL_CALLS]name[ARGS]{json}`.
"Never closed" is a trace cut by max_tokens before [/THINK].
"""

import json
import urllib.request

import pytest
import yaml

from sim.base.testing import (  # noqa: F401
    base_image,
    derived_image,
    docker_client,
    model_dir,
    run_python,
    serving,
)
from tests.helpers import box_program

KEY = "thorfleet-test-key"
TRACE = "Thinking it over, step by step."  # the stand-in's trace (vllm_standin.py)
ANSWER_START = "This is the thorfleet stand-in engine answering"
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CHAT = {"model": "/model", "max_tokens": 64, "temperature": 0,
        "messages": [{"role": "user", "content": "Is 2027 prime?"}]}
HIGH = {**CHAT, "reasoning_effort": "high"}
TOOLS = {**CHAT, "messages": [{"role": "user", "content": "Weather in Paris? Use the tool."}],
         "tools": [WEATHER_TOOL]}


def rendered_config(**settings) -> str:
    """files/thor/vllm.yaml.j2 as thorfleet renders it with default settings (API key set), and
    `settings` over them."""
    from thorfleet.settings import schema
    from thorfleet.settings.render import Settings

    data = {"weights_model_revision": "a" * 40, "weights_draft_revision": "b" * 40,
            "image_base": "r/vllm@sha256:" + "c" * 64, **settings}
    values, problems = schema.check(data, api_key=KEY)
    assert not problems, problems
    return Settings(values, api_key=KEY).config_text


@pytest.fixture(scope="module")
def image(docker_client, base_image):
    return derived_image(docker_client, base_image)


@pytest.fixture(scope="module")
def server(docker_client, image, model_dir):
    config = rendered_config()
    assert "reasoning_parser: thorfleet_mistral" in config
    # the values as vLLM reads them (the file is written by a YAML emitter, which quotes them)
    assert yaml.safe_load(config)["reasoning_parser_plugin"] == \
        "/opt/thorfleet/image/thorfleet_reasoning.py"
    with serving(docker_client, image, model_dir, config=config,
                 env={"VLLM_API_KEY": KEY, "THORFLEET_SIM_DECODE_TOKS": "200"}) as running:
        running.wait_healthy(timeout=600)  # 2 busy cores: start-up can take minutes
        yield running


def chat(server, body) -> dict:
    status, answer = server.request("POST", "/v1/chat/completions", body=body, key=KEY)
    assert status == 200, answer
    return answer["choices"][0]


def stream(server, body) -> tuple[dict, str | None, list[dict]]:
    """({reasoning, content}: joined deltas, the last finish_reason, the tool_calls deltas)."""
    request = urllib.request.Request(
        server.url + "/v1/chat/completions", data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    joined, finish, calls = {"reasoning": "", "content": ""}, None, []
    with urllib.request.urlopen(request, timeout=60) as response:
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "choices" in event, event  # vLLM streams an error as an event of its own
            if not event["choices"]:  # the last chunk: the whole usage (enable_force_include_usage)
                assert event["usage"]["completion_tokens"] > 0, event
                continue
            choice = event["choices"][0]
            delta = choice["delta"]
            joined["reasoning"] += delta.get("reasoning") or delta.get("reasoning_content") or ""
            joined["content"] += delta.get("content") or ""
            calls += delta.get("tool_calls") or []
            finish = choice.get("finish_reason") or finish
    return joined, finish, calls


def reasoning_of(message: dict) -> str | None:
    # vLLM 0.19.0 names the field `reasoning`; `reasoning_content` is what clients read.
    return message.get("reasoning_content") or message.get("reasoning")


def test_the_plugin_is_what_vllm_runs(server):
    assert "reasoning parser thorfleet_mistral: splits a [THINK] block the prompt opened" in (
        server.logs())


def test_high_splits_trace_and_answer_not_streamed(server):
    answer = chat(server, HIGH)
    message = answer["message"]
    assert reasoning_of(message) == TRACE, message
    assert message["content"].startswith(ANSWER_START), message
    assert "[THINK]" not in message["content"] and "[/THINK]" not in message["content"]
    assert answer["finish_reason"] == "stop"


def test_high_splits_trace_and_answer_streamed(server):
    joined, finish, calls = stream(server, HIGH)
    assert joined["reasoning"] == TRACE, joined
    assert joined["content"].startswith(ANSWER_START), joined
    assert "[/THINK]" not in joined["content"] and not calls
    assert finish == "stop"


@pytest.mark.parametrize("streamed", [False, True], ids=["not-streamed", "streamed"])
def test_a_trace_never_closed_stays_reasoning_and_says_length(server, streamed):
    """Cut by max_tokens before [/THINK]: the unfinished trace is reasoning, content is empty
    and finish_reason says why (thorfleet_reasoning.py's docstring)."""
    body = {**HIGH, "max_tokens": 4}
    if streamed:
        joined, finish, _ = stream(server, body)
        reasoning, content = joined["reasoning"], joined["content"]
    else:
        answer = chat(server, body)
        reasoning, content = reasoning_of(answer["message"]), answer["message"]["content"]
        finish = answer["finish_reason"]
    assert reasoning and TRACE.startswith(reasoning), reasoning
    assert not content
    assert finish == "length"


@pytest.mark.parametrize("effort", [None, "none"])
def test_requests_without_reasoning_are_unchanged(server, effort):
    body = CHAT if effort is None else {**CHAT, "reasoning_effort": effort}
    message = chat(server, body)["message"]
    assert message["content"].startswith(ANSWER_START) and not reasoning_of(message)
    joined, finish, _ = stream(server, body)
    assert joined["content"].startswith(ANSWER_START) and not joined["reasoning"]
    assert finish == "stop"


@pytest.mark.parametrize("effort", [None, "high"])
def test_a_streamed_tool_call_arrives_as_tool_calls(server, effort):
    body = TOOLS if effort is None else {**TOOLS, "reasoning_effort": effort}
    joined, finish, calls = stream(server, body)
    assert calls, joined  # 0.19.0 unpatched: `[TOOL_CALLS]get_weather...` as content
    assert calls[0]["function"]["name"] == "get_weather"
    arguments = "".join(c["function"].get("arguments") or "" for c in calls)
    assert json.loads(arguments) == {"city": "Paris"}
    assert "[TOOL_CALLS]" not in joined["content"]
    assert finish == "tool_calls"
    message = chat(server, body)["message"]  # and not streamed, as before
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"


# The parser class itself, against vLLM 0.19.0's real classes in the image (nvidia runtime: vLLM
# imports torch): loaded as `--reasoning-parser-plugin` loads it and called as serving.py does.
PARSER_PROBE = r'''
import json, os, tempfile
os.environ["HF_HUB_OFFLINE"] = "1"
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
import subprocess, sys
from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.mistral_reasoning_parser import MistralReasoningParser
from vllm.tokenizers.mistral import MistralTokenizer
tmp = tempfile.mkdtemp()
subprocess.run([sys.executable, "/opt/thorfleet/image/v15_test_tokenizer.py", tmp + "/tekken.json"],
               check=True, stdout=subprocess.DEVNULL)
ReasoningParserManager.import_reasoning_parser("/opt/thorfleet/image/thorfleet_reasoning.py")
cls = ReasoningParserManager.get_reasoning_parser("thorfleet_mistral")
tok = MistralTokenizer.from_pretrained(tmp)
sp = tok.tokenizer.get_special_token
msgs = [{"role": "user", "content": "hi"}]
plain = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
high = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                               reasoning_effort="high")
enc = lambda s: tok.encode(s, add_special_tokens=False)
out = {"closed": enc("trace") + [sp("[/THINK]")] + enc("answer"), "open": enc("trace cut"),
       "call": enc("trace") + [sp("[TOOL_CALLS]")] + enc("get_weather") + [sp("[ARGS]")] + enc("{}"),
       "own": [sp("[THINK]")] + enc("trace") + [sp("[/THINK]")] + enc("answer")}
result = {"subclass": issubclass(cls, MistralReasoningParser)}
for prompt_name, prompt in (("plain", plain), ("high", high)):
    for name, ids in out.items():
        text = tok.decode(ids, skip_special_tokens=False)
        p = cls(tok, chat_template_kwargs={})
        p.is_reasoning_end(prompt)
        base = MistralReasoningParser(tok)
        result[f"{prompt_name}-{name}"] = {
            "split": list(p.extract_reasoning(text, None)),
            "base": list(base.extract_reasoning(text, None)),
            "ended": p.is_reasoning_end(ids)}
print("RESULT " + json.dumps(result))
'''


@pytest.fixture(scope="module")
def parsed(docker_client, image):
    out = run_python(docker_client, image, PARSER_PROBE)
    return json.loads(out.split("RESULT ", 1)[1])


def test_parser_splits_a_prefilled_trace_with_vllms_classes(parsed):
    assert parsed["subclass"]
    assert parsed["high-closed"]["split"] == ["trace", "answer"]
    assert parsed["high-closed"]["base"] == [None, "traceanswer"]  # 0.19.0's own: inline
    assert parsed["high-closed"]["ended"]
    assert parsed["high-open"]["split"] == ["trace cut", None] and not parsed["high-open"]["ended"]
    # A tool call written inside the trace ends it: the call reaches the tool parser.
    assert parsed["high-call"]["split"] == ["trace", "[TOOL_CALLS]get_weather[ARGS]{}"]
    assert parsed["high-call"]["ended"]


def test_parser_stands_aside_when_the_prompt_opened_nothing(parsed):
    for name in ("closed", "open", "call", "own"):
        assert parsed[f"plain-{name}"]["split"] == parsed[f"plain-{name}"]["base"], name




def test_the_proof_streams_a_tool_call_and_checks_the_split(server, docker_client, image,
                                                           tmp_path):
    """files/thor/bin/thorfleet-serve's check_requests against this server, with the label this
    image carries: the streamed tool call and the reasoning split pass."""
    from types import SimpleNamespace

    tool = box_program("thorfleet-serve")
    (tmp_path / "secrets.env").write_text(f"VLLM_API_KEY={KEY}\n")
    tool.PATHS = SimpleNamespace(secrets=tmp_path / "secrets.env")
    port = int(server.url.rsplit(":", 1)[1])
    label = docker_client.images.get(image).labels["thorfleet.patches"]
    patches = dict(item.split("=", 1) for item in label.split(","))
    assert patches["streamed-tool-calls"] == patches["reasoning-split"] == "applied"
    for only in ("streamed tool call", "reasoning split"):
        tool.check_requests(port, only=only, patches=patches)
    # An image without the streamed fix or the plugin is not asked for them.
    tool.check_requests(port, only="reasoning split", patches={})
