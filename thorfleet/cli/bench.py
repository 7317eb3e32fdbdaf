"""`python -m thorfleet bench INVENTORY --out DIR`: the fleet's capacity, measured as the field
measures it, by vLLM's own `vllm bench serve` through the door.

    runs = plan(models, shapes)              # pure: one run per model, shape and concurrency
    where = door_for_boxes(g)                # pure: the door's URL as a box reaches it
    words = bench_words(run, where, ...)     # pure: `vllm bench serve` with vLLM's own flags
    lines = summary(results, capacity)       # pure: the table, and what queued at the door

Where it runs: on a Thor (`--on HOST`, default the first), in the image that box serves, with
the model's own tokenizer (its weights folder, read-only). vLLM and the tokenizer are there; a
laptop often has neither, and the image is built for the box (arm64). Each run is its own
`docker run --rm` (`--runtime nvidia`: the image's PyTorch loads the Jetson libcuda, as the server
does). It asks the door as any client does, with a client's key (`--client`) or the fleet's: the
door's limits apply. The key reaches the box on the SSH command's stdin and the container on its
own stdin, which the container's shell reads into vLLM's environment: never on a command line,
in a file, or in the container's configuration (`docker inspect`). The results come back as vLLM
wrote them (`--save-result`); the laptop writes DIR/bench.json ({"runs": [...]}, vLLM's keys plus
thorfleet's `shape`, `box_slots` and `queued`) and draws DIR/bench.png when matplotlib is installed
(the optional extra `plot`).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from thorfleet.gateway.monitor import target

# The shapes people compare (input tokens, output tokens, concurrencies, prompts at each).
# seed 004's: 1024 in / 512 out at concurrency 1 (and, `seed-large`, 1000 prompts at 100);
# Jetson AI Lab's: 2048 in / 128 out at concurrency 1 and 8 (docs/facts.md "Checked again in
# December 2026": reported speeds).
PRESETS = {
    "seed": (1024, 512, (1,), 8),
    "jetson-ai-lab": (2048, 128, (1, 8), 16),
    "seed-large": (1024, 512, (100,), 1000),
}
DEFAULT_PRESETS = ("seed", "jetson-ai-lab")
LONG_PRESETS = {"seed-large": "1000 prompts of 512 tokens: hours on a fleet of a few boxes that "
                              "decode one request each at ~34 tok/s"}
RESULT = "result.json"
MARK = "thorfleet-bench-result:"  # the line after which the box prints vLLM's result


@dataclass(frozen=True)
class Run:
    model: str
    shape: str
    input_len: int
    output_len: int
    concurrency: int
    prompts: int


def plan(models, shapes) -> list[Run]:
    """One run per model, shape and concurrency, in that order. `shapes`: {name: (input,
    output, concurrencies, prompts)}."""
    return [Run(m, name, i, o, c, p) for m in models
            for name, (i, o, concurrencies, p) in shapes.items() for c in concurrencies]


def door_for_boxes(g) -> tuple[str, str | None]:
    """(the door's URL as a box reaches it, an `--add-host NAME:IP` it needs or None). The URL
    must be one the door's certificate names: the shared address (two gateways); else the address
    the gateway connects to the boxes from, when the certificate names it; else a DNS name of
    gateway_names, resolved to that address. ValueError with the fix when there is none."""
    port = g.gateway_port
    if g.gateway_virtual_ip:
        return f"https://{g.gateway_virtual_ip.split('/')[0]}:{port}", None
    own = g.own_address
    if own in g.names:
        return f"https://{target(own, port)}", None
    dns = [n for n in g.gateway_names if not _is_ip(n)]
    if dns:
        return f"https://{dns[0]}:{port}", f"{dns[0]}:{own}"
    raise ValueError(f"{g.name}: the boxes reach the door at {own} (gateway_fleet_address), which "
                     f"its certificate does not name ({', '.join(g.names)}): add {own}, or a DNS "
                     "name for it, to gateway_names and deploy")


def _is_ip(text) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def bench_words(run: Run, url: str, goodput=()) -> list[str]:
    """`vllm bench serve`'s words for one run, vLLM's own flags (vllm/benchmarks/serve.py): the
    chat endpoint, random prompts of the model's own tokenizer, every request its full output
    (--ignore-eos), the result saved where the box reads it back."""
    return ["vllm", "bench", "serve", "--backend", "openai-chat",
            "--endpoint", "/v1/chat/completions", "--base-url", url, "--model", run.model,
            "--tokenizer", "/model", "--tokenizer-mode", "mistral", "--dataset-name", "random",
            "--random-input-len", str(run.input_len), "--random-output-len", str(run.output_len),
            "--num-prompts", str(run.prompts), "--max-concurrency", str(run.concurrency),
            "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99",
            *(["--goodput", *goodput] if goodput else []),
            "--save-result", "--result-dir", "/out", "--result-filename", RESULT]


_NAME, _OUT = object(), object()  # the container's name and the run's folder: $name and $d
# What the container runs first: the key's line off its stdin into its own environment, then vLLM.
# `read` is sh's builtin: the key is in no process's arguments and not in the container's
# configuration (docker inspect's Config.Env holds what -e and --env-file gave it).
_KEY_FROM_STDIN = 'IFS= read -r OPENAI_API_KEY && export OPENAI_API_KEY && exec "$@"'
CONTAINER = "thorfleet-bench-"  # the bench container's name: this and the run's folder's suffix
# The signals that end the box's shell early (the SSH session gone: HUP or PIPE; ^C; a kill):
# each exits, so the EXIT trap runs. dash runs the EXIT trap on `exit` only, not on a signal.
_SIGNALS = (("HUP", 129), ("INT", 130), ("PIPE", 141), ("TERM", 143))


def box_command(run: Run, url: str, add_host, image: str, model_dir: str, goodput=()) -> str:
    """The shell command the box runs as root (under sudo -n): stdin is the key's line (read by
    the shell's own `read`, which takes one line and no more), then the CA's certificate. The key
    is written on no disk and into no process's arguments: the shell's builtin printf pipes it to
    the container's stdin (`docker run -i`), where the container's shell reads it into its own
    environment before it runs vLLM. A root-only folder for the CA and the result, removed after,
    and the container removed with it when the shell is stopped early (HUP, INT, PIPE, TERM);
    vLLM's result is printed after MARK."""
    docker = ["docker", "run", "-i", "--rm", "--name", _NAME, "--runtime", "nvidia",
              "--network", "host", *(["--add-host", add_host] if add_host else []),
              "-e", "SSL_CERT_FILE=/out/ca.pem", "-v", f"{model_dir}:/model:ro", "-v", _OUT,
              image, "sh", "-c", _KEY_FROM_STDIN, "sh", *bench_words(run, url, goodput)]
    line = " ".join({_NAME: '"$name"', _OUT: '"$d":/out'}.get(w) if w in (_NAME, _OUT)
                    else shlex.quote(w) for w in docker)
    traps = "; ".join(f"trap 'exit {code}' {signal}" for signal, code in _SIGNALS)
    script = ("umask 077; d=$(mktemp -d) || exit 1; "
              f"name={CONTAINER}" + "${d##*.}; "
              "trap 'docker rm -f \"$name\" >/dev/null 2>&1; rm -rf \"$d\"' EXIT; "
              f"{traps}; "
              "IFS= read -r key; cat > \"$d/ca.pem\"; "
              # in the background, so a signal is taken at once (a shell waiting for a
              # foreground command runs its traps only after it ends)
              f"printf '%s\\n' \"$key\" | {line} >&2 & key=; wait $!; rc=$?; "
              f"echo {MARK}; cat \"$d/{RESULT}\" 2>/dev/null; exit $rc")
    return "sudo -n sh -c " + shlex.quote(script)


def result_of(out: str) -> dict | None:
    """vLLM's result as the box printed it after MARK, or None."""
    _, mark, rest = out.partition(MARK)
    try:
        return json.loads(rest) if mark and rest.strip() else None
    except ValueError:
        return None


def queued(concurrency: int, slots: int) -> int:
    """How many of a run's requests wait at the door at a time: the model's boxes take `slots`
    (their max_num_seqs) at once."""
    return max(0, concurrency - slots)


def summary(results: list[dict]) -> list[str]:
    """The runs as the operator reads them: per model and concurrency, output tok/s, time to
    first token, time per output token and inter-token latency (median, p99), goodput when an
    SLO was set, failures, and how many waited at the door."""
    head = (f"{'model':<24} {'conc':>4} {'shape':<14} {'ok/n':>7} {'out tok/s':>9} "
            f"{'TTFT med/p99 ms':>17} {'TPOT med/p99':>14} {'ITL med/p99':>14} {'goodput':>8}")
    lines = [head]
    for r in results:
        goodput = r.get("request_goodput")
        lines.append(
            f"{r['model_id']:<24} {r['max_concurrency']:>4} {r['shape']:<14} "
            f"{r['completed']:>3}/{r['num_prompts']:<3} {r['output_throughput']:>9.1f} "
            f"{r['median_ttft_ms']:>8.0f}/{r['p99_ttft_ms']:<8.0f} "
            f"{r['median_tpot_ms']:>6.1f}/{r['p99_tpot_ms']:<7.1f} "
            f"{r['median_itl_ms']:>6.1f}/{r['p99_itl_ms']:<7.1f} "
            f"{'-' if goodput is None else f'{goodput:.2f}':>8}")
    for r in results:
        if r.get("failed"):
            lines.append(f"{r['model_id']} at {r['max_concurrency']}: {r['failed']} of "
                         f"{r['num_prompts']} requests failed (over the client's limits at the "
                         "door? gateway_client_max_inflight)")
        if r["queued"]:
            lines.append(f"{r['model_id']} at {r['max_concurrency']}: {r['queued']} of "
                         f"{r['max_concurrency']} requests waited at the door at a time: its boxes "
                         f"take {r['box_slots']} at once (max_num_seqs)")
    return lines


def plot(results: list[dict], path: Path) -> bool:
    """DIR/bench.png: output tok/s, and median TTFT and TPOT, against concurrency, a line per
    model. False when matplotlib is not installed (the optional extra `plot`)."""
    plt = pyplot()
    if plt is None:
        return False
    figure, (speed, latency) = plt.subplots(1, 2, figsize=(11, 4))
    for model in dict.fromkeys(r["model_id"] for r in results):
        for shape in dict.fromkeys(r["shape"] for r in results if r["model_id"] == model):
            rows = sorted((r for r in results if r["model_id"] == model and r["shape"] == shape),
                          key=lambda r: r["max_concurrency"])
            x = [r["max_concurrency"] for r in rows]
            label = f"{model} ({shape})"
            speed.plot(x, [r["output_throughput"] for r in rows], marker="o", label=label)
            latency.plot(x, [r["median_ttft_ms"] for r in rows], marker="o",
                         label=f"{label} TTFT")
            latency.plot(x, [r["median_tpot_ms"] for r in rows], marker="s", linestyle="--",
                         label=f"{label} TPOT")
    speed.set(xlabel="concurrency", ylabel="output tok/s", title="throughput")
    latency.set(xlabel="concurrency", ylabel="ms (median)", title="latency", yscale="log")
    return saved(plt, figure, (speed, latency), path)


def pyplot():
    """matplotlib's pyplot drawing to files, or None without the optional extra `plot`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def saved(plt, figure, panels, path) -> bool:
    """Each panel's legend and grid, the figure written to `path` and closed: True."""
    for axes in panels:
        axes.legend(fontsize=7)
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True


def the_door(inventory, settings, err):
    """The first gateway's settings: what a benchmark asks through. None, said on `err`, when
    the inventory has no gateway."""
    from thorfleet.settings.roles import gateways

    doors = [settings[h.name].gateway_role for h in gateways(inventory)]
    if not doors:
        print("thorfleet: bench measures through the door: the inventory has no gateway",
              file=err)
        return None
    return doors[0]


def door_key(g, box, client: str | None) -> str:
    """The key a benchmark asks the door with: client's (gateway_clients), else the fleet's one
    key when the door has no clients (the client's as the run's plan read it). ValueError naming
    the fix."""
    if client:
        if client not in (g.gateway_clients or {}):
            raise ValueError(f"--client {client}: not one of gateway_clients "
                             f"({', '.join(sorted(g.gateway_clients or {})) or 'none'})")
        policy = g.policies[client]  # its key as the run's plan read it
        if policy.key is None:
            raise ValueError(f"--client {client}: its key file {policy.key_file} is not there "
                             "yet: a deploy makes it (pyinfra INVENTORY deploy.py)")
        return policy.key
    if g.gateway_clients:
        raise ValueError("the door takes client keys only (gateway_clients): name one with "
                         "--client NAME; its limits apply to the benchmark")
    return box.api_key


def run_all(inventory, settings, out: Path, *, models=None, shapes=None, client=None, on=None,
            goodput=(), run=None, err=sys.stderr, timeout=None) -> int:
    """Every run on the box `on` (default: the inventory's first Thor), one after another, with
    progress on stderr; DIR/bench.json and DIR/bench.png written. 0 when every run completed
    with no failed request, else 1."""
    from thorfleet.settings.roles import thors

    if run is None:
        from thorfleet.run.pyinfra_hooks import connectable
        from thorfleet.run.pyinfra_hooks import run_once as run

        connectable(inventory, 10)
    g = the_door(inventory, settings, err)
    if g is None:
        return 2
    boxes = thors(inventory)
    runner = next((h for h in boxes if h.name == on), None) if on else boxes[0]
    if runner is None:
        print(f"thorfleet: --on {on}: not a Thor of this inventory", file=err)
        return 2
    box = settings[runner.name]
    try:
        url, add_host = door_for_boxes(g)
        key = door_key(g, box, client)
    except (OSError, ValueError) as error:
        print(f"thorfleet: {error}", file=err)
        return 2
    served = {b.model: sum(x.maxconn for x in pool)
              for pool in g.pools.values() for b in pool[:1]}
    models = list(models or served)
    unknown = [m for m in models if m not in served]
    if unknown:
        print(f"thorfleet: --model {', '.join(unknown)}: no box serves it (the door serves "
              f"{', '.join(served)})", file=err)
        return 2
    shapes = shapes or {name: PRESETS[name] for name in DEFAULT_PRESETS}
    for name in shapes:
        if name in LONG_PRESETS:
            print(f"thorfleet: preset {name}: {LONG_PRESETS[name]}", file=err)
    runs = plan(models, shapes)
    ca = Path(g.ca_file).read_text()
    out.mkdir(parents=True, exist_ok=True)
    results, failed = [], False
    for n, r in enumerate(runs, 1):
        print(f"thorfleet: bench {n}/{len(runs)} on {runner.name}: {r.model}, {r.prompts} prompts "
              f"of {r.input_len} in / {r.output_len} out at concurrency {r.concurrency} "
              f"({r.shape})", file=err, flush=True)
        command = box_command(r, url, add_host, box.image_tag, box.model_dir, goodput)
        code, said, log = run(runner, command, timeout or 86400,
                              stdin=f"{key}\n{ca}".encode())
        result = result_of(said)
        if code != 0 or result is None:
            tail = " / ".join(line for line in (log or said).strip().splitlines()[-3:])
            print(f"thorfleet: {runner.name}: vllm bench serve failed (exit {code}): {tail}",
                  file=err)
            failed = True
            continue
        if result.get("failed"):  # vLLM logs each failed request's error
            errors = [line.strip() for line in log.splitlines() if "rror" in line][-2:]
            print(f"thorfleet: {runner.name}: {result['failed']} of {r.prompts} requests failed: "
                  f"{' / '.join(errors) or 'vLLM said no more'}", file=err)
        slots = served[r.model]
        result.update(shape=r.shape, box_slots=slots, queued=queued(r.concurrency, slots))
        failed |= bool(result.get("failed")) or not result.get("completed")
        results.append(result)
    (out / "bench.json").write_text(json.dumps({"runs": results}, indent=2) + "\n")
    for line in summary(results):
        print(line)
    drawn = plot(results, out / "bench.png") if results else False
    print(f"thorfleet: wrote {out / 'bench.json'}"
          + (f" and {out / 'bench.png'}" if drawn else
             " (no plot: pip install 'thorfleet[plot]' for bench.png)"), file=err)
    return 1 if failed else 0
