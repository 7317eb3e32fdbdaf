"""The memory gate on a temporary /proc: its threshold comes from the server's own setting."""

import subprocess

from tests.helpers import ROOT

GATE = ROOT / "files" / "thor" / "bin" / "memory-gate"
KIB_PER_GIB = 1 << 20


def fake_proc(tmp_path, total_gib, available_gib, cached_gib=0.0):
    (tmp_path / "sys" / "vm").mkdir(parents=True)
    (tmp_path / "sys" / "vm" / "drop_caches").write_text("0\n")
    lines = {"MemTotal": total_gib, "MemFree": available_gib, "MemAvailable": available_gib,
             "Cached": cached_gib}
    (tmp_path / "meminfo").write_text(
        "".join(f"{key}: {int(gib * KIB_PER_GIB)} kB\n" for key, gib in lines.items()))
    return tmp_path


def gate(proc, *args):
    argv = ["sh", str(GATE), "--proc", str(proc), "--gpu-memory-utilization", "0.72",
            "--margin-gib", "7", "--timeout", "0", "--interval", "1", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_threshold_is_utilization_times_memtotal_plus_margin(tmp_path):
    done = gate(fake_proc(tmp_path, 122, 119.5))
    assert done.returncode == 0, done.stderr
    # 0.72 x 122 + 7 = 94.84: the seed's 95 GiB, derived from the setting vLLM checks
    assert "119.5 GiB available > 94.8 GiB (gpu_memory_utilization 0.72 x MemTotal 122.0" in done.stdout
    assert (tmp_path / "sys" / "vm" / "drop_caches").read_text() == "3\n"


def test_held_memory_fails_naming_both_numbers_and_the_cause(tmp_path):
    done = gate(fake_proc(tmp_path, 122, 58.2, cached_gib=0.3))
    assert done.returncode == 1
    assert "only 58.2 GiB available after 0s, need more than 94.8 GiB" in done.stderr
    assert "page cache is down to 0.3 GiB, so memory is held by processes" in done.stderr


def test_an_explicit_threshold_wins(tmp_path):
    done = gate(fake_proc(tmp_path, 122, 58.2), "--min-gib", "50")
    assert done.returncode == 0, done.stderr
    assert "> 50 GiB (memory_min_available_gib)" in done.stdout


def test_a_bigger_utilization_needs_more(tmp_path):
    proc = fake_proc(tmp_path, 122, 100)
    assert gate(proc).returncode == 0
    argv = ["sh", str(GATE), "--proc", str(proc), "--gpu-memory-utilization", "0.9",
            "--margin-gib", "7", "--timeout", "0", "--interval", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 1 and "need more than 116.8 GiB" in done.stderr
