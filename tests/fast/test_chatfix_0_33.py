"""chatfix.py on a vLLM 0.33.0 base (transformers 5.20.2, mistral_common 1.11.7): each patch
applied, skipped or refused by the shape of 0.33.0's files, and no rule crashes on them.

As tests/fast/test_chatfix_newer.py: no Docker, no vLLM; a base is a few real excerpts (each cited by
file and lines of the 0.33.0 wheel, the rest elided) served to chatfix.py as site-packages. The
tokenizer and transformers files are 0.26.0's excerpts: 0.33.0's apply_chat_template has the same
lines (tokenizers/mistral.py L386-420). `chatfix.py plan` on a real 0.33.0 install printed the
label below (NOTES-0.33.md).
"""


from tests.fast.test_chatfix_newer import (
    AUTH_0_26_0,
    MISTRAL,
    MISTRAL_PY_0_26_0,
    REASONING,
    SERVING,
    TRANSFORMERS,
    TRANSFORMERS_5_20_2,
    load_chatfix,
    verdict,
)

# vllm 0.33.0 vllm/reasoning/mistral_reasoning_parser.py (all of it): a shim from 0.27.1 on
REASONING_0_33_0 = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project

from vllm.parser.engine.registered_adapters import MistralParserReasoningAdapter

__all__ = ["MistralParserReasoningAdapter"]
'''

# vllm 0.33.0 vllm/parser/mistral.py L151-156, L196-199, L225-227, L243-248, L273-274, L293-299
ENGINE = "vllm/parser/mistral.py"
ENGINE_0_33_0 = '''\
@functools.cache
def mistral_config(
    *,
    reasoning_encoding: Literal["special_token", "text", "none"],
    name: str = "mistral",
) -> ParserEngineConfig:
    if reasoning_encoding != "none":
        reasoning_transitions: dict[tuple[ParserState, str], Transition] = {
            (ParserState.CONTENT, "THINK_START"): Transition(
                ParserState.REASONING,
                (),
            ),
        }
    return ParserEngineConfig(
        name=name,
        initial_state=ParserState.CONTENT,
        wait_for_reasoning=reasoning_encoding != "none",
        transitions={
            (ParserState.CONTENT, "TOOL_CALLS"): Transition(
                ParserState.TOOL_NAME,
                (EventType.REASONING_END, EventType.TOOL_CALL_START)
                if reasoning_encoding != "none"
                else (EventType.TOOL_CALL_START,),
            ),
        },
    )


class MistralParser(ParserEngine):
    """Mistral parser: engine-based reasoning + ``[TOOL_CALLS]`` tool calls."""

    def __init__(
        self,
        tokenizer: TokenizerLike,
        tools: list[Tool] | None = None,
        **kwargs,
    ) -> None:
        vocab = tokenizer.get_vocab()
'''

# vllm 0.33.0 vllm/entrypoints/serve/middleware/authenticate.py L11, L14, L47-62: 0.26.0's
# middleware, moved, with /cohere guarded too
AUTH = "vllm/entrypoints/serve/middleware/authenticate.py"
AUTH_0_33_0 = AUTH_0_26_0.split("\n\n\n", 1)[1].replace('"/inference")', '"/inference", "/cohere")')
assert '"/cohere")' in AUTH_0_33_0

# vllm 0.33.0 vllm/entrypoints/openai/chat_completion/serving.py L472, L484-487, L509, L536-546
SERVING_0_33_0 = '''\
class OpenAIServingChat(OpenAIServing):
    async def chat_completion_stream_generator(self, request):
        try:
            async for chunk in self.chat_completion_stream_generator_raw(
                request,
            ):
                yield chunk
        finally:
            pass

    async def chat_completion_stream_generator_raw(self, request):
        try:
            if self.parser_cls is not None:
                processors = [
                    ChatStreamProcessor(
                        request,
                        self._make_parser(request, tokenizer, chat_template_kwargs),
                        enable_auto_tools=self.enable_auto_tools,
                    )
                    for _ in range(num_choices)
                ]
        finally:
            pass
'''

# vllm 0.33.0 vllm/entrypoints/openai/chat_completion/stream_processor.py L24, L52, L72-83
PROCESSOR = "vllm/entrypoints/openai/chat_completion/stream_processor.py"
PROCESSOR_0_33_0 = '''\
class ChatStreamProcessor:
    def step(self, delta_text, delta_token_ids, finish_reason, prompt_token_ids):
        delta: DeltaMessage | None
        if not delta_text and not delta_token_ids and not self.num_output_tokens:
            # Finished without output. Send the final chunk unparsed.
            delta = DeltaMessage()
        elif self.parser is not None:
            delta = self.parser.parse_delta(
                delta_text=delta_text,
                delta_token_ids=delta_token_ids,
                request=self.request,
                prompt_token_ids=prompt_token_ids,
                finished=finish_reason is not None,
            )
'''

VERSIONS_0_33_0 = {"vllm": "0.33.0", "transformers": "5.20.2", "mistral_common": "1.11.7"}
BASE_0_33_0 = {MISTRAL: MISTRAL_PY_0_26_0, TRANSFORMERS: TRANSFORMERS_5_20_2, AUTH: AUTH_0_33_0,
               SERVING: SERVING_0_33_0, PROCESSOR: PROCESSOR_0_33_0,
               REASONING: REASONING_0_33_0, ENGINE: ENGINE_0_33_0}
LABEL_0_33_0 = ("vllm-reasoning-effort=skipped,transformers-reasoning-effort=skipped,"
                "think-prefill=applied,api-key-every-route=applied,streamed-tool-calls=skipped,"
                "streamed-tool-call-end=skipped,reasoning-split=applied")


def test_plan_on_0_33_0_labels_each_patch(monkeypatch):
    fix = load_chatfix(monkeypatch, BASE_0_33_0, VERSIONS_0_33_0)
    steps = fix.plan(think_prefill=True)
    assert fix.label(steps) == LABEL_0_33_0
    why = {patch.name: reason for patch, _, reason in steps}
    assert why["streamed-tool-calls"] == (
        "vLLM streams every delta through parser.parse_delta and its Mistral parser engine ends "
        "reasoning at a tool call outside [THINK]")
    assert AUTH in why["api-key-every-route"]
    assert why["reasoning-split"] == (
        "vLLM's mistral reasoning parser cannot split a [THINK] the prompt opened")


def test_apply_on_0_33_0_patches_the_moved_middleware(monkeypatch):
    fix = load_chatfix(monkeypatch, BASE_0_33_0, VERSIONS_0_33_0)
    texts = {str(path): text for path, text in fix.patched_texts(fix.plan(True)).items()}
    assert sorted(texts) == sorted([f"/base/{MISTRAL}", f"/base/{AUTH}"])
    auth = texts[f"/base/{AUTH}"]
    assert "if url_path not in OPEN_PATHS and not self.verify_token(headers):" in auth
    assert 'GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")' in auth
    assert "startswith(GUARDED_PREFIX)" not in auth
    patched = {**BASE_0_33_0, MISTRAL: texts[f"/base/{MISTRAL}"], AUTH: auth}
    fix = load_chatfix(monkeypatch, patched, VERSIONS_0_33_0)
    assert verdict(fix, "api-key-every-route") == (
        "skipped", "the base already carries this patch")


def test_the_engine_shape_steps_aside_only_when_mistral_parser_reads_the_prompt(monkeypatch):
    """reasoning-split on the shim: needed while MistralParser reads nothing from the prompt;
    skipped (and thorfleet_reasoning.py registers vLLM's own class) once it defines both hooks."""
    reads = ENGINE_0_33_0 + '''
    def set_prompt_token_ids(self, prompt_token_ids):
        ...

    def adjust_initial_state_from_prompt(self, prompt_token_ids):
        ...
'''
    only_streamed = ENGINE_0_33_0 + '''
    def adjust_initial_state_from_prompt(self, prompt_token_ids):
        ...
'''
    for engine, expected in ((ENGINE_0_33_0, "applied"), (only_streamed, "applied"),
                             (reads, "skipped")):
        fix = load_chatfix(monkeypatch, {**BASE_0_33_0, ENGINE: engine}, VERSIONS_0_33_0)
        assert verdict(fix, "reasoning-split")[0] == expected
    fix = load_chatfix(monkeypatch, {**BASE_0_33_0, ENGINE: "x = 1\n"}, VERSIONS_0_33_0)
    got, why = verdict(fix, "reasoning-split")
    assert got == "refused" and "expected a class MistralParser" in why


def test_a_stream_without_parse_delta_keeps_the_streamed_tool_call_patch(monkeypatch):
    """The skip rests on ChatStreamProcessor.step calling parse_delta, and on the engine ending
    reasoning at [TOOL_CALLS] from CONTENT: without either the patch is needed (and refused: its
    0.19.0 hunks are not in 0.33.0's serving.py)."""
    no_parse = PROCESSOR_0_33_0.replace("self.parser.parse_delta(", "self.parser.other(")
    no_end = ENGINE_0_33_0.replace(
        "(EventType.REASONING_END, EventType.TOOL_CALL_START)\n", "(EventType.TOOL_CALL_START,)\n")
    for changed in ({PROCESSOR: no_parse}, {ENGINE: no_end}):
        fix = load_chatfix(monkeypatch, {**BASE_0_33_0, **changed}, VERSIONS_0_33_0)
        assert verdict(fix, "streamed-tool-calls")[0] == "refused"
