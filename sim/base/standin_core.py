"""The stand-in EngineCore: a process of its own, as vLLM V1 runs its engine core.

vLLM 0.19.0's AsyncLLM talks to its engine through `AsyncMPClient` (v1/engine/core_client.py,
MPClient), which starts `EngineCoreProc.run_engine_core` in a background process
(v1/engine/core.py L1038) titled by `set_process_title("EngineCore")` (core.py L1054-1055) as
`VLLM::EngineCore` (utils/system_utils.py L179-193, prefix VLLM_PROCESS_NAME_PREFIX). The API
server sends requests, the engine core schedules and steps them and sends outputs back; a
process frozen with SIGSTOP (what a hung GPU looks like from the API server) sends nothing, while
the API server still answers /health 200: AsyncLLM.check_health only raises once the engine core
is dead (v1/engine/async_llm.py L874-877, `errored` L1026-1027).

So here: vllm_standin.StandInCore is the client in the API server's process; this process is the
engine core's busy loop, stdlib only. Protocol: JSON lines over the socket passed as --fd.

  client -> core   {"op": "add", "rid": R, "prompt": P, "steps": N, "finish": "stop"|"length",
                    "blocks": [h0, h1, ...]}   P prompt tokens; with prefix caching on, the hash
                                               chain of every full block of the prompt and then
                                               of the answer the client chose (hex strings,
                                               vLLM's own hash_block_tokens), else []
                   {"op": "abort", "rid": R}
  core -> client   {"rid": R, "step": I, "n": K, "finish": null|"stop"|"length", "spec": A|null,
                    "cached": C, "running": n, "waiting": n, "kv": u}   tokens I..I+K-1 of R are
                                               out; C of its prompt tokens came from the cache
                   {"rid": null, "running": n, "waiting": n, "kv": u}   the scheduler's stats
                                                            changed (a wait, a prefill's chunk)
                   either may carry "prefix": [requests, queries, hits]: the prefix-cache
                   lookups since the last message (vLLM's PrefixCacheStats for one step)

What the token ids are is the client's choice (it has the tokenizer); when each comes out, who
runs and who waits, how long a prompt's prefill takes and how full the KV cache is are this
process's, by the rules cited below. The engine runs in steps, as vLLM's does: Scheduler.plan
fills one step from one token budget (the rules of v1/core/sched/scheduler.py `schedule()`), and
the step takes what thor.py's cost model says a Thor takes for what it holds.
"""

import argparse
import json
import math
import os
import selectors
import socket
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import thor  # beside this file: the step's cost on a Thor, every constant with its source


def accepted(step: int, mean: float, drafted: int) -> int:
    """Draft tokens the target accepts in EAGLE step `step`: whole tokens whose running sum keeps
    to `mean` a step (thor.py fits it to the seed's 33.7 tok/s), never more than were drafted."""
    return min(drafted, math.floor((step + 1) * mean) - math.floor(step * mean))


@dataclass(eq=False)
class Block:
    id: int | None  # None: past the pool's end (no preemption here: see BlockPool.new)
    hash: str | None = None  # set while the prefix cache holds it
    refs: int = 0


class BlockPool:
    """vLLM 0.19.0's block pool (v1/core/block_pool.py) and its free queue
    (kv_cache_utils.py FreeKVCacheBlockQueue L158-178), by their rules:
    - all blocks start free in id order; block 0 is the null block, never handed out (L174-176)
      and not counted in the usage (get_usage L487-498);
    - a new block is taken from the front of the free queue, and if the prefix cache held it,
      its hash is dropped then (get_new_blocks L320-350, _maybe_evict_cached_block L352-390):
      freed blocks stay cached until reused, least recently freed first;
    - a cache hit takes its blocks out of the free queue (touch L392-407);
    - a request's blocks are freed last block first (single_type_kv_cache_manager.py free
      L286-290), to the back of the queue (free_blocks L409-423), so a chain's tail is evicted
      before its head.
    Blocks never used are the queue's front, in id order, counted rather than listed (a test
    pool has 2**30)."""

    def __init__(self, blocks: int):
        self.total = blocks - 1  # the null block
        self.fresh = 1  # the next never-used block id
        self.freed: OrderedDict[int, Block] = OrderedDict()  # the queue after the fresh ones
        self.cached: dict[str, dict[int, Block]] = {}  # BlockHashToBlockMap (L33-90)

    def free_count(self) -> int:
        return self.total + 1 - self.fresh + len(self.freed)

    def usage(self) -> float:
        return 1.0 - self.free_count() / self.total if self.total else 0.0

    def new(self) -> Block:
        if self.fresh <= self.total:
            block, self.fresh = Block(self.fresh), self.fresh + 1
        elif self.freed:
            _, block = self.freed.popitem(last=False)
            self.evict(block)
        else:
            # vLLM would not schedule the request (allocate_slots returns None) or preempt one;
            # the stand-in has neither, as before the cache: it runs on, the usage stays at 1
            block = Block(None)
        block.refs = 1
        return block

    def evict(self, block: Block) -> None:
        if block.hash is not None:
            holders = self.cached[block.hash]
            del holders[block.id]
            if not holders:
                del self.cached[block.hash]
            block.hash = None

    def lookup(self, hashes) -> list[Block]:
        """The longest run of cached blocks from the chain's start (FullAttentionManager
        find_longest_cache_hit, single_type_kv_cache_manager.py L445-456): a chain, so the first
        miss ends it."""
        hit = []
        for block_hash in hashes:
            holders = self.cached.get(block_hash)
            if holders is None:
                break
            hit.append(next(iter(holders.values())))  # get_one_block L61-72
        return hit

    def touch(self, blocks) -> None:
        for block in blocks:
            if block.refs == 0:
                del self.freed[block.id]
            block.refs += 1

    def cache(self, block: Block, block_hash: str) -> None:
        if block.id is not None and block.hash is None:
            block.hash = block_hash
            self.cached.setdefault(block_hash, {})[block.id] = block

    def free(self, blocks) -> None:
        for block in reversed(blocks):
            block.refs -= 1
            if block.refs == 0 and block.id is not None:
                self.freed[block.id] = block


@dataclass
class Request:
    rid: str
    prompt: int
    steps: int  # tokens to generate
    finish: str
    hashes: tuple = ()  # full blocks' hash chain, prompt then answer; () when caching is off
    prefilled: int = 0
    out: int = 0  # tokens out so far
    drafts: int = 0  # EAGLE steps taken
    cached: int = -1  # prompt tokens its prefix-cache hit saved (Request.num_cached_tokens)
    blocks: list = field(default_factory=list)

    @property
    def held(self) -> int:  # tokens in its KV cache
        return self.prefilled + self.out

    @property
    def computed(self) -> int:
        """Tokens whose KV is written: the last token sampled is computed by the next step."""
        return self.prefilled + max(0, self.out - 1)


@dataclass
class Step:
    """What one step of the engine holds: (request, tokens scheduled for it) in order, and how
    long it takes."""
    work: list[tuple[Request, int]] = field(default_factory=list)
    seconds: float = 0.0


class Scheduler:
    """vLLM V1's scheduler, by its rules (v1/core/sched/scheduler.py `schedule()`, 0.19.0): one
    token budget a step (`token_budget = self.max_num_scheduled_tokens`, max_num_batched_tokens),
    spent first on the running requests in order (a decode's 1 + num_speculative_tokens, a
    prefill's next chunk: `num_new_tokens = min(num_new_tokens, token_budget)`), then on waiting
    requests admitted first come first served while `len(self.running) <
    self.max_num_running_reqs` (max_num_seqs) and budget is left. No clock: `plan` says what the
    next step holds and how long it takes, `finish` applies it; Core keeps the time."""

    def __init__(self, cost, spec_tokens: int, accept_mean: float, max_running: int,
                 budget: int, kv_blocks: int = 1 << 30, block_size: int = 16,
                 caching: bool = False, eagle: bool = False):
        self.cost = cost  # ([thor.Work], any decode in it) -> seconds
        self.spec_tokens = spec_tokens
        self.accept_mean = accept_mean
        self.max_running = max_running
        self.budget = budget
        # The KV cache: kv_blocks of block_size tokens in vLLM's block pool; a request takes
        # blocks as a step is scheduled for it and frees them when it ends, and the scheduler
        # reports the share in use every step (get_usage -> SchedulerStats.kv_cache_usage ->
        # vllm:kv_cache_usage_perc). With prefix caching on (cache_config.enable_prefix_caching),
        # full blocks are cached by their hash and a new request starts after its hit.
        self.pool = BlockPool(kv_blocks)
        self.block_size = block_size
        self.caching = caching
        # EAGLE (SpeculativeConfig.use_eagle: method eagle, eagle3 or mtp, config/speculative.py
        # L857-858; scheduler.py L214-219) drops the last block a hit matched
        self.eagle = eagle
        self.prefix = [0, 0, 0]  # PrefixCacheStats since last taken: requests, queries, hits
        self.waiting: dict[str, Request] = {}  # insertion order is arrival order
        self.running: dict[str, Request] = {}

    def counts(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting),
                "kv": self.pool.usage()}

    def take_prefix(self) -> list[int] | None:
        """The prefix-cache lookups since the last call (KVCacheManager.make_prefix_cache_stats,
        kv_cache_manager.py L164-174), None when there were none."""
        if not self.prefix[0]:
            return None
        prefix, self.prefix = self.prefix, [0, 0, 0]
        return prefix

    def add(self, rid: str, prompt: int, steps: int, finish: str, hashes=()) -> None:
        self.waiting[rid] = Request(rid, max(1, prompt), steps, finish, tuple(hashes))

    def abort(self, rid: str) -> bool:
        request = self.waiting.pop(rid, None) or self.running.pop(rid, None)
        if request is not None:
            self.pool.free(request.blocks)
        return request is not None

    def hit(self, request: Request) -> int:
        """Prompt tokens a waiting request finds in the prefix cache, its blocks taken
        (kv_cache_manager.py get_computed_blocks L176-216 for a request not yet computed):
        - whole blocks only, by the hash chain from the prompt's start;
        - never the prompt's last token, whose logits must be computed (`max_cache_hit_length =
          request.num_tokens - 1`, L195-201), so a full hit recomputes a whole block;
        - with EAGLE, one block less (single_type_kv_cache_manager.py L457-460: the last
          matched block is dropped so the draft gets its hidden states);
        - each lookup is counted, hit or not: queries += prompt, hits += the hit (L208-214,
          PrefixCacheStats.record, v1/metrics/stats.py L131-142)."""
        if not self.caching:  # L192-193: no lookup, no stats
            return 0
        hit = self.pool.lookup(request.hashes[:(request.prompt - 1) // self.block_size])
        if self.eagle and hit:
            hit.pop()
        self.pool.touch(hit)
        request.blocks = hit
        tokens = len(hit) * self.block_size
        self.prefix = [self.prefix[0] + 1, self.prefix[1] + request.prompt,
                       self.prefix[2] + tokens]
        return tokens

    def allocate(self, request: Request, n: int) -> None:
        """Blocks for the step's n tokens, and the full ones cached as soon as scheduled
        (allocate_slots L416-425: up to `min(computed + new, request.num_tokens)`, the drafts
        left out), so a request admitted later in the same step can hit them, as in vLLM."""
        while len(request.blocks) * self.block_size < request.computed + n:
            request.blocks.append(self.pool.new())
        if self.caching:
            full = min(request.computed + n, request.prompt + request.out) // self.block_size
            for block, block_hash in zip(request.blocks[:full], request.hashes[:full],
                                         strict=False):
                self.pool.cache(block, block_hash)

    def plan(self) -> Step | None:
        step, budget = Step(), self.budget
        for request in self.running.values():
            if budget <= 0:
                break
            if request.prefilled < request.prompt:
                n = min(request.prompt - request.prefilled, budget)
            else:  # the token the last step sampled, and the drafts to verify with it
                n = min(1 + self.spec_tokens, budget)
            self.allocate(request, n)
            step.work.append((request, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            rid, request = next(iter(self.waiting.items()))
            del self.waiting[rid]
            self.running[rid] = request
            # a hit is prefilled already: the step computes (and the cost model charges) only
            # the rest, attending over the cached tokens as context (scheduler.py L820-831)
            request.cached = request.prefilled = self.hit(request)
            n = min(request.prompt - request.prefilled, budget)
            self.allocate(request, n)
            step.work.append((request, n))
            budget -= n
        if not step.work:
            return None
        decoding = any(r.prefilled >= r.prompt for r, _ in step.work)
        step.seconds = self.cost([thor.Work(n, r.held) for r, n in step.work], decoding)
        return step

    def finish(self, step: Step) -> list[dict]:
        """The step's outputs (v1/core/sched/scheduler.py update_from_output): a prefill chunk
        fills KV blocks, the last one samples the first token; a decode yields 1 + the drafts the
        target accepted, all in one output. Requests aborted meanwhile yield nothing."""
        events = []
        for request, n in step.work:
            if self.running.get(request.rid) is not request:
                continue
            spec = None
            if request.prefilled < request.prompt:
                request.prefilled += n
                if request.prefilled < request.prompt:
                    continue
                made = 1
            else:
                made = 1
                if self.spec_tokens:
                    spec = accepted(request.drafts, self.accept_mean, self.spec_tokens)
                    request.drafts += 1
                    made += spec
            made = min(made, request.steps - request.out)
            first, request.out = request.out, request.out + made
            finish = request.finish if request.out >= request.steps else None
            if finish is not None:
                del self.running[request.rid]
                self.pool.free(request.blocks)
            events.append({"rid": request.rid, "step": first, "n": made, "finish": finish,
                           "spec": spec, "cached": request.cached})
        return events

    def busy(self) -> bool:
        return bool(self.running or self.waiting)


def closed_loop(scheduler: Scheduler, concurrency: int, prompts: int, prompt: int,
                tokens: int, hashes=()) -> list[dict]:
    """`vllm bench serve --max-concurrency C` against this scheduler on a Thor's clock, with no
    wall clock: C clients, each sending its next request when its last one ends, `prompts` in
    all (each the same prompt, whose block hashes are `hashes`). Each request's (sent, first
    token, end) seconds: what the fast tests pin and bench/standin_model.py publishes, by the
    code the engine core runs."""
    now, sent, done = 0.0, 0, {}
    while sent < min(concurrency, prompts):
        scheduler.add(f"r{sent}", prompt, tokens, "length", hashes)
        done[f"r{sent}"] = {"sent": now}
        sent += 1
    while (step := scheduler.plan()) is not None:
        now += step.seconds
        for event in scheduler.finish(step):
            times = done[event["rid"]]
            times.setdefault("first", now)
            if event["finish"] is not None:
                times["end"] = now
                if sent < prompts:
                    scheduler.add(f"r{sent}", prompt, tokens, "length", hashes)
                    done[f"r{sent}"] = {"sent": now}
                    sent += 1
    return list(done.values())


class Core:
    """The engine core's busy loop: a step at a time, each taking its cost in wall time; requests
    that arrive during a step join the next (the scheduler runs between steps)."""

    def __init__(self, out: socket.socket, scheduler: Scheduler, time_scale: float = 1.0):
        self.out = out
        self.scheduler = scheduler
        self.time_scale = time_scale  # tests only: the same Thor, faster
        self.step: Step | None = None
        self.ends = 0.0  # when the step in flight ends
        self.said: dict = {}  # the stats last sent

    def send(self, **event) -> None:
        self.said = {key: event[key] for key in ("running", "waiting", "kv")}
        prefix = self.scheduler.take_prefix()
        if prefix is not None:
            event["prefix"] = prefix
        self.out.sendall((json.dumps(event) + "\n").encode())

    def stats(self) -> None:
        """The scheduler's stats, when they changed (a wait, an admission, a prefill's chunk,
        a prefix-cache lookup)."""
        counts = self.scheduler.counts()
        if counts != self.said or self.scheduler.prefix[0]:
            self.send(rid=None, **counts)

    def start(self, now: float) -> None:
        self.step = self.scheduler.plan()
        if self.step is not None:
            self.ends = now + self.step.seconds * self.time_scale

    def end_step(self) -> None:
        for event in self.scheduler.finish(self.step):
            self.send(**event, **self.scheduler.counts())
        # each step from the last one's end (its clock, not the loop's): the API server's work
        # never slows the engine
        self.start(self.ends)
        self.stats()

    def handle(self, message: dict) -> None:
        if message["op"] == "add":
            self.scheduler.add(message["rid"], message["prompt"], message["steps"],
                               message["finish"], message.get("blocks", ()))
        elif message["op"] == "abort" and not self.scheduler.abort(message["rid"]):
            return  # neither running nor waiting: nothing changed
        if self.step is None:  # idle: the scheduler runs now
            self.start(time.monotonic())
        # running or waiting, it shows on /metrics from the next step, as the scheduler reports
        self.send(rid=None, **self.scheduler.counts())

    def busy_loop(self, inbox: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(inbox, selectors.EVENT_READ)
        pending = b""
        while True:
            while self.step is not None and self.ends <= time.monotonic():
                self.end_step()
            timeout = max(0.0, self.ends - time.monotonic()) if self.step is not None else None
            if selector.select(timeout):
                data = inbox.recv(65536)
                if not data:  # the API server is gone: so is its engine core
                    return
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self.handle(json.loads(line))


def scheduler_for(box: "thor.Box", max_running: int, budget: int, *kv, **cache) -> Scheduler:
    return Scheduler(box.step_seconds, box.spec_tokens, box.accept_mean, max_running, budget, *kv,
                     **cache)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--spec-tokens", type=int, required=True)
    parser.add_argument("--max-running", type=int, required=True)
    parser.add_argument("--budget", type=int, required=True)  # max_num_batched_tokens
    parser.add_argument("--kv-blocks", type=int, required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--time-scale", type=float, required=True)
    parser.add_argument("--prefix-caching", action="store_true")  # cache_config's
    parser.add_argument("--eagle", action="store_true")  # SpeculativeConfig.use_eagle()
    args = parser.parse_args(argv)
    import setproctitle  # a vLLM dependency; its title is how `ps` and `docker top` find it

    setproctitle.setproctitle(args.title)
    sock = socket.socket(fileno=args.fd)
    scheduler = scheduler_for(thor.Box(thor.MISTRAL_SMALL_4, thor.THOR, args.spec_tokens),
                              args.max_running, args.budget, args.kv_blocks, args.block_size,
                              caching=args.prefix_caching, eagle=args.eagle)
    try:
        Core(sock, scheduler, args.time_scale).busy_loop(sock)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
