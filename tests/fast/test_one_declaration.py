"""Each setting's default is declared once, in thorfleet/settings/schema.py, and nowhere else a
value could be declared:

- a program thorfleet installs (files/thor/bin/) has no default of its own for any option thorfleet
  gives it, in a unit it renders or a command it sends: the value is the settings', and a second
  default is one that drifts (the watchdog's --start-timeout was 1200 against
  watchdog_start_timeout_s's 1800);
- group_data/ (and inventory/group_data/) declares no setting's default again: group_data/all.py
  takes them from the schema.

Read from the code itself (Python's ast, the unit files' own lines), not from a list kept beside
it. The edits that break it: `default=1200` on the watchdog's --start-timeout; a literal
`watchdog_interval_s = 15` in group_data/all.py.
"""

import ast
import re
from pathlib import Path

from tests.helpers import BINS, ROOT
from thorfleet.settings import layout
from thorfleet.settings.schema import FIELDS

# The programs thorfleet installs that read options with argparse (Python, by their first line).
PROGRAMS = {p.name: p for folder in BINS for p in folder.iterdir()
            if p.is_file() and p.read_bytes()[:40].startswith(b"#!/usr/bin/env python3")}
# layout's constants naming one of them: {constant's name: program}
NAMED = {name: Path(value).name for name, value in vars(layout).items()
         if isinstance(value, str) and Path(value).name in PROGRAMS}
FLAGS = {"store_true", "store_false", "append", "count", "help", "version"}


def own_defaults(program) -> dict[str, int]:
    """{--option: line} of each option `program` gives a default of its own; an option named by
    a variable (a loop's) counts as one unless it is required (this reader cannot name it)."""
    found = {}
    for node in ast.walk(ast.parse(PROGRAMS[program].read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args):
            continue
        words = {k.arg: k.value for k in node.keywords}
        if not isinstance(node.args[0], ast.Constant):
            required = words.get("required")
            if not (isinstance(required, ast.Constant) and required.value is True):
                found[f"{ast.unparse(node.args[0])} (a variable)"] = node.lineno
            continue
        if not str(node.args[0].value).startswith("--"):
            continue
        action = words.get("action")
        if isinstance(action, ast.Constant) and action.value in FLAGS:
            continue
        default = words.get("default")
        if default is not None and not (isinstance(default, ast.Constant) and default.value is None):
            found[node.args[0].value] = node.lineno
    return found


def _program_of(node, named_locals) -> str | None:
    """The program an expression names: a layout constant, a local bound to one, or a string
    (an f-string's part included) ending in its name."""
    for part in ast.walk(node):
        if isinstance(part, ast.Name) and (part.id in NAMED or part.id in named_locals):
            return NAMED.get(part.id) or named_locals[part.id]
        if isinstance(part, ast.Attribute) and part.attr in NAMED:
            return NAMED[part.attr]
        if isinstance(part, ast.Constant) and isinstance(part.value, str):
            for program in PROGRAMS:
                if part.value.endswith(f"/{program}"):
                    return program
    return None


def _options(items) -> set[str]:
    return {i.value for i in items
            if isinstance(i, ast.Constant) and isinstance(i.value, str) and i.value.startswith("--")}


def passed_in_python() -> dict[str, set[str]]:
    """{program: options} thorfleet's Python puts on a command line beside the program's path
    (sh(...), a tuple of words), or passes to a fact class's `tool_command` whose `tool` it is."""
    passed: dict[str, set[str]] = {}
    sources = [*(ROOT / "thorfleet").rglob("*.py"), *(ROOT / "tasks").glob("*.py"),
               ROOT / "deploy.py"]
    for source in sources:
        tree = ast.parse(source.read_text())
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.Module, ast.FunctionDef, ast.ClassDef)):
                continue
            named_locals = {}
            for node in ast.walk(scope):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                        node.targets[0], ast.Name):
                    program = _program_of(node.value, {})
                    if program:
                        named_locals[node.targets[0].id] = program
            for node in ast.walk(scope):
                items = node.args if isinstance(node, ast.Call) else getattr(node, "elts", None)
                if not items or not isinstance(node, (ast.Call, ast.Tuple, ast.List)):
                    continue
                program = next((p for p in (_program_of(i, named_locals) for i in items) if p),
                               None)
                if program is None and isinstance(node, ast.Call) and isinstance(
                        node.func, ast.Attribute) and node.func.attr == "tool_command":
                    program = named_locals.get("tool")
                if program:
                    passed.setdefault(program, set()).update(_options(items))
    return passed


def passed_in_units() -> dict[str, set[str]]:
    """{program: options} on the lines of the units and configs thorfleet ships (files/) that run
    a program: `{{ layout.NAME }}` or its path, then its words."""
    passed: dict[str, set[str]] = {}
    for path in (ROOT / "files").rglob("*"):
        if not path.is_file() or path.parent in BINS or path.suffix in (".png", ".py"):
            continue
        for line in path.read_text(errors="replace").splitlines():
            for name, program in NAMED.items():
                at = max(line.find(f"layout.{name} "), line.find(f"/{program} "))
                if at >= 0:
                    passed.setdefault(program, set()).update(
                        re.findall(r"(?<!\S)(--[a-z][a-z0-9-]*)", line[at:]))
    return passed


def test_the_finders_find_what_thorfleet_passes():
    """The finders see the commands they must: the watchdog's unit, thorfleet-serve's proof,
    the weights' fetch, the run lock's take (else the test below holds nothing)."""
    units, python = passed_in_units(), passed_in_python()
    assert {"--start-timeout", "--interval", "--exporter-port"} <= units["thorfleet-watchdog"]
    assert {"--listen"} <= units["thorfleet-door-usage"]
    assert {"--timeout", "--service", "--port"} <= python["thorfleet-serve"]
    assert {"--progress-every", "--revision"} <= python["thorfleet-weights"]
    assert {"--wait", "--holder"} <= python["thorfleet-run-lock"]
    assert {"--port"} <= python["thorfleet-watchdog"]  # doctor's `metrics`


def test_no_program_has_a_default_for_an_option_thorfleet_gives_it():
    given = passed_in_units()
    for program, options in passed_in_python().items():
        given.setdefault(program, set()).update(options)
    seconds = [f"{PROGRAMS[program].relative_to(ROOT)}:{line}: {option} has a default of its own, but thorfleet "
               "always gives it (from the settings): drop the default"
               for program, options in sorted(given.items())
               for option, line in sorted(own_defaults(program).items())
               if option in options or option.endswith("(a variable)")]
    assert seconds == []


def group_data_literals() -> dict[str, tuple[str, object]]:
    """{setting: (file:line, value)} of each literal a group_data file assigns a setting."""
    found = {}
    for path in sorted([*(ROOT / "group_data").glob("*.py"),
                        *(ROOT / "inventory" / "group_data").glob("*.py")]):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                    node.targets[0], ast.Name) and node.targets[0].id in FIELDS:
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    continue  # computed (an environment variable): not a declared default
                found[node.targets[0].id] = (f"{path.relative_to(ROOT)}:{node.lineno}", value)
    return found


def test_group_data_declares_no_default_again():
    again = [f"{where}: {key} = {value!r} is the schema's default already (declared once, in "
             "thorfleet/settings/schema.py): set here only what differs"
             for key, (where, value) in group_data_literals().items()
             if value == FIELDS[key].default]
    assert again == []
