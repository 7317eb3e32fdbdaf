"""Benchmark the gateway on the simulated fleet: what it costs a request, how it spreads them, and
what a client sees of a rolling change with and without it.

    python -m bench.gateway                   # thor-10..12 behind gw-1, ~10 min
    python -m bench.gateway --hosts 10-12 --out bench/results/gateway.json

1. Time to first token and the gap between streamed tokens, through the gateway (HTTPS to
   HAProxy on the gateway box) against one box directly (HTTP from the same gateway box): the
   client runs on the gateway box (bench/gateway_client.py), so the two paths differ by HAProxy.
2. Aggregate decode rate of 1, 3 and 6 concurrent streams through the gateway over the boxes at
   max_num_seqs 1: tokens of all streams over the wall time, against one stream's rate.
3. Requests failed during a full rolling config change under continuous load (3 clients of short
   completions): through the gateway, and against the boxes directly (each client its own box,
   as without a gateway), the same client and the same change.

Never touches boxes outside --hosts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from bench.rollout import parse_range
from sim import fleet, operator

CLIENT = Path(__file__).with_name("gateway_client.py")
ON_GATEWAY = "/tmp/gateway_client.py"
GATEWAY = "gw-1"


def on_gateway(*args, timeout=900):
    """JSON of the client run on the gateway box (through Docker: the benchmark's own channel)."""
    done = subprocess.run(["docker", "exec", fleet.GATEWAY_CONTAINER, "python3", ON_GATEWAY,
                           *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def converge(sim, workdir, name, hosts, gateway=True, **extra):
    report = workdir / f"{name}-report.json"
    inventory = sim.write_inventory(workdir / f"{name}.py", hosts=hosts,
                                    gateway=GATEWAY if gateway else None,
                                    extra_data={"rollout_report_path": str(report), **extra})
    run = operator.deploy(inventory)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(report.read_text())


def added_latency(sim, hosts, key, n):
    direct = f"http://{sim.ip(hosts[0])}:8002"
    through = "https://127.0.0.1:28443"
    # warm both paths once (TLS session, connection pools are per request anyway)
    on_gateway("stream", direct, key, "-", 2, 16)
    on_gateway("stream", through, key, "/tmp/fleet-ca.pem", 2, 16)
    found = {"direct": on_gateway("stream", direct, key, "-", n, 64),
             "gateway": on_gateway("stream", through, key, "/tmp/fleet-ca.pem", n, 64)}
    found["ttft_added_ms"] = round(found["gateway"]["ttft_ms_median"]
                                   - found["direct"]["ttft_ms_median"], 2)
    found["token_gap_added_ms"] = round(found["gateway"]["token_gap_ms_mean"]
                                        - found["direct"]["token_gap_ms_mean"], 3)
    return found


def aggregate(endpoint, key, streams, max_tokens=200):
    """Tokens per second of `streams` concurrent streams through the gateway (from the laptop)."""
    import http.client
    import ssl
    from urllib.parse import urlparse

    url = urlparse(endpoint["url"])
    context = ssl.create_default_context(cafile=endpoint["ca_file"])
    got = []

    def one():
        conn = http.client.HTTPSConnection(url.hostname, url.port, context=context, timeout=600)
        body = {"model": "/model", "prompt": "def fib(n):", "max_tokens": max_tokens,
                "temperature": 0}
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        answer = json.loads(conn.getresponse().read())
        got.append(answer["usage"]["completion_tokens"])
        conn.close()

    threads = [threading.Thread(target=one) for _ in range(streams)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.perf_counter() - began
    return {"streams": streams, "tokens": sum(got), "seconds": round(took, 2),
            "tok_s": round(sum(got) / took, 1)}


def rolling_under_load(sim, workdir, hosts, key, through_gateway, value):
    """Failed requests while every box restarts once for a config change, under 3 clients."""
    name = "gw" if through_gateway else "direct"
    converge(sim, workdir, f"{name}-before", hosts, gateway=through_gateway)
    urls = (["https://127.0.0.1:28443"] if through_gateway
            else [f"http://{sim.ip(h)}:8002" for h in hosts])
    stop = f"/tmp/bench-stop-{name}"
    sim.exec(GATEWAY, f"rm -f {stop}")
    found = {}
    loader = threading.Thread(target=lambda: found.update(on_gateway(
        "load", stop, key, "/tmp/fleet-ca.pem", 3, *urls, timeout=1800)))
    loader.start()
    time.sleep(3)
    began = time.monotonic()
    converge(sim, workdir, f"{name}-change", hosts, gateway=through_gateway,
             service_extra_env={"THORFLEET_BENCH_ROLL": value})
    took = time.monotonic() - began
    sim.exec(GATEWAY, f"touch {stop}")
    loader.join()
    return {**found, "rollout_s": round(took, 1)}


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=__doc__)
    parser.add_argument("--hosts", default="10-12")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "gateway.json"))
    args = parser.parse_args()
    hosts = parse_range(args.hosts)
    up_to = max(fleet.index_of(h) for h in hosts)
    sim = fleet.up(up_to, gateway=True,
                   inventory=Path(tempfile.gettempdir()) / "thorfleet-bench-gw.py")
    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    key = (sim.state / "api_key").read_text().strip()

    report = converge(sim, workdir, "converge", hosts)
    endpoint = report["endpoint"]
    subprocess.run(["docker", "cp", str(CLIENT), f"{fleet.GATEWAY_CONTAINER}:{ON_GATEWAY}"],
                   check=True)
    subprocess.run(["docker", "cp", endpoint["ca_file"],
                    f"{fleet.GATEWAY_CONTAINER}:/tmp/fleet-ca.pem"], check=True)

    results = {"hosts": hosts, "gateway": GATEWAY, "max_num_seqs": 1,
               "as_of": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    results["latency"] = added_latency(sim, hosts, key, args.requests)
    spread = [aggregate(endpoint, key, n) for n in (1, 3, 6)]
    one = spread[0]["tok_s"]
    for row in spread:
        row["x_one_stream"] = round(row["tok_s"] / one, 2)
    results["aggregate"] = spread
    stamp = str(int(time.time()))
    results["rolling_change"] = {
        "through_gateway": rolling_under_load(sim, workdir, hosts, key, True, f"g{stamp}"),
        "direct": rolling_under_load(sim, workdir, hosts, key, False, f"d{stamp}"),
    }
    converge(sim, workdir, "leave", hosts)  # the gateway back, the boxes behind it
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    lat = results["latency"]
    print(f"TTFT added {lat['ttft_added_ms']} ms (direct {lat['direct']['ttft_ms_median']} ms), "
          f"token gap added {lat['token_gap_added_ms']} ms; aggregate "
          + ", ".join(f"{r['streams']}: {r['tok_s']} tok/s ({r['x_one_stream']}x)" for r in spread)
          + "; failed during the rollout: gateway "
          f"{results['rolling_change']['through_gateway']['failed']}, direct "
          f"{results['rolling_change']['direct']['failed']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
