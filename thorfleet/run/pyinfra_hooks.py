"""Every place thorfleet touches pyinfra's run machinery, in one module, each with why.

pyinfra is pinned (pyproject: pyinfra==3.10.*); tests/fast/test_pyinfra_hooks.py checks every name and
signature in `EXPECTED` against the installed pyinfra, so an upgrade that moves one fails the fast
tests, not a run on the fleet. Elsewhere thorfleet holds the run's State only to keep its own
records on it (runstate.py, thorfleet/plan.py) and uses pyinfra's operation and fact API.

Public API used where it exists:
- the run's State is `host.state` (deploy.py, the operations);
- what a host's operations did comes from the state callbacks' host events
  (`BaseStateCallback.operation_host_success` / `operation_host_error`), recorded by `_Events`, then
  read with OperationMeta's own `did_change()`, `did_error()`, `executed`, `stdout_lines`,
  `stderr_lines`; their names with `State.get_op_order()` and `State.get_op_meta()`;
- what a dry run would change is `OperationMeta.will_change`, known when pyinfra checked for
  changes while planning (`State.should_check_for_changes()`: not under `-y`);
- "the run's last operation has run" is the `operation_end` event;
- SSH keepalives are set in the `host_connect` event, on the connection pyinfra just opened
  (reconnections after a reboot included);
- the hosts still in the run are `Inventory.get_active_hosts()`, the failed ones
  `State.failed_hosts`, a run's --limit `State.is_host_in_limit()`, plan or execution
  `State.current_stage`;
- a host the run could not connect to is the `host_connect_error` event, with pyinfra's
  ConnectError (raised while handling paramiko's or the socket's exception, which says why).

Hooks, where pyinfra 3.10 has no public path:
1. `after_inventory_loaded`: the CLI State's `init` is wrapped. thorfleet checks every host's group
   data before the first SSH connection (bad input is refused, no host contacted). config.py is
   the only code of ours the CLI runs before connecting, and it runs before the inventory is
   loaded; pyinfra has no event between "inventory loaded" and "connecting" (the first callback,
   `host_before_connect`, is per host, inside the connection pool, and callbacks can only be added
   once `init` has made the list), so the check follows `State.init`, which the CLI calls right
   after loading the inventory (pyinfra_cli/cli.py).
2. `load_cli_inventory`: `thorfleet pin` loads an inventory exactly as the CLI does, with
   `pyinfra_cli.inventory.make_inventory` (there is no API for it). The `pyinfra_cli` package's
   `__init__` only applies gevent's monkey patching for the CLI's SSH concurrency; patched,
   `select.epoll` is gone and huggingface_hub cannot be imported, and pin needs no gevent. So its
   modules are imported without running that `__init__`. Its cache of compiled files
   (`pyinfra_cli.util.PYTHON_CODES`) is emptied of the files pin rewrites, so they are read afresh.
3. `operation_parameters`: `@reads` binds an operation's own arguments. It reads the generator's
   signature through `@operation()`'s `functools.wraps` (`__wrapped__`; pyinfra documents the
   generator itself as `_inner`, for calling one operation's commands from another).
4. `cli_inventory_argument`, `cli_dry_run`: the INVENTORY the operator gave the CLI, and whether
   it was given --dry, read from click's current context (the CLI is a click command; its State
   keeps neither), so a refusal of the inventory names the file as `thorfleet check` does, and a
   run that stopped while connecting leaves the last report alone under --dry only.
5. thorfleet's per-run records are attributes of the run's State (`thorfleet_events` here,
   `thorfleet_run` in runstate.py, the run's plan on it, from thorfleet/plan.py): one set per run, so two
   runs in one process never share them, and pyinfra has no place for a deploy's own data per run.
6. `connectable`, `run_once`: `thorfleet status` puts the inventory on a State of its own
   (pyinfra's API: State, Config), then sends each box one command over the connection pyinfra's
   own SSH connector opened (`Host.connect`: the deploy's ssh_* data and host-key check), through
   the connector's paramiko client (`SSHConnector.client`). `Host.run_shell_command` would ask for a
   sudo password on the terminal when `sudo -n` says one is needed
   (pyinfra/connectors/util.py `execute_command_with_sudo_retry`), and it reads the output in
   gevent greenlets whose timeout cannot fire in the plain thread each box is asked from (no
   monkey patching: a blocked read holds the thread), so a box that stops answering would hang.
7. `ShownCommand`: a shell command whose output the operator sees as it comes, without -v (a
   weights transfer, an image build). pyinfra prints a command's output only under -vvv; the
   command's own `execute` (StringCommand.execute) is overridden to pass `print_output=True`.
8. `fact_command`, `fact_value`: the run's reads are batched into one SSH command per stage
   (snapshot.py), so a fact's command and its processing are called by hand, as pyinfra's
   get_facts does (`command`, `requires_command`, `process`, `default`): pyinfra has no batch read.
9. `connected`, `wait_for_reboot`: connecting a host from another host's operation (the gateway,
   outside --limit, when a box drains; a box read for the snapshot), and reconnecting one after a
   reboot that pyinfra did not start (nvpmodel's own, for a power mode), with `Host.connect` and
   `Host.disconnect`: pyinfra's server.reboot does this inside its own operation only.
10. `when_unreachable`: a host the run cannot connect to is said in one line with its fix
   (thorfleet's), in place of pyinfra's own line and paramiko's tracebacks. paramiko logs each
   failed SSH handshake with its traceback at ERROR (its transport's thread), and with no handler
   of its own Python prints it on stderr: its logger gets a NullHandler (propagation stays, so
   `--debug-all` still shows them). pyinfra logs its own line from `Host.connect` before the
   `host_connect_error` event, with no option the CLI passes (and its strict host key policy one
   more, naming no host): while the run connects (its Connect stage), a filter on pyinfra's
   logger drops those records, known by where they are logged (`Host.connect` in
   pyinfra/api/host.py, `StrictPolicy.missing_host_key` in its sshuserclient, at ERROR); the
   event's handler says the host's line. A changed host key's warnings stay: they are an alarm.
11. `ssh_destination`: where pyinfra's SSH connector will dial a host and which known_hosts files
   it checks the host's key against, so `check` can find a missing host key offline (a strict
   check refuses the first connection otherwise). The ssh_* data decide, then the ssh_config file
   (HostName, Port, UserKnownHostsFile); pyinfra has no API for it, and reading ssh_config our own
   way could disagree with it, so its SSH client's own `parse_config` is asked, as its `connect`
   asks it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
import time
import types
from typing import NamedTuple

from pyinfra.api import StringCommand
from pyinfra.api.state import BaseStateCallback, StateStage

# "module:qualified name" -> its signature in pyinfra 3.10, or "property" / "attribute" (a class
# attribute, or one declared on the class).
EXPECTED = {
    "pyinfra.api.state:State.init": "(self, inventory: 'Inventory', config: 'Config | None', "
                                    "initial_limit=None)",
    "pyinfra.api.state:State.add_callback_handler": "(self, handler)",
    "pyinfra.api.state:State.get_op_order": "(self)",
    "pyinfra.api.state:State.get_op_meta": "(self, op_hash: 'str') -> 'StateOperationMeta'",
    "pyinfra.api.state:State.get_op_data_for_host":
        "(self, host: 'Host', op_hash: 'str') -> 'StateOperationHostData'",
    "pyinfra.api.state:State.is_host_in_limit": "(self, host: 'Host')",
    "pyinfra.api.state:State.should_check_for_changes": "(self)",
    "pyinfra.api.state:State.current_stage": "attribute",
    "pyinfra.api.state:StateStage.Execute": "attribute",
    "pyinfra.api.state:StateOperationMeta.names": "attribute",
    "pyinfra.api.state:BaseStateCallback.host_connect": "(state: 'State', host: 'Host')",
    "pyinfra.api.state:BaseStateCallback.host_connect_error":
        "(state: 'State', host: 'Host', error)",
    "pyinfra.api.state:StateStage.Connect": "attribute",
    "pyinfra.api.state:BaseStateCallback.operation_host_success":
        "(state: 'State', host: 'Host', op_hash, retry_count: 'int' = 0)",
    "pyinfra.api.state:BaseStateCallback.operation_host_error":
        "(state: 'State', host: 'Host', op_hash, retry_count: 'int' = 0, max_retries: 'int' = 0)",
    "pyinfra.api.state:BaseStateCallback.operation_end": "(state: 'State', op_hash)",
    "pyinfra.api.operation:OperationMeta.will_change": "property",
    "pyinfra.api.operation:OperationMeta.executed": "property",
    "pyinfra.api.operation:OperationMeta.is_complete": "(self) -> 'bool'",
    "pyinfra.api.operation:OperationMeta.did_change": "(self) -> 'bool'",
    "pyinfra.api.operation:OperationMeta.did_error": "(self) -> 'bool'",
    "pyinfra.api.operation:OperationMeta.stdout_lines": "property",
    "pyinfra.api.operation:OperationMeta.stderr_lines": "property",
    "pyinfra.api.operation:operation": "(is_idempotent: 'bool' = True, idempotent_notice: "
                                       "'str | None' = None, is_deprecated: 'bool' = False, "
                                       "deprecated_for: 'str | None' = None, _set_in_op: "
                                       "'bool' = True) -> 'Callable[[Callable[P, Generator]], "
                                       "PyinfraOperation[P]]'",
    "pyinfra.api.inventory:Inventory.get_active_hosts": "(self) -> 'list[Host]'",
    "pyinfra.api.host:Host.connect":
        "(self, reason=None, show_errors: 'bool' = True, raise_exceptions: 'bool' = False)",
    "pyinfra.api.host:Host.disconnect": "(self) -> 'None'",
    "pyinfra.api.command:StringCommand.execute":
        "(self, state: 'State', host: 'Host', connector_arguments: 'ConnectorArguments')",
    "pyinfra.api.command:StringCommand.get_raw_value": "(self) -> 'str'",
    "pyinfra.api.facts:FactBase.requires_command": "(self, *args, **kwargs) -> 'str | None'",
    "pyinfra.connectors.ssh:SSHConnector.client": "attribute",
    "pyinfra.connectors.sshuserclient.client:SSHClient.parse_config":
        "(self, hostname, initial_cfg=None, ssh_config_file=None, strict_host_key_checking=None)",
    "pyinfra_cli.inventory:make_inventory": "(inventory: str, override_data=None, "
                                            "cwd: str | None = None, group_data_directories=None)",
    "pyinfra_cli.util:PYTHON_CODES": "attribute",
}


# --- before connecting (hook 1) and SSH keepalives ------------------------------------------------


def cli_inventory_argument() -> str | None:
    """The INVENTORY argument of the running `pyinfra` CLI, or None (the Python API)."""
    import click

    context = click.get_current_context(silent=True)
    return context.params.get("inventory") if context is not None else None


def cli_dry_run() -> bool:
    """True when the running `pyinfra` CLI was given --dry (False for the Python API)."""
    import click

    context = click.get_current_context(silent=True)
    return bool(context is not None and context.params.get("dry"))


def after_inventory_loaded(*steps):
    """Run each `step(state)` right after the CLI loads the inventory, before any connection
    (config.py). A step may exit the process: no host has been contacted yet."""
    from pyinfra.context import ctx_state

    state = ctx_state.get()
    init = state.init

    def init_then_steps(inventory, *args, **kwargs):
        init(inventory, *args, **kwargs)
        for step in steps:
            step(state)

    state.init = init_then_steps


class _Keepalive(BaseStateCallback):
    """An SSH keepalive on every connection to a box, every `ssh_keepalive_interval_s` (paramiko's
    Transport.set_keepalive). A restart is proven for up to service_health_timeout_s while the
    laptop's session sits idle, and NAT and firewalls drop idle connections. pyinfra only takes a
    keepalive from an ssh_config file's ServerAliveInterval, and pointing it at a file of ours
    would hide the operator's own ~/.ssh/config."""

    @staticmethod
    def host_connect(state, host):
        seconds = host.data.get("ssh_keepalive_interval_s")
        client = getattr(host.connector, "client", None)  # SSH only
        transport = client.get_transport() if client is not None else None
        if seconds and transport is not None:
            transport.set_keepalive(int(seconds))


def keep_ssh_sessions_alive(state):
    """Set keepalives on every connection `state` opens, reconnections after a reboot included."""
    state.add_callback_handler(_Keepalive())


# --- a host the run cannot connect to (hook 10) ---------------------------------------------------


class _Unreachable(BaseStateCallback):
    """Hands each host the run could not connect to, as it connects, to `say(state, host,
    error)`. Later connections (a drain's, a reboot's wait) are their callers' to say."""

    def __init__(self, say):
        self.say = say

    def host_connect_error(self, state, host, error):
        if state.current_stage == StateStage.Connect:
            self.say(state, host, error)


class _NotPyinfrasConnectLine(logging.Filter):
    """Drops pyinfra's own lines for a host it could not connect to while `state` connects: the
    host's line with its fix takes their place. They are known by where pyinfra logs them, at
    ERROR: Host.connect's, and its strict host key policy's (which names no host)."""

    SAID_BY = ((os.path.join("pyinfra", "api", "host.py"), "connect"),
               (os.path.join("pyinfra", "connectors", "sshuserclient", "client.py"),
                "missing_host_key"))

    def __init__(self, state):
        super().__init__()
        self.state = state

    def filter(self, record):
        return not (self.state.current_stage == StateStage.Connect
                    and record.levelno == logging.ERROR
                    and any(record.pathname.endswith(path) and record.funcName == function
                            for path, function in self.SAID_BY))


def when_unreachable(say):
    """A step for after_inventory_loaded: `say(state, host, error)` for each host the run cannot
    connect to (pyinfra's ConnectError), in place of pyinfra's line and paramiko's tracebacks."""

    def step(state):
        logging.getLogger("paramiko").addHandler(logging.NullHandler())
        logging.getLogger("pyinfra").addFilter(_NotPyinfrasConnectLine(state))
        state.add_callback_handler(_Unreachable(say))

    return step


def stopped_connecting(state) -> bool:
    """True when the run ended while connecting (pyinfra stops there with no host left)."""
    return state.current_stage == StateStage.Connect


# --- what the run did, from the state callbacks ---------------------------------------------------


class Outcome(NamedTuple):
    """One operation on one host, once it ran."""

    name: str
    changed: bool
    failed: bool
    output: tuple[str, ...]  # its stdout lines, then its stderr lines


class _Events(BaseStateCallback):
    """Each host's finished operations (their OperationMeta, complete once the event's operation
    returns), and what to do once the run's last operation has run."""

    def __init__(self):
        self.finished: dict[str, dict] = {}  # host name -> {op_hash: OperationMeta}
        self.after_last: list = []  # each called with the State

    def _finished(self, state, host, op_hash):
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        self.finished.setdefault(host.name, {})[op_hash] = meta

    def operation_host_success(self, state, host, op_hash, retry_count=0):
        self._finished(state, host, op_hash)

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        self._finished(state, host, op_hash)

    def operation_end(self, state, op_hash):
        if op_hash == state.get_op_order()[-1]:
            for then in self.after_last:
                then(state)


def watch(state) -> _Events:
    """The run's recorder of operation events, added to `state` on first use. It must be added
    before the first operation executes: config.py does it as the CLI loads the inventory, and
    report.install from deploy.py (every deploy file runs before any operation executes)."""
    events = getattr(state, "thorfleet_events", None)
    if events is None:
        events = state.thorfleet_events = _Events()
        state.add_callback_handler(events)
    return events


def after_last_operation(state, then):
    """Call `then(state)` once the run's last operation has run on every host."""
    watch(state).after_last.append(then)


def operation_name(state, op_hash) -> str:
    return min(state.get_op_meta(op_hash).names)


def outcomes(state, host) -> list[Outcome]:
    """What each operation that ran on `host` did, in the run's operation order."""
    finished = watch(state).finished.get(host.name, {})
    found = []
    for op_hash in state.get_op_order():
        meta = finished.get(op_hash)
        if meta is None or not meta.is_complete():
            continue
        found.append(Outcome(operation_name(state, op_hash), meta.did_change(), meta.did_error(),
                             tuple(meta.stdout_lines + meta.stderr_lines)))
    return found


def sent_commands(host) -> bool:
    """True once an operation has sent `host` a command in this run. Also True in a run nobody
    watched (`watch`: config.py and report.install do, before execution): the run's events were
    not seen, so nothing read before it may be trusted."""
    events = getattr(host.state, "thorfleet_events", None)
    if events is None:
        return True
    finished = events.finished.get(host.name, {})
    return any(meta.is_complete() and meta.executed for meta in finished.values())


def changes(step) -> bool:
    """Whether an operation's result (OperationMeta) changes its host: what it did once executed,
    what pyinfra planned before (`will_change`)."""
    return step.did_change() if step.is_complete() else step.will_change


def planned_changes(state, host) -> list[str]:
    """The operations a dry run planned to change on `host`, in order. Only a run that checked
    for changes while planning knows (`pyinfra -y` skips it): otherwise none are listed."""
    if not state.should_check_for_changes():
        return []
    planned = []
    for op_hash in state.get_op_order():
        try:
            meta = state.get_op_data_for_host(host, op_hash).operation_meta
        except KeyError:  # not an operation of this host
            continue
        if meta.will_change:
            planned.append(operation_name(state, op_hash))
    return planned


# --- stages and hosts -------------------------------------------------------------------------------


def stage(state):
    """The run's stage (StateStage): pyinfra plans every operation, then executes them, and runs
    each body once in each."""
    return state.current_stage


def executing(state) -> bool:
    """True once pyinfra executes the operations (it runs each body once to plan it first)."""
    return state.current_stage >= StateStage.Execute


def in_limit(state, host) -> bool:
    """True when `host` is in this run (its --limit)."""
    return state.is_host_in_limit(host)


def failed_hosts(state) -> set:
    """The run's hosts that pyinfra failed."""
    return state.failed_hosts


def active_hosts(state) -> list:
    """The run's hosts that have not failed."""
    return state.inventory.get_active_hosts()


OPERATION_OPTIONS = ("is_idempotent", "idempotent_notice", "is_deprecated", "deprecated_for")

# --- operations (hook 3) ----------------------------------------------------------------------------


def operation_body(op):
    """The generator under an `@operation()` (pyinfra documents it as `_inner`: one operation's
    commands reused inside another)."""
    return op._inner


def operation_options(body) -> dict:
    """The options `@operation()` gave `body` (set on it as attributes), to wrap another function
    the same way (snapshot.reads hands a body its declared answers)."""
    return {name: getattr(body, name) for name in OPERATION_OPTIONS}


def operation_parameters(op) -> inspect.Signature:
    """The parameters of the generator under an `@operation()` (its own, not pyinfra's `_sudo`...)."""
    return inspect.signature(op)  # @operation() wraps it with functools.wraps


# --- loading an inventory as the CLI does (hook 2) --------------------------------------------------


def _import_pyinfra_cli_quietly() -> None:
    if "pyinfra_cli" in sys.modules:
        return
    spec = importlib.util.find_spec("pyinfra_cli")
    package = types.ModuleType("pyinfra_cli")
    package.__path__ = list(spec.submodule_search_locations)
    package.__package__ = "pyinfra_cli"
    sys.modules["pyinfra_cli"] = package


def load_cli_inventory(path: str, cwd: str, fresh=()):
    """pyinfra's own Inventory for the file at `path`, with `cwd`'s group_data, as the CLI loads
    it. Files at `fresh` (paths, or folders: every file under them) are compiled afresh. Raises
    what the CLI raises (click.ClickException, PyinfraError, the file's own errors)."""
    from pyinfra.api.state import State
    from pyinfra.context import ctx_state

    _import_pyinfra_cli_quietly()
    make_inventory = importlib.import_module("pyinfra_cli.inventory").make_inventory
    compiled = importlib.import_module("pyinfra_cli.util").PYTHON_CODES
    for name in list(compiled):
        if any(name == str(f) or name.startswith(f"{f}/") for f in fresh):
            compiled.pop(name, None)
    with ctx_state.use(State(check_for_changes=False)):  # the CLI's exec_file needs a state
        return make_inventory(str(path), cwd=cwd)


# --- one command over the deploy's own SSH connection (hook 6) --------------------------------------


def connectable(inventory, connect_timeout: float):
    """`inventory` (loaded by load_cli_inventory) on a State of its own, so its hosts can connect
    outside a run, each within `connect_timeout` seconds (pyinfra's CONNECT_TIMEOUT). pyinfra's
    and paramiko's log lines are kept off the terminal: what they say of a host is its row."""
    import logging

    from pyinfra.api import Config, State

    for name in ("pyinfra", "paramiko"):
        logging.getLogger(name).addHandler(logging.NullHandler())
    State(inventory, Config(CONNECT_TIMEOUT=connect_timeout), check_for_changes=False)
    return inventory


def run_once(host, command: str, timeout: float, stdin: bytes = b"") -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `command` on `host`, connected as a deploy connects (its
    ssh_* data; host keys checked as the deploy checks them), then disconnected; `stdin` is sent
    first (a secret, kept off the command line). Nothing is asked on the terminal; no read waits
    longer than `timeout` seconds. Raises ConnectError when the host cannot be reached, OSError
    (socket.timeout) when it stops answering."""
    host.connect(show_errors=False, raise_exceptions=True)
    client = getattr(host.connector, "client", None)
    try:
        if client is None:
            raise OSError(f"{host.name}: not an SSH host (status reads boxes over SSH)")
        given, stdout, stderr = client.exec_command(command, timeout=timeout)
        if stdin:
            given.write(stdin)
            given.channel.shutdown_write()
        given.close()
        out, err = stdout.read(), stderr.read()
        return (stdout.channel.recv_exit_status(), out.decode(errors="replace"),
                err.decode(errors="replace"))
    finally:
        if client is not None:
            client.close()
        host.disconnect()


# --- commands shown as they run (hook 7) ----------------------------------------------------------


class ShownCommand(StringCommand):
    """A shell command whose output the operator sees as it comes, under the host's name, without
    -v: the progress of a long transfer or build. Fails the operation as any command does."""

    def execute(self, state, host, connector_arguments):
        connector_arguments.update(self.connector_arguments)
        return host.run_shell_command(self, print_output=True, print_input=state.print_input,
                                      **connector_arguments)


# --- a fact's command and value, read in a batch (hook 8) -----------------------------------------


def fact_command(fact, kwargs) -> tuple[str, str | None]:
    """(the shell command of `fact` with `kwargs`, the program it requires or None)."""
    instance = fact()
    command = instance.command(**kwargs) if callable(instance.command) else instance.command
    if isinstance(command, StringCommand):
        command = command.get_raw_value()
    requires = instance.requires_command
    if callable(requires):
        requires = requires(**kwargs)
    return command, requires


def fact_value(fact, output):
    """What `fact` makes of its command's output lines (its default for none)."""
    instance = fact()
    return instance.process(output) if output else instance.default()


# --- connections opened outside pyinfra's own (hook 9) --------------------------------------------


def connected(host, reason):
    """`host`, connected (raises pyinfra's connection error when it cannot be)."""
    if not host.connected:
        host.connect(reason=reason, raise_exceptions=True)
    return host


def wait_for_reboot(host, rebooted, timeout, every=5) -> bool:
    """Drop `host`'s connection and connect again every `every` s until `rebooted(host)` is true
    on a connection, up to `timeout` s. True when it is (the host is left connected)."""
    deadline = time.monotonic() + timeout
    host.disconnect()
    while time.monotonic() < deadline:
        time.sleep(every)
        host.connect(show_errors=False)
        if host.connected and rebooted(host):
            return True
        if host.connected:
            host.disconnect()
    return False


# --- where SSH dials a host, before connecting (hook 11) ------------------------------------------


class SSHDestination(NamedTuple):
    address: str  # the name or address SSH dials: known_hosts holds the key under it
    port: int
    known_hosts: tuple[str, ...]  # the files the host's key is looked up in, expanded


def ssh_destination(name, data) -> SSHDestination:
    """Where pyinfra's SSH connector dials the host `name` with `data` (its host data), and the
    files it looks the host's key up in: ssh_hostname (else the name), ssh_port and
    ssh_known_hosts_file, else what the ssh_config file says for it, else 22 and
    ~/.ssh/known_hosts. Raises ValueError for an ssh_port that is not a number."""
    from pyinfra.connectors.sshuserclient.client import SSHClient

    # "pkey" given: parse_config would otherwise load ssh_config's IdentityFile, and could ask
    # for its passphrase; the strict policy given: an odd StrictHostKeyChecking there would raise
    address, found, _, _, files, _, _ = SSHClient().parse_config(
        data.get("ssh_hostname") or name, {"pkey": None},
        ssh_config_file=data.get("ssh_config_file"), strict_host_key_checking="yes")
    port = int(data.get("ssh_port") or found.get("port") or 22)  # ssh_port wins, as in connect
    if data.get("ssh_known_hosts_file"):
        files = (os.path.expanduser(data.get("ssh_known_hosts_file")),)
    return SSHDestination(address, port, tuple(files))
