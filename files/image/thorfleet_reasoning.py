"""thorfleet's reasoning parser: splits a [THINK] block that the prompt opened (vLLM plugin).

Loaded by vLLM's `--reasoning-parser-plugin` (config `reasoning_parser_plugin:
/opt/thorfleet/image/thorfleet_reasoning.py`) and chosen with `reasoning_parser: thorfleet_mistral`.
Two shapes of vLLM's Mistral reasoning code, told apart by what
vllm/reasoning/mistral_reasoning_parser.py defines (never by a version string):
- a class MistralReasoningParser of its own (0.19.0, 0.26.0): PrefilledThinkReasoningParser
  below subclasses it (everything from "Why" on describes it);
- a shim re-exporting MistralParserReasoningAdapter (from 0.27.1; read here in 0.33.0, L4-6):
  the adapter (parser/engine/adapters.py) wraps parser/mistral.py's MistralParser, a ParserEngine
  whose every output starts in CONTENT (mistral.py L227), where [/THINK] is absorbed without an
  event (L212-215): a prefilled `trace[/THINK]answer` comes back as content "traceanswer". The
  engine-shape classes below start such an output in REASONING instead (see their docstrings);
  the split, the never-closed trace and the tool call inside the trace then follow vLLM's own
  transitions (mistral.py L196-221), as described below for the older shape.

Why: for reasoning_effort "high" the derived image ends the prompt with [THINK] (patches/
think-prefill.diff; this checkpoint does not open its think block by itself). The model's output
is then `trace[/THINK]answer`, with no [THINK] of its own, and vLLM 0.19.0's
MistralReasoningParser cannot split it: `is_reasoning_end` wants [THINK] before [/THINK] in the
same list and `extract_reasoning` joins the text around a lone [/THINK] into `content`
(vllm/reasoning/mistral_reasoning_parser.py L66-73, L144-153). The trace then arrives inline.

What this parser does, per request (vLLM builds one parser per chat request):
- It learns whether the prompt opened [THINK] from the prompt token ids vLLM hands it: serving
  calls `is_reasoning_end(prompt_token_ids)` before generating (chat_completion/serving.py L309,
  and L687 when streaming). A list that starts with BOS is a prompt (model output never does);
  the prompt opened the block when its last think marker is [THINK].
- Prompt opened [THINK] and the model closes it: the trace goes in `reasoning_content`, the answer
  in `content`, streamed and not streamed (streaming reads as if [THINK] preceded the output, so
  vLLM's own BaseThinkingReasoningParser code does the deltas). Tool calls after [/THINK] reach
  the tool parser, because `is_reasoning_end` now sees the close. On vLLM 0.26.0 every streamed
  delta goes through parser.parse_delta, which ends reasoning when `is_reasoning_end_streaming`
  says so: here at [/THINK] (or a tool call), not at the first token with no [THINK].
- Prompt opened [THINK] and the model never closes it: everything it wrote is `reasoning_content`
  and `content` is empty (null when not streamed); `finish_reason` is vLLM's own, `length` when
  max_tokens cut the trace. Why: the text is an unfinished trace, not an answer, and a client must
  not show or act on it as one (parse it as JSON, speak it); a streamed reasoning delta cannot be
  taken back, so streamed and non-streamed agree only if the trace stays reasoning; and it is what
  OpenAI-style reasoning APIs do when the budget runs out inside the reasoning (empty content,
  finish_reason "length"). A client that gets empty content reads finish_reason: `length` means
  raise max_tokens (or ask without reasoning_effort high); `stop` means the model ended inside
  its trace, whose text is in reasoning_content.
- Prompt opened [THINK] and the model calls a tool without closing it: [TOOL_CALLS] ends the
  trace as [/THINK] would (the call goes to the tool parser, never into reasoning_content), as
  vLLM's mistral parser alone would have passed it on as content to the tool parser.
- Non-streamed without a prompt seen (include_reasoning false skips L309): a lone [/THINK] (no
  [THINK] before it) can only close a block the prompt opened, so the text before it is the trace.
- Requests whose prompt did not open [THINK] (no reasoning_effort, "none", an image built with
  --think-prefill 0) go to MistralReasoningParser unchanged.

It stands aside where the base already splits a prefilled trace: chatfix.py's shape rule
(`mistral_parser_splits_prefill`, the same one `chatfix.py plan` labels the image with,
`reasoning-split=skipped`) reads the installed MistralReasoningParser; when it no longer folds a
lone [/THINK] into content, the name `thorfleet_mistral` is registered for vLLM's own class.
`chatfix.py check` proves the split on the built image, whichever class that is.
"""

import importlib.util
import inspect
from collections.abc import Sequence
from pathlib import Path

from vllm.logger import init_logger
from vllm.reasoning import ReasoningParserManager, mistral_reasoning_parser

NAME = "thorfleet_mistral"
TOOL_CALLS = "[TOOL_CALLS]"
logger = init_logger(f"vllm.{__name__}")  # under vllm: its log config shows it

# The code's shape: 0.19.0 and 0.26.0 define the class in this module; from 0.27.1 the module is a
# shim that re-exports the engine adapter (0.33.0 reasoning/mistral_reasoning_parser.py L4-6).
ENGINE_SHAPE = not hasattr(mistral_reasoning_parser, "MistralReasoningParser")

if not ENGINE_SHAPE:
    from vllm.entrypoints.openai.engine.protocol import DeltaMessage
    from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser
    from vllm.reasoning.mistral_reasoning_parser import MistralReasoningParser

    class PrefilledThinkReasoningParser(MistralReasoningParser):
        """MistralReasoningParser that also splits a [THINK] block the prompt opened."""

        def __init__(self, tokenizer, *args, **kwargs):
            super().__init__(tokenizer, *args, **kwargs)
            self.bos_token_id = tokenizer.bos_token_id
            try:  # Mistral v11+ tokenizers; a call in an unclosed trace ends the trace
                self.tool_calls_token_id = tokenizer.tokenizer.get_special_token(TOOL_CALLS)
            except Exception:  # noqa: BLE001 - older tokenizers have no such token
                self.tool_calls_token_id = None
            # None until a prompt is seen; then whether it ended inside an open [THINK] block.
            self.prompt_opened: bool | None = None

        def _last_marker_is_start(self, ids: Sequence[int]) -> bool:
            for token_id in reversed(ids):
                if token_id == self.start_token_id:
                    return True
                if token_id == self.end_token_id:
                    return False
            return False

        def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
            if len(input_ids) and input_ids[0] == self.bos_token_id:
                # The prompt (or, in the engine's structured-output manager, prompt + output):
                # vLLM's answer is right for both; only remember what the prompt opened.
                if self.prompt_opened is None:
                    self.prompt_opened = self._last_marker_is_start(input_ids)
                return super().is_reasoning_end(input_ids)
            if self.prompt_opened:
                # Output of a prompt that opened [THINK]: reasoning ended once [/THINK] is its last
                # think marker (vLLM's generic rule, BaseThinkingReasoningParser.is_reasoning_end),
                # or a tool call began.
                return (BaseThinkingReasoningParser.is_reasoning_end(self, input_ids)
                        or self._call_in_trace(input_ids) is not None)
            return super().is_reasoning_end(input_ids)

        def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids) -> bool:
            if self.prompt_opened and not (len(input_ids) and input_ids[0] == self.bos_token_id):
                # Output of a prompt that opened [THINK]. vLLM 0.26.0 streams chat through
                # parser.parse_delta, which hands every later delta to content (or the tool parser)
                # once this is true (vllm/parser/abstract_parser.py L846-851); its
                # MistralReasoningParser says true for an output with no [THINK]
                # (reasoning/mistral_reasoning_parser.py L76-83), i.e. from the trace's first token.
                # The trace ends at [/THINK] or a tool call. (0.19.0's serving never calls this; its
                # engine does, with prompt + output: the BOS case, vLLM's answer.)
                return self.end_token_id in delta_ids or self._call_in_trace(input_ids) is not None
            return super().is_reasoning_end_streaming(input_ids, delta_ids)

        def _call_in_trace(self, ids: Sequence[int]) -> int | None:
            """Index of a [TOOL_CALLS] written before any [/THINK] (prompt-opened trace), else
            None."""
            for n, token_id in enumerate(ids):
                if token_id == self.end_token_id:
                    return None
                if token_id == self.tool_calls_token_id:
                    return n
            return None

        def extract_content_ids(self, input_ids: list[int]) -> list[int]:
            if self.prompt_opened:
                if (call := self._call_in_trace(input_ids)) is not None:
                    return list(input_ids[call:])
                return BaseThinkingReasoningParser.extract_content_ids(self, input_ids)
            return super().extract_content_ids(input_ids)

        def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
            if self.prompt_opened:
                return super().count_reasoning_tokens([self.start_token_id, *token_ids])
            return super().count_reasoning_tokens(token_ids)

        def extract_reasoning(self, model_output, request):
            opened = self.prompt_opened
            if opened is None:  # no prompt seen: a lone closing tag tells
                before, found, _ = model_output.partition(self.end_token)
                opened = bool(found) and self.start_token not in before
            if not opened:
                return super().extract_reasoning(model_output, request)
            trace, closed, answer = model_output.removeprefix(self.start_token).partition(
                self.end_token)
            if not closed and TOOL_CALLS in trace:
                trace, call, rest = trace.partition(TOOL_CALLS)
                return trace or None, call + rest
            if not closed:
                return trace or None, None  # never closed: all trace, no answer (see docstring)
            return trace or None, answer or None

        def extract_reasoning_streaming(self, previous_text, current_text, delta_text,
                                        previous_token_ids, current_token_ids, delta_token_ids):
            if self.prompt_opened and self.tool_calls_token_id is not None and (
                    self._call_in_trace(current_token_ids) is not None):
                if self._call_in_trace(previous_token_ids) is not None:
                    return DeltaMessage(content=delta_text)  # the call goes on: content
                trace, call, rest = delta_text.partition(TOOL_CALLS)
                return DeltaMessage(reasoning=trace or None, content=call + rest)
            if self.prompt_opened:
                # As if the output had begun with [THINK]: vLLM's own delta logic then applies.
                previous_token_ids = [self.start_token_id, *previous_token_ids]
                current_token_ids = [self.start_token_id, *current_token_ids]
            return super().extract_reasoning_streaming(
                previous_text, current_text, delta_text, previous_token_ids, current_token_ids,
                delta_token_ids)

else:
    from vllm.parser.engine.parser_engine_config import ParserState
    from vllm.parser.mistral import MistralParser
    from vllm.reasoning.mistral_reasoning_parser import MistralParserReasoningAdapter

    MistralReasoningParser = MistralParserReasoningAdapter  # what vLLM registers as "mistral"

    class PrefilledThinkMistralParser(MistralParser):
        """vLLM's MistralParser (parser/mistral.py L273) that starts the output of a prompt ending
        in an open [THINK] in REASONING: the engine's transitions then end the trace at [/THINK]
        (REASONING_END, mistral.py L207-210) or at a tool call (L217-220), and a trace never
        closed stays reasoning. Prompts that did not open [THINK] keep vLLM's CONTENT start."""

        # None until a prompt is seen; then whether it ended inside an open [THINK] block.
        _prompt_opened: bool | None = None

        def _opens(self, prompt_token_ids: Sequence[int]) -> bool:
            for token_id in reversed(prompt_token_ids):
                if token_id == self._reasoning_start_token_id:
                    return True
                if token_id in self._reasoning_end_token_ids:
                    return False
            return False

        def set_prompt_token_ids(self, prompt_token_ids: Sequence[int]) -> None:
            # Called with the prompt before the output is parsed, not streamed (chat_completion/
            # serving.py L996-997) and streamed (parser/abstract_parser.py L871, in parse_delta).
            super().set_prompt_token_ids(prompt_token_ids)
            self._prompt_opened = self._opens(prompt_token_ids)

        def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
            # parse_delta's hook for a prompt that leaves reasoning open (abstract_parser.py
            # L875-882), done as vLLM's own Gemma4Parser does it (parser/gemma4.py L561-581).
            if self._opens(prompt_token_ids):
                self._prompt_opened = True
                self._engine.reset(initial_state=ParserState.REASONING)
                self._streaming_initialized = True

        def _reset(self, initial_state: ParserState | None = None) -> None:
            # Every parse starts here with no state of its own (parser_engine.py L257-267):
            # extract_reasoning (L570), initialize_streaming (L227-233), _single_pass_parse.
            super()._reset(initial_state=initial_state)
            if initial_state is None and self._prompt_opened:
                self._engine.reset(initial_state=ParserState.REASONING)

        def extract_reasoning(self, model_output, request):
            start, end = self.reasoning_start_str, self.reasoning_end_str
            if self._prompt_opened is None and start and end:
                # No prompt seen: a lone closing tag (no [THINK] before it) can only close a
                # block the prompt opened.
                before, found, _ = model_output.partition(end)
                self._prompt_opened = bool(found) and start not in before
            return super().extract_reasoning(model_output, request)

    class PrefilledThinkReasoningParser(MistralParserReasoningAdapter):
        """vLLM's MistralParserReasoningAdapter around PrefilledThinkMistralParser."""

        _parser_engine_cls = PrefilledThinkMistralParser

        def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
            # Not streamed, vLLM counts on a second engine and copies only whether the prompt
            # closed reasoning onto it (parser/engine/adapters.py L146-161): it is made here as
            # there, and told what the prompt opened too.
            if (not self._streaming_count_valid and token_ids
                    and self._counting_parser_engine is None):
                self._counting_parser_engine = self._parser_engine_cls(
                    self.model_tokenizer, **self._parser_engine_kwargs)
                self._counting_parser_engine._prompt_closes_reasoning = (
                    self._parser_engine._prompt_closes_reasoning)
            if self._counting_parser_engine is not None:
                self._counting_parser_engine._prompt_opened = self._parser_engine._prompt_opened
            return super().count_reasoning_tokens(token_ids)


def base_splits_prefill() -> str | None:
    """Why vLLM's own Mistral reasoning parser needs no help (chatfix.py's shape rule on its
    installed source), or None when it does. Without chatfix.py beside this file: None."""
    chatfix_path = Path(__file__).with_name("chatfix.py")
    if not chatfix_path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("thorfleet_chatfix", chatfix_path)
    chatfix = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chatfix)
    text = Path(inspect.getsourcefile(mistral_reasoning_parser)).read_text()
    return chatfix.mistral_parser_splits_prefill(text)


def register() -> type:
    reason = base_splits_prefill()
    chosen = MistralReasoningParser if reason else PrefilledThinkReasoningParser
    ReasoningParserManager.register_module(NAME, module=chosen)
    logger.info("reasoning parser %s: %s", NAME,
                f"vLLM's own {MistralReasoningParser.__name__} ({reason})" if reason
                else "splits a [THINK] block the prompt opened")
    return chosen


PARSER = register()
