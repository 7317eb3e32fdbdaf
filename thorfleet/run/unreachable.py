"""Why a run could not connect to a host, and what fixes it: one line per host, naming the setting
and the fix, as `check` names a problem.

    line = why_unreachable(error, address=..., port=..., user=..., key=..., known_hosts=...)

`error` is pyinfra's ConnectError; what went wrong is the exception it was raised from (raised
while handling it: its __context__), paramiko's or the socket's, and those are what this reads.
Pure: no pyinfra, no I/O.
"""

from __future__ import annotations

import errno
import socket

from paramiko import AuthenticationException, BadHostKeyException, SSHException
from paramiko.ssh_exception import NoValidConnectionsError


def keyscan(address, port, file) -> str:
    """The command that adds the host key of `address`:`port` to `file`, as known_hosts names it."""
    port = port or 22
    return f"ssh-keyscan {'' if str(port) == '22' else f'-p {port} '}{address} >> {file}"


def known_hosts_name(address, port) -> str:
    """How known_hosts (and SSH looking a key up) names `address`:`port`."""
    return address if str(port or 22) == "22" else f"[{address}]:{port}"


def no_host_key(said, address, port, file) -> str:
    """The line for a known_hosts (`said`: how to name it) without the key of `address`:`port`,
    while the host key check is strict: `check` says it before connecting, a run once it failed."""
    return (f"{said} holds no host key for {known_hosts_name(address, port)}, and "
            "ssh_strict_host_key_checking='yes' refuses a box it does not know: "
            f"{keyscan(address, port, file)}, once")


def cause_of(error) -> BaseException:
    """The exception pyinfra's ConnectError was raised from (itself when none)."""
    return error.__cause__ or error.__context__ or error


def why_unreachable(error, *, address, port, user, key, known_hosts) -> str:
    """One line: where the run could not connect, pyinfra's words for it, and the fix."""
    where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    fix = fix_for(cause_of(error), address=address, port=port, user=user, key=key,
                  known_hosts=known_hosts)
    return f"could not connect over SSH to {where} ({error}): {fix}"


def fix_for(cause, *, address, port, user, key, known_hosts) -> str:
    """What to do about `cause` (paramiko's or the socket's exception), naming the setting."""
    as_user = f"ssh_user {user!r}" if user else "this machine's user (no ssh_user)"
    ssh = f"ssh -p {port} {user + '@' if user else ''}{address}"
    if isinstance(cause, AuthenticationException):
        with_key = f"ssh_key {key}" if key else "the SSH agent's keys (no ssh_key)"
        copy = f"ssh-copy-id -i {key} -p {port} {user + '@' if user else ''}{address}" if key \
            else "ssh-copy-id"
        return (f"the box refused {as_user} with {with_key}: put the key's public half in that "
                f"user's ~/.ssh/authorized_keys there ({copy}), or set ssh_user and ssh_key to a "
                "pair it takes")
    if isinstance(cause, BadHostKeyException):
        name = known_hosts_name(address, port)
        return (f"it answers with another host key than the one {known_hosts} holds "
                "(ssh_known_hosts_file): if the box was reinstalled, compare the new key with its "
                f"console, then ssh-keygen -R {name} -f {known_hosts} and "
                f"{keyscan(address, port, known_hosts)}; if not, find out what answers at "
                "that address")
    if isinstance(cause, SSHException) and "No host key" in str(cause):
        return no_host_key(f"{known_hosts} (ssh_known_hosts_file)", address, port, known_hosts)
    if isinstance(cause, socket.gaierror):
        return (f"this machine cannot resolve {address!r}: set ssh_hostname to the box's IP "
                "address, or to a name DNS or /etc/hosts resolves")
    if isinstance(cause, TimeoutError):
        return ("no answer before pyinfra's connect timeout: is the box on, and on a network "
                "this machine reaches? Check ssh_hostname, and any firewall between")
    codes = {getattr(e, "errno", None) for e in getattr(cause, "errors", {}).values()}
    if isinstance(cause, ConnectionRefusedError) or (
            isinstance(cause, NoValidConnectionsError) and codes == {errno.ECONNREFUSED}):
        return (f"nothing accepts connections on port {port} there: check ssh_port, and that "
                "the box is up with sshd running")
    if isinstance(cause, OSError):
        return (f"this machine cannot reach it ({cause.strerror or cause}): is the box on, and on "
                "a network this machine reaches? Check ssh_hostname")
    if isinstance(cause, EOFError) or (isinstance(cause, SSHException) and any(
            words in str(cause) for words in ("protocol banner", "No existing session"))):
        return (f"what answers on port {port} did not begin SSH (another service on ssh_port, or "
                f"an sshd turning this machine away): check ssh_port, then {ssh} by hand")
    return f"{ssh} by hand says why; the setting to mend is one of the host's ssh_* data"
