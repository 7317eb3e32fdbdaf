"""Prometheus on the monitor host, rendered on the laptop: its scrape config and its arguments.

    m = MonitorSettings(values, name, targets)   # thorfleet/plan.py makes it, checked
    m.config_text     # /etc/prometheus/prometheus.yml: every Thor's vLLM and box exporter (and
                      # the gateway's usage per client, with gateway_clients)
    m.defaults_text   # /etc/default/prometheus: where it listens, how long it keeps samples
    prometheus_config(m), defaults_text(retention)   # the same, as functions

The monitor host is the inventory group `monitor`'s, else each gateway (roles.monitors_of): a pair
runs two alike, so either answers when the other is lost. Every series names its box by its
inventory name (the target's `host` label), not only by an address, and by nothing that says
which Prometheus read it: both of a pair show the same series and fire the same alerts.
Both files come from emitters (yaml.safe_dump, whole words), so a value never becomes syntax; each
value is checked here by its own rule before it lands (target, label_value, plain_word).
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass
from functools import cached_property

import yaml

from thorfleet.settings.schema import Checked, is_host

PROMETHEUS_UNIT = "prometheus.service"
# Debian 12's package: its paths (dpkg -L prometheus) and its unit's way of reading arguments.
PROMETHEUS_CONFIG = "/etc/prometheus/prometheus.yml"
PROMETHEUS_RULES_DIR = "/etc/prometheus/rules"
PROMETHEUS_RULES = f"{PROMETHEUS_RULES_DIR}/thorfleet.yml"
PROMETHEUS_DEFAULTS = "/etc/default/prometheus"
# Prometheus's own default port, on loopback only: the laptop reaches it through SSH
# (ssh -L 9090:127.0.0.1:9090 <monitor host>); nothing else on the network does.
LISTEN = "127.0.0.1:9090"
VLLM_JOB, BOX_JOB, DOOR_JOB = "vllm", "thorfleet", "door"
METRICS_PATH = "/metrics"
# Prometheus's default scrape timeout (10s) may not exceed the scrape interval (config check:
# "scrape timeout greater than scrape interval").
SCRAPE_TIMEOUT_S = 10


@dataclass(frozen=True)
class Target:
    """One Thor as Prometheus scrapes it: its inventory name (the `host` label), the address the
    monitor dials, vLLM's port and the box exporter's (watchdog_port)."""

    name: str
    address: str
    service_port: int
    watchdog_port: int


def label_value(name) -> str:
    """`name` as the `host` label: Prometheus takes any UTF-8 as a label value, and the YAML
    emitter quotes what needs it; what cannot be read on a dashboard or in an alert's one line
    (a newline, a control character, nothing at all) is refused."""
    if not isinstance(name, str) or not name or not name.isprintable():
        raise ValueError(f"{name!r} cannot be a host label: an inventory name of printable "
                         "characters is (rename the host in the inventory)")
    return name


def target(address, port) -> str:
    """host:port of a static target, an IPv6 address in brackets; refused unless a host name or
    an IP address (no zone: a target is dialled from the monitor host) and a TCP port."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"{port!r} is not a TCP port")
    if not isinstance(address, str) or "%" in address or not is_host(address):
        raise ValueError(f"{address!r} is not a host name or an IP address")
    try:
        bracketed = ipaddress.ip_address(address).version == 6
    except ValueError:  # a host name
        bracketed = False
    return f"[{address}]:{port}" if bracketed else f"{address}:{port}"


def prometheus_config(m) -> str:
    """/etc/prometheus/prometheus.yml of `m` (MonitorSettings, or anything with its fields):
    job `vllm` scrapes each Thor's vLLM /metrics, job `thorfleet` its box exporter, each target
    labelled with the Thor's inventory name; the alerting rules from PROMETHEUS_RULES."""
    interval = m.monitor_scrape_interval_s

    def job(name, port_of):
        return {"job_name": name, "metrics_path": METRICS_PATH, "static_configs": [
            {"targets": [target(t.address, port_of(t))], "labels": {"host": label_value(t.name)}}
            for t in m.targets]}

    config = {
        "global": {"scrape_interval": f"{interval}s",
                   "scrape_timeout": f"{min(interval, SCRAPE_TIMEOUT_S)}s",
                   "evaluation_interval": f"{interval}s"},
        "rule_files": [PROMETHEUS_RULES],
        "scrape_configs": [job(VLLM_JOB, lambda t: t.service_port),
                           job(BOX_JOB, lambda t: t.watchdog_port)],
    }
    door = getattr(m, "door_usage", None)
    if door:  # each client's series carry their own `client` label
        config["scrape_configs"].append({"job_name": DOOR_JOB, "metrics_path": METRICS_PATH,
                                         "static_configs": [{"targets": [door]}]})
    head = "# thorfleet's: rendered from the inventory on every run (edits here are replaced)\n"
    return head + yaml.safe_dump(config, sort_keys=False, allow_unicode=True, width=1000)


def plain_word(value) -> str:
    """`value` as one word of ARGS: a word shlex leaves as it is. Quoting cannot help: systemd
    unquotes `$ARGS` words, Debian's init script (`$ARGS` in sh, unquoted) does not."""
    text = str(value)
    if not text or shlex.quote(text) != text:
        raise ValueError(f"{text!r} cannot be one word of {PROMETHEUS_DEFAULTS}'s ARGS")
    return text


def defaults_text(retention, listen=LISTEN) -> str:
    """/etc/default/prometheus: Prometheus's arguments. Debian 12's prometheus.service reads them
    as `EnvironmentFile=/etc/default/prometheus` and `ExecStart=/usr/bin/prometheus $ARGS` (an
    unbraced $ARGS: split at whitespace into words), its /etc/init.d/prometheus by sourcing the
    file; so ARGS holds plain words, each checked (plain_word)."""
    words = [f"--config.file={PROMETHEUS_CONFIG}", f"--web.listen-address={listen}",
             f"--storage.tsdb.retention.time={retention}"]
    return ("# thorfleet's: Prometheus listens on loopback only; reach it with\n"
            f"# ssh -L 9090:{listen} <monitor host>\n"
            f'ARGS="{" ".join(plain_word(w) for w in words)}"\n')


class MonitorSettings(Checked):
    """The monitor host's checked settings (`m.monitor_retention`, ...) and what is rendered."""

    def __init__(self, values, name: str, targets: list[Target]):
        super().__init__(values, name)
        self.targets = targets
        self.gateway_role = None  # a monitor of its own is no gateway
        # host:port of the gateway's usage per client, when the monitor is a gateway with
        # gateway_clients (thorfleet/plan.py): job `door`, its own gateway's on loopback
        self.door_usage = None

    @property
    def monitor_role(self):
        """What the monitor's deploy renders from (a gateway that is the monitor has its own)."""
        return self

    @cached_property
    def config_text(self) -> str:
        return prometheus_config(self)

    @cached_property
    def defaults_text(self) -> str:
        return defaults_text(self.monitor_retention)
