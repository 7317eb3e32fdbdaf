"""`thorfleet doctor`'s reads and verdicts (issue 38), without a box.

The reads run for real on this machine (a Debian box that is no Thor: each says so); the parsers
read the outputs the real tools print (haproxy -vv, keepalived --version here; nvpmodel's and
jetson_clocks' as published); the verdicts are a table. The edits that break these: a release
check that refuses R39; mode names not compared; swap areas not read; an unreadable zone dropped;
PyTorch's arch list not read; FlashInfer's absence taken as fine; the sudo row forgotten; the
memory row's verdict not compared with preflight_min_memory_gib, or MemTotal read in other units.
"""

import io
import json
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from sim import fleet
from thorfleet import facts
from thorfleet.box import readings
from thorfleet.cli import doctor
from thorfleet.cli.pin import load_inventory
from thorfleet.doctor import ask, rows
from thorfleet.doctor.ask import Answer
from thorfleet.plan import settings_for_inventory
from thorfleet.settings.layout import FILES

REPO = Path(__file__).resolve().parents[2]

SETTINGS = SimpleNamespace(
    preflight_min_l4t_release="38.0", preflight_min_memory_gib=100,
    preflight_min_free_disk_gib=100, weights_dir="/opt/thorfleet/models",
    model_dir="/opt/thorfleet/models/m/" + "a" * 40, draft_dir="/opt/thorfleet/models/d/" + "b" * 40,
    weights_model_revision="a" * 40, weights_draft_revision="b" * 40, power_mode=1,
    power_allow_reboot=False, image_base="ghcr.io/nvidia-ai-iot/vllm@sha256:" + "c" * 64,
    service_docker_gpus="all", service_name="thorfleet-vllm", service_port=8002,
    service_profile="default", prefix_caching=True)

# What a converged Thor answers (the sim's box, as doctor read it)
MODES = {0: "MAXN", 1: "120W", 2: "90W", 3: "70W"}
CONVERGED = {
    "release": "38.2", "memory": 122.0, "disk": 150.0, "present": 71.0, "swaps": [],
    "drop_caches": True, "modes": MODES, "masks": {0: "0", 1: "0", 2: "3", 3: "7"}, "mode": 1,
    "clocks": {"cpu": [(2601000, 2601000)] * 14, "gpu": [(1386000000, 1386000000)] * 2,
               "lines": 22, "locked": True},
    "docker": "28.2.2", "runtimes": ["io.containerd.runc.v2", "nvidia", "runc"], "cdi": None,
    "probe": {"vllm": "0.19.0", "torch": "2.9.0", "flashinfer-python": "0.6.9",
              "torch_cuda": "13.0", "arch_list": ["sm_87", "sm_110"], "capability": [11, 0],
              "device": "NVIDIA Thor"},
    "weights": {"complete": True, "problems": []}, "draft": {"complete": True, "problems": []},
    "kernels": {"active": "active", "marlin": None, "chosen": [],
                "kernels": {"TRITON_MLA attention": "Using TRITON_MLA attention backend",
                            "GEMM": "Using NvFp4LinearBackend.FLASHINFER_CUTLASS for NVFP4 GEMM",
                            "MoE": "Using 'FLASHINFER_CUTLASS' NvFp4 MoE backend"}},
    # the proof's prompt twice (tests/fast/test_prefix_caching.py): 384 of 800 tokens cached
    "metrics": {**{name: 0.0 for name in readings.VLLM_METRICS.values()},
                readings.PREFIX_QUERIES: 800.0, readings.PREFIX_HITS: 384.0},
    "thermal": {"thermal_zone0": {"type": "cpu-thermal", "temp_c": 37.3}},
}


def verdicts(sudo=True, **changed):
    got = {k: Answer(v) for k, v in CONVERGED.items()}
    got.update({k: v if isinstance(v, Answer) else Answer(v) for k, v in changed.items()})
    return {r["check"]: r for r in rows.thor_rows("thor-1", SETTINGS, sudo, got)}


@pytest.mark.parametrize("queries,hits,found,verdict", [
    (0.0, 0.0, "off", "ok"),
    (800.0, 384.0, "off in group data, on in the running server (48% hit rate", "copes"),
])
def test_a_box_with_prefix_caching_off_says_off(queries, hits, found, verdict):
    got = {k: Answer(v) for k, v in CONVERGED.items()}
    got["metrics"] = Answer({**CONVERGED["metrics"], readings.PREFIX_QUERIES: queries,
                             readings.PREFIX_HITS: hits})
    s = SimpleNamespace(**{**vars(SETTINGS), "prefix_caching": False})
    table = {r["check"]: r for r in rows.thor_rows("thor-1", s, True, got)}
    assert table["prefix cache"]["found"].startswith(found)
    assert table["prefix cache"]["verdict"] == verdict


def test_a_converged_thor_is_ok():
    table = verdicts()
    assert {c: r["verdict"] for c, r in table.items() if r["verdict"] != "ok"} == {}
    assert all(set(r) == set(rows.ROW_FIELDS) for r in table.values())
    assert rows.exit_status(list(table.values())) == 0


UNREAD = Answer(error="command not found on the box")
CASES = [
    # (what the box says, the row, its verdict, words of what it found or of the fix)
    ({"release": "39.2"}, "L4T release", "ok", "R39.2"),
    ({"release": "36.4"}, "L4T release", "blocks", "older than R38.0"),
    ({"release": None}, "L4T release", "blocks", "not a Jetson"),
    ({"memory": 62.0}, "memory total", "blocks", "preflight_min_memory_gib"),
    ({"disk": 20.0, "present": 0.0}, "free disk", "blocks", "preflight_min_free_disk_gib"),
    ({"swaps": [{"name": "/dev/zram0", "type": "partition", "size_kib": 8 << 20}]},
     "swap and zram", "copes", "nvzramconfig"),
    ({"drop_caches": False}, "page-cache drop", "blocks", "memory gate"),
    ({"modes": {0: "MAXN", 1: "MAXN_SUPER"}}, "nvpmodel modes", "copes", "mode 1 is MAXN_SUPER"),
    ({"modes": {0: "MAXN", 2: "90W"}}, "nvpmodel modes", "blocks", "offers no mode 1"),
    ({"modes": UNREAD}, "nvpmodel modes", "blocks", "L4T's nvpmodel"),
    ({"mode": 0}, "mode change", "copes", "switches it"),
    ({"mode": 2}, "mode change", "blocks", "power_allow_reboot = True"),
    ({"clocks": {"cpu": [(1, 2)], "gpu": [(3, 3)], "lines": 5, "locked": False}}, "clocks locked", "copes",
     "thorfleet-clocks.service"),
    ({"clocks": {"cpu": [], "gpu": [], "lines": 3, "locked": False}}, "jetson_clocks format", "copes",
     "does not read"),
    ({"runtimes": ["runc"]}, "nvidia runtime", "blocks", "nvidia-ctk runtime configure"),
    ({"runtimes": None}, "nvidia runtime", "blocks", "install JetPack's Docker"),
    ({"docker": None}, "Docker", "blocks", "install JetPack's Docker"),
    ({"probe": None}, "GPU in a container", "not checked yet", "pulls nothing"),
    ({"probe": Answer(error="exit 125: docker: Error response from daemon: unknown or invalid "
                            "runtime name: nvidia")}, "GPU in a container", "blocks", "did not run"),
    ({"probe": {**CONVERGED["probe"], "arch_list": ["sm_80", "sm_90", "sm_100", "sm_120"]}},
     "PyTorch arch list", "blocks", "image built for Thor"),
    ({"probe": {**CONVERGED["probe"], "capability": [8, 7]}}, "GPU in a container", "blocks",
     "not a Thor's GPU"),
    ({"probe": {**CONVERGED["probe"], "capability": None,
                "torch_error": "AssertionError: Torch not compiled with CUDA enabled"}},
     "GPU in a container", "blocks", "sees no GPU"),
    ({"probe": {**CONVERGED["probe"], "flashinfer-python": None}}, "vLLM and FlashInfer",
     "blocks", "the proof refuses"),
    ({"probe": {**CONVERGED["probe"], "flashinfer-python": "0.6.9", "has_flashinfer": False}},
     "vLLM and FlashInfer", "blocks", "the proof refuses"),  # vLLM's own answer wins
    ({"probe": {**CONVERGED["probe"], "flashinfer-python": None, "has_flashinfer": True}},
     "vLLM and FlashInfer", "ok", "present (no version recorded)"),
    ({"probe": {**CONVERGED["probe"], "flashinfer-python": "0.6.8.post1"}}, "vLLM and FlashInfer",
     "copes", "falls back"),
    ({"weights": {"complete": False, "problems": ["thorfleet tools not installed"]}},
     "checkpoint", "not checked yet", "a deploy fetches"),
    ({"draft": {"complete": False, "problems": ["model.safetensors: size differs"]}},
     "EAGLE draft", "copes", "fetches what is missing"),
    ({"kernels": {}}, "kernels", "not checked yet", "once the server runs"),
    ({"kernels": {**CONVERGED["kernels"], "marlin": "marlin_utils_fp4: using Marlin"}},
     "kernels", "blocks", "Marlin"),
    ({"kernels": {**CONVERGED["kernels"],
                  "kernels": {**CONVERGED["kernels"]["kernels"], "MoE": None}}},
     "kernels", "blocks", "no MoE"),
    ({"metrics": None}, "server metrics", "not checked yet", "once the server runs"),
    ({"metrics": {readings.RUNNING: 0.0}}, "server metrics", "blocks", "wedged"),
    ({"metrics": {n: 0.0 for n in readings.VLLM_METRICS.values() if n != readings.KV_USAGE}},
     "server metrics", "copes", "kv_usage"),
    ({}, "prefix cache", "ok", "on; 48% hit rate (384 of 800 prompt tokens cached)"),
    ({"metrics": {**CONVERGED["metrics"], readings.PREFIX_QUERIES: 0.0,
                  readings.PREFIX_HITS: 0.0}}, "prefix cache", "not checked yet",
     "no prompt looked up yet"),
    ({"metrics": {n: 0.0 for n in readings.VLLM_METRICS.values()
                  if n not in (readings.PREFIX_QUERIES, readings.PREFIX_HITS)}},
     "prefix cache", "copes", "no prefix_cache counters"),
    ({"metrics": None}, "prefix cache", "not checked yet", "once the server runs"),
    ({"metrics": {n: 0.0 for n in readings.VLLM_METRICS.values() if n != readings.PREFIX_HITS}},
     "server metrics", "ok", "8 of 9"),  # the counters are the prefix cache row's, not needed
    ({"thermal": {"thermal_zone0": {"type": "cpu-thermal", "temp_c": 37.3},
                  "thermal_zone2": {"type": "soc012-thermal", "error": "No such file"}}},
     "thermal zones", "copes", "thermal_zone2 (soc012-thermal"),
    ({"thermal": {}}, "thermal zones", "copes", "heat alert"),
]


@pytest.mark.parametrize(("changed", "check", "verdict", "words"), CASES,
                         ids=[f"{c[1]}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_each_answer_gets_its_verdict(changed, check, verdict, words):
    found = verdicts(**changed)[check]
    assert found["verdict"] == verdict, found
    assert words in found["found"] + " " + found["fix"], found


def test_without_sudo_the_box_is_blocked_and_a_blocking_row_fails_the_exit():
    table = verdicts(sudo=False)
    assert table["passwordless sudo"]["verdict"] == "blocks"
    assert rows.exit_status(list(table.values())) == 1


def test_a_mode_that_needs_a_reboot_copes_when_the_deploy_may_reboot():
    s = SimpleNamespace(**{**vars(SETTINGS), "power_allow_reboot": True})
    got = {k: Answer(v) for k, v in CONVERGED.items()} | {"mode": Answer(2)}
    found = {r["check"]: r for r in rows.thor_rows("thor-1", s, True, got)}["mode change"]
    assert (found["verdict"], found["fix"]) == (
        "copes", "the deploy reboots the box once (power_allow_reboot is True)")


# --- parsers of the real tools' outputs ---------------------------------------------------------

def test_nvpmodel_modes_and_masks_as_l4t_prints_and_writes_them():
    verbose = ["NVPM VERB: Config file: /etc/nvpmodel.conf",
               "NVPM VERB: parsing done for /etc/nvpmodel.conf",
               "NVPM VERB: POWER_MODEL: ID=0 NAME=MAXN", "NVPM VERB: POWER_MODEL: ID=1 NAME=120W"]
    assert readings.power_modes(verbose) == {0: "MAXN", 1: "120W"}
    conf = (REPO / "sim" / "box" / "files" / "nvpmodel.conf").read_text()
    masks = readings.power_masks(conf)
    # docs/facts.md "The target box": 0 and 1 switch live, 2 needs a reboot
    assert masks[0] == masks[1] != masks[2]


def test_swaps_as_the_kernel_lists_them():
    text = ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
            "/dev/zram0                              partition\t8388604\t\t0\t\t5\n"
            "/var/tmp/swapfile                       file\t\t65532\t\t0\t\t-2\n")
    assert readings.swaps(text) == [
        {"name": "/dev/zram0", "type": "partition", "size_kib": 8388604},
        {"name": "/var/tmp/swapfile", "type": "file", "size_kib": 65532}]
    assert readings.swaps(Path("/proc/swaps").read_text()) == []  # this machine: none


def test_thermal_readings_name_the_zone_that_cannot_be_read():
    found = facts.box.ThermalReadings().process([
        "thermal_zone0 cpu-thermal ok 37300",
        ("thermal_zone1 gpu-thermal error cat: /sys/class/thermal/thermal_zone1/temp: "
        "No data available")])
    assert found == {"thermal_zone0": {"type": "cpu-thermal", "temp_c": 37.3},
                     "thermal_zone1": {"type": "gpu-thermal", "error": "No data available"}}


def test_the_container_probe_answer_and_a_container_that_did_not_run():
    probe = facts.box.ContainerProbe()
    assert probe.process(['{"vllm": "0.19.0", "arch_list": ["sm_110"]}']) == {
        "vllm": "0.19.0", "arch_list": ["sm_110"]}
    assert probe.process([("docker: Error response from daemon: unknown or invalid runtime "
                          "name: nvidia.")]) == {
        "error": "docker: Error response from daemon: unknown or invalid runtime name: nvidia."}
    command = probe.command(SETTINGS.image_base, "all")
    assert "--rm --network none --runtime nvidia --gpus all" in command
    assert "docker pull" not in command  # an image not on the box is not checked, never pulled


def test_the_probes_are_real_files_that_python_compiles_and_the_reads_send_whole():
    for name, path in (("container_probe.py", facts.box.PROBE),
                       ("mirror_probe.py", facts.box.MIRROR_PROBE)):
        source = (Path(FILES) / "doctor" / name).read_text()
        compile(source, name, "exec")
        assert path.read_text() == source
    assert shlex.quote(facts.box.MIRROR_PROBE.read_text()) in facts.box.AptMirror.command()
    assert shlex.quote(facts.box.PROBE.read_text()) in facts.box.ContainerProbe().command(
        SETTINGS.image_base, "all")


def test_haproxy_and_keepalived_as_debian_12_builds_them():
    build = facts.gateway.HaproxyBuild().process(
        subprocess.run(["haproxy", "-vv"], capture_output=True, text=True,
                       check=True).stdout.splitlines())
    assert build["version"].startswith("2.6.")
    version = facts.gateway.KeepalivedVersion().process(
        subprocess.run("keepalived --version 2>&1", shell=True, capture_output=True, text=True,
                       check=False).stdout.splitlines())
    mirror = Answer({"url": "http://deb.debian.org/debian", "ok": True, "said": "HTTP 200"})
    table = rows.gateway_rows("gw-1", True, True, {
        "haproxy": Answer(build), "keepalived": Answer(version), "mirror": mirror})
    assert [(r["check"], r["verdict"]) for r in table] == [
        ("passwordless sudo", "ok"), ("HAProxy", "ok"), ("keepalived", "ok"),
        ("package mirror", "ok")]
    without_ssl = {**build, "lines": [ln for ln in build["lines"] if "OpenSSL" not in ln]}
    table = rows.gateway_rows("gw-1", False, True, {"haproxy": Answer(without_ssl),
                                                   "mirror": mirror})
    assert table[1]["verdict"] == "blocks" and "no OpenSSL" in table[1]["found"]
    # no HAProxy yet and no mirror: the deploy could not install it
    away = Answer({"url": "http://deb.debian.org/debian", "ok": False, "said": "timed out"})
    for build_answer, verdict in ((Answer(build), "copes"), (UNREAD, "blocks")):
        table = rows.gateway_rows("gw-1", False, True, {"haproxy": build_answer, "mirror": away})
        assert table[-1]["verdict"] == verdict, table[-1]


# --- the reads, run for real on this machine ------------------------------------------------------

def test_the_reads_run_here_and_each_says_what_this_machine_is_not():
    queries = ask.thor_queries(SETTINGS)
    script = ask.snapshot.script(list(queries.values()))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120,
                         check=False).stdout
    sudo, got = ask.answers(queries, f"{ask.SUDO_MARK} yes\n{out}")
    assert sudo is True and set(got) == set(queries)
    table = {r["check"]: r for r in rows.thor_rows("this-machine", SETTINGS, sudo, got)}
    assert table["L4T release"]["verdict"] == "blocks"  # no /etc/nv_tegra_release
    assert table["nvpmodel modes"]["found"] == "unread: command not found on the box"
    # this machine's MemTotal, read here apart from the reads, and the one verdict its size gives
    kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:")))
    assert table["memory total"]["found"] == f"{kib / 1024 ** 2:.1f} GiB"
    expected = "blocks" if kib / 1024 ** 2 < SETTINGS.preflight_min_memory_gib else "ok"
    assert table["memory total"]["verdict"] == expected, table["memory total"]
    # and each verdict where it must be: under a threshold above it, and one below it
    for least, verdict in ((kib // 1024 ** 2 + 1, "blocks"), (1, "ok")):
        settings = SimpleNamespace(**{**vars(SETTINGS), "preflight_min_memory_gib": least})
        again = {r["check"]: r for r in rows.thor_rows("this-machine", settings, sudo, got)}
        assert again["memory total"]["verdict"] == verdict, (least, again["memory total"])
    assert table["swap and zram"]["found"] == "none"
    assert table["kernels"]["verdict"] == "not checked yet"  # thorfleet-serve not installed


# --- the command: each host's one command run here, as its shell would ----------------------------

@pytest.fixture
def sim_inventory(tmp_path, monkeypatch):
    """A sim-like inventory of two Thors (sim write_inventory), as `sim up` writes it."""
    monkeypatch.setenv("THORFLEET_SIM_STATE", str(tmp_path / "state"))
    hub = {"endpoint_in_sim": "http://thorfleet-hub:8000",
           "endpoint_local": "http://127.0.0.1:4711",
           "revisions": {fleet.MODEL_REPO: "a" * 40, fleet.DRAFT_REPO: "b" * 40}}
    fleet._record(["thor-1", "thor-2"], "registry:5000/vllm@sha256:" + "c" * 64, hub,
                  own_inventory=False)
    (tmp_path / "state" / "api_key").write_text("sk-doctor-test-key\n")
    (tmp_path / "state" / "api_key").chmod(0o600)
    path = fleet.write_inventory(tmp_path / "sim.py", ["thor-1", "thor-2"], {})
    for name in ("id_ed25519", "known_hosts"):
        (tmp_path / "state" / name).touch()
    found = load_inventory(path)
    return found, settings_for_inventory(found)


def test_doctor_runs_each_hosts_one_command_and_exits_1_naming_what_blocks(sim_inventory):
    hosts, settings = sim_inventory
    asked = []

    def run(host, line, timeout):  # this machine stands for the box: the command as it is
        asked.append((host.name, line))
        if host.name == "thor-2":
            raise OSError("Could not connect ([Errno 111] Connection refused)")
        done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=timeout,
                              check=False)
        return done.returncode, done.stdout, done.stderr

    out, err = io.StringIO(), io.StringIO()
    code = doctor.show(hosts, settings, as_json=True, run=run, out=out, err=err)
    assert code == 1
    found = json.loads(out.getvalue())
    assert all(list(r) == list(rows.ROW_FIELDS) for r in found)
    by = {(r["host"], r["check"]): r for r in found}
    assert by["thor-2", "SSH"]["verdict"] == "blocks"
    assert by["thor-1", "L4T release"]["verdict"] == "blocks"  # this machine is no Jetson
    assert "sk-doctor-test-key" not in "".join(line for _, line in asked)
    assert "thorfleet: thor-2: SSH blocks serving: unreachable: Could not connect" in err.getvalue()
    assert ("thorfleet: thor-1: L4T release blocks serving: no /etc/nv_tegra_release"
            in err.getvalue())
    # the table: one line per row, the verdicts counted in its title
    shown = io.StringIO()
    doctor.show(hosts, settings, only={"thor-1"}, run=run, out=Console(file=shown, width=250),
                err=io.StringIO())
    assert shown.getvalue().startswith("thorfleet doctor: ")
    assert "thor-2" not in shown.getvalue()
