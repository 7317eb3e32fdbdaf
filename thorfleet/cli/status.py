"""`python -m thorfleet status`: the fleet as it is now, read-only, without a deploy.

    replies = collect(hosts, commands)   # {host name: Reply}: one SSH round trip per box, all at once
    table = rows(replies, rendered)      # pure: one row per host (ROW_FIELDS), from the box's JSON
    ok, why = serving(row)               # what the exit status and stderr say of a host
    client_lines(reply)                  # with gateway_clients: one line per client at the door
    address_lines(address, answers)      # two gateways: which one holds the shared address

Each Thor is asked one command, the box's watchdog (`layout.BOX_WATCHDOG status`, under `sudo -n`),
which prints one JSON object: what the server, its watchdog and the box's readings say now. The
laptop adds what only it knows: whether the box serves the version the inventory renders
(render.Settings.fingerprint, the deploy's own hash). Boxes are reached as a deploy reaches them:
pyinfra's SSH connector with the host's ssh_* data and the deploy's host-key check
(pyinfra_hooks.run_once), one thread per box.
"""

from __future__ import annotations

import json
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from thorfleet.settings import layout

TIMEOUT_S = 10.0  # to connect, and for the box's answer: a box that stops answering is a row
WATCH_S = 5.0  # --watch's default refresh
# Watchdog states that mean the box does not serve (the others: ok, starting, held, unknown).
NOT_SERVING = ("failing", "over_cap", "stopped")
GIB = 1024 ** 3

# Every row has exactly these keys, in this order (--json prints the rows).
ROW_FIELDS = ("host", "model", "serving", "why", "version", "version_state", "fingerprint", "active",
              "health", "watchdog", "watchdog_running", "last_check_ok", "watchdog_why",
              "running", "waiting", "decode_tok_s", "eagle_acceptance", "mem_available_gib",
              "power_mode", "clocks_locked", "temperature_max_c", "restarts_24h", "unknown",
              "error")
# Where each field is in the box's JSON (files/thor/bin/thorfleet-watchdog `status`), and its type.
# A field the answer lacks (an older watchdog script) or gives another type is listed in the
# row's `unknown` and shown as "?"; null (the box knows there is none) is shown as "-".
NUMBER = (int, float)
READS = {
    "fingerprint": (("fingerprint",), str),
    "active": (("active",), str),
    "health": (("health",), bool),
    "watchdog": (("watchdog", "state"), str),
    "watchdog_running": (("watchdog", "running"), bool),
    "last_check_ok": (("watchdog", "last_check_ok"), bool),
    "watchdog_why": (("watchdog", "why"), str),
    "running": (("requests", "running"), NUMBER),
    "waiting": (("requests", "waiting"), NUMBER),
    "decode_tok_s": (("decode_tok_s",), NUMBER),
    "eagle_acceptance": (("eagle_acceptance",), NUMBER),
    "mem_available_gib": (("mem_available_bytes",), NUMBER),
    "power_mode": (("power_mode",), int),
    "clocks_locked": (("clocks_locked",), bool),
    "temperature_max_c": (("temperatures_c",), dict),
    "restarts_24h": (("watchdog", "restarts_24h"), int),
}
BOX_FIELDS = ("version", *READS)


class Reply(NamedTuple):
    """What one box answered: its status JSON, or why there is none."""

    status: dict | None
    error: str | None = None


# --- asking the boxes -------------------------------------------------------------------------------


def command(settings) -> str:
    """The one command a Thor runs for `status`, for its own service and port. Its key is never
    on it: the watchdog reads it from the box's secrets file."""
    return shlex.join(["sudo", "-n", layout.BOX_WATCHDOG, "status",
                       "--service", settings.service_name, "--port", str(settings.service_port)])


def reply(code: int, out: str, err: str, what: str = "watchdog status") -> Reply:
    """The box's answer to `command` (`what` it runs), read: one JSON object on stdout, or why
    not."""
    try:
        found = json.loads(out)
    except ValueError:
        found = None
    if isinstance(found, dict):
        return Reply(found)
    said = (err.strip() or out.strip() or "no output").splitlines()[-1]
    if "password is required" in said:
        said += " (ssh_user needs passwordless sudo, as for a deploy)"
    elif "command not found" in said or "No such file" in said:
        said += f" (no {what.split()[0]} on the box: deploy first)"
    return Reply(None, f"{what} failed (exit {code}): {said}")


def _ask(host, line, run, timeout, what="watchdog status") -> Reply:
    try:
        return reply(*run(host, line, timeout), what=what)
    except TimeoutError:
        return Reply(None, f"unreachable: no answer within {timeout:g} s")
    except Exception as error:  # noqa: BLE001 - one box's failure is its row, never the others'
        return Reply(None, f"unreachable: {error or type(error).__name__}")


def collect(hosts, commands, run=None, timeout=TIMEOUT_S, what="watchdog status") -> dict:
    """{host name: Reply} of every host in `hosts` (each with .name), all asked at once, one
    thread each. `commands`: {name: command line}; `run(host, command, timeout) -> (exit status,
    stdout, stderr)`, by default over the deploy's own SSH connection."""
    if run is None:
        from thorfleet.run.pyinfra_hooks import run_once as run
    hosts = list(hosts)
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        asked = {h.name: pool.submit(_ask, h, commands[h.name], run, timeout, what)
                 for h in hosts}
        return {name: future.result() for name, future in asked.items()}


# --- rows: pure -------------------------------------------------------------------------------------

def _read(status, path, kinds):
    """(value, known) of status[path...]: known is False when a key is missing or the value is
    neither null nor of `kinds`."""
    value = status
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None, False
        value = value[key]
    if value is None:
        return None, True
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        return None, False
    return value, True


def version_state(box, rendered) -> str:
    """current: the box serves what its inventory renders; stale: another version; none: the
    box has proven none."""
    if box is None:
        return "none"
    return "current" if box.strip() == rendered else "stale"


def row(name, answer: Reply, rendered=None, model=None) -> dict:
    """One host's row (ROW_FIELDS) from its Reply; `rendered`: the fingerprint its inventory
    renders, `model`: the model it serves by its profile (the name clients ask for). An
    unreachable host's row knows none of the box's fields."""
    found = dict.fromkeys(ROW_FIELDS)
    found.update(host=name, model=model, unknown=[])
    if answer.status is None:
        found.update(unknown=list(BOX_FIELDS), version_state="?", error=answer.error)
    else:
        for field, (path, kinds) in READS.items():
            if path[0] == "requests" and answer.status.get("requests", {}) is None:
                continue  # null: vLLM's /metrics could not be read (the server is down)
            found[field], known = _read(answer.status, path, kinds)
            if not known:
                found["unknown"].append(field)
        if "fingerprint" in found["unknown"]:
            found["unknown"].insert(0, "version")
            found["version_state"] = "?"
        else:
            found["version"] = (found["fingerprint"] or "")[:12] or None
            found["version_state"] = version_state(found["fingerprint"], rendered)
        if found["mem_available_gib"] is not None:
            found["mem_available_gib"] = round(found["mem_available_gib"] / GIB, 1)
        zones = found["temperature_max_c"]
        degrees = [v for v in (zones or {}).values()
                   if isinstance(v, NUMBER) and not isinstance(v, bool)]
        found["temperature_max_c"] = max(degrees) if degrees else None
    found["serving"], found["why"] = serving(found)
    return found


def rows(replies: dict, rendered: dict | None = None, models: dict | None = None) -> list[dict]:
    """One row per host, in the order of `replies` ({name: Reply}); `rendered`: {name: the
    fingerprint its inventory renders}; `models`: {name: the model it serves}."""
    return [row(name, answer, (rendered or {}).get(name), (models or {}).get(name))
            for name, answer in replies.items()]


def model_lines(table: list[dict]) -> list[str]:
    """One line per model the fleet serves: how many of its boxes serve, and which do not (a
    model with none left is what a client of it sees as a 503)."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in table if r["model"]):
        boxes = [r for r in table if r["model"] == model]
        up = [r["host"] for r in boxes if r["serving"]]
        down = [r["host"] for r in boxes if not r["serving"]]
        lines.append(f"model {model}: {len(up)}/{len(boxes)} serving"
                     + (f" (not: {', '.join(down)})" if down else "")
                     + ("  NONE LEFT" if not up else ""))
    return lines


def serving(found: dict) -> tuple[bool, str]:
    """(whether the host serves, why not): health true and the watchdog not failing, over its cap
    or stopped; an unreachable host does not serve."""
    if found.get("error"):
        return False, found["error"]
    why = []
    active = found.get("active")
    if active is not None and active != "active":
        why.append(f"not active ({active})")
    if found.get("health") is not True:
        why.append("health false" if found.get("health") is False else "health unknown")
    state = found.get("watchdog")
    if state in NOT_SERVING:
        said = found.get("watchdog_why")
        why.append(f"watchdog {state}" + (f": {said}" if said else ""))
    return (False, "; ".join(why)) if why else (True, "serving")


def exit_status(table: list[dict]) -> int:
    return 0 if all(r["serving"] for r in table) else 1


def problems(table: list[dict]) -> list[str]:
    """One stderr line per host that does not serve."""
    return [f"thorfleet: {r['host']}: not serving: {r['why']}" for r in table if not r["serving"]]


# --- the table ---------------------------------------------------------------------------------------

COLUMNS = (("host", "left"), ("model", "left"), ("version", "left"), ("health", "left"), ("watchdog", "left"),
           ("run/wait", "right"), ("tok/s", "right"), ("EAGLE", "right"), ("MemAvail", "right"),
           ("power", "right"), ("clocks", "left"), ("°C", "right"), ("restarts", "right"),
           ("not serving", "left"))
CAPTION = ("version: what the box serves, against what the inventory renders; run/wait: "
           "requests; tok/s: decode over the watchdog's last interval; MemAvail: GiB; °C: the "
           "hottest thermal zone; restarts: by the watchdog, last 24 h; ?: the box did not say")


def _cell(found, field, text=str):
    if field in found["unknown"]:
        return "?"
    value = found[field]
    if value is None:
        return "-"
    if value is True or value is False:
        return "yes" if value else "NO"
    return text(value)


def _count(value):
    return f"{value:g}"


VERDICT_STATES = ("ok", "failing", "over_cap")  # the watchdog's states its last check decided


def cells(found: dict) -> tuple[str, ...]:
    """One row as the table shows it: "?" where the box did not say, "-" where there is none."""
    version = _cell(found, "version")
    if found["version_state"] == "none":
        version = "none"
    elif version not in ("?", "-"):
        version = f"{version} {found['version_state']}"
    watchdog = _cell(found, "watchdog")
    if found["watchdog_running"] is False:
        watchdog = "not running"
    elif found["last_check_ok"] is not None and watchdog in VERDICT_STATES:
        # a stopped, held or starting server keeps the check from before: not a verdict on it
        watchdog += " pass" if found["last_check_ok"] else " FAIL"
    return (
        found["host"], found["model"] or "-", version, _cell(found, "health"), watchdog,
        f"{_cell(found, 'running', _count)}/{_cell(found, 'waiting', _count)}",
        _cell(found, "decode_tok_s", lambda v: f"{v:.1f}"),
        _cell(found, "eagle_acceptance", lambda v: f"{v:.2f}"),
        _cell(found, "mem_available_gib", lambda v: f"{v:.1f}"),
        _cell(found, "power_mode"), _cell(found, "clocks_locked"),
        _cell(found, "temperature_max_c", lambda v: f"{v:.0f}"),
        _cell(found, "restarts_24h"),
        "" if found["serving"] else found["why"],
    )


def table(found: list[dict], width: int | None = None, at: float | None = None):
    """The rows as a rich Table, one line per host. Given the terminal's `width`, the last
    column (why a host does not serve: in full on stderr and in --json) is cut to fit."""
    from rich.table import Table

    shown = [cells(r) for r in found]
    note = None
    if width:
        widths = [max([len(header), *(len(c[i]) for c in shown)])
                  for i, (header, _) in enumerate(COLUMNS[:-1])]
        note = max(width - sum(widths) - (len(COLUMNS) - 1), len(COLUMNS[-1][0]))
    up = sum(1 for r in found if r["serving"])
    when = time.strftime("%H:%M:%S", time.localtime(at if at is not None else time.time()))
    grid = Table(title=f"thorfleet status: {up}/{len(found)} serving, {when}",
                 title_justify="left", caption=CAPTION, caption_justify="left", box=None,
                 padding=(0, 1, 0, 0), pad_edge=False, header_style="bold underline")
    for header, justify in COLUMNS:
        last = header == COLUMNS[-1][0]
        grid.add_column(header, justify=justify, no_wrap=True, overflow="ellipsis",
                        max_width=note if last else None)
    for r, row_cells in zip(found, shown):
        grid.add_row(*row_cells, style=None if r["serving"] else "red")
    return grid


# --- the door's clients (gateway_clients) -----------------------------------------------------------

def door_command() -> str:
    """What the gateway runs for each client's counts (files/gateway/bin/thorfleet-door-usage)."""
    return shlex.join(["sudo", "-n", layout.GATEWAY_DOOR_USAGE, "show"])


def client_lines(answer: Reply) -> list[str]:
    """One line per client from the gateway's answer to door_command; one line saying why not."""
    clients = (answer.status or {}).get("clients")
    if not isinstance(clients, dict):
        return [f"clients at the door: unknown ({answer.error or 'no clients in the answer'})"]
    lines = ["clients at the door (counted since HAProxy last started):"]
    for name, c in clients.items():
        refused = c.get("refused", {})
        lines.append(f"  {name}: {c.get('requests', '?')} requests, {c.get('in_flight', '?')} "
                     f"at the door now; answers 4xx {c.get('answers_4xx', '?')}, 5xx "
                     f"{c.get('answers_5xx', '?')}; refused over its limits: "
                     f"{refused.get('in_flight', '?')} at once, {refused.get('rate', '?')} a minute"
                     f", {refused.get('budget', '?')} over a budget")
        if isinstance(c.get("tokens"), dict):
            lines.append(f"    {token_line(c['tokens'], c.get('budget_left'))}")
    if not clients:
        lines.append("  none has asked yet")
    return lines


def token_line(tokens: dict, left) -> str:
    """A client's tokens (the boxes' counts: prompt + completion, UTC periods) and what is left
    of each budget it has, from its `tokens` and `budget_left` in thorfleet-door-usage's JSON."""
    def spent(period):
        counts = tokens.get(period)
        if not isinstance(counts, dict):
            return "?"
        total = sum(counts.get(kind, 0) for kind in ("prompt", "completion"))
        return f"{total:,} (cached {counts.get('cached', 0):,} of prompt {counts.get('prompt', 0):,})"

    budgets = [f"{n:,} of its {budget}" for budget, n in (left or {}).items() if n is not None]
    return (f"tokens today {spent('today')}, this month {spent('month')}; left: "
            f"{', '.join(budgets) or 'no budget'}")


def _door(inventory, settings, run, timeout) -> list[str]:
    from thorfleet.settings.roles import gateway_of

    gateway = gateway_of(inventory)
    role = getattr(settings.get(gateway.name), "gateway_role", None) if gateway else None
    if role is None or not role.gateway_clients:
        return []
    answers = collect([gateway], {gateway.name: door_command()}, run=run, timeout=timeout,
                      what="thorfleet-door-usage show")
    return client_lines(answers[gateway.name])


# --- two gateways: who holds the door's address ------------------------------------------------------

def holds_command(address: str) -> str:
    """What each gateway of a pair runs: whether the shared address is on one of its interfaces."""
    script = (f"if ip -o -4 addr show | grep -qw {shlex.quote(address)}; then "
              "echo '{\"holds\": true}'; else echo '{\"holds\": false}'; fi")
    return shlex.join(["sh", "-c", script])


def address_lines(address: str, answers: dict) -> tuple[list[str], bool]:
    """(lines, whether clients can reach the door) from each gateway's answer to holds_command:
    one gateway holds the address, or none (the door is down), or two (the LAN sees it twice)."""
    holders = [name for name, a in answers.items() if a.status and a.status.get("holds")]
    rest = "; ".join(f"{name}: {'backup' if a.status else a.error}"
                     for name, a in answers.items() if name not in holders)
    if len(holders) == 1:
        return [f"the door's address {address}: held by {holders[0]} ({rest})"], True
    silent = [name for name, a in answers.items() if not a.status]
    if not holders and len(silent) == len(answers):
        return [(f"the door's address {address}: unknown, no gateway answered ({rest}): reach "
                 "them over SSH first (their ssh_hostname and ssh_port)")], False
    if not holders and silent:
        return [(f"the door's address {address}: held by no gateway that answered ({rest}): "
                 f"{' and '.join(silent)} may hold it; reach {'it' if len(silent) == 1 else 'them'}"
                 " over SSH, then see each gateway's `journalctl -u keepalived`")], False
    if not holders:
        return [(f"the door's address {address}: held by no gateway ({rest}): clients cannot "
                "reach the fleet; see each gateway's `journalctl -u keepalived`")], False
    return [(f"the door's address {address}: held by {' and '.join(holders)} at once: the LAN "
            "sees it twice (VRRP between them is cut: check gateway_vrrp_router_id and the "
            "path between the gateways)")], False


def _pair(inventory, settings, run, timeout) -> tuple[list[str], bool]:
    from thorfleet.settings.roles import gateways

    found = gateways(inventory)
    role = getattr(settings.get(found[0].name), "gateway_role", None) if found else None
    if role is None or not role.gateway_virtual_ip:
        return [], True
    address = role.gateway_virtual_ip.split("/")[0]
    answers = collect(found, {h.name: holds_command(address) for h in found}, run=run,
                      timeout=timeout, what="ip addr show")
    return address_lines(address, answers)


# --- the command --------------------------------------------------------------------------------------


def refresh(hosts, commands, rendered, run=None, timeout=TIMEOUT_S, models=None) -> list[dict]:
    return rows(collect(hosts, commands, run=run, timeout=timeout), rendered, models)


def console():
    import sys

    from rich.console import Console

    # piped: wide enough that no column is cut (a terminal's own width otherwise)
    return Console(width=None if sys.stdout.isatty() else 160)


def show(inventory, settings, *, as_json=False, watch=None, timeout=TIMEOUT_S, run=None,
         out=None, err=None) -> int:
    """Ask every Thor of `inventory` (its checked `settings`: {name: Settings}) once, or every
    `watch` seconds until Ctrl-C; print the table (or the rows as JSON) and a stderr line per host
    that does not serve. Exit status 0 when every host serves (of the last refresh), else 1."""
    import sys

    from thorfleet.settings.roles import thors

    err = err or sys.stderr
    hosts = thors(inventory)
    if run is None:
        from thorfleet.run.pyinfra_hooks import connectable

        connectable(inventory, timeout)
    commands = {h.name: command(settings[h.name]) for h in hosts}
    rendered = {h.name: settings[h.name].fingerprint for h in hosts}
    models = {h.name: settings[h.name].served_names[0] for h in hosts}
    screen = out or console()
    found = refresh(hosts, commands, rendered, run, timeout, models)
    if watch:
        found = _watch(screen, found, lambda: refresh(hosts, commands, rendered, run, timeout,
                                                      models), watch)
    elif as_json:
        screen.file.write(json.dumps(found, indent=2) + "\n")
    else:
        screen.print(table(found, screen.width))
        for line in model_lines(found):
            screen.print(line, highlight=False)
        for line in _door(inventory, settings, run, timeout):
            screen.print(line, highlight=False)
    door, reachable = _pair(inventory, settings, run, timeout)
    for line in door:
        if reachable:
            screen.print(line, highlight=False)
        else:
            print(line, file=err)
    for line in problems(found):
        print(line, file=err)
    return exit_status(found) or int(not reachable)


def _watch(screen, found, again, every):
    """The table refreshed in place every `every` seconds until Ctrl-C: the last rows."""
    from rich.live import Live

    with Live(table(found, screen.width), console=screen, auto_refresh=False) as live:
        try:
            while True:
                time.sleep(every)
                found = again()
                live.update(table(found, screen.width), refresh=True)
        except KeyboardInterrupt:
            pass
    return found
