"""Operations any host's service needs, whatever its role: the distribution's packages, a unit
running now, and a unit made to read its files again."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from thorfleet import facts
from thorfleet.operations.commands import sh
from thorfleet.run.snapshot import reads


@reads(installed=lambda packages, **_: (facts.system.DebInstalled, {"packages": list(packages)}))
@operation()
def packages(packages, *, installed, keep_config=False):
    """The distribution's `packages` installed (apt; the lists are refreshed only when one is
    missing, so a re-run reads dpkg and changes nothing). `keep_config`: a config file thorfleet
    wrote before the install is kept (dpkg --force-confold), so the service the package starts
    at once starts with it.

    .. code:: python

        packages(name="Install HAProxy", packages=["haproxy", "socat"])
    """
    missing = [p for p in packages if p not in installed]
    if not missing:
        host.noop(f"{', '.join(packages)} installed")
        return
    keep = "-o Dpkg::Options::=--force-confold " if keep_config else ""
    yield ("export DEBIAN_FRONTEND=noninteractive && apt-get update -q && "
           f"apt-get install -y -q --no-install-recommends {keep}{sh(*missing)}")


@reads(active=lambda unit, **_: (facts.system.UnitActive, {"unit": unit}))
@operation()
def running(unit, *, active):
    """A systemd unit running now (enabled at boot is files.unit_enabled's)."""
    if active == "active":
        host.noop(f"{unit} is running")
        return
    yield sh("systemctl", "start", unit)


@reads(active=lambda unit, **_: (facts.system.UnitActive, {"unit": unit}))
@operation()
def stopped(unit, *, active):
    """A systemd unit not running now (one whose role the inventory no longer gives the host)."""
    if active != "active":
        host.noop(f"{unit} is not running")
        return
    yield sh("systemctl", "stop", unit)


@operation(is_idempotent=False)
def reloaded(unit, restart=False):
    """`unit` made to read its files again: reloaded (e.g. Debian's prometheus.service:
    ExecReload=kill -HUP, which rereads prometheus.yml and the rules and keeps the samples), or
    restarted when `restart` (a new ARGS in /etc/default/prometheus, new code for the watchdog:
    read at start only); started when it is not running. Called only when one of its files
    changed (`_if`).

    + unit: the service, as systemctl takes it
    + restart: restart instead of reload (its arguments changed)

    .. code:: python

        reloaded(name="Reload Prometheus", unit="prometheus.service",
                 _if=lambda: config.did_change())
    """
    verb = "restart" if restart else "reload"
    yield (f"if systemctl is-active --quiet {unit}; then {sh('systemctl', verb, unit)}; "
           f"else {sh('systemctl', 'start', unit)}; fi")


@operation(is_idempotent=False)
def listening_anew(socket, service):
    """A socket unit listening on its new port: `service` stopped first (the holder of the
    socket's descriptor, or of the port itself before there was a socket unit), then the socket
    started; `service`'s own start is the caller's next step. Called only when the socket's file
    changed (`_if`).

    .. code:: python

        listening_anew(name="Listen on the watchdog's port", socket="thorfleet-watchdog.socket",
                       service="thorfleet-watchdog.service", _if=socket_file.did_change)
    """
    yield f"{sh('systemctl', 'stop', service, socket)} && {sh('systemctl', 'start', socket)}"
