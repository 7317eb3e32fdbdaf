"""docs/settings.md's table of group data keys, generated from group_data/all.py.

    python -m tests.readme_table      # rewrite the table in docs/settings.md
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = "<!-- group-data-table: generated from group_data/all.py, checked by tests/fast/test_readme.py -->"
END = "<!-- end group-data-table -->"


def table():
    rows = ["| key | default | what it sets |", "| --- | --- | --- |"]
    for line in (ROOT / "group_data" / "all.py").read_text().splitlines():
        match = re.match(r"^(\w+) = (.+?)  # (.+)$", line)
        if match:
            key, default, comment = match.groups()
            rows.append(f"| `{key}` | `{default}` | {comment.replace('|', '/')} |")
    return "\n".join(rows)


def readme_with_table(text):
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    path = ROOT / "docs" / "settings.md"
    path.write_text(readme_with_table(path.read_text()))
