"""A tiny client for the stand-in hub's run-time knobs (see server.py for what each fault does)."""

import contextlib
import json
import urllib.request


class HubFaults:
    """Switch faults on and off in a running stand-in hub, and read what it served.

    faults = HubFaults("http://127.0.0.1:18000")
    with faults.injected(mode="cut", path="consolidated-00007-of-00013.safetensors"):
        ...  # downloads of that shard break half way
    """

    def __init__(self, endpoint: str, client: str | None = None):
        """client: one box's address; its faults and requests only, so stories on other boxes
        can share the hub meanwhile. None: every client's."""
        self.endpoint = endpoint.rstrip("/")
        self.client = client

    def add(
        self, mode: str, path: str = "*", repo: str = "*", count: int | None = None, **options
    ) -> dict:
        """Add a fault: mode is cut, bad-sha, slow, uplink, 401 or 404; path and repo are globs;
        count is how many responses it spoils (None: until cleared); options: at (cut), rate
        (slow: each response; uplink: all of them together)."""
        return self._call(
            "POST",
            "/_sim/faults",
            {"mode": mode, "path": path, "repo": repo, "count": count, "client": self.client,
             **options},
        )

    def clear(self) -> None:
        self._call("DELETE", "/_sim/faults")

    def active(self) -> list[dict]:
        return self._call("GET", "/_sim/faults")

    @contextlib.contextmanager
    def injected(
        self, mode: str, path: str = "*", repo: str = "*", count: int | None = None, **options
    ):
        self.add(mode, path=path, repo=repo, count=count, **options)
        try:
            yield self
        finally:
            self.clear()

    def requests(self) -> list[dict]:
        """Requests served since forget_requests(): method, path, range, body bytes sent."""
        return self._call("GET", "/_sim/requests")

    def forget_requests(self) -> None:
        self._call("DELETE", "/_sim/requests")

    def _call(self, method: str, path: str, body=None):
        if self.client is not None and method != "POST":
            path += f"?client={self.client}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.endpoint + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")
