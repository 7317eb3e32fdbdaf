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

  client -> core   {"op": "add", "rid": R, "prompt": P, "steps": N, "finish": "stop"|"length"}
                   {"op": "abort", "rid": R}
  core -> client   {"rid": R, "step": I, "n": K, "finish": null|"stop"|"length", "spec": A|null,
                    "running": n, "waiting": n, "kv": u}   tokens I..I+K-1 of R are out
                   {"rid": null, "running": n, "waiting": n, "kv": u}   the scheduler's stats
                                                            changed (a wait, a prefill's chunk)

What the token ids are is the client's choice (it has the tokenizer); when each comes out, who
runs and who waits, how long a prompt's prefill takes and how full the KV cache is are this
process's, by the rules cited below.
"""

import argparse
import heapq
import json
import math
import os
import selectors
import socket
import sys
import time

# How much longer a decode step takes per sequence the batch holds beyond one: 2/7, from the
# figures reported on Thor (Core.step_rate).
BATCH_SLOWDOWN = 2 / 7


def accepted_per_step(step: int) -> int:
    """Draft tokens the target accepts in one EAGLE step, so that a step yields 1 + accepted
    tokens and the rates agree: 33.7 / 17.5 - 1 = 0.93 accepted per step (13 steps of 1 in 14),
    an acceptance rate of 0.31 of 3 drafted (FACTS.md: 0.2-0.4 measured on JSON/tool output)."""
    return 0 if step % 14 == 13 else 1


class Core:
    def __init__(self, out: socket.socket, rate: float, spec_tokens: int, max_running: int,
                 prefill_rate: float, chunk: int, kv_blocks: int, block_size: int):
        self.out = out
        self.rate = rate
        self.spec_tokens = spec_tokens
        # vLLM's scheduler runs at most max_num_seqs requests; the rest wait in arrival order
        # (v1/core/sched/scheduler.py L105 max_num_running_reqs = max_num_seqs, L568 `if
        # len(self.running) == self.max_num_running_reqs: break` in the loop over self.waiting)
        # and are counted as waiting (L1957 num_waiting_reqs -> vllm:num_requests_waiting).
        self.max_running = max_running
        # A prompt is prefilled max_num_batched_tokens a step (chunked prefill: the scheduler's
        # token budget, v1/core/sched/scheduler.py `token_budget = self.max_num_scheduled_tokens`),
        # each chunk in chunk / prefill_rate s; the first token comes with the last chunk.
        self.prefill_rate = prefill_rate
        self.chunk = chunk
        # The KV cache: kv_blocks of block_size tokens; a request holds ceil(its tokens / block)
        # blocks, freed when it ends, and the scheduler reports the share in use every step
        # (v1/core/block_pool.py get_usage = 1 - free / total -> SchedulerStats.kv_cache_usage
        # -> vllm:kv_cache_usage_perc).
        self.kv_blocks = kv_blocks
        self.block_size = block_size
        self.waiting: dict[str, dict] = {}  # insertion order is arrival order
        self.running: dict[str, dict] = {}
        self.due: list[tuple[float, int, str]] = []  # (when, token index, rid): its next event

    def send(self, **event) -> None:
        self.out.sendall((json.dumps(event) + "\n").encode())

    def counts(self) -> dict:
        held = sum(math.ceil(r["held"] / self.block_size) for r in self.running.values())
        return {"running": len(self.running), "waiting": len(self.waiting),
                "kv": min(1.0, held / self.kv_blocks)}

    def step_rate(self) -> float:
        """Each running sequence's decode rate with the batch as it is now: one step decodes
        every running sequence, and a step's time grows with the batch, linearly through the
        figures reported on Thor for a 120B NVFP4 MoE, 15 tok/s at concurrency 1 and 40 in all at
        8 (FACTS.md "Reported speeds", jetson-ai-lab PR #410): at 8 a step takes 8 x 15 / 40 = 3
        times one of 1, so 1 + BATCH_SLOWDOWN x 7 = 3. Per sequence the rate falls, in all it
        rises (toward rate / BATCH_SLOWDOWN); at 1 it is the box's rate, as before."""
        return self.rate / (1 + BATCH_SLOWDOWN * (max(1, len(self.running)) - 1))

    def schedule(self) -> None:
        """Admit waiting requests, first come first served, while a running slot is free."""
        now = time.monotonic()
        while self.waiting and len(self.running) < self.max_running:
            rid, request = next(iter(self.waiting.items()))
            del self.waiting[rid]
            request.update(held=0, prefilled=0, drafts=0)
            self.running[rid] = request
            self.prefill(rid, now)

    def prefill(self, rid: str, now: float) -> None:
        """The next chunk of a prompt; after the last, the first token (index 0) is due."""
        request = self.running[rid]
        size = min(self.chunk, request["prompt"] - request["prefilled"])
        if size > 0:
            heapq.heappush(self.due, (now + size / self.prefill_rate, -1, rid))
        else:
            # each step at its own time from the last step's (its clock, not the loop's `now`):
            # the API server's work never slows the decode
            request["clock"] = now
            self.plan_step(rid, 0)

    def add(self, rid: str, prompt: int, steps: int, finish: str) -> None:
        self.waiting[rid] = {"prompt": prompt, "steps": steps, "finish": finish}
        self.schedule()
        # running or waiting, it shows on /metrics from the next step, as the scheduler reports
        self.send(rid=None, **self.counts())

    def abort(self, rid: str) -> None:
        if self.waiting.pop(rid, None) is not None or self.running.pop(rid, None) is not None:
            self.schedule()
            self.send(rid=None, **self.counts())

    def due_event(self, rid: str, step: int, now: float) -> None:
        request = self.running.get(rid)
        if request is None:  # aborted meanwhile
            return
        if step < 0:  # a prefill chunk is done: its tokens hold KV blocks now
            size = min(self.chunk, request["prompt"] - request["prefilled"])
            request["prefilled"] += size
            request["held"] += size
            self.prefill(rid, now)
            if request["prefilled"] < request["prompt"]:
                self.send(rid=None, **self.counts())
            return
        self.decode(rid, step)

    def plan_step(self, rid: str, step: int) -> None:
        """Schedule the decode step that starts at token `step`: with EAGLE it yields 1 + the
        drafts the target accepts, all in one output (v1/core/sched/scheduler.py
        update_from_output: a request's new_token_ids are every token the step accepted), due
        when that many tokens are out at the request's rate."""
        request = self.running[rid]
        spec = None
        if self.spec_tokens:
            spec = accepted_per_step(request["drafts"])
            request["drafts"] += 1
        request["spec"] = spec
        request["n"] = min(1 + (spec or 0), request["steps"] - step)
        request["clock"] += request["n"] / self.step_rate()
        heapq.heappush(self.due, (request["clock"], step, rid))

    def decode(self, rid: str, step: int) -> None:
        """Tokens step..step+n-1 are out; the scheduler reports the drafts it verified
        (v1/spec_decode/metrics.py SpecDecodingStats -> vllm:spec_decode_* on /metrics)."""
        request = self.running[rid]
        n, spec = request["n"], request["spec"]
        request["held"] += n
        finish = request["finish"] if step + n >= request["steps"] else None
        if finish is not None:
            del self.running[rid]
            self.schedule()
        else:
            self.plan_step(rid, step + n)
        self.send(rid=rid, step=step, n=n, finish=finish, spec=spec, **self.counts())

    def handle(self, message: dict) -> None:
        if message["op"] == "add":
            self.add(message["rid"], message["prompt"], message["steps"], message["finish"])
        elif message["op"] == "abort":
            self.abort(message["rid"])

    def busy_loop(self, inbox: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(inbox, selectors.EVENT_READ)
        pending = b""
        while True:
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                _, step, rid = heapq.heappop(self.due)
                self.due_event(rid, step, now)
            timeout = max(0.0, self.due[0][0] - time.monotonic()) if self.due else None
            if selector.select(timeout):
                data = inbox.recv(65536)
                if not data:  # the API server is gone: so is its engine core
                    return
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self.handle(json.loads(line))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--spec-tokens", type=int, required=True)
    parser.add_argument("--max-running", type=int, required=True)
    parser.add_argument("--prefill-rate", type=float, required=True)
    parser.add_argument("--chunk", type=int, required=True)
    parser.add_argument("--kv-blocks", type=int, required=True)
    parser.add_argument("--block-size", type=int, required=True)
    args = parser.parse_args(argv)
    import setproctitle  # a vLLM dependency; its title is how `ps` and `docker top` find it

    setproctitle.setproctitle(args.title)
    sock = socket.socket(fileno=args.fd)
    try:
        Core(sock, args.rate, args.spec_tokens, args.max_running, args.prefill_rate,
             args.chunk, args.kv_blocks, args.block_size).busy_loop(sock)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
