"""The stand-in engine core decodes a batch as a Thor would (sim/base/standin_core.py): each
sequence slower as the batch grows, the box faster in all, by the curve through the figures
reported on Thor (15 tok/s at concurrency 1, 40 in all at 8). Run for real, in a thread, on a
socket pair, at a fast rate so it takes a second.

The edit that breaks it: every running sequence decoding at the box's full rate (the stand-in as
it was, where a batch of 8 was 8 times as fast in all).
"""

import importlib.util
import json
import socket
import threading
import time
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "sim" / "base" / "standin_core.py"
RATE, STEPS = 200.0, 40


def load():
    spec = importlib.util.spec_from_file_location("standin_core", CORE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode(batch: int, max_running: int = 8) -> tuple[float, float]:
    """(each sequence's tok/s, the box's tok/s in all) of `batch` requests sent at once."""
    core_module = load()
    ours, theirs = socket.socketpair()
    core = core_module.Core(theirs, RATE, 0, max_running, 1e9, 8192, 10_000, 16)
    threading.Thread(target=core.busy_loop, args=(theirs,), daemon=True).start()
    started = time.monotonic()
    for n in range(batch):
        ours.sendall((json.dumps({"op": "add", "rid": f"r{n}", "prompt": 8, "steps": STEPS,
                                  "finish": "length"}) + "\n").encode())
    done, pending, ended = set(), b"", {}
    while len(done) < batch:
        pending += ours.recv(65536)
        *lines, pending = pending.split(b"\n")
        for line in lines:
            event = json.loads(line)
            if event.get("finish"):
                done.add(event["rid"])
                ended[event["rid"]] = time.monotonic() - started
    ours.close()
    took = max(ended.values())
    return STEPS / took, batch * STEPS / took


def test_a_batch_decodes_slower_each_and_faster_in_all():
    one_each, one_all = decode(1)
    eight_each, eight_all = decode(8)
    assert abs(one_each - RATE) / RATE < 0.15, one_each  # alone: the box's rate
    # at 8: each a third of the rate, 8/3 of it in all (the reported 15 -> 40 tok/s)
    assert eight_each < one_each / 2.5, (one_each, eight_each)
    assert 2.2 * one_all < eight_all < 3.0 * one_all, (one_all, eight_all)


def test_one_at_a_time_the_rest_wait_as_before():
    _, total = decode(4, max_running=1)
    assert abs(total - RATE) / RATE < 0.15, total  # four in turn: the box's rate in all
