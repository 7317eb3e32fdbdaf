"""One round trip for a converged run (thorfleet/run/snapshot.py): the reads the operations declare run
as one shell command, here a real local shell on temp folders, and answer the operations until the
host has been sent a command in the run; then each read is a fact command of its own again."""

import subprocess
from types import SimpleNamespace

import pytest
from pyinfra.api import operation
from pyinfra.api.state import StateStage
from pyinfra.facts.server import Which

from thorfleet import facts
from thorfleet.run import pyinfra_hooks, snapshot
from thorfleet.run.runstate import run_state


def on_this_machine(queries):
    """Lines the one command prints when run by a real shell here."""
    done = subprocess.run(["sh", "-c", snapshot.script(queries)], capture_output=True, text=True,
                          check=True)
    return done.stdout.splitlines()


def test_one_command_answers_every_fact_as_its_own_command_would(tmp_path):
    (tmp_path / "ctx" / "patches").mkdir(parents=True)
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM base\n")
    (tmp_path / "ctx" / "patches" / "a.diff").write_text("no newline at the end")
    (tmp_path / "ctx" / "patches" / "a.diff").chmod(0o755)
    queries = [(facts.system.FileState, {"path": str(tmp_path / "ctx" / "Dockerfile")}),
               (facts.system.PathState, {"path": str(tmp_path / "ctx")}),
               (facts.system.PathState, {"path": str(tmp_path / "nothing")}),
               (facts.system.TreeState, {"path": str(tmp_path / "ctx")}),
               (Which, {"command": "sh"})]
    values = snapshot.parse(queries, on_this_machine(queries))
    for fact, kwargs in queries:
        alone = subprocess.run(["sh", "-c", snapshot._command(fact, kwargs)], capture_output=True,
                               text=True, check=True).stdout.splitlines()
        expected = fact().process(alone) if alone else fact().default()
        assert values[snapshot.key_of(fact, kwargs)] == expected, fact
    tree = values[snapshot.key_of(facts.system.TreeState, {"path": str(tmp_path / "ctx")})]
    assert tree["patches/a.diff"]["mode"] == "755" and set(tree) == {"Dockerfile",
                                                                       "patches/a.diff"}


# What is absent on this machine as on a bare box: each prints nothing, so each is its default.
ABSENT = [(facts.box.L4TRelease, {}), (facts.box.RebootMarker, {}),
          (facts.system.UnitEnabled, {"unit": "thorfleet-no-such.service"}),
          (facts.system.PasswdEntry, {"user": "thorfleet-no-such-user"}),
          (facts.serving.WeightsState, {"folder": "/nowhere", "revision": "a" * 40}),
          (facts.serving.ServerState, {"service": "thorfleet-vllm", "port": 8002}),
          (facts.serving.Leftovers, {"models": "/nowhere", "contexts": "/nowhere", "image_name": "x",
                             "keep_context": "c", "keep_dirs": [], "keep_images": [],
                             "units": []})]


def test_what_is_absent_prints_nothing_and_reads_as_the_facts_default():
    for fact, kwargs in ABSENT:
        alone = subprocess.run(["sh", "-c", snapshot._command(fact, kwargs)], capture_output=True,
                               text=True, check=True).stdout
        assert alone == "", (fact, alone)
    values = snapshot.parse(ABSENT, on_this_machine(ABSENT))
    assert values == {snapshot.key_of(fact, kwargs): fact().default() for fact, kwargs in ABSENT}


class Exits(facts.system.FileState):
    """A fact whose command fails on the box."""

    def command(self, path):
        return f"echo half an answer; exit 3 # {path}"


class NotInstalled(facts.power.PowerMode):
    requires_command = "thorfleet-no-such-command"


class InstalledWithAComment(facts.power.PowerMode):
    command = "echo 2 # the mode"
    requires_command = "sh"


def test_a_read_that_fails_on_the_box_is_left_to_be_read_alone(tmp_path):
    (tmp_path / "f").write_text("x")
    queries = [(Exits, {"path": "/x"}), (NotInstalled, {}),
               (facts.system.FileState, {"path": str(tmp_path / "f")}), (InstalledWithAComment, {})]
    values = snapshot.parse(queries, on_this_machine(queries))
    assert list(values) == [snapshot.key_of(facts.system.FileState, {"path": str(tmp_path / "f")}),
                            snapshot.key_of(InstalledWithAComment, {})]
    assert values[snapshot.key_of(InstalledWithAComment, {})] == 2


class Meta:
    def __init__(self, executed):
        self.executed = executed

    def is_complete(self):
        return True


class Box:
    """A host whose one-round-trip command runs here and whose own fact commands are counted."""

    def __init__(self, state):
        self.name, self.state, self.connected = "thor-1", state, True
        self.round_trips, self.alone = 0, []

    def run_shell_command(self, command, **kwargs):
        self.round_trips += 1
        done = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True,
                              text=True, check=False)
        return done.returncode == 0, SimpleNamespace(stdout_lines=done.stdout.splitlines())

    def get_fact(self, fact, **kwargs):
        self.alone.append((fact, kwargs))
        return "read alone"


def finished(target, op_hash):
    """pyinfra's event for an operation that ran on `target` (what snapshot learns it from)."""
    pyinfra_hooks.watch(target.state).operation_host_success(target.state, target, op_hash)


def planned_box(tmp_path):
    state = SimpleNamespace(current_stage=StateStage.Execute, ops={}, print_fact_output=False,
                            print_fact_input=False, add_callback_handler=lambda handler: None)
    state.get_op_data_for_host = lambda host, op_hash: state.ops[host][op_hash]
    pyinfra_hooks.watch(state)  # as config.py and report.install do for a run
    target = Box(state)
    state.ops[target] = {}
    paths = [str(tmp_path / name) for name in ("a", "b", "c")]
    for path in paths:
        (tmp_path / path).write_text(path)
    snapshot.plan(target, [(facts.system.FileState, {"path": p}) for p in paths])
    return target, paths


def test_the_reads_of_a_converged_host_take_one_round_trip(tmp_path):
    target, paths = planned_box(tmp_path)
    for path in paths:
        assert snapshot.read(facts.system.FileState, target, path=path)["mode"] == "644"
    assert (target.round_trips, target.alone) == (1, [])
    # a read no operation declared is read alone
    assert snapshot.read(facts.power.PowerMode, target) == "read alone"
    assert target.round_trips == 1


def test_with_batched_reads_off_every_read_is_its_own_fact_command(tmp_path, monkeypatch):
    # THORFLEET_BATCH_READS=0: pyinfra's way, one fact command per read, to measure the difference
    monkeypatch.setenv("THORFLEET_BATCH_READS", "0")
    target, paths = planned_box(tmp_path)
    for path in paths:
        assert snapshot.read(facts.system.FileState, target, path=path) == "read alone"
    assert target.round_trips == 0
    assert target.alone == [(facts.system.FileState, {"_sudo": True, "path": p}) for p in paths]


def test_a_read_with_pyinfras_own_arguments_is_never_in_the_one_command(tmp_path):
    # the one command runs as root: a read as the SSH user (`_sudo`: False) is a command of its own
    target, paths = planned_box(tmp_path)
    snapshot.plan(target, [(facts.box.SudoWorks, {"_sudo": False})])
    assert snapshot.read(facts.box.SudoWorks, target, _sudo=False) == "read alone"
    assert target.alone == [(facts.box.SudoWorks, {"_sudo": False})]
    assert snapshot.read(facts.system.FileState, target, path=paths[0])["mode"] == "644"
    assert target.round_trips == 1 and len(target.alone) == 1


def test_once_the_host_was_sent_a_command_every_read_is_fresh(tmp_path):
    target, paths = planned_box(tmp_path)
    snapshot.read(facts.system.FileState, target, path=paths[0])
    target.state.ops[target]["an earlier operation"] = SimpleNamespace(operation_meta=Meta(True))
    finished(target, "an earlier operation")
    assert snapshot.read(facts.system.FileState, target, path=paths[1]) == "read alone"


def test_an_operation_that_sent_nothing_keeps_the_answers(tmp_path):
    target, paths = planned_box(tmp_path)
    target.state.ops[target]["a no-op"] = SimpleNamespace(operation_meta=Meta(False))
    finished(target, "a no-op")
    snapshot.read(facts.system.FileState, target, path=paths[0])
    snapshot.read(facts.system.FileState, target, path=paths[1])
    assert (target.round_trips, target.alone) == (1, [])


def test_the_execution_reads_the_box_again_after_the_plan(tmp_path):
    target, paths = planned_box(tmp_path)
    target.state.current_stage = StateStage.Prepare
    snapshot.read(facts.system.FileState, target, path=paths[0])
    target.state.current_stage = StateStage.Execute
    snapshot.read(facts.system.FileState, target, path=paths[0])
    assert target.round_trips == 2


def test_declared_reads_are_planned_for_the_host_with_the_operations_own_arguments():
    state = SimpleNamespace()
    target = SimpleNamespace(name="thor-1", state=state)
    from pyinfra.context import ctx_host

    from thorfleet.operations import files

    with ctx_host.use(target):
        try:
            files.whole_file(name="x", path="/etc/x", src="/dev/null", _sudo=True)
        except Exception:  # noqa: BLE001, S110 - no pyinfra run here: only the declaration counts
            pass
    assert list(run_state(state).planned_reads["thor-1"].values()) == [
        (facts.system.FileState, {"path": "/etc/x"})]


@snapshot.reads(current=lambda path, **_: (facts.system.FileState, {"path": path}),
                tool_found=lambda tool=None, **_: (Which, {"command": tool}) if tool else None)
@operation()
def probe(path, tool=None, *, current, tool_found):
    yield f"{path}: {current}, {tool_found}"


def test_the_body_gets_each_named_read_answered_and_callers_pass_only_its_own_arguments():
    from pyinfra.context import ctx_host

    asked = []
    box = SimpleNamespace(name="thor-1", state=SimpleNamespace(),
                          get_fact=lambda fact, **kw: asked.append((fact, kw)) or "answer")
    with ctx_host.use(box):
        assert list(probe._inner(path="/x")) == ["/x: answer, None"]
        assert asked == [(facts.system.FileState, {"_sudo": True, "path": "/x"})]
        with pytest.raises(TypeError):  # an answer is the operation's to read, never a caller's
            list(probe._inner(path="/x", current="mine"))
    assert snapshot.declared(probe, "/x", tool="rsync") == [
        (facts.system.FileState, {"path": "/x"}), (Which, {"command": "rsync"})]


def test_a_named_read_the_body_does_not_take_is_refused_where_it_is_declared():
    with pytest.raises(TypeError, match="nowhere"):
        snapshot.reads(nowhere=lambda **_: (facts.power.PowerMode, {}))(probe)
