"""chatfix.py on a vLLM 0.26.0 base (transformers 5.20.2, mistral_common 1.11.7) beside 0.19.0
(transformers 4.57.3): each patch applied, skipped because the base has the fix, or refused.

No Docker, no vLLM: the rules and the strict applier read text, so a base is a few real excerpts
of its files (each cited by version, file and lines; the lines the rules and hunks read, the rest
elided) served to chatfix.py in place of site-packages. tests/docker/test_patches.py builds the real
0.19.0 images; a 0.26.0 image build is the CI run's to prove.
"""

import importlib.util
from pathlib import Path

import pytest

CHATFIX = Path(__file__).resolve().parents[2] / "files" / "image" / "chatfix.py"


# ------------------------------------------------------------------ real excerpts

# vllm 0.19.0 vllm/tokenizers/mistral.py L1-3, L231, L418-458 (the rest elided)
MISTRAL_PY_0_19_0 = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
from collections.abc import Sequence

class MistralTokenizer(TokenizerLike):
    def apply_chat_template(
        self,
        messages: list["ChatCompletionMessageParam"],
        tools: list[dict[str, Any]] | None = None,
        **kwargs,
    ) -> list[int]:
        add_generation_prompt = kwargs.pop("add_generation_prompt", False)
        continue_final_message = kwargs.get("continue_final_message", False)
        tokenize = kwargs.get("tokenize", True)
        padding = kwargs.get("padding", False)
        truncation = kwargs.get("truncation", False)
        max_length = kwargs.get("max_length")

        version_kwargs = {}
        # NOTE: This is for backward compatibility.
        # Transformers should be passed arguments it knows.
        if self.version >= 15:
            version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort")

        messages, tools = _prepare_apply_chat_template_tools_and_messages(
            messages, tools, continue_final_message, add_generation_prompt
        )

        return self.transformers_tokenizer.apply_chat_template(
            conversation=messages,
            tools=tools,
            continue_final_message=continue_final_message,
            tokenize=tokenize,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            return_tensors=None,
            return_dict=False,
            **version_kwargs,
        )

    def decode(
        self, ids: Sequence[int] | int, skip_special_tokens: bool = False
    ) -> str:
        # TODO(juliendenize): once https://github.com/huggingface/transformers/pull/41962
        # is in, directly call self.transformers_tokenizer.decode(...).
        ...  # (body elided)
'''


# vllm 0.26.0 vllm/tokenizers/mistral.py L1-3, L224, L411-451 (the rest elided)
MISTRAL_PY_0_26_0 = '''\
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
from collections.abc import Sequence

class MistralTokenizer(TokenizerLike):
    def apply_chat_template(
        self,
        messages: list["ChatCompletionMessageParam"],
        tools: list[dict[str, Any]] | None = None,
        **kwargs,
    ) -> list[int]:
        add_generation_prompt = kwargs.pop("add_generation_prompt", False)
        continue_final_message = kwargs.get("continue_final_message", False)
        tokenize = kwargs.get("tokenize", True)
        padding = kwargs.get("padding", False)
        truncation = kwargs.get("truncation", False)
        max_length = kwargs.get("max_length")

        version_kwargs = {}
        # NOTE: This is for backward compatibility.
        # Transformers should be passed arguments it knows.
        if self.version >= 15:
            version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort")

        _validate_apply_chat_template_args(
            messages, continue_final_message, add_generation_prompt
        )

        return self.transformers_tokenizer.apply_chat_template(
            conversation=messages,
            tools=tools,
            continue_final_message=continue_final_message,
            tokenize=tokenize,
            padding=padding,
            truncation=truncation,
            max_length=max_length,
            return_tensors=None,
            return_dict=False,
            **version_kwargs,
        )

    def decode(
        self, ids: Sequence[int] | int, skip_special_tokens: bool = False
    ) -> str:
        # TODO(juliendenize): once https://github.com/huggingface/transformers/pull/41962
        # is in, directly call self.transformers_tokenizer.decode(...).
        ...  # (body elided)
'''


# transformers 4.57.3 transformers/tokenization_mistral_common.py L158, L1368-1380
TRANSFORMERS_4_57_3 = '''\
class MistralCommonTokenizer(PushToHubMixin):
    def apply_chat_template(
        self,
        conversation: Union[list[dict[str, str]], list[list[dict[str, str]]]],
        tools: Optional[list[Union[dict, Callable]]] = None,
        continue_final_message: bool = False,
        tokenize: bool = True,
        padding: Union[bool, str, PaddingStrategy] = False,
        truncation: bool = False,
        max_length: Optional[int] = None,
        return_tensors: Optional[Union[str, TensorType]] = None,
        return_dict: bool = False,
        **kwargs,
    ) -> Union[str, list[int], list[str], list[list[int]], BatchEncoding]:
        ...  # (body elided)
'''


# transformers 5.20.2 transformers/tokenization_mistral_common.py L194, L1038-1052
TRANSFORMERS_5_20_2 = '''\
class MistralCommonBackend(PreTrainedTokenizerBase):
    def apply_chat_template(  # type: ignore[override]
        self,
        conversation: list[dict[str, str]] | list[list[dict[str, str]]],
        tools: list[dict | Callable] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        padding: bool | str | PaddingStrategy = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | TensorType | None = None,
        return_dict: bool = True,
        reasoning_effort: "ReasoningEffort | None" = None,
        **kwargs,
    ) -> str | list[int] | list[str] | list[list[int]] | BatchEncoding:
        ...  # (body elided)
'''


# vllm 0.19.0 vllm/entrypoints/openai/server_utils.py L35-38, L71-83
AUTH_0_19_0 = '''\
logger = init_logger("vllm.entrypoints.openai.server_utils")


class AuthenticationMiddleware:
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if scope["type"] not in ("http", "websocket") or scope["method"] == "OPTIONS":
            # scope["type"] can be "lifespan" or "startup" for example,
            # in which case we don't need to do anything
            return self.app(scope, receive, send)
        root_path = scope.get("root_path", "")
        url_path = URL(scope=scope).path.removeprefix(root_path)
        headers = Headers(scope=scope)
        # Type narrow to satisfy mypy.
        if url_path.startswith("/v1") and not self.verify_token(headers):
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
            return response(scope, receive, send)
        return self.app(scope, receive, send)
'''


# vllm 0.26.0 vllm/entrypoints/serve/utils/server_utils.py L39-45, L78-93
AUTH_0_26_0 = '''\
logger = init_logger("vllm.entrypoints.openai.server_utils")


GUARDED_PREFIX = ("/v1", "/v2", "/inference")


class AuthenticationMiddleware:
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        if (
            scope["type"] not in ("http", "websocket")
            or scope.get("method") == "OPTIONS"
        ):
            # scope["type"] can be "lifespan" or "startup" for example,
            # in which case we don't need to do anything
            return self.app(scope, receive, send)
        root_path = scope.get("root_path", "")
        url_path = scope["path"].removeprefix(root_path)
        headers = Headers(scope=scope)
        # Type narrow to satisfy mypy.
        if url_path.startswith(GUARDED_PREFIX) and not self.verify_token(headers):
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
            return response(scope, receive, send)
        return self.app(scope, receive, send)
'''


# vllm 0.19.0 vllm/entrypoints/openai/chat_completion/serving.py L87, L936-942, then the stream's
# finish at its own depth (L584-585, L675, L1083, L1101-1120: the isinstance test's second half
# left out, L1143); the signature (L498) shortened, the gate dedented from 32 spaces
SERVING_0_19_0 = '''\
class OpenAIServingChat(OpenAIServing):
    async def chat_completion_stream_generator(self, request):
        if reasoning_parser.is_reasoning_end(output_token_ids):
            reasoning_end_arr[i] = True
            current_token_ids = (
                reasoning_parser.extract_content_ids(
                    output_token_ids
                )
            )
        try:
            async for res in result_generator:
                for output in res.outputs:
                    if output.finish_reason is None:
                        pass
                    else:
                        should_check = (
                            self._should_check_for_unstreamed_tool_arg_tokens(
                                delta_message, output
                            )
                        )
                        # only check if there are any tool calls
                        # detected by partial parsing
                        if should_check and tool_parser and auto_tools_called:
                            latest_delta_len = 0
                            if (
                                isinstance(
                                    delta_message.tool_calls[0].function,
                                    DeltaFunctionCall,
                                )
                            ):
                                latest_delta_len = 1
                            actual_call = tool_parser.streamed_args_for_tool[index]
        finally:
            pass
'''


# vllm 0.19.0 vllm/tool_parsers/mistral_tool_parser.py L73, L319-320: streamed_args_for_tool
# never written
MISTRAL_TOOLS_0_19_0 = '''\
class MistralToolParser(ToolParser):
    def _extract_tool_calls_streaming(self, delta_text, delta_token_ids):
        if delta_tool_calls and not self.prev_tool_call_arr:
            self.prev_tool_call_arr = [{"arguments": {}}]
'''


# vllm 0.26.0 vllm/tool_parsers/mistral_tool_parser.py L96, L471-473: kept beside the calls
MISTRAL_TOOLS_0_26_0 = '''\
class MistralToolParser(ToolParser):
    def _generate_delta_tool_call(self, delta_text):
            self.current_tool_id += 1
            self.streamed_args_for_tool.append("")
            self.prev_tool_call_arr.append({})
'''


# vllm 0.26.0 vllm/entrypoints/openai/chat_completion/serving.py L112, L606-615;
# the signature (L414) shortened, the call dedented from 20 spaces
SERVING_0_26_0 = '''\
class OpenAIServingChat(GenerateBaseServing):
    async def chat_completion_stream_generator(self, request):
        if parser is not None:
            delta_message = parser.parse_delta(
                delta_text=delta_text,
                delta_token_ids=as_list(output.token_ids),
                request=request,
                prompt_token_ids=res.prompt_token_ids,
                finished=output.finish_reason is not None,
            )
            if delta_message is not None and delta_message.tool_calls:
                tools_streamed[i] = True
'''


# vllm 0.19.0 vllm/reasoning/mistral_reasoning_parser.py L20, L68-77, L114-116, L148-153
REASONING_0_19_0 = '''\
class MistralReasoningParser(BaseThinkingReasoningParser):
    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        has_eot_token = False

        for id in reversed(input_ids):
            if id == self.start_token_id:
                # Reasoning ends only if a BOT token is found before a EOT token.
                return has_eot_token
            elif id == self.end_token_id:
                has_eot_token = True
        return False
    def extract_reasoning(
        self, model_output: str, request: "ChatCompletionRequest | ResponsesRequest"
    ) -> tuple[str | None, str | None]:
        # be `False` and the parser outputs all tokens as 'content'
        if has_non_valid_eot_token:
            prev_eot_token, _, post_eot_token = prev_bot_token.partition(
                self.end_token
            )
            return None, prev_eot_token + post_eot_token
'''


# vllm 0.26.0 vllm/reasoning/mistral_reasoning_parser.py L17, L76-83, L120-122, L154-159
REASONING_0_26_0 = '''\
class MistralReasoningParser(BaseThinkingReasoningParser):
    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Iterable[int]
    ) -> bool:
        if self.end_token_id in delta_ids:
            return True
        # Grammar's think? is optional — if [THINK] was never generated,
        # reasoning was skipped entirely.
        return self.start_token_id not in input_ids
    def extract_reasoning(
        self, model_output: str, request: "ChatCompletionRequest | ResponsesRequest"
    ) -> tuple[str | None, str | None]:
        # be `False` and the parser outputs all tokens as 'content'
        if has_non_valid_eot_token:
            prev_eot_token, _, post_eot_token = prev_bot_token.partition(
                self.end_token
            )
            return None, prev_eot_token + post_eot_token
'''


# mistral_common 1.11.7 mistral_common/protocol/instruct/request.py L36
MISTRAL_COMMON_REQUEST = '''\
class ReasoningEffort(str, Enum):
    ...
'''


# mistral_common 1.11.7 mistral_common/tokens/tokenizers/base.py L104
MISTRAL_COMMON_BASE = '''\
begin_model_settings = "[MODEL_SETTINGS]"
'''


# ------------------------------------------------------------------ the bases, as chatfix sees them

MISTRAL = "vllm/tokenizers/mistral.py"
TRANSFORMERS = "transformers/tokenization_mistral_common.py"
AUTH_OLD = "vllm/entrypoints/openai/server_utils.py"
AUTH_NEW = "vllm/entrypoints/serve/utils/server_utils.py"
SERVING = "vllm/entrypoints/openai/chat_completion/serving.py"
REASONING = "vllm/reasoning/mistral_reasoning_parser.py"
TOOLS = "vllm/tool_parsers/mistral_tool_parser.py"
MISTRAL_COMMON = {"mistral_common/protocol/instruct/request.py": MISTRAL_COMMON_REQUEST,
                  "mistral_common/tokens/tokenizers/base.py": MISTRAL_COMMON_BASE}
VERSIONS_0_19_0 = {"vllm": "0.19.0", "transformers": "4.57.3", "mistral_common": "1.11.0"}
VERSIONS_0_26_0 = {"vllm": "0.26.0", "transformers": "5.20.2", "mistral_common": "1.11.7"}
BASE_0_19_0 = {MISTRAL: MISTRAL_PY_0_19_0, TRANSFORMERS: TRANSFORMERS_4_57_3,
               AUTH_OLD: AUTH_0_19_0, SERVING: SERVING_0_19_0, REASONING: REASONING_0_19_0,
               TOOLS: MISTRAL_TOOLS_0_19_0}
# 0.26.0 has no entrypoints/openai/server_utils.py: the middleware moved.
BASE_0_26_0 = {MISTRAL: MISTRAL_PY_0_26_0, TRANSFORMERS: TRANSFORMERS_5_20_2,
               AUTH_NEW: AUTH_0_26_0, SERVING: SERVING_0_26_0, REASONING: REASONING_0_26_0,
               TOOLS: MISTRAL_TOOLS_0_26_0}
LABEL_0_26_0 = ("vllm-reasoning-effort=skipped,transformers-reasoning-effort=skipped,"
                "think-prefill=applied,api-key-every-route=applied,streamed-tool-calls=skipped,"
                "streamed-tool-call-end=skipped,reasoning-split=applied")


def load_chatfix(monkeypatch, files: dict[str, str], versions: dict[str, str]):
    """chatfix.py, fresh, reading `files` (relpath -> text) as the base's site-packages."""
    spec = importlib.util.spec_from_file_location("chatfix_under_test", CHATFIX)
    fix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fix)
    files = {**MISTRAL_COMMON, **files}

    def source_of(relpath):
        if relpath not in files:
            raise fix.PlanError(f"{relpath}: not in the base")
        return Path("/base") / relpath, files[relpath]

    monkeypatch.setattr(fix, "source_of", source_of)
    monkeypatch.setattr(fix, "version_of", lambda package: versions.get(package, "not installed"))
    monkeypatch.setattr(fix, "say", lambda message: None)
    return fix


def verdict(fix, name: str) -> tuple[str, str]:
    """("applied" | "skipped" | "refused", why or the refusal) for one patch, as plan decides it
    and patched_texts fits it."""
    patch = next(p for p in fix.TABLE if p.name == name)
    try:
        action, why = fix.decide(patch)
        if action == "apply" and patch.diff:
            relpath = fix.target_of(patch)
            fix.fit(patch, fix.source_of(relpath)[1], relpath)
    except fix.PlanError as error:
        return "refused", str(error)
    return {"apply": "applied", "skip": "skipped"}[action], why


# ------------------------------------------------------------------ the whole plan on 0.26.0

def test_plan_on_0_26_0_labels_each_patch(monkeypatch):
    fix = load_chatfix(monkeypatch, BASE_0_26_0, VERSIONS_0_26_0)
    steps = fix.plan(think_prefill=True)
    assert fix.label(steps) == LABEL_0_26_0
    why = {patch.name: reason for patch, _, reason in steps}
    assert why["vllm-reasoning-effort"] == (
        "transformers 5.20.2 MistralCommonBackend.apply_chat_template already takes "
        "reasoning_effort (default None): the None vLLM passes on is no error")
    assert why["streamed-tool-calls"] == (
        "vLLM streams every delta through parser.parse_delta and its MistralReasoningParser "
        "ends reasoning when the answer opened no [THINK]")
    assert AUTH_OLD in why["api-key-every-route"] and AUTH_NEW in why["api-key-every-route"]
    assert fix.label(fix.plan(think_prefill=False)) == LABEL_0_26_0.replace(
        "think-prefill=applied", "think-prefill=off").replace(
        "reasoning-split=applied", "reasoning-split=off")


def test_apply_on_0_26_0_patches_the_moved_middleware_and_the_wrapper(monkeypatch):
    fix = load_chatfix(monkeypatch, BASE_0_26_0, VERSIONS_0_26_0)
    texts = {str(path): text for path, text in fix.patched_texts(fix.plan(True)).items()}
    assert sorted(texts) == sorted([f"/base/{MISTRAL}", f"/base/{AUTH_NEW}"])
    auth = texts[f"/base/{AUTH_NEW}"]
    assert "if url_path not in OPEN_PATHS and not self.verify_token(headers):" in auth
    assert "startswith(GUARDED_PREFIX)" not in auth
    assert "        rendered = self.transformers_tokenizer.apply_chat_template(" in texts[
        f"/base/{MISTRAL}"]
    # and the patched base plans as already carrying both (a rebuild stands aside)
    patched = {**BASE_0_26_0, MISTRAL: texts[f"/base/{MISTRAL}"], AUTH_NEW: auth}
    fix = load_chatfix(monkeypatch, patched, VERSIONS_0_26_0)
    assert fix.label(fix.plan(True)) == LABEL_0_26_0.replace("=applied,", "=skipped,")


def test_plan_on_0_19_0_excerpts_decides_as_before(monkeypatch):
    """The decisions (not the fits: these excerpts hold only some hunks) and reasons on 0.19.0."""
    fix = load_chatfix(monkeypatch, BASE_0_19_0, VERSIONS_0_19_0)
    assert [fix.decide(patch) for patch in fix.TABLE] == [("apply", patch.why)
                                                         for patch in fix.TABLE]


# ------------------------------------------------------------------ per patch: shape -> verdict

def changed(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


# the 0.26.0 wrapper no longer returning the call think-prefill's hunk wraps
MISTRAL_PY_MOVED_RETURN = changed(MISTRAL_PY_0_26_0,
                                  "        return self.transformers_tokenizer.apply_chat_template(",
                                  "        out = self.transformers_tokenizer.apply_chat_template(")
# upstream deny-by-default (PR #58028's shape) in the 0.26.0 file
AUTH_0_26_0_FIXED = changed(AUTH_0_26_0, "if url_path.startswith(GUARDED_PREFIX) and",
                            "if url_path not in self.public_paths and")
# still a prefix check, written differently: neither diff fits, the rule sees no fix
AUTH_0_26_0_OTHER_PREFIX = changed(AUTH_0_26_0, "if url_path.startswith(GUARDED_PREFIX) and",
                                   "if url_path.startswith(PREFIXES) and")

CASES = [
    # vllm-reasoning-effort: the 400 is the pair (vLLM passes None, transformers refuses it)
    ("vllm-reasoning-effort", {MISTRAL: MISTRAL_PY_0_19_0, TRANSFORMERS: TRANSFORMERS_4_57_3},
     "applied", "vLLM passes reasoning_effort=None to transformers"),
    ("vllm-reasoning-effort", {MISTRAL: MISTRAL_PY_0_19_0, TRANSFORMERS: TRANSFORMERS_5_20_2},
     "skipped", "MistralCommonBackend.apply_chat_template already takes reasoning_effort"),
    ("vllm-reasoning-effort", {MISTRAL: MISTRAL_PY_0_26_0, TRANSFORMERS: TRANSFORMERS_5_20_2},
     "skipped", "the None vLLM passes on is no error"),
    ("vllm-reasoning-effort", {MISTRAL: MISTRAL_PY_0_26_0, TRANSFORMERS: TRANSFORMERS_4_57_3},
     "refused", "_prepare_apply_chat_template_tools_and_messages("),
    ("transformers-reasoning-effort", {TRANSFORMERS: TRANSFORMERS_5_20_2},
     "skipped", "transformers 5.20.2 MistralCommonBackend.apply_chat_template already takes"),
    # think-prefill: one diff fits both wrappers
    ("think-prefill", {MISTRAL: MISTRAL_PY_0_19_0}, "applied", 'reasoning_effort "high" opens'),
    ("think-prefill", {MISTRAL: MISTRAL_PY_0_26_0}, "applied", 'reasoning_effort "high" opens'),
    ("think-prefill", {MISTRAL: MISTRAL_PY_MOVED_RETURN}, "refused", "hunk 1 expected once"),
    # api-key-every-route: the diff for the file the base has
    ("api-key-every-route", {AUTH_OLD: AUTH_0_19_0}, "applied",
     "vLLM's --api-key guards only paths under /v1"),
    ("api-key-every-route", {AUTH_NEW: AUTH_0_26_0}, "applied", f"{AUTH_OLD} moved: here"),
    ("api-key-every-route", {AUTH_NEW: AUTH_0_26_0_FIXED}, "skipped", "no path prefix"),
    ("api-key-every-route", {AUTH_NEW: AUTH_0_26_0_OTHER_PREFIX}, "refused",
     "if url_path.startswith(GUARDED_PREFIX) and not self.verify_token(headers):"),
    ("api-key-every-route", {}, "refused", f"{AUTH_OLD}: not in the base"),
    # streamed-tool-calls: fixed only when serving has no gate AND the parser ends a no-[THINK]
    ("streamed-tool-calls", {SERVING: SERVING_0_26_0, REASONING: REASONING_0_26_0},
     "skipped", "through parser.parse_delta"),
    ("streamed-tool-calls", {SERVING: SERVING_0_26_0, REASONING: REASONING_0_19_0},
     "refused", "streamed-tool-calls: vllm/entrypoints/openai/chat_completion/serving.py"),
    # streamed-tool-call-end: needed while the stream's end reads a list the parser never fills
    ("streamed-tool-call-end", {SERVING: SERVING_0_19_0, TOOLS: MISTRAL_TOOLS_0_19_0},
     "applied", "with an IndexError"),
    ("streamed-tool-call-end", {SERVING: SERVING_0_19_0, TOOLS: MISTRAL_TOOLS_0_26_0},
     "skipped", "MistralToolParser keeps streamed_args_for_tool"),
    ("streamed-tool-call-end", {SERVING: SERVING_0_26_0, TOOLS: MISTRAL_TOOLS_0_26_0},
     "skipped", "reads no tool parser's streamed_args_for_tool"),
    # reasoning-split: both still fold a lone [/THINK] into content
    ("reasoning-split", {REASONING: REASONING_0_19_0}, "applied", "cannot split a [THINK]"),
    ("reasoning-split", {REASONING: REASONING_0_26_0}, "applied", "cannot split a [THINK]"),
]


@pytest.mark.parametrize("name, files, expected, says", CASES,
                         ids=[f"{c[0]}-{n}" for n, c in enumerate(CASES)])
def test_each_patch_is_applied_skipped_or_refused_by_shape(monkeypatch, name, files, expected,
                                                           says):
    versions = VERSIONS_0_26_0 if TRANSFORMERS_5_20_2 in files.values() else VERSIONS_0_19_0
    fix = load_chatfix(monkeypatch, files, versions)
    got, why = verdict(fix, name)
    assert (got, says in why) == (expected, True), why


def test_think_prefill_fits_what_the_vllm_fix_leaves_on_0_19_0(monkeypatch):
    fix = load_chatfix(monkeypatch, {MISTRAL: MISTRAL_PY_0_19_0}, VERSIONS_0_19_0)
    fixed = fix.fit(fix.VLLM_FIX, MISTRAL_PY_0_19_0, MISTRAL)
    both = fix.fit(fix.THINK_PREFILL, fixed, MISTRAL)
    assert "takes_it = " in both and "rendered += think" in both


# ------------------------------------------------------------------ the rules alone, on the excerpts

@pytest.mark.parametrize("rule, text, expected", [
    ("vllm_already_skips_unset_effort", MISTRAL_PY_0_19_0, None),  # vLLM's half unfixed on both
    ("vllm_already_skips_unset_effort", MISTRAL_PY_0_26_0, None),
    ("transformers_takes_what_vllm_passes", TRANSFORMERS_4_57_3, None),
    ("transformers_takes_what_vllm_passes", TRANSFORMERS_5_20_2, "the None vLLM passes on"),
    ("stream_gate_already_ends_without_think", SERVING_0_19_0, None),
    ("stream_gate_already_ends_without_think", SERVING_0_26_0, None),  # no gate: not this rule
    ("mistral_stream_ends_without_think", REASONING_0_19_0, None),
    ("mistral_stream_ends_without_think", REASONING_0_26_0, "opened no [THINK]"),
    ("mistral_parser_splits_prefill", REASONING_0_19_0, None),
    ("mistral_parser_splits_prefill", REASONING_0_26_0, None),
])
def test_rules_read_the_real_shapes(monkeypatch, rule, text, expected):
    fix = load_chatfix(monkeypatch, {}, VERSIONS_0_26_0)
    got = getattr(fix, rule)(text)
    assert got is None if expected is None else expected in got, got


def test_serving_shapes(monkeypatch):
    fix = load_chatfix(monkeypatch, {}, VERSIONS_0_26_0)
    assert fix.stream_goes_through_parse_delta(SERVING_0_26_0)
    assert not fix.stream_goes_through_parse_delta(SERVING_0_19_0)
    # parse_delta, but the 0.19.0 gate still there too: not the fixed shape
    both = SERVING_0_26_0 + "\n".join(SERVING_0_19_0.splitlines()[2:]) + "\n"
    assert not fix.stream_goes_through_parse_delta(both)


def test_stream_rule_needs_both_halves(monkeypatch):
    """0.26.0's parser rule alone is no fix while serving still gates on is_reasoning_end."""
    fix = load_chatfix(monkeypatch, {REASONING: REASONING_0_26_0}, VERSIONS_0_26_0)
    assert fix.stream_tools_not_needed(SERVING_0_19_0) is None
    assert "parse_delta" in fix.stream_tools_not_needed(SERVING_0_26_0)
