"""The gateway, rendered on the laptop: HAProxy's config, its certificate, the Thors' firewall.

    g = GatewaySettings(values, name, address, backends)   # thorfleet/plan.py makes it, checked
    g.config_text          # /etc/haproxy/haproxy.cfg
    g.pem                  # certificate chain + key (fleet CA's, or the operator's)
    g.endpoint             # {"url": ..., "ca_file": ...}: what clients use, in the report
    firewall_script(ports, *ips)  # a Thor's nftables table (and its mark): only these get in

Every value lands through the emitter of the file it lands in (haproxy_word, nft_word), which
refuses what that file's grammar would read as more than one word; the schema and the run's plan
(thorfleet/plan.py) have checked each value's own rule before.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import jinja2

from thorfleet.gateway import tls
from thorfleet.gateway.monitor import target
from thorfleet.gateway.policy import AT_SHARE_CLASS, fair_share
from thorfleet.settings import layout
from thorfleet.settings.clients import PRIORITY_CLASS
from thorfleet.settings.recipe import (
    BODY_BYTES_PER_TOKEN,
    IMAGE_BODY_BYTES,
    LEGACY_MODEL,
    PREFILL_MARGIN,
    PROFILES,
)
from thorfleet.settings.schema import Checked, check_names

# HAProxy's config words (configuration.txt, 2.2 "Quoting and escaping"): outside quotes a space
# or '#' ends a word, '\', '"', "'" and '$' start an escape, a quote or a variable. A plain word
# holds none of them; anything else is single-quoted (no escapes inside), or refused.
_HAPROXY_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+,=\[\]-]+")
_HAPROXY_QUOTABLE = re.compile(r"[ -&(-~]+")  # printable ASCII but the single quote
# A server name in HAProxy: letters, digits, '-', '_', '.' and ':' (configuration.txt, "server").
SERVER_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
# A box is in rotation while its watchdog says it serves (files/thor/bin/thorfleet-watchdog, on
# watchdog_port): 200 only while vLLM's own /health answers 200 and the last check that the
# server generates passed. vLLM's /health alone stays 200 on a wedged engine.
HEALTH_PATH = "/healthy"
# How long the door waits for a request's headers, and then for its body where it reads one.
REQUEST_TIMEOUT_S = 30
# What the door sends again, to another box, when a request failed before any byte of its answer
# (HAProxy's retry-on): a connection refused, a box that closed without answering or answered
# junk, a 502 or 503 from a server going down. Not 500 (vLLM's answer to a request it cannot
# take, which would fail on every box) nor response-timeout (a request held for `timeout server`
# would then hold another box as long).
RETRY_ON = ("conn-failure", "empty-response", "junk-response", "502", "503")
# Failed answers in a row that take a box out of rotation at the door (observe layer7): one is a
# passing fault, three a server that fails whatever it is sent. Its checks put it back.
ERROR_LIMIT = 3
# What the door's request buffers may hold at once, at worst (each connection a full buffer of
# tune.bufsize): the door's connections are bounded by it.
DOOR_BUFFER_BUDGET = 1 << 30
# How often the door's usage service (files/gateway/bin/thorfleet-door-usage) asks every box for its
# counts, and how long it waits for each: a client over a budget is refused within about one
# interval (and a box that does not answer in time keeps its last counts).
USAGE_INTERVAL_S = 2
USAGE_TIMEOUT_S = 1
# The most connections the door takes at once however small its buffer, and the room above them
# for the runtime API and the pair's level frontend.
DOOR_MAXCONN_CAP = 4000
DOOR_MAXCONN_SPARE = 100
# The header a client names its conversation by (llm-d's x-session-token): turns that carry the
# same one are one conversation, kept on its box (gateway_affinity_balance_factor), whatever
# their bodies say.
SESSION_HEADER = "X-Session-Token"
# A conversation's first messages, as the door reads them when no SESSION_HEADER names it: the
# first message, and the second too when the first is a system prompt (shared by many
# conversations: alone it would send them all to one box). A turn's earlier messages are
# resent unchanged, so every turn reads the same. A content of parts: its first part's text.
FIRST_MESSAGE_ROLES = ("system", "developer")


def haproxy_word(value):
    """`value` as one word of haproxy.cfg."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{value!r} has no haproxy.cfg spelling")
    if isinstance(value, int):
        return str(value)
    text = str(value)
    if _HAPROXY_PLAIN.fullmatch(text):
        return text
    if _HAPROXY_QUOTABLE.fullmatch(text):
        return f"'{text}'"
    raise ValueError(f"{text!r} cannot be one haproxy.cfg word")


def nft_word(value):
    """`value` as one word of an nft script: a number, an IP address, a plain name, a quoted
    string (nft's strings take no escapes: one holding a quote or a newline is refused), or a
    tuple of numbers as an anonymous set (`{ 8002, 9105 }`)."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{value!r} has no nft spelling")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple) and value and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return "{ " + ", ".join(map(str, value)) + " }"
    if isinstance(value, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return str(value)
    text = str(value)
    if re.fullmatch(r"[a-z][a-z0-9_]*", text):
        return text
    if re.fullmatch(r"[ !#-~]*", text):
        return f'"{text}"'
    raise ValueError(f"{text!r} cannot be one nft word")


def map_line(key, value) -> str:
    """One line of a HAProxy map file: the key is its first word (up to a space or tab), the
    value the rest of the line; a line starting with '#' is a comment. A key with a space or a
    control character, or a value that would reach past its line, is refused."""
    key, value = str(key), str(value)
    if not _MAP_KEY.fullmatch(key):
        raise ValueError(f"{key!r} cannot be one key of a HAProxy map")
    if not _MAP_VALUE.fullmatch(value):
        raise ValueError(f"{value!r} cannot be one value of a HAProxy map")
    return f"{key} {value}\n"


_MAP_KEY = re.compile(r"[!-\"$-~][!-~]*")  # visible ASCII, no '#' first
_MAP_VALUE = re.compile(r"[!-~]([ -~]*[!-~])?")  # one line of printable ASCII, no space at its ends


def _environment(finalize):
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(layout.GATEWAY_FILES)),
                              keep_trailing_newline=True, undefined=jinja2.StrictUndefined,
                              finalize=finalize)


def keepalived_word(value):
    """A word of keepalived's config: plain (letters, digits and _.:/@+=-), since a space, '#',
    '!', a quote or a brace would end it or start something else; anything else is refused."""
    text = str(value)
    if _KEEPALIVED_PLAIN.fullmatch(text):
        return text
    raise ValueError(f"{text!r} cannot be one keepalived word")


_KEEPALIVED_PLAIN = re.compile(r"[A-Za-z0-9_.:/@+=-]+")
_HAPROXY = _environment(haproxy_word)
_NFT = _environment(nft_word)
_KEEPALIVED = _environment(keepalived_word)


# The name the clients map gives the fleet's one key (service_api_key_file), which opens the door
# without gateway_clients. Outside schema.CLIENT_NAME's grammar (a letter first), so no client is
# ever named so; and the map holds it only when there are no clients.
FLEET_CLIENT = "_fleet"


def error_body(status, kind, message) -> str:
    """The door's own answer as an OpenAI client reads an error: one line of JSON."""
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": status}}, separators=(",", ":"))


def queue_message(seconds: int) -> str:
    return f"no box was free within {seconds} s; try again later"


def lf_error_body(status, kind, message, **samples) -> str:
    """error_body as a HAProxy log-format string (`lf-string`): each `{name}` of `message` is
    the sample expression samples[name], filled in per request (one of thorfleet's own, never a
    value of the inventory), and every other '%' is doubled to stand for itself."""
    marks = {name: f"\x01{name}\x01" for name in samples}
    body = error_body(status, kind, message.format(**marks)).replace("%", "%%")
    for name, expression in samples.items():
        body = body.replace(json.dumps(marks[name])[1:-1], f"%[{expression}]")
    return body


def pool_name(model: str) -> str:
    """The HAProxy backend of the boxes serving `model` (a fleet of several models)."""
    return f"{layout.GATEWAY_BACKEND}-{model}"


# Two gateways: VRRP, the level port and the peers port answer the other only, in a table of
# their own (a gateway may be a Thor too, with layout.FIREWALL_TABLE), loaded by keepalived's
# drop-in.
GATEWAY_FIREWALL_TABLE = ("inet", "thorfleet_gateway")
GATEWAY_FIREWALL = "/etc/haproxy/thorfleet/firewall.nft"  # beside the level file
GATEWAY_FIREWALL_DROPIN = "thorfleet-keepalived-firewall.conf"  # files/gateway/systemd/
VRRP = 112  # its IP protocol number (RFC 5798)
# Both gateways' keepalived started at once (a first run, both booted together): each waits 3
# adverts and its priority's skew (~3.4 s at 150, ~3.6 s at 100) before it takes the address, so
# the one started half a second earlier won, whatever its priority, and nopreempt kept it there
# (seen in the pair's story). The other gateway's VRRP starts this much after its keepalived
# (keepalived.conf(5) vrrp_startup_delay): the first of the inventory is elected before it looks.
VRRP_STARTUP_DELAY_S = 10


def firewall_script(ports, *sources: str, protocols=(), table=layout.FIREWALL_TABLE
                    ) -> tuple[str, str]:
    """(script, mark) of a Thor's nftables table: its `ports` (vLLM's, the watchdog's) answer
    the `sources` (the gateway's IP, a monitor host's) and the box itself only; so do the IP
    `protocols` (numbers) but from the `sources` only. The last rule's comment is `mark`, a
    digest of the rest, so a fact tells the live table is this one from `nft list table` alone."""
    addresses = sorted({ipaddress.ip_address(s) for s in sources if s},
                       key=lambda a: (a.version, a))
    family, table = table
    ports = sorted({_port(p) for p in ports})
    protocols = tuple(sorted({_protocol(p) for p in protocols})) or None

    def render(mark):
        return _NFT.get_template("firewall.nft.j2").render(
            family=family, table=table, ports=tuple(ports), protocols=protocols,
            sources=[("ip" if a.version == 4 else "ip6", a) for a in addresses], mark=mark)

    mark = f"thorfleet {hashlib.sha256(render('thorfleet').encode()).hexdigest()[:16]}"
    return render(mark), mark


def _protocol(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
        raise ValueError(f"{value!r} is not an IP protocol number")
    return value


def _port(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError(f"{value!r} is not a TCP port")
    return value


@dataclass(frozen=True)
class Backend:
    """One Thor behind the gateway: its inventory name, where the gateway dials its vLLM port,
    how many requests it takes at once (vLLM's max_num_seqs), the port its health check asks
    (the watchdog's), and its serving profile (recipe.PROFILES: the model it serves, under which
    names)."""

    name: str
    address: str
    port: int
    maxconn: int
    check_port: int
    profile: str = "default"
    names: tuple[str, ...] = ()
    images: int = 0  # the images a prompt may hold (a vision box's service_images_per_prompt)

    @property
    def model(self) -> str:
        return PROFILES[self.profile]["model"]

    @property
    def dial(self) -> str:
        """address:port as HAProxy reads a server's: an IPv6 address in brackets (unbracketed,
        its first ':' was once taken for the port's)."""
        return target(self.address, self.port)


class GatewaySettings(Checked):
    """The gateway host's checked settings (`g.gateway_port`, ...) and what is rendered from them."""

    def __init__(self, values, name: str, address: str, backends: list[Backend], box_key: str,
                 names=None, pair=None, policies=None):
        super().__init__(values, name)
        # {client name: its ClientPolicy}, each with its key once the run's plan has read it
        # (run/laptop.client_keys); else as gateway_clients declares them (values.client_policies)
        self.policies = values.client_policies if policies is None else policies
        self.address = address  # how the laptop reaches it (ssh_hostname): a name clients use
        # Every name clients use for the door, the certificate's: the virtual address first (two
        # gateways), then each gateway's inventory address, then gateway_names.
        self.names = check_names(names or [address, *self.gateway_names])
        # [(gateway host, the address it connects from)] of every gateway, this one included, in
        # inventory order (the first is the one keepalived prefers).
        self.pair = pair or [(name, address)]
        self.backends = backends
        # the boxes' service key: the one the door sends them; without gateway_clients, the one
        # it opens to
        self.box_key = box_key
        self.health_path = HEALTH_PATH
        self.monitor_role = None  # MonitorSettings when Prometheus runs here (thorfleet/plan.py)

    @property
    def gateway_role(self):
        """What the gateway's deploy renders from (a Thor that is the gateway too has its own)."""
        return self

    @property
    def own_address(self) -> str:
        """The address this gateway connects from (gateway_fleet_address, else ssh_hostname)."""
        return dict(self.pair)[self.name]

    @property
    def preferred(self) -> bool:
        """Whether this is the inventory's first gateway, the one that holds the address when
        both are up."""
        return self.pair[0][0] == self.name

    @property
    def vrrp_priority(self) -> int:
        """keepalived's priority: the preferred gateway's higher."""
        return 150 if self.preferred else 100

    @property
    def vrrp_startup_delay(self) -> int:
        """Seconds this gateway's VRRP waits once keepalived starts: none on the preferred one,
        VRRP_STARTUP_DELAY_S on the other, so an election both start at once is the first's."""
        return 0 if self.preferred else VRRP_STARTUP_DELAY_S

    def check_command(self, kind) -> list[str]:
        """keepalived's check of this gateway (files/gateway/bin/thorfleet-door-check): `up` (HAProxy
        runs) or `level` (not behind the other gateway)."""
        if kind == "up":
            return [layout.GATEWAY_DOOR_CHECK, "up"]
        # this gateway's own HAProxy first (the level it runs), then the other's
        urls = [f"http://{target(address, layout.GATEWAY_LEVEL_PORT)}/"
                for _, address in [(self.name, self.own_address), *self.peers]]
        return [layout.GATEWAY_DOOR_CHECK, "level", layout.GATEWAY_PEER_LEVEL, *urls]

    def keepalived_text(self, interface: str) -> str:
        """keepalived's config on this gateway, holding gateway_virtual_ip on `interface` (the
        one that has this gateway's own address)."""
        return _KEEPALIVED.get_template("keepalived.conf.j2").render(g=self, interface=interface)

    @cached_property
    def level_digest(self) -> str:
        """What must be alike on both gateways before either may hold the address: the config,
        the certificate, the door's key maps (a digest: none of it in clear). The config is
        taken with '-' where it carries this digest (its level frontend's header) and where it
        names this gateway's own peer (`localpeer`, the one line that differs between them)."""
        digest = hashlib.sha256()
        for part in (self._config("-", "-"), self.pem, *self.maps.values()):
            digest.update(hashlib.sha256(part.encode()).digest())
        return digest.hexdigest()[:32]

    @property
    def peers(self) -> list[tuple[str, str]]:
        """[(host, address)] of the other gateway sharing gateway_virtual_ip (none alone)."""
        return [(name, source) for name, source in self.pair if name != self.name]

    @property
    def peer_firewall(self) -> str:
        """This gateway's nftables table (two gateways): VRRP, the level port and the clients
        table's peers port answer the other gateway only, and the gateway itself."""
        ports = (layout.GATEWAY_LEVEL_PORT, *([layout.GATEWAY_PEERS_PORT] if self.door_peers
                                              else []))
        return firewall_script(ports, *(a for _, a in self.peers), protocols=(VRRP,),
                               table=GATEWAY_FIREWALL_TABLE)[0]

    @property
    def door_peers(self) -> list[tuple[str, str]]:
        """[(peer name, address:port)] of HAProxy's peers section, which keeps the clients table
        (gateway_clients) and the conversations' homes (affinity); none without either. One
        gateway: its own peer on loopback, where the old process hands its rows to the new one at
        a reload. Two: each gateway's peer on its own address, so each sends its rows to the
        other and a failover keeps them. Named by place in the inventory, not by host name: one
        grammar, and the same lines on both."""
        if not (self.gateway_clients or self.affinity):
            return []
        addresses = [a for _, a in self.pair] if self.peers else ["127.0.0.1"]
        return [(f"gateway-{n}", target(a, layout.GATEWAY_PEERS_PORT))
                for n, a in enumerate(addresses, 1)]

    @property
    def local_peer(self) -> str:
        """This gateway's name in door_peers (HAProxy's `localpeer`, so the name does not hang on
        the host name: a renamed host would otherwise find no peer of its own at a reload)."""
        return f"gateway-{[name for name, _ in self.pair].index(self.name) + 1}"

    @cached_property
    def queue_timeouts(self) -> dict[str, int]:
        """{pool: seconds a request may wait for one of its slots}: gateway_queue_timeout_s, or
        its boxes' longest prefill (recipe.PROFILES prefill_s, with PREFILL_MARGIN) when that is
        longer: a second 256K prompt waits out the first's minutes of prefill, not a 503."""
        return {pool: max(self.gateway_queue_timeout_s,
                          max(math.ceil(PROFILES[b.profile]["prefill_s"] * PREFILL_MARGIN)
                              for b in boxes))
                for pool, boxes in self.pools.items()}

    @staticmethod
    def queue_error(seconds: int) -> str:
        """The door's 503 when no slot freed within `seconds` (a pool's queue timeout)."""
        return error_body(503, "service_unavailable", queue_message(seconds))

    @property
    def error_responses(self) -> list[dict]:
        """The door's own answers, as OpenAI clients read an error: JSON with `error.message`,
        `type` and `code`, not HAProxy's HTML page; a 503 (no box free within
        gateway_queue_timeout_s, or none in rotation) says when to try again (Retry-After)."""
        said = {
            401: ("invalid_api_key", ("no client key, or one this door does not know: send "
                                      "yours as Authorization: Bearer <key>"), None),
            404: ("not_found", "this route is not served here: the OpenAI API is under /v1/",
                  None),
            502: ("bad_gateway", "the box answering this request failed; try again", None),
            503: ("service_unavailable", queue_message(self.gateway_queue_timeout_s),
                  self.gateway_retry_after_s),
            504: ("gateway_timeout", "the box did not answer in time", None),
        }
        return [{"status": status, "retry_after": retry, "body": error_body(status, kind, message)}
                for status, (kind, message, retry) in sorted(said.items())]

    @property
    def limit_bodies(self) -> dict:
        """The door's 429s, as OpenAI's rate-limit errors read (log-format strings naming the
        client's own limit): over its requests at once, or over its requests a minute."""
        inflight = ("this client has {limit} requests at the door already (its max_inflight in "
                    "gateway_clients, else gateway_client_max_inflight); try again later")
        rate = ("this client started {limit} requests in the last minute (its requests_per_minute "
                "in gateway_clients, else gateway_client_requests_per_minute); try again later")
        said = {"inflight": (inflight, "var(txn.max_inflight)"),
                "rate": (rate, "var(txn.requests_per_minute)")}
        return {reason: lf_error_body(429, "rate_limit_exceeded", message, limit=limit)
                for reason, (message, limit) in said.items()}

    @property
    def budget_bodies(self) -> dict:
        """The door's 429s to a client over a token budget, by budget (log-format strings naming
        the client, its budget's tokens from the budget map, and when it frees); a day's or a
        month's is OpenAI's insufficient_quota, a minute's a rate limit."""
        said = {
            "tokens_per_minute": ("rate_limit_exceeded", "any 60 s",
                                  "it frees as its tokens of the last minute age out"),
            "tokens_per_day": ("insufficient_quota", "UTC day", "it frees at 00:00 UTC"),
            "tokens_per_month": ("insufficient_quota", "UTC month",
                                 "it frees on the 1st of next month, 00:00 UTC"),
        }
        return {budget: lf_error_body(
            429, kind, f"{{client}} is over its {budget} ({{tokens}} tokens, {period}): {frees}; "
            "Retry-After says in how many seconds", client="var(txn.client)",
            tokens="var(txn.budget),field(3,:)")
            for budget, (kind, period, frees) in said.items()}

    @property
    def runtime_maps(self) -> tuple[str, ...]:
        """The maps haproxy.cfg reads that the door's own programs keep, not the deploy: it makes
        each empty when missing (HAProxy refuses a config naming a map file that is not there)
        and never writes them. With gateway_clients: the budget map (thorfleet-door-usage)."""
        return (layout.GATEWAY_BUDGET_MAP,) if self.gateway_clients else ()

    @property
    def usage_config(self) -> dict:
        """What thorfleet-door-usage reads (layout.GATEWAY_DOOR_USAGE_CONFIG): every box, asked
        for its counts at its check port (the watchdog's, as HAProxy's health check), each
        client's token budgets (None: none), and how often and how long it asks."""
        return {"boxes": [{"name": b.name, "address": b.address, "port": b.check_port}
                          for b in self.backends],
                "clients": {name: p.budgets for name, p in self.policies.items()},
                "interval_s": USAGE_INTERVAL_S, "timeout_s": USAGE_TIMEOUT_S}

    @property
    def usage_config_text(self) -> str:
        return json.dumps(self.usage_config, indent=1) + "\n"

    @property
    def denied_bodies(self) -> dict:
        """The door's 403s to a client calling a model its `models` leaves out: naming the model
        (JSON-escaped by HAProxy's json converter), or, for a request naming none, the model it
        would go to."""
        first = self.pool_model(next(iter(self.pools)))
        return {
            "named": lf_error_body(403, "PermissionDeniedError",
                                   'this client may not call the model "{model}": GET /v1/models '
                                   "lists the ones it may", model="var(txn.model),json(utf8s)"),
            "unnamed": error_body(403, "PermissionDeniedError",
                                  f"a request naming no model goes to {first}, which this client "
                                  "may not call: name one GET /v1/models lists"),
        }

    @property
    def ipv6_clients(self) -> bool:
        """A client name is an IPv6 address: the front door listens on both families."""
        return any(":" in name for name in self.names)

    @property
    def url(self) -> str:
        """The door's URL at its first name (the report's endpoint)."""
        return self.url_at(self.names[0])

    def url_at(self, name: str) -> str:
        """The door's URL at one of its names (an IPv6 address in brackets)."""
        host = f"[{name}]" if ":" in name else name
        return f"https://{host}:{self.gateway_port}"

    @property
    def api_urls(self) -> list[str]:
        """The base URL a client gives its OpenAI SDK (where the OpenAI API is), at each name
        the certificate holds, the report's first."""
        return [f"{self.url_at(name)}/v1" for name in self.names]

    @property
    def operator_certificate(self) -> bool:
        return self.gateway_tls_cert_file is not None

    @property
    def ca_file(self) -> str:
        """What clients trust: the fleet CA's certificate, or the operator's chain."""
        if self.operator_certificate:
            return str(Path(self.gateway_tls_cert_file).expanduser())
        return str(self.ca_dir / "fleet-ca.pem")

    @property
    def endpoint(self) -> dict:
        return {"url": self.url, "ca_file": self.ca_file}

    @cached_property
    def pem(self) -> str:
        """HAProxy's `crt` file: the certificate (chain) and its key, read only: the operator's,
        or the fleet CA's that a deploy made before it planned any host (plan.make_laptop_files),
        the same bytes on a re-run."""
        if self.operator_certificate:
            pair = tls.operator_pair(Path(self.gateway_tls_cert_file).expanduser(),
                                     Path(self.gateway_tls_key_file).expanduser(), self.names)
        else:
            pair = tls.held_pair(self.ca_dir, self.door_holder, self.names)
        return tls.haproxy_pem(*pair).decode()

    @property
    def ca_dir(self) -> Path:
        return Path(self.gateway_ca_dir).expanduser()

    @property
    def door_holder(self) -> str:
        """One certificate for the door, on each gateway: kept under the first gateway's name."""
        return self.pair[0][0]

    @property
    def client_keys(self) -> dict[str, str]:
        """{client name: its key}, as the run's plan read them from the laptop's key files
        (gateway_clients; run/laptop.client_keys, which a deploy has made the missing ones)."""
        missing = [p for p in self.policies.values() if p.key is None]
        if missing:
            raise ValueError(f"client {missing[0].name}'s key file {missing[0].key_file} is not "
                             "read: a deploy makes and reads it before it plans any host "
                             "(pyinfra INVENTORY deploy.py)")
        keys = {}
        for name, policy in self.policies.items():
            same = next((other for other, taken in keys.items() if taken == policy.key), None)
            if same is not None:  # the plan refuses it first (laptop.client_keys)
                raise ValueError(f"client {name}'s key file {policy.key_file} holds client "
                                 f"{same}'s key: each client needs a key of its own")
            keys[name] = policy.key
        return keys

    @property
    def door_keys(self) -> dict[str, str]:
        """{name: key} of what opens the door: each client's (gateway_clients), else the fleet's
        one key, the boxes' own, as FLEET_CLIENT."""
        return self.client_keys if self.gateway_clients else {FLEET_CLIENT: self.box_key}

    @property
    def clients_map_text(self) -> str:
        """HAProxy's map of the door's keys: the SHA-256 (hex) of each, and its name."""
        return "".join(map_line(hashlib.sha256(key.encode()).hexdigest(), name)
                       for name, key in self.door_keys.items())

    @property
    def box_key_map_text(self) -> str:
        """HAProxy's map of the one key the door sends the boxes (the boxes' service key)."""
        return map_line("box", self.box_key)

    @cached_property
    def maps(self) -> dict[str, str]:
        """{path on the gateway: text} of every map haproxy.cfg reads, root-only beside it: the
        door's keys always; each client's policy with gateway_clients. The deploy writes them
        before the config (tasks/gateway.py), and the pair's level digests them."""
        maps = {layout.GATEWAY_CLIENTS_MAP: self.clients_map_text,
                layout.GATEWAY_BOX_KEY_MAP: self.box_key_map_text}
        if not self.gateway_clients:
            return maps
        policies = self.policies.items()
        maps[layout.GATEWAY_INFLIGHT_MAP] = "".join(
            map_line(name, p.max_inflight) for name, p in policies)
        maps[layout.GATEWAY_RATE_MAP] = "".join(
            map_line(name, p.requests_per_minute) for name, p in policies)
        maps[layout.GATEWAY_CLASS_MAP] = "".join(
            map_line(name, PRIORITY_CLASS[p.priority]) for name, p in policies)
        maps[layout.GATEWAY_POOLS_MAP] = "".join(
            map_line(f"{name}:{pool}", 1) for name in self.policies
            for pool in self.allowed_pools(name))
        maps[layout.GATEWAY_MODELS_MAP] = "".join(
            map_line(name, self.models_list(self.allowed_pools(name))) for name in self.policies)
        return maps

    def allowed_pools(self, client: str) -> list[str]:
        """The pools client `client` may call: those serving a name its `models` holds (None:
        every pool). A pool answers each name routes() gives it."""
        models = self.policies[client].models
        return [pool for pool, names in self.routes
                if models is None or set(models) & set(names)]

    def client_models(self, client: str) -> list[str]:
        """The model names client `client` may call, as its GET /v1/models lists them."""
        return [self.pool_model(pool) for pool in self.allowed_pools(client)]

    @property
    def fair_shares(self) -> dict[str, int]:
        """{pool: the slots one client may hold while another waits for it}: half its boxes'
        slots (each box's maxconn, vLLM's max_num_seqs), policy.fair_share."""
        return {pool: fair_share(sum(b.maxconn for b in boxes))
                for pool, boxes in self.pools.items()}

    @property
    def at_share_class(self) -> int:
        return AT_SHARE_CLASS

    # --- routing by model: one pool of boxes per model the fleet serves ------------------------------
    @cached_property
    def pools(self) -> dict[str, list[Backend]]:
        """{HAProxy backend: its boxes}, one per model the fleet serves, in the profiles' order
        (recipe.PROFILES); a fleet of one model has the one backend `thors`, as before models."""
        order = [p["model"] for p in PROFILES.values()]
        models = sorted({b.model for b in self.backends}, key=order.index)
        if len(models) <= 1:
            return {layout.GATEWAY_BACKEND: self.backends}
        return {pool_name(m): [b for b in self.backends if b.model == m] for m in models}

    @property
    def routed(self) -> bool:
        """The door reads each request's `model` to pick its pool (more than one model served)."""
        return len(self.pools) > 1

    def pool_of(self, server: str) -> str:
        """The HAProxy backend box `server` is in."""
        return next(pool for pool, boxes in self.pools.items()
                    if any(b.name == server for b in boxes))

    @property
    def routes(self) -> list[tuple[str, list[str]]]:
        """[(pool, the model names it answers)]: every name its boxes serve, but the old name
        (recipe.LEGACY_MODEL), which is the first pool's; a request naming none of them is
        answered 404 by the door."""
        routes = []
        for pool, boxes in self.pools.items():
            names = sorted({n for b in boxes for n in b.names if n != LEGACY_MODEL})
            routes.append((pool, [*names, *([LEGACY_MODEL] if not routes else [])]))
        return routes

    def pool_model(self, pool: str) -> str:
        """The name clients write for the model `pool` serves (its profile's, recipe.PROFILES)."""
        return self.pools[pool][0].model

    @property
    def models_body(self) -> str:
        """/v1/models at the door without gateway_clients: the fleet's models."""
        return self.models_list(list(self.pools))

    def models_list(self, pools) -> str:
        """/v1/models at the door: the models of `pools` by the names clients write, as vLLM
        lists them (entrypoints/openai/models: ModelCard id, object, owned_by, max_model_len)."""
        data = [{"id": self.pool_model(pool), "object": "model", "created": 0,
                 "owned_by": "thorfleet",
                 "max_model_len": PROFILES[self.pools[pool][0].profile]["max_model_len"]}
                for pool in pools]
        return json.dumps({"object": "list", "data": data}, separators=(",", ":"))

    @property
    def body_limits(self) -> dict[str, int]:
        """{pool: the largest request body it takes}: the longest context its boxes serve, at
        recipe.BODY_BYTES_PER_TOKEN, and a vision box's images at recipe.IMAGE_BODY_BYTES each;
        over it, 413 (a fleet of one model too)."""
        return {pool: max(PROFILES[b.profile]["max_model_len"] * BODY_BYTES_PER_TOKEN
                          + b.images * IMAGE_BODY_BYTES for b in boxes)
                for pool, boxes in self.pools.items()}

    @property
    def body_limit(self) -> int:
        """The largest body any pool takes: a body declared over it is refused before it is
        read, and one buffer holds it."""
        return max(self.body_limits.values())

    @property
    def bufsize(self) -> int:
        """HAProxy's tune.bufsize: a body up to body_limit and its headers (64 KiB) in one
        buffer, which is all `wait-for-body` waits for and what a retry can send again."""
        return self.body_limit + 65536

    @property
    def affinity(self) -> bool:
        """Each conversation goes to its home, the box that answered its last turn, within
        gateway_affinity_balance_factor; a first turn, and off every turn, the least busy box."""
        return self.gateway_affinity_balance_factor is not None

    @property
    def session_header(self) -> str:
        return SESSION_HEADER

    @property
    def first_message_roles(self) -> tuple[str, ...]:
        return FIRST_MESSAGE_ROLES

    @property
    def request_timeout_s(self) -> int:
        return REQUEST_TIMEOUT_S

    @property
    def retry_on(self) -> tuple[str, ...]:
        return RETRY_ON

    @property
    def error_limit(self) -> int:
        return ERROR_LIMIT

    @property
    def maxconn(self) -> int:
        """The door's connections at once (frontend maxconn): as many full buffers as
        DOOR_BUFFER_BUDGET holds, at most DOOR_MAXCONN_CAP, and never fewer than four a box's
        slot (its maxconn), so the boxes' slots and a queue as long fit."""
        slots = sum(b.maxconn for b in self.backends)
        return max(4 * slots, min(DOOR_MAXCONN_CAP, DOOR_BUFFER_BUDGET // self.bufsize))

    @property
    def global_maxconn(self) -> int:
        return self.maxconn + DOOR_MAXCONN_SPARE

    @property
    def no_box_body(self) -> str:
        """/health at the door with no box of the first pool in rotation."""
        return error_body(503, "service_unavailable", "no box is in rotation; try again later")

    def too_large_body(self, limit: int, pool: str | None = None) -> str:
        """The door's 413: over `limit`, the most the door (or `pool`'s model) takes."""
        whom = f"the model {self.pool_model(pool)}" if pool else "any model here"
        return error_body(413, "BadRequestError",
                          f"the request body is over {limit} bytes, the most this door takes "
                          f"for {whom}")

    @property
    def route_errors(self) -> dict:
        """The door's answer when routing to a model no box serves (404, as vLLM types it)."""
        return {  # the 404 names no model, though only a client with a key is answered it
            "unknown": error_body(404, "NotFoundError",
                                  "no box here serves the model this request names: GET "
                                  "/v1/models lists the models served"),
        }

    @cached_property
    def config_text(self) -> str:
        # two gateways: the config carries its level, so HAProxy says the level it runs
        return self._config(self.level_digest if self.peers else None, self.local_peer)

    def _config(self, level, local_peer) -> str:
        return _HAPROXY.get_template("haproxy.cfg.j2").render(g=self, layout=layout, level=level,
                                                              local_peer=local_peer)
