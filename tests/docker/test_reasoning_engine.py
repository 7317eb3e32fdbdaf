# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""thorfleet's reasoning plugin on the real newer vLLM releases of the sim's bases (0.26.0's
MistralReasoningParser, 0.33.0's MistralParserReasoningAdapter shim): vLLM's own parser classes,
MistralTokenizer and API-key middleware, in a throwaway container of each base (no engine, no
server). The check itself is tests/newer_vllm_check.py, run by the base's own python (about 15 s
of one core per base).
"""


import pytest

from sim.base.testing import docker_client, run_check  # noqa: F401

TRACE, ANSWER = "The user asks about Paris.", "It is sunny in Paris."


@pytest.fixture(scope="module", params=["upstream-0.26.0", "upstream-0.33.0"])
def found(request, docker_client):
    return run_check(docker_client, request.param, ["/repo/tests/newer_vllm_check.py"])


def test_vllm_alone_folds_a_prefilled_trace_into_content(found):
    assert found["prompt_ends_with_think"]
    assert found["own_split"] == [None, TRACE + ANSWER]


def test_the_plugin_is_chosen_and_subclasses_the_installed_shape(found):
    assert found["plugin_class"] == "PrefilledThinkReasoningParser"
    assert found["plugin_base"] in ("MistralReasoningParser", "MistralParserReasoningAdapter")
    assert found["plugin_prompt_is_reasoning_end"] is False


@pytest.mark.parametrize("case, reasoning, content, calls", [
    ("closed", TRACE, ANSWER, []),
    ("never closed", TRACE, None, []),
    ("call in trace", TRACE, None, ["get_weather"]),
    ("plain", None, ANSWER, []),
    ("plain call", None, None, ["get_weather"]),
])
def test_split_streamed_and_not(found, case, reasoning, content, calls):
    got = found["results"][case]
    assert (got["reasoning"], got["content"], got["calls"]) == (reasoning, content, calls)
    assert got["streamed"] == {"reasoning": reasoning or "", "content": content or "",
                               "calls": calls}
    if got["reasoning_tokens"] is not None:  # 0.33.0 counts them (adapters.py L146-161)
        assert (got["reasoning_tokens"] > 0) == bool(reasoning)


def test_the_api_key_patch_guards_every_route_but_health(found):
    probe = found["api_key_probe"]
    assert probe.pop("/health") == [200, 200]
    assert set(map(tuple, probe.values())) == {(401, 200)}
