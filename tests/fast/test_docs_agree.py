"""The README and the docs say what the code does, and the same thing where they meet: what an
operator tripped on, reading them as a new user would (issue 50).

Fast: text and the code's own tables. The edits that break them (each seen failing once): the
deploying.md Service step listing two profiles again; the README's "What a run does" in its old
order (the gateway and watchdog after verification, no cleanup), or docs/layout.md's tasks row in
its; first-real-thor.md deploying one box first (`--limit thor-01`); the two-gateway example in
docs/gateway.md without the ssh_* keys of the README's step 3; the API key file "root-only on the
laptop" (it is the operator's, 0600).
"""

import ast
import re
import textwrap

from tests.readme_table import ROOT
from thorfleet.settings.recipe import PROFILES

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def section(text, heading):
    """The Markdown of `text` under `heading`, up to the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"{heading}\n")
    rest = text[start + len(heading) + 1:]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[:end.start()] if end else rest


def python_blocks(text):
    return [textwrap.dedent(block) for block in
            re.findall(r"^ *```python\n(.*?)^ *```$", text, re.MULTILINE | re.DOTALL)]


def test_the_service_step_names_every_profile():
    step = next(item for item in (DOCS / "deploying.md").read_text().split("\n6. ")[1:]
                if item.startswith("**Service**"))
    assert [p for p in PROFILES if f"`{p}`" not in step] == []


def deploy_steps():
    """The task modules deploy.py runs, in its order (`gateway.box`: the Thor's firewall)."""
    tasks = {path.stem for path in (ROOT / "tasks").glob("*.py")}
    calls = [node for node in ast.walk(ast.parse((ROOT / "deploy.py").read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and isinstance(node.func.value, ast.Name) and node.func.value.id in tasks]
    return [call.func.value.id for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def test_the_readme_and_the_layout_list_the_steps_in_deploy_pys_order():
    steps = deploy_steps()
    assert steps[:2] == ["gateway", "monitor"] and steps[-1] == "cleanup", steps
    said = section(README, "## What a run does")
    assert re.findall(r"\*\*(\w+)\*\*", said) == steps
    row = next(line for line in (DOCS / "layout.md").read_text().splitlines()
               if line.startswith("| `tasks/` |"))
    names = "|".join(sorted(set(steps)))
    assert re.findall(rf"\b({names})\b", row.split("order:", 1)[1]) == steps, row
    count = {9: "nine", 10: "ten", 11: "eleven"}[len(steps) - 2]
    assert f"then each Thor's {count})" in (DOCS / "layout.md").read_text()


def test_the_first_real_thor_is_deployed_as_the_readme_deploys_a_fleet():
    step_7 = README[README.index("7. **Deploy**"):README.index("8. **Read the report**")]
    command = re.search(r"^ *(pyinfra .*deploy\.py)$", step_7, re.MULTILINE).group(1)
    page = section((DOCS / "first-real-thor.md").read_text(), "## 2. Deploy and look")
    assert re.findall(r"`(pyinfra [^`]*deploy\.py)`", page.replace("\n", " ")) == [command]


def test_the_two_gateway_example_logs_in_as_the_readmes_gateway_does():
    def gateway_data(block):
        found = {}
        exec(block, found)  # noqa: S102 - the docs' own examples
        return found["gateway"][1]

    step_3 = README[README.index("3. **List your boxes"):README.index("4. **Trust")]
    readme = gateway_data(python_blocks(step_3)[0])
    pair = next(block for block in python_blocks((DOCS / "gateway.md").read_text())
                if "gateway_virtual_ip" in block)
    ssh = {key: value for key, value in readme.items() if key.startswith("ssh_")}
    assert {k: v for k, v in gateway_data(pair).items() if k.startswith("ssh_")} == ssh


def test_the_laptops_api_key_is_the_operators_not_roots():
    step_2 = README[README.index("2. **Make the fleet's API key**"):README.index("3. **List")]
    assert "root-only" not in step_2 and "(0600)" in step_2
    assert "(umask 077; openssl rand" in step_2  # what makes it the operator's alone
