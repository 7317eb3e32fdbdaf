"""How thorfleet reads what a Thor prints: the one parser of each output, for both sides.

Stdlib only. The laptop's facts import it as `thorfleet.box.readings`; on the box the watchdog
imports the same file from the package beside it (`thorfleet_box.readings`, layout.BOX_LIB), so
the box and the laptop read a power mode, a clock lock or a metric one way.
"""

from __future__ import annotations

import math
import re
from pathlib import Path


def power_mode(lines) -> int:
    """The nvpmodel mode id from `nvpmodel -q`: its last line, after any `NVPM WARN` lines and the
    `NV Power Mode: <NAME>` line."""
    return int(lines[-1].strip())


def clocks_locked(lines) -> bool:
    """True when jetson_clocks has pinned every CPU and the GPU: MinFreq == MaxFreq on each `cpuN`
    line and on each GPU line of `jetson_clocks --show`. On Thor the GPU lines are its devfreq
    devices (`gpu-gpc-0`, `gpu-nvd-0`), not a line starting `GPU` as on Orin; EMC's MinFreq differs
    from its MaxFreq even when locked, so EMC is not read (a Thor's `jetson_clocks --show` after
    `jetson_clocks`, as published: tests/fast/test_facts.py)."""
    return locked(clock_lines(lines))


def locked(kinds) -> bool:
    """Whether clock_lines' CPU and GPU lines are all pinned (MinFreq == MaxFreq)."""
    # no GPU line read is not "locked": a format we do not know must not pass as locked
    return all(kinds.values()) and all(
        low == high for found in kinds.values() for low, high in found)


def clock_lines(lines) -> dict[str, list[tuple[int, int]]]:
    """{"cpu": [(MinFreq, MaxFreq) of each `cpuN` line], "gpu": [... of each GPU line]} of
    `jetson_clocks --show`: the lines clocks_locked reads. Both lists filled is the format
    thorfleet knows."""
    kinds = {"cpu": [], "gpu": []}
    for line in lines:
        freqs = re.search(r"MinFreq=(\d+)\s+MaxFreq=(\d+)", line)
        name = line.strip().split(" ", 1)[0].rstrip(":").lower()
        if not freqs:
            continue
        pair = (int(freqs.group(1)), int(freqs.group(2)))
        if re.fullmatch(r"cpu\d+", name):
            kinds["cpu"].append(pair)
        elif name.startswith("gpu"):  # "gpu-gpc-0", "gpu-nvd-0" (Thor) or "GPU" (Orin)
            kinds["gpu"].append(pair)
    return kinds


def power_modes(lines) -> dict[int, str]:
    """{mode id: name} from `nvpmodel -p --verbose`, whose lines carry `POWER_MODEL: ID=n
    NAME=x` (after an `NVPM VERB:` prefix on L4T)."""
    found = {}
    for line in lines:
        mode = re.search(r"POWER_MODEL:\s*ID=(\d+)\s+NAME=(\S+)", line)
        if mode:
            found[int(mode.group(1))] = mode.group(2)
    return found


def power_masks(conf_text: str) -> dict[int, str | None]:
    """{mode id: its GPU power-gating mask (TPC_PG_MASK) or None} of /etc/nvpmodel.conf: a mode
    whose mask differs from the running one's needs a reboot to apply (docs/facts.md "The
    target box")."""
    masks, mode = {}, None
    for line in conf_text.splitlines():
        header = re.match(r"\s*<\s*POWER_MODEL\s+ID=(\d+)", line)
        if header:
            mode = int(header.group(1))
            masks[mode] = None
        elif re.match(r"\s*<", line):
            mode = None
        elif mode is not None:
            setting = re.match(r"\s*\S+\s+TPC_PG_MASK\s+(\S+)", line)
            if setting:
                masks[mode] = setting.group(1)
    return masks


def swaps(proc_swaps_text: str) -> list[dict]:
    """[{"name", "type", "size_kib"}] of /proc/swaps (proc(5): a header line, then Filename, Type,
    Size in KiB, Used, Priority per active swap area)."""
    found = []
    for line in proc_swaps_text.splitlines()[1:]:
        words = line.split()
        if len(words) >= 3 and words[2].isdigit():
            found.append({"name": words[0], "type": words[1], "size_kib": int(words[2])})
    return found


def mem_available_bytes(meminfo_text: str) -> int | None:
    """MemAvailable of /proc/meminfo in bytes (the kernel writes kB, which are KiB), or None when
    the text has no such line."""
    found = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo_text, re.MULTILINE)
    return int(found[1]) * 1024 if found else None


def thermal_zones(root="/sys/class/thermal") -> dict[str, float]:
    """{zone type: degrees Celsius} of every thermal_zone*/ under `root` (the kernel's sysfs ABI,
    Documentation/ABI/testing/sysfs-class-thermal: `type`, and `temp` in millidegrees). A zone that
    cannot be read now (some drivers refuse while their sensor is off) is left out; two zones of
    one type give the hotter reading."""
    found = {}
    for zone in sorted(Path(root).glob("thermal_zone*")):
        try:
            kind = (zone / "type").read_text().strip()
            celsius = int((zone / "temp").read_text().strip()) / 1000
        except (OSError, ValueError):
            continue
        if kind and (kind not in found or celsius > found[kind]):
            found[kind] = celsius
    return found


# vLLM 0.19.0's names (vllm/v1/metrics/loggers.py), each summed over its label sets (engine, model)
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
GENERATED, PROMPTED = "vllm:generation_tokens_total", "vllm:prompt_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
# What moves while a long prompt is prefilled, when the token counters do not (a prefill counts in
# prompt_tokens_total only once it has ended): each chunk the scheduler runs takes KV-cache blocks
# for its tokens (v1/core/sched/scheduler.py allocate_slots: 0.19.0 L746, 0.26.0 L935, 0.33.0
# L1435), and the scheduler's stats go out every step, outputs or not (0.19.0 L1549-1554, usage
# at L1958; 0.26.0 L2434; 0.33.0 L3294), as this gauge (v1/metrics/loggers.py: 0.19.0 L483 and
# L1046, 0.26.0 L562, 0.33.0 L620).
KV_USAGE = "vllm:kv_cache_usage_perc"
# Prompt tokens looked up in the prefix cache, and found there (loggers.py 0.19.0 L505-523): both
# stay 0 while prefix caching is off (v1/core/kv_cache_manager.py get_computed_blocks returns
# before counting). `thorfleet doctor` shows their ratio, the box's hit rate.
PREFIX_QUERIES, PREFIX_HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
# Every name the watchdog reads, by what it tells (`thorfleet doctor` checks the server has them).
VLLM_METRICS = {"running": RUNNING, "waiting": WAITING, "generated": GENERATED,
                "prompted": PROMPTED, "accepted": ACCEPTED, "drafted": DRAFTED, "kv_usage": KV_USAGE,
                "prefix_queries": PREFIX_QUERIES, "prefix_hits": PREFIX_HITS}

# One sample of Prometheus's text exposition format (0.0.4): `name{labels} value [timestamp]` or
# `name value [timestamp]`; a label value is a quoted string that may hold }, spaces and \" .
_SAMPLE = re.compile(r'([A-Za-z_:][A-Za-z0-9_:]*)'
                     r'(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?'
                     r'[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*')


def _value(text):
    # the format's spellings of the special values; Python's float() reads the rest
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    return special[text] if text in special else float(text)


def metric_sums(prometheus_text: str, names) -> dict[str, float]:
    """{name: value summed over its label sets} of every name in `names` that the exposition
    `prometheus_text` has (a name it lacks is absent). `#` lines (HELP, TYPE, comments) and lines
    that are no sample are skipped."""
    wanted = set(names)
    sums = {}
    for line in prometheus_text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        found = _SAMPLE.fullmatch(line.strip())
        if not found or found[1] not in wanted:
            continue
        try:
            value = _value(found[2])
        except ValueError:
            continue
        sums[found[1]] = sums.get(found[1], 0.0) + value
    return sums
