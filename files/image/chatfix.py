#!/usr/bin/env python3
"""Plan, apply and check thorfleet's patches (chat template, API key, reasoning split, streamed
tool calls and their end) inside a vLLM image.

Runs with whatever `python3` the image puts first on PATH, and finds the packages through that
interpreter (no hard-coded site-packages path). Each patch is a real unified diff in patches/;
it is applied here strictly: every hunk's old lines must occur exactly once in the target file,
wherever they are (line numbers are ignored), or nothing is written and the build stops with what
was expected and what was found. A patch the base no longer needs is skipped, and said so. A patch
may have more than one diff, one per shape of the code it changes (the file moved, the lines
around it changed): the first whose file the base has and whose hunks fit is the one applied.

The table (TABLE, in this order; the label lists each as applied, skipped or off):
    vllm-reasoning-effort          patches/vllm-reasoning-effort.diff (vLLM passes None on;
                                   skipped where transformers takes it: the 400 is the pair)
    transformers-reasoning-effort  patches/transformers-reasoning-effort.diff (4.57.3 refuses it)
    think-prefill                  patches/think-prefill.diff (build option: "high" opens [THINK])
    api-key-every-route            patches/vllm-api-key-every-route.diff (--api-key only on /v1),
                                   or vllm-api-key-every-route-serve.diff where the middleware
                                   lives in entrypoints/serve/utils/ (prefixes /v1 /v2 /inference),
                                   or -middleware.diff in entrypoints/serve/middleware/ (+/cohere)
    streamed-tool-calls            patches/vllm-streamed-tool-calls.diff (stream waits for [/THINK])
    streamed-tool-call-end         patches/vllm-streamed-tool-call-end.diff (IndexError at the end
                                   when the last delta carries arguments)
    reasoning-split                thorfleet_reasoning.py, a --reasoning-parser-plugin, no diff:
                                   splits a [THINK] the prompt opened; off with think-prefill off,
                                   skipped where vLLM's MistralReasoningParser already splits it

`plan` and `apply` only read and write text (ast, difflib, py_compile): they never import vLLM,
transformers or torch. On a Jetson `docker build` never has the nvidia runtime, and without its
libcuda.so.1 `import torch` (so vLLM) fails (dusty-nv/jetson-containers #1397). Whether a
patch is needed is read from the code's shape, never from a version string (these images carry
versions like `0.19.1.dev3+g1234abc` and `0.19.0rc2`, which `~=0.19.0` rejects under packaging
24.x: PEP 440 leaves pre- and dev releases out).
`check` and `render` import the patched code: build-image.sh runs them in
`docker run --runtime nvidia` of the built image before tagging it.

    chatfix.py plan   --think-prefill 1|0                 text only; last stdout line = label
    chatfix.py apply  --think-prefill 1|0 [--expect L]    text only: plan, patch, py_compile
    chatfix.py check  --think-prefill 1|0                 imports: render requests, probe the key
    chatfix.py render [--tokenizer DIR]                   imports: rendered requests as JSON
"""

import argparse
import ast
import asyncio
import difflib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATCHES = HERE / "patches"
THINK, SETTINGS = "[THINK]", "[MODEL_SETTINGS]"
# What vLLM 0.19.0 + transformers 4.57.3 raise for every chat request
# (tokenization_mistral_common.py, MistralCommonTokenizer.apply_chat_template).
KWARGS_ERROR = "Kwargs ['reasoning_effort'] are not supported by"


class PlanError(Exception):
    """A patch no longer fits the base: the message says what was found and what was expected."""


@dataclass
class Patch:
    name: str
    diff: str  # in patches/; its +++ line names the file, relative to the site-packages dir
    why: str
    # (text of the target file, its path relative to site-packages) -> None when the patch is
    # needed, else why it is not. Reads the code's shape only; whether the hunks fit is checked
    # separately (fit()).
    not_needed: Callable[[str, str], str | None]
    # A step with no diff (a plugin shipped beside this file): the file its rule reads.
    reads: str = ""
    # The same fix for later shapes of the code, tried after `diff` (its file moved, or the lines
    # around the change did); each is chosen only where its own hunks fit.
    more: tuple[str, ...] = ()


def say(message: str) -> None:
    print(f"[chatfix] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ versions and package paths
# Versions are read from dist-info metadata (no import) and only ever reported, never compared.

def version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def site_root(package: str) -> Path:
    """The directory holding a top-level package, found through this interpreter without
    importing it (find_spec of a top-level name runs no package code)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PlanError(f"package {package} not found by {sys.executable}")
    return Path(next(iter(spec.submodule_search_locations))).parent


def source_of(relpath: str) -> tuple[Path, str]:
    path = site_root(relpath.split("/")[0]) / relpath
    if not path.is_file():
        raise PlanError(f"{relpath}: not in {path.parent} (expected the file the patch changes)")
    return path, path.read_text()


# ------------------------------------------------------------------ strict unified-diff applier

def read_diff(path: Path) -> tuple[str, list[tuple[list[str], list[str]]]]:
    """(target path relative to site root, [(old lines, new lines) per hunk])."""
    target, hunks = None, []
    for line in path.read_text().splitlines():
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].removeprefix("b/")
        elif line.startswith("--- ") or (not hunks and not line.startswith("@@")):
            continue  # header and the comment above it
        elif line.startswith("@@"):
            hunks.append(([], []))
        else:
            tag, body = line[:1], line[1:]
            old, new = hunks[-1]
            if tag in (" ", ""):
                old.append(body)
                new.append(body)
            elif tag == "-":
                old.append(body)
            elif tag == "+":
                new.append(body)
    if target is None or not hunks:
        raise PlanError(f"{path.name}: not a unified diff")
    return target, hunks


def find_block(lines: list[str], block: list[str]) -> list[int]:
    size = len(block)
    return [i for i in range(len(lines) - size + 1) if lines[i:i + size] == block]


def closest(lines: list[str], block: list[str]) -> str:
    """The stretch of the file most like the expected block, to show what is there instead."""
    size, best, best_at = len(block), -1.0, 0
    want = "\n".join(block)
    for i in range(max(1, len(lines) - size + 1)):
        ratio = difflib.SequenceMatcher(None, want, "\n".join(lines[i:i + size])).quick_ratio()
        if ratio > best:
            best, best_at = ratio, i
    return "\n".join(f"    {best_at + 1 + n:5d}| {line}"
                     for n, line in enumerate(lines[best_at:best_at + size]))


def diffs_of(patch: Patch) -> tuple[str, ...]:
    return (patch.diff, *patch.more) if patch.diff else ()


def exists(relpath: str) -> bool:
    try:
        source_of(relpath)
    except PlanError:
        return False
    return True


def target_of(patch: Patch) -> str:
    """The file the patch changes (or its rule reads) in this base: the first of its diffs' files
    the base has; the first diff's when it has none (source_of then says it is missing)."""
    targets = [read_diff(PATCHES / diff)[0] for diff in diffs_of(patch)] or [patch.reads]
    return next((relpath for relpath in targets if exists(relpath)), targets[0])


def target_of_first(patch: Patch) -> str:
    return read_diff(PATCHES / patch.diff)[0] if patch.diff else patch.reads


def shapes(patch: Patch, relpath: str | None) -> list[tuple[str, list]]:
    """[(diff, hunks)] of the patch's diffs that change `relpath` (all of them when None)."""
    found = [(diff, *read_diff(PATCHES / diff)) for diff in diffs_of(patch)]
    return [(diff, hunks) for diff, target, hunks in found if relpath in (None, target)]


def carries(patch: Patch, text: str, relpath: str | None = None) -> bool:
    """The text already carries the patch (one of its diffs): every new block there once, no old
    block left."""
    lines = text.splitlines()  # a plugin (no diff) has no shapes: never carried
    return any(all(len(find_block(lines, new)) == 1 for _, new in hunks) and not any(
        find_block(lines, old) for old, _ in hunks) for _, hunks in shapes(patch, relpath))


def apply_hunks(patch: Patch, relpath: str, hunks: list, lines: list[str]) -> list[str]:
    """The lines with each hunk applied in turn, its old lines found exactly once in the lines as
    the hunks before it left them; PlanError at the first that is not."""
    lines = list(lines)
    package = relpath.split("/")[0]
    for n, (old, new) in enumerate(hunks, 1):
        found = find_block(lines, old)
        if len(found) != 1:
            lines_at = [i + 1 for i in found]
            where = "nowhere" if not found else f"{len(found)} times (lines {lines_at})"
            expected = "\n".join(f"         | {line}" for line in old)
            raise PlanError(
                f"{patch.name}: {relpath} ({package} {version_of(package)}) no longer "
                f"has the code this patch changes.\n  hunk {n} expected once:\n{expected}\n"
                f"  found it {where}; closest code in the file:\n{closest(lines, old)}")
        at = found[0]
        lines[at:at + len(old)] = new
    return lines


def fit(patch: Patch, text: str, relpath: str | None = None) -> str | None:
    """The text with the hunks of the patch's first diff (of those for `relpath`) that fits
    applied, each hunk's old lines found exactly once; None when the text already carries the
    patch. When none fits: PlanError with the first diff's misfit (and the other diffs tried)."""
    if carries(patch, text, relpath):
        return None
    tried = shapes(patch, relpath)
    if not tried:
        raise PlanError(f"{patch.name}: no diff of this patch changes {relpath}")
    first = None
    for diff, hunks in tried:
        try:
            lines = apply_hunks(patch, read_diff(PATCHES / diff)[0], hunks, text.splitlines())
        except PlanError as error:
            first = first or error
            continue
        return "\n".join(lines) + "\n"
    others = ", ".join(diff for diff, _ in tried[1:])
    raise PlanError(f"{first}\n  (nor do the hunks of {others} fit)" if others else str(first))


def patched_texts(steps) -> dict[Path, str]:
    """Every file the planned patches change, as they leave it (in order: think-prefill's hunk
    must fit the text that vLLM's fix leaves). Nothing is written here."""
    texts: dict[Path, str] = {}
    for patch, action, _ in steps:
        if action != "apply" or not patch.diff:
            continue
        relpath = target_of(patch)
        path, text = source_of(relpath)
        text = texts.get(path, text)
        texts[path] = fit(patch, text, relpath) or text
    return texts


# ------------------------------------------------------------------ does the base need a patch?
# Each rule reads the target file's syntax tree (ast), never imports it, never a version string.

VLLM_TOKENIZER = "vllm/tokenizers/mistral.py"
TRANSFORMERS_TOKENIZER = "transformers/tokenization_mistral_common.py"
AUTH_0_19 = "vllm/entrypoints/openai/server_utils.py"
CHAT_SERVING = "vllm/entrypoints/openai/chat_completion/serving.py"
STREAM_PROCESSOR = "vllm/entrypoints/openai/chat_completion/stream_processor.py"  # 0.33.0
MISTRAL_REASONING = "vllm/reasoning/mistral_reasoning_parser.py"
MISTRAL_ENGINE = "vllm/parser/mistral.py"  # from 0.27.1 the engine behind MISTRAL_REASONING
MISTRAL_TOOLS = "vllm/tool_parsers/mistral_tool_parser.py"


def parse(relpath: str, text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as error:
        raise PlanError(f"{relpath}: not valid Python ({error})") from None


def method(tree: ast.Module, classes: tuple[str, ...], name: str, relpath: str):
    """(class name, the FunctionDef of `name`) of the first class in `classes` defined there."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    return node.name, item
    raise PlanError(f"{relpath}: expected a method {name} in class {' or '.join(classes)}; "
                    f"found none")


def guarded_by(function: ast.AST, wanted) -> list[tuple[ast.AST, list[ast.expr]]]:
    """[(node, tests of the `if`s around it)] for every node in `function` that `wanted` picks."""
    found = []

    def walk(node, tests):
        if wanted(node):
            found.append((node, tests))
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            inner = tests + [node.test] if isinstance(node, ast.If) and field in (
                "body", "orelse") else tests
            for child in children:
                if isinstance(child, ast.AST):
                    walk(child, inner)

    walk(function, [])
    return found


def mentions(expr: ast.expr, word: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == word
               or isinstance(n, ast.Constant) and n.value == word for n in ast.walk(expr))


def vllm_already_skips_unset_effort(text: str, relpath: str = VLLM_TOKENIZER) -> str | None:
    """vLLM 0.19.0 vllm/tokenizers/mistral.py L433-435: for v15 tokenizers
    `version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort")`, None included, under
    an `if` that tests only the version. Upstream later puts
    it under a test of reasoning_effort itself. Not needed when every such assignment is."""
    _, function = method(parse(relpath, text), ("MistralTokenizer",), "apply_chat_template",
                         relpath)
    sets = guarded_by(function, lambda n: isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
        and t.slice.value == "reasoning_effort" for t in n.targets))
    if sets and all(any(mentions(test, "reasoning_effort") for test in tests)
                    for _, tests in sets):
        return "vLLM already passes reasoning_effort on only when the request sets it"
    return None  # the 0.19.0 shape, or code this patch does not know: fit() says which


def transformers_takes_what_vllm_passes(transformers_text: str) -> str | None:
    """The other half of the pair: vLLM 0.26.0 vllm/tokenizers/mistral.py L426-428 still passes
    `reasoning_effort=kwargs.get("reasoning_effort")`, None included, but transformers 5.x's
    MistralCommonBackend.apply_chat_template has a `reasoning_effort=None` parameter
    (tokenization_mistral_common.py L1050 in 5.20.2), so the keyword, None or not, is no error:
    the 400 needs both halves."""
    takes = transformers_already_takes_effort(transformers_text)
    return f"{takes} (default None): the None vLLM passes on is no error" if takes else None


def vllm_effort_not_needed(text: str, relpath: str = VLLM_TOKENIZER) -> str | None:
    """vLLM's own fix (vllm_already_skips_unset_effort), or a transformers that takes what vLLM
    passes (read from the installed transformers' source, by ast as well)."""
    if (reason := vllm_already_skips_unset_effort(text, relpath)) is not None:
        return reason
    return transformers_takes_what_vllm_passes(source_of(TRANSFORMERS_TOKENIZER)[1])


def transformers_already_takes_effort(text: str, relpath: str = TRANSFORMERS_TOKENIZER) -> str | None:
    """transformers 4.57.3 tokenization_mistral_common.py L1368-1380: apply_chat_template has no
    reasoning_effort parameter and refuses extra kwargs; 5.x's MistralCommonBackend takes it
    (huggingface/transformers PR #44656)."""
    cls, function = method(parse(relpath, text), ("MistralCommonBackend", "MistralCommonTokenizer"),
                           "apply_chat_template", relpath)
    params = function.args
    names = [a.arg for a in params.posonlyargs + params.args + params.kwonlyargs]
    if "reasoning_effort" in names:
        return f"transformers {version_of('transformers')} {cls}.apply_chat_template already " \
               f"takes reasoning_effort"
    return None


def base_guards_every_route(text: str, relpath: str = AUTH_0_19) -> str | None:
    """vLLM 0.19.0 entrypoints/openai/server_utils.py L80: AuthenticationMiddleware.__call__
    answers 401 only `if url_path.startswith("/v1") and not self.verify_token(headers)`
    (vllm #58144). Not needed when no test around the 401 looks at
    a path prefix (upstream's deny-by-default, PR #58028); `check` then proves it by probing.
    vLLM 0.26.0 moved it to entrypoints/serve/utils/server_utils.py (L90:
    `url_path.startswith(GUARDED_PREFIX)`, GUARDED_PREFIX = ("/v1", "/v2", "/inference")), and
    0.33.0 to entrypoints/serve/middleware/authenticate.py (L59, "/cohere" added to the prefixes
    at L11): the same shape, still needed."""
    _, function = method(parse(relpath, text), ("AuthenticationMiddleware",), "__call__",
                         relpath)
    denials = guarded_by(function, lambda n: isinstance(n, ast.keyword) and n.arg == "status_code"
                         and isinstance(n.value, ast.Constant) and n.value.value == 401)
    prefix = any(isinstance(n, ast.Attribute) and n.attr == "startswith"
                 for _, tests in denials for test in tests for n in ast.walk(test))
    if denials and not prefix:
        return "vLLM's AuthenticationMiddleware tests no path prefix before its 401"
    return None


def stream_gate_already_ends_without_think(text: str, relpath: str = CHAT_SERVING) -> str | None:
    """vLLM 0.19.0 entrypoints/openai/chat_completion/serving.py L936: with tools ("auto") and a
    reasoning parser, the stream hands deltas to the tool parser only after
    `if reasoning_parser.is_reasoning_end(output_token_ids):` (the `if` whose body calls
    extract_content_ids), which a Mistral answer without [THINK] never satisfies (upstream
    discussion in vllm PR #44596). Not needed when that gate tests more than that one call."""
    functions = stream_functions(parse(relpath, text), relpath)
    gates = [node for function in functions for node in ast.walk(function)
             if isinstance(node, ast.If) and any(
                 isinstance(n, ast.Attribute) and n.attr == "extract_content_ids"
                 for stmt in node.body for n in ast.walk(stmt))]
    bare = [g for g in gates if isinstance(g.test, ast.Call)
            and isinstance(g.test.func, ast.Attribute) and g.test.func.attr == "is_reasoning_end"]
    if gates and not bare:
        return "vLLM's streamed end-of-reasoning gate tests more than is_reasoning_end(delta)"
    return None  # the 0.19.0 shape, or code this patch does not know: fit() says which


def stream_functions(tree: ast.Module, relpath: str = CHAT_SERVING) -> list:
    """The stream generator, and the one it wraps where it only serializes another's chunks
    (vLLM 0.33.0 chat_completion/serving.py L472-507 wraps chat_completion_stream_generator_raw,
    L509)."""
    _, function = method(tree, ("OpenAIServingChat",), "chat_completion_stream_generator",
                         relpath)
    functions = [function]
    try:
        functions.append(method(tree, ("OpenAIServingChat",),
                                "chat_completion_stream_generator_raw", relpath)[1])
    except PlanError:
        pass
    return functions


def calls(function: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and (
        isinstance(n.func, ast.Attribute) and n.func.attr == name
        or isinstance(n.func, ast.Name) and n.func.id == name) for n in ast.walk(function))


def stream_goes_through_parse_delta(text: str, relpath: str = CHAT_SERVING) -> bool:
    """vLLM 0.26.0 chat_completion/serving.py L606-613: no end-of-reasoning gate left in the
    stream generator (no `if` whose body calls extract_content_ids); every delta goes to
    `parser.parse_delta(...)` (vllm/parser/abstract_parser.py), which decides the hand-over to
    the tool parser with the reasoning parser's is_reasoning_end_streaming. vLLM 0.33.0 makes
    the call one step further: the raw generator builds a ChatStreamProcessor per choice
    (serving.py L538-546) whose step calls parser.parse_delta (chat_completion/
    stream_processor.py L77), read from that file."""
    functions = stream_functions(parse(relpath, text), relpath)
    gates = [node for function in functions for node in ast.walk(function)
             if isinstance(node, ast.If) and any(
                 isinstance(n, ast.Attribute) and n.attr == "extract_content_ids"
                 for stmt in node.body for n in ast.walk(stmt))]
    if gates:
        return False
    if any(calls(function, "parse_delta") for function in functions):
        return True
    if any(calls(function, "ChatStreamProcessor") for function in functions):
        _, step = method(parse(STREAM_PROCESSOR, source_of(STREAM_PROCESSOR)[1]),
                         ("ChatStreamProcessor",), "step", STREAM_PROCESSOR)
        return calls(step, "parse_delta")
    return False


def mistral_stream_ends_without_think(text: str, relpath: str = MISTRAL_REASONING) -> str | None:
    """vLLM 0.26.0 reasoning/mistral_reasoning_parser.py L76-83: MistralReasoningParser.
    is_reasoning_end_streaming is true for [/THINK] in the delta or when
    `self.start_token_id not in input_ids` (the answer opened no [THINK]), so a plain answer's
    [TOOL_CALLS] reaches the tool parser. 0.19.0's has no such method (the generic one waits for
    [/THINK])."""
    tree = parse(relpath, text)
    found = [item for node in tree.body if isinstance(node, ast.ClassDef)
             and node.name == "MistralReasoningParser" for item in node.body
             if isinstance(item, ast.FunctionDef) and item.name == "is_reasoning_end_streaming"]
    ends = any(isinstance(n, ast.Compare) and any(isinstance(op, ast.NotIn) for op in n.ops)
               and isinstance(n.left, ast.Attribute) and n.left.attr == "start_token_id"
               for function in found for n in ast.walk(function))
    if ends:
        return ("vLLM streams every delta through parser.parse_delta and its "
                "MistralReasoningParser ends reasoning when the answer opened no [THINK]")
    if not found and any(isinstance(node, ast.ImportFrom) and any(
            alias.name == "MistralParserReasoningAdapter" for alias in node.names)
            for node in tree.body):
        return mistral_engine_call_ends_reasoning(source_of(MISTRAL_ENGINE)[1])
    return None


def mistral_engine_call_ends_reasoning(text: str, relpath: str = MISTRAL_ENGINE) -> str | None:
    """vLLM 0.33.0 parser/mistral.py L243-248: in mistral_config, [TOOL_CALLS] from CONTENT (an
    answer that opened no [THINK]) is `Transition(ParserState.TOOL_NAME, (EventType.
    REASONING_END, EventType.TOOL_CALL_START) if reasoning_encoding != "none" ...)`: the engine
    ends reasoning there, and parse_delta hands over to the tool parser when the engine says so
    (has_engine_confirmed_reasoning_end, parser/abstract_parser.py L899-902)."""
    for node in ast.walk(parse(relpath, text)):
        if not isinstance(node, ast.Dict):
            continue
        for key, value in zip(node.keys, node.values):
            if (isinstance(key, ast.Tuple) and len(key.elts) == 2
                    and isinstance(key.elts[0], ast.Attribute) and key.elts[0].attr == "CONTENT"
                    and isinstance(key.elts[1], ast.Constant)
                    and key.elts[1].value == "TOOL_CALLS"
                    and any(isinstance(n, ast.Attribute) and n.attr == "REASONING_END"
                            for n in ast.walk(value))):
                return ("vLLM streams every delta through parser.parse_delta and its Mistral "
                        "parser engine ends reasoning at a tool call outside [THINK]")
    return None


def stream_tools_not_needed(text: str, relpath: str = CHAT_SERVING) -> str | None:
    """The 0.19.0 gate fixed in place, or the 0.26.0 shape: no gate in serving, the parser's
    end-of-reasoning rule ends a reasoning the answer never opened (read from the installed
    mistral_reasoning_parser.py, by ast as well)."""
    if (reason := stream_gate_already_ends_without_think(text, relpath)) is not None:
        return reason
    if stream_goes_through_parse_delta(text, relpath):
        return mistral_stream_ends_without_think(source_of(MISTRAL_REASONING)[1])
    return None


def stream_tool_end_not_needed(text: str, relpath: str = CHAT_SERVING) -> str | None:
    """vLLM 0.19.0 chat_completion/serving.py L1143: at a stream's finish, with a tool call's
    arguments in the last delta, `tool_parser.streamed_args_for_tool[index]` is read, and
    MistralToolParser (tool_parsers/mistral_tool_parser.py) never appends to that list: an
    IndexError, the stream's last event a 500 (vllm issue #33916). Not needed where the stream
    reads it nowhere (0.26.0, 0.33.0: the parser's own parse_delta ends the call), or where
    MistralToolParser keeps it."""
    functions = stream_functions(parse(relpath, text), relpath)
    reads = [node for function in functions for node in ast.walk(function)
             if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
             and node.value.attr == "streamed_args_for_tool"]
    if not reads:
        return "vLLM's chat stream reads no tool parser's streamed_args_for_tool at its end"
    if exists(MISTRAL_TOOLS) and any(
            isinstance(node, ast.Attribute) and node.attr == "streamed_args_for_tool"
            for node in ast.walk(parse(MISTRAL_TOOLS, source_of(MISTRAL_TOOLS)[1]))):
        return "vLLM's MistralToolParser keeps streamed_args_for_tool"
    return None


def mistral_parser_splits_prefill(text: str, relpath: str = MISTRAL_REASONING) -> str | None:
    """vLLM 0.19.0 reasoning/mistral_reasoning_parser.py L144-153: MistralReasoningParser.
    extract_reasoning returns `None, prev_eot_token + post_eot_token` for an output with [/THINK]
    but no [THINK], i.e. a trace whose [THINK] the prompt opened is folded into content, [/THINK]
    dropped. Not needed when no `return None, <a + b>` is left there. From 0.27.1 the module is a
    shim re-exporting MistralParserReasoningAdapter (0.33.0 L4-6): then read parser/mistral.py
    (mistral_engine_splits_prefill). Also read at server start by thorfleet_reasoning.py, which
    then registers vLLM's own class under its name."""
    tree = parse(relpath, text)
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    if "MistralReasoningParser" not in classes and any(
            isinstance(node, ast.ImportFrom) and any(
                alias.name == "MistralParserReasoningAdapter" for alias in node.names)
            for node in tree.body):
        return mistral_engine_splits_prefill(source_of(MISTRAL_ENGINE)[1])
    _, function = method(tree, ("MistralReasoningParser",), "extract_reasoning", relpath)
    folds = [n for n in ast.walk(function) if isinstance(n, ast.Return)
             and isinstance(n.value, ast.Tuple) and len(n.value.elts) == 2
             and isinstance(n.value.elts[0], ast.Constant) and n.value.elts[0].value is None
             and isinstance(n.value.elts[1], ast.BinOp) and isinstance(n.value.elts[1].op, ast.Add)]
    if not folds:
        return "vLLM's MistralReasoningParser no longer folds a lone [/THINK] trace into content"
    return None


def mistral_engine_splits_prefill(text: str, relpath: str = MISTRAL_ENGINE) -> str | None:
    """vLLM 0.33.0 parser/mistral.py: MistralParser (L273) is a ParserEngine whose config starts
    every output in CONTENT (mistral_config, L227), where [/THINK] is absorbed with no event
    (L212-215), and it reads nothing from the prompt: the ParserEngine defaults leave the state
    alone (parser/engine/parser_engine.py L235-249). So a trace the prompt opened is content.
    Not needed when MistralParser itself reads the prompt on both paths: the streamed hook
    (adjust_initial_state_from_prompt, parser/abstract_parser.py L875-882) and the non-streamed
    one (set_prompt_token_ids, chat_completion/serving.py L996-997)."""
    tree = parse(relpath, text)
    found = [node for node in tree.body
             if isinstance(node, ast.ClassDef) and node.name == "MistralParser"]
    if not found:
        raise PlanError(f"{relpath}: expected a class MistralParser (the engine behind "
                        f"MistralParserReasoningAdapter); found none")
    defined = {item.name for item in found[0].body
               if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if {"adjust_initial_state_from_prompt", "set_prompt_token_ids"} <= defined:
        return "vLLM's MistralParser reads the prompt on both paths (streamed and not)"
    return None


def always_needed(text: str, relpath: str = "") -> str | None:
    return None


VLLM_FIX = Patch("vllm-reasoning-effort", "vllm-reasoning-effort.diff",
                 "vLLM passes reasoning_effort=None to transformers",
                 vllm_effort_not_needed)
TRANSFORMERS_FIX = Patch("transformers-reasoning-effort", "transformers-reasoning-effort.diff",
                         "transformers' MistralCommonTokenizer refuses reasoning_effort",
                         transformers_already_takes_effort)
# mistral_common 1.11.0 encodes reasoning_effort but never appends [THINK]; a build option.
THINK_PREFILL = Patch("think-prefill", "think-prefill.diff",
                      'reasoning_effort "high" opens the [THINK] block', always_needed)
API_KEY = Patch("api-key-every-route", "vllm-api-key-every-route.diff",
                "vLLM's --api-key guards only paths under /v1", base_guards_every_route,
                more=("vllm-api-key-every-route-serve.diff",
                      "vllm-api-key-every-route-middleware.diff"))
STREAM_TOOLS = Patch("streamed-tool-calls", "vllm-streamed-tool-calls.diff",
                     "vLLM streams a tool call as content while a reasoning parser is on",
                     stream_tools_not_needed)
STREAM_TOOL_END = Patch("streamed-tool-call-end", "vllm-streamed-tool-call-end.diff",
                        "vLLM ends a streamed Mistral tool call with an IndexError",
                        stream_tool_end_not_needed)
# No diff: thorfleet_reasoning.py is copied into the image and named in the rendered config
# (reasoning_parser_plugin, reasoning_parser: thorfleet_mistral). With think-prefill off no
# prompt opens [THINK], so it is off (the plugin, still loaded, then only delegates).
REASONING_SPLIT = Patch("reasoning-split", "",
                        "vLLM's mistral reasoning parser cannot split a [THINK] the prompt opened",
                        mistral_parser_splits_prefill,
                        reads="vllm/reasoning/mistral_reasoning_parser.py")
PLUGIN = HERE / "thorfleet_reasoning.py"
PLUGIN_NAME = "thorfleet_mistral"
# In this order: think-prefill's hunk must fit the text vllm-reasoning-effort leaves.
TABLE = (VLLM_FIX, TRANSFORMERS_FIX, THINK_PREFILL, API_KEY, STREAM_TOOLS, STREAM_TOOL_END,
         REASONING_SPLIT)

# mistral_common must know ReasoningEffort and encode [MODEL_SETTINGS] (v15) for any of the chat
# patches to mean anything: mistral_common 1.11.0 protocol/instruct/request.py L36 and
# tokens/tokenizers/base.py L105. Read from its source.
MISTRAL_COMMON_NEEDS = (("mistral_common/protocol/instruct/request.py", "class ReasoningEffort("),
                        ("mistral_common/tokens/tokenizers/base.py", '"[MODEL_SETTINGS]"'))


def check_mistral_common() -> None:
    for relpath, needle in MISTRAL_COMMON_NEEDS:
        try:
            _, text = source_of(relpath)
        except PlanError:
            text = ""
        if needle not in text:
            raise PlanError(
                f"mistral_common {version_of('mistral_common')}: {relpath} lacks `{needle}`; "
                f"expected mistral_common >= 1.11.0's reasoning_effort support (ReasoningEffort, "
                f"[MODEL_SETTINGS] for v15 tokenizers)")


def make_tokenizer(dest: Path) -> Path:
    """The v15 test tokenizer, written by the same script the sim hub uses."""
    subprocess.run([sys.executable, str(HERE / "v15_test_tokenizer.py"), str(dest / "tekken.json")],
                   check=True, stdout=subprocess.DEVNULL)
    return dest


def plan(think_prefill: bool) -> list[tuple[Patch, str, str]]:
    """[(patch, "apply" | "skip" | "off", why)], or PlanError naming what does not fit.
    Text only: safe in a plain `docker run` or `docker build` on a Jetson."""
    check_mistral_common()
    found = {p: version_of(p) for p in ("vllm", "transformers", "mistral_common")}
    say("found " + ", ".join(f"{p} {v}" for p, v in found.items())
        + f" (python {sys.version.split()[0]})")
    steps = []
    for patch in TABLE:
        if patch in (THINK_PREFILL, REASONING_SPLIT) and not think_prefill:
            steps.append((patch, "off", "build option --think-prefill 0"))
            continue
        steps.append((patch, *decide(patch)))
    patched_texts(steps)  # shapes last: raises PlanError when a hunk does not fit
    return steps


def decide(patch: Patch) -> tuple[str, str]:
    """("skip" | "apply", why) for one patch, from the file the base has; whether an applied
    patch's hunks fit is patched_texts()'s (fit()'s) to say."""
    relpath = target_of(patch)
    _, text = source_of(relpath)
    if carries(patch, text, relpath):
        return "skip", "the base already carries this patch"
    if (reason := patch.not_needed(text, relpath)) is not None:
        return "skip", reason
    if relpath != (primary := target_of_first(patch)):
        return "apply", f"{patch.why} ({primary} moved: here {relpath})"
    return "apply", patch.why


def label(steps) -> str:
    words = {"apply": "applied", "skip": "skipped", "off": "off"}
    return ",".join(f"{patch.name}={words[action]}" for patch, action, _ in steps)


def show(steps) -> None:
    for patch, action, why in steps:
        say(f"{action:5s} {patch.name}: {why}")


# ------------------------------------------------------------------ rendering, as vLLM does it

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CASES = {
    "absent": {},
    "none": {"reasoning_effort": "none"},
    "high": {"reasoning_effort": "high"},
    "unknown": {"reasoning_effort": "extreme"},
    "tools": {"tools": [WEATHER_TOOL]},
    "tools-high": {"tools": [WEATHER_TOOL], "reasoning_effort": "high"},
}


def render_case(tokenizer, case: dict) -> dict:
    """One request through vLLM's MistralTokenizer.apply_chat_template with the keywords vLLM's
    chat preprocessing passes (add_generation_prompt, tools, reasoning_effort, ...)."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = case.get("tools")
    try:
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, continue_final_message=False,
            documents=None, chat_template=None, return_dict=False, tokenize=True,
            reasoning_effort=case.get("reasoning_effort"))
    except Exception as error:  # noqa: BLE001 - any of them is what vLLM turns into a 400
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}
    return {"ok": True, "text": tokenizer.decode(ids, skip_special_tokens=False)}


def render_all(tokenizer_dir: Path) -> dict:
    from vllm.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_pretrained(str(tokenizer_dir))
    return {name: render_case(tokenizer, case) for name, case in CASES.items()}


def check_chat(think_prefill: bool) -> None:
    """What the patched image must render; raises AssertionError with the rendering otherwise."""
    with tempfile.TemporaryDirectory() as tmp:
        results = render_all(make_tokenizer(Path(tmp)))
    for name, result in results.items():
        shown = result["text"][-100:] if result["ok"] else result["error"].splitlines()[0]
        say(f"render {name:10s} -> {shown}")
    for name in ("absent", "none", "high", "tools", "tools-high"):
        assert results[name]["ok"], f"{name}: {results[name]['error']}"
    high = results["high"]["text"]
    assert f'{SETTINGS}{{"reasoning_effort": "high"}}' in high, f"high lacks settings: {high}"
    for name in ("absent", "none"):
        assert THINK not in results[name]["text"], f"{name} opens [THINK]"
    if think_prefill:
        assert high.endswith(THINK) and high.count(THINK) == 1, f"high: {high}"
    assert "[AVAILABLE_TOOLS]" in results["tools"]["text"]
    assert not results["unknown"]["ok"], "an unknown reasoning_effort was accepted"


# ------------------------------------------------------------------ the API key, as vLLM checks it

KEY = "thorfleet-self-check-key"
# Routes vLLM 0.19.0 mounts for a generate model outside /v1 that must need the key (vllm #58144,
# PR #42064), one under /v1, and a path no router knows yet.
MUST_NEED_KEY = ("/invocations", "/inference/v1/generate", "/tokenize", "/detokenize",
                 "/v1/chat/completions", "/v1/models", "/some/future/route")
# Liveness: thorfleet's own health wait calls /health without the key.
MUST_BE_OPEN = ("/health",)


async def through_middleware(middleware_class, method: str, path: str, key: str | None) -> int:
    """The status vLLM's AuthenticationMiddleware gives one request (200 = passed to the app)."""
    statuses = []

    async def app(scope, receive, send):
        statuses.append(200)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    headers = [(b"host", b"localhost")]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": headers, "server": ("localhost", 8002)}
    await middleware_class(app, tokens=[KEY])(scope, receive, send)
    return statuses[0]


def check_api_key() -> None:
    """Every path but the allowlist answers 401 without the key and passes with it."""
    module = importlib.import_module(target_of(API_KEY).removesuffix(".py").replace("/", "."))
    middleware_class = module.AuthenticationMiddleware

    def status(method, path, key):
        return asyncio.run(through_middleware(middleware_class, method, path, key))

    for path in MUST_NEED_KEY:
        got = status("POST", path, None)
        assert got == 401, f"POST {path} without the key: {got}, expected 401"
        got = status("POST", path, "wrong")
        assert got == 401, f"POST {path} with a wrong key: {got}, expected 401"
        got = status("POST", path, KEY)
        assert got == 200, f"POST {path} with the key: {got}, expected it passed on"
    for path in MUST_BE_OPEN:
        got = status("GET", path, None)
        assert got == 200, f"GET {path} without the key: {got}, expected it passed on"
    say(f"api key: {', '.join(MUST_NEED_KEY)} need it; {', '.join(MUST_BE_OPEN)} open")


# ------------------------------------------------------------------ the reasoning split, as vLLM loads it

TRACE, ANSWER = "The user asks about Paris.", "It is sunny in Paris."


def split_by_plugin(tokenizer_dir: Path) -> dict:
    """The plugin loaded as `--reasoning-parser-plugin` loads it, looked up by the name the
    config gives, and called as chat_completion/serving.py calls it: is_reasoning_end on the
    prompt, then extract_reasoning (not streamed), or token by token as the base's serving
    streams (stream_deltas)."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tokenizers.mistral import MistralTokenizer

    ReasoningParserManager.import_reasoning_parser(str(PLUGIN))
    parser_class = ReasoningParserManager.get_reasoning_parser(PLUGIN_NAME)
    tokenizer = MistralTokenizer.from_pretrained(str(tokenizer_dir))
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           reasoning_effort="high")
    output = tokenizer.encode(TRACE, add_special_tokens=False) + [
        tokenizer.tokenizer.get_special_token("[/THINK]")] + tokenizer.encode(
        ANSWER, add_special_tokens=False)
    text = tokenizer.decode(output, skip_special_tokens=False)

    full = parser_class(tokenizer, chat_template_kwargs={})
    prompt_ended = full.is_reasoning_end(prompt)
    reasoning, content = full.extract_reasoning(text, request=None)

    parts = {"reasoning": "", "content": ""}
    for delta in stream_deltas(parser_class, tokenizer, prompt, output, messages):
        for key in parts:
            parts[key] += (getattr(delta, key, None) or "") if delta else ""
    return {"class": parser_class.__name__, "prompt_ends_with_think": prompt[-1:] == [
                tokenizer.tokenizer.get_special_token("[THINK]")],
            "prompt_is_reasoning_end": prompt_ended, "reasoning": reasoning, "content": content,
            "streamed": parts}


def stream_deltas(parser_class, tokenizer, prompt: list[int], output: list[int], messages):
    """The DeltaMessages of `output` streamed one token at a time, as the base's chat serving
    streams it. Where serving hands each delta to parser.parse_delta (vLLM 0.26.0
    chat_completion/serving.py L606-613), through the Parser it builds from the config's parsers
    (vllm.yaml.j2: tool_call_parser mistral, auto tools; serving.py L153-159): that Parser
    decides when reasoning ends (is_reasoning_end_streaming, parser/abstract_parser.py L846-851),
    not the reasoning parser alone. Else (0.19.0, no tools): is_reasoning_end on the prompt
    (serving.py L687), then extract_reasoning_streaming on every delta (L997)."""
    if stream_goes_through_parse_delta(source_of(CHAT_SERVING)[1]):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.parser import ParserManager

        parser = ParserManager.get_parser(tool_parser_name="mistral",
                                          reasoning_parser_name=PLUGIN_NAME,
                                          enable_auto_tools=True)(
            tokenizer, None, chat_template_kwargs={})
        request = ChatCompletionRequest(model="check", messages=messages, stream=True,
                                        reasoning_effort="high")
        previous_text = ""
        for n in range(len(output)):
            current_text = tokenizer.decode(output[:n + 1], skip_special_tokens=False)
            yield parser.parse_delta(current_text[len(previous_text):], output[n:n + 1],
                                     request, prompt_token_ids=prompt,
                                     finished=n == len(output) - 1)
            previous_text = current_text
        return
    streamed = parser_class(tokenizer, chat_template_kwargs={})
    streamed.is_reasoning_end(prompt)
    previous_text, previous_ids = "", []
    for n in range(len(output)):
        current_ids = output[:n + 1]
        current_text = tokenizer.decode(current_ids, skip_special_tokens=False)
        yield streamed.extract_reasoning_streaming(
            previous_text, current_text, current_text[len(previous_text):], previous_ids,
            current_ids, output[n:n + 1])
        previous_text, previous_ids = current_text, current_ids


def check_reasoning_split(think_prefill: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        split = split_by_plugin(make_tokenizer(Path(tmp)))
    say(f"reasoning split by {PLUGIN_NAME} ({split['class']}): {split['reasoning']!r} | "
        f"{split['content']!r}; streamed {split['streamed']['reasoning']!r} | "
        f"{split['streamed']['content']!r}")
    if not think_prefill:
        return  # no prompt opens [THINK]: the parser only delegates to vLLM's
    assert split["prompt_ends_with_think"], "the high prompt does not end with [THINK]"
    assert not split["prompt_is_reasoning_end"], "the prompt's open [THINK] reads as ended"
    assert (split["reasoning"], split["content"]) == (TRACE, ANSWER), split
    assert split["streamed"] == {"reasoning": TRACE, "content": ANSWER}, split["streamed"]


def check(think_prefill: bool) -> None:
    check_chat(think_prefill)
    check_api_key()
    check_reasoning_split(think_prefill)


# ------------------------------------------------------------------ commands

def cmd_plan(args) -> int:
    try:
        steps = plan(args.think_prefill == "1")
    except PlanError as error:
        say(f"FAILED: {error}")
        return 1
    show(steps)
    print(label(steps))
    return 0


def cmd_apply(args) -> int:
    think_prefill = args.think_prefill == "1"
    try:
        steps = plan(think_prefill)
    except PlanError as error:
        say(f"FAILED: {error}")
        return 1
    show(steps)
    if args.expect and label(steps) != args.expect:
        say(f"FAILED: planned {args.expect!r} outside the build, but found {label(steps)!r} here")
        return 1
    for path, text in patched_texts(steps).items():
        if text != path.read_text():
            path.write_text(text)
            # Compiling is not importing: a syntax error fails the build, nothing else runs.
            py_compile.compile(str(path), doraise=True)
            say(f"patched {path}")
    # The import and render self-check is `chatfix.py check`, run by build-image.sh in
    # `docker run --runtime nvidia` of the built image before it is tagged.
    print(label(steps))
    return 0


def cmd_check(args) -> int:
    try:
        check(args.think_prefill == "1")
    except AssertionError as error:
        say(f"FAILED self-check: {error}")
        return 1
    say("self-check passed: absent, none, high and tools render; unknown values are refused; "
        "the API key guards every route but the allowlist; the reasoning parser plugin loads"
        + (" and splits a prefilled [THINK]" if args.think_prefill == "1" else ""))
    return 0


def cmd_render(args) -> int:
    if args.tokenizer:
        results = render_all(Path(args.tokenizer))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = render_all(make_tokenizer(Path(tmp)))
    print(json.dumps(results))
    return 0


def main(argv=None) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "apply", "check"):
        one = sub.add_parser(name)
        one.add_argument("--think-prefill", choices=["0", "1"], default="1")
        if name == "apply":
            one.add_argument("--expect", default="", help="the label `plan` printed")
    sub.add_parser("render").add_argument("--tokenizer", help="dir holding tekken.json")
    args = parser.parse_args(argv)
    return {"plan": cmd_plan, "apply": cmd_apply, "check": cmd_check,
            "render": cmd_render}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
