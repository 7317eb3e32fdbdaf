"""Monitor: Prometheus scraping every Thor's vLLM and box exporter, with thorfleet's alerts.

On the monitor host (inventory group `monitor`, else each gateway): Prometheus and promtool from
the distribution's packages; its scrape config rendered from the inventory (each box labelled
with its inventory name), thorfleet's alerting rules (files/monitor/alerts.yml) and its arguments
(loopback 127.0.0.1:9090 only, the retention), each checked by promtool before it goes live so a
bad one is never loaded; reloaded only when a file changed. The laptop reaches it through SSH:
`ssh -L 9090:127.0.0.1:9090 <monitor host>`, then http://127.0.0.1:9090.
"""

from io import StringIO

from pyinfra import host
from pyinfra.api import deploy

from thorfleet.gateway.monitor import (
    PROMETHEUS_CONFIG,
    PROMETHEUS_DEFAULTS,
    PROMETHEUS_RULES,
    PROMETHEUS_RULES_DIR,
    PROMETHEUS_UNIT,
)
from thorfleet.operations import files, preflight, system
from thorfleet.run.runstate import run_state
from thorfleet.settings.layout import FILES

# Debian 12's prometheus (2.42), with promtool to check a config and its rules before they go
# live. Its exporters are Recommends, left out: the boxes export their own figures.
MONITOR_PACKAGES = ("prometheus",)


@deploy("Monitor")
def run(m, lock=True):
    if lock:  # a monitor that is the gateway is held by the gateway's run
        this_run = run_state(host.state)
        preflight.box_held(name="Hold the monitor host for this run (one thorfleet run at a time)",
                           holder=this_run.holder, token=this_run.token,
                           wait_s=m.preflight_lock_wait_s)
    # Its arguments before the package: the package starts Prometheus at once, and Debian's own
    # arguments would listen on every address until the restart below.
    arguments = files.whole_file(
        name=f"Write Prometheus's arguments: listen on loopback only, keep "
             f"{m.monitor_retention} of samples",
        src=StringIO(m.defaults_text), path=PROMETHEUS_DEFAULTS, mode="644")
    system.packages(name="Install Prometheus and promtool (the distribution's package, "
                          "keeping those arguments)",
                     packages=MONITOR_PACKAGES, keep_config=True)
    files.directory(name="Create the folder of thorfleet's alerting rules",
                    path=PROMETHEUS_RULES_DIR)
    # the rules first: promtool check config reads the rule files the config names
    rules = files.whole_file(
        name="Write thorfleet's alerting rules (promtool check rules before they go live)",
        src=str(FILES / "monitor" / "alerts.yml"), path=PROMETHEUS_RULES, mode="644",
        check=("promtool", "check", "rules"))
    config = files.whole_file(
        name=f"Write Prometheus's config: {len(m.targets)} box(es), vLLM and box exporter every "
             f"{m.monitor_scrape_interval_s}s (promtool check config before it goes live)",
        src=StringIO(m.config_text), path=PROMETHEUS_CONFIG, mode="644",
        check=("promtool", "check", "config"))
    files.unit_enabled(name="Enable Prometheus at boot", unit=PROMETHEUS_UNIT)
    system.reloaded(name="Restart Prometheus for its new arguments", unit=PROMETHEUS_UNIT,
                     restart=True, _if=arguments.did_change)
    system.reloaded(name="Reload Prometheus for its new config or rules (samples kept)",
                     unit=PROMETHEUS_UNIT,
                     _if=lambda: (config.did_change() or rules.did_change())
                     and not arguments.did_change())
    system.running(name="Prometheus is running", unit=PROMETHEUS_UNIT)
