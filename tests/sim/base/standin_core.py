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

  client -> core   {"op": "add", "rid": R, "steps": N, "finish": "stop"|"length"}
                   {"op": "abort", "rid": R}
  core -> client   {"rid": R, "step": I, "finish": null|"stop"|"length", "spec": A|null,
                    "running": n, "waiting": n}     a token (step I of R) is out
                   {"rid": null, "running": n, "waiting": n}   the scheduler's counts changed

What the token ids are is the client's choice (it has the tokenizer); when each comes out, who
runs and who waits are this process's, by the rules cited below.
"""

import argparse
import heapq
import json
import os
import selectors
import socket
import sys
import time


def accepted_per_step(step: int) -> int:
    """Draft tokens the target accepts in one EAGLE step, so that a step yields 1 + accepted
    tokens and the rates agree: 33.7 / 17.5 - 1 = 0.93 accepted per step (13 steps of 1 in 14),
    an acceptance rate of 0.31 of 3 drafted (FACTS.md: 0.2-0.4 measured on JSON/tool output)."""
    return 0 if step % 14 == 13 else 1


class Core:
    def __init__(self, out: socket.socket, rate: float, spec_tokens: int, max_running: int):
        self.out = out
        self.rate = rate
        self.spec_tokens = spec_tokens
        # vLLM's scheduler runs at most max_num_seqs requests; the rest wait in arrival order
        # (v1/core/sched/scheduler.py L105 max_num_running_reqs = max_num_seqs, L568 `if
        # len(self.running) == self.max_num_running_reqs: break` in the loop over self.waiting)
        # and are counted as waiting (L1957 num_waiting_reqs -> vllm:num_requests_waiting).
        self.max_running = max_running
        self.waiting: dict[str, dict] = {}  # insertion order is arrival order
        self.running: dict[str, dict] = {}
        self.due: list[tuple[float, int, str]] = []  # (when, step, rid) of each running request

    def send(self, **event) -> None:
        self.out.sendall((json.dumps(event) + "\n").encode())

    def counts(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting)}

    def schedule(self) -> None:
        """Admit waiting requests, first come first served, while a running slot is free."""
        now = time.monotonic()
        while self.waiting and len(self.running) < self.max_running:
            rid, request = next(iter(self.waiting.items()))
            del self.waiting[rid]
            # each token at its own time from the start (begun + (step + 1) / rate), not a pause
            # after the last one: the API server's work on a token never slows the decode
            request.update(begun=now, drafts=0, left_in_step=0)
            self.running[rid] = request
            heapq.heappush(self.due, (now + 1 / self.rate, 0, rid))

    def add(self, rid: str, steps: int, finish: str) -> None:
        self.waiting[rid] = {"steps": steps, "finish": finish}
        self.schedule()
        if rid in self.waiting:  # its wait shows on /metrics, as the scheduler reports it
            self.send(rid=None, **self.counts())

    def abort(self, rid: str) -> None:
        if self.waiting.pop(rid, None) is not None or self.running.pop(rid, None) is not None:
            self.schedule()
            self.send(rid=None, **self.counts())

    def step(self, rid: str, step: int) -> None:
        request = self.running.get(rid)
        if request is None:  # aborted meanwhile
            return
        finish = request["finish"] if step == request["steps"] - 1 else None
        spec = None
        if self.spec_tokens and request["left_in_step"] == 0:
            # a new EAGLE step: the scheduler reports each draft it verified
            # (v1/spec_decode/metrics.py SpecDecodingStats, -> vllm:spec_decode_* on /metrics)
            spec = accepted_per_step(request["drafts"])
            request["drafts"] += 1
            request["left_in_step"] = spec + 1
        request["left_in_step"] = max(0, request["left_in_step"] - 1)
        if finish is not None:
            del self.running[rid]
            self.schedule()
        else:
            heapq.heappush(self.due, (request["begun"] + (step + 2) / self.rate, step + 1, rid))
        self.send(rid=rid, step=step, finish=finish, spec=spec, **self.counts())

    def handle(self, message: dict) -> None:
        if message["op"] == "add":
            self.add(message["rid"], message["steps"], message["finish"])
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
                self.step(rid, step)
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
    args = parser.parse_args(argv)
    import setproctitle  # a vLLM dependency; its title is how `ps` and `docker top` find it

    setproctitle.setproctitle(args.title)
    sock = socket.socket(fileno=args.fd)
    try:
        Core(sock, args.rate, args.spec_tokens, args.max_running).busy_loop(sock)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
