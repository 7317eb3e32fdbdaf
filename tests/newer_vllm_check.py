"""thorfleet's reasoning plugin and chatfix.py's API-key patch on a real, unpatched vLLM install:
run with that install's python (tests/docker/test_reasoning_engine.py runs it in a container of each
newer sim base). No server, no engine, no GPU: vLLM's own parser classes, its
MistralTokenizer on the v15 test tokenizer, its AuthenticationMiddleware.

The prompt for reasoning_effort "high" is rendered by vLLM's MistralTokenizer and ends in [THINK]
as think-prefill.diff leaves it (appended here: the install is not patched). The plugin is loaded
as `--reasoning-parser-plugin` loads it and called as the base's serving calls it: non-streamed
through the Parser that ParserManager composes (set_prompt_token_ids, then parse: 0.33.0
chat_completion/serving.py L996-1020; 0.26.0 asks is_reasoning_end of the prompt, L358-359),
streamed token by token through parse_delta as both stream (chatfix.py's stream_deltas).
Prints one JSON object.
"""

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
IMAGE = Path(__file__).resolve().parents[1] / "files" / "image"
TRACE, ANSWER = "The user asks about Paris.", "It is sunny in Paris."


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> dict:
    chatfix = load("chatfix", IMAGE / "chatfix.py")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser import ParserManager
    from vllm.reasoning import ReasoningParserManager
    from vllm.tokenizers.mistral import MistralTokenizer

    ReasoningParserManager.import_reasoning_parser(str(IMAGE / "thorfleet_reasoning.py"))
    plugin_class = ReasoningParserManager.get_reasoning_parser("thorfleet_mistral")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = MistralTokenizer.from_pretrained(str(chatfix.make_tokenizer(Path(tmp))))
    think = tokenizer.tokenizer.get_special_token("[THINK]")
    end = tokenizer.tokenizer.get_special_token("[/THINK]")
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [chatfix.WEATHER_TOOL]
    plain = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    high = [*tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           reasoning_effort="high"), think]

    def enc(text):
        return tokenizer.encode(text, add_special_tokens=False)

    def call_ids():  # [TOOL_CALLS] and [ARGS] are special tokens, as the model writes them
        special = tokenizer.tokenizer.get_special_token
        return [special("[TOOL_CALLS]"), *enc("get_weather"), special("[ARGS]"),
                *enc('{"city": "Paris"}')]

    outputs = {
        "closed": (high, [*enc(TRACE), end, *enc(ANSWER)]),
        "never closed": (high, enc(TRACE)),
        "call in trace": (high, [*enc(TRACE), *call_ids()]),
        "plain": (plain, enc(ANSWER)),
        "plain call": (plain, call_ids()),
    }
    parser_class = ParserManager.get_parser(tool_parser_name="mistral",
                                            reasoning_parser_name="thorfleet_mistral",
                                            enable_auto_tools=True)

    def request(stream):
        return ChatCompletionRequest(model="m", messages=messages, tools=tools, stream=stream,
                                     reasoning_effort="high")

    results = {}
    for name, (prompt, output) in outputs.items():
        text = tokenizer.decode(output, skip_special_tokens=False)
        whole = parser_class(tokenizer, None, chat_template_kwargs={})
        if hasattr(whole, "set_prompt_token_ids"):  # 0.33.0 serving.py L996-997
            whole.set_prompt_token_ids(prompt)
        else:  # 0.26.0 chat_completion/serving.py L358-359, before generating
            whole.is_reasoning_end(prompt)
        reasoning, content, calls = whole.parse(text, request(False), enable_auto_tools=True,
                                                model_output_token_ids=output)
        counted = getattr(whole, "count_reasoning_tokens", lambda ids: None)(output)
        streamed = parser_class(tokenizer, None, chat_template_kwargs={})
        parts = {"reasoning": "", "content": "", "calls": []}
        previous = ""
        for n in range(len(output)):
            current = tokenizer.decode(output[:n + 1], skip_special_tokens=False)
            delta = streamed.parse_delta(current[len(previous):], output[n:n + 1],
                                         request(True), prompt_token_ids=prompt,
                                         finished=n == len(output) - 1)
            previous = current
            if delta is not None:
                parts["reasoning"] += delta.reasoning or ""
                parts["content"] += delta.content or ""
                parts["calls"] += [c.function.name for c in delta.tool_calls or []
                                   if c.function and c.function.name]
        results[name] = {"reasoning": reasoning, "content": content,
                         "calls": [c.name for c in calls or []], "reasoning_tokens": counted,
                         "streamed": parts}

    # vLLM's own "mistral" parser on the same prefilled output: does it split it by itself?
    own = ParserManager.get_parser(reasoning_parser_name="mistral")(tokenizer, None)
    getattr(own, "set_prompt_token_ids", own.is_reasoning_end)(high)
    own_split = own.parse(tokenizer.decode(outputs["closed"][1], skip_special_tokens=False),
                          request(False))[:2]

    # chatfix.py's API-key patch, applied to the text (not the install) and probed
    relpath = chatfix.target_of(chatfix.API_KEY)
    patched = chatfix.fit(chatfix.API_KEY, chatfix.source_of(relpath)[1], relpath)
    middleware = {}
    exec(compile(patched, relpath, "exec"), middleware)  # noqa: S102 - the patched upstream file
    import asyncio

    probe = {path: [asyncio.run(chatfix.through_middleware(
                        middleware["AuthenticationMiddleware"], method, path, key))
                    for key in (None, chatfix.KEY)]
             for method, path in [("POST", p) for p in chatfix.MUST_NEED_KEY]
             + [("GET", p) for p in chatfix.MUST_BE_OPEN]}
    return {"plugin_class": plugin_class.__name__,
            "plugin_base": plugin_class.__mro__[1].__name__,
            "prompt_ends_with_think": high[-1] == think,
            "plugin_prompt_is_reasoning_end": whole.is_reasoning_end(high),
            "results": results, "own_split": list(own_split),
            "api_key_target": relpath, "api_key_probe": probe}


if __name__ == "__main__":
    print(json.dumps(main()))
    sys.stdout.flush()
