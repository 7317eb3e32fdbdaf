"""The tasks call the operations as they are declared: every step of the deploy planned for a
two-box fleet with a registry (pyinfra's API, no box contacted), then each operation's body run
against a box with nothing in place and one already right, its reads answered from a table."""

import pyinfra
import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_inventory, ctx_state
from pyinfra.facts.server import Which

from tasks import cleanup, image, memory, power, preflight, service, verification, weights
from tests.fast.test_settings import GOOD
from thorfleet import facts
from thorfleet.plan import settings_for

TASKS = (preflight, power, memory, image, weights, service, verification, cleanup)
READY = {facts.lock.RunLock: {"held": True, "why": None}, facts.box.L4TRelease: "38.2", facts.box.MemTotalGiB: 122.0, facts.box.FreeDiskGiB: 500.0,
         facts.serving.PinnedWeightsGiB: 0.0, facts.box.SudoWorks: True, facts.box.DockerRuntimes: ["nvidia"],
         Which: "/usr/bin/rsync"}
BARE = {**READY, facts.power.PowerMode: 0, facts.power.Clocks: {"locked": False},
        facts.serving.Leftovers: {"dirs": ["/old"], "images": ["old:1"], "contexts": []}}
RIGHT = {**READY, facts.power.PowerMode: 1, facts.power.Clocks: {"locked": True},
         facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}, facts.serving.DockerImageId: "sha256:1",
         facts.system.UnitEnabled: "enabled", facts.serving.WeightsState: {"complete": True, "problems": []},
         facts.system.PathState: {"type": "directory", "mode": "755", "user": "root", "group": "root"}}


@pytest.mark.parametrize("box", [BARE, RIGHT], ids=["bare", "right"])
def test_every_task_plans_and_every_operation_body_runs(box, monkeypatch):
    monkeypatch.setenv("THORFLEET_API_KEY", "sk-test-0123456789")
    monkeypatch.setenv("THORFLEET_BATCH_READS", "0")  # each read from the table, no round trip
    inventory = Inventory((["thor-1", "thor-2"], {**GOOD, "image_registry": "reg.lan:5000/t"}))
    state = State(check_for_changes=False)  # as `pyinfra -y`: bodies run at execution only
    state.init(inventory, Config())
    state.current_stage = StateStage.Prepare
    with ctx_state.use(state), ctx_inventory.use(inventory):
        for h in inventory:
            h.get_fact = lambda fact, **_: box[fact] if fact in box else fact().default()
            with ctx_host.use(h):
                for task in TASKS:
                    task.run(settings_for(h.data.dict()))
        ran = 0
        for h in inventory:
            with ctx_host.use(h):
                for op_hash in state.get_op_order():
                    if op_hash in state.ops[h]:
                        list(state.ops[h][op_hash].command_generator())
                        ran += 1
    assert ran == len(inventory) * len(state.get_op_order()) - 2  # one image operation each


@pytest.mark.parametrize("extra, shipped", [({"image_registry": "reg.lan:5000/t"}, "Pull"),
                                            ({}, "Load")])
def test_the_first_host_builds_before_any_other_asks_for_the_image(extra, shipped, monkeypatch):
    # pyinfra runs each operation on every host in the order of the lines that call it: the other
    # hosts' pull or load must come after the first host's build, or each builds its own
    monkeypatch.setenv("THORFLEET_API_KEY", "sk-test-0123456789")
    monkeypatch.setenv("THORFLEET_BATCH_READS", "0")
    # as the CLI orders operations: by the lines that call them (the API counts them per host)
    monkeypatch.setattr(pyinfra, "is_cli", True)
    inventory = Inventory((["thor-1", "thor-2", "thor-3"], {**GOOD, **extra}))
    state = State(check_for_changes=False)
    state.init(inventory, Config())
    state.current_op_file_number = 0
    state.current_stage = StateStage.Prepare
    with ctx_state.use(state), ctx_inventory.use(inventory):
        for h in inventory:
            h.get_fact = lambda fact, **_: BARE[fact] if fact in BARE else fact().default()
            with ctx_host.use(h):
                image.run(settings_for(h.data.dict()))
    order = [(sorted(h.name for h in inventory if op_hash in state.ops[h]),
              state.get_op_meta(op_hash).names) for op_hash in state.get_op_order()]
    steps = [(hosts, sorted(n.split(" ")[2] for n in names)) for hosts, names in order
             if any(n.split(" ")[2] in ("Build", "Pull", "Load") for n in names)]
    assert steps == [(["thor-1"], ["Build"]), (["thor-2", "thor-3"], [shipped])], steps
