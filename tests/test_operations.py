"""thorfleet's operations, facts in and commands out (as pyinfra tests its own): each yields only
what closes the gap, and nothing (a noop) when the box is already right."""

from io import StringIO
from types import SimpleNamespace

import pytest
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.context import ctx_host

from thorfleet import facts
from thorfleet import operations as thor

pytestmark = pytest.mark.fast


class FakeHost:
    """Answers get_fact from a table {FactClass: value or callable(**kwargs)}; records noops."""

    def __init__(self, known):
        self.known, self.noops, self.name, self.data = known, [], "thor-1", {}

    def get_fact(self, fact, **kwargs):
        value = self.known[fact]
        return value(**{k: v for k, v in kwargs.items() if not k.startswith("_")}) \
            if callable(value) else value

    def noop(self, message):
        self.noops.append(message)


def run(op, known, **kwargs):
    """(commands as text, noops) of one operation against the given facts."""
    fake = FakeHost(known)
    with ctx_host.use(fake):
        commands = list(op._inner(**kwargs))
    return [text(c) for c in commands], fake.noops


def text(command):
    if isinstance(command, str):
        return command
    if isinstance(command, StringCommand):
        return " ".join(str(bit) for bit in command.bits)
    if isinstance(command, FileUploadCommand):
        return f"upload {command.dest}"
    if isinstance(command, FunctionCommand):
        return f"call {command.function.__name__}"
    return repr(command)


def test_power_mode_already_set_is_a_noop():
    commands, noops = run(thor.power_mode, {facts.PowerMode: 1}, mode=1)
    assert commands == [] and noops == ["power mode is already 1"]


def test_power_mode_never_leaves_the_reboot_prompt_waiting_on_stdin():
    commands, _ = run(thor.power_mode, {facts.PowerMode: 0}, mode=1)
    assert commands[0] == "nvpmodel -m 1 </dev/null || true"
    assert commands[1] == "call needs_reboot"


def test_clocks():
    assert run(thor.clocks_locked, {facts.ClocksLocked: True}) == ([], ["clocks are already locked"])
    assert run(thor.clocks_locked, {facts.ClocksLocked: False})[0] == ["jetson_clocks"]


SHA_OF_HELLO = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"


def test_whole_file_in_place_is_a_noop():
    state = {"sha256": SHA_OF_HELLO, "mode": "644", "user": "root", "group": "root"}
    commands, noops = run(thor.whole_file, {facts.FileState: state}, path="/etc/x",
                          src=StringIO("hello\n"))
    assert commands == [] and noops == ["/etc/x is already in place"]


def test_whole_file_with_only_its_mode_drifted_is_chmodded_not_rewritten():
    state = {"sha256": SHA_OF_HELLO, "mode": "666", "user": "root", "group": "root"}
    commands, _ = run(thor.whole_file, {facts.FileState: state}, path="/etc/x",
                      src=StringIO("hello\n"), mode="600")
    assert commands == ["chown root:root /etc/x && chmod 600 /etc/x"]


def test_whole_file_is_staged_then_renamed_into_place():
    commands, _ = run(thor.whole_file, {facts.FileState: None}, path="/etc/x",
                      src=StringIO("hello\n"))
    staged = f".thorfleet-upload/{SHA_OF_HELLO[:16]}"
    assert commands[1] == f"upload {staged}"
    # the live file only ever changes by a rename of a complete file beside it
    assert f"sudo install -m 644 -o root -g root {staged} /etc/x.thorfleet-tmp" in commands[2]
    assert "sudo mv -f /etc/x.thorfleet-tmp /etc/x" in commands[2]


def test_checkpoint_complete_is_a_noop_and_missing_is_fetched():
    kwargs = {"folder": "/m/r", "repo": "mistralai/x", "revision": "a" * 40}
    commands, noops = run(thor.checkpoint, {facts.WeightsState: {"complete": True}}, **kwargs)
    assert commands == [] and "complete" in noops[0]
    commands, _ = run(thor.checkpoint, {facts.WeightsState: {"complete": False, "problems": []}},
                      endpoint="http://hub:8000", **kwargs)
    assert commands == [("/opt/thorfleet/venv/bin/python /opt/thorfleet/bin/thorfleet-weights fetch "
                        f"--dir /m/r --repo mistralai/x --revision {'a' * 40} "
                        "--endpoint http://hub:8000")]


def settings(**extra):
    return SimpleNamespace(
        image_tag="thorfleet/mistral-small4:abc", image_base="r/vllm@sha256:" + "c" * 64,
        image_think_prefill=True, image_inputs_hash="abc" * 10, service_name="thorfleet-vllm",
        service_port=8002, service_health_timeout_s=1200, fingerprint="f" * 64, **extra)


def test_derived_image_present_is_a_noop_absent_is_built():
    commands, noops = run(thor.derived_image, {facts.DockerImageLabels: {"thorfleet.patches": "p"}},
                          s=settings(), context="/ctx")
    assert commands == [] and "already built" in noops[0]
    commands, _ = run(thor.derived_image, {facts.DockerImageLabels: lambda ref: None},
                      s=settings(), context="/ctx")
    assert commands[0].startswith("docker pull r/vllm@sha256:")
    assert commands[1].startswith("sh /ctx/build-image.sh --base r/vllm@sha256:")


def test_serving_a_proven_healthy_version_is_a_noop():
    state = {"active": "active", "proven_fingerprint": "f" * 64, "healthy": True}
    commands, noops = run(thor.serving, {facts.ServerState: state}, s=settings())
    assert commands == [] and "is serving fingerprint" in noops[0]


def test_serving_a_changed_version_activates_it():
    state = {"active": "active", "proven_fingerprint": "e" * 64, "healthy": True}
    commands, _ = run(thor.serving, {facts.ServerState: state}, s=settings())
    assert commands == ["call run"]
