"""thorfleet's touches of pyinfra (thorfleet/run/pyinfra_hooks.py) hold against the pinned pyinfra: every
name and signature it relies on is there, and the events, stages and plans it reads mean what it
expects, on a real pyinfra State (operations on @local: `true`, `false`, `echo`)."""

import ast
import importlib
import inspect
import io
import sys
from contextlib import redirect_stderr
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_state
from pyinfra.operations import files, server

from thorfleet.operations import power
from thorfleet.run import pyinfra_hooks

ROOT = Path(__file__).resolve().parents[2]


def found(path):
    """What pyinfra has at "module:qualified.name": its signature, or "property" / "attribute"."""
    module, qualified = path.split(":")
    if module.startswith("pyinfra_cli"):
        pyinfra_hooks._import_pyinfra_cli_quietly()
    owner = importlib.import_module(module)
    *parents, name = qualified.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    if inspect.isclass(owner):
        raw = inspect.getattr_static(owner, name, None)
        if isinstance(raw, property):
            return "property"
        if raw is None:
            return "attribute" if name in getattr(owner, "__annotations__", {}) else None
    elif not hasattr(owner, name):
        return None
    value = getattr(owner, name)
    if callable(value) and not inspect.isclass(value) and not isinstance(value, dict):
        return str(inspect.signature(value))
    return "attribute"


@pytest.mark.parametrize("path", sorted(pyinfra_hooks.EXPECTED))
def test_every_name_thorfleet_relies_on_is_in_the_pinned_pyinfra(path):
    assert found(path) == pyinfra_hooks.EXPECTED[path], (
        f"pyinfra changed {path}: thorfleet/run/pyinfra_hooks.py relies on it (see its docstring)")


def test_an_operations_own_parameters_are_read_through_operation():
    assert pyinfra_hooks.operation_parameters(files.put) == inspect.signature(files.put._inner)
    # and @reads keeps the generator (what a test or another operation calls)
    assert list(pyinfra_hooks.operation_parameters(power.clocks_locked).parameters) == []
    assert inspect.isgeneratorfunction(power.clocks_locked._inner)


def local_run(check_for_changes=True):
    """A real pyinfra State for @local, planned with one changing, one failing (ignored) and one
    unchanged operation, as deploy.py would plan them."""
    inventory = Inventory((["@local"], {}))
    state = State(inventory, Config(), check_for_changes=check_for_changes)
    pyinfra_hooks.watch(state)
    state.set_stage(StateStage.Connect)
    connect_all(state)
    state.set_stage(StateStage.Prepare)
    add_op(state, server.shell, name="Say yes", commands=["true"])
    add_op(state, server.shell, name="Say no", commands=["echo out; echo why >&2; false"],
           _ignore_errors=True)
    add_op(state, files.directory, name="Keep the folder", path=str(ROOT))
    return state, inventory.get_host("@local")


def test_the_plan_is_read_from_will_change_and_only_when_pyinfra_checked():
    state, local = local_run()
    assert not pyinfra_hooks.executing(state)
    assert pyinfra_hooks.planned_changes(state, local) == ["Say yes", "Say no"]
    state, local = local_run(check_for_changes=False)  # pyinfra -y: nothing planned, nothing known
    assert pyinfra_hooks.planned_changes(state, local) == []


def test_what_each_operation_did_comes_from_the_state_callbacks():
    state, local = local_run()
    assert not pyinfra_hooks.sent_commands(local)
    after = []
    pyinfra_hooks.after_last_operation(state, lambda s: after.append(s))
    state.set_stage(StateStage.Execute)
    with redirect_stderr(io.StringIO()):
        run_ops(state)
    assert pyinfra_hooks.executing(state)
    assert pyinfra_hooks.outcomes(state, local) == [
        pyinfra_hooks.Outcome("Say yes", True, False, ()),
        pyinfra_hooks.Outcome("Say no", False, True, ("out", "why")),
        pyinfra_hooks.Outcome("Keep the folder", False, False, ())]
    assert pyinfra_hooks.sent_commands(local)
    assert after == [state]  # once, after the last operation
    assert pyinfra_hooks.in_limit(state, local)
    assert pyinfra_hooks.active_hosts(state) == [local]
    assert pyinfra_hooks.failed_hosts(state) == set()


def test_a_run_nobody_watched_trusts_no_earlier_read():
    host = SimpleNamespace(name="thor-1", state=SimpleNamespace())
    assert pyinfra_hooks.sent_commands(host)


def test_config_checks_the_inventory_before_connecting_and_adds_the_run_handlers(monkeypatch):
    config_py = (ROOT / "config.py").read_text()
    # bad group data: refused with one line per problem, before any connection
    state = State()
    with ctx_state.use(state):  # as the CLI does before it reads config.py
        exec(compile(config_py, "config.py", "exec"), {"__name__": "config"})  # noqa: S102
        err = io.StringIO()
        with redirect_stderr(err), pytest.raises(SystemExit) as stopped:
            state.init(Inventory((["thor-1"], {})), Config())
    assert stopped.value.code == 2
    assert "refusing to run (no host was contacted)" in err.getvalue()
    assert "  - thor-1: " in err.getvalue()
    # good group data: the run goes on, with keepalives, the event recorder and the line for a
    # host it cannot connect to in place
    monkeypatch.setattr("thorfleet.plan.settings_for_run", lambda state: {})
    state = State()
    with ctx_state.use(state):
        exec(compile(config_py, "config.py", "exec"), {"__name__": "config"})  # noqa: S102
        state.init(Inventory((["thor-1"], {})), Config())
    kinds = {type(handler).__name__ for handler in state.callback_handlers}
    assert kinds == {"_Keepalive", "_Events", "_Unreachable"}
    assert state.thorfleet_events in state.callback_handlers


def test_every_new_ssh_connection_gets_the_hosts_keepalive():
    set_to = []
    transport = SimpleNamespace(set_keepalive=set_to.append)
    client = SimpleNamespace(get_transport=lambda: transport)
    for seconds in (30, 0, None):
        box = SimpleNamespace(data={"ssh_keepalive_interval_s": seconds},
                              connector=SimpleNamespace(client=client))
        pyinfra_hooks._Keepalive.host_connect(None, box)
    local = SimpleNamespace(data={"ssh_keepalive_interval_s": 30}, connector=SimpleNamespace())
    pyinfra_hooks._Keepalive.host_connect(None, local)  # not SSH: nothing to set
    assert set_to == [30]


def test_pin_loads_pyinfra_cli_without_gevents_monkey_patching(tmp_path):
    # run apart: this test process has imported pyinfra_cli already
    import subprocess

    (tmp_path / "inventory.py").write_text('thors = (["thor-1"], {"x": 1})\n')
    code = ("import select, sys; from thorfleet.run import pyinfra_hooks; "
            f"inv = pyinfra_hooks.load_cli_inventory({str(tmp_path / 'inventory.py')!r}, "
            f"{str(ROOT)!r}); "
            "print(inv.get_host('thor-1').data.x, hasattr(select, 'epoll'))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    assert done.stdout.split() == ["1", str(hasattr(__import__("select"), "epoll"))], done.stderr


# pyinfra's API as its docs teach it (Writing Operations, Writing Facts, Using Operations, Inventory
# & Data): what thorfleet may import from pyinfra anywhere. "*": any name of that module.
ALLOWED_IMPORTS = {
    "pyinfra": {"host", "inventory", "state", "config", "logger"},
    "pyinfra.api": {"deploy", "operation", "FactBase", "FunctionCommand", "StringCommand",
                    "FileUploadCommand"},
    "pyinfra.api.exceptions": {"PyinfraError"},
    "pyinfra.operations": "*",
    "pyinfra.facts.server": "*",
}
# ...and what of the context objects it may touch: the host's documented attributes, the
# logger's levels, config's upper-case settings.
ALLOWED_ATTRS = {
    "host": {"name", "data", "groups", "get_fact", "noop", "loop", "log_styled", "state",
             "run_shell_command", "connected"},
    "logger": {"error", "warning", "info", "debug"},
}
# pyinfra's run machinery and its undocumented parts, by the names thorfleet would reach them with
# on any object: each lives in pyinfra_hooks, with why.
INTERNALS = {"current_stage", "get_op_meta", "get_op_order", "get_op_data_for_host", "ops",
             "op_meta", "_maybe_is_change", "will_change", "operation_meta", "active_hosts",
             "failed_hosts", "_get_module", "_connect", "init", "callback_handlers",
             "add_callback_handler", "is_executing", "should_check_for_changes",
             "is_host_in_limit", "connect", "disconnect", "execute", "requires_command",
             "get_raw_value", "connector", "client", "print_input"}
# thorfleet/box is the box's, stdlib only (tests/fast/test_readings.py): no pyinfra to reach into
SOURCES = sorted([*(p for p in (ROOT / "thorfleet").rglob("*.py") if p.parent.name != "box"),
                  *(ROOT / "tasks").glob("*.py"), ROOT / "deploy.py", ROOT / "config.py"])


def touches(path):
    """Where a file reaches pyinfra other than through its documented API."""
    found, bound = [], {}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyinfra"):
            allowed = ALLOWED_IMPORTS.get(node.module, set())
            for alias in node.names:
                bound[alias.asname or alias.name] = alias.name
                if allowed != "*" and alias.name not in allowed:
                    found.append(f"{path.name}:{node.lineno}: from {node.module} import "
                                 f"{alias.name}")
        elif isinstance(node, ast.Import) and any(a.name.startswith("pyinfra") for a in node.names):
            found.append(f"{path.name}:{node.lineno}: import pyinfra...")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner == "pyinfra_hooks":
                continue
            if node.attr in INTERNALS:
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
            elif owner in bound and bound[owner] in ALLOWED_ATTRS and \
                    node.attr not in ALLOWED_ATTRS[bound[owner]]:
                found.append(f"{path.name}:{node.lineno}: {owner}.{node.attr}")
            elif owner in bound and bound[owner] == "config" and not node.attr.isupper():
                found.append(f"{path.name}:{node.lineno}: config.{node.attr}")
        elif isinstance(node, ast.FunctionDef) and node.name in INTERNALS:
            found.append(f"{path.name}:{node.lineno}: def {node.name} (overrides pyinfra's)")
    return found


def test_the_guard_reads_every_module_of_the_package():
    assert ROOT / "thorfleet" / "operations" / "verification.py" in SOURCES
    assert len([p for p in SOURCES if p.parent.name == "operations"]) >= 10


def test_only_pyinfra_hooks_reaches_past_pyinfras_documented_api():
    found = [hit for path in SOURCES if path.name != "pyinfra_hooks.py" for hit in touches(path)]
    assert found == []


@pytest.mark.parametrize("line, why", [
    ("state.is_host_in_limit(host)", ".is_host_in_limit"),
    ("from pyinfra.api.state import State", "import State"),
    ("host.connector.client", ".connector"),
    ("host.current_op_hash", "host.current_op_hash"),
])
def test_the_guard_fails_on_an_internal_in_a_new_place(tmp_path, line, why):
    module = tmp_path / "new.py"
    module.write_text(f"from pyinfra import host, state\n\n\ndef f():\n    return {line}\n"
                      if not line.startswith("from") else line + "\n")
    assert any(why in hit for hit in touches(module)), touches(module)


def test_the_report_rows_and_table_are_pure():
    for name in ("report_rows", "report_table"):
        tree = ast.parse((ROOT / "thorfleet" / "run" / f"{name}.py").read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not {m for m in imported if m.split(".")[0] in ("pyinfra", "thorfleet")}, name
