"""thorfleet's reasoning plugin on a real vLLM install newer than the sim's base (0.26.0's
MistralReasoningParser, 0.33.0's MistralParserReasoningAdapter shim), outside the sim.

Opt-in: THORFLEET_NEWER_VLLM_PYTHON names the python of a venv holding that vLLM (a --no-deps
install with torch cpu is enough: no engine, no GPU, no server); the check itself is
tests/newer_vllm_check.py, run by that python (about 15 s of one core). Skipped without it.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PYTHON = os.environ.get("THORFLEET_NEWER_VLLM_PYTHON", "")
CHECK = Path(__file__).with_name("newer_vllm_check.py")
TRACE, ANSWER = "The user asks about Paris.", "It is sunny in Paris."


@pytest.fixture(scope="module")
def found():
    if not PYTHON:
        pytest.skip("THORFLEET_NEWER_VLLM_PYTHON is not set")
    done = subprocess.run([PYTHON, str(CHECK)], capture_output=True, text=True, timeout=300,
                          check=False, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


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
