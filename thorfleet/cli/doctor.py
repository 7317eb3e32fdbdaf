"""`python -m thorfleet doctor`: which of thorfleet's assumptions hold on each box, read only.

    found = ask(hosts, settings)        # {host name: (sudo, {key: Answer}) or the error}: one
                                        # SSH command per host, all at once (doctor/ask.py)
    table = rows(inventory, settings, found)   # pure: one row per assumption (doctor/rows.py)

Nothing is installed or changed, no service restarted, no image pulled: the one command reads,
and its container probe runs an image already on the box (`--rm`, no network). Hosts are reached
as a deploy reaches them (pyinfra_hooks.run_once: the host's ssh_* data, the deploy's host-key
check).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from thorfleet.doctor import ask as asking
from thorfleet.doctor import rows as verdicts

# A box's reads run at once; the slowest is the container probe (PyTorch imported on a Thor in
# about 10 s) and the mirror's 5 s: this leaves room for a loaded box.
TIMEOUT_S = 120.0


def queries(host, settings, pair: bool) -> dict:
    """What doctor reads on `host`: a Thor's reads, a gateway's, or both."""
    from thorfleet.settings.roles import is_gateway, is_thor

    found = {}
    if is_thor(host):
        found |= asking.thor_queries(settings)
    if is_gateway(host):
        found |= asking.gateway_queries(pair)
    return found


def ask(hosts, asked: dict, run=None, timeout=TIMEOUT_S) -> dict:
    """{host name: (sudo, {key: Answer})}, or {host name: "why it could not be asked"}; every host
    at once, one thread each. `asked`: {name: queries}."""
    if run is None:
        from thorfleet.run.pyinfra_hooks import run_once as run

    def one(host):
        try:
            code, out, err = run(host, asking.command(asked[host.name]), timeout)
        except TimeoutError:
            return f"unreachable: no answer within {timeout:g} s"
        except Exception as error:  # noqa: BLE001 - one host's failure is its row
            return f"unreachable: {error or type(error).__name__}"
        if not out.startswith(asking.SUDO_MARK):
            said = (err.strip() or out.strip() or "no output").splitlines()[-1]
            return f"the reads did not run (exit {code}): {said}"
        return asking.answers(asked[host.name], out)

    hosts = list(hosts)
    with ThreadPoolExecutor(max_workers=max(len(hosts), 1)) as pool:
        return dict(zip([h.name for h in hosts], pool.map(one, hosts), strict=True))


def rows(hosts, settings, found, pair: bool) -> list[dict]:
    """Every host's rows, in the inventory's order."""
    from thorfleet.settings.roles import is_gateway, is_thor

    table = []
    for host in hosts:
        answer = found[host.name]
        if isinstance(answer, str):
            table += verdicts.unreachable_rows(host.name, answer)
            continue
        sudo, got = answer
        if is_thor(host):
            table += verdicts.thor_rows(host.name, settings[host.name], sudo, got)
        if is_gateway(host):
            gateway = verdicts.gateway_rows(host.name, pair, sudo, got)
            table += gateway[1:] if is_thor(host) else gateway  # one sudo row a host
    return table


COLUMNS = ("host", "area", "check", "expects", "found", "verdict", "fix")
STYLE = {verdicts.OK: None, verdicts.COPES: "yellow", verdicts.BLOCKS: "red",
         verdicts.NOT_YET: "dim"}


def table(found: list[dict]):
    from rich.table import Table

    counts = {v: sum(1 for r in found if r["verdict"] == v) for v in verdicts.VERDICTS}
    title = "thorfleet doctor: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    grid = Table(title=title, title_justify="left", box=None, padding=(0, 1, 0, 0),
                 pad_edge=False, header_style="bold underline")
    for column in COLUMNS:
        grid.add_column(column, overflow="fold")
    for r in found:
        grid.add_row(*(str(r[c]) for c in COLUMNS), style=STYLE[r["verdict"]])
    return grid


def show(inventory, settings, *, only=None, as_json=False, timeout=TIMEOUT_S, run=None,
         out=None, err=None) -> int:
    """Ask every host of `inventory` (or those named in `only`) once; print the rows (a table, or
    JSON), and a stderr line per row that blocks serving. Exit 0 when none does, else 1."""
    from thorfleet.settings.roles import gateways, is_gateway, is_thor

    err = err or sys.stderr
    hosts = [h for h in inventory if (is_thor(h) or is_gateway(h))
             and (only is None or h.name in only)]
    if run is None:
        from thorfleet.run.pyinfra_hooks import connectable

        connectable(inventory, min(timeout, 10))
    pair = len(gateways(inventory)) == 2
    asked = {h.name: queries(h, settings[h.name], pair) for h in hosts}
    found = rows(hosts, settings, ask(hosts, asked, run, timeout), pair)
    if as_json:
        (out or sys.stdout).write(json.dumps(found, indent=2) + "\n")
    else:
        from thorfleet.cli.status import console

        screen = console() if out is None else out
        screen.print(table(found))
    for r in verdicts.blocks(found):
        print(f"thorfleet: {r['host']}: {r['check']} blocks serving: {r['found']}"
              + (f" ({r['fix']})" if r["fix"] else ""), file=err)
    return verdicts.exit_status(found)
