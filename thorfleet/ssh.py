"""SSH keepalives for every connection pyinfra opens to a box.

A restart is proven for up to service_health_timeout_s (20 min by default) while the laptop's SSH
session sits idle; NAT and firewalls drop idle connections (FACTS.md, "Thor realities"). pyinfra
only takes a keepalive from an ssh_config file's ServerAliveInterval, and pointing it at a file of
ours would hide the operator's own ~/.ssh/config, so thorfleet sets it on each new transport
(paramiko's Transport.set_keepalive) from the host's `ssh_keepalive_interval_s`.
"""

from pyinfra.connectors.ssh import SSHConnector

_connect = SSHConnector._connect


def _connect_with_keepalive(self):
    result = _connect(self)
    seconds = self.host.data.get("ssh_keepalive_interval_s")
    transport = self.client.get_transport() if self.client else None
    if seconds and transport is not None:
        transport.set_keepalive(int(seconds))
    return result


def install_keepalive():
    """Patch pyinfra's SSH connector once (config.py calls this before any connection)."""
    SSHConnector._connect = _connect_with_keepalive
