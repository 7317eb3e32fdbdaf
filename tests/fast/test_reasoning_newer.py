"""thorfleet's reasoning parser (files/image/thorfleet_reasoning.py) on vLLM 0.26.0 beside 0.19.0:
a trace the prompt opened ([THINK] prefilled) streams as reasoning until [/THINK], then content.

No Docker, no vLLM: the plugin is loaded against a few real excerpts of vLLM's reasoning classes
(each cited by version, file and lines; the rest elided; `start_token` and the tokenizer check
simplified) written as a `vllm` package in a temporary directory. 0.26.0 streams chat through
parser.parse_delta (chat_completion/serving.py L606-613), modelled below from
parser/abstract_parser.py; 0.19.0 calls extract_reasoning_streaming per delta (serving.py L997).
tests/docker/test_reasoning_split.py proves the split on a real 0.19.0 server in Docker.
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.fast.test_chatfix_newer import SERVING_0_19_0, SERVING_0_26_0

IMAGE = Path(__file__).resolve().parents[2] / "files" / "image"

# ------------------------------------------------------------------ the fake vllm package

STUBS = {
    "vllm/__init__.py": "",
    "vllm/logger.py": "import logging\n\ninit_logger = logging.getLogger\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/engine/__init__.py": "",
    "vllm/entrypoints/openai/engine/protocol.py": '''\
from dataclasses import dataclass


@dataclass
class DeltaMessage:
    reasoning: str | None = None
    content: str | None = None
''',
    "vllm/entrypoints/openai/chat_completion/__init__.py": "",
    "vllm/entrypoints/openai/chat_completion/protocol.py": '''\
class ChatCompletionRequest:
    def __init__(self, **fields):
        self.include_reasoning = True
        self.__dict__.update(fields)
''',
    "vllm/reasoning/__init__.py": '''\
class ReasoningParser:
    def __init__(self, tokenizer, *args, **kwargs):
        self.model_tokenizer = tokenizer


class ReasoningParserManager:
    parsers = {}

    @classmethod
    def register_module(cls, name, module):
        cls.parsers[name] = module

    @classmethod
    def get_reasoning_parser(cls, name):
        return cls.parsers[name]
''',
    # vllm 0.26.0 parser/abstract_parser.py Parser.parse_delta L801-914: the prompt check, the
    # reasoning phase and the pass-through; elided: the tool phase (with no tools it passes text
    # on as content the same way, L660-675), engine-based parsers, finalize.
    "vllm/parser/__init__.py": '''\
from vllm.entrypoints.openai.engine.protocol import DeltaMessage
from vllm.reasoning import ReasoningParserManager


class Parser:
    reasoning_parser_cls = None

    def __init__(self, tokenizer, tools=None, *args, **kwargs):
        self._reasoning_parser = self.reasoning_parser_cls(tokenizer, *args, **kwargs)
        self.prompt_reasoning_checked = self.reasoning_ended = False
        self.previous_text, self.previous_token_ids = "", []

    def parse_delta(self, delta_text, delta_token_ids, request, prompt_token_ids=None, *,
                    finished):
        parser = self._reasoning_parser
        if not self.prompt_reasoning_checked and prompt_token_ids is not None:
            self.prompt_reasoning_checked = True
            if parser.is_reasoning_end(prompt_token_ids):
                self.reasoning_ended = True
        current_text = self.previous_text + delta_text
        current_token_ids = self.previous_token_ids + delta_token_ids
        delta_message, transitioned = None, False
        if not self.reasoning_ended:
            delta_message = parser.extract_reasoning_streaming(
                self.previous_text, current_text, delta_text, self.previous_token_ids,
                current_token_ids, delta_token_ids)
            if parser.is_reasoning_end_streaming(current_token_ids, delta_token_ids):
                self.reasoning_ended = transitioned = True
                current_token_ids = parser.extract_content_ids(delta_token_ids)
                current_text = (delta_message.content if delta_message else None) or ""
                delta_text = current_text
        if delta_message is None and not transitioned and self.reasoning_ended:
            delta_message = DeltaMessage(content=delta_text)
        self.previous_text, self.previous_token_ids = current_text, current_token_ids
        return delta_message


class ParserManager:
    @staticmethod
    def get_parser(tool_parser_name=None, reasoning_parser_name=None, **kwargs):
        return type("DelegatingParser", (Parser,), {
            "reasoning_parser_cls": ReasoningParserManager.get_reasoning_parser(
                reasoning_parser_name)})
''',
    # vllm 0.26.0 reasoning/basic_parsers.py L68-155 (0.19.0 L60-147: the same code)
    "vllm/reasoning/basic_parsers.py": '''\
from itertools import islice

from vllm.entrypoints.openai.engine.protocol import DeltaMessage
from vllm.reasoning import ReasoningParser


class BaseThinkingReasoningParser(ReasoningParser):
    def is_reasoning_end(self, input_ids):
        start_token_id = self.start_token_id
        end_token_id = self.end_token_id

        for i in range(len(input_ids) - 1, -1, -1):
            if input_ids[i] == start_token_id:
                return False
            if input_ids[i] == end_token_id:
                return True
        return False

    def is_reasoning_end_streaming(self, input_ids, delta_ids):
        end_token_id = self.end_token_id
        return end_token_id in delta_ids

    def extract_content_ids(self, input_ids):
        if self.end_token_id not in islice(input_ids, 0, max(0, len(input_ids) - 1)):
            return []
        else:
            return input_ids[input_ids.index(self.end_token_id) + 1 :]

    def extract_reasoning_streaming(self, previous_text, current_text, delta_text,
                                    previous_token_ids, current_token_ids, delta_token_ids):
        if len(delta_token_ids) == 1 and (
            delta_token_ids[0] in [self.start_token_id, self.end_token_id]
        ):
            return None
        if self.start_token_id in previous_token_ids:
            if self.end_token_id in delta_token_ids:
                end_index = delta_text.find(self.end_token)
                reasoning = delta_text[:end_index]
                content = delta_text[end_index + len(self.end_token) :]
                return DeltaMessage(
                    reasoning=reasoning, content=content if content else None
                )
            elif self.end_token_id in previous_token_ids:
                return DeltaMessage(content=delta_text)
            else:
                return DeltaMessage(reasoning=delta_text)
        elif self.start_token_id in delta_token_ids:
            if self.end_token_id in delta_token_ids:
                start_index = delta_text.find(self.start_token)
                end_index = delta_text.find(self.end_token)
                reasoning = delta_text[start_index + len(self.start_token) : end_index]
                content = delta_text[end_index + len(self.end_token) :]
                return DeltaMessage(
                    reasoning=reasoning, content=content if content else None
                )
            else:
                return DeltaMessage(reasoning=delta_text)
        else:
            return DeltaMessage(content=delta_text)
''',
}

# vllm 0.26.0 reasoning/mistral_reasoning_parser.py L17-162 (__init__ and start/end_token
# simplified); 0.19.0 is the same without is_reasoning_end_streaming (L76-83).
MISTRAL_HEAD = '''\
from vllm.reasoning import ReasoningParser
from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser


class MistralReasoningParser(BaseThinkingReasoningParser):
    start_token, end_token = "[THINK]", "[/THINK]"

    def __init__(self, tokenizer, *args, **kwargs):
        ReasoningParser.__init__(self, tokenizer, *args, **kwargs)
        self.start_token_id = tokenizer.tokenizer.get_special_token(self.start_token)
        self.end_token_id = tokenizer.tokenizer.get_special_token(self.end_token)

    def is_reasoning_end(self, input_ids):
        has_eot_token = False

        for id in reversed(input_ids):
            if id == self.start_token_id:
                # Reasoning ends only if a BOT token is found before a EOT token.
                return has_eot_token
            elif id == self.end_token_id:
                has_eot_token = True
        return False
'''
MISTRAL_STREAMING_0_26_0 = '''
    def is_reasoning_end_streaming(self, input_ids, delta_ids):
        if self.end_token_id in delta_ids:
            return True
        # Grammar's think? is optional — if [THINK] was never generated,
        # reasoning was skipped entirely.
        return self.start_token_id not in input_ids
'''
MISTRAL_TAIL = '''
    def extract_reasoning(self, model_output, request):
        if not model_output:
            return (None, "")
        prev_bot_token, bot_token, post_bot_token = model_output.partition(
            self.start_token
        )
        has_bot_token = bool(bot_token)
        has_valid_eot_token = has_bot_token and self.end_token in post_bot_token
        if has_bot_token and has_valid_eot_token:
            prev_eot_token, _, post_eot_token = post_bot_token.partition(self.end_token)
            content = prev_bot_token + post_eot_token
            return prev_eot_token, content if content else None
        elif has_bot_token:
            return post_bot_token, prev_bot_token if prev_bot_token else None
        else:
            has_non_valid_eot_token = self.end_token in prev_bot_token
            if has_non_valid_eot_token:
                prev_eot_token, _, post_eot_token = prev_bot_token.partition(
                    self.end_token
                )
                return None, prev_eot_token + post_eot_token
            else:
                return None, prev_bot_token
'''
MISTRAL = {"0.19.0": MISTRAL_HEAD + MISTRAL_TAIL,
           "0.26.0": MISTRAL_HEAD + MISTRAL_STREAMING_0_26_0 + MISTRAL_TAIL}
SERVING = {"0.19.0": SERVING_0_19_0, "0.26.0": SERVING_0_26_0}

# ------------------------------------------------------------------ a tokenizer, a word a token

BOS, INST, END_INST, CALLS, THINK, END = 1, 3, 4, 9, 34, 35
SPECIAL = {"<s>": BOS, "[INST]": INST, "[/INST]": END_INST, "[TOOL_CALLS]": CALLS,
           "[THINK]": THINK, "[/THINK]": END}


class Tokenizer:
    bos_token_id = BOS

    def __init__(self):
        self.tokenizer = self
        self.ids = dict(SPECIAL)

    def get_special_token(self, name):
        return SPECIAL[name]

    def encode(self, text: str) -> list[int]:
        pieces = [(" " if n else "") + word for n, word in enumerate(text.split(" "))]
        return [self.ids.setdefault(piece, 100 + len(self.ids)) for piece in pieces]

    def decode(self, ids, skip_special_tokens=False) -> str:
        pieces = {i: piece for piece, i in self.ids.items()}
        return "".join(pieces[i] for i in ids)


TOK = Tokenizer()
TRACE, ANSWER = "The user asks about Paris.", "It is sunny in Paris."
T, A = TOK.encode(TRACE), TOK.encode(ANSWER)
HIGH_PROMPT = [BOS, INST, *TOK.encode("weather?"), END_INST, THINK]  # think-prefill's prompt
PLAIN_PROMPT = [BOS, INST, *TOK.encode("weather?"), END_INST]


@pytest.fixture(params=["0.19.0", "0.26.0"])
def vllm(request, tmp_path, monkeypatch):
    """(version, plugin module) with the fake vllm of that version importable."""
    version = request.param
    for relpath, text in {**STUBS,
                          "vllm/reasoning/mistral_reasoning_parser.py": MISTRAL[version]}.items():
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_text(text)
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "vllm"}
    for name in saved:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("thorfleet_reasoning_under_test",
                                                  IMAGE / "thorfleet_reasoning.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    yield version, plugin
    for name in [n for n in sys.modules if n.split(".")[0] == "vllm"]:
        del sys.modules[name]
    sys.modules.update(saved)


def parser(plugin, prompt):
    p = plugin.PARSER(TOK)
    if prompt is not None:
        p.is_reasoning_end(prompt)
    return p


# ------------------------------------------------------------------ when the trace ends, streamed

STREAM_END = [
    # (case, prompt seen, output so far, delta, ended by 0.19.0, ended by 0.26.0)
    ("prefilled trace, first token", HIGH_PROMPT, T[:1], T[:1], False, False),
    ("prefilled trace goes on", HIGH_PROMPT, T[:3], T[2:3], False, False),
    ("prefilled trace closes", HIGH_PROMPT, [*T, END], [END], True, True),
    ("closes inside a longer delta", HIGH_PROMPT, [*T, END, *A[:2]], [T[-1], END, *A[:2]],
     True, True),
    ("a tool call inside the trace", HIGH_PROMPT, [*T[:2], CALLS], [CALLS], True, True),
    ("plain answer (vLLM's rule)", PLAIN_PROMPT, A[:1], A[:1], False, True),
    ("plain prompt, model opens [THINK]", PLAIN_PROMPT, [THINK, *T[:1]], T[:1], False, False),
    ("no prompt seen (vLLM's rule)", None, T[:1], T[:1], False, True),
    # the engine's structured-output manager: one parser for all requests, prompt + output
    ("engine: prompt + trace", HIGH_PROMPT, [*HIGH_PROMPT, *T[:2]], T[1:2], False, False),
    ("engine: prompt + closed trace", HIGH_PROMPT, [*HIGH_PROMPT, *T, END], [END], True, True),
    ("engine: another request's plain answer", HIGH_PROMPT, [*PLAIN_PROMPT, *A[:2]], A[1:2],
     False, True),
]


@pytest.mark.parametrize("case, prompt, ids, delta, ended_19, ended_26", STREAM_END,
                         ids=[row[0] for row in STREAM_END])
def test_when_reasoning_ends_streamed(vllm, case, prompt, ids, delta, ended_19, ended_26):
    version, plugin = vllm
    expected = ended_26 if version == "0.26.0" else ended_19
    assert parser(plugin, prompt).is_reasoning_end_streaming(ids, delta) is expected


# ------------------------------------------------------------------ the streamed split, as served

def streamed(version, plugin, prompt, output, per_delta=1) -> tuple[str, str]:
    """(reasoning, content) joined from the deltas, streamed as that version's chat serving does
    (chatfix.py's stream_deltas, whose serving-shape rule reads the cited excerpt)."""
    spec = importlib.util.spec_from_file_location("chatfix_under_test", IMAGE / "chatfix.py")
    fix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fix)
    fix.source_of = lambda relpath: (Path("/base") / relpath, SERVING[version])
    parts = {"reasoning": "", "content": ""}
    if per_delta == 1:
        deltas = fix.stream_deltas(plugin.PARSER, TOK, prompt, output, messages=[])
    else:  # several tokens a delta (speculative decoding): 0.26.0's parse_delta only
        from vllm.parser import ParserManager

        p = ParserManager.get_parser(reasoning_parser_name=plugin.NAME)(TOK)
        chunks = [output[n:n + per_delta] for n in range(0, len(output), per_delta)]
        deltas = [p.parse_delta(TOK.decode(c), c, None, prompt_token_ids=prompt, finished=False)
                  for c in chunks]
    for delta in deltas:
        for key in parts:
            parts[key] += (getattr(delta, key, None) or "") if delta else ""
    return parts["reasoning"], parts["content"]


SPLITS = [
    # (case, prompt, output, tokens a delta, (reasoning, content))
    ("prefilled trace, then the answer", HIGH_PROMPT, [*T, END, *A], 1, (TRACE, ANSWER)),
    ("prefilled trace, 3 tokens a delta", HIGH_PROMPT, [*T, END, *A], 3, (TRACE, ANSWER)),
    ("prefilled trace never closed", HIGH_PROMPT, T, 1, (TRACE, "")),
    ("plain prompt, plain answer", PLAIN_PROMPT, A, 1, ("", ANSWER)),
]


@pytest.mark.parametrize("case, prompt, output, per_delta, expected", SPLITS,
                         ids=[row[0] for row in SPLITS])
def test_streamed_split(vllm, case, prompt, output, per_delta, expected):
    version, plugin = vllm
    if per_delta > 1 and version == "0.19.0":
        pytest.skip("0.26.0's parse_delta model only")
    assert streamed(version, plugin, prompt, output, per_delta) == expected


def test_the_check_fails_an_image_whose_streamed_split_breaks_on_0_26_0(vllm, monkeypatch):
    """Without the plugin's is_reasoning_end_streaming (as before) 0.26.0 streams all but the
    first trace token as content, and chatfix.py check's stream (parse_delta) sees it."""
    version, plugin = vllm
    monkeypatch.delattr(plugin.PrefilledThinkReasoningParser, "is_reasoning_end_streaming")
    got = streamed(version, plugin, HIGH_PROMPT, [*T, END, *A])
    if version == "0.19.0":
        assert got == (TRACE, ANSWER)  # 0.19.0's serving never asks
    else:
        assert got == ("The", " user asks about Paris.[/THINK]It is sunny in Paris.")
