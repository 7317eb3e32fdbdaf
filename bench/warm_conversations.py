"""Benchmark warm conversations: turns 2-6 of each conversation against its first, through the
door, with prefix caching on and off, on the default profile and the throughput profile.

    python -m sim up --hosts 3 --gateway
    python -m bench.warm_conversations --hosts 1-3 --out bench/results/warm-conversations.json

The boxes thor-<hosts> behind gw-1. Each run converges them on a profile, with prefix caching
and the door's affinity both on (gateway_affinity_balance_factor AFFINITY), caching on and the
door spreading turns (leastconn), or both off (the seed's), then runs `python -m thorfleet bench --conversations N` (the
product's own multi-turn mode, on this machine as a client) with issue 52's shape: each
conversation 6 turns growing from 16K tokens, 64-token answers, 2 s of thought between turns; 3
conversations at once on the default profile (one per box), 8 on the throughput profile. Each
run's whole result (every turn: the box it landed on, its time to first token, the door's wait,
its cached tokens) is kept under `runs`, with the goals checked beside it:
- time to first token of turns 2-6 (median, the door's wait apart) at most a tenth of turn 1's;
- at least 90 % of turns 2-6 served by the box that served the turn before (where the prefix
  is), and no box serving more than 1.5x the mean number of requests.
Beside the first way's result: `modelled`, what the step model of a Thor gives turn 2 against
turn 1 from the run's own token counts (the share no cache takes off), and `floor`, what the API
server's render and tokenizer and a one-token chat take on this machine's CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.rollout import parse_range
from sim import fleet, operator
from sim.base import thor
from thorfleet.cli.conversations import TOKENS_PER_WORD, history, text

GATEWAY = "gw-1"
RUNS = (("default", 3), ("throughput", 8))  # (profile, conversations at once)
AFFINITY = 150
# (prefix caching, the door's balance factor or None: leastconn)
WAYS = ((True, AFFINITY), (True, None), (False, None))
SHAPE = {"turns": 6, "first_tokens": 16000, "grow_tokens": 300, "answer_tokens": 64,
         "think_s": 2.0}


def converge(sim, workdir: Path, hosts, profile: str, caching: bool, factor) -> Path:
    inventory = sim.write_inventory(
        workdir / f"{profile}-{caching}-{factor}.py", hosts=hosts,
        gateway=(GATEWAY, {"gateway_affinity_balance_factor": factor}),
        extra_data={"service_profile": profile, "service_prefix_caching": caching,
                    "rollout_report_path": str(workdir / "report.json"), "rollout_batch": 3})
    run = operator.deploy(inventory)
    if run.returncode != 0:
        raise RuntimeError(run.stderr[-3000:])
    return inventory


def converse(inventory: Path, out: Path, conversations: int) -> dict:
    words = [sys.executable, "-m", "thorfleet", "bench", str(inventory), "--out", str(out),
             "--conversations", str(conversations),
             *(f"--{key.replace('_', '-')}={value}" for key, value in SHAPE.items())]
    done = subprocess.run(words, text=True, check=False)
    result = json.loads((out / "conversations.json").read_text())
    result["exit"] = done.returncode
    return result


KEY_FILE = "/etc/thorfleet/secrets.env"  # the box's own key (files/thor/systemd: EnvironmentFile)


def on_box(sim, host, path: str, body: dict, runs: int = 3) -> float:
    """Median seconds of `runs` POSTs of `body` to the box's own vLLM port, timed by curl on the
    box (no door, no TLS); the body and the key go through files, never a command line."""
    sim.put(host, "/tmp/bench-body.json", json.dumps(body))
    code, out = sim.exec(host, (
        f"set -a; . {KEY_FILE}; set +a; umask 077; h=$(mktemp); "
        'printf "Authorization: Bearer %s\\n" "$VLLM_API_KEY" > "$h"; '
        f"for i in $(seq {runs}); do curl -sS -o /dev/null -w '%{{time_total}}\\n' -H @\"$h\" "
        "-H 'Content-Type: application/json' --data-binary @/tmp/bench-body.json "
        f"http://127.0.0.1:8002{path}; done; rm -f \"$h\" /tmp/bench-body.json"), timeout=300)
    if code != 0:
        raise RuntimeError(f"{host}: {out[-1000:]}")
    return statistics.median(float(t) for t in out.split())


def floor(sim, host: str, words: int) -> dict:
    """What a later turn costs that is not the prefill the box models: the API server's chat
    template and tokenizer on a whole first turn's messages (vLLM's own /tokenize, the same
    render a chat request takes), and a one-word chat answered with one token. Both on this
    machine's CPU, where a Thor's would be its own."""
    messages = history([text(0, 1, words, "floor")], [])
    return {"host": host,
            "tokenize_first_turn_s": round(on_box(sim, host, "/tokenize", {
                "model": "/model", "messages": messages}), 3),
            "one_word_chat_s": round(on_box(sim, host, "/v1/chat/completions", {
                "model": "/model", "max_tokens": 1,
                "messages": [{"role": "user", "content": "hello"}]}), 3)}


BATCHED_TOKENS, EAGLE_TOKENS = 8192, 3  # files/thor/vllm.yaml.j2: a step's tokens, EAGLE's draft


def modelled(run: dict) -> dict | None:
    """What the stand-in's step model of a Thor (sim/base/thor.py) gives the default profile's
    turn 1 and turn 2 of one conversation of this run alone, from its own token counts: the
    share no prefix cache can take off. A later turn's few hundred new tokens are one step that
    reads nearly every expert's weights (a Thor's bandwidth), and its first token one more."""
    rows = {r["turn"]: r for r in run["turns"] if r["conversation"] == 0 and "error" not in r}
    if run["profile"] != "default" or not {1, 2} <= set(rows):
        return None
    box = thor.Box(thor.MISTRAL_SMALL_4, thor.THOR, spec_tokens=EAGLE_TOKENS)

    def first_token(new: int, cached: int) -> float:
        seconds, done = 0.0, 0
        while done < new:  # chunked prefill
            chunk = min(BATCHED_TOKENS, new - done)
            seconds += box.step_seconds([thor.Work(chunk, cached + done)], False)
            done += chunk
        return seconds

    one = first_token(rows[1]["prompt_tokens"], 0)
    two = first_token(rows[2]["prompt_tokens"] - rows[2]["cached_tokens"], rows[2]["cached_tokens"])
    return {"turn_1_s": round(one, 3), "turn_2_s": round(two, 3),
            "later_vs_first_ttft": round(two / one, 3)}


def goals(summary: dict) -> dict:
    return {"later_vs_first_ttft": summary["later_vs_first_ttft"], "at_most": 0.1,
            "later_turns_on_their_box": summary["later_turns_on_their_box"], "at_least": 0.9,
            "busiest_box_vs_mean": summary["busiest_box_vs_mean"], "busiest_at_most": 1.5,
            "met": (summary["later_vs_first_ttft"] or 1) <= 0.1
            and (summary["later_turns_on_their_box"] or 0) >= 0.9
            and (summary["busiest_box_vs_mean"] or 9) <= 1.5 and not summary["failed"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1-3")
    parser.add_argument("--out", type=Path,
                        default=Path("bench/results/warm-conversations.json"))
    parser.add_argument("--profile", action="append", choices=[p for p, _ in RUNS],
                        help="only these (default: each)")
    args = parser.parse_args(argv)
    hosts = parse_range(args.hosts)
    sim = fleet.attach()
    workdir = Path(tempfile.mkdtemp(prefix="bench-warm-"))
    results = {"command": "python -m bench.warm_conversations " + " ".join(
        sys.argv[1:] if argv is None else argv), "hosts": hosts, "gateway": GATEWAY,
        "shape": SHAPE, "runs": []}
    for profile, conversations in RUNS:
        if args.profile and profile not in args.profile:
            continue
        for caching, factor in WAYS:
            print(f"bench: {profile}, prefix caching {'on' if caching else 'off'}, affinity "
                  f"{factor}: converging", file=sys.stderr, flush=True)
            inventory = converge(sim, workdir, hosts, profile, caching, factor)
            run = converse(inventory, workdir / f"{profile}-{caching}-{factor}", conversations)
            run.update(profile=profile, prefix_caching=caching, affinity=factor)
            if caching and factor:
                run["modelled"] = modelled(run)
                run["floor"] = floor(sim, hosts[0], round(SHAPE["first_tokens"] / TOKENS_PER_WORD))
            if caching and factor:
                run["goal"] = goals(run["summary"])
            results["runs"].append(run)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")  # each run as it ends
    met = all(r["goal"]["met"] for r in results["runs"] if "goal" in r)
    for r in results["runs"]:
        s = r["summary"]  # read back from JSON: its turns are keyed "1", "2", ...
        print(f"{r['profile']:>10} caching {'on ' if r['prefix_caching'] else 'off'} affinity "
              f"{r['affinity']}: turn 1 "
              f"{s['turns']['1']['median_ttft_ms']} ms, "
              f"later/first {s['later_vs_first_ttft']}, on their box "
              f"{s['later_turns_on_their_box']}, busiest {s['busiest_box_vs_mean']}x")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
