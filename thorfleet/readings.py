"""How thorfleet reads what a Thor prints: the one parser of each output, for both sides.

Stdlib only. The laptop's facts import it as `thorfleet.readings`; on the box it is copied beside
the watchdog as `thorfleet_readings.py` (layout.BOX_READINGS), so the box and the laptop read a
power mode, a clock lock or a metric one way.
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
    kinds = {"cpu": [], "gpu": []}
    for line in lines:
        freqs = re.search(r"MinFreq=(\d+)\s+MaxFreq=(\d+)", line)
        name = line.strip().split(" ", 1)[0].rstrip(":").lower()
        if not freqs:
            continue
        if re.fullmatch(r"cpu\d+", name):
            kinds["cpu"].append(freqs)
        elif name.startswith("gpu"):  # "gpu-gpc-0", "gpu-nvd-0" (Thor) or "GPU" (Orin)
            kinds["gpu"].append(freqs)
    # no GPU line read is not "locked": a format we do not know must not pass as locked
    return all(kinds.values()) and all(
        f.group(1) == f.group(2) for found in kinds.values() for f in found)


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
