#!/usr/bin/env python3
"""The benchmark's client, run on the gateway box so that "through the gateway" and "direct to a
box" leave from the same place and differ only by HAProxy (stdlib only; bench/gateway.py copies it
there).

    gateway_client.py stream URL KEY CAFILE N MAX_TOKENS     # time to first token, token gaps
    gateway_client.py load STOPFILE KEY CAFILE CLIENTS URL... # short requests until STOPFILE exists

Prints one JSON line.
"""

import http.client
import itertools
import json
import os
import ssl
import statistics
import sys
import threading
import time
from urllib.parse import urlparse


def connection(url, cafile, timeout=300):
    parsed = urlparse(url)
    if parsed.scheme == "https":
        context = ssl.create_default_context(cafile=cafile)
        return http.client.HTTPSConnection(parsed.hostname, parsed.port, context=context,
                                           timeout=timeout)
    return http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)


def completion(url, key, cafile, max_tokens, stream):
    """(ok, seconds to the first token, [seconds between tokens]) of one /v1/completions."""
    body = {"model": "/model", "prompt": "def fib(n):", "max_tokens": max_tokens,
            "temperature": 0, "stream": stream}
    conn = connection(url, cafile)
    began = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Authorization": f"Bearer {key}",
                              "Content-Type": "application/json"})
        answer = conn.getresponse()
        if not stream:
            ok = answer.status == 200 and json.loads(answer.read())["usage"][
                "completion_tokens"] == max_tokens
            return ok, time.perf_counter() - began, []
        stamps, done = [], False
        for line in answer:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
            elif line.startswith(b"data: [DONE]"):
                done = True
                break
        # answered whole: vLLM's end of stream (a chunk may carry more than one token: with EAGLE
        # each step's accepted tokens come together, so chunks are fewer than max_tokens)
        ok = answer.status == 200 and done and bool(stamps)
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        return ok, (stamps[0] - began) if stamps else None, gaps
    except OSError:
        return False, None, []
    finally:
        conn.close()


def stream(url, key, cafile, n, max_tokens):
    ttfts, gaps, failed = [], [], 0
    for _ in range(int(n)):
        ok, ttft, between = completion(url, key, cafile, int(max_tokens), stream=True)
        failed += not ok
        if ttft is not None:
            ttfts.append(ttft)
        gaps += between
    return {"url": url, "requests": int(n), "failed": failed,
            "ttft_ms_median": round(1000 * statistics.median(ttfts), 2),
            "ttft_ms_p90": round(1000 * sorted(ttfts)[int(0.9 * (len(ttfts) - 1))], 2),
            "token_gap_ms_mean": round(1000 * statistics.fmean(gaps), 3)}


def load(stopfile, key, cafile, clients, *urls):
    results, lock = [], threading.Lock()

    def client(i):
        turn = i
        while not os.path.exists(stopfile):
            url = urls[turn % len(urls)]  # a client of its own box, round-robin over them
            turn += 1
            ok, _, _ = completion(url, key, cafile, 8, stream=False)
            with lock:
                results.append(ok)
            if not ok:
                time.sleep(0.2)  # a client that failed tries again soon, as a person would

    threads = [threading.Thread(target=client, args=(i,)) for i in range(int(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"urls": list(urls), "clients": int(clients), "requests": len(results),
            "failed": results.count(False)}


if __name__ == "__main__":
    action, *args = sys.argv[1:]
    print(json.dumps({"stream": stream, "load": load}[action](*args)))
