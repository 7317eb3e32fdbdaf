"""The README is the operator's, and short; the docs hold the rest, and every tunable is in them.

- docs/settings.md's table is the schema's, setting for setting;
- the README stays at most 300 lines;
- every relative link in the README and the docs names a file of the repository (and, with an
  anchor, a heading of that file);
- every shell command the README shows parses (`bash -n`), and every Python block compiles.
"""

import re
import subprocess

import pytest

from tests.readme_table import ROOT, readme_with_table

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "README.md",
         ROOT / "sim" / "README.md", ROOT / "CHANGELOG.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_settings_table_is_the_schemas():
    settings = (ROOT / "docs" / "settings.md").read_text()
    assert settings == readme_with_table(settings), "run: python -m tests.readme_table"


def test_every_group_data_change_has_a_comment():
    for line in (ROOT / "group_data" / "all.py").read_text().splitlines():
        if re.match(r"^\w+ = ", line):
            assert "  # " in line, f"no one-line comment: {line}"


def test_the_readme_is_at_most_300_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= 300, f"README.md is {lines} lines: move the reference to docs/"


def anchors(path):
    """GitHub's anchors for the headings of a Markdown file."""
    found = set()
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_exists(page):
    missing = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        known = where.exists() and ROOT in where.parents and not (
            anchor and where.suffix == ".md" and anchor not in anchors(where))
        if not known:
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)}: links to nothing: {missing}"


def test_nothing_points_outside_the_repository():
    for page in PAGES:
        assert "../shared" not in page.read_text(), page


def blocks(kind):
    return re.findall(rf"^ *```{kind}\n(.*?)^ *```$", README.read_text(), re.MULTILINE | re.DOTALL)


def test_every_shell_command_in_the_readme_parses():
    shown = blocks("sh")
    assert len(shown) >= 5
    for block in shown:
        script = "\n".join(line.strip() for line in block.splitlines())
        done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, (script, done.stderr)


def test_every_python_block_in_the_readme_compiles():
    shown = blocks("python")
    assert len(shown) >= 2
    for block in shown:
        lines = block.splitlines()
        indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
        compile("\n".join(line[indent:] for line in lines), "README.md", "exec")
