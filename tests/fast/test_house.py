"""The house rules a newcomer can rely on, read from the source (ast): thorfleet's modules import
downwards with no cycle, settings imports nothing above it, the operations never import the
report, and only layout.py spells the box's paths."""

import ast
import re

from tests.helpers import ROOT

PACKAGE = ROOT / "thorfleet"
# Modules that import nothing of thorfleet's: facts of the world, not logic, and the one module
# that touches pyinfra's run machinery (pyinfra_hooks), which host is what (roles), the laptop's
# one file writer (laptop), and the box's own package (common, readings, usage: shipped whole).
LEAVES = {"common", "laptop", "layout", "pyinfra_hooks", "readings", "recipe", "roles", "runstate",
          "rollout", "usage"}
# What the box-facing side (facts, operations) may import: never settings, schema or the report.
BOX_SIDE = {"facts": {"layout", "readings"},
            "operations": {"facts", "layout", "pyinfra_hooks", "roles", "rollout", "runstate",
                           "snapshot"},
            "snapshot": {"pyinfra_hooks", "runstate"}}


ROOMS = ("box", "cli", "doctor", "gateway", "run", "settings")  # thorfleet's rooms: a module in one is named alone


def _module(dotted: str) -> str:
    """thorfleet.settings.schema -> schema; thorfleet.operations.power -> operations (the operations
    are one module, all their files together); thorfleet.facts -> facts."""
    parts = dotted.split(".")[1:]
    return parts[1] if parts[0] in ROOMS and len(parts) > 1 else parts[0]


def imports():
    """{module: {thorfleet modules it imports, anywhere in its body}} for every module of the
    package, rooms included."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent.name in ROOMS:
            continue  # a room's docstring
        module = _module(".".join(("thorfleet", *path.relative_to(PACKAGE).with_suffix("").parts)))
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "thorfleet" or node.module.removeprefix("thorfleet.") in ROOMS:
                    found.update(_module(f"{node.module}.{alias.name}") for alias in node.names)
                elif node.module.startswith("thorfleet."):
                    found.add(_module(node.module))
            elif isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(f"{path.name}: use absolute imports (from thorfleet...)")
            elif isinstance(node, ast.Import):
                found.update(_module(a.name) for a in node.names
                             if a.name.startswith("thorfleet."))
        graph.setdefault(module, set()).update(found - {module})
    return graph


def test_the_package_is_its_rooms():
    """What a newcomer opens first: the rooms, the facts and operations tasks/ calls, the parsers
    shared with the box, and the command line's entry (docs/layout.md)."""
    top = {p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert top == {"__init__.py", "__main__.py", "facts", "plan.py", "operations", *ROOMS}


def test_settings_is_a_leaf():
    """The settings room (each setting declared, checked, parsed, rendered) imports nothing of
    thorfleet's outside itself: what crosses hosts, the gateway's config and the command line
    build on it, never the other way (the run's plan is thorfleet/plan.py)."""
    outside = {}
    for path in sorted((PACKAGE / "settings").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if module.startswith("thorfleet") and not module.startswith("thorfleet.settings"):
                outside.setdefault(path.name, []).append(module)
    assert outside == {}


def test_settings_reads_no_file_of_the_operators():
    """The settings room checks and renders what it is given: the files a host's data names on
    the laptop (the API key, the hub token, client keys, certificates, under ~) are read by the
    run's plan and run/laptop.py, which also refuse them when others could read them. Breaks
    with: a path of the operator's expanded or opened in settings/ (settings_for was there)."""
    reads = {}
    for path in sorted((PACKAGE / "settings").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("expanduser", "home"):
                reads.setdefault(path.name, []).append(node.attr)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "open":
                reads.setdefault(path.name, []).append("open")
    assert reads == {}


def test_every_import_points_down_with_no_cycle():
    graph = imports()
    order, placed = [], set()
    while len(placed) < len(graph):  # a layer at a time: modules whose imports are all placed
        layer = sorted(m for m, uses in graph.items() if m not in placed and uses <= placed)
        assert layer, f"import cycle among {sorted(set(graph) - placed)}: " + "; ".join(
            f"{m} -> {sorted(graph[m] - placed)}" for m in sorted(set(graph) - placed))
        order.append(layer)
        placed.update(layer)
    assert all(uses <= set(graph) for uses in graph.values())  # no import of a missing module


def test_the_leaves_import_nothing_of_thorfleet():
    graph = imports()
    assert {m: graph[m] for m in LEAVES} == {m: set() for m in LEAVES}


def test_the_box_side_does_not_import_settings_or_the_report():
    graph = imports()
    for module, allowed in BOX_SIDE.items():
        assert graph[module] <= allowed, f"{module} imports {sorted(graph[module] - allowed)}"


def test_each_concern_of_the_operations_shares_only_the_shell_helpers():
    for path in sorted((PACKAGE / "operations").glob("*.py")):
        own = {node.module for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and node.module
               and node.module.startswith("thorfleet.operations")}
        assert own <= {"thorfleet.operations.commands"}, f"{path.name} imports {sorted(own)}"


BOX_PATH = re.compile(r"/(opt|etc|var/lib|var/cache)/thorfleet\b|/run/thorfleet")


def test_only_layout_spells_the_boxs_paths():
    # thorfleet/box is the box's own code, run at those paths (its tests hold it to layout.py's)
    sources = [*(p for p in PACKAGE.rglob("*.py") if "box" not in p.relative_to(PACKAGE).parts),
               *(ROOT / "tasks").glob("*.py"), ROOT / "deploy.py", ROOT / "config.py"]
    spelled = {}
    for path in sources:
        found = sorted({match.group(0) for match in BOX_PATH.finditer(path.read_text())})
        if found and path.name != "layout.py":
            spelled[str(path.relative_to(ROOT))] = found
    assert spelled == {}


def test_the_templates_take_the_boxs_paths_from_the_layout():
    for template in (ROOT / "files").rglob("*.j2"):
        assert not BOX_PATH.search(template.read_text()), template
