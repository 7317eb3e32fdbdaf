"""A host the run cannot connect to is one line naming the fix, as `check` says a problem, in place
of pyinfra's own line and paramiko's tracebacks (about 100 lines for three hosts); and a run that
reaches no host still writes its report (its plan under --dry), each host's row saying why.

Fast: no Docker; pyinfra's own SSH connector against local listeners and paramiko servers. The
edits that break them (each seen failing once): paramiko's logger left without a handler (its
tracebacks on stderr again); pyinfra's own line for the host not filtered (two lines per host),
or its strict host key policy's;
report.unreachable not installing the report (a run that reached no host writes none); is_plan
taking a run that stopped while connecting for a dry run (its report not written); --dry read at
exit rather than as the inventory loads (click's context is gone by then: the plan written as a
report); fix_for reading pyinfra's ConnectError rather than what it was raised from (every host
the catch-all line); a changed host key tested after a missing one (said as missing).
"""

import errno
import json
import socket
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
from paramiko.ssh_exception import NoValidConnectionsError
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import StateStage

from tests.fast.test_gateway_render import PINS
from tests.fast.test_status import Boxes
from tests.helpers import accepting, free_port
from thorfleet.run import pyinfra_hooks
from thorfleet.run.unreachable import fix_for, why_unreachable

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def closing_port():
    """A port whose listener closes each connection at once, before any SSH banner."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepting(listener, lambda conn: conn.close())
    yield listener.getsockname()[1]
    listener.close()


def pyinfra(*args):
    return subprocess.run([sys.executable, "-m", "pyinfra", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          check=False)


@pytest.fixture
def boxes(tmp_path):
    user = paramiko.RSAKey.generate(1024)
    user.write_private_key_file(str(tmp_path / "id_rsa"))
    found = Boxes(user, "{}")
    for name in ("known", "unknown", "changed", "stranger"):
        found.start(name)
    yield found
    found.close()


def test_a_run_that_reaches_no_host_says_one_line_each_and_writes_its_report(tmp_path,
                                                                            closing_port, boxes):
    key = tmp_path / "api_key"
    key.write_text("sk-test-the-boxes-own-0123456789\n")
    key.chmod(0o600)
    (tmp_path / "kh").touch()
    report = tmp_path / "report.json"
    refused, unknown = free_port(), boxes.ports["unknown"]  # an SSH server the laptop lacks
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f"thors = ([('thor-1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {refused}}}), "
        f"('thor-2', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {closing_port}}}), "
        f"('thor-3', {{'ssh_hostname': '127.0.0.1', 'ssh_port': {unknown}}})], "
        f"{{**{PINS!r}, 'service_api_key_file': {str(key)!r}, 'ssh_user': 'ubuntu', "
        f"'ssh_known_hosts_file': {str(tmp_path / 'kh')!r}, "
        f"'rollout_report_path': {str(report)!r}}})\n")
    fixes = {"thor-1": (f"could not connect over SSH to 127.0.0.1:{refused} (Could not connect",
                        (f"nothing accepts connections on port {refused} there: check "
                         "ssh_port, and that the box is up with sshd running")),
             "thor-2": (f"could not connect over SSH to 127.0.0.1:{closing_port} (SSH error",
                        (f"did not begin SSH (another service on ssh_port, or an sshd turning "
                         f"this machine away): check ssh_port, then ssh -p {closing_port} "
                         "ubuntu@127.0.0.1 by hand")),
             "thor-3": (f"could not connect over SSH to 127.0.0.1:{unknown} (SSH error",
                        f"ssh-keyscan -p {unknown} 127.0.0.1 >> {tmp_path / 'kh'}, once")}

    def said_once_each(done):
        assert done.returncode == 1, done.stderr  # pyinfra's "No hosts remaining!"
        assert "Traceback" not in done.stderr and "paramiko" not in done.stderr, done.stderr
        # nor the strict host key policy's own line, which names no host
        assert not any(line.strip().startswith("No host key")
                       for line in done.stderr.splitlines()), done.stderr
        for name, (begins, fix) in fixes.items():
            lines = [line for line in done.stderr.splitlines() if f"[{name}]" in line]
            assert len(lines) == 1, done.stderr
            assert f"thorfleet: {begins}" in lines[0] and lines[0].endswith(fix), lines[0]

    dry = pyinfra("--dry", inventory, "deploy.py")
    said_once_each(dry)
    assert not report.exists()  # --dry leaves the last report alone, and writes its plan
    plan = json.loads(Path(f"{report}.dry.json").read_text())
    assert plan["would_change"] == {} and sorted(plan["unreachable"]) == list(fixes)
    assert plan["unreachable"]["thor-1"].endswith(fixes["thor-1"][1])

    run = pyinfra("-y", inventory, "deploy.py")
    said_once_each(run)
    rows = json.loads(report.read_text())["hosts"]
    for name, (begins, fix) in fixes.items():
        assert rows[name]["error"].startswith(begins) and rows[name]["error"].endswith(fix)


def test_each_way_pyinfras_ssh_fails_is_said_with_its_fix(tmp_path, boxes, closing_port):
    """pyinfra 3.10's real connection errors, read as the run reads them (the host_connect_error
    event while it connects), each with the fix for what happened."""
    kh = tmp_path / "kh"
    kh.write_text("".join(f"[127.0.0.1]:{boxes.ports[n]} ssh-rsa {boxes.keys[n].get_base64()}\n"
                          for n in ("known", "stranger")))
    other = paramiko.RSAKey.generate(1024).get_base64()
    with kh.open("a") as file:  # a key the box "changed" no longer has (a reinstalled box)
        file.write(f"[127.0.0.1]:{boxes.ports['changed']} ssh-rsa {other}\n")
    common = {"ssh_hostname": "127.0.0.1", "ssh_user": "thor", "ssh_key": str(tmp_path / "id_rsa"),
              "ssh_known_hosts_file": str(kh), "ssh_strict_host_key_checking": "yes"}
    refused = free_port()
    hosts = [(name, {**common, "ssh_port": boxes.ports[name]})
             for name in ("known", "unknown", "changed")]
    hosts += [("stranger", {**common, "ssh_port": boxes.ports["stranger"], "ssh_user": "nobody"}),
              ("refused", {**common, "ssh_port": refused}),
              ("closing", {**common, "ssh_port": closing_port})]
    state = State(Inventory((hosts, {})), Config(CONNECT_TIMEOUT=5))
    said = {}

    def say(state, host, error):
        data = host.data.dict()
        said[host.name] = why_unreachable(error, address="127.0.0.1", port=data["ssh_port"],
                                          user=data["ssh_user"], key=data["ssh_key"],
                                          known_hosts=str(kh))

    pyinfra_hooks.when_unreachable(say)(state)
    state.set_stage(StateStage.Connect)
    connect_all(state)  # "known" connects: the run goes on
    port = boxes.ports
    assert sorted(said) == ["changed", "closing", "refused", "stranger", "unknown"]
    assert said["unknown"].endswith(
        f"{kh} (ssh_known_hosts_file) holds no host key for [127.0.0.1]:{port['unknown']}, and "
        "ssh_strict_host_key_checking='yes' refuses a box it does not know: "
        f"ssh-keyscan -p {port['unknown']} 127.0.0.1 >> {kh}, once"), said["unknown"]
    assert f"it answers with another host key than the one {kh} holds" in said["changed"]
    assert f"ssh-keygen -R [127.0.0.1]:{port['changed']} -f {kh}" in said["changed"]
    assert "the box refused ssh_user 'nobody' with ssh_key" in said["stranger"]
    assert f"ssh-copy-id -i {tmp_path / 'id_rsa'} -p {port['stranger']} nobody@127.0.0.1" in \
        said["stranger"]
    assert said["refused"].endswith(f"nothing accepts connections on port {refused} there: "
                                    "check ssh_port, and that the box is up with sshd running")
    assert "did not begin SSH" in said["closing"]
    # once the run executes, a reconnection's failure is its caller's to say (a drain, a reboot)
    state.set_stage(StateStage.Execute)
    said.clear()
    with pytest.raises(PyinfraError):
        pyinfra_hooks.connected(state.inventory.get_host("refused"), reason="a drain")
    assert said == {}


class RaisedFrom(Exception):
    """Stands for pyinfra's ConnectError, raised while handling what went wrong, as it is."""


def raised_from(cause):
    try:
        raise cause
    except (OSError, EOFError, paramiko.SSHException):
        try:
            raise RaisedFrom("pyinfra's words")
        except RaisedFrom as error:
            return error


HOST = {"address": "thor-01.lab", "port": 22, "user": "ubuntu", "key": "~/.ssh/id_ed25519",
        "known_hosts": "~/.ssh/known_hosts"}


@pytest.mark.parametrize("cause, fix", [
    (socket.gaierror(-2, "Name or service not known"),
     "this machine cannot resolve 'thor-01.lab': set ssh_hostname to the box's IP address"),
    (TimeoutError("timed out"), "no answer before pyinfra's connect timeout"),
    (NoValidConnectionsError({("10.0.0.1", 22): OSError(errno.EHOSTUNREACH, "No route to host")}),
     "this machine cannot reach it (Unable to connect to port 22 on 10.0.0.1)"),
    (NoValidConnectionsError({("10.0.0.1", 22): ConnectionRefusedError(errno.ECONNREFUSED, "x")}),
     "nothing accepts connections on port 22 there: check ssh_port"),
    (paramiko.AuthenticationException("Authentication failed."),
     "the box refused ssh_user 'ubuntu' with ssh_key ~/.ssh/id_ed25519"),
    (paramiko.SSHException("StrictPolicy: No host key for thor-01.lab found in known_hosts"),
     "ssh-keyscan thor-01.lab >> ~/.ssh/known_hosts, once"),
    (EOFError(), "did not begin SSH"),
    (paramiko.SSHException("Incompatible ssh peer (no acceptable kex algorithm)"),
     "ssh -p 22 ubuntu@thor-01.lab by hand says why"),
])
def test_each_cause_names_its_fix(cause, fix):
    line = why_unreachable(raised_from(cause), **HOST)
    assert line.startswith("could not connect over SSH to thor-01.lab:22 (pyinfra's words): ")
    assert fix in line, line
    assert fix_for(cause, **HOST) in line


def test_without_an_ssh_key_the_agents_keys_are_named():
    assert fix_for(paramiko.AuthenticationException(), **{**HOST, "key": None}).startswith(
        "the box refused ssh_user 'ubuntu' with the SSH agent's keys (no ssh_key)")
