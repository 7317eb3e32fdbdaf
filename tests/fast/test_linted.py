"""Every Python program in the repository is read by ruff: the ones without a `.py` name (run by
name on a box, a gateway or the sim's boxes) are listed in pyproject.toml's extend-include, or
ruff never opens them. The edit that breaks it: a stand-in dropped from that list."""

import subprocess

import tomllib

from tests.helpers import ROOT


def python_programs_without_the_extension() -> set[str]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    found = set()
    for name in tracked:
        path = ROOT / name
        if path.suffix or not path.is_file():
            continue
        first = path.read_bytes()[:64].split(b"\n", 1)[0]
        if first.startswith(b"#!") and b"python" in first:
            found.add(name)
    return found


def test_every_python_program_is_linted():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"][
        "extend-include"])
    programs = python_programs_without_the_extension()
    assert {"files/thor/bin/thorfleet-watchdog", "sim/box/files/nvpmodel"} <= programs  # it finds them
    assert programs - listed == set(), "add them to [tool.ruff] extend-include in pyproject.toml"
