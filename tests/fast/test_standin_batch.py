"""The stand-in engine core schedules and times a batch as a Thor would (sim/base/standin_core.py,
the step's cost from sim/base/thor.py): one token budget a step, shared by the running decodes
and the prefill chunks, each step as long as what it holds takes.

The table: every figure the docs publish for the stand-in (bench/results/standin-model.json,
written by `python -m bench.standin_model`) is what the model gives now; a change to the model
fails here until the JSON, and the docs that quote it, are made again. The properties hold for any
honest model: the seed's single-stream rates, a batch faster in all and slower each, prefills
that share one clock.

The edits that break it (each tried once): a step a third as fast for any batch above 1; the
batch's slowdown at a quarter of the model's (the routed experts' bytes counted for one token
whatever the batch); a prefill clock per request (a step's cost that of its largest part alone);
the scheduler admitting past max_num_seqs.
"""

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from bench import standin_model
from bench.standin_model import core, thor

RESULT = Path(__file__).resolve().parents[2] / "bench" / "results" / "standin-model.json"
BASE = thor.Box(thor.MISTRAL_SMALL_4, thor.THOR)
EAGLE = thor.Box(thor.MISTRAL_SMALL_4, thor.THOR, 3)


def published() -> dict:
    return json.loads(RESULT.read_text())


def test_the_published_figures_are_what_the_model_gives_now():
    """So the docs regenerate with the model: python -m bench.standin_model --out ..."""
    result = published()
    assert json.loads(json.dumps(standin_model.curves())) == result["mistral_small_4"]
    assert standin_model.held_out() == result["held_out"]


@pytest.mark.parametrize("concurrency, output, each, tpot", [
    (1, 16.43, 17.61, 56.78), (2, 28.24, 15.48, 64.6), (4, 44.41, 12.57, 79.54),
    (8, 62.08, 8.519, 117.4)])
def test_the_throughput_profiles_curve_at_jetson_ai_labs_shape(concurrency, output, each, tpot):
    """2048 in / 128 out, 8 at once at most (the throughput profile's max_num_seqs)."""
    got = standin_model.bench(BASE, concurrency, 2 * concurrency, 2048, 128)
    assert got["output_tok_s"] == pytest.approx(output, rel=2e-3), got
    assert got["per_stream_tok_s"] == pytest.approx(each, rel=2e-3), got
    assert got["tpot_ms"] == pytest.approx(tpot, rel=2e-3), got


def test_alone_a_box_decodes_at_the_seeds_rates():
    for box, seed in ((BASE, thor.SEED_BASE), (EAGLE, thor.SEED_EAGLE)):
        rate = thor.single_stream(box.model, box.machine, box.overhead, thor.SEED_PROMPT,
                                  thor.SEED_TOKENS, box.spec_tokens, box.accept_mean)
        assert rate == pytest.approx(seed, rel=0.01), (box.spec_tokens, rate)
    # EAGLE accepts what the seed's 1.93x asks, no more than it drafts
    assert 0 < EAGLE.accept_mean < 3


def test_a_batch_is_faster_in_all_and_slower_each():
    figures = [standin_model.bench(BASE, c, 2 * c, 2048, 128) for c in (1, 2, 4, 8)]
    totals = [f["output_tok_s"] for f in figures]
    each = [f["per_stream_tok_s"] for f in figures]
    assert totals == sorted(totals) and len(set(totals)) == 4, totals
    assert each == sorted(each, reverse=True) and len(set(each)) == 4, each
    # two at once give more than one, less than two
    assert totals[0] < totals[1] < 2 * totals[0], totals


def test_eight_prompts_share_one_clock():
    """Eight 2,048-token prompts at once: each step's budget (8,192 tokens) holds four, and a step
    costs what all it holds costs. Not quite eight times one: the weights a step reads (every
    routed expert, for any prompt this long) and its fixed cost are paid once for the four."""
    one = BASE.step_seconds([thor.Work(2048, 0)], False)
    scheduler = core.scheduler_for(BASE, 8, 8192)
    for n in range(8):
        scheduler.add(f"r{n}", 2048, 1, "length")
    steps = []
    while (step := scheduler.plan()) is not None:
        steps.append(step)
        scheduler.finish(step)
    assert [sum(n for _, n in s.work) for s in steps] == [8192, 8192]
    eight = sum(s.seconds for s in steps)
    assert 4 * one < eight < 8 * one, (one, eight)


def test_a_long_prompt_delays_the_others_decode():
    """A decode's step holds a 8,192-token chunk of another's prompt: it waits that long."""
    scheduler = core.scheduler_for(BASE, 8, 8192)
    scheduler.add("short", 16, 100, "length")
    scheduler.finish(scheduler.plan())  # its prefill, and its first token
    alone = scheduler.plan()
    scheduler.finish(alone)
    scheduler.add("long", 48000, 1, "length")
    behind = scheduler.plan()
    assert [(r.rid, n) for r, n in behind.work] == [("short", 1), ("long", 8191)]
    assert behind.seconds > 10 * alone.seconds, (alone.seconds, behind.seconds)


def test_no_more_run_than_max_num_seqs_the_rest_wait_in_turn():
    scheduler = core.scheduler_for(BASE, 1, 8192)
    runs = core.closed_loop(scheduler, 4, 4, 64, 8)
    assert scheduler.counts()["running"] == 0
    # each starts when the one before it ends
    ends = sorted(r["end"] for r in runs)
    firsts = sorted(r["first"] for r in runs)
    assert all(first > end for first, end in zip(firsts[1:], ends, strict=False)), runs


def test_the_engine_core_keeps_the_models_time_in_wall_time():
    """The busy loop (as the API server runs it), on a socket pair, at a Thor's own pace: four
    16-token answers at once end when the replayed model says they end (~1.5 s: long enough that
    a loaded machine's late wake-ups, ~0.1 s seen with CI's stories beside it, stay inside the
    bound, while steps that take no time end in ~0.2 s, outside it)."""
    ours, theirs = socket.socketpair()
    scale = 1.0
    engine = core.Core(theirs, core.scheduler_for(BASE, 8, 8192), scale)
    threading.Thread(target=engine.busy_loop, args=(theirs,), daemon=True).start()
    started = time.monotonic()
    for n in range(4):
        ours.sendall((json.dumps({"op": "add", "rid": f"r{n}", "prompt": 64, "steps": 16,
                                  "finish": "length"}) + "\n").encode())
    done, pending, tokens = set(), b"", 0
    while len(done) < 4:
        pending += ours.recv(65536)
        *lines, pending = pending.split(b"\n")
        for line in lines:
            event = json.loads(line)
            if event["rid"] is not None:
                tokens += event["n"]
                if event["finish"]:
                    done.add(event["rid"])
    took = time.monotonic() - started
    ours.close()
    expected = max(r["end"] for r in core.closed_loop(core.scheduler_for(BASE, 8, 8192),
                                                      4, 4, 64, 16))
    assert tokens == 64
    assert took == pytest.approx(expected * scale, rel=0.3, abs=0.15), (took, expected * scale)
