"""`python -m thorfleet bench`'s decisions (thorfleet/cli/bench.py): which runs, the door's URL as
a box reaches it, the box's command, what the operator reads back; and `run_all` whole, with a
client's key, each run's command run here as a box's shell runs it (docker and vLLM stood in): the
key reaches vLLM and nothing else, and a run stopped early leaves nothing behind. The run itself,
vLLM's own benchmark through the door, is tests/fleet/test_workloads.py's.

The edits that break them: the key written into the box's command line (`OPENAI_API_KEY=...`
before the command run_all sends), onto docker's words (`-e OPENAI_API_KEY=...`) or into the
container's configuration (`-e OPENAI_API_KEY` from the shell's environment, or an --env-file: what
`docker inspect` shows); a signal left out of the traps (HUP: the folder and the container
outlive the SSH session) or docker run in the foreground (the traps wait for it); a URL the door's
certificate does not name; `head` reading the key's line (it swallows the CA that follows on
stdin); the queue counted against the whole fleet's slots rather than the model's own boxes.
"""

import hashlib
import io
import itertools
import json
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fast.test_gateway_render import inventory, planned
from thorfleet.__main__ import main
from thorfleet.cli import bench
from thorfleet.plan import settings_for_inventory

KEY = "sk-bench-0123456789abcdef"


def door(**values):
    data = {"gateway_port": 8443, "gateway_virtual_ip": None, "own_address": "10.0.0.9",
            "names": ["gw.lab"], "gateway_names": [], "name": "gw-1"}
    return SimpleNamespace(**{**data, **values})


@pytest.mark.parametrize("values, url, add_host", [
    ({"gateway_virtual_ip": "10.0.0.50/24", "names": ["10.0.0.50", "10.0.0.9"]},
     "https://10.0.0.50:8443", None),
    ({"names": ["10.0.0.9"]}, "https://10.0.0.9:8443", None),
    ({"names": ["127.0.0.1", "door.lab"], "gateway_names": ["door.lab"]},
     "https://door.lab:8443", "door.lab:10.0.0.9"),
    ({"own_address": "fd00::9", "names": ["fd00::9"]}, "https://[fd00::9]:8443", None),
])
def test_the_door_is_asked_at_an_address_its_certificate_names(values, url, add_host):
    assert bench.door_for_boxes(door(**values)) == (url, add_host)


def test_the_certificate_names_the_address_the_boxes_reach_the_gateway_at(tmp_path):
    """The laptop reaches the gateway at one address (ssh_hostname: the sim's published port on
    127.0.0.1, or a management network) and the boxes at another (gateway_fleet_address): the
    door's certificate names both, so `bench` asks the door from a box without a gateway_names
    of the operator's (`python -m sim up --gateway` writes such an inventory)."""
    inv = inventory(tmp_path, gateway_hosts=[("gw-1", {
        "ssh_hostname": "127.0.0.1", "gateway_fleet_address": "172.18.0.9"})])
    g = settings_for_inventory(inv)["gw-1"].gateway_role
    assert g.names == ["127.0.0.1", "172.18.0.9"]
    assert bench.door_for_boxes(g) == (f"https://172.18.0.9:{g.gateway_port}", None)


def test_a_door_whose_certificate_names_no_address_a_box_uses_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="add 10.0.0.9, or a DNS name for it, to gateway_names"):
        bench.door_for_boxes(door(names=["127.0.0.1"]))


def test_each_model_shape_and_concurrency_is_a_run():
    runs = bench.plan(["m", "m-256k"], {"jetson-ai-lab": bench.PRESETS["jetson-ai-lab"]})
    assert [(r.model, r.input_len, r.output_len, r.concurrency, r.prompts) for r in runs] == [
        ("m", 2048, 128, 1, 16), ("m", 2048, 128, 8, 16),
        ("m-256k", 2048, 128, 1, 16), ("m-256k", 2048, 128, 8, 16)]


def test_the_box_command_runs_vllms_own_flags():
    run = bench.Run("mistral-small-4", "custom", 16, 8, 2, 4)
    command = bench.box_command(run, "https://door.lab:8443", "door.lab:10.0.0.9", "img:1",
                                "/opt/models/m", goodput=("ttft:500",))
    words = shlex.split(command)
    assert words[:3] == ["sudo", "-n", "sh"]
    script = words[-1]
    docker = shlex.split(script.split(" docker run ", 1)[1].split(" >&2", 1)[0])
    vllm = docker[docker.index("vllm"):]
    assert docker[docker.index("vllm") - 5:docker.index("vllm")] == [
        "img:1", "sh", "-c", bench._KEY_FROM_STDIN, "sh"]
    assert vllm[:3] == ["vllm", "bench", "serve"]
    flags = dict(itertools.pairwise(vllm))
    assert flags["--max-concurrency"] == "2" and flags["--num-prompts"] == "4"
    assert flags["--random-input-len"] == "16" and flags["--random-output-len"] == "8"
    assert flags["--goodput"] == "ttft:500"
    assert dict(itertools.pairwise(docker))["--add-host"] == "door.lab:10.0.0.9"


# docker and vLLM stood in, run here as the box's shell runs them. docker: `run` records what the
# container's configuration would hold (its words, -e, --env-file's contents: what `docker inspect`
# shows) and runs the container's command here, /out its -v folder; `rm -f NAME` stops it.
FAKE_DOCKER = r"""#!{python}
import json, os, signal, subprocess, sys
from pathlib import Path
log = Path({log!r})
args = sys.argv[1:]
if args[:2] == ["rm", "-f"]:
    with (log / "removed").open("a") as f:
        f.write(args[2] + "\n")
    pid = log / "containers" / args[2]
    if pid.exists():
        os.killpg(int(pid.read_text()), signal.SIGKILL)
    sys.exit(0)
assert args[0] == "run", args
valued = {{"--name", "--runtime", "--network", "--add-host", "-e", "--env", "--env-file", "-v",
          "--volume", "--entrypoint", "-u", "--user"}}
env, env_files, out, name, i = {{}}, {{}}, None, None, 1
while args[i].startswith("-"):
    if args[i] not in valued:
        i += 1
        continue
    option, value = args[i], args[i + 1]
    i += 2
    if option in ("-e", "--env") and "=" in value:
        env[value.partition("=")[0]] = value.partition("=")[2]
    elif option in ("-e", "--env") and value in os.environ:  # NAME alone: docker's own value
        env[value] = os.environ[value]
    elif option == "--env-file":
        env_files[value] = Path(value).read_text()
        env.update(line.split("=", 1) for line in env_files[value].splitlines() if "=" in line)
    elif option in ("-v", "--volume") and value.endswith(":/out"):
        out = value[:-len(":/out")]
    elif option == "--name":
        name = value
with (log / "docker.jsonl").open("a") as f:
    f.write(json.dumps({{"argv": sys.argv, "env": env, "env_files": env_files, "name": name,
                        "own_env": dict(os.environ)}}) + "\n")
container = subprocess.Popen(args[i + 1:], start_new_session=True,
                             env={{"PATH": os.environ["PATH"], "OUT": out, **env}})
if name:  # what `docker rm -f NAME` stops
    (log / "containers").mkdir(exist_ok=True)
    (log / "containers" / name).write_text(str(container.pid))
sys.exit(container.wait())
"""
# vLLM's `vllm bench serve`: what reached it (a digest of its key, the CA), every process's command
# line read while it runs (the whole pipeline is alive then), and a result as vLLM writes it.
FAKE_VLLM = r"""#!{python}
import glob, hashlib, json, os, sys, time
from pathlib import Path
log, out = Path({log!r}), Path(os.environ["OUT"])
key = os.environ.get("OPENAI_API_KEY", "")
shown = []
for path in glob.glob("/proc/[0-9]*/cmdline"):
    try:
        words = Path(path).read_bytes()
    except OSError:
        continue
    if key and key.encode() in words:
        shown.append(words.replace(b"\0", b" ").decode(errors="replace"))
flags = dict(zip(sys.argv[3::1], sys.argv[4::1]))
ca = Path(os.environ["SSL_CERT_FILE"].replace("/out/", str(out) + "/")).read_text()
with (log / "vllm.jsonl").open("a") as f:
    f.write(json.dumps({{"argv": sys.argv, "key_sha": hashlib.sha256(key.encode()).hexdigest(),
                        "shown": shown, "ca": ca[:11], "pid": os.getpid()}}) + "\n")
while (log / "hold").exists():  # a run stopped while it benchmarks
    time.sleep(0.05)
n = int(flags["--num-prompts"])
(out / "result.json").write_text(json.dumps({{
    "model_id": flags["--model"], "max_concurrency": int(flags["--max-concurrency"]),
    "num_prompts": n, "completed": n, "failed": 0, "output_throughput": 10.0,
    "median_ttft_ms": 50.0, "p99_ttft_ms": 60.0, "median_tpot_ms": 20.0, "p99_tpot_ms": 21.0,
    "median_itl_ms": 20.0, "p99_itl_ms": 22.0}}))
"""
# sudo -n: runs the command as is (the test runs as whoever it is), its words recorded.
FAKE_SUDO = """#!/bin/sh
printf '%s\\n' "$*" >> {log}/sudo
[ "$1" = -n ] && shift
exec "$@"
"""


class Box:
    """A Thor stood in by this machine: bench's `run` gives the command to sh here, as SSH gives
    it to the box's shell; its /tmp is `box-tmp`."""

    def __init__(self, tmp_path):
        self.bin, self.log, self.tmp = (tmp_path / n for n in ("bin", "log", "box-tmp"))
        for folder in (self.bin, self.log, self.tmp):
            folder.mkdir()
        for name, text in (("docker", FAKE_DOCKER), ("vllm", FAKE_VLLM), ("sudo", FAKE_SUDO)):
            (self.bin / name).write_text(text.format(python=sys.executable, log=str(self.log)))
            (self.bin / name).chmod(0o755)
        self.env = {"PATH": f"{self.bin}:/usr/bin:/bin", "TMPDIR": str(self.tmp)}
        self.commands = []

    def run(self, host, command, timeout, stdin=b""):
        self.commands.append(command)
        done = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True,
                              timeout=timeout, check=False, env=self.env)
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    def records(self, name):
        path = self.log / name
        return ([json.loads(line) for line in path.read_text().splitlines()]
                if path.exists() else [])


MIXED = [("thor-1", {"ssh_hostname": "10.0.0.1"}), ("thor-2", {"ssh_hostname": "10.0.0.2"}),
         ("thor-3", {"ssh_hostname": "10.0.0.3", "service_profile": "no-eagle"})]


@pytest.fixture
def bench_run(tmp_path):
    """`run_all` over a fleet of two EAGLE boxes and one long-context box, a client's key (fresh:
    seen nowhere else on this machine), each run on the stood-in box: (box, key, bench.json)."""
    key = secrets.token_hex(24)
    key_file = tmp_path / "alice.key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    inv = inventory(tmp_path, gateway_data={"gateway_clients": {"alice": str(key_file)}},
                    thor_hosts=MIXED)
    settings = planned(inv)  # the fleet CA, made as a deploy makes it: the runs send it
    box = Box(tmp_path)
    err = io.StringIO()
    code = bench.run_all(inv, settings, tmp_path / "out", client="alice", run=box.run, err=err,
                         shapes={"custom": (16, 8, (1, 2), 4)})
    assert code == 0, err.getvalue()
    return box, key, json.loads((tmp_path / "out" / "bench.json").read_text())["runs"]


def test_the_key_reaches_vllm_and_no_command_line_file_or_container_config(bench_run):
    box, key, runs = bench_run
    assert len(runs) == 4 and len(box.commands) == 4
    # it got there: vLLM's environment holds it, and the CA that followed it on stdin
    seen = box.records("vllm.jsonl")
    assert [(r["key_sha"], r["ca"]) for r in seen] == [
        (hashlib.sha256(key.encode()).hexdigest(), "-----BEGIN ")] * 4
    # ...and nothing else did: no process's words while vLLM ran (the box's shell, sudo, docker,
    # the container's shell, vLLM), not the SSH command, not sudo's or docker's words
    assert [r["shown"] for r in seen] == [[]] * 4
    assert not [c for c in box.commands if key in c]
    assert key not in (box.log / "sudo").read_text()
    for call in box.records("docker.jsonl"):
        assert not [w for w in call["argv"] if key in w], call["argv"]
        # what `docker inspect` shows as Config.Env: -e and --env-file give it, stdin does not
        assert key not in json.dumps([call["env"], call["env_files"]]), call
        assert key not in json.dumps(call["own_env"])
    # no file the run left on the box holds it: its folder is gone
    assert list(box.tmp.iterdir()) == []
    assert not [r for r in runs if key in json.dumps(r)]


def test_what_queued_is_counted_against_each_models_own_boxes(bench_run):
    _, _, runs = bench_run
    assert [(r["model_id"], r["max_concurrency"], r["box_slots"], r["queued"]) for r in runs] == [
        ("mistral-small-4", 1, 2, 0), ("mistral-small-4", 2, 2, 0),
        ("mistral-small-4-256k", 1, 1, 0), ("mistral-small-4-256k", 2, 1, 1)]


# The box's shell gets every signal at its default, as sshd starts it. A test run under nohup, or
# in the background of a shell without job control, inherits HUP or INT ignored, and sh cannot
# trap a signal ignored when it started (POSIX, "trap"): the run went on, as no box's would (seen
# once, the tests started under nohup). env execs, so the signal still goes to the shell's pid.
AS_SSHD_STARTS_IT = ("env", "--default-signal=HUP,INT,PIPE,TERM")


@pytest.mark.parametrize("signal_name", ["HUP", "INT", "PIPE", "TERM"])
def test_a_run_stopped_early_leaves_no_folder_and_no_container(tmp_path, signal_name):
    box = Box(tmp_path)
    (box.log / "hold").touch()  # vLLM benchmarks until the container is removed
    run = bench.Run("m", "custom", 16, 8, 1, 1)
    command = bench.box_command(run, "https://10.0.0.9:8443", None, "img:1", "/opt/models/m")
    shell = subprocess.Popen([*AS_SSHD_STARTS_IT, *shlex.split(command)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=box.env)
    try:
        shell.stdin.write(f"{KEY}\n-----BEGIN CERT".encode())
        shell.stdin.close()
        deadline = time.monotonic() + 20
        while not box.records("vllm.jsonl") and time.monotonic() < deadline:
            time.sleep(0.05)
        [started] = box.records("vllm.jsonl")
        assert list(box.tmp.iterdir()), "the run's folder, while it runs"
        shell.send_signal(getattr(signal, f"SIG{signal_name}"))
        assert shell.wait(timeout=20) != 0
    finally:
        shell.kill()
        (box.log / "hold").unlink()
    [call] = box.records("docker.jsonl")
    removed = box.log / "removed"
    assert (removed.read_text().split() if removed.exists() else []) == [call["name"]]
    assert call["name"].startswith(bench.CONTAINER)
    assert list(box.tmp.iterdir()) == []
    assert _gone(started["pid"]), "vLLM still runs: the container was left"


def _gone(pid, within=10.0):
    deadline = time.monotonic() + within
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


def test_what_waited_at_the_door_and_what_failed_is_said():
    result = {"model_id": "m-256k", "max_concurrency": 2, "shape": "custom", "completed": 3,
              "num_prompts": 4, "failed": 1, "output_throughput": 16.5, "median_ttft_ms": 570,
              "p99_ttft_ms": 573, "median_tpot_ms": 57.2, "p99_tpot_ms": 57.3,
              "median_itl_ms": 57.2, "p99_itl_ms": 58.3, "request_goodput": None,
              "box_slots": 1, "queued": bench.queued(2, 1)}
    lines = bench.summary([result])
    assert lines[1].split()[:4] == ["m-256k", "2", "custom", "3/4"]
    assert "m-256k at 2: 1 of 4 requests failed" in lines[2]
    assert lines[3] == ("m-256k at 2: 1 of 2 requests waited at the door at a time: its boxes "
                        "take 1 at once (max_num_seqs)")
    assert bench.queued(8, 16) == 0


def test_bench_draws_the_runs(tmp_path):
    try:  # the extra `plot`: .ci/setup installs it; missing, CI would pass without drawing
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.fail("matplotlib is missing: .ci/setup installs thorfleet's extra `plot` "
                    "(pip install -e '.[test,plot]')", pytrace=False)
    runs = [{"model_id": "m", "shape": "s", "max_concurrency": c, "output_throughput": 30.0 * c,
             "median_ttft_ms": 90.0, "median_tpot_ms": 25.0 + c} for c in (1, 8)]
    assert bench.plot(runs, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("flags, said", [
    (["--preset", "seed", "--num-prompts", "4"], "--preset or the shape flags"),
    (["--preset", "nope"], "--preset is one of seed, jetson-ai-lab, seed-large"),
    (["--max-concurrency", "1,x"], "--max-concurrency 1,x: a number"),
    (["--max-concurrency", "0"], "concurrencies are at least 1"),
])
def test_bad_flags_are_refused_before_any_host_is_touched(tmp_path, capsys, flags, said):
    missing = tmp_path / "not-read.py"  # refused before the inventory is even read
    code = main(["bench", str(missing), "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and said in err, err
