"""`thorfleet doctor`'s verdicts, pure: one row per assumption, from what a host answered.

    rows = thor_rows(host, s, sudo, answers)      # a Thor: the box, power, containers, model, heat
    rows = gateway_rows(host, s, sudo, answers)   # a gateway host: HAProxy, keepalived, its mirror

Each row (ROW_FIELDS): what thorfleet expects, what the box says, and a verdict: ok; copes (it
differs, and thorfleet copes: the row says how); blocks (serving fails until the fix is made);
"not checked yet" (it needs the image, the weights or a running server, which a box that never
served has not). Every expectation comes from the code the deploy runs: the preflight's checks
(operations/preflight.py), the recipe's facts (settings/recipe.py), the parsers the watchdog reads
the box with (readings.py) and the proof's kernel lines (files/thor/bin/thorfleet-serve).
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from thorfleet.box import readings
from thorfleet.doctor.ask import Answer
from thorfleet.operations import preflight
from thorfleet.settings.recipe import (
    FLASHINFER_NO_SM110_MOE_UP_TO,
    POWER_MODE_NAMES,
    PROFILES,
    THOR_ARCH,
    THOR_CAPABILITY,
)

OK, COPES, BLOCKS, NOT_YET = "ok", "copes", "blocks", "not checked yet"
VERDICTS = (OK, COPES, BLOCKS, NOT_YET)
ROW_FIELDS = ("host", "area", "check", "expects", "found", "verdict", "fix")
HAPROXY_MIN = "2.6"  # Debian 12's, whose `haproxy -c` the fast tests check the config with
# the build features the gateway's config uses (files/gateway/haproxy.cfg.j2): TLS on the door's
# bind and the sha2 converter of client keys both come with OpenSSL
HAPROXY_FEATURES = {"OpenSSL (TLS at the door, sha2 of client keys)": "Built with OpenSSL"}
# what the watchdog cannot judge a server without (files/thor/bin/thorfleet-watchdog)
WATCHDOG_NEEDS = ("running", "waiting", "generated", "prompted")
# read for the prefix cache's own row, not asked of every server
PREFIX_CACHE = ("prefix_queries", "prefix_hits")


def row(host, area, check, expects, found, verdict, fix="") -> dict:
    return dict(zip(ROW_FIELDS, (host, area, check, expects, found, verdict, fix), strict=True))


def blocks(table) -> list[dict]:
    return [r for r in table if r["verdict"] == BLOCKS]


def exit_status(table) -> int:
    """0 when nothing blocks serving, else 1."""
    return 1 if blocks(table) else 0


def _failed(host, area, check, expects, answer: Answer, fix, verdict=BLOCKS):
    return row(host, area, check, expects, f"unread: {answer.error}", verdict, fix)


def _version(text):
    try:
        return Version(text)
    except (InvalidVersion, TypeError):
        return None


# --- a Thor ---------------------------------------------------------------------------------------

def thor_rows(host, s, sudo, got: dict) -> list[dict]:
    """Every row of a Thor: `s` its Settings, `sudo` whether `sudo -n` worked, `got` {key:
    Answer} (doctor/ask.py)."""
    return [*_box(host, s, sudo, got), *_power(host, s, got), *_containers(host, s, got),
            *_model(host, s, got), *_heat(host, s, got)]


def sudo_row(host, sudo) -> dict:
    problem = preflight.sudo_problem(sudo, None)
    return row(host, "box", "passwordless sudo", "`sudo -n true` works for the SSH user",
               "works" if sudo else "asks for a password", BLOCKS if problem else OK,
               problem or "")


def _preflight_row(host, check, expects, answers, found, problem):
    """The row of one of the deploy's preflight checks: `problem(*values)` blocks, else ok."""
    failed = next((a for a in answers if a.error), None)
    if failed:
        return _failed(host, "box", check, expects, failed, "")
    values = [a.value for a in answers]
    why = problem(*values)
    return row(host, "box", check, expects, found(*values), BLOCKS if why else OK, why or "")


def _box(host, s, sudo, got):
    yield sudo_row(host, sudo)
    yield _preflight_row(
        host, "L4T release", f"R{s.preflight_min_l4t_release} or newer (JetPack 7: r38; 7.2: r39)",
        [got["release"]], lambda r: f"R{r}" if r else "no /etc/nv_tegra_release",
        lambda r: preflight.release_problem(r, s.preflight_min_l4t_release))
    yield _preflight_row(
        host, "memory total", f"{s.preflight_min_memory_gib} GiB or more (preflight_min_memory_gib)",
        [got["memory"]], lambda m: f"{m:.1f} GiB",
        lambda m: preflight.memory_problem(m, s.preflight_min_memory_gib))
    yield _preflight_row(
        host, "free disk", f"{s.preflight_min_free_disk_gib} GiB free under {s.weights_dir}, the "
        "pinned weights counted", [got["disk"], got["present"]],
        lambda d, p: f"{d:.1f} GiB free + {p:.1f} GiB of pinned weights",
        lambda d, p: preflight.disk_problem(d, p, s.preflight_min_free_disk_gib, s.weights_dir))
    swaps = got["swaps"]
    expects = "none: MemAvailable, which the memory gate reads, counts RAM only"
    if swaps.error:
        yield _failed(host, "box", "swap and zram", expects, swaps, "", COPES)
    elif not swaps.value:
        yield row(host, "box", "swap and zram", expects, "none", OK)
    else:
        areas = ", ".join(f"{a['name']} ({a['type']}, {a['size_kib'] / 1024 ** 2:.1f} GiB)"
                          for a in swaps.value)
        yield row(host, "box", "swap and zram", expects, areas, COPES,
                  "the gate still waits for RAM, but the kernel may swap the server's memory out "
                  "under pressure (slower decode; zram takes RAM itself): `swapoff -a`, and "
                  "disable zram (JetPack's nvzramconfig service) on a serving box")
    drop = got["drop_caches"]
    expects = "root may write /proc/sys/vm/drop_caches (the memory gate's lever; not written)"
    if drop.error or not drop.value:
        yield row(host, "box", "page-cache drop", expects,
                  f"unread: {drop.error}" if drop.error else "not writable", BLOCKS,
                  "the memory gate cannot free the page cache before a start: run thorfleet as "
                  "a user with passwordless sudo on a box whose /proc/sys is writable by root")
    else:
        yield row(host, "box", "page-cache drop", expects, "writable by root", OK)


def _power(host, s, got):
    mode_id, named = s.power_mode, POWER_MODE_NAMES.get(s.power_mode)
    expects = f"power_mode {mode_id}" + (f" ({named})" if named else "")
    modes = got["modes"]
    if modes.error or not modes.value:
        yield row(host, "power", "nvpmodel modes", expects,
                  f"unread: {modes.error}" if modes.error else "no POWER_MODEL lines", BLOCKS,
                  "the deploy sets the mode with nvpmodel: is this a Jetson with L4T's nvpmodel?")
    else:
        offered = ", ".join(f"{i} {name}" for i, name in sorted(modes.value.items()))
        here = modes.value.get(mode_id)
        if here is None:
            yield row(host, "power", "nvpmodel modes", expects, offered, BLOCKS,
                      f"this release offers no mode {mode_id}: set power_mode to one it offers")
        elif named and here != named:
            yield row(host, "power", "nvpmodel modes", expects, offered, COPES,
                      f"mode {mode_id} is {here} here, not {named}: the deploy sets mode "
                      f"{mode_id} whatever its name; check it is the power you want")
        else:
            yield row(host, "power", "nvpmodel modes", expects, offered, OK)
    yield _reboot_row(host, s, got)
    clocks = got["clocks"]
    expects = "`jetson_clocks --show` with cpuN and GPU MinFreq/MaxFreq lines (readings.py)"
    if clocks.error:
        yield _failed(host, "power", "jetson_clocks format", expects, clocks,
                      "the deploy locks clocks with jetson_clocks: install L4T's")
        return
    lines = clocks.value
    known = bool(lines["cpu"] and lines["gpu"])
    yield row(host, "power", "jetson_clocks format", expects,
              f"{len(lines['cpu'])} CPU and {len(lines['gpu'])} GPU lines of {lines['lines']}",
              OK if known else COPES,
              "" if known else "a format thorfleet does not read: status and the watchdog show "
              "the clocks as not locked, and each deploy runs jetson_clocks again")
    if known:
        locked = lines["locked"]
        yield row(host, "power", "clocks locked", "MinFreq == MaxFreq on every CPU and GPU line",
                  "locked" if locked else "not locked", OK if locked else COPES,
                  "" if locked else "the deploy locks them (jetson_clocks, and at every boot "
                  "thorfleet-clocks.service)")


def _reboot_row(host, s, got):
    expects = 'modes that change the GPU power-gating mask need a reboot (docs/facts.md "The target box")'
    mode, masks = got["mode"], got["masks"]
    if mode.error or mode.value is None:
        return row(host, "power", "mode change", expects, "current mode unread", COPES,
                   "the deploy asks nvpmodel and never answers its reboot prompt unasked")
    if mode.value == s.power_mode:
        return row(host, "power", "mode change", expects, f"already mode {mode.value}", OK)
    table = masks.value or {}
    if mode.value not in table or s.power_mode not in table:
        return row(host, "power", "mode change", expects,
                   f"mode {mode.value} now; no mask for it in /etc/nvpmodel.conf", COPES,
                   "nvpmodel decides at the deploy: power_allow_reboot says whether it may reboot")
    if table[mode.value] == table[s.power_mode]:
        return row(host, "power", "mode change", expects,
                   f"mode {mode.value} now: switches live to {s.power_mode}", COPES,
                   "the deploy switches it")
    if s.power_allow_reboot:
        return row(host, "power", "mode change", expects,
                   f"mode {mode.value} now: {s.power_mode} needs a reboot", COPES,
                   "the deploy reboots the box once (power_allow_reboot is True)")
    return row(host, "power", "mode change", expects,
               f"mode {mode.value} now: {s.power_mode} needs a reboot", BLOCKS,
               "set power_allow_reboot = True for one reboot, or run "
               f"`sudo nvpmodel -m {s.power_mode}` and reboot by hand")


def _containers(host, s, got):
    docker = got["docker"]
    if docker.error or not docker.value:
        yield row(host, "containers", "Docker", "an engine answering",
                  f"unread: {docker.error}" if docker.error else "no engine answers", BLOCKS,
                  preflight.runtime_problem(None))
    else:
        yield row(host, "containers", "Docker", "an engine answering", docker.value, OK)
    runtimes = got["runtimes"]
    problem = None if runtimes.error else preflight.runtime_problem(runtimes.value)
    yield row(host, "containers", "nvidia runtime", "`nvidia` among Docker's runtimes",
              f"unread: {runtimes.error}" if runtimes.error else ", ".join(runtimes.value or []),
              BLOCKS if problem or runtimes.error else OK, problem or "")
    cdi = got["cdi"]
    listed = "nvidia-ctk not installed" if cdi.error or cdi.value is None else (
        ", ".join(cdi.value) or "none")
    yield row(host, "containers", "CDI devices", "not needed: the server runs with --runtime "
              "nvidia (shown for the record)", listed, OK)
    yield from _image(host, s, got["probe"])


def _image(host, s, probe):
    capability = ".".join(map(str, THOR_CAPABILITY))
    checks = (("GPU in a container", f"the GPU seen with --runtime nvidia, capability {capability}"),
              ("PyTorch arch list", f"{THOR_ARCH} among the CUDA archs PyTorch was built for"),
              ("vLLM and FlashInfer", "FlashInfer present: the proof needs its CUTLASS NVFP4 GEMM"))
    if probe.value is None and not probe.error:
        for check, expects in checks:
            yield row(host, "containers", check, expects, f"{s.image_base} not on this box",
                      NOT_YET, "doctor pulls nothing: a deploy pulls image_base")
        return
    found = probe.value or {}
    if probe.error or "error" in found:
        said = probe.error or found["error"]
        for check, expects in checks:
            yield row(host, "containers", check, expects, f"the container did not run: {said}",
                      BLOCKS, "the server runs in this image the same way: fix what it says")
        return
    seen = found.get("capability")
    if found.get("torch_error") or seen is None:
        yield row(host, "containers", checks[0][0], checks[0][1],
                  found.get("torch_error") or "no GPU", BLOCKS,
                  "PyTorch in the image sees no GPU: check the nvidia runtime and the driver")
    else:
        here = ".".join(map(str, seen))
        yield row(host, "containers", checks[0][0], checks[0][1],
                  f"{found.get('device')}, capability {here}",
                  OK if tuple(seen) == THOR_CAPABILITY else BLOCKS,
                  "" if tuple(seen) == THOR_CAPABILITY else "not a Thor's GPU")
    archs = found.get("arch_list")
    if archs is None:
        yield row(host, "containers", checks[1][0], checks[1][1], "unread", NOT_YET)
    else:
        has = THOR_ARCH in archs
        yield row(host, "containers", checks[1][0], checks[1][1],
                  f"{' '.join(archs) or 'none'} (torch {found.get('torch')}, CUDA "
                  f"{found.get('torch_cuda')})", OK if has else BLOCKS,
                  "" if has else f"this image's PyTorch has no {THOR_ARCH} kernels: set "
                  "image_base to an image built for Thor (Jetson AI Lab's, or vLLM >= 0.20 "
                  "aarch64 CUDA 13)")
    flashinfer = found.get("flashinfer-python")
    present = found.get("has_flashinfer")  # vLLM's has_flashinfer(), where it could be asked
    present = bool(flashinfer) if present is None else present
    said = (f"vLLM {found.get('vllm')}, FlashInfer "
            + (flashinfer or "present (no version recorded)" if present else "absent"))
    if not present:
        yield row(host, "containers", checks[2][0], checks[2][1], said, BLOCKS,
                  "without FlashInfer vLLM picks other NVFP4 kernels and the proof refuses the "
                  "box: use an image that carries it")
    elif flashinfer and (_version(flashinfer) or Version("0")) <= Version(
            FLASHINFER_NO_SM110_MOE_UP_TO):
        yield row(host, "containers", checks[2][0], checks[2][1], said, COPES,
                  f"FlashInfer <= {FLASHINFER_NO_SM110_MOE_UP_TO} has no SM110 MoE kernels: vLLM "
                  "falls back to its own CUTLASS MoE (the proof accepts either)")
    else:
        yield row(host, "containers", checks[2][0], checks[2][1], said, OK)


def _model(host, s, got):
    for key, label, revision in (("weights", "checkpoint", s.weights_model_revision),
                                 ("draft", "EAGLE draft", s.weights_draft_revision)):
        answer = got[key]
        expects = f"pinned {label} @{str(revision)[:12]} present and verified"
        problems = (answer.value or {}).get("problems") or []
        if answer.error:
            yield _failed(host, "model", label, expects, answer, "", COPES)
        elif "thorfleet tools not installed" in problems:
            yield row(host, "model", label, expects, "thorfleet's tools not installed", NOT_YET,
                      "a deploy fetches and verifies them")
        elif answer.value.get("complete"):
            yield row(host, "model", label, expects, "present, verified", OK)
        else:
            yield row(host, "model", label, expects, "; ".join(problems)[:200] or "incomplete",
                      COPES, "a deploy fetches what is missing and verifies it")
    kernels = got["kernels"].value or {}
    expects = "the kernels the proof requires, read from the running server's log"
    if got["kernels"].error or kernels.get("active") != "active" or "kernels" not in kernels:
        yield row(host, "model", "kernels", expects,
                  got["kernels"].error or f"server {kernels.get('active', 'never installed')}",
                  NOT_YET, "read once the server runs (deploy, then doctor again)")
    else:
        missing = [what for what, line in kernels["kernels"].items() if line is None]
        chosen = " | ".join(kernels.get("chosen") or []) or "no kernel line"
        if kernels.get("marlin"):
            yield row(host, "model", "kernels", expects, kernels["marlin"], BLOCKS,
                      "the slow Marlin FP4 fallback: the proof refuses it")
        elif missing:
            yield row(host, "model", "kernels", expects, chosen[:200], BLOCKS,
                      f"no {', '.join(missing)}: the proof refuses this start")
        else:
            yield row(host, "model", "kernels", expects,
                      "; ".join(kernels["kernels"].values())[:200], OK)
    yield _metrics_row(host, s, got["metrics"])
    yield _prefix_cache_row(host, s, got["metrics"])


def _metrics_row(host, s, metrics):
    expects = "vLLM's /metrics has the names the watchdog reads (readings.VLLM_METRICS)"
    if metrics.error or metrics.value is None:
        return row(host, "model", "server metrics", expects,
                   metrics.error or "the server does not answer", NOT_YET,
                   "read once the server runs")
    missing = [k for k, name in readings.VLLM_METRICS.items() if name not in metrics.value]
    needed = [k for k in missing if k in WATCHDOG_NEEDS]
    eagle = PROFILES.get(s.service_profile, {}).get("eagle")
    optional = [k for k in missing if k not in WATCHDOG_NEEDS and k not in PREFIX_CACHE
                and (eagle or k not in ("accepted", "drafted"))]
    found = f"{len(readings.VLLM_METRICS) - len(missing)} of {len(readings.VLLM_METRICS)}"
    if needed:
        return row(host, "model", "server metrics", expects, f"{found}; no {', '.join(needed)}",
                   BLOCKS, "the watchdog cannot tell a serving server from a wedged one")
    if optional:
        return row(host, "model", "server metrics", expects,
                   f"{found}; no {', '.join(optional)}", COPES,
                   "status lacks EAGLE acceptance, or a long prefill is judged by tokens only")
    return row(host, "model", "server metrics", expects, found, OK)


def _prefix_cache_row(host, s, metrics):
    """The share of prompt tokens the running server took from its prefix cache (vLLM's counters
    since it started), or "off"."""
    expects = "with prefix caching on, the share of prompt tokens served from the cache"
    if metrics.error or metrics.value is None:
        return row(host, "model", "prefix cache", expects,
                   metrics.error or "the server does not answer", NOT_YET,
                   "read once the server runs")
    queries = metrics.value.get(readings.PREFIX_QUERIES)
    hits = metrics.value.get(readings.PREFIX_HITS)
    if queries is None or hits is None:
        return row(host, "model", "prefix cache", expects, "no prefix_cache counters on /metrics",
                   COPES if s.prefix_caching else OK, "no hit rate to show" if s.prefix_caching
                   else "")
    if not s.prefix_caching:
        if queries:  # vLLM counts no query while caching is off: the running server has it on
            return row(host, "model", "prefix cache", expects,
                       f"off in group data, on in the running server ({_hit_rate(hits, queries)})",
                       COPES, "a deploy restarts it with prefix caching off")
        return row(host, "model", "prefix cache", expects, "off", OK)
    if not queries:
        return row(host, "model", "prefix cache", expects,
                   "on; no prompt looked up yet (or the running server has it off)", NOT_YET,
                   "read again once it has served prompts (a deploy restarts an older server)")
    return row(host, "model", "prefix cache", expects, f"on; {_hit_rate(hits, queries)}", OK)


def _hit_rate(hits, queries):
    return f"{hits / queries:.0%} hit rate ({hits:g} of {queries:g} prompt tokens cached)"


def _heat(host, s, got):
    thermal = got["thermal"]
    expects = "thermal zones whose temp reads (the watchdog's and alerts' readings)"
    if thermal.error or not thermal.value:
        yield row(host, "heat", "thermal zones", expects, thermal.error or "none", COPES,
                  "no temperature to read: status shows none and the heat alert cannot fire")
        return
    read = {z: r for z, r in thermal.value.items() if "temp_c" in r}
    unread = {z: r for z, r in thermal.value.items() if "temp_c" not in r}
    hottest = max(read.values(), key=lambda r: r["temp_c"]) if read else None
    found = f"{len(read)} read" + (f", hottest {hottest['type']} {hottest['temp_c']:.1f} °C"
                                   if hottest else "")
    if unread:
        names = ", ".join(f"{z} ({r['type']}: {r['error']})" for z, r in unread.items())
        yield row(host, "heat", "thermal zones", expects, f"{found}; unreadable: {names}",
                  COPES, "the watchdog leaves an unreadable zone out: the heat alert misses it")
    else:
        yield row(host, "heat", "thermal zones", expects, found, OK)


# --- a gateway host -------------------------------------------------------------------------------

def gateway_rows(host, pair: bool, sudo, got: dict) -> list[dict]:
    """Every row of a gateway host (`pair`: two gateways share an address)."""
    table = [sudo_row(host, sudo)]
    build = got["haproxy"]
    expects = f"HAProxy {HAPROXY_MIN} or newer with " + ", ".join(HAPROXY_FEATURES)
    mirror = got["mirror"].value
    if build.error or build.value is None:
        table.append(row(host, "gateway", "HAProxy", expects, "not installed", COPES,
                         "the deploy installs the distribution's haproxy"))
    else:
        version = _version((build.value["version"] or "").split("-")[0])
        lacking = [what for what, line in HAPROXY_FEATURES.items()
                   if not any(ln.startswith(line) for ln in build.value["lines"])]
        old = version is None or version < Version(HAPROXY_MIN)
        table.append(row(host, "gateway", "HAProxy", expects,
                         f"{build.value['version']}" + (f"; no {', '.join(lacking)}"
                                                        if lacking else ""),
                         BLOCKS if lacking or old else OK,
                         "install the distribution's haproxy (Debian 12: 2.6)"
                         if lacking or old else ""))
    if pair:
        keepalived = got["keepalived"]
        table.append(row(host, "gateway", "keepalived", "keepalived, for the shared address",
                         keepalived.value or "not installed", OK if keepalived.value else COPES,
                         "" if keepalived.value else "the deploy installs the distribution's"))
    expects = "the package mirror answers (the deploy installs HAProxy and friends from it)"
    if got["mirror"].error or mirror is None:
        table.append(row(host, "gateway", "package mirror", expects,
                         got["mirror"].error or "APT names no http(s) mirror", COPES,
                         "fine while the gateway's packages are installed"))
    else:
        # without HAProxy the deploy must install it from there: unreachable, that blocks
        needed = build.error or build.value is None
        table.append(row(host, "gateway", "package mirror", expects,
                         f"{mirror['url']}: {mirror['said']}",
                         OK if mirror["ok"] else BLOCKS if needed else COPES,
                         "" if mirror["ok"] else "the deploy installs HAProxy from it: mend the "
                         "route or APT's sources" if needed else "a deploy that must install a "
                         "package fails"))
    return table


def unreachable_rows(host, error) -> list[dict]:
    return [row(host, "box", "SSH", "reachable as a deploy reaches it", error, BLOCKS,
                "check ssh_hostname, the host key (known_hosts) and the SSH user")]
