"""Benchmark routing by model at the door: what reading the body costs, and where requests go.

    python -m bench.door_routing --out bench/results/door-routing.json [--fleet]

1. The door alone (this machine, no sim): HAProxy itself on the rendered config of a one-model
   fleet (today's door: no body read) and of a two-model fleet (the body read whole, routed by
   `model`), in front of stand-in boxes on 127.0.0.1 that answer at once. `--requests`
   requests one after another on one kept-alive TLS connection, bodies of 2 KB (a chat) and
   1 MB (a long prompt, `model` last): the time to the whole answer, median and p99; then 8
   clients at once with 1 MB bodies, and HAProxy's peak resident memory (VmHWM) after each door.
2. With --fleet: the sim's mixed fleet (thor-10 and thor-11 EAGLE, thor-12 long-context, behind
   gw-1, as tests/fleet/test_workloads.py leaves it): 2 EAGLE clients and 1 long-context client
   for `--seconds`, counted per box at the door (HAProxy's stot) and per model answered.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from thorfleet.gateway.config import Backend, GatewaySettings
from thorfleet.settings import layout
from thorfleet.settings.recipe import served_names
from thorfleet.settings.schema import check_gateway

HF_ID = "mistralai/Mistral-Small-4-119B-2603-NVFP4"
KEY = "bench-the-fleets-key-0123456789"  # the door's, which opens it and which it sends on


class Box(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # headers and body go out in two writes: without this, Nagle and HAProxy's delayed ACK
        # add 40 ms to an answer, the stand-in's cost and not the door's
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self):
        self._answer(b"{}")

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(json.dumps({"box": self.server.server_address[1],
                                 "length": len(body)}).encode())

    def _answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def haproxy(g, workdir: Path) -> subprocess.Popen:
    """HAProxy on `g`'s rendered config, its files in `workdir` as the deploy writes them on a
    gateway, run in the foreground as this user (no syslog, no chroot)."""
    config = g.config_text
    for path, text in {layout.GATEWAY_PEM: g.pem, **g.maps}.items():
        (workdir / path.rsplit("/", 1)[1]).write_text(text)
        config = config.replace(path, str(workdir / path.rsplit("/", 1)[1]))
    config = (config.replace(layout.GATEWAY_ADMIN_SOCKET, str(workdir / "admin.sock"))
              .replace(layout.GATEWAY_SERVER_STATE, str(workdir / "server-state"))
              .replace("    log /dev/log local0\n", "")
              .replace("    chroot /var/lib/haproxy\n", ""))
    (workdir / "haproxy.cfg").write_text(config)
    return subprocess.Popen([shutil.which("haproxy") or "haproxy", "-db", "-f",
                             str(workdir / "haproxy.cfg")], stderr=subprocess.PIPE)


def _door(workdir: Path, profiles):
    """(HAProxy process, door port, ssl context, boxes) on the rendered config of a fleet of one
    box per profile in `profiles`."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Box) for _ in range(2 * len(profiles))]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    values, problems = check_gateway({"gateway_ca_dir": str(workdir / "ca"), "gateway_port": port})
    assert not problems, problems
    boxes = [Backend(f"thor-{n}", "127.0.0.1", servers[2 * n].server_address[1], 1,
                     servers[2 * n + 1].server_address[1], p, tuple(served_names(p, HF_ID)))
             for n, p in enumerate(profiles)]
    g = GatewaySettings(values, "gw-1", "127.0.0.1", boxes, box_key=KEY)
    process = haproxy(g, workdir)
    context = ssl.create_default_context(cafile=g.ca_file)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    time.sleep(3)  # the first health checks: every box in rotation
    return process, port, context, servers, g


def _chat(model, size):
    content = "lorem ipsum " * (size // 12)
    return json.dumps({"messages": [{"role": "user", "content": content}],
                       "model": model}).encode()


def _timed(port, context, body, n):
    """Seconds to the whole answer of `n` POSTs one after another on one connection."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
    took = []
    for _ in range(n):
        started = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", body=body,
                           headers={"Content-Type": "application/json",
                                    "Authorization": f"Bearer {KEY}"})
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
        took.append(time.perf_counter() - started)
    connection.close()
    return took


def _hwm(pid) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def measure_door(requests: int) -> dict:
    found = {}
    for name, profiles in (("one model (today's door)", ("default", "default")),
                           ("two models (routed by body)", ("default", "no-eagle"))):
        with tempfile.TemporaryDirectory() as folder:
            process, port, context, servers, g = _door(Path(folder), profiles)
            try:
                row = {"routed": g.routed, "bufsize": g.bufsize}
                for label, size in (("2KB", 2_000), ("1MB", 1_000_000)):
                    body = _chat("mistral-small-4", size)
                    _timed(port, context, body, 5)  # warm
                    took = sorted(_timed(port, context, body, requests))
                    row[label] = {"bytes": len(body),
                                  "median_ms": round(statistics.median(took) * 1000, 3),
                                  "p99_ms": round(took[int(0.99 * (len(took) - 1))] * 1000, 3)}
                body = _chat("mistral-small-4", 1_000_000)
                threads = [threading.Thread(target=_timed, args=(port, context, body, 20))
                           for _ in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                row["haproxy_peak_rss_kib_after_8x20_1MB"] = _hwm(process.pid)
                found[name] = row
            finally:
                process.terminate()
                process.wait(10)
                for server in servers:
                    server.shutdown()
    one, two = found.values()
    found["added_by_routing_ms"] = {size: round(two[size]["median_ms"] - one[size]["median_ms"], 3)
                                    for size in ("2KB", "1MB")}
    return found


def measure_fleet(seconds: int) -> dict:
    from sim import fleet
    from tests.fleet.test_workloads import EAGLE, LONG, Door, Load

    sim = fleet.up(hosts=12, gateway=True, leave_existing=True)
    key = (fleet.state_dir() / "api_key").read_text().strip()
    door = Door({"url": f"https://127.0.0.1:{fleet.GATEWAY_HTTPS_PORT}",
                 "ca_file": str(fleet.state_dir() / "fleet-ca" / "fleet-ca.pem")}, key)

    def stot():
        _, text = sim.exec("gw-1", "echo 'show stat' | socat stdio UNIX-CONNECT:"
                                   "/run/haproxy/admin.sock")
        return {f[1]: int(f[7]) for f in (line.split(",") for line in text.splitlines())
                if len(f) > 7 and f[0].startswith("thors") and f[1] not in ("FRONTEND", "BACKEND")}

    before = stot()
    with Load(door, [EAGLE, EAGLE, LONG]) as load:
        time.sleep(seconds)
    after = stot()
    per_box = {box: after[box] - before.get(box, 0) for box in after}
    return {"seconds": seconds, "clients": {EAGLE: 2, LONG: 1},
            "answered": {m: sum(1 for r in load.results if r[0] == m and r[1] == 200)
                         for m in (EAGLE, LONG)},
            "failed": len(load.failed()),
            "answered_by_the_model_asked": all(r[2] == r[0] for r in load.results),
            "sent_per_box": per_box}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--fleet", action="store_true", help="also the sim's mixed fleet")
    parser.add_argument("--seconds", type=int, default=60)
    args = parser.parse_args(argv)
    result = {"as_of": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True,
                                        check=False).stdout.splitlines()[0],
              "door": measure_door(args.requests)}
    if args.fleet:
        result["fleet"] = measure_fleet(args.seconds)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
