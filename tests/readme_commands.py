"""The two commands the README's "Try it" section gives a newcomer, read from the README itself.

    python3 -m tests.readme_commands first    # the first command: set up, bring up 2 boxes, deploy
    python3 -m tests.readme_commands test     # the test command

.ci/run runs both as written, so a README whose first command does not work fails CI. Standard
library only: .ci/run reads them before anything is installed.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Try it"


def try_it_commands(readme: str) -> list[str]:
    """The lines of the first ```sh block under the "Try it" heading."""
    start = readme.find("\n" + SECTION)
    if start < 0:
        raise ValueError(f"README.md has no {SECTION!r} section")
    block = re.search(r"^```sh\n(.*?)^```$", readme[start:], re.MULTILINE | re.DOTALL)
    if block is None:
        raise ValueError(f"README.md's {SECTION!r} section has no ```sh block")
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    if len(lines) != 2:
        raise ValueError(f"README.md's {SECTION!r} block should hold two commands (the first, "
                         f"then the test command), not {len(lines)}")
    return lines


def main(argv=None) -> int:
    which = (argv or sys.argv[1:] or [""])[0]
    if which not in ("first", "test"):
        print("usage: python3 -m tests.readme_commands first|test", file=sys.stderr)
        return 2
    first, test = try_it_commands((ROOT / "README.md").read_text())
    print(first if which == "first" else test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
