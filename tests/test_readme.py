"""Every tunable is documented: the README's table matches group_data/all.py line for line."""

import re

import pytest

from tests.readme_table import ROOT, readme_with_table

pytestmark = pytest.mark.fast


def test_readme_table_matches_group_data():
    readme = (ROOT / "README.md").read_text()
    assert readme == readme_with_table(readme), "run: python -m tests.readme_table"


def test_every_group_data_key_has_a_comment():
    for line in (ROOT / "group_data" / "all.py").read_text().splitlines():
        if re.match(r"^\w+ = ", line):
            assert "  # " in line, f"no one-line comment: {line}"
