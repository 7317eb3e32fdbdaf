"""Every thorfleet setting, declared once: its type, its range or allowed values, its meaning and its
default. The checks are derived from the declaration (pydantic, strict: "0.7" is not a number).

Nothing else declares a default: group_data/all.py hands these to pyinfra as host data (defaults()),
docs/settings.md is generated from them, and the programs on the boxes take every value from the
units and commands rendered from them (tests/fast/test_one_declaration.py).

A problem is one line naming the key, the value and the fix; the caller prefixes the host.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import math
import re
from itertools import pairwise
from typing import Annotated, Any, Literal

from packaging.version import InvalidVersion, Version
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    create_model,
)
from pydantic_core import PydanticCustomError

from thorfleet.settings.clients import PRIORITY_CLASS, TOKEN_BUDGETS, ClientPolicy
from thorfleet.settings.layout import (
    BOX_BIN,
    BOX_ETC,
    BOX_HOME,
    BOX_IMAGE_CONTEXT,
    BOX_MODELS,
    BOX_OWN_NAMES,
    BOX_PEER_HOME,
    BOX_STATE,
    BOX_VLLM_CACHE,
)
from thorfleet.settings.recipe import IMAGE_TOKENS_MAX, PROFILES, SECRET_ENV, max_images

# Group data keys with these prefixes are thorfleet's: one no setting has is a typo, not a choice.
PREFIXES = ("preflight_", "power_", "memory_", "weights_", "image_", "service_", "rollout_",
            "watchdog_", "gateway_", "monitor_")


class SettingsError(ValueError):
    """Bad group data; `problems` holds one message per problem."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# --- value types ------------------------------------------------------------------------------
# Every pattern is a whole-value match (re.fullmatch): Python's `$` also matches before a final
# "\n", and a value that ends in one ends the unit line or YAML scalar it lands in.


def _full(pattern):
    """A check that the whole value matches `pattern`."""
    compiled = re.compile(pattern)

    def matches(value):
        if not compiled.fullmatch(value):
            raise ValueError("no full match")
        return value

    return AfterValidator(matches)


def _finite(value, info):
    """inf and nan are floats, and pass a range check one way or the other: a wait of inf never
    ends, a floor of nan never fails."""
    if isinstance(value, float) and not math.isfinite(value):
        key = info.field_name
        _refuse(f"{key}={value!r} {must(key)}, not inf or nan")
    return value


# Whole seconds that reach the unit's TimeoutStartSec/TimeoutStopSec, docker stop -t and vLLM's
# shutdown_timeout: kept far below where systemd's microsecond clock or a 32-bit int overflows.
MAX_SECONDS = 10**9


def _at_most_max_seconds(value, info):
    if value > MAX_SECONDS:
        _refuse(f"{info.field_name}={value!r} is more than {MAX_SECONDS} seconds (~31 years): "
                "systemd's and docker's time spans would overflow")
    return value


# A number stays the type the operator wrote (7 renders as 7, not 7.0): the rendered files, and so
# the fingerprint, do not change when the schema is applied.
Number = Annotated[StrictInt | StrictFloat, BeforeValidator(_finite)]
NonNegative = Annotated[Number, Field(ge=0)]
Positive = Annotated[Number, Field(gt=0)]

_HEX40 = r"[0-9a-f]{40}"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_IMAGE_NAME = _REPOSITORY
_IMAGE_BY_DIGEST = rf"{_REPOSITORY}(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?@sha256:[0-9a-f]{{64}}"
# systemd unit names and Docker container names both accept these (the intersection), and the
# name is thorfleet's: it writes /etc/systemd/system/<name>.service and runs `docker rm -f <name>`,
# so a name a box already has (ssh, docker, nvpmodel, another team's container) would be replaced
# or killed. No list of the names a box has can be complete; a prefix no package uses can.
# (Bare `vllm` is the name other guides give their own vLLM container: not thorfleet's.)
_SERVICE_NAME = r"(?=.{1,63}\Z)(?:thorfleet-|vllm[_.-])[A-Za-z0-9_.-]+"
# thorfleet's own other names on the box (layout.BOX_OWN_NAMES: its other units, the weights fetch
# containers, the copy users), and any name one of them begins.
_RESERVED_SERVICE = rf"(?:{'|'.join(map(re.escape, BOX_OWN_NAMES))})(?:[_.-].*)?"
# Hugging Face's repo id rule (huggingface_hub validate_repo_id): no "--" or "..", 96 at most.
_HF_NAME = r"(?!.*(?:--|\.\.))[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HF_REPO = rf"{_HF_NAME}/{_HF_NAME}"
# Goes into a unit's ExecStart, a docker -v and rrsync's command: no spaces, quotes, $, %, \ or ':'.
_BOX_PATH = r"(?:/[A-Za-z0-9_.+-]+)+"
_GPUS = r"all|[1-9][0-9]{0,3}|device=[A-Za-z0-9-]+(?:,[A-Za-z0-9-]+)*"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd expands $ and % in ExecStart, splits on whitespace, and unquotes quotes and backslashes.
_UNSAFE_IN_UNIT = re.compile(r"[\s\"'\\$%]")
_ULIMIT_VALUE = re.compile(r"-?[0-9]{1,19}(?::-?[0-9]{1,19})?")
# docker run --ulimit accepts these names (docker/go-units ulimit.go).
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile",
           "nproc", "rss", "rtprio", "rttime", "sigpending", "stack")
# A DNS name (RFC 1123 labels), as a YAML host, an ssh destination and rsync's host:path take it.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")  # and 253 characters at most
# An IPv6 zone is an interface name (Linux: at most 15 characters, no / or whitespace).
_ZONE = re.compile(r"[A-Za-z0-9_.-]{1,15}")
# The folders of the system and thorfleet's own other folders: weights_dir is made 755, served to
# the other boxes read-only (rrsync -ro) and cleaned of old revisions, so it must be a folder of
# its own. (the system's: the FHS top level; thorfleet's: thorfleet/settings/layout.py)
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
                "/lost+found", "/proc", "/root", "/run", "/sbin", "/snap", "/sys", "/tmp",
                "/usr", "/var")
THORFLEET_TREES = (BOX_BIN, BOX_IMAGE_CONTEXT, BOX_ETC, BOX_STATE, BOX_PEER_HOME, BOX_VLLM_CACHE)


def _refuse(*problems):
    """Raise the given whole-line problems from inside a validator."""
    raise PydanticCustomError("thorfleet", "{problems}", {"problems": list(problems)})


def _version(value):
    if not re.fullmatch(r"[0-9A-Za-z.+!-]+", str(value)):
        raise ValueError("not a version")
    try:
        Version(str(value))
    except InvalidVersion:
        raise ValueError("not a version") from None
    return value


def _no_dotdot(path):
    if "/../" in f"{path}/" or "/./" in f"{path}/":
        raise ValueError("relative parts")
    return path


def _inside(path, tree):
    return path == tree or path.startswith(f"{tree}/")


def _own_folder(path):
    """weights_dir: not a system folder, not a home folder itself, not one of thorfleet's other
    folders, nor a folder above one of them (BOX_MODELS, the default, is below BOX_HOME, which
    holds BOX_BIN: inside BOX_HOME, only BOX_HOME itself and its other folders are refused)."""
    parts = path.strip("/").split("/")
    hidden = next((part for part in parts if part.startswith(".")), None)
    if hidden:  # ~/.cache, ~/.ssh, /data/.snapshots: a person's or a program's own
        _refuse(f"weights_dir={path!r} is inside a hidden folder ({hidden}), which belongs to a "
                "person's or a program's settings: the deploy would make it root's, 755; use a "
                f"folder for the weights alone, like {BOX_MODELS} or /data/models")
    system = next((t for t in SYSTEM_TREES if _inside(path, t)), None)
    ours = next((t for t in (BOX_HOME, *THORFLEET_TREES) if _inside(t, path)
                 or (t != BOX_HOME and _inside(path, t))), None)
    if system or ours or len(parts) < 2 or (parts[0] == "home" and len(parts) < 3):
        why = (f"it is inside {system}, a folder of the system" if system else
               f"it is or holds thorfleet's {ours}" if ours else
               "it is a top-level or home folder")
        _refuse(f"weights_dir={path!r} is not a folder of its own ({why}): the deploy makes it "
                "755, serves it to the other boxes and removes old revisions from it; use a "
                f"folder for the weights alone, like {BOX_MODELS} or /data/models")
    return path


def is_host(value):
    """A DNS name, or an IP address as a YAML scalar and a listening socket take it."""
    address, _, zone = value.partition("%")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return len(value) <= 253 and bool(HOSTNAME.fullmatch(value))
    # ipaddress takes anything after an IPv6 '%' as its zone: only an interface name is one.
    return not zone if ip.version == 4 or "%" not in value else bool(_ZONE.fullmatch(zone))


def _listen_address(host):
    if host is not None and not is_host(host):
        raise ValueError("not an address")
    return host


# A peer's address as another box dials it (ssh's host, rsync's host:path): a DNS name or IPv4
# address, optionally :port. files/thor/bin/thorfleet-weights checks it again (PEER there, the same).
PEER = re.compile(rf"(?:{HOSTNAME.pattern}|[0-9]{{1,3}}(?:\.[0-9]{{1,3}}){{3}})(?::[0-9]{{1,5}})?")


def is_peer_address(value):
    """Whether `value` is a host[:port] another box can dial for the fleet copy."""
    if not isinstance(value, str) or not PEER.fullmatch(value):
        return False
    address, _, port = value.partition(":")
    if len(address) > 253:
        return False
    if re.fullmatch(r"[0-9.]+", address):
        try:
            ipaddress.IPv4Address(address)
        except ValueError:
            return False
    return not port or 1 <= int(port) <= 65535


def _peer_address(value):
    if not is_peer_address(value):
        raise ValueError("not a peer address")
    return value


def is_ip_address(value):
    """An IP address, written as nftables and HAProxy read it (no zone, no port)."""
    try:
        return str(ipaddress.ip_address(value)) == value and value
    except ValueError:
        return False


def _ip(value):
    if not is_ip_address(value):
        raise ValueError("not an IP address")
    return value


_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def check_names(names) -> list[str]:
    """The names, each an IP address or an RFC 1123 hostname, written one way (IPs compressed, DNS
    names lower case: a SAN compares case-insensitively), duplicates dropped, order kept."""
    found: list[str] = []
    for name in names:
        # a scoped IPv6 address ("fe80::1%eth0") names one link of one host: no SAN can hold it
        address = ip_address_or_none(name) if isinstance(name, str) and "%" not in name else None
        if address is not None:
            name = str(address)
        elif _dns_name(name):
            name = name.lower()
        else:
            raise ValueError(
                f"gateway name {name!r}: neither an IP address (no %scope) nor an RFC 1123 "
                f"hostname: dot-separated labels of 1-63 letters, digits or '-', not starting or "
                f"ending with '-', at most 253 characters, no trailing dot, no wildcard, and a "
                f"last label not all digits (clients read that as an IPv4 address)")
        if name not in found:
            found.append(name)
    if not found:
        raise ValueError("gateway names: none given; the certificate must name the gateway")
    return found


def _dns_name(name) -> bool:
    if not isinstance(name, str) or len(name) > 253:
        return False
    labels = name.split(".")
    # inet_aton reads "10.1" as an address, so RFC 3696 section 2 rules out an all-digit TLD
    return all(_DNS_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit()


def ip_address_or_none(name):
    """`name` as an ipaddress address, or None: a DNS name (the certificate's SAN kinds)."""
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _certificate_name(name):
    try:
        check_names([name])
    except ValueError:
        return False
    return True


def _client_names(names):
    """Each name clients reach the gateway by: a DNS name or an IP address, by the rule the
    certificate's subjectAltName entries are made with (check_names)."""
    bad = [name for name in names if not isinstance(name, str) or not _certificate_name(name)]
    if bad:
        _refuse(f"gateway_names={names!r}: {bad!r} is not a DNS name or IP address (the "
                "certificate names each as it is)")
    return names


def _media_domains(domains):
    """Each a DNS name a box may fetch image URLs from, as vLLM compares it with a URL's host:
    whole and lowercase (no scheme, path, port, wildcard or IP address: vLLM's check has none).
    HOSTNAME has no ':' (no IPv6 address); an IPv4 address is all digits and dots."""
    bad = [d for d in domains if not isinstance(d, str) or len(d) > 253
           or not HOSTNAME.fullmatch(d) or d != d.lower() or re.fullmatch(r"[0-9.]+", d)]
    if bad:
        _refuse(f"service_media_domains={domains!r}: {bad!r} is not a domain name (lowercase, "
                "like images.example.com; no scheme, path, port, wildcard or IP address)")
    return domains


def _virtual_ip(value):
    """The gateways' shared address as keepalived holds it: an IPv4 address and the prefix of
    its network, written as Python writes it back (so the certificate, the report and the
    keepalived config all say the one text), a host of that network."""
    try:
        interface = ipaddress.IPv4Interface(value)
    except ValueError:
        interface = None
    if interface is None or str(interface) != value or "/" not in value:
        _refuse(f"gateway_virtual_ip={value!r} is not an IPv4 address with its network's prefix "
                "length, like 192.168.1.50/24")
    network = interface.network
    if network.prefixlen < 31 and interface.ip in (network.network_address,
                                                   network.broadcast_address):
        _refuse(f"gateway_virtual_ip={value!r} is its network's own or broadcast address: pick "
                "a free host address of the gateways' network")
    return value


# A client's name at the door: a HAProxy map value, a Prometheus label value and a file name,
# plain in each.
CLIENT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


# A client's own limits, held to the fleet-wide settings' bounds (gateway_client_max_inflight,
# gateway_client_requests_per_minute): a number either may hold, each may hold.
CLIENT_MAX_INFLIGHT_MAX = 10000
CLIENT_REQUESTS_PER_MINUTE_MAX = 1000000
# The keys of a client's dict entry in gateway_clients: its key file, and its own policy.
CLIENT_LIMITS = {"max_inflight": ("gateway_client_max_inflight", CLIENT_MAX_INFLIGHT_MAX),
                 "requests_per_minute": ("gateway_client_requests_per_minute",
                                         CLIENT_REQUESTS_PER_MINUTE_MAX)}
# A token budget's least: one turn of a conversation with Mistral's chat template and a system
# prompt is more than 1,000 tokens (prompt and answer), so a smaller budget could not serve a
# single turn: it is a typo (a day's budget written in thousands), not a choice.
TOKEN_BUDGET_MIN = 1000
# A client's token budgets and the fleet-wide settings that fill in the ones it leaves out.
CLIENT_BUDGETS = {name: f"gateway_client_{name}" for name in TOKEN_BUDGETS}
CLIENT_KEYS = ("key_file", *CLIENT_LIMITS, *CLIENT_BUDGETS, "models", "priority")


def client_entry_problems(name, entry) -> list[str]:
    """What is wrong with client `name`'s entry of gateway_clients: a key file path, or a dict
    of key_file and any of its own limits, models and priority. Each line names the client,
    the key and the fix; the models' names are checked against the boxes by the run's plan (thorfleet/plan.py)."""
    where = f"gateway_clients[{name!r}]"
    if isinstance(entry, str):
        return [] if entry else [f"{where} is empty: give the laptop path of its key file"]
    problems = [f"{where} has {key!r}, not a key of a client's policy: use "
                f"{', '.join(CLIENT_KEYS)}" for key in entry if key not in CLIENT_KEYS]
    path = entry.get("key_file")
    if not isinstance(path, str) or not path:
        problems.append(f"{where} has no key_file: add \"key_file\": the laptop path of its key "
                        "(made when missing)")
    for key, (fleet, most) in CLIENT_LIMITS.items():
        value = entry.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            problems.append(f"{where}: {key}={value!r} must be a whole number from 1 to {most}, "
                            f"as {fleet}; or leave it out for the fleet's {fleet}")
    for key, fleet in CLIENT_BUDGETS.items():
        value = entry.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < TOKEN_BUDGET_MIN):
            problems.append(f"{where}: {key}={value!r} must be a whole number of tokens, at "
                            f"least {TOKEN_BUDGET_MIN} (less serves not one turn: a typo); None "
                            f"for no budget, or leave it out for the fleet's {fleet}")
    models = entry.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        problems.append(f"{where}: models={models!r} must be a list of model names (GET "
                        "/v1/models lists them); or leave it out for every model")
    elif "models" in entry and not models:
        problems.append(f"{where}: models=[] lets it call no model: name at least one, or "
                        "remove the client to revoke it")
    priority = entry.get("priority", "interactive")
    if priority not in PRIORITY_CLASS:
        problems.append(f"{where}: priority={priority!r} is not a priority: use "
                        f"{' or '.join(map(repr, PRIORITY_CLASS))} (the default)")
    return problems


def key_file(entry) -> str:
    """The laptop path of a client's key file, in either form of its entry."""
    return entry["key_file"] if isinstance(entry, dict) else entry


def policies(clients, max_inflight: int, requests_per_minute: int,
             budgets: dict | None = None) -> dict[str, ClientPolicy]:
    """{client name: its policy} of gateway_clients' entries (checked by client_entry_problems),
    sorted by name, each limit it does not set the fleet's; `budgets`: the fleet's
    {TOKEN_BUDGETS name: tokens or None}. A budget the entry sets to None is none for that
    client, whatever the fleet's."""
    fleet = {name: (budgets or {}).get(name) for name in TOKEN_BUDGETS}
    found = {}
    for name, entry in sorted((clients or {}).items()):
        own = entry if isinstance(entry, dict) else {}
        models = own.get("models")
        found[name] = ClientPolicy(
            name, key_file(entry), own.get("max_inflight", max_inflight),
            own.get("requests_per_minute", requests_per_minute),
            None if models is None else tuple(models), own.get("priority", "interactive"),
            **{budget: own.get(budget, tokens) for budget, tokens in fleet.items()})
    return found


def budget_problems(clients, fleet: dict, parsed: dict) -> list[str]:
    """A token budget above the next longer one set (tokens_per_minute above tokens_per_day, a
    day above a month), after the fleet's (`fleet`: {TOKEN_BUDGETS name: the gateway_client_*
    setting's tokens}) are filled in: it could never be spent. Each line names the client (or
    the fleet settings) and both keys. Run on entries client_entry_problems passed, `parsed`
    their policies (policies(), with the fleet's budgets)."""
    problems = _order_problems(fleet, CLIENT_BUDGETS, lambda b, v: f"{CLIENT_BUDGETS[b]}={v}")
    for name, policy in parsed.items():
        own = clients[name] if isinstance(clients[name], dict) else {}

        def said(budget, value, own=own):
            return f"{budget}={value}" + (
                "" if budget in own else f" (the fleet's {CLIENT_BUDGETS[budget]})")

        problems += [f"gateway_clients[{name!r}]: {p}" for p in _order_problems(
            policy.budgets, {b: b for b in TOKEN_BUDGETS}, said, own)]
    return problems


def _order_problems(budgets, keys, said, own=None) -> list[str]:
    """Each budget of `budgets` ({name: tokens or None}) above the next longer one set, told by
    said(name, tokens) and mended by the setting keys[name]; with `own` (a client's entry),
    only the pairs it sets one of (the rest are the fleet settings', said once)."""
    set_ = [(name, tokens) for name, tokens in budgets.items() if tokens is not None]
    return [f"{said(short, low)} is above {said(long, high)}: it could never be spent; lower "
            f"{keys[short]} or raise {keys[long]}"
            for (short, low), (long, high) in pairwise(set_)
            if low > high and (own is None or short in own or long in own)]


def _clients(clients):
    if clients is None:
        return None
    problems = [f"gateway_clients has {name!r}, not a client name: lower-case letters, digits, "
                "'-' and '_', starting with a letter, 32 at most" for name in clients
                if not CLIENT_NAME.fullmatch(name)]
    problems += [p for name, entry in clients.items() for p in client_entry_problems(name, entry)]
    if not clients:
        problems.append("gateway_clients is empty: list at least one client (yourself), or set "
                        "it to None to keep the one fleet key")
    if problems:
        _refuse(*problems)
    return clients


def _extra_env(env):
    problems = []
    secrets = sorted(name for name in env if name in SECRET_ENV)
    if secrets:
        problems.append(f"service_extra_env must not carry secrets ({', '.join(secrets)}): "
                        "use service_api_key_file / weights_hf_token_file")
    for name, value in env.items():
        if name in SECRET_ENV:
            continue
        if not _ENV_NAME.fullmatch(name):
            problems.append(f"service_extra_env has {name!r}, not an environment variable name: "
                            "use letters, digits and _, not starting with a digit")
        elif isinstance(value, bool) or not isinstance(value, (str, int, float)):
            problems.append(f"service_extra_env[{name!r}]={value!r} must be a string or a number")
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"service_extra_env[{name!r}]={value!r} must be a string or a "
                            "number, not inf or nan")
        elif _UNSAFE_IN_UNIT.search(str(value)) or not str(value).isprintable():
            problems.append(f"service_extra_env[{name!r}]={value!r} is not safe in a unit line: "
                            "no spaces, newlines, quotes, backslashes, $ or % (systemd would "
                            "split or expand them), nothing unprintable")
    if problems:
        _refuse(*problems)
    return env


def _ulimits(limits):
    problems = []
    for name, value in limits.items():
        if name not in ULIMITS:
            near = difflib.get_close_matches(str(name), ULIMITS, n=1)
            hint = f"did you mean {near[0]}?" if near else f"use one of {', '.join(ULIMITS)}"
            problems.append(f"service_docker_ulimits has {name!r}, not a ulimit docker knows: {hint}")
        elif isinstance(value, bool) or not isinstance(value, (str, int)) or \
                not _ULIMIT_VALUE.fullmatch(str(value)):
            problems.append(f"service_docker_ulimits[{name!r}]={value!r} must be a number, -1 for "
                            "unlimited, or SOFT:HARD")
    if problems:
        _refuse(*problems)
    return limits


def _service_name(name):
    if re.fullmatch(_RESERVED_SERVICE, name):
        _refuse(f"service_name={name!r} is a name thorfleet uses for something else on the box "
                f"(its own units, containers and users: {', '.join(BOX_OWN_NAMES)}): use "
                "another, like thorfleet-vllm")
    return name


# An http(s) URL of a hub: a host (name or address, IPv6 in brackets), an optional port and a path
# of plain characters; it lands in a command line and in huggingface_hub's HF_ENDPOINT.
_URL = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[^/?#:\[\]@]+)(?::([0-9]{1,5}))?"
                  r"((?:/[A-Za-z0-9._~!*()+,;=:@-]*)*)")


def _url(url):
    found = _URL.fullmatch(url)
    host = found[1].strip("[]") if found else ""
    if not found or not is_host(host) or "%" in host or \
            found[1].startswith("[") != (":" in host) or \
            (found[2] and not 1 <= int(found[2]) <= 65535):
        raise ValueError("not a URL")
    return url


# Prometheus's duration (prometheus/common model/time.go ParseDuration: its durationRE, matched
# whole; "" is refused there, and its bare "0" is refused here: a retention of 0 is no setting).
_PROMETHEUS_DURATION = re.compile(r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?"
                                  r"(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?")
_DURATION_MS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)


def _prometheus_duration(value):
    found = _PROMETHEUS_DURATION.fullmatch(value)
    if not value or not found:
        raise ValueError("not a duration")
    # ParseDuration also refuses what overflows its int64 of milliseconds
    if sum(int(n) * ms for n, ms in zip(found.groups(), _DURATION_MS) if n) >= 2**63:
        raise ValueError("too long")
    return value


def setting(default, meaning, must, **constraints):
    """A setting: its default, its one-line meaning (the comment in group_data/all.py), and what a
    bad value is told ("<key>=<value> <must>")."""
    return Field(default, description=meaning, json_schema_extra={"must": must}, **constraints)


# Both checkpoints are pinned the same way, and refused with the same fix.
UNPINNED_REVISION = ("is not pinned: set the 40-hex commit hash you tested "
                     "(python -m thorfleet pin INVENTORY looks it up)")

class Schema(BaseModel):
    """One host's thorfleet settings, checked."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, validate_default=True)

    # --- ssh: how the laptop reaches the boxes ---------------------------------------------------
    ssh_strict_host_key_checking: Literal["yes", "accept-new", "ask", "no", "off"] = setting(
        "yes", "refuse unknown or changed host keys (pyinfra's own default accepts new ones)",
        "is not one of pyinfra's values: use 'yes', 'accept-new', 'ask', 'no' or 'off'")
    ssh_keepalive_interval_s: NonNegative = setting(
        30, "SSH keepalive while a restart is proven, so NAT keeps the idle session",
        "must be a non-negative number of seconds (0: no keepalives)")

    # --- preflight: refuse boxes that cannot run the model ---------------------------------------
    preflight_min_l4t_release: Annotated[StrictStr | Number, AfterValidator(_version)] = setting(
        "38.0", "oldest L4T release accepted, from /etc/nv_tegra_release (JetPack 7)",
        "is not a version like 38.0")
    preflight_min_memory_gib: NonNegative = setting(
        100, "least total memory (MemTotal) a box must have; a Thor has ~122 GiB",
        "must be a non-negative number (GiB)")
    preflight_min_free_disk_gib: NonNegative = setting(
        100, "least free disk under weights_dir for weights (~71 GB) and image",
        "must be a non-negative number (GiB)")
    preflight_lock_wait_s: NonNegative = setting(
        0, "how long a run waits for another thorfleet run holding a box (0: stop at once)",
        "must be a non-negative number of seconds")

    # --- power: nvpmodel mode and locked clocks --------------------------------------------------
    power_mode: Annotated[StrictInt, Field(ge=0, le=3)] = setting(
        1, "nvpmodel mode; on the T5000 0=MAXN, 1=120W (the recipe's), 2=90W, 3=70W",
        "is not a T5000 mode (0, 1, 2, 3)")
    power_allow_reboot: StrictBool = setting(
        False, "allow a reboot when the mode needs one (2 and 3); otherwise fail clearly",
        "must be True or False")
    power_reboot_timeout_s: Positive = setting(
        900, "how long to wait for a box to come back from that reboot",
        "must be a positive number of seconds")

    # --- memory: the page-cache gate run before every start of the server ------------------------
    memory_min_available_gib: NonNegative | None = setting(
        None, "MemAvailable a start needs; None: gpu_memory_utilization x MemTotal + margin",
        "must be a non-negative number, or None to derive it from service_gpu_memory_utilization")
    memory_gate_margin_gib: NonNegative = setting(
        7, "derived gate's headroom: 0.72 x 122 + 7 = 94.8 GiB, the recipe's 95",
        "must be a non-negative number (GiB)")
    # memory-gate compares it with sh's integer test: a whole number.
    memory_gate_timeout_s: Annotated[StrictInt, Field(gt=0),
                                     AfterValidator(_at_most_max_seconds)] = setting(
        300, "give up waiting for the page cache to drain after this long",
        "must be a positive whole number of seconds")
    memory_gate_interval_s: Annotated[Number, Field(ge=1)] = setting(
        5, "seconds between drop_caches attempts",
        "must be a number of seconds, at least 1")

    # --- weights: huggingface_hub downloads on the box -------------------------------------------
    weights_dir: Annotated[StrictStr, _full(_BOX_PATH), AfterValidator(_no_dotdot),
                         AfterValidator(_own_folder)] = setting(
        BOX_MODELS, "where checkpoints live on the box, one folder per revision",
        f"must be an absolute path on the box like {BOX_MODELS} (letters, digits, _ . + - and /; "
        "no spaces, quotes, $, %, : or ..)")
    weights_model_repo: Annotated[StrictStr, _full(_HF_REPO)] = setting(
        "mistralai/Mistral-Small-4-119B-2603-NVFP4", "the NVFP4 checkpoint (~71 GB)",
        "is not a Hugging Face repo id like owner/name")
    weights_model_revision: Annotated[StrictStr, _full(_HEX40)] = setting(
        None, "REQUIRED: 40-hex commit of the checkpoint to serve (pin it)",
        UNPINNED_REVISION)
    weights_draft_repo: Annotated[StrictStr, _full(_HF_REPO)] = setting(
        "mistralai/Mistral-Small-4-119B-2603-eagle", "the EAGLE-3 draft (~0.4 GB)",
        "is not a Hugging Face repo id like owner/name")
    weights_draft_revision: Annotated[StrictStr, _full(_HEX40)] = setting(
        None, "REQUIRED: 40-hex commit of the draft to serve (pin it)",
        UNPINNED_REVISION)
    weights_hf_endpoint: Annotated[StrictStr, AfterValidator(_url)] | None = setting(
        None, "hub or site mirror the boxes download from (group_data/all.py: the laptop's HF_ENDPOINT, if set)",
        "must be an http(s) URL of the hub or a mirror, or None for huggingface.co")
    weights_hf_allow_plain_http: StrictBool = setting(
        False, "allow an http:// weights_hf_endpoint with a token: the token and the code the model "
        "runs (trust_remote_code) then travel unencrypted", "must be True or False")
    weights_hf_token_file: Annotated[StrictStr, Field(min_length=1)] | None = setting(
        None, "laptop path of a file holding HF_TOKEN (else env HF_TOKEN); never logged",
        "must be a file path on the laptop, or None")
    weights_source: Literal["auto", "hub", "fleet"] = setting(
        "auto", "hub: every box downloads; fleet: the run's first box does, the others copy from "
        "boxes that have it (rsync over SSH); auto: fleet for 2+ hosts",
        "is not 'auto', 'hub' or 'fleet' (a site mirror is weights_hf_endpoint)")
    weights_peer_address: Annotated[StrictStr, AfterValidator(_peer_address)] | None = setting(
        None, "host[:port] the other boxes reach this one at over SSH, the gateway at its host (None: its ssh_hostname)",
        "is not a host name or address with an optional :port")
    weights_progress_interval_s: Positive = setting(
        10, "seconds between the progress lines of a weights transfer (done, rate, time left)",
        "must be a number of seconds above 0")
    weights_peer_key_file: Annotated[StrictStr, Field(min_length=1)] = setting(
        "~/.config/thorfleet/peer_ed25519", "laptop path of the boxes' shared copy key (may only "
        "read weights_dir); made when missing", "must be a file path on the laptop")

    # --- image: the derived vLLM image with the chat patches -------------------------------------
    image_base: Annotated[StrictStr, _full(_IMAGE_BY_DIGEST)] = setting(
        None, "REQUIRED: base vLLM image pinned by digest, e.g. ghcr.io/nvidia-ai-iot/vllm@sha256:…",
        "is not pinned by digest: use REPO@sha256:<64 hex> (the tag moves; python -m thorfleet "
        "pin INVENTORY looks it up)")
    image_name: Annotated[StrictStr, _full(_IMAGE_NAME)] = setting(
        "thorfleet/mistral-small4", "local name of the derived image; the tag is a hash of its inputs",
        "is not a Docker repository name: lowercase, like thorfleet/mistral-small4, without a tag "
        "(thorfleet tags it with a hash of its inputs)")
    image_registry: Annotated[StrictStr, _full(_IMAGE_NAME)] | None = setting(
        None, "registry the image is shared through: the run's first host builds and pushes, the "
        "others pull (None: see image_source)",
        "is not a registry path like registry.site:5000/thorfleet (no tag), or None")
    image_source: Literal["auto", "build", "fleet"] = setting(
        "auto", "without image_registry: fleet: the run's first box builds, the others load it "
        "from that box over SSH (docker save | docker load); build: every box builds its own; "
        "auto: fleet for 2+ hosts", "is not 'auto', 'build' or 'fleet' (a registry is "
        "image_registry)")
    image_peer_key_file: Annotated[StrictStr, Field(min_length=1)] = setting(
        "~/.config/thorfleet/image_ed25519", "laptop path of the boxes' image-copy key (may only "
        "docker-save thorfleet's derived image from another box); made when missing",
        "must be a file path on the laptop")
    image_think_prefill: StrictBool = setting(
        True, "open [THINK] for reasoning_effort=high (this checkpoint does not by itself)",
        "must be True or False")

    # --- service: the systemd-supervised vLLM container ------------------------------------------
    service_name: Annotated[StrictStr, _full(_SERVICE_NAME),
                            AfterValidator(_service_name)] = setting(
        "thorfleet-vllm", "systemd unit and container name",
        "is not a name both systemd and Docker accept that is thorfleet's own: thorfleet-... or "
        "vllm-..., up to 63 letters, digits, _ . -, like thorfleet-vllm (a name the box has "
        "already, like ssh, would lose its unit and its container)")
    service_profile: Literal[tuple(PROFILES)] = setting(
        "default", "what the box serves, under its model name: \"default\" (mistral-small-4: "
        "EAGLE-3, 64K), \"no-eagle\" (mistral-small-4-256k), \"throughput\" "
        "(mistral-small-4-batch: 8 at once, 32K), \"vision\" (mistral-small-4-vision: images, "
        "64K); may differ per host",
        f"is unknown: use one of {sorted(PROFILES)}")
    service_images_per_prompt: Annotated[StrictInt, Field(ge=1, le=64)] = setting(
        4, "vision profile: most images in one prompt (vLLM's limit_mm_per_prompt); each takes "
        "up to 3,080 tokens of the 64K context", "must be a whole number from 1 to 64")
    service_media_domains: Annotated[list[StrictStr], AfterValidator(_media_domains)] = setting(
        [], "vision profile: domains a box may fetch image URLs from, whole names (none: data: "
        "URLs only, the box fetches nothing)",
        "must be a list of domain names, like ['images.example.com']")
    service_prefix_caching: StrictBool | None = setting(
        None, "vLLM's prefix caching (a prompt's start seen before is not computed again): "
        "True, False, or None for the profile's (on, but off for vision: docs/workloads.md)",
        "must be True, False, or None for the profile's default")
    service_host: Annotated[StrictStr | None, AfterValidator(_listen_address)] = setting(
        None, "listen address; None: 0.0.0.0 with an API key, 127.0.0.1 without one",
        "must be an IP address or host name to listen on, or None")
    service_port: Annotated[StrictInt, Field(ge=1, le=65535)] = setting(
        8002, "port vLLM listens on",
        "must be at least 1 and at most 65535 (a TCP port)")
    service_gpu_memory_utilization: Annotated[Number, Field(gt=0, le=1)] = setting(
        0.72, "share of unified memory vLLM may take (~96 GB on a Thor)",
        "must be a number in (0, 1]")
    service_api_key_file: Annotated[StrictStr, Field(min_length=1)] | None = setting(
        None, "laptop path of a file holding the API key (else env THORFLEET_API_KEY)",
        "must be a file path on the laptop, or None")
    service_allow_no_api_key: StrictBool | Literal["anywhere"] = setting(
        False, "explicitly serve without an API key (then binds 127.0.0.1 unless set)",
        "must be True, False or 'anywhere'")
    service_health_timeout_s: Positive = setting(
        1200, "how long a (re)start may take to answer /health (the recipe waits 20 min)",
        "must be a positive number of seconds")
    service_docker_gpus: Annotated[StrictStr, _full(_GPUS)] = setting(
        "all", "value of docker run --gpus",
        "is not a docker --gpus value: 'all', a count like '1', or 'device=0,1'")
    service_docker_ulimits: Annotated[dict[StrictStr, Any], AfterValidator(_ulimits)] = setting(
        {"memlock": "-1", "stack": "67108864"}, "docker run --ulimit, as the recipe runs it",
        "must be a dict of ulimit name: value, like {'memlock': '-1'}")
    service_extra_env: Annotated[dict[StrictStr, Any], AfterValidator(_extra_env)] = setting(
        {}, "extra environment for the container, merged over the recipe's (thorfleet/settings/recipe.py)",
        "must be a dict of NAME: value")

    # --- rollout: how a fleet is converged -------------------------------------------------------
    rollout_batch: Annotated[StrictInt, Field(ge=1)] = setting(
        1, "hosts restarted at once; each batch must serve before the next starts",
        "must be at least 1 (a whole number of hosts)")
    rollout_canary_group: Annotated[StrictStr, _full(r"[A-Za-z_][A-Za-z0-9_]*")] | None = setting(
        None, "inventory group restarted (and proven) before everyone else",
        "must be the name of a group of the inventory, or None")
    # vLLM's --shutdown-timeout is an int; the unit adds its margins to it.
    rollout_drain_timeout_s: Annotated[StrictInt, Field(ge=0),
                                       AfterValidator(_at_most_max_seconds)] = setting(
        120, "before a restart, wait this long for answers in flight; vLLM's shutdown_timeout too",
        "must be a whole number of seconds, 0 or more (0: a restart cuts answers in flight)")
    rollout_benchmark: Literal["first-install", "always", "never"] = setting(
        "first-install", "benchmark after the proof: on a first install, always or never",
        "must be 'first-install', 'always' or 'never'")
    rollout_bench_min_fraction: Annotated[Number, Field(ge=0, le=1)] = setting(
        0.8, "a host below this share of the fleet's median tok/s fails the run",
        "must be a number in [0, 1] (0: no median check)")
    rollout_bench_min_toks: NonNegative = setting(
        27, "a host below this many tok/s fails the run (a Thor: 33.7 EAGLE, 17.5 base)",
        "must be a non-negative number of tokens per second (0: no floor)")
    rollout_report_path: Annotated[StrictStr, Field(min_length=1)] = setting(
        "thorfleet-report.json", "laptop path of the JSON report of the last run",
        "must be a file path on the laptop")

    # --- watchdog: proves between runs that each box generates (files/thor/bin/thorfleet-watchdog) ----
    # Each lands as a whole number on the watchdog unit's command line.
    watchdog_interval_s: Annotated[StrictInt, Field(ge=1),
                                   AfterValidator(_at_most_max_seconds)] = setting(
        15, "seconds between two checks of the server",
        "must be a whole number of seconds, at least 1")
    watchdog_failures: Annotated[StrictInt, Field(ge=1)] = setting(
        3, "failed checks in a row before the watchdog restarts",
        "must be a whole number of checks, at least 1")
    watchdog_timeout_s: Annotated[StrictInt, Field(ge=1),
                                  AfterValidator(_at_most_max_seconds)] = setting(
        20, "a 1-token completion must finish within this",
        "must be a whole number of seconds, at least 1")
    watchdog_restart_backoff_s: Annotated[StrictInt, Field(ge=0),
                                          AfterValidator(_at_most_max_seconds)] = setting(
        60, "wait after a restart before the next one may happen; doubles with each restart in "
        "the last hour", "must be a whole number of seconds, 0 or more")
    watchdog_max_restarts_per_hour: Annotated[StrictInt, Field(ge=1)] = setting(
        3, "past it, no restart; the box is reported failed",
        "must be a whole number of restarts, at least 1")
    watchdog_give_up_after: Annotated[StrictInt, Field(ge=1)] = setting(
        6, "restarts in a row with no check passing: then none until one passes (you or a deploy "
        "restart it); the box is reported failed", "must be a whole number of restarts, at least 1")
    # Not service_health_timeout_s: that one is part of a version, which a failed proof rolls
    # back, while the watchdog's unit stays as written.
    watchdog_start_timeout_s: Annotated[StrictInt, Field(ge=1),
                                        AfterValidator(_at_most_max_seconds)] = setting(
        1800, "a started server gets this long to answer /health before the watchdog judges it",
        "must be a whole number of seconds, at least 1")
    watchdog_port: Annotated[StrictInt, Field(ge=1, le=65535)] = setting(
        9105, "the box exporter's port (/metrics, /healthy)",
        "must be at least 1 and at most 65535 (a TCP port), not service_port")

    # --- gateway: one HTTPS endpoint in front of the boxes (the inventory group `gateway`) -------
    gateway_serves_model: StrictBool = setting(
        False, "the gateway host is also a Thor that serves the model (False: a box of its own)",
        "must be True or False")
    gateway_port: Annotated[StrictInt, Field(ge=1, le=65535)] = setting(
        8443, "HTTPS port clients use on the gateway",
        "must be at least 1 and at most 65535 (a TCP port)")
    gateway_names: Annotated[list[StrictStr], AfterValidator(_client_names)] = setting(
        [], "more names or addresses clients use for the gateway (its inventory address is one)",
        "must be a list of DNS names or IP addresses")
    gateway_tls_cert_file: Annotated[StrictStr, Field(min_length=1)] | None = setting(
        None, "laptop path of your certificate chain for the gateway (None: the fleet CA signs one)",
        "must be a file path on the laptop, or None")
    gateway_tls_key_file: Annotated[StrictStr, Field(min_length=1)] | None = setting(
        None, "laptop path of that certificate's private key (chmod 600); never logged",
        "must be a file path on the laptop, or None")
    gateway_ca_dir: Annotated[StrictStr, Field(min_length=1)] = setting(
        "~/.config/thorfleet/fleet-ca", "laptop folder of the fleet CA (made once; clients trust "
        "its fleet-ca.pem)", "must be a folder path on the laptop")
    gateway_fleet_address: Annotated[StrictStr, AfterValidator(_ip)] | None = setting(
        None, "IP address the boxes see the gateway connect from (None: its ssh_hostname)",
        "must be an IP address (the boxes' firewall lets only it in), or None")
    gateway_virtual_ip: Annotated[StrictStr, AfterValidator(_virtual_ip)] | None = setting(
        None, "address/prefix clients use when the group `gateway` has two hosts, held by one at "
        "a time (keepalived), like 192.168.1.50/24", "must be an IPv4 address with its "
        "network's prefix length, like 192.168.1.50/24, or None")
    gateway_vrrp_router_id: Annotated[StrictInt, Field(ge=1, le=255)] = setting(
        51, "VRRP id of the two gateways' address, unique among VRRP routers on their LAN",
        "must be a whole number from 1 to 255")
    gateway_clients: Annotated[dict[StrictStr, StrictStr | dict[StrictStr, Any]],
                               AfterValidator(_clients)] | None = setting(
        None, "{client name: laptop path of its key file (chmod 600, made when missing), or a "
        "dict of key_file and any of max_inflight, requests_per_minute, tokens_per_minute, "
        "tokens_per_day, tokens_per_month, models, priority}: only these keys open the door "
        "(None: the fleet's one key, service_api_key_file)",
        "must be a dict of client name: key file path (or a dict of its key_file and policy), "
        "or None")
    gateway_client_max_inflight: Annotated[StrictInt, Field(
            ge=1, le=CLIENT_MAX_INFLIGHT_MAX)] = setting(
        4, "with gateway_clients: most requests one client has at the door at once (answering or "
        "queued), unless its own max_inflight says; over it, 429",
        f"must be a whole number from 1 to {CLIENT_MAX_INFLIGHT_MAX}")
    gateway_client_requests_per_minute: Annotated[StrictInt, Field(
            ge=1, le=CLIENT_REQUESTS_PER_MINUTE_MAX)] = setting(
        120, "with gateway_clients: most requests one client starts in any minute, unless its own "
        "requests_per_minute says; over it, 429",
        f"must be a whole number from 1 to {CLIENT_REQUESTS_PER_MINUTE_MAX}")
    gateway_client_tokens_per_minute: Annotated[StrictInt, Field(
            ge=TOKEN_BUDGET_MIN)] | None = setting(
        None, "with gateway_clients: most tokens (prompt + completion) one client spends in any "
        "60 s, unless its own tokens_per_minute says; over it, 429 until it frees (None: no "
        "budget)", f"must be a whole number of tokens, at least {TOKEN_BUDGET_MIN}, or None")
    gateway_client_tokens_per_day: Annotated[StrictInt, Field(
            ge=TOKEN_BUDGET_MIN)] | None = setting(
        None, "with gateway_clients: most tokens (prompt + completion) one client spends in a "
        "UTC day, unless its own tokens_per_day says; over it, 429 until 00:00 UTC (None: no "
        "budget)", f"must be a whole number of tokens, at least {TOKEN_BUDGET_MIN}, or None")
    gateway_client_tokens_per_month: Annotated[StrictInt, Field(
            ge=TOKEN_BUDGET_MIN)] | None = setting(
        None, "with gateway_clients: most tokens (prompt + completion) one client spends in a "
        "UTC calendar month, unless its own tokens_per_month says; over it, 429 until the 1st "
        "(None: no budget)",
        f"must be a whole number of tokens, at least {TOKEN_BUDGET_MIN}, or None")
    gateway_queue_timeout_s: Annotated[StrictInt, Field(ge=1, le=86400)] = setting(
        120, "how long a request waits at the gateway for a free box before a 503 (a pool whose longest prefill is longer waits that: the 256K pool 300 s)",
        "must be a whole number of seconds from 1 to 86400")
    gateway_retry_after_s: Annotated[StrictInt, Field(ge=1, le=3600)] = setting(
        5, "seconds a client is told to wait (Retry-After) when no box was free in time",
        "must be a whole number of seconds from 1 to 3600")
    gateway_check_interval_s: Annotated[StrictInt, Field(ge=1, le=3600)] = setting(
        2, "seconds between the gateway's health checks of each box",
        "must be a whole number of seconds from 1 to 3600")
    gateway_affinity_balance_factor: Annotated[StrictInt, Field(ge=100, le=1000)] | None = setting(
        150, "the load bound of a conversation's home, in percent of the mean: the gateway sends each later turn of a conversation (X-Session-Token, else its client and first messages) to the box that answered the turn before while that box holds under this share of the mean of its pool's requests and has a free slot (None: off, the least busy box)",
        "must be a whole number from 100 to 1000 (percent of the mean), or None")

    # --- monitor: Prometheus on the gateway host (or the inventory group `monitor`) --------------
    monitor_scrape_interval_s: Annotated[StrictInt, Field(ge=1),
                                         AfterValidator(_at_most_max_seconds)] = setting(
        15, "seconds between two scrapes of every box by Prometheus (and between rule evaluations)",
        "must be a whole number of seconds, at least 1")
    monitor_fleet_address: Annotated[StrictStr, AfterValidator(_ip)] | None = setting(
        None, "IP address the boxes see a monitor host of its own connect from (None: its ssh_hostname)",
        "must be an IP address (with a gateway, the boxes' firewall lets it in too), or None")
    monitor_retention: Annotated[StrictStr, AfterValidator(_prometheus_duration)] = setting(
        "15d", "how long Prometheus keeps samples (its duration: 15d, 12h, 1w2d)",
        "is not a Prometheus duration: digits and units y w d h m s ms in that order, like 15d "
        "or 1w2d")


FIELDS = Schema.model_fields


def defaults() -> dict:
    """{setting: its default}, each its own copy: the host data group_data/all.py gives pyinfra,
    whose SSH connector reads the ssh_ ones itself before any thorfleet code runs."""
    return {key: copy.deepcopy(field.default) for key, field in FIELDS.items()}


# Defaults that are REQUIRED: None means "not set", and the check refuses it.
REQUIRED = tuple(k for k, f in FIELDS.items() if f.description.startswith("REQUIRED"))


def must(key):
    """What a bad value of `key` is told."""
    return FIELDS[key].json_schema_extra["must"]


def _nearest(key):
    """The setting `key` was probably meant to be: the same prefix, the rest spelt nearly alike
    (the shared prefix alone would make service_colour "near" service_port)."""
    prefix = next(p for p in PREFIXES if key.startswith(p))
    rests = {k[len(prefix):]: k for k in FIELDS if k.startswith(prefix)}
    near = difflib.get_close_matches(key[len(prefix):], list(rests), n=1, cutoff=0.6)
    return rests[near[0]] if near else None


def _unknown_keys(data):
    problems = []
    for key in sorted(data):
        if key.startswith(PREFIXES) and key not in FIELDS:
            fix = f"did you mean {near}?" if (near := _nearest(key)) else \
                "see docs/settings.md for every setting"
            problems.append(f"{key}={data[key]!r} is not a thorfleet setting: {fix}")
    return problems


def _messages(error: ValidationError, data):
    """One line per key: thorfleet's own lines where a validator gave them (a union of types
    reports each member's failure; one mistake is still one line), else the key's fix."""
    own, other = {}, []
    for detail in error.errors(include_url=False):
        key = detail["loc"][0]
        if detail["type"] == "thorfleet":
            own.setdefault(key, []).extend(detail["ctx"]["problems"])
        elif key not in other:
            other.append(key)
    found = []
    for key in [*own, *(k for k in other if k not in own)]:
        lines = own.get(key) or [f"{key}={data.get(key, FIELDS[key].default)!r} {must(key)}"]
        found += [line for line in lines if line not in found]
    return found


# The pins a Thor serves by: `pin` writes them; a stand-in value is refused.
PINNED_KEYS = ("weights_model_revision", "weights_draft_revision", "image_base")


def placeholder(pin) -> bool:
    """A commit or digest written as a stand-in, all zeros (git's and Docker's own "none"): no
    real commit or image has it, and it would pass a check of its shape alone."""
    hexes = pin.rsplit("@sha256:", 1)[-1] if isinstance(pin, str) else ""
    return len(hexes) in (40, 64) and set(hexes) == {"0"}


# What secrets.env (systemd's EnvironmentFile, and thorfleet-serve, read it unquoted) and an HTTP
# Authorization header hold as they are: visible ASCII; the key without quotes, \, $ or `.
API_KEY = re.compile(r"[!#%&(-\[\]-_a-~]+")
# As short as the boxes' key, or a client's (gateway.config.CLIENT_KEY), may be: long enough that
# nobody guesses it.
API_KEY_MIN = 16
# A client key, as a bearer token goes (RFC 6750's b64token): letters, digits and -._~+/=, and
# long enough that nobody guesses it.
CLIENT_KEY = re.compile(rf"[A-Za-z0-9._~+/-]{{{API_KEY_MIN},512}}=*")
_TOKEN = re.compile(r"[!-~]+")


def _secret_problems(api_key, hf_token, data):
    problems = []
    if api_key and not API_KEY.fullmatch(api_key):
        problems.append("the API key (service_api_key_file or THORFLEET_API_KEY) holds whitespace, "
                        "a quote, a backslash, $, ` or something unprintable, which secrets.env "
                        "cannot hold as it is: use a key of letters, digits and - . _ ~ + / =")
    elif api_key and len(api_key) < API_KEY_MIN:  # its length only: never a part of it
        problems.append(f"the API key (service_api_key_file or THORFLEET_API_KEY) is "
                        f"{len(api_key)} characters, under {API_KEY_MIN}: anyone who can reach a "
                        "box could guess it; make a longer one: (umask 077; openssl rand -hex 24 "
                        "> FILE)")
    if hf_token and not _TOKEN.fullmatch(hf_token):
        problems.append("the Hugging Face token (weights_hf_token_file or HF_TOKEN) holds "
                        "whitespace or something unprintable: put the token alone in the file")
    endpoint = data.get("weights_hf_endpoint")
    if hf_token and isinstance(endpoint, str) and endpoint.lower().startswith("http://") and \
            data.get("weights_hf_allow_plain_http") is not True:
        problems.append(f"weights_hf_endpoint={endpoint!r} is plain HTTP and a Hugging Face token "
                        "is set: the token, and the code the model runs (trust_remote_code), "
                        "would travel unencrypted; use https://, or set "
                        "weights_hf_allow_plain_http=True if you trust that network")
    return problems


def _ssh_port_problems(values, data, keys):
    """A port thorfleet listens on (and its firewall guards) that is the host's own SSH port: the
    operator's way in would be taken or closed (the Thors' table lets only the gateway reach
    service_port), and the next deploy could not reach the host."""
    ssh_port = data.get("ssh_port") or 22
    return [f"{key}={getattr(values, key)!r} is this host's SSH port (ssh_port {ssh_port}): "
            f"thorfleet would listen there, and on a Thor its firewall lets only the gateway "
            f"reach service_port, closing your way in; use another port, like "
            f"{FIELDS[key].default}"
            for key in keys if values is not None and getattr(values, key) == ssh_port]


def _repository(image):
    """REPO of REPO[:TAG]@sha256:..."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def check(data, *, api_key=None, hf_token=None, groups=None):
    """(Schema, []) for one host's data, or (None, problems): every problem, one line each.

    `api_key`: the laptop's key for this host (the file or env var read), or whether it has one;
    `hf_token`: the Hugging Face token read the same way (None: none);
    `groups`: the inventory's group names, for rollout_canary_group (None: not checked).
    """
    problems = _unknown_keys(data)
    values = None
    try:
        values = Schema.model_validate({k: data[k] for k in FIELDS if k in data})
    except ValidationError as error:
        problems += _messages(error, data)
    # Rules across keys.
    problems += _secret_problems(api_key if isinstance(api_key, str) else None, hf_token, data)
    if not api_key:
        if not data.get("service_allow_no_api_key"):
            problems.append("no API key: set service_api_key_file (or env THORFLEET_API_KEY), "
                            "or service_allow_no_api_key=True to serve without one")
        host = data.get("service_host")
        if host not in (None, "127.0.0.1", "localhost", "::1") and \
                data.get("service_allow_no_api_key") != "anywhere":
            problems.append(f"service_host={host!r} without an API key would expose the server: "
                            "set an API key, or service_allow_no_api_key='anywhere' if you "
                            "really mean it")
    if values is not None and values.image_name == _repository(values.image_base):
        problems.append(f"image_name={values.image_name!r} is image_base's own repository: "
                        "thorfleet would tag its derived image there and remove that "
                        "repository's other tags as its old versions (thorfleet-clean); use a "
                        "name of its own, like thorfleet/mistral-small4")
    problems += _ssh_port_problems(values, data, ("service_port", "watchdog_port"))
    problems += [f"{key}={data[key]!r} is a placeholder, not a pin: python -m thorfleet pin "
                 f"looks the real one up" for key in PINNED_KEYS if placeholder(data.get(key))]
    if values is not None and values.service_images_per_prompt > max_images("vision"):
        problems.append(f"service_images_per_prompt={values.service_images_per_prompt!r} does not "
                        f"fit the vision profile's context: {IMAGE_TOKENS_MAX} tokens an image at "
                        f"most, and images may take half of {PROFILES['vision']['max_model_len']}; "
                        f"use at most {max_images('vision')}")
    if values is not None and values.watchdog_port == values.service_port:
        problems.append(f"watchdog_port={values.watchdog_port!r} is service_port too: the "
                        "watchdog's exporter and vLLM cannot listen on one port; use another, "
                        "like 9105")
    canary = data.get("rollout_canary_group")
    if groups is not None and isinstance(canary, str) and canary not in groups:
        names = sorted(g for g in groups if g != "all")
        problems.append(f"rollout_canary_group={canary!r} is not a group of this inventory: "
                        f"use one of {names} or None")
    return (None if problems else values), problems


# A gateway that is no Thor runs no server: it reads how it is reached and its own settings only,
# so the Thors' required pins and key need not be in its data.
GATEWAY_KEYS = tuple(k for k in FIELDS if k.startswith(("ssh_", "gateway_", "monitor_"))) + (
    "rollout_drain_timeout_s", "preflight_lock_wait_s")
class _Role(BaseModel):
    model_config = Schema.model_config


class _Door(_Role):
    """A gateway's settings, with each client of gateway_clients parsed (check_gateway)."""

    _client_policies: dict = PrivateAttr(default_factory=dict)

    @property
    def client_policies(self) -> dict[str, ClientPolicy]:
        """{client name: its ClientPolicy}: its own limits, models, priority and token budgets,
        else the fleet's (gateway_client_*); {} without gateway_clients."""
        return self._client_policies


def _role_schema(name, keys, base=_Role):
    """The schema of a host that is no Thor: the settings `keys` alone, declared as for a Thor."""
    return create_model(name, __base__=base,
                        **{key: (FIELDS[key].annotation, FIELDS[key]) for key in keys})


def _check_role(schema, keys, data):
    """(values or None, problems) of `data` for a host of `schema`: a key no setting has, or one
    that breaks its rule, is a problem."""
    problems = _unknown_keys(data)
    values = None
    try:
        values = schema.model_validate({k: data[k] for k in keys if k in data})
    except ValidationError as error:
        problems += _messages(error, data)
    return values, problems


class Frozen:
    """A host's settings, changed by nobody once the run's plan has built them (freeze()): what
    a task, the report or doctor reads is what the plan checked. A cached value is still kept
    (functools.cached_property writes the instance's __dict__, not through __setattr__)."""

    def freeze(self):
        self.__dict__["_frozen"] = True

    def hold(self, values) -> None:
        """`values` (a checked schema) kept, each of its settings a plain attribute beside it
        (`s.service_port`): a task, a template or the report reads it as it reads any attribute."""
        clash = sorted(set(type(values).model_fields) & set(dir(type(self))))
        if clash:  # a declared name would hide, or be hidden by, what the class derives
            raise TypeError(f"{type(self).__name__} derives {', '.join(clash)}: a setting's name")
        self.__dict__.update(values.__dict__)
        self.__dict__["values"] = values

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen"):
            raise AttributeError(f"{type(self).__name__}.{name}: a host's settings are not changed "
                                 "after the run's plan built them (thorfleet/plan.py)")
        super().__setattr__(name, value)


class Checked(Frozen):
    """A checked host's settings read as attributes (`g.gateway_port`), the schema's only."""

    def __init__(self, values, name: str):
        self.hold(values)
        self.name = name  # its inventory name

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, {self.values!r})"


GatewaySchema = _role_schema("GatewaySchema", GATEWAY_KEYS, base=_Door)


def check_gateway(data):
    """(GatewaySchema, []) for the data of a gateway (or of a Thor's gateway role), its clients'
    policies parsed (GatewaySchema.client_policies), or (None, problems)."""
    values, problems = _check_role(GatewaySchema, GATEWAY_KEYS, data)
    problems += _ssh_port_problems(values, data, ("gateway_port",))
    cert, key = data.get("gateway_tls_cert_file"), data.get("gateway_tls_key_file")
    if (cert is None) != (key is None):
        problems.append("gateway_tls_cert_file and gateway_tls_key_file go together: set both "
                        "(your certificate and its key), or neither (the fleet CA signs one)")
    if values is not None and values.gateway_clients:
        fleet = {name: getattr(values, setting) for name, setting in CLIENT_BUDGETS.items()}
        values._client_policies = policies(
            values.gateway_clients, values.gateway_client_max_inflight,
            values.gateway_client_requests_per_minute, fleet)
        problems += budget_problems(values.gateway_clients, fleet, values.client_policies)
    return (None if problems else values), problems


# A monitor host (the group `monitor`) runs Prometheus only: how it is reached, its run lock and
# Prometheus's own settings; the Thors' watchdog_port and service_port are read from the Thors.
MONITOR_KEYS = tuple(k for k in FIELDS if k.startswith(("ssh_", "monitor_"))) + (
    "preflight_lock_wait_s",)
MonitorSchema = _role_schema("MonitorSchema", MONITOR_KEYS)


def check_monitor(data):
    """(MonitorSchema, []) for the data of a monitor host that is no Thor, or (None, problems)."""
    values, problems = _check_role(MonitorSchema, MONITOR_KEYS, data)
    return (None if problems else values), problems
