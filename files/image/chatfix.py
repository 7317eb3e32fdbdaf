#!/usr/bin/env python3
"""Plan, apply and check thorfleet's chat-template patches inside a vLLM image.

Runs with whatever `python3` the image puts first on PATH, and finds the packages through that
interpreter (no hard-coded site-packages path). Each patch is a real unified diff in patches/;
it is applied here strictly: every hunk's old lines must occur exactly once in the target file,
wherever they are (line numbers are ignored), or nothing is written and the build stops with what
was expected and what was found. A patch the base no longer needs is skipped, and said so.

    chatfix.py plan   --think-prefill 1|0                 check only; last stdout line = label
    chatfix.py apply  --think-prefill 1|0 [--expect L]    plan, patch, then self-check
    chatfix.py check  --think-prefill 1|0                 render requests, assert the result
    chatfix.py render [--tokenizer DIR]                   print rendered requests as JSON
"""

import argparse
import difflib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import py_compile
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PATCHES = HERE / "patches"
THINK, SETTINGS = "[THINK]", "[MODEL_SETTINGS]"
# What vLLM 0.19.0 + transformers 4.57.3 raise for every chat request (FACTS.md).
KWARGS_ERROR = "Kwargs ['reasoning_effort'] are not supported by"


class PlanError(Exception):
    """A patch no longer fits the base: the message says what was found and what was expected."""


@dataclass
class Patch:
    name: str
    diff: str
    package: str  # the distribution whose code the diff changes
    written_for: str  # the versions whose code the diff was written against (a PEP 440 spec)
    why: str


VLLM_FIX = Patch("vllm-reasoning-effort", "vllm-reasoning-effort.diff", "vllm", "~=0.19.0",
                 "vLLM passes reasoning_effort on only when set and when transformers takes it")
TRANSFORMERS_FIX = Patch(
    "transformers-reasoning-effort", "transformers-reasoning-effort.diff", "transformers",
    "~=4.57.0", "transformers' MistralCommonTokenizer takes reasoning_effort (5.x's plumbing)")
THINK_PREFILL = Patch("think-prefill", "think-prefill.diff", "vllm", "~=0.19.0",
                      'reasoning_effort "high" opens the [THINK] block')
# mistral_common must know ReasoningEffort and encode [MODEL_SETTINGS] (v15) for any of this.
MISTRAL_COMMON_NEEDED = ">=1.11.0,<2"


def say(message: str) -> None:
    print(f"[chatfix] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ versions and package paths

def version_of(package: str) -> str:
    return importlib.metadata.version(package)


def check_version(package: str, spec: str, what: str) -> str:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    found = version_of(package)
    if Version(found) not in SpecifierSet(spec):
        raise PlanError(
            f"{what}: found {package} {found}, expected {package}{spec} (the code it was "
            f"written against). Re-check the patch against this base before widening the range.")
    return found


def site_root(package: str) -> Path:
    """The directory holding the importable package, found through this interpreter."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PlanError(f"package {package} not found by {sys.executable}")
    return Path(next(iter(spec.submodule_search_locations))).parent


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


def target_of(patch: Patch) -> Path:
    relpath, _ = read_diff(PATCHES / patch.diff)
    return site_root(relpath.split("/")[0]) / relpath


def fit(patch: Patch, text: str) -> str | None:
    """The text with every hunk applied, each hunk's old lines found exactly once; None when the
    text already carries the patch (every new block there, no old block left)."""
    relpath, hunks = read_diff(PATCHES / patch.diff)
    lines = text.splitlines()
    if all(len(find_block(lines, new)) == 1 for _, new in hunks) and not any(
            find_block(lines, old) for old, _ in hunks):
        return None
    for n, (old, new) in enumerate(hunks, 1):
        found = find_block(lines, old)
        if len(found) != 1:
            where = "nowhere" if not found else f"{len(found)} times (lines {[i + 1 for i in found]})"
            expected = "\n".join(f"         | {line}" for line in old)
            raise PlanError(
                f"{patch.name}: {relpath} ({patch.package} {version_of(patch.package)}) no longer "
                f"has the code this patch changes.\n  hunk {n} expected once:\n{expected}\n"
                f"  found it {where}; closest code in the file:\n{closest(lines, old)}")
        at = found[0]
        lines[at:at + len(old)] = new
    return "\n".join(lines) + "\n"


def patched_texts(steps) -> dict[Path, str]:
    """Every file the planned patches change, as they leave it (in order: think-prefill's hunk
    must fit the text that vLLM's fix leaves). Nothing is written here."""
    texts: dict[Path, str] = {}
    for patch, action, _ in steps:
        if action != "apply":
            continue
        path = target_of(patch)
        text = texts.get(path) or path.read_text()
        texts[path] = fit(patch, text) or text
    return texts


# ------------------------------------------------------------------ does the base need a patch?

def transformers_takes_reasoning_effort() -> tuple[bool, str]:
    module = __import__("transformers.tokenization_mistral_common", fromlist=["x"])
    cls = getattr(module, "MistralCommonBackend", None) or module.MistralCommonTokenizer
    takes = "reasoning_effort" in inspect.signature(cls.apply_chat_template).parameters
    return takes, f"{cls.__name__}.apply_chat_template"


def vllm_forwards_unset_reasoning_effort(tokenizer_dir: Path) -> bool:
    """Ask vLLM's own wrapper: render a request without reasoning_effort and see whether it hands
    transformers `reasoning_effort=None` (the 0.19.0 bug) or leaves it out (fixed upstream)."""
    from vllm.tokenizers.mistral import MistralTokenizer

    tokenizer = MistralTokenizer.from_pretrained(str(tokenizer_dir))
    seen: dict = {}

    class Seen(Exception):
        pass

    def spy(*args, **kwargs):
        seen.update(kwargs, called=True)
        raise Seen

    tokenizer.transformers_tokenizer.apply_chat_template = spy
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                      add_generation_prompt=True)
    except Seen:
        pass
    if not seen.get("called"):
        raise PlanError("vllm-reasoning-effort: vLLM's MistralTokenizer.apply_chat_template no "
                        "longer calls transformers' apply_chat_template; expected it to")
    return "reasoning_effort" in seen and seen["reasoning_effort"] is None


def make_tokenizer(dest: Path) -> Path:
    """The v15 test tokenizer, written by the same script the sim hub uses."""
    subprocess.run([sys.executable, str(HERE / "v15_test_tokenizer.py"), str(dest / "tekken.json")],
                   check=True, stdout=subprocess.DEVNULL)
    return dest


def plan(think_prefill: bool) -> list[tuple[Patch, str, str]]:
    """[(patch, "apply" | "skip" | "off", why)], or PlanError naming what does not fit."""
    check_version("mistral_common", MISTRAL_COMMON_NEEDED, "mistral_common")
    found = {p: version_of(p) for p in ("vllm", "transformers", "mistral_common")}
    say("found " + ", ".join(f"{p} {v}" for p, v in found.items()) + f" (python {sys.version.split()[0]})")
    steps = []

    with tempfile.TemporaryDirectory() as tmp:
        if vllm_forwards_unset_reasoning_effort(make_tokenizer(Path(tmp))):
            steps.append((VLLM_FIX, "apply", "vLLM passes reasoning_effort=None to transformers"))
        else:
            steps.append((VLLM_FIX, "skip", "vLLM already leaves an unset reasoning_effort out"))

    takes, where = transformers_takes_reasoning_effort()
    if takes:
        why = f"transformers {found['transformers']} {where} already takes reasoning_effort"
        steps.append((TRANSFORMERS_FIX, "skip", why))
    else:
        steps.append((TRANSFORMERS_FIX, "apply", f"{where} refuses reasoning_effort"))

    if think_prefill:
        steps.append((THINK_PREFILL, "apply", "build option --think-prefill 1"))
    else:
        steps.append((THINK_PREFILL, "off", "build option --think-prefill 0"))

    for patch, action, _ in steps:
        if action == "apply":
            check_version(patch.package, patch.written_for, patch.name)
    patched_texts(steps)  # shapes last: raises PlanError when a hunk does not fit
    return steps


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


def check(think_prefill: bool) -> None:
    """What the patched image must do; raises AssertionError with the rendering otherwise."""
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
            py_compile.compile(str(path), doraise=True)
            say(f"patched {path}")
    # A fresh interpreter imports the patched modules: a broken patch fails here, not a request.
    argv = [sys.executable, __file__, "check", "--think-prefill", args.think_prefill]
    if subprocess.run(argv, check=False).returncode != 0:
        say("FAILED: the patched image does not render chat requests as expected")
        return 1
    print(label(steps))
    return 0


def cmd_check(args) -> int:
    try:
        check(args.think_prefill == "1")
    except AssertionError as error:
        say(f"FAILED self-check: {error}")
        return 1
    say("self-check passed: absent, none, high and tools render; unknown values are refused")
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
