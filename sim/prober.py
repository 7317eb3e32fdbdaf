"""Watch every box's /health while a rollout runs, and say who was down when.

The server listens on the box's own network (host networking inside the box), so the probe runs
inside each box: a shell loop started with `docker exec`, one curl every `interval` seconds,
bounded in time and stopped by a marker file. Timestamps come from the box, whose clock is the
host's (containers share the kernel clock), so samples of different boxes line up.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from sim.fleet import box_exec, box_name

STOP = "/run/thorfleet-prober-stop"
LOOP = """end=$(( $(date +%s) + {limit} ))
while [ ! -e {stop} ] && [ "$(date +%s)" -lt "$end" ]; do
  code=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 1 http://127.0.0.1:{port}/health)
  echo "$(date +%s.%N) $code"
  sleep {interval}
done"""


@dataclass
class Outage:
    host: str
    start: float  # first sample that failed
    end: float  # first sample that answered 200 again (or the last sample, if none did)
    recovered: bool

    @property
    def seconds(self):
        return self.end - self.start


class Prober:
    """`with Prober(hosts) as probe: ...` then `probe.samples[host]` is [(time, http_code)]."""

    def __init__(self, hosts, port=8002, interval=0.5, limit_s=1800):
        self.hosts, self.port, self.interval, self.limit_s = list(hosts), port, interval, limit_s
        self.samples: dict[str, list[tuple[float, str]]] = {}
        self._procs = {}

    def __enter__(self):
        loop = LOOP.format(limit=int(self.limit_s), stop=STOP, port=self.port,
                           interval=self.interval)
        for host in self.hosts:
            box_exec(None, host, f"rm -f {STOP}")
            self._procs[host] = subprocess.Popen(
                ["docker", "exec", box_name(int(host.rsplit("-", 1)[-1])), "sh", "-c", loop],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
        return self

    def __exit__(self, *exc):
        for host in self.hosts:
            box_exec(None, host, f"touch {STOP}")
        for host, proc in self._procs.items():
            out, _ = proc.communicate(timeout=30)
            self.samples[host] = [(float(t), code) for t, code in
                                  (line.split() for line in out.splitlines() if len(line.split()) == 2)]
        return False

    def outages(self) -> list[Outage]:
        """Every stretch of failed samples, per host, from the first failure to the next 200."""
        found = []
        for host, samples in self.samples.items():
            start = None
            for t, code in samples:
                if code != "200" and start is None:
                    start = t
                elif code == "200" and start is not None:
                    found.append(Outage(host, start, t, True))
                    start = None
            if start is not None:
                found.append(Outage(host, start, samples[-1][0], False))
        return found

    def most_down_at_once(self) -> int:
        """The largest number of hosts down at the same moment (outages as half-open intervals)."""
        edges = sorted([(o.start, 1) for o in self.outages()] + [(o.end, -1) for o in self.outages()],
                       key=lambda edge: (edge[0], edge[1]))
        most = down = 0
        for _, step in edges:
            down += step
            most = max(most, down)
        return most


def restart_window(host, since: float, service="thorfleet-vllm"):
    """(start, end) of the host's last restart after `since`: from systemd stopping (or starting)
    the service to thorfleet-serve writing the proven fingerprint. None if it did not restart."""
    _, journal = box_exec(None, host, f"journalctl -u {service} -o short-unix --no-pager "
                                      f"--since @{int(since)}")
    starts = [float(line.split()[0]) for line in journal.splitlines()
              if "systemd[1]:" in line and ("Stopping" in line or "Starting" in line)
              and float(line.split()[0]) >= since]
    code, mtime = box_exec(None, host, "stat -c %.9Y /var/lib/thorfleet/proven-fingerprint")
    if not starts or code != 0:
        return None
    return starts[0], float(mtime.strip())
