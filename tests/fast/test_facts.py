"""thorfleet's facts parse what a real Thor prints (its tools' documented formats and published
outputs); what is absent prints nothing, and the fact is then pyinfra's default()."""

import subprocess

from thorfleet import facts
from thorfleet.settings import layout

# `sudo jetson_clocks --show` on a Jetson AGX Thor (L4T r38) after `jetson_clocks`, as published
# (wang-junjian.github.io, Jetson AGX Thor, 2025): the GPU is the devfreq devices gpu-gpc-0 /
# gpu-nvd-0, cpuN lines have no Online=, EMC's MinFreq stays below its MaxFreq.
THOR_LOCKED = """\
SOC family:tegra264  Machine:NVIDIA Jetson AGX Thor Developer Kit
Online CPUs: 0-13, Offline CPUs:
cpu0:  Governor=schedutil MinFreq=2601000 MaxFreq=2601000 CurrentFreq=2601000 IdleStates: WFI=0 cc7=0
cpu1:  Governor=schedutil MinFreq=2601000 MaxFreq=2601000 CurrentFreq=2601000 IdleStates: WFI=0 cc7=0
cpu13: Governor=schedutil MinFreq=2601000 MaxFreq=2601000 CurrentFreq=2601000 IdleStates: WFI=0 cc7=0
gpu-gpc-0 MinFreq=1575000000 MaxFreq=1575000000 CurrentFreq=1575000000
gpu-nvd-0 MinFreq=1692000000 MaxFreq=1692000000 CurrentFreq=1692000000
EMC MinFreq=665600000 MaxFreq=4266000000 CurrentFreq=4266000000 FreqOverride=1
PVA0_VPS0: Online=0 MinFreq=0 MaxFreq=1215000000 CurrentFreq=1215000000
FAN Dynamic Speed Control=nvfancontrol hwmon1_pwm1=73
NV Power Mode: MAXN
""".splitlines()


def parse(fact, lines):
    return fact().process(lines)


def test_clocks_locked_on_a_thor():
    assert parse(facts.power.Clocks, THOR_LOCKED)["locked"] is True


def test_clocks_with_the_gpu_unlocked_are_not_locked():
    # CPUs pinned but the GPU's devfreq floor below its maximum: a CPU-only reader says "locked"
    lines = [line.replace("gpu-gpc-0 MinFreq=1575000000", "gpu-gpc-0 MinFreq=306000000")
             for line in THOR_LOCKED]
    assert parse(facts.power.Clocks, lines)["locked"] is False


def test_clocks_with_a_cpu_unlocked_are_not_locked():
    lines = [line.replace("cpu1:  Governor=schedutil MinFreq=2601000",
                          "cpu1:  Governor=schedutil MinFreq=972000") for line in THOR_LOCKED]
    assert parse(facts.power.Clocks, lines)["locked"] is False


def test_clocks_without_any_gpu_line_are_not_called_locked():
    assert parse(facts.power.Clocks, [ln for ln in THOR_LOCKED if "gpu-" not in ln])["locked"] is False


def test_clocks_on_an_orin_read_its_gpu_line():
    orin = ["cpu0: Online=1 Governor=schedutil MinFreq=2201600 MaxFreq=2201600 CurrentFreq=2201600",
            "GPU MinFreq=1300500000 MaxFreq=1300500000 CurrentFreq=1300500000",
            "EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=3199000000 FreqOverride=1"]
    assert parse(facts.power.Clocks, orin)["locked"] is True


def test_power_mode_is_the_last_line_after_warnings():
    # `nvpmodel -q`: optional `NVPM WARN ...` lines, then `NV Power Mode: <NAME>`, then the id alone
    out = ["NVPM WARN: fan mode is not set!", "NV Power Mode: 120W", "1"]
    assert parse(facts.power.PowerMode, out) == 1


def test_l4t_release_of_jetpack_7():
    # the first line of /etc/nv_tegra_release on JetPack 7: `# R38 (release), REVISION: 2.0, ...`
    line = [("# R38 (release), REVISION: 2.0, GCID: 41844464, BOARD: generic, EABI: aarch64, "
            "DATE: Fri Aug 22 00:55:42 UTC 2025")]
    assert parse(facts.box.L4TRelease, line) == "38.2.0"
    assert facts.box.L4TRelease().default() is None  # not a Jetson: no file, nothing printed


def test_memtotal_of_a_thor():
    assert round(parse(facts.box.MemTotalGiB, ["127929488"]), 1) == 122.0


def test_docker_runtimes():
    out = [('{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"},'
           '"runc":{"path":"runc"}}')]
    assert parse(facts.box.DockerRuntimes, out) == ["io.containerd.runc.v2", "nvidia", "runc"]


def test_file_state():
    # GNU stat's %F, then sha256sum for a regular file only (what a Thor's coreutils print)
    out = ["600 root root regular file",
           "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
    assert parse(facts.system.FileState, out) == {
        "type": "regular file",
        "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "mode": "600", "user": "root", "group": "root"}
    assert parse(facts.system.FileState, ["777 root root symbolic link"]) == {
        "type": "symbolic link", "sha256": None, "mode": "777", "user": "root", "group": "root"}
    assert parse(facts.system.FileState, []) is None


def test_file_state_reads_a_link_as_a_link_on_this_machine(tmp_path):
    import subprocess

    (tmp_path / "copy").write_text("hello\n")
    (tmp_path / "x").symlink_to(tmp_path / "copy")
    for name, kind in (("copy", "regular file"), ("x", "symbolic link")):
        out = subprocess.run(["sh", "-c", facts.system.FileState().command(str(tmp_path / name))],
                             capture_output=True, text=True, check=True).stdout.splitlines()
        assert parse(facts.system.FileState, out)["type"] == kind
    assert parse(facts.system.FileState, subprocess.run(
        ["sh", "-c", facts.system.FileState().command(str(tmp_path / "x"))], capture_output=True,
        text=True, check=True).stdout.splitlines())["sha256"] is None


def test_image_labels():
    assert facts.serving.DockerImageLabels().default() is None  # no such image: nothing on stdout
    assert parse(facts.serving.DockerImageLabels, ["null"]) == {}  # an image without labels
    assert parse(facts.serving.DockerImageLabels, [""]) is None  # inspect's empty line for a missing image
    assert parse(facts.serving.DockerImageLabels, ['{"thorfleet.patches":"a=applied"}']) == {
        "thorfleet.patches": "a=applied"}


def test_image_id():
    # `docker image inspect --format '{{.Id}}'` here (Docker 20.10); nothing when it is absent
    real = "sha256:3746115537fb36e11ee0194531abd53cfeeb4a16cb29a53eda87ad3c04b1c637"
    assert parse(facts.serving.DockerImageId, [real]) == real
    assert facts.serving.DockerImageId().default() is None  # absent: nothing printed
    assert parse(facts.serving.DockerImageId, [""]) is None  # or inspect's empty line
    assert facts.serving.DockerImageId().command("r/x:$(id)") == (
        "docker image inspect --format '{{.Id}}' 'r/x:$(id)' 2>/dev/null || true")


# --- the commands: every value quoted, the box's paths from layout.py ----------------------------

def test_fact_commands_quote_what_they_are_given():
    hostile = "/srv/a b;rm -rf ~"
    assert facts.system.FileState().command(hostile).count("'/srv/a b;rm -rf ~'") == 6
    assert facts.box.FreeDiskGiB().command(hostile).startswith("p='/srv/a b;rm -rf ~'; ")
    assert "inspect --format '{{json .Config.Labels}}' 'r/x:$(id)' " in \
        facts.serving.DockerImageLabels().command("r/x:$(id)")
    weights = facts.serving.WeightsState().command(hostile, "a" * 40)
    assert f"verify --dir '/srv/a b;rm -rf ~' --revision {'a' * 40}" in weights
    served = facts.serving.ServerState().command("x;y", 8002, chat=True)
    assert "state --service 'x;y' --port 8002 --chat" in served


def test_fact_commands_take_the_box_paths_from_the_layout():
    weights = facts.serving.WeightsState().command("/m", "a" * 40)
    # the check is stdlib only: the box's own python3, nothing installed for it
    assert weights.startswith(f"if [ -f {layout.BOX_WEIGHTS} ]; then python3 {layout.BOX_WEIGHTS} "
                              "verify ")
    served = facts.serving.ServerState().command("thorfleet-vllm", 8002)
    # the tool reads its paths from the layout file: without it there is nothing to ask yet
    assert served.startswith(f"if [ -f {layout.BOX_SERVE} ] && [ -f {layout.BOX_LAYOUT_ENV} ]; ")
    assert facts.box.RebootMarker.command == f"! test -e {layout.BOX_REBOOT_MARKER} || echo yes"


def test_weights_and_server_state_read_the_tools_last_line():
    assert parse(facts.serving.WeightsState, ["thorfleet-weights: noise",
                                      '{"complete": true, "problems": []}']) == {
        "complete": True, "problems": []}
    assert parse(facts.serving.ServerState, ["{}"]) == {}
    # the tools not installed yet: nothing printed, so each fact's default
    assert facts.serving.WeightsState().default() == {"complete": False,
                                              "problems": ["thorfleet tools not installed"]}
    assert facts.serving.ServerState().default() == {}
    assert facts.serving.Leftovers().default() == {"dirs": [], "images": [], "contexts": []}


def test_pinned_weights_counts_the_folders_and_their_staging_on_a_real_disk(tmp_path):
    model, draft = tmp_path / "M" / ("a" * 40), tmp_path / "E" / ("b" * 40)
    model.mkdir(parents=True)
    (model / "consolidated-00001.safetensors").write_bytes(b"\1" * (3 << 20))
    staging = tmp_path / "M" / f".{'a' * 40}.partial"  # a download that was cut
    staging.mkdir()
    (staging / "consolidated-00002.safetensors").write_bytes(b"\1" * (1 << 20))
    (tmp_path / "M" / ("c" * 40)).mkdir()  # another revision: not the pinned one, not counted
    (tmp_path / "M" / ("c" * 40) / "x").write_bytes(b"\1" * (5 << 20))
    command = facts.serving.PinnedWeightsGiB().command([str(model), str(draft)])  # no draft yet
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    gib = facts.serving.PinnedWeightsGiB().process(out.splitlines())
    assert 4 <= gib * 1024 < 4.2, gib * 1024


def test_every_facts_command_names_its_arguments():
    # pyinfra hands a fact its arguments by the names in its command's signature: *args or
    # **kwargs there receive nothing it can call the command with (a read alone then crashes)
    import inspect

    from pyinfra.api import FactBase

    from thorfleet import facts as module

    for fact in vars(module).values():
        if isinstance(fact, type) and issubclass(fact, FactBase) and callable(
                getattr(fact, "command", None)):
            kinds = {p.kind for p in inspect.signature(fact.command).parameters.values()}
            assert not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}, \
                fact.__name__


def test_tree_state_reads_owners_and_what_is_not_a_file_on_this_machine(tmp_path):
    import subprocess

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a").write_text("a\n")
    (tmp_path / "b").write_text("b\n")
    (tmp_path / "b").chmod(0o755)
    (tmp_path / "link").symlink_to(tmp_path / "b")
    # what python3 writes beside the box's package when a program imports it: not the package's
    # (breaks with: the cache listed, so the package is re-sent and its watchdog restarted each run)
    (tmp_path / "sub" / "__pycache__").mkdir()
    (tmp_path / "sub" / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\0")
    out = subprocess.run(["sh", "-c", facts.system.TreeState().command(str(tmp_path))],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    tree = parse(facts.system.TreeState, out)
    owner = subprocess.run(["stat", "-c", "%U:%G", str(tmp_path / "b")], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert tree == {
        "sub/a": {"mode": "644", "owner": owner,
                  "sha256": "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7"},
        "b": {"mode": "755", "owner": owner,
              "sha256": "0263829989b6fd954f72baaf2fc64bc2e2f01d692d4de72986ea808f6e99813f"},
        "link": {"type": "other"}}
