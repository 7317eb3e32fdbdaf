"""A setting to the box, and a client's key to the door, each cross at most seven files, never
going back to one they left (python -m tests.walk, whose rule is docs/layout.md's).

The edits that break these (each tried once): operations/files.secret_file a function again
(the key enters files.py as the task plans, then again as the operation runs: 7 files, 1
return); the watchdog's unit rendered into tasks/watch.py's hands again (whole_file with
settings.render(...) as its src: 8 files); the walker never ending a visit (no return counted).
"""

import importlib.util
import re

import pytest

from tests import walk

DOCS = (walk.ROOT / "docs" / "layout.md").read_text()
STEP = re.compile(r"^ *\d+\. ([^:]+):", re.MULTILINE)  # a walk's step: its file


# Where each value takes effect: the watchdog reads the inventory's interval from the unit the
# deploy wrote, with its own parser; the door's map, written whole, holds the key's digest. A walk
# that lost the value on the way would end short of it.
@pytest.mark.parametrize("value, lands", [
    ("watchdog_interval_s", "files/thor/bin/thorfleet-watchdog"),
    ("client_key", "thorfleet/operations/files.py")])
def test_a_value_crosses_at_most_seven_files_and_never_goes_back(value, lands, tmp_path):
    followed = getattr(walk, value)(tmp_path)
    assert followed.files()[-1] == str(walk.ROOT / lands), followed.report()
    assert len(followed.files()) <= 7 and followed.returns() == [], followed.report()
    # docs/layout.md shows this walk as the command prints it: the same files, in this order
    shown = DOCS.split(f"$ python -m tests.walk {value} ", 1)[1].split("\n$", 1)[0]
    shown = shown.split("\n```", 1)[0]
    assert STEP.findall(shown) == STEP.findall(followed.report()), shown


HOUSE = """
def hands_on(value):  # a frame of the house's holds it, then ends
    return inner(value)

def inner(value):  # called by a running frame of the same file: the same visit
    return value
"""


def test_a_return_is_counted(tmp_path):
    """The walker's own rule: the value back in a file after every frame of it that held it
    ended is a return; a callee or callback of a running frame is the same visit."""
    path = tmp_path / "house.py"
    path.write_text(HOUSE)
    spec = importlib.util.spec_from_file_location("house", path)
    house = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(house)
    steps = walk.Walk(forms=(7919,))
    steps.counts = lambda filename: filename == str(path)
    with steps.following():
        house.hands_on(7919)
    assert (steps.files(), steps.returns()) == ([str(path)], [])
    with steps.following():
        house.hands_on(7919)
    assert steps.returns() == [str(path)], steps.report()
