"""`python -m thorfleet bench`'s decisions (thorfleet/cli/bench.py): which runs, the door's URL as
a box reaches it, the box's command (the key never on it), what the operator reads back. The
run itself, vLLM's own benchmark through the door, is tests/fleet/test_workloads.py's.

The edits that break them: the key written into the command line; a URL the door's certificate
does not name; `head` reading the key's line (it swallows the CA that follows on stdin); the
queue not counted against the model's own boxes.
"""

import itertools
import shlex
import subprocess
from types import SimpleNamespace

import pytest

from thorfleet.__main__ import main
from thorfleet.cli import bench

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


def test_a_door_whose_certificate_names_no_address_a_box_uses_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="add 10.0.0.9, or a DNS name for it, to gateway_names"):
        bench.door_for_boxes(door(names=["127.0.0.1"]))


def test_each_model_shape_and_concurrency_is_a_run():
    runs = bench.plan(["m", "m-256k"], {"jetson-ai-lab": bench.PRESETS["jetson-ai-lab"]})
    assert [(r.model, r.input_len, r.output_len, r.concurrency, r.prompts) for r in runs] == [
        ("m", 2048, 128, 1, 16), ("m", 2048, 128, 8, 16),
        ("m-256k", 2048, 128, 1, 16), ("m-256k", 2048, 128, 8, 16)]


def test_the_box_command_takes_the_key_on_stdin_only_and_runs_vllms_own_flags(tmp_path):
    run = bench.Run("mistral-small-4", "custom", 16, 8, 2, 4)
    command = bench.box_command(run, "https://door.lab:8443", "door.lab:10.0.0.9", "img:1",
                                "/opt/models/m", goodput=("ttft:500",))
    assert KEY not in command
    words = shlex.split(command)
    assert words[:3] == ["sudo", "-n", "sh"]
    script = words[-1]
    vllm = shlex.split(script.split(" docker run ", 1)[1].split(" >&2", 1)[0])
    assert vllm[vllm.index("bench") - 2:vllm.index("bench") + 2] == ["img:1", "vllm", "bench",
                                                                     "serve"]
    flags = dict(itertools.pairwise(vllm))
    assert flags["--max-concurrency"] == "2" and flags["--num-prompts"] == "4"
    assert flags["--random-input-len"] == "16" and flags["--random-output-len"] == "8"
    assert flags["--goodput"] == "ttft:500" and flags["--add-host"] == "door.lab:10.0.0.9"
    # the script as the box's shell runs it, docker stood in: the key line, then the CA, land apart
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\nfor a; do case $a in *:/out) d=${a%:/out};; esac; done\n"
                    "printf '{\"seen_env\": \"%s\", \"seen_ca\": \"%s\"}' "
                    "\"$(cat \"$d/env\")\" \"$(head -c 11 \"$d/ca.pem\")\" > \"$d/result.json\"\n")
    fake.chmod(0o755)
    done = subprocess.run(["sh", "-c", script], input=f"OPENAI_API_KEY={KEY}\n-----BEGIN CERT",
                          capture_output=True, text=True, check=False,
                          env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert bench.result_of(done.stdout) == {"seen_env": f"OPENAI_API_KEY={KEY}",
                                            "seen_ca": "-----BEGIN "}


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
    pytest.importorskip("matplotlib")
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
