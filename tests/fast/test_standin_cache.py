"""The stand-in engine core's prefix cache (sim/base/standin_core.py) keeps vLLM 0.19.0's rules:
hits in whole blocks along the hash chain from the prompt's start, never the prompt's last token,
one block less with EAGLE, freed blocks kept until the LRU free queue hands them out again (a
chain's tail first), and a hit prefilled already, so the step model charges only the rest.

The edits that break it (each tried once): the last-token rule dropped (`request.prompt - 1` ->
`request.prompt`); EAGLE's dropped block kept; freed blocks appended head first (no `reversed`);
a hit left in the free queue (touch not removing it); the free queue taken from the back; the
hit not counted as prefilled (`request.prefilled = 0`); the lookup counted only on a hit; the
output events without "cached"; the API server's block size left at the CPU platform's; the
draft's KV layers left out of a block's bytes.
"""

import importlib.util
import json
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.standin_model import core, thor

BASE = thor.Box(thor.MISTRAL_SMALL_4, thor.THOR)
EAGLE = thor.Box(thor.MISTRAL_SMALL_4, thor.THOR, 3)
BLOCK = 16
STANDIN = Path(__file__).resolve().parents[2] / "sim" / "base" / "vllm_standin.py"


def chain(labels: str) -> list[str]:
    """A hash chain as the client sends it: each block's hash names every block before it, so a
    block after a difference never matches (vLLM's hash_block_tokens takes the parent's hash)."""
    return [labels[:i + 1] for i in range(len(labels))]


def scheduler(box=BASE, kv_blocks=1 << 30, max_running=8, caching=True):
    return core.scheduler_for(box, max_running, 8192, kv_blocks, BLOCK, caching=caching,
                              eagle=box.spec_tokens > 0)


def run(sched, requests) -> dict[str, int]:
    """Add (rid, prompt tokens, block labels, answer tokens) together, run them to their end;
    each request's cached prompt tokens."""
    cached = {}
    for rid, prompt, labels, steps in requests:
        sched.add(rid, prompt, steps, "length", chain(labels))
    while (step := sched.plan()) is not None:
        for event in sched.finish(step):
            cached[event["rid"]] = event["cached"]
    return cached


# (why, box, first prompt (tokens, blocks), second prompt, the second's cached tokens)
HITS = [
    ("the same 64 tokens: the last token is recomputed, so its whole block is",
     BASE, (64, "abcd"), (64, "abcd"), 48),
    ("65 tokens: 4 full blocks, the 65th token recomputed alone", BASE, (65, "abcd"),
     (65, "abcd"), 64),
    ("a shared prefix of two blocks", BASE, (64, "abcd"), (64, "abxy"), 32),
    ("a difference in the first block: nothing after it matches", BASE, (64, "abcd"),
     (64, "zbcd"), 0),
    ("a partial last block is never cached: 40 tokens cache 2 blocks", BASE, (40, "ab"),
     (64, "abcd"), 32),
    ("a shorter prompt hits its own full blocks only", BASE, (64, "abcd"), (40, "ab"), 32),
    ("one token: nothing to hit", BASE, (64, "abcd"), (1, ""), 0),
    ("EAGLE: the last matched block is dropped too", EAGLE, (64, "abcd"), (64, "abcd"), 32),
    ("EAGLE: 65 tokens", EAGLE, (65, "abcd"), (65, "abcd"), 48),
    ("EAGLE: a one-block hit is no hit", EAGLE, (64, "abcd"), (64, "axyz"), 0),
]


@pytest.mark.parametrize("why, box, first, second, hit", HITS, ids=[h[0] for h in HITS])
def test_a_second_prompt_hits_whole_blocks_of_the_first(why, box, first, second, hit):
    sched = scheduler(box)
    assert run(sched, [("first", *first, 1)]) == {"first": 0}
    assert run(sched, [("second", *second, 1)]) == {"second": hit}, why
    # each lookup counted as vLLM's PrefixCacheStats.record does: its prompt, its hit
    assert sched.take_prefix() == [2, first[0] + second[0], hit]
    assert sched.take_prefix() is None


def test_without_prefix_caching_nothing_is_looked_up_or_hit():
    sched = scheduler(caching=False)
    assert run(sched, [("first", 64, "abcd", 1)]) == {"first": 0}
    assert run(sched, [("second", 64, "abcd", 1)]) == {"second": 0}
    assert sched.take_prefix() is None


def test_a_request_admitted_in_the_same_step_hits_blocks_scheduled_before_it():
    """vLLM caches a prefill's full blocks when it schedules them (allocate_slots), so a twin
    admitted later in the same step finds them."""
    sched = scheduler()
    assert run(sched, [("one", 64, "abcd", 1), ("two", 64, "abcd", 1)]) == {"one": 0, "two": 48}


def test_the_answers_blocks_are_cached_too():
    """A second turn whose prompt holds the first turn's answer hits into it (vLLM hashes every
    full block of the request, output included), up to the answer's last computed token."""
    sched = scheduler()
    # 32 prompt tokens and a 40-token answer: tokens 0..70 computed (the last sampled is not),
    # so blocks 0..3 are full and cached
    assert run(sched, [("turn1", 32, "abcde", 40)]) == {"turn1": 0}
    assert run(sched, [("turn2", 96, "abcdef", 1)]) == {"turn2": 64}


# (why, usable blocks, waves of (rid, prompt, blocks, answer), each request's cached tokens):
# 32-token prompts take 2 blocks, so a pool of 4 holds two of them.
EVICTIONS = [
    ("the least recently freed is evicted first", 4,
     [[("a", 32, "ab", 1)], [("b", 32, "xy", 1)], [("c", 32, "pq", 1)], [("a2", 48, "abc", 1)]],
     {"a": 0, "b": 0, "c": 0, "a2": 0}),
    ("the more recently freed stays cached", 4,
     [[("a", 32, "ab", 1)], [("b", 32, "xy", 1)], [("c", 32, "pq", 1)], [("b2", 48, "xyz", 1)]],
     {"a": 0, "b": 0, "c": 0, "b2": 32}),
    ("a request's blocks are freed tail first: its head outlives its tail", 2,
     [[("a", 32, "ab", 1)], [("d", 16, "p", 1)], [("a2", 48, "abc", 1)]],
     {"a": 0, "d": 0, "a2": 16}),
    ("a hit takes its blocks out of the free queue: a request beside it cannot evict them", 3,
     [[("a", 32, "ab", 1)], [("a2", 48, "abc", 1), ("g", 32, "xy", 1)],
      [("a3", 48, "abc", 1)]],
     {"a": 0, "a2": 32, "g": 0, "a3": 32}),
]


@pytest.mark.parametrize("why, usable, waves, hits", EVICTIONS, ids=[e[0] for e in EVICTIONS])
def test_eviction_follows_vllms_free_queue(why, usable, waves, hits):
    sched = scheduler(kv_blocks=usable + 1)  # and the null block
    got = {}
    for wave in waves:
        got.update(run(sched, wave))
    assert got == hits, why
    assert sched.counts()["kv"] == 0.0  # every block free again, the cached ones included


# (box, the second prompt's prefill as the step model is charged it: new tokens, cached context)
SHORTER = [(BASE, 16, 2032), (EAGLE, 32, 2016)]


@pytest.mark.parametrize("box, new, context", SHORTER, ids=["base", "eagle"])
def test_a_hit_shortens_the_prefill_in_closed_loop_time(box, new, context):
    """The same 2,048-token prompt twice, one after the other: the second's first token comes
    after a prefill of only what the cache did not hold, attending over what it did."""
    labels = "".join(chr(0x4e00 + i) for i in range(2048 // BLOCK))
    runs = core.closed_loop(scheduler(box, max_running=1), 1, 2, 2048, 16, chain(labels))
    first, second = (r["first"] - r["sent"] for r in runs)
    assert first == pytest.approx(box.step_seconds([thor.Work(2048, 0)], False))
    assert second == pytest.approx(box.step_seconds([thor.Work(new, context)], False))
    assert second < first / 2
    off = core.closed_loop(scheduler(box, max_running=1, caching=False), 1, 2, 2048, 16,
                           chain(labels))
    assert [r["first"] - r["sent"] for r in off] == pytest.approx([first, first])


def test_the_engine_core_reports_hits_and_lookups_over_its_socket():
    """The busy loop as the API server runs it: each output says how many prompt tokens were
    cached, and the lookups reach the client once each, as the step's prefix-cache stats."""
    ours, theirs = socket.socketpair()
    engine = core.Core(theirs, scheduler(), 0.001)
    threading.Thread(target=engine.busy_loop, args=(theirs,), daemon=True).start()
    cached, prefix, pending = {}, [0, 0, 0], b""
    for rid in ("first", "second"):
        ours.sendall((json.dumps({"op": "add", "rid": rid, "prompt": 64, "steps": 2,
                                  "finish": "length", "blocks": chain("abcd")}) + "\n").encode())
        while rid not in cached or not cached.get("done-" + rid):
            pending += ours.recv(65536)
            *lines, pending = pending.split(b"\n")
            for line in lines:
                event = json.loads(line)
                prefix = [a + b for a, b in zip(prefix, event.get("prefix", (0, 0, 0)),
                                                strict=True)]
                if event["rid"] is not None:
                    cached[event["rid"]] = event["cached"]
                    cached["done-" + event["rid"]] = event["finish"] is not None
    ours.close()
    assert (cached["first"], cached["second"]) == (0, 48)
    assert prefix == [2, 128, 48]


def standin():
    """vllm_standin alone (its top level is stdlib; thor is imported beside it)."""
    spec = importlib.util.spec_from_file_location("vllm_standin_cache_under_test", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# (why, block size vLLM's config holds, whether the user chose it, the Thor's)
SIZES = [("the sim's CpuPlatform set 128; TRITON_MLA on a Thor keeps the default 16", 128, False,
          16),
         ("a --block-size the user gave is kept", 64, True, 64)]


@pytest.mark.parametrize("why, configured, chosen, thors", SIZES, ids=[s[0] for s in SIZES])
def test_the_engine_core_gets_a_thors_block_size(why, configured, chosen, thors):
    config = SimpleNamespace(block_size=configured, user_specified_block_size=chosen)
    assert standin().thor_block_size(config) == thors, why


# (why, requested bytes, weight bytes, draft, max_model_len, blocks): the seed asks 0.72 of a
# Thor's 122 GiB (94,317,481,821 bytes) and loads 66 GB; a token's KV is 320 BF16 values a layer,
# 36 layers and the draft's 2
KV = [("the seed with its draft: 28.3 GB over 16 x 38 x 640 bytes", 94_317_481_821,
       66_000_000_000, True, 65536, 72_773),
      ("without the draft: 36 layers", 94_317_481_821, 66_000_000_000, False, 65536, 76_816),
      ("no room: one max_model_len sequence, the least vLLM starts with", 60_000_000_000,
       66_000_000_000, True, 65536, 4096)]


@pytest.mark.parametrize("why, requested, weights, draft, max_model_len, blocks", KV,
                         ids=[k[0] for k in KV])
def test_kv_blocks_are_what_the_memory_left_after_the_weights_holds(why, requested, weights,
                                                                   draft, max_model_len, blocks):
    assert standin().kv_blocks(requested, weights, 16, draft, max_model_len) == blocks, why
