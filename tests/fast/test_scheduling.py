"""How the stories are handed to pytest-xdist's workers (tests/conftest.py
pytest_xdist_make_scheduler), run for real: a pytest of its own with four workers, on groups of
stand-in tests that record which worker ran them."""

import os
import subprocess
import sys

from tests.helpers import ROOT

# In queue order, as GROUP_ORDER puts the stories: the longest first, a one-test group among them
# (thor-13+14 is one story), the next long one, the short ones last.
GROUPS = [("one-long-test", 1, 2.0), ("a", 3, 0.3), ("b", 3, 0.3), ("c", 3, 0.3),
          ("next-long", 2, 0.5), ("short", 1, 0.1)]

CONFTEST = "from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n"


def stories():
    lines = ["import os, time", "import pytest", "",
             "def record(group):",
             "    with open(os.environ['RECORD'], 'a') as out:",
             "        out.write(f\"{os.environ['PYTEST_XDIST_WORKER']} {group}\\n\")", ""]
    for group, count, seconds in GROUPS:
        for index in range(count):
            lines += [f"@pytest.mark.xdist_group({group!r})",
                      f"def test_{group.replace('-', '_')}_{index}():",
                      f"    record({group!r})", f"    time.sleep({seconds})", ""]
    return "\n".join(lines)


def test_a_one_test_groups_worker_takes_a_short_group_next_not_the_next_long_one(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_groups.py").write_text(stories())
    record = tmp_path / "record"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "4",
         "--dist", "loadgroup", "--no-loadscope-reorder", "test_groups.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "RECORD": str(record), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {}
    for line in record.read_text().splitlines():
        worker, group = line.split()
        ran.setdefault(group, set()).add(worker)
    assert all(len(workers) == 1 for workers in ran.values()), ran  # a group stays on one worker
    # the one-test group's worker needs a next group before it can start its test: it gets the
    # short one, and the next long group goes to whichever worker frees first
    assert ran["short"] == ran["one-long-test"], ran
    assert ran["next-long"] != ran["one-long-test"], ran
