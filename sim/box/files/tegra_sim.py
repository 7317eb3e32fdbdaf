"""State of the simulated Thor's power mode and clocks, shared by the nvpmodel and jetson_clocks
stand-ins. Where a real box keeps state, this keeps it too:

- the power mode in /var/lib/nvpmodel/status (`pmode:0001 fmode:quiet`), on disk: survives reboot;
- the jetson_clocks lock in /run/jetson_clocks (tmpfs): lost on reboot, and reset by a mode change.
"""

import json
import os
import re
import sys
from pathlib import Path

CONF = Path("/etc/nvpmodel.conf")
STATUS = Path("/var/lib/nvpmodel/status")
CLOCKS = Path("/run/jetson_clocks/state.json")
CPU_MIN_FREQ = 972000        # kHz, the DVFS floor of every mode (illustrative)
GPU_MIN_FREQ = 306000000     # Hz, gpu-gpc-0's floor (illustrative)
NVD_MIN_FREQ = 345600000     # Hz, gpu-nvd-0's floor (illustrative)
# EMC as a locked Thor printed it: MinFreq stays below MaxFreq even when locked (docs/facts.md
# "Thor realities").
EMC_MIN_FREQ = 665600000
EMC_MAX_FREQ = 4266000000
CPU_COUNT = 14               # Thor T5000: 14 Neoverse V3AE cores


def load_modes(conf: Path = CONF) -> tuple[dict, int]:
    """Parse nvpmodel.conf: {id: {"name", "cpu_max", "gpu_max", "nvd_max", "tpc_mask"}}, default id."""
    modes, default, current = {}, None, None
    for line in conf.read_text().splitlines():
        line = line.strip()
        if match := re.fullmatch(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=(\S+)\s*>", line):
            current = modes.setdefault(int(match[1]), {"name": match[2]})
        elif match := re.fullmatch(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>", line):
            default, current = int(match[1]), None
        elif line.startswith("<"):
            current = None
        elif current is not None and line and not line.startswith("#"):
            param, arg, value = line.split()
            key = {("CPU_ALL", "MAX_FREQ"): "cpu_max", ("GPU", "MAX_FREQ"): "gpu_max",
                   ("GPU_NVD", "MAX_FREQ"): "nvd_max",
                   ("GPU_POWER_CONTROL", "TPC_PG_MASK"): "tpc_mask"}.get((param, arg))
            if key:
                current[key] = int(value)
    return modes, default


def read_status() -> dict:
    """{"pmode": int or None, "fmode": str or None} from the status file."""
    status = {"pmode": None, "fmode": None}
    if STATUS.exists():
        for field in STATUS.read_text().split():
            key, _, value = field.partition(":")
            if key == "pmode":
                status["pmode"] = int(value)
            elif key == "fmode":
                status["fmode"] = value
    return status


def write_status(pmode: int, fmode: str | None) -> None:
    STATUS.parent.mkdir(parents=True, exist_ok=True)
    text = f"pmode:{pmode:04d}" + (f" fmode:{fmode}" if fmode else "")
    tmp = STATUS.with_suffix(".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, STATUS)


def current_mode() -> tuple[int, dict]:
    modes, default = load_modes()
    pmode = read_status()["pmode"]
    if pmode not in modes:
        pmode = default
    return pmode, modes[pmode]


def read_clocks() -> dict:
    """The jetson_clocks lock: {"locked": bool, "fan_max": bool}."""
    if CLOCKS.exists():
        return json.loads(CLOCKS.read_text())
    return {"locked": False, "fan_max": False}


def write_clocks(locked: bool, fan_max: bool) -> None:
    if not locked and not fan_max:
        CLOCKS.unlink(missing_ok=True)
        return
    CLOCKS.parent.mkdir(parents=True, exist_ok=True)
    CLOCKS.write_text(json.dumps({"locked": locked, "fan_max": fan_max}) + "\n")


def require_root(message: str) -> None:
    if os.geteuid() != 0:
        print(message, file=sys.stderr)
        sys.exit(1)
