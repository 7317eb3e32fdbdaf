#!/usr/bin/env python3
"""A stand-in Hugging Face hub that huggingface_hub (`hf download`, snapshot_download) downloads
from unchanged through HF_ENDPOINT. Standard library only: it runs in the sim's bookworm image.

    python3 server.py --root DIR --port 8000 [--token-file F]

DIR is what sim/hub/repos.py builds (manifest.json + blobs/). Endpoints, as the hub has them:
    GET       /api/models/{repo}[/revision/{rev}]     repo info: sha, siblings
    GET       /api/models/{repo}/tree/{rev}[/{path}]  file listing with LFS sha256 and sizes
    HEAD/GET  /{repo}/resolve/{rev}/{path}            small files: 200, the git blob id as ETag;
                                                      LFS files: 302 to a blob URL, X-Linked-Etag =
                                                      sha256, X-Linked-Size, X-Repo-Commit
    HEAD/GET  /_sim/lfs/{repo}/{commit}/{path}        the "CDN" the LFS redirect points at (ranges)
No X-Xet-Hash header is ever sent, so clients take the plain HTTP download path.

Token: when --token-file names a non-empty file, repo requests need `Authorization: Bearer
<token>`; the file is re-read, so the token can change at run time. Each line is `TOKEN` (every
client) or `CLIENT_IP TOKEN` (that box alone: stories on other boxes share the hub). Missing ->
401 GatedRepo (as the hub answers for a gated repo), wrong -> 401 "Invalid credentials in
Authorization header".

Fault knobs, switched at run time (no token needed):
    POST   /_sim/faults  {"repo": glob, "path": glob, "mode": m, "count": n|null, ...}
    GET    /_sim/faults  -> the active faults;  DELETE /_sim/faults -> clear them all
    modes: "cut"     headers announce the full length, the body stops half way ("at": byte count),
                     the connection closes
           "bad-sha" full length, but bytes differ from the advertised sha256/etag
           "slow"    body trickles at "rate" bytes/s (default 65536)
           "uplink"  every response it spoils shares "rate" bytes/s (default 65536): one office
                     uplink in front of the hub, as boxes on one site see it
           "401" / "404"  refuse (404 is EntryNotFound). API calls match path "" (path "*" refuses
                     the whole repo, "*.safetensors" only the shards).
    count: how many responses the fault spoils before it lapses; null = until cleared.
    GET /_sim/requests (DELETE to clear) lists the repo requests served (method, path, range, body
    bytes sent), to check what a client fetched.
"""

import argparse
import collections
import fnmatch
import itertools
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

CHUNK = 64 * 1024
BODY_FAULTS = ("cut", "bad-sha", "slow", "uplink")
REFUSALS = ("401", "404")


class Hub:
    """Repos, token and faults: the state every request handler thread shares."""

    def __init__(self, root: Path, token_file: Path | None):
        self.root = root
        self.token_file = token_file
        self.lock = threading.Lock()
        self.faults: list[dict] = []
        self._fault_ids = itertools.count(1)
        self.served = itertools.count(1)
        self._uplink_free_at: dict[int, float] = {}  # per uplink fault: when its link is free
        # per client: a box's log holds its own last 5000, however busy the others keep the hub
        self.requests: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=5000))
        self._manifest, self._manifest_mtime = None, None

    def manifest(self) -> dict:
        # Reloaded when build_repos rewrites it, so new revisions appear without a restart.
        path = self.root / "manifest.json"
        mtime = path.stat().st_mtime_ns
        with self.lock:
            if mtime != self._manifest_mtime:
                self._manifest, self._manifest_mtime = json.loads(path.read_text()), mtime
            return self._manifest

    def token(self, client: str) -> str | None:
        """The token `client` must send (None: none needed)."""
        if self.token_file is None:
            return None
        try:
            lines = self.token_file.read_text().split("\n")
        except FileNotFoundError:
            return None
        tokens = dict(line.split() if " " in line.strip() else ("*", line.strip())
                      for line in lines if line.strip())
        return tokens.get(client, tokens.get("*"))

    def add_fault(self, fault: dict) -> dict:
        mode = fault.get("mode")
        if mode not in BODY_FAULTS + REFUSALS:
            raise ValueError(f"unknown fault mode {mode!r}")
        if fault.get("count") is not None and (
            not isinstance(fault["count"], int) or fault["count"] < 1
        ):
            raise ValueError("count must be a positive integer or null")
        fault = {
            "repo": fault.get("repo", "*"),
            "path": fault.get("path", "*"),
            "mode": mode,
            "count": fault.get("count"),
            # The address a fault spoils (a glob): several stories share one hub, each on its box.
            "client": fault.get("client") or "*",
            "id": next(self._fault_ids),
            **{k: v for k, v in fault.items() if k in ("at", "rate")},
        }
        with self.lock:
            self.faults.append(fault)
        return fault

    def uplink_wait(self, fault_id: int, size: int, rate: float) -> float:
        """Seconds until `size` bytes have crossed an uplink fault's link, which every response
        it spoils shares at `rate` bytes/s, first come first served."""
        with self.lock:
            now = time.monotonic()
            done = max(now, self._uplink_free_at.get(fault_id, now)) + size / rate
            self._uplink_free_at[fault_id] = done
        return done - now

    def take_fault(self, repo: str, path: str, modes: tuple, client: str) -> dict | None:
        """The first active fault of one of `modes` that matches, spending one of its count."""
        with self.lock:
            for fault in self.faults:
                if (
                    fault["mode"] in modes
                    and fnmatch.fnmatchcase(client, fault["client"])
                    and fnmatch.fnmatchcase(repo, fault["repo"])
                    and fnmatch.fnmatchcase(path, fault["path"])
                ):
                    if fault["count"] is not None:
                        fault["count"] -= 1
                        if fault["count"] <= 0:
                            self.faults.remove(fault)
                    return dict(fault)
        return None


class HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class Handler(BaseHTTPRequestHandler):
    protocol_version = (
        "HTTP/1.1"  # keep-alive, as httpx expects; every response sets Content-Length
    )
    server_version = "thorfleet-hub"
    hub: Hub  # set by main()

    def do_HEAD(self):
        self._dispatch(head=True)

    def do_GET(self):
        self._dispatch(head=False)

    def do_POST(self):
        self._dispatch(head=False)

    def do_DELETE(self):
        self._dispatch(head=False)

    def log_message(self, fmt, *args):
        sys.stderr.write(f"{self.address_string()} {fmt % args}\n")

    # --- routing -------------------------------------------------------------------------------

    def _dispatch(self, head: bool):
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        query = parse_qs(url.query)
        self._sent = 0
        # Read any body now: left unread, it would spoil the next request on this connection.
        self._body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        admin = parts[:1] == ["_sim"] and parts[1:2] != ["lfs"]
        try:
            if admin:
                return self._admin(parts[1:])
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                return self._api(parts[2] + "/" + parts[3], parts[4:], query)
            if parts[:2] == ["_sim", "lfs"] and len(parts) >= 6:
                return self._lfs_blob(
                    parts[2] + "/" + parts[3], parts[4], "/".join(parts[5:]), head
                )
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), head)
            raise HubError(404, None, f"no route for {url.path}")
        except HubError as error:
            self._error(error, head)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            if not admin:
                with self.hub.lock:
                    self.hub.requests[self.client_address[0]].append(
                        {
                            "n": next(self.hub.served),  # the order across clients
                            "method": self.command,
                            "path": url.path,
                            "range": self.headers.get("Range"),
                            "bytes": self._sent,
                            "client": self.client_address[0],
                        }
                    )

    def _admin(self, parts: list[str]):
        if parts == ["health"]:
            return self._json(200, {"ok": True})
        # ?client=ADDR: only that client's faults and requests (listed, or cleared by DELETE).
        client = parse_qs(urlsplit(self.path).query).get("client", [None])[0]

        def others(entry: dict) -> bool:
            return client is not None and entry.get("client") != client

        if parts == ["faults"]:
            if self.command == "POST":
                try:
                    fault = self.hub.add_fault(json.loads(self._body or b"{}"))
                except ValueError as error:
                    return self._json(400, {"error": str(error)})
                return self._json(201, fault)
            with self.hub.lock:
                if self.command == "DELETE":
                    self.hub.faults[:] = [f for f in self.hub.faults if others(f)]
                active = [f for f in self.hub.faults if not others(f)]
            return self._json(200, active)
        if parts == ["requests"]:
            with self.hub.lock:
                logs = [self.hub.requests[client]] if client else list(self.hub.requests.values())
                if self.command == "DELETE":
                    for log in logs:
                        log.clear()
                served = sorted((r for log in logs for r in log), key=lambda r: r["n"])
            return self._json(200, served)
        raise HubError(404, None, "no such admin endpoint")

    # --- repo lookups ------------------------------------------------------------------------

    def _repo(self, repo_id: str, path: str) -> dict:
        """Check the token, then the refusal faults; return the repo."""
        token = self.hub.token(self.client_address[0])
        if token is not None:
            auth = self.headers.get("Authorization", "")
            if not auth:
                raise HubError(
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. You must have "
                    "access to it and be authenticated to access it. Please log in.",
                )
            if auth != f"Bearer {token}":
                raise HubError(401, None, "Invalid credentials in Authorization header")
        repo = self.hub.manifest()["repos"].get(repo_id)
        if repo is None:
            raise HubError(404, "RepoNotFound", "Repository not found")
        refusal = self.hub.take_fault(repo_id, path, REFUSALS, self.client_address[0])
        if refusal and refusal["mode"] == "401":
            raise HubError(401, None, "Invalid credentials in Authorization header")
        if refusal:
            raise HubError(404, "EntryNotFound" if path else "RepoNotFound", "refused by sim fault")
        return repo

    def _commit(self, repo: dict, revision: str) -> str:
        commit = repo["refs"].get(revision, revision)
        if commit not in repo["commits"]:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return commit

    def _entry(self, repo: dict, commit: str, path: str) -> dict:
        entry = repo["commits"][commit]["files"].get(path)
        if entry is None:
            raise HubError(404, "EntryNotFound", f"{path} does not exist at {commit}", commit)
        return entry

    # --- API ------------------------------------------------------------------------------------

    def _api(self, repo_id: str, rest: list[str], query: dict):
        repo = self._repo(repo_id, "")
        if not rest or rest[0] == "revision":
            commit = self._commit(repo, rest[1] if len(rest) > 1 else "main")
            return self._json(200, self._model_info(repo_id, repo, commit, "blobs" in query))
        if rest[0] == "tree" and len(rest) >= 2:
            commit = self._commit(repo, rest[1])
            prefix = "/".join(rest[2:]).strip("/")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._json(200, self._tree(repo["commits"][commit]["files"], prefix, recursive))
        raise HubError(404, None, "no such API endpoint")

    def _model_info(self, repo_id: str, repo: dict, commit: str, blobs: bool) -> dict:
        info = repo["commits"][commit]
        siblings = []
        for path, entry in info["files"].items():
            sibling = {"rfilename": path}
            if blobs:
                sibling.update(size=entry["size"], blobId=entry["oid"])
                if entry["lfs"]:
                    sibling["lfs"] = {
                        "sha256": entry["sha256"],
                        "size": entry["size"],
                        "pointerSize": entry["lfs"]["pointerSize"],
                    }
            siblings.append(sibling)
        return {
            "_id": repo_id.replace("/", "-"),
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": commit,
            "lastModified": info["date"],
            "createdAt": repo["commits"][repo["history"][0]]["date"],
            "private": False,
            "gated": "auto" if self.hub.token(self.client_address[0]) else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": ["vllm", "mistral-common"],
            "library_name": "vllm",
            "siblings": siblings,
            "usedStorage": sum(e["size"] for e in info["files"].values()),
        }

    def _tree(self, files: dict, prefix: str, recursive: bool) -> list[dict]:
        listing, folders = [], set()
        base = prefix + "/" if prefix else ""
        for path, entry in files.items():
            if not path.startswith(base):
                continue
            rest = path[len(base) :]
            if "/" in rest and not recursive:
                folders.add(base + rest.split("/")[0])
                continue
            item = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
            if entry["lfs"]:
                item["lfs"] = dict(entry["lfs"])
            listing.append(item)
        if prefix and not listing and not folders:
            raise HubError(404, "EntryNotFound", f"{prefix} does not exist")
        return [
            {"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)
        ] + listing

    # --- file bytes ---------------------------------------------------------------------------

    def _resolve(self, repo_id: str, revision: str, path: str, head: bool):
        repo = self._repo(repo_id, path)
        commit = self._commit(repo, revision)
        entry = self._entry(repo, commit, path)
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if entry["lfs"]:
            # The hub redirects LFS files to its CDN and describes the file on the redirect itself.
            host = self.headers.get("Host") or f"127.0.0.1:{self.server.server_address[1]}"
            location = f"http://{host}/_sim/lfs/{repo_id}/{commit}/{quote(path)}"
            headers.update(
                {
                    "ETag": f'"{entry["oid"]}"',
                    "X-Linked-Etag": f'"{entry["sha256"]}"',
                    "X-Linked-Size": str(entry["size"]),
                    "Location": location,
                    "Content-Length": "0",
                }
            )
            return self._reply(302, headers, b"", head)
        headers["ETag"] = f'"{entry["oid"]}"'
        return self._send_file(repo_id, path, entry, headers, head)

    def _lfs_blob(self, repo_id: str, commit: str, path: str, head: bool):
        # Authorization is checked here too: clients send it on same-host redirects.
        repo = self._repo(repo_id, path)
        if commit not in repo["commits"]:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {commit}")
        entry = self._entry(repo, commit, path)
        headers = {
            "X-Repo-Commit": commit,
            "Accept-Ranges": "bytes",
            "ETag": f'"{entry["sha256"]}"',
            "X-Linked-Etag": f'"{entry["sha256"]}"',
            "X-Linked-Size": str(entry["size"]),
        }
        return self._send_file(repo_id, path, entry, headers, head)

    def _send_file(self, repo_id: str, path: str, entry: dict, headers: dict, head: bool):
        size = entry["size"]
        start, end = 0, size - 1
        status = 200
        ranged = _parse_range(self.headers.get("Range"), size)
        if ranged == "unsatisfiable":
            headers["Content-Range"] = f"bytes */{size}"
            raise HubError(416, None, "Requested range not satisfiable")
        if ranged:
            start, end = ranged
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        headers["Content-Length"] = str(end - start + 1)
        headers["Content-Type"] = (
            "application/json" if path.endswith(".json") else "application/octet-stream"
        )
        headers["Content-Disposition"] = f'inline; filename="{path.rsplit("/", 1)[-1]}"'
        fault = None if head else self.hub.take_fault(repo_id, path, BODY_FAULTS,
                                                           self.client_address[0])
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if head:
            return
        self._stream(self.hub.root / "blobs" / entry["sha256"], start, end, size, fault)

    def _stream(self, blob: Path, start: int, end: int, size: int, fault: dict | None):
        mode = fault["mode"] if fault else None
        length = end - start + 1
        stop = length
        if mode == "cut":
            stop = min(int(fault.get("at", length // 2)), length - 1)
        rate = float(fault.get("rate", 65536)) if mode in ("slow", "uplink") else None
        # bad-sha flips 16 bytes in the middle of the file, wherever the requested range falls.
        bad = range(size // 2, min(size // 2 + 16, size)) if mode == "bad-sha" else range(0)
        with open(blob, "rb") as handle:
            handle.seek(start)
            offset = start
            while self._sent < stop:
                chunk = bytearray(
                    handle.read(min(CHUNK if rate is None else 16384, stop - self._sent))
                )
                if not chunk:
                    break
                for position in bad:
                    if offset <= position < offset + len(chunk):
                        chunk[position - offset] ^= 0x5A
                self.wfile.write(chunk)
                self._sent += len(chunk)
                offset += len(chunk)
                if mode == "uplink":
                    time.sleep(self.hub.uplink_wait(fault["id"], len(chunk), rate))
                elif rate:
                    time.sleep(len(chunk) / rate)
        if mode == "cut":
            # Headers promised `length` bytes; closing now is what a dropped transfer looks like.
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # --- responses ----------------------------------------------------------------------------

    def _error(self, error: HubError, head: bool):
        headers = {"Content-Type": "application/json"}
        if error.code:
            headers["X-Error-Code"] = error.code
        headers["X-Error-Message"] = error.message
        if error.commit:
            headers["X-Repo-Commit"] = error.commit
        body = json.dumps({"error": error.message}).encode()
        headers["Content-Length"] = str(len(body))
        self._reply(error.status, headers, body, head)

    def _json(self, status: int, value) -> None:
        body = json.dumps(value).encode()
        self._reply(
            status,
            {"Content-Type": "application/json", "Content-Length": str(len(body))},
            body,
            self.command == "HEAD",
        )

    def _reply(self, status: int, headers: dict, body: bytes, head: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
            self._sent += len(body)


def _parse_range(value: str | None, size: int):
    """(start, end) for one `bytes=a-b`, `bytes=a-` or `bytes=-n`; None for no/ignored range."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    first, _, last = value[6:].strip().partition("-")
    try:
        if first == "":
            start, end = max(size - int(last), 0), size - 1
        else:
            start, end = int(first), (int(last) if last else size - 1)
    except ValueError:
        return None
    if start >= size or start > end:
        return "unsatisfiable"
    return start, min(end, size - 1)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="directory built by build_repos")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument(
        "--token-file", type=Path, help="require this token (file re-read per request)"
    )
    args = parser.parse_args(argv)
    Handler.hub = Hub(args.root, args.token_file)
    Handler.hub.manifest()  # fail at start, not on the first request, if the root is wrong
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(
        f"thorfleet-hub serving {args.root} on {args.host}:{server.server_address[1]}", flush=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
