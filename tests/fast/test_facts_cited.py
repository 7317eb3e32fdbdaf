"""Every citation resolves inside the repository (issue 50, item 7): the facts thorfleet relies on
are docs/facts.md, each with its source, and whatever cites them names a section of that page.

- no tracked file cites the facts file that lived outside the repository (CHANGELOG.md's history
  may name it);
- every section cited (`facts.md`, a comma or a Markdown link to it, then the section's name in
  double quotes) is a heading of docs/facts.md: case aside, the cited name is the heading or its
  start, as `docs/facts.md "Thor realities"` cites "Thor realities found since the first
  release";
- every Markdown link to facts.md reaches docs/facts.md, its anchor is a heading's (GitHub's
  slug), and the section quoted after it is that heading.

Fast: text only. Seen failing once each: .ci/setup citing "Thor realites"; sim/README.md's
link to `#the-target-boxes`; tests/fast/test_doctor.py citing the old file again.
"""

import re
import subprocess

from tests.readme_table import ROOT

PAGE = ROOT / "docs" / "facts.md"
OUTSIDE = re.compile(r"FACTS\.md|\bFACTS\b(?=['\" :,)])")  # the old file, and its short form
HISTORY = {"CHANGELOG.md"}
# Strings (not comments) that may still name the old file: none.
KNOWN_STRINGS: dict[str, int] = {}
# `facts.md`, then a Markdown link's target if any, then the quoted section: "...".
CITATION = re.compile(r'facts\.md(?:\]\(([^)\s]*)\))?[,:]?\s+"([^"]{1,120})"')
LINK = re.compile(r"\]\(([^)\s]*facts\.md)(?:#([^)\s]*))?\)")
COMMENT = re.compile(r"^\s*(?:#+|//|/?\*+)?\s*")


def tracked():
    """{path relative to the repository: text} of every tracked text file."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    files = {}
    for name in filter(None, names):
        path = ROOT / name
        if not path.is_file():
            continue
        raw = path.read_bytes()
        if b"\0" in raw:
            continue
        try:
            files[name] = raw.decode()
        except UnicodeDecodeError:
            continue
    return files


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    title = heading.strip().lower()
    return re.sub(r"[^\w\- ]", "", title).replace(" ", "-")


def headings():
    return [line.lstrip("#").strip() for line in PAGE.read_text().splitlines()
            if re.match(r"#{1,6} ", line)]


def flat(text):
    """The text as one line: a citation wrapped over comment or docstring lines reads whole."""
    return " ".join(COMMENT.sub("", line) for line in text.splitlines())


def test_nothing_cites_the_facts_file_outside_the_repository():
    found = {}
    for name, text in tracked().items():
        if name in HISTORY:
            continue
        hits = len(OUTSIDE.findall(text))
        if hits != KNOWN_STRINGS.get(name, 0):
            found[name] = hits
    assert not found, f"cite docs/facts.md instead: {found}"


def test_every_cited_section_is_a_heading_of_facts_md():
    known = headings()
    assert "The target box" in known and len(known) >= 10
    wrong = []
    for name, text in tracked().items():
        for match in CITATION.finditer(flat(text)):
            target, cited = match.group(1), " ".join(match.group(2).split())
            named = [h for h in known if h.lower().startswith(cited.lower())]
            if not named:
                wrong.append(f"{name}: {cited!r} is no section")
            elif target and "#" in target and target.partition("#")[2] != slug(named[0]):
                wrong.append(f"{name}: {target} is not the anchor of {named[0]!r}")
    assert not wrong, "\n".join(wrong)


def test_every_link_to_facts_md_reaches_a_heading():
    anchors = {slug(h) for h in headings()}
    wrong = []
    for name, text in tracked().items():
        if not name.endswith(".md"):
            continue
        for path, anchor in LINK.findall(text):
            if path.startswith(("http://", "https://")):
                continue
            if (ROOT / name).parent.joinpath(path).resolve() != PAGE:
                wrong.append(f"{name}: {path} is not docs/facts.md")
            elif anchor and anchor not in anchors:
                wrong.append(f"{name}: #{anchor} is no heading of docs/facts.md")
    assert not wrong, "\n".join(wrong)
