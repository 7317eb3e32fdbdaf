"""chatfix.py's shape rules read code, never versions: each rule is shown the shapes it must tell
apart (the bug and the fix), on text alone, by this machine's Python (they import nothing of vLLM or
transformers). Their effect on the real packages is tests/docker/test_patches.py's.
"""

import pytest

from sim.base import IMAGE_CONTEXT


def chatfix():
    import importlib.util

    spec = importlib.util.spec_from_file_location("chatfix", IMAGE_CONTEXT / "chatfix.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VLLM_0_19_0 = '''
class MistralTokenizer:
    def apply_chat_template(self, messages, tools=None, **kwargs):
        version_kwargs = {}
        if self.version >= 15:
            version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort")
'''
VLLM_UPSTREAM = '''
class MistralTokenizer:
    def apply_chat_template(self, messages, tools=None, **kwargs):
        version_kwargs = {}
        if self.version >= 15 and (effort := kwargs.get("reasoning_effort")) is not None:
            version_kwargs["reasoning_effort"] = effort
'''
AUTH_0_19_0 = '''
class AuthenticationMiddleware:
    def __call__(self, scope, receive, send):
        if url_path.startswith("/v1") and not self.verify_token(headers):
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
            return response(scope, receive, send)
        return self.app(scope, receive, send)
'''
AUTH_DENY_BY_DEFAULT = '''
class AuthenticationMiddleware:
    def __call__(self, scope, receive, send):
        if url_path not in self.public_paths and not self.verify_token(headers):
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
            return response(scope, receive, send)
        return self.app(scope, receive, send)
'''
TRANSFORMERS_4 = '''
class MistralCommonTokenizer:
    def apply_chat_template(self, conversation, tools=None, return_dict=False, **kwargs):
        pass
'''
# vllm/entrypoints/openai/chat_completion/serving.py L936 (0.19.0): the tool parser waits for
# is_reasoning_end of the delta alone; a gate that also looks at the parsed delta is a fix.
STREAM_0_19_0 = '''
class OpenAIServingChat:
    async def chat_completion_stream_generator(self, request):
        if reasoning_parser.is_reasoning_end(output_token_ids):
            reasoning_end_arr[i] = True
            current_token_ids = reasoning_parser.extract_content_ids(output_token_ids)
'''
STREAM_FIXED = '''
class OpenAIServingChat:
    async def chat_completion_stream_generator(self, request):
        if reasoning_parser.is_reasoning_end(output_token_ids) or not delta_message.reasoning:
            reasoning_end_arr[i] = True
            current_token_ids = reasoning_parser.extract_content_ids(output_token_ids)
'''
# vllm/reasoning/mistral_reasoning_parser.py L144-153 (0.19.0): a lone [/THINK] is dropped and
# the text on both sides returned as content; a parser that splits it returns the trace.
MISTRAL_PARSER_0_19_0 = '''
class MistralReasoningParser:
    def extract_reasoning(self, model_output, request):
        if has_non_valid_eot_token:
            prev_eot_token, _, post_eot_token = prev_bot_token.partition(self.end_token)
            return None, prev_eot_token + post_eot_token
        return None, prev_bot_token
'''
MISTRAL_PARSER_SPLITS = '''
class MistralReasoningParser:
    def extract_reasoning(self, model_output, request):
        if has_non_valid_eot_token:
            prev_eot_token, _, post_eot_token = prev_bot_token.partition(self.end_token)
            return prev_eot_token, post_eot_token or None
        return None, prev_bot_token
'''
TRANSFORMERS_5 = '''
class MistralCommonBackend:
    def apply_chat_template(self, conversation, tools=None, *, reasoning_effort=None, **kwargs):
        pass
'''


def test_shape_rules_tell_the_bug_from_the_fix():
    fix = chatfix()
    assert fix.vllm_already_skips_unset_effort(VLLM_0_19_0) is None
    assert "only when the request sets it" in fix.vllm_already_skips_unset_effort(VLLM_UPSTREAM)
    assert fix.base_guards_every_route(AUTH_0_19_0) is None
    assert "no path prefix" in fix.base_guards_every_route(AUTH_DENY_BY_DEFAULT)
    assert fix.transformers_already_takes_effort(TRANSFORMERS_4) is None
    assert "MistralCommonBackend.apply_chat_template already takes" in (
        fix.transformers_already_takes_effort(TRANSFORMERS_5))
    assert fix.stream_gate_already_ends_without_think(STREAM_0_19_0) is None
    assert "tests more than is_reasoning_end(delta)" in (
        fix.stream_gate_already_ends_without_think(STREAM_FIXED))
    assert fix.mistral_parser_splits_prefill(MISTRAL_PARSER_0_19_0) is None
    assert "no longer folds a lone [/THINK]" in fix.mistral_parser_splits_prefill(
        MISTRAL_PARSER_SPLITS)
    with pytest.raises(fix.PlanError, match="expected a method apply_chat_template in class "
                                            "MistralTokenizer; found none"):
        fix.vllm_already_skips_unset_effort("class Other:\n    pass\n")
