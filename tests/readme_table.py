"""docs/settings.md's table of every setting, generated from its one declaration
(thorfleet/settings/schema.py: the key, its default and its one-line meaning).

    python -m tests.readme_table      # rewrite the table in docs/settings.md
"""

import json
from pathlib import Path

from thorfleet.settings.schema import FIELDS

ROOT = Path(__file__).resolve().parent.parent
START = "<!-- settings-table: generated from thorfleet/settings/schema.py, checked by tests/fast/test_readme.py -->"
END = "<!-- end settings-table -->"


def shown(value) -> str:
    """A default as Python spells it in group data (None, True, "yes", {"a": "b"})."""
    if value is None or isinstance(value, bool):
        return repr(value)
    return json.dumps(value)


def table():
    rows = ["| key | default | what it sets |", "| --- | --- | --- |"]
    for key, field in FIELDS.items():
        rows.append(f"| `{key}` | `{shown(field.default)}` | {field.description.replace('|', '/')} |")
    return "\n".join(rows)


def readme_with_table(text):
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


if __name__ == "__main__":
    path = ROOT / "docs" / "settings.md"
    path.write_text(readme_with_table(path.read_text()))
