"""thorfleet's operations, facts in and commands out (as pyinfra tests its own): each yields only
what closes the gap, and nothing (a noop) when the box is already right.

The edits that break the staging tests (tried once): files._replace
naming the staged upload after the content's sha256 again (`digest[:16]`); whole_file deciding
to upload from anything but the box's reported sha256."""

import hashlib
from io import StringIO
from types import SimpleNamespace

import pytest
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.context import ctx_host
from pyinfra.facts.server import Which

from thorfleet import facts
from thorfleet.operations import (
    cleanup,
    files,
    image,
    power,
    preflight,
    verification,
    weights,
)
from thorfleet.operations.commands import ShownCommand
from thorfleet.run import pyinfra_hooks, snapshot
from thorfleet.run.runstate import run_state
from thorfleet.settings import layout


class FakeHost:
    """Answers get_fact from a table {FactClass: value or callable(**kwargs)}; records noops, the
    lines it logs and the shell commands a FunctionCommand runs (answered by `shell`)."""

    def __init__(self, known, state=None, shell=None):
        self.known, self.noops, self.name, self.data = known, [], "thor-1", {}
        self.state = state or SimpleNamespace()  # pyinfra's State: holds the run state
        self.logged, self.ran, self.shell, self.asked = [], [], shell, []

    def get_fact(self, fact, **kwargs):
        self.asked.append((fact, {k: v for k, v in kwargs.items() if k != "_sudo" or not v}))
        value = self.known[fact]
        return value(**{k: v for k, v in kwargs.items() if not k.startswith("_")}) \
            if callable(value) else value

    def noop(self, message):
        self.noops.append(message)

    def log_styled(self, message, **kwargs):
        self.logged.append((message, kwargs.get("fg")))

    def run_shell_command(self, command, **kwargs):
        self.ran.append(command)
        return self.shell(command)


def plan(op, known, state=None, shell=None, **kwargs):
    """(commands, fake host) of one operation against the given facts."""
    fake = FakeHost(known, state, shell)
    with ctx_host.use(fake):
        commands = list(op._inner(**kwargs))
    return commands, fake


def run(op, known, **kwargs):
    """(commands as text, noops) of one operation against the given facts."""
    commands, fake = plan(op, known, **kwargs)
    return [text(c) for c in commands], fake.noops


def execute(command, fake):
    """What a FunctionCommand returns when pyinfra runs it on the fake host."""
    return command.function(fake.state, fake, *command.args, **command.kwargs)


def test_every_operation_runs_twice_to_the_same_noop():
    # pyinfra's own check: against facts that say "already right", the second run yields nothing
    known = {facts.power.PowerMode: 1, facts.power.Clocks: {"locked": True},
             facts.serving.WeightsState: {"complete": True},
             facts.serving.DockerImageLabels: {"thorfleet.patches": "p"},
             facts.serving.ServerState: {"active": "active", "proven_fingerprint": "f" * 64,
                                 "secrets_proven": True, "healthy": True}}
    for op, kwargs in ((power.power_mode, {"mode": 1}), (power.clocks_locked, {}),
                       (weights.checkpoint, {"folder": "/m", "repo": "o/r", "revision": "a" * 40,
                                          "image": "i"}),
                       (image.derived_image, built_from()),
                       (verification.serving, {"service": "thorfleet-vllm", "port": 8002,
                                               "fingerprint": "f" * 64, "health_timeout": 1200})):
        for _ in range(2):
            commands, noops = run(op, known, **kwargs)
            assert commands == [] and len(noops) == 1, op


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
    commands, noops = run(power.power_mode, {facts.power.PowerMode: 1}, mode=1)
    assert commands == [] and noops == ["power mode is already 1"]


def test_power_mode_never_leaves_the_reboot_prompt_waiting_on_stdin():
    commands, _ = run(power.power_mode, {facts.power.PowerMode: 0}, mode=1)
    assert commands[0] == "nvpmodel -m 1 </dev/null || true"
    assert commands[1] == "call needs_reboot"


def test_a_mode_that_needs_a_reboot_fails_the_host_with_the_fix_in_the_report():
    modes = iter([0, 0])  # before, and still after nvpmodel read EOF at its prompt
    commands, fake = plan(power.power_mode, {facts.power.PowerMode: lambda: next(modes)}, mode=2)
    assert execute(commands[1], fake) is False
    [error] = run_state(fake.state).errors["thor-1"]
    assert "power mode 2 needs a reboot and power_allow_reboot is False" in error
    assert fake.logged == [(f"thorfleet: {error}", "red")]  # logged as recorded, in red


def test_a_box_without_nvpmodel_fails_the_host_recorded_not_raised():
    commands, fake = plan(power.power_mode, {facts.power.PowerMode: None}, mode=1)
    assert [text(c) for c in commands] == ["call fail"]
    assert execute(commands[0], fake) is False
    assert run_state(fake.state).errors == {
        "thor-1": ["nvpmodel not found: this box is not a Jetson with JetPack"]}


def test_clocks():
    assert run(power.clocks_locked, {facts.power.Clocks: {"locked": True}}) == ([], ["clocks are already locked"])
    assert run(power.clocks_locked, {facts.power.Clocks: {"locked": False}})[0] == ["jetson_clocks"]
    assert run(power.clocks_locked, {facts.power.Clocks: None})[0] == ["call fail"]


def test_preflight_problems_fail_the_host_once_with_every_problem():
    known = {facts.box.L4TRelease: "36.4.0", facts.box.MemTotalGiB: 61.4, facts.box.FreeDiskGiB: 500.0,
             facts.serving.PinnedWeightsGiB: 0.0, facts.box.SudoWorks: True, facts.box.DockerRuntimes: ["runc"]}
    commands, fake = plan(preflight.thor_ready, known, **ready_args())
    assert execute(commands[0], fake) is False
    [error] = run_state(fake.state).errors["thor-1"]
    assert error.startswith("preflight failed:") and error.count("\n  - ") == 3


def ready_args():
    return {"min_l4t_release": "38.0", "min_memory_gib": 110, "min_free_disk_gib": 100,
            "weights_dir": layout.BOX_MODELS,
            "checkpoints": [f"{layout.BOX_MODELS}/M/{'a' * 40}", f"{layout.BOX_MODELS}/E/{'b' * 40}"]}


def test_the_pinned_weights_on_disk_count_toward_the_free_disk_preflight_asks():
    ready = {facts.box.L4TRelease: "38.2.0", facts.box.MemTotalGiB: 122.0, facts.box.SudoWorks: True,
             facts.box.DockerRuntimes: ["nvidia", "runc"]}
    # a converged box: 66 GiB of weights in place, 40 GiB left on the disk
    commands, fake = plan(preflight.thor_ready,
                          {**ready, facts.box.FreeDiskGiB: 40.0, facts.serving.PinnedWeightsGiB: 66.0}, **ready_args())
    assert commands == [] and fake.noops == ["Thor ready: L4T R38.2.0, 122 GiB, 40 GiB free"]
    # the same disk without them: the download would not fit
    commands, fake = plan(preflight.thor_ready,
                          {**ready, facts.box.FreeDiskGiB: 40.0, facts.serving.PinnedWeightsGiB: 0.0}, **ready_args())
    assert execute(commands[0], fake) is False
    [error] = run_state(fake.state).errors["thor-1"]
    assert f"40.0 GiB free under {layout.BOX_MODELS}, need 100" in error
    commands, fake = plan(preflight.thor_ready,
                          {**ready, facts.box.FreeDiskGiB: 20.0, facts.serving.PinnedWeightsGiB: 66.0}, **ready_args())
    assert execute(commands[0], fake) is False
    assert "20.0 GiB free under /opt/thorfleet/models + 66.0 GiB of the pinned weights already " \
           "there, need 100" in run_state(fake.state).errors["thor-1"][0]


SHA_OF_HELLO = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"


def test_whole_file_in_place_is_a_noop():
    on_box = {"type": "regular file", "sha256": SHA_OF_HELLO, "mode": "644", "user": "root",
              "group": "root"}
    commands, noops = run(files.whole_file, {facts.system.FileState: on_box}, path="/etc/x",
                          src=StringIO("hello\n"))
    assert commands == [] and noops == ["/etc/x is already in place"]


def test_whole_file_with_only_its_mode_drifted_is_chmodded_not_rewritten():
    on_box = {"type": "regular file", "sha256": SHA_OF_HELLO, "mode": "666", "user": "root",
              "group": "root"}
    commands, _ = run(files.whole_file, {facts.system.FileState: on_box}, path="/etc/x",
                      src=StringIO("hello\n"), mode="600")
    assert commands == ["chown root:root /etc/x && chmod 600 /etc/x"]


def test_whole_file_quotes_its_path():
    on_box = {"type": "regular file", "sha256": SHA_OF_HELLO, "mode": "666", "user": "root",
              "group": "root"}
    commands, _ = run(files.whole_file, {facts.system.FileState: on_box}, path="/etc/a b;x",
                      src=StringIO("hello\n"))
    assert commands == ["chown root:root '/etc/a b;x' && chmod 644 '/etc/a b;x'"]
    commands, _ = run(files.whole_file, {facts.system.FileState: None}, path="/etc/a b",
                      src=StringIO("hello\n"))
    assert "'/etc/a b.thorfleet-tmp' '/etc/a b';" in commands[2]


def test_whole_file_replaces_a_link_to_a_copy_and_refuses_a_folder():
    # a link to a file of the same content is still not the file thorfleet installs: replaced
    # whole, the link itself (mv -T), never followed
    link = {"type": "symbolic link", "sha256": None, "mode": "777", "user": "root",
            "group": "root"}
    commands, _ = run(files.whole_file, {facts.system.FileState: link}, path="/etc/x",
                      src=StringIO("hello\n"))
    assert len(commands) == 3 and "sudo mv -fT /etc/x.thorfleet-tmp /etc/x" in commands[2]
    folder = {"type": "directory", "sha256": None, "mode": "755", "user": "root", "group": "root"}
    commands, fake = plan(files.whole_file, {facts.system.FileState: folder}, path="/etc/x",
                          src=StringIO("hello\n"))
    assert execute(commands[0], fake) is False
    assert fake.logged[-1][0] == ("thorfleet: /etc/x is a directory, not the file thorfleet "
                                  "installs there: move it away, then run again")


@pytest.mark.parametrize(("state", "expected"), [
    ("enabled", []),
    ("disabled", ["systemctl enable u.service"]),
    ("enabled-runtime", ["systemctl enable u.service"]),
    ("linked", ["systemctl enable u.service"]),
    ("linked-runtime", ["systemctl enable u.service"]),
    ("alias", ["systemctl enable u.service"]),
    ("indirect", ["systemctl enable u.service"]),
    ("masked", ["systemctl unmask u.service && systemctl enable u.service"]),
    ("masked-runtime", ["systemctl unmask --runtime u.service && systemctl enable u.service"]),
])
def test_a_unit_in_any_state_systemd_has_is_enabled_with_the_least_work(state, expected):
    commands, _ = run(files.unit_enabled, {facts.system.UnitEnabled: state}, unit="u.service")
    assert commands == expected


@pytest.mark.parametrize(("state", "said"), [
    ("static", "u.service is static: its unit file has no [Install] section"),
    ("generated", "u.service is generated: a systemd generator made it"),
    ("transient", "u.service is transient: systemd-run made it: `systemctl stop` it"),
    ("bad", "u.service is bad: its unit file does not parse"),
    (None, "u.service is unknown to systemd: `systemctl daemon-reload`, then run the deploy"),
])
def test_a_unit_state_a_run_cannot_put_right_fails_saying_how_to(state, said):
    commands, fake = plan(files.unit_enabled, {facts.system.UnitEnabled: state}, unit="u.service")
    assert execute(commands[0], fake) is False
    assert fake.logged[-1][0].startswith(f"thorfleet: {said}")


def test_whole_file_is_staged_then_renamed_into_place():
    commands, _ = run(files.whole_file, {facts.system.FileState: None}, path="/etc/x",
                      src=StringIO("hello\n"))
    staged = commands[1].removeprefix("upload ")
    assert staged.startswith(".thorfleet-upload/") and commands[1] == f"upload {staged}"
    # the live file only ever changes by a rename of a complete file beside it
    assert f"sudo install -m 644 -o root -g root {staged} /etc/x.thorfleet-tmp" in commands[2]
    assert "sudo mv -fT /etc/x.thorfleet-tmp /etc/x" in commands[2]


def test_a_secrets_staged_name_tells_nothing_of_it_and_a_converged_box_is_still_a_noop():
    """`sudo install STAGED ...` is in the box's process list while it runs: a name derived from
    the content (once the first 16 hex of its sha256) let anyone on the box check guesses of the
    boxes' key (secrets.env, the door's box-key map) offline. Whether to upload comes from the
    sha256 the box reports of the live file, not from the staged name."""
    secret = "VLLM_API_KEY=sk-a-key-0123456789abcdef\n"
    digest = hashlib.sha256(secret.encode()).hexdigest()
    names = set()
    for _ in range(2):
        commands, _ = run(files.whole_file, {facts.system.FileState: None}, path="/etc/s",
                          src=StringIO(secret), mode="600")
        staged = commands[1].removeprefix("upload .thorfleet-upload/")
        assert staged not in digest and digest[:8] not in "".join(commands), commands
        assert f"{files.BOX_UPLOAD_STAGING}/{staged}" in commands[2]  # installed, then removed
        names.add(staged)
    assert len(names) == 2  # not a function of the content at all
    converged = {"type": "regular file", "sha256": digest, "mode": "600", "user": "root",
                 "group": "root"}
    for _ in range(2):
        assert run(files.whole_file, {facts.system.FileState: converged}, path="/etc/s",
                   src=StringIO(secret), mode="600") == ([], ["/etc/s is already in place"])


def test_checkpoint_complete_is_a_noop_and_missing_is_fetched():
    kwargs = {"folder": "/m/r", "repo": "mistralai/x", "revision": "a" * 40, "image": "img:1"}
    commands, noops = run(weights.checkpoint, {facts.serving.WeightsState: {"complete": True}}, **kwargs)
    assert commands == [] and "complete" in noops[0]
    commands, _ = run(weights.checkpoint, {facts.serving.WeightsState: {"complete": False, "problems": []}},
                      endpoint="http://hub:8000", token_file="/etc/t", **kwargs)
    # huggingface_hub from the image: nothing from apt or PyPI on the box; the token a file
    w = layout.BOX_WEIGHTS
    assert commands == [(f"docker rm -f thorfleet-fetch-aaaaaaaaaaaa >/dev/null 2>&1; "
                         "docker run --rm --name thorfleet-fetch-aaaaaaaaaaaa --network host "
                         "-e HF_HUB_DISABLE_XET=1 -e HF_HUB_DISABLE_PROGRESS_BARS=1 "
                         f"-v /m:/m -v {w}:{w}:ro -v /etc/t:/etc/t:ro "
                         f"--entrypoint python3 img:1 {w} fetch --dir /m/r --repo mistralai/x "
                         f"--revision {'a' * 40} --endpoint http://hub:8000 --token-file /etc/t "
                         "--progress-every 10")]
    # shown as it comes, under the host's name, without -v: the transfer's progress lines
    (command,), _ = plan(weights.checkpoint, {facts.serving.WeightsState: {"complete": False}}, **kwargs)
    assert isinstance(command, ShownCommand)


def test_checkpoint_with_peers_copies_first_and_asks_the_hub_only_for_what_is_left():
    kwargs = {"folder": "/m/r", "repo": "mistralai/x", "revision": "a" * 40, "image": "img:1"}
    commands, _ = run(weights.checkpoint, {facts.serving.WeightsState: {"complete": False, "problems": []}},
                      peers=["thor-1.lan", "thor-3.lan:2222"], root="/m", **kwargs)
    w, listed = layout.BOX_WEIGHTS, f"{layout.BOX_MANIFESTS}/{'a' * 40}.json"
    manifest = (f"docker run --rm --name thorfleet-fetch-aaaaaaaaaaaa --network host "
                "-e HF_HUB_DISABLE_XET=1 -e HF_HUB_DISABLE_PROGRESS_BARS=1 -v /m:/m "
                f"-v {w}:{w}:ro -v {layout.BOX_MANIFESTS}:{layout.BOX_MANIFESTS} --entrypoint python3 img:1 {w} "
                f"manifest --repo mistralai/x --revision {'a' * 40} --out {listed}")
    copy = (f"python3 {w} copy --dir /m/r --revision {'a' * 40} --expected {listed} --root /m "
            f"--key {layout.BOX_PEER_KEY} --known-hosts {layout.BOX_PEER_KNOWN_HOSTS} "
            f"--user {layout.PEER_USER} --progress-every 10 --peer thor-1.lan "
            "--peer thor-3.lan:2222")
    [command] = commands
    # the file list from the hub (metadata only), the copy on the box (rsync), then the hub fetch
    # only if the copy left something missing
    assert command.startswith(f"docker rm -f thorfleet-fetch-aaaaaaaaaaaa >/dev/null 2>&1; "
                              f"{{ {manifest} && {copy}; }} || docker run ")
    assert command.endswith(f"fetch --dir /m/r --repo mistralai/x --revision {'a' * 40} "
                            "--progress-every 10")


def built_from(**extra):
    """derived_image's and shared_image's arguments for the test image."""
    return {"tag": "thorfleet/mistral-small4:abc", "base": "r/vllm@sha256:" + "c" * 64,
            "inputs_hash": "abc" * 10, "think_prefill": True, "context": "/ctx", **extra}


SHARED = {"registry": "reg:5000/team", "shared_ref": "reg:5000/team/mistral-small4:abc"}


def settings(**extra):
    return SimpleNamespace(
        image_tag="thorfleet/mistral-small4:abc", image_base="r/vllm@sha256:" + "c" * 64,
        image_think_prefill=True, image_inputs_hash="abc" * 10, service_name="thorfleet-vllm",
        service_port=8002, service_health_timeout_s=1200, fingerprint="f" * 64, **extra)


def test_derived_image_present_is_a_noop_absent_is_built():
    commands, noops = run(image.derived_image, {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}},
                          **built_from())
    assert commands == [] and "already built" in noops[0]
    commands, _ = run(image.derived_image, {facts.serving.DockerImageLabels: lambda ref: None},
                      **built_from())
    assert commands[0].startswith("docker pull r/vllm@sha256:")
    assert commands[1] == (f"sh /ctx/build-image.sh --base r/vllm@sha256:{'c' * 64} "
                           "--tag thorfleet/mistral-small4:abc --think-prefill 1 "
                           f"--label thorfleet.inputs={'abc' * 10}")


# operations.serving and the rollout's decision: tests/fast/test_rollout_cases.py, a table of turns


def test_each_run_has_its_own_run_state():
    one, other = SimpleNamespace(), SimpleNamespace()
    run_state(one).failed_restarts.add("thor-1")
    assert run_state(one) is run_state(one) and run_state(other).failed_restarts == set()


def test_leftovers_are_removed_one_command_each_kind_and_none_is_a_noop():
    keep = {"weights_dir": "/m", "keep_dirs": ["/m/M/" + "a" * 40, "/m/E/" + "b" * 40],
            "image_name": "thorfleet/mistral-small4", "keep_image": "thorfleet/mistral-small4:abc",
            "keep_context": "abcabcabcabc", "service": "thorfleet-vllm"}
    nothing = {"dirs": [], "images": [], "contexts": []}
    commands, noops = run(cleanup.leftovers_removed, {facts.serving.Leftovers: nothing}, **keep)
    assert commands == [] and noops[0].startswith("nothing old to remove")
    found = {"dirs": ["/m/M/" + "1" * 40], "images": ["thorfleet/mistral-small4:old"],
             "contexts": [f"{layout.BOX_IMAGE_CONTEXT}/cccccccccccc"]}
    asked = {}
    commands, _ = run(cleanup.leftovers_removed,
                      {facts.serving.Leftovers: lambda **kw: asked.update(kw) or found}, **keep)
    assert commands == [f"rm -rf -- /m/M/{'1' * 40} {layout.BOX_IMAGE_CONTEXT}/cccccccccccc",
                        "docker rmi thorfleet/mistral-small4:old"]
    # what it keeps: the pinned weights, this image, and what the live and last good units use
    assert asked["keep_dirs"] == keep["keep_dirs"] and asked["keep_context"] == "abcabcabcabc"
    assert asked["keep_images"] == ["thorfleet/mistral-small4:abc"]
    assert asked["units"] == [layout.box_unit("thorfleet-vllm"), layout.BOX_LAST_GOOD_UNIT]


def test_with_a_registry_the_first_host_pulls_what_an_earlier_run_pushed_else_builds_and_pushes():
    built_id = "sha256:" + "9" * 64
    commands, fake = plan(image.derived_image, {facts.serving.DockerImageLabels: lambda ref: None,
                                                facts.serving.DockerImageId: None}, **built_from(**SHARED),
                          shell=lambda c: (True, SimpleNamespace(stdout_lines=[built_id])))
    command, remember = (text(c) for c in commands)
    pulled, built = command.split("; else ")
    # already in the registry (a box added later, a fleet that ran before): pulled, not built
    assert pulled.startswith("if docker pull -q reg:5000/team/mistral-small4:abc")
    assert "docker tag reg:5000/team/mistral-small4:abc thorfleet/mistral-small4:abc" in pulled
    assert "sh /ctx/build-image.sh " in built
    assert built.endswith("docker tag thorfleet/mistral-small4:abc reg:5000/team/mistral-small4:abc"
                          " && docker push -q reg:5000/team/mistral-small4:abc && "
                          "docker rmi reg:5000/team/mistral-small4:abc >/dev/null; fi")
    # then what it built (or pulled) is the image the run's other hosts must pull, by ID
    assert remember == "call remember" and execute(commands[1], fake) is True
    assert run_state(fake.state).image_ids == {"thorfleet/mistral-small4:abc": built_id}
    # a first host that has it already: nothing to do, but its ID is the one to pull
    commands, fake = plan(image.derived_image, {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"},
                                               facts.serving.DockerImageId: built_id},
                          **built_from(**SHARED), state=fleet_state({"thor-2": True}))
    assert commands == [] and run_state(fake.state).image_ids == {
        "thorfleet/mistral-small4:abc": built_id}


class OtherHost:
    """Another host of the run, as an operation on this one sees it (hashable, as pyinfra's)."""

    def __init__(self, name, state):
        self.name, self.state = name, state


class Inventory(list):
    def get_active_hosts(self):  # pyinfra's: the run's hosts that have not failed
        return list(self)


def fleet_state(has_image):
    """A run's state whose other hosts ({name: whether it has the image}) declared their image
    read and have had their one-round-trip read of the box."""
    state = SimpleNamespace(current_stage=3, add_callback_handler=lambda handler: None)
    pyinfra_hooks.watch(state)  # nothing has run yet
    others = [OtherHost(name, state) for name in has_image]
    state.inventory = Inventory(others)
    query = (facts.serving.DockerImageLabels, {"ref": "thorfleet/mistral-small4:abc"})
    key = snapshot.key_of(*query)
    for other in others:
        snapshot.plan(other, [query])
        run_state(state).held_reads[other.name] = {"stage": 3, "tried": {key}, "values": {
            key: {"thorfleet.patches": "p"} if has_image[other.name] else None}}
    return state


def test_a_first_host_that_has_the_image_pushes_it_for_the_boxes_of_the_run_that_lack_it():
    # a fleet converged before image_registry was set, then a box added: that box pulls, no build
    have = {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}, facts.serving.DockerImageId: "sha256:9"}
    [command], _ = run(image.derived_image, have, **built_from(**SHARED),
                       state=fleet_state({"thor-2": True, "thor-3": False}))
    assert command == ("docker tag thorfleet/mistral-small4:abc reg:5000/team/mistral-small4:abc && "
                       "docker push -q reg:5000/team/mistral-small4:abc && docker rmi "
                       "reg:5000/team/mistral-small4:abc >/dev/null && echo 'thorfleet: "
                       "thorfleet/mistral-small4:abc pushed to reg:5000/team for thor-3'")
    # every box of the run has it: nothing to ship, nothing sent
    assert run(image.derived_image, have, **built_from(**SHARED),
               state=fleet_state({"thor-2": True, "thor-3": True}))[0] == []


def test_the_other_hosts_pull_check_the_inputs_label_and_build_only_without_it():
    commands, noops = run(image.shared_image, {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}},
                          **built_from(**SHARED))
    assert commands == [] and "already here" in noops[0]  # a box that has it gets nothing
    [command], _ = run(image.shared_image, {facts.serving.DockerImageLabels: lambda ref: None},
                       **built_from(**SHARED))
    pulled, built = command.split("; else ")
    assert pulled.startswith("if docker pull -q reg:5000/team/mistral-small4:abc")
    # on arrival: the image's label is the hash of every input this run renders
    assert ("[ \"$(docker inspect --format '{{index .Config.Labels \"thorfleet.inputs\"}}' "
            f"reg:5000/team/mistral-small4:abc)\" = {'abc' * 10} ]") in pulled
    assert "docker tag reg:5000/team/mistral-small4:abc thorfleet/mistral-small4:abc" in pulled
    # not in the registry (the builder is down, or its build failed): built here, base first
    assert "docker pull r/vllm@sha256:" in built and "sh /ctx/build-image.sh" in built
    # when the run's first host built (or holds) it, what arrives must be that image, by ID
    state = SimpleNamespace()
    run_state(state).image_ids["thorfleet/mistral-small4:abc"] = "sha256:" + "9" * 64
    [command], _ = run(image.shared_image, {facts.serving.DockerImageLabels: lambda ref: None},
                       **built_from(**SHARED), state=state)
    pulled = command.split("; else ")[0]
    assert ("[ \"$(docker inspect --format '{{.Id}}' reg:5000/team/mistral-small4:abc)\" = "
            f"sha256:{'9' * 64} ] && docker tag ") in pulled


def test_without_a_registry_the_first_host_builds_and_records_the_id_the_others_load():
    built_id = "sha256:" + "9" * 64
    commands, fake = plan(image.derived_image, {facts.serving.DockerImageLabels: lambda ref: None,
                                                facts.serving.DockerImageId: None},
                          **built_from(shared=True),
                          shell=lambda c: (True, SimpleNamespace(stdout_lines=[built_id])))
    *build, remember = (text(c) for c in commands)
    assert build[-1].startswith("sh /ctx/build-image.sh ") and remember == "call remember"
    assert execute(commands[-1], fake) is True
    assert run_state(fake.state).image_ids == {"thorfleet/mistral-small4:abc": built_id}
    # a first host that has it: nothing to do, but its ID is the one the others must load
    commands, fake = plan(image.derived_image, {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"},
                                               facts.serving.DockerImageId: built_id},
                          **built_from(shared=True))
    assert commands == [] and run_state(fake.state).image_ids == {
        "thorfleet/mistral-small4:abc": built_id}
    # not shared (one box, or image_source='build'): its ID is not even read
    assert image.derived_image.declared(**built_from()) == [
        (facts.serving.DockerImageLabels, {"ref": "thorfleet/mistral-small4:abc"}),
        (facts.serving.DockerImageLabels, {"ref": "r/vllm@sha256:" + "c" * 64})]


def test_the_other_hosts_load_from_the_first_check_the_id_and_build_only_without_it():
    commands, noops = run(image.loaded_image, {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}},
                          **built_from(source="thor-1:2201"))
    assert commands == [] and "already here" in noops[0]  # a box that has it gets nothing
    state = SimpleNamespace()
    run_state(state).image_ids["thorfleet/mistral-small4:abc"] = "sha256:" + "9" * 64
    [command], _ = run(image.loaded_image, {facts.serving.DockerImageLabels: lambda ref: None},
                       **built_from(source="thor-1:2201"), state=state)
    loaded, built = command.split("; else ")
    assert loaded == (
        f"if {layout.BOX_IMAGE_TOOL} load --from thor-1:2201 --tag thorfleet/mistral-small4:abc "
        f"--inputs {'abc' * 10} --id sha256:{'9' * 64} --key {layout.BOX_IMAGE_KEY} "
        f"--known-hosts {layout.BOX_PEER_KNOWN_HOSTS} --user {layout.IMAGE_USER}; then :")
    # the load failed (the first host down, a cut transfer, another image): built here
    assert built.startswith("echo 'thorfleet: building thorfleet/mistral-small4:abc here instead'")
    assert "docker pull r/vllm@sha256:" in built and "sh /ctx/build-image.sh" in built
    # the first host's build failed, so it recorded no ID: the load is asked without one
    [command], _ = run(image.loaded_image, {facts.serving.DockerImageLabels: lambda ref: None},
                       **built_from(source="thor-1"))
    assert "--id" not in command.split("; else ")[0]


def test_directory_is_made_put_right_or_left_alone():
    right = {"type": "directory", "mode": "755", "user": "root", "group": "root"}
    assert run(files.directory, {facts.system.PathState: right}, path="/etc/t")[0] == []
    assert run(files.directory, {facts.system.PathState: None}, path="/etc/t b", mode="700")[0] == [
        "mkdir -p '/etc/t b'", "chown root:root '/etc/t b' && chmod 700 '/etc/t b'"]
    loose = {**right, "mode": "777", "user": "thor"}
    assert run(files.directory, {facts.system.PathState: loose}, path="/etc/t")[0] == [
        "chown root:root /etc/t && chmod 755 /etc/t"]
    # a file in the way is not replaced: the host fails, naming it
    (command,), _ = plan(files.directory, {facts.system.PathState: {**right, "type": "regular file"}},
                         path="/etc/t")
    assert isinstance(command, FunctionCommand)


def test_absent_removes_only_what_is_there():
    assert run(files.absent, {facts.system.PathState: None}, path="/opt/v")[0] == []
    assert run(files.absent, {facts.system.PathState: {"type": "directory"}}, path="/opt/v")[0] == [
        "rm -rf -- /opt/v"]


def test_a_unit_is_enabled_once():
    assert run(files.unit_enabled, {facts.system.UnitEnabled: "enabled"}, unit="u.service")[0] == []
    assert run(files.unit_enabled, {facts.system.UnitEnabled: "disabled"}, unit="u.service")[0] == [
        "systemctl enable u.service"]


def test_the_system_user_is_made_or_put_right():
    known = {facts.system.PasswdEntry: {"uid": 998, "home": "/var/lib/p", "shell": "/bin/sh"}}
    assert run(files.system_user, known, user="p", home="/var/lib/p")[0] == []
    assert run(files.system_user, {facts.system.PasswdEntry: None}, user="p", home="/var/lib/p")[0] == [
        "useradd --system --home-dir /var/lib/p --no-create-home --shell /bin/sh p"]
    assert run(files.system_user, known, user="p", home="/home/p")[0] == [
        "usermod --home /home/p --shell /bin/sh p"]


def test_a_tree_uploads_only_the_files_that_differ_and_removes_the_extra(tmp_path):
    import hashlib

    (tmp_path / "patches").mkdir()
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    (tmp_path / "patches" / "a.diff").write_text("diff\n")
    (tmp_path / "build.sh").write_text("#!/bin/sh\n")
    (tmp_path / "build.sh").chmod(0o755)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"\0")

    def on_box(name, mode="644", owner="root:root"):
        return {"sha256": hashlib.sha256((tmp_path / name).read_bytes()).hexdigest(), "mode": mode,
                "owner": owner}

    same = {"Dockerfile": on_box("Dockerfile"), "patches/a.diff": on_box("patches/a.diff"),
            "build.sh": on_box("build.sh", "755")}
    commands, noops = run(files.tree, {facts.system.TreeState: same}, src=str(tmp_path), dest="/c")
    assert commands == [] and noops == [f"/c already holds {tmp_path}"]
    drifted = {**same, "build.sh": on_box("build.sh", "644"), "old.diff": on_box("Dockerfile"),
               "patches/a.diff": {"sha256": "0" * 64, "mode": "644", "owner": "root:root"}}
    commands, _ = run(files.tree, {facts.system.TreeState: drifted}, src=str(tmp_path), dest="/c")
    assert commands[0] == "mkdir -p /c /c/patches"
    # build.sh's content is right: only its mode is put back; a.diff is uploaded again
    assert commands[1] == "chown root:root /c/build.sh && chmod 755 /c/build.sh"
    assert "sudo install -m 644 -o root -g root" in commands[4] and "/c/patches/a.diff" in commands[4]
    assert commands[5:] == ["rm -f -- /c/old.diff"]
    # a file given away, or replaced by a link to a copy: put right with the least work
    owned = {**same, "Dockerfile": on_box("Dockerfile", owner="thor:thor"),
             "build.sh": {"type": "other"}}
    commands, _ = run(files.tree, {facts.system.TreeState: owned}, src=str(tmp_path), dest="/c")
    assert commands[1] == "chown root:root /c/Dockerfile && chmod 644 /c/Dockerfile"
    assert "sudo mv -fT /c/build.sh.thorfleet-tmp /c/build.sh" in commands[4]
    # a fresh box: the folder is absent, which the fact reads as no file (its default)
    commands, _ = run(files.tree, {facts.system.TreeState: facts.system.TreeState().default()},
                      src=str(tmp_path), dest="/c")
    assert len(commands) == 1 + 3 * 3


class Renders:
    """A host's settings as files.template asks them: each template renders to `text`."""

    def __init__(self, text):
        self.text = text

    def render(self, template):
        return self.text


# Every operation, with arguments and the box as it reads it: once with nothing in place (the
# commands that put it there) and once already right (a noop).
ABSENT_AND_RIGHT = {
    preflight.thor_ready: ({**ready_args(), "fleet_copy": True}, [
        {facts.box.L4TRelease: None, facts.box.MemTotalGiB: 8.0, facts.box.FreeDiskGiB: 1.0,
         facts.serving.PinnedWeightsGiB: 0.0, facts.box.SudoWorks: False, facts.box.DockerRuntimes: None,
         Which: None},
        {facts.box.L4TRelease: "38.2.0", facts.box.MemTotalGiB: 122.0, facts.box.FreeDiskGiB: 500.0,
         facts.serving.PinnedWeightsGiB: 0.0, facts.box.SudoWorks: True,
         facts.box.DockerRuntimes: ["nvidia"], Which: "/usr/bin/rsync"}]),
    preflight.box_held: ({"holder": "me", "token": "t"}, [
        {facts.lock.RunLock: {"held": False, "why": "held by another run"}},
        {facts.lock.RunLock: {"held": True, "why": None}}]),
    power.power_mode: ({"mode": 1}, [{facts.power.PowerMode: 0}, {facts.power.PowerMode: 1}]),
    power.clocks_locked: ({}, [{facts.power.Clocks: {"locked": False}}, {facts.power.Clocks: {"locked": True}}]),
    files.whole_file: ({"path": "/etc/x", "src": StringIO("hello\n")}, [
        {facts.system.FileState: None},
        {facts.system.FileState: {"type": "regular file", "sha256": SHA_OF_HELLO, "mode": "644",
                           "user": "root",
                           "group": "root"}}]),
    files.template: ({"path": "/etc/x", "src": "t.j2", "settings": Renders("hello\n")}, [
        {facts.system.FileState: None},
        {facts.system.FileState: {"type": "regular file", "sha256": SHA_OF_HELLO, "mode": "644",
                                  "user": "root", "group": "root"}}]),
    files.directory: ({"path": "/etc/t"}, [
        {facts.system.PathState: None},
        {facts.system.PathState: {"type": "directory", "mode": "755", "user": "root", "group": "root"}}]),
    files.absent: ({"path": "/etc/t"}, [{facts.system.PathState: {"type": "directory"}},
                                        {facts.system.PathState: None}]),
    files.unit_enabled: ({"unit": "u.service"}, [{facts.system.UnitEnabled: "disabled"},
                                                 {facts.system.UnitEnabled: "enabled"}]),
    files.system_user: ({"user": "p", "home": "/var/lib/p"}, [
        {facts.system.PasswdEntry: None},
        {facts.system.PasswdEntry: {"uid": 998, "home": "/var/lib/p", "shell": "/bin/sh"}}]),
    files.tree: ({"src": str(layout.FILES / "image"), "dest": "/c"}, [
        {facts.system.TreeState: {}},
        {facts.system.TreeState: {name: on_box for name, (_, on_box) in files._tree(
            layout.FILES / "image").items()}}]),
    weights.checkpoint: ({"folder": "/m/r", "repo": "o/r", "revision": "a" * 40, "image": "i",
                          "peers": ["thor-2.lan"], "root": "/m"}, [
        {facts.serving.WeightsState: {"complete": False, "problems": []}},
        {facts.serving.WeightsState: {"complete": True, "problems": []}}]),
    image.derived_image: (built_from(**SHARED), [
        {facts.serving.DockerImageLabels: None, facts.serving.DockerImageId: None},
        {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}, facts.serving.DockerImageId: "sha256:9"}]),
    image.shared_image: (built_from(**SHARED), [
        {facts.serving.DockerImageLabels: None},
        {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}}]),
    image.loaded_image: (built_from(source="thor-1"), [
        {facts.serving.DockerImageLabels: None},
        {facts.serving.DockerImageLabels: {"thorfleet.patches": "p"}}]),
    verification.serving: ({"service": "thorfleet-vllm", "port": 8002, "fingerprint": "f" * 64,
                            "health_timeout": 1200}, [
        {facts.serving.ServerState: {}},
        {facts.serving.ServerState: {"active": "active", "proven_fingerprint": "f" * 64,
                             "secrets_proven": True, "healthy": True}}]),
    verification.benchmark: ({"port": 8002}, [{}]),
    verification.benchmark_gate: ({"min_fraction": 0.8, "floor": 27}, [{}]),
    cleanup.leftovers_removed: ({"weights_dir": "/m", "keep_dirs": ["/m/M/" + "a" * 40],
                                 "image_name": "thorfleet/mistral-small4",
                                 "keep_image": "thorfleet/mistral-small4:abc",
                                 "keep_context": "abcabcabcabc", "service": "thorfleet-vllm"}, [
        {facts.serving.Leftovers: {"dirs": ["/m/M/" + "1" * 40], "images": [], "contexts": []}},
        {facts.serving.Leftovers: {"dirs": [], "images": [], "contexts": []}}]),
}


def every_operation():
    """Each operation thorfleet.operations defines, found in its modules."""
    found = set()
    for module in (cleanup, files, image, power, preflight, verification, weights):
        found.update(value for value in vars(module).values()
                     if hasattr(value, "_inner") and value.__module__ == module.__name__)
    return found


def test_an_operation_reads_only_what_it_declared():
    # what snapshot.read gathers in one round trip is the declaration: a read it does not name
    # would be a fact command of its own on every run, and go stale in none of the tests here
    assert every_operation() == set(ABSENT_AND_RIGHT)
    for op, (kwargs, boxes) in ABSENT_AND_RIGHT.items():
        declared = snapshot.declared(op, **kwargs)
        for known in boxes:
            _, fake = plan(op, known, state=fleet_state({"thor-2": False}), **kwargs)
            undeclared = [asked for asked in fake.asked if asked not in declared]
            assert undeclared == [], f"{op.__name__} reads {undeclared} it did not declare"


def test_a_complete_checkpoint_with_loose_modes_gets_its_owner_and_modes_back_and_nothing_else():
    found = {"complete": True, "problems": [], "modes": ["consolidated-00001.safetensors"]}
    commands, _ = run(weights.checkpoint, {facts.serving.WeightsState: found}, folder="/m/r",
                      repo="o/r", revision="a" * 40, image="i")
    assert commands == ["chown -R root:root /m/r && chmod -R u+rwX,go+rX,go-w /m/r"]
