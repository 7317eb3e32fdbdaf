"""Prometheus on the monitor host, from the distribution's packages: reloaded when its config or
rules changed, restarted when its arguments did (a reload rereads the config and rules only)."""

from __future__ import annotations

from pyinfra.api import operation

from thorfleet.operations.commands import sh

# Debian 12's prometheus (2.42), with promtool to check a config and its rules before they go
# live. Its exporters are Recommends, left out: the boxes export their own figures.
MONITOR_PACKAGES = ("prometheus",)


@operation(is_idempotent=False)
def reloaded(unit, restart=False):
    """`unit` made to read its files again: reloaded (Debian's prometheus.service: ExecReload=
    kill -HUP, which rereads prometheus.yml and the rules and keeps the samples), or restarted
    when `restart` (a new ARGS in /etc/default/prometheus is read at start only); started when it
    is not running. Called only when one of them changed (`_if`).

    + unit: the service, as systemctl takes it
    + restart: restart instead of reload (its arguments changed)

    .. code:: python

        reloaded(name="Reload Prometheus", unit="prometheus.service",
                 _if=lambda: config.did_change())
    """
    verb = "restart" if restart else "reload"
    yield (f"if systemctl is-active --quiet {unit}; then {sh('systemctl', verb, unit)}; "
           f"else {sh('systemctl', 'start', unit)}; fi")
