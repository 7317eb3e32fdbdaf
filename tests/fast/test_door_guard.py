"""What the door refuses before it reads, answers itself, and sends again: HAProxy itself on the
rendered config (tests/fast/test_gateway_render.py's running_door), in front of stand-in boxes on
loopback that say how often they were asked.

- A POST without a key is refused (401) from its headers: the door reads no body of a client it
  does not know, however large the body declared (it read up to 4 MiB, 11 with vision, first),
  with a key per client (gateway_clients) or the fleet's one key (the old door, without
  clients, read them all).
- A body declared over the door's limit is refused before it is read; each pool holds bodies to
  its own limit (a text pool not to the vision pool's), a fleet of one model too, chunked or not.
- /health is the door's own answer: no box is asked; with no box in rotation, 503.
- A request whose box fails before answering (503, or a closed connection) is sent once more to
  the other box: the client gets 200 every time, and the failing box is out of rotation after
  ERROR_LIMIT failures, until its checks (the watchdog's verdict) put it back. A box that fails
  after its answer began is not asked again: the client sees the cut.

The edits that break them (each tried once): the
wait-for-body rule moved above the key check (the keyless 401 waits for the body); the key check
back inside `{% if g.gateway_clients %}` (without clients, `assert status == 401` sees 0, no
answer within 5 s, routed, and the 413 of the declared length with one model); the declared
413 rule dropped (a one-model fleet reads a body of any length to the box); the wait for a chunked
body dropped in a fleet of one model (it streams past the limit); the per-pool 413 loop dropped
(the text pool takes the vision pool's limit); /health sent to the boxes again (a box is asked);
no retry-on (the client gets the box's 503, or a 502); observe layer4 (the failing box is asked
on and on).
"""

import json
import socket
import ssl
import subprocess
import time
from http.server import BaseHTTPRequestHandler

import pytest

from tests.fast.test_gateway_render import (
    BOX_KEY,
    client_files,
    running_door,
)
from thorfleet.gateway.config import ERROR_LIMIT
from thorfleet.settings import layout

KEY = "alice-key-0123456789abcdef"
MIXED = ({}, {}, {"service_profile": "no-eagle"})  # two EAGLE boxes and a long-context one
DECLARED = 3_400_000  # the keyless body: 3.4 MB


def raw(door, g, head: bytes, body=b"", timeout=10):
    """The door's status code and answer body to `head` (request line and headers, no blank line
    at its end) and then `body`, over one TLS connection; '' if the door said nothing within
    `timeout` seconds."""
    context = ssl.create_default_context(cafile=g.ca_file)
    with socket.create_connection(("::1", door), timeout=timeout) as plain, \
            context.wrap_socket(plain, server_hostname="::1") as tls:
        got = b""
        try:  # a door that answers before the body is all sent may close on the rest
            tls.sendall(head + b"\r\nConnection: close\r\n\r\n" + body)
        except (ConnectionError, ssl.SSLError):
            pass
        try:
            while b"\r\n\r\n" not in got or not got.rstrip().endswith(b"}"):
                chunk = tls.recv(65536)
                if not chunk:
                    break
                got += chunk
        except (TimeoutError, ConnectionError, ssl.SSLError):
            pass
    status, _, rest = got.decode(errors="replace").partition("\r\n")
    return int(status.split()[1]) if status else 0, rest.partition("\r\n\r\n")[2]


def post_head(length, key=None, chunked=False, path="/v1/chat/completions"):
    lines = [f"POST {path} HTTP/1.1", "Host: door", "Content-Type: application/json",
             "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return "\r\n".join(lines).encode()


def chunked(body: bytes) -> bytes:
    """`body` as chunks of 64 KiB, and the last chunk."""
    step = 65536
    return b"".join(b"%x\r\n%s\r\n" % (len(body[at:at + step]), body[at:at + step])
                    for at in range(0, len(body), step)) + b"0\r\n\r\n"


def asked(boxes):
    return [getattr(b, "asked", 0) for b in boxes[::2]]


def admin(tmp_path, command):
    return subprocess.run(["socat", "-t", "5", "stdio", f"UNIX-CONNECT:{tmp_path / 'admin.sock'}"],
                          input=command + "\n", capture_output=True, text=True, timeout=30,
                          check=True).stdout


def up(tmp_path, backend):
    """{server: its operational state is up} in `backend` (show servers state: srv_op_state)."""
    rows = [line.split() for line in admin(tmp_path, f"show servers state {backend}").splitlines()
            if line[:1].isdigit()]
    return {f[3]: f[5] != "0" for f in rows if len(f) > 6}


# --- refused before it is read -------------------------------------------------------------------

@pytest.mark.parametrize("clients", [True, False], ids=["clients", "fleet-key"])
@pytest.mark.parametrize("thor_data", [MIXED, ()], ids=["routed", "one-model"])
def test_a_keyless_body_is_refused_from_its_headers_never_read(tmp_path, thor_data, clients):
    """The client sends the headers of a 3.4 MB POST and not a byte of its body: the 401 comes
    back at once, with a key per client or with the fleet's one key. Buffered first (the old
    door), it came only after the body, or `timeout http-request` later; without clients, only
    from a box."""
    boxes = []
    gateway_data = {"gateway_clients": client_files(tmp_path, alice=KEY)} if clients else {}
    opens = KEY if clients else BOX_KEY
    with running_door(tmp_path, thors=len(thor_data) or 1, thor_data=thor_data,
                      gateway_data=gateway_data, servers_out=boxes) as (door, g, _):
        for key in (None, "mallory-key-0123456789abcdef", *([BOX_KEY] if clients else [])):
            began = time.monotonic()
            status, body = raw(door, g, post_head(DECLARED, key), timeout=5)
            assert status == 401, (key, status, body)
            assert json.loads(body)["error"]["type"] == "invalid_api_key"
            assert time.monotonic() - began < 3
        # with a key, a body declared over the door's limit: 413 from its headers too
        status, body = raw(door, g, post_head(g.body_limit + 1, opens), timeout=5)
        assert status == 413, status
        assert str(g.body_limit) in json.loads(body)["error"]["message"]
        # ...and one within it is read and served (a body of its declared length, whole)
        sent = json.dumps({"model": "/model", "prompt": "x" * 100_000}).encode()
        status, body = raw(door, g, post_head(len(sent), opens), sent)
        assert status == 200 and json.loads(body)["length"] == len(sent), body
        assert sum(asked(boxes)) == 1


# --- each pool its limit, every door ------------------------------------------------------------

def test_each_pool_holds_bodies_to_its_own_limit(tmp_path):
    """A text pool beside a vision pool: a 2 MiB text request is over the text pool's limit (64K
    tokens at 16 bytes: 1 MiB) and under the vision pool's (+4 images of a MiB): 413 naming the
    text pool's limit, while the same body to the vision model is served."""
    vision = {"service_profile": "vision", "service_images_per_prompt": 4}
    boxes = []
    with running_door(tmp_path, thors=2, thor_data=({}, vision), servers_out=boxes) as (door, g, _):
        text_pool, vision_pool = g.pools
        assert g.body_limits == {text_pool: 65536 * 16, vision_pool: 65536 * 16 + 4 * (1 << 20)}
        for model, chunk in (("mistral-small-4", False), ("/model", False), (None, False),
                             ("mistral-small-4", True)):
            named = {"model": model} if model else {}
            sent = json.dumps({"prompt": "x" * (2 << 20), **named}).encode()
            status, body = raw(door, g, post_head(len(sent), BOX_KEY, chunked=chunk),
                               chunked(sent) if chunk else sent)
            assert status == 413, (model, status, body)
            assert f"over {g.body_limits[text_pool]} bytes" in json.loads(body)["error"]["message"]
        assert asked(boxes) == [0, 0]
        sent = json.dumps({"prompt": "x" * (2 << 20), "model": "mistral-small-4-vision"}).encode()
        status, body = raw(door, g, post_head(len(sent), BOX_KEY), sent)
        assert status == 200 and json.loads(body)["length"] == len(sent), body
        assert asked(boxes) == [0, 1]


def test_a_fleet_of_one_model_has_a_limit_too_declared_or_chunked(tmp_path):
    """One model, nothing to route: a body of declared length streams to the box, one declared
    over the limit is refused from its headers, and a chunked one is read first and held to the
    limit (it streamed to the box whatever its size)."""
    boxes = []
    with running_door(tmp_path, servers_out=boxes) as (door, g, _):
        limit = g.body_limits[layout.GATEWAY_BACKEND]
        assert limit == g.body_limit == 65536 * 16
        status, _ = raw(door, g, post_head(limit + 1, BOX_KEY), timeout=5)
        assert status == 413, status
        over = json.dumps({"model": "/model", "prompt": "x" * limit}).encode()
        status, body = raw(door, g, post_head(0, BOX_KEY, chunked=True), chunked(over))
        assert status == 413, (status, body)
        assert f"over {limit} bytes" in json.loads(body)["error"]["message"]
        assert asked(boxes) == [0]
        within = json.dumps({"model": "/model", "prompt": "x" * (limit // 2)}).encode()
        for chunk in (False, True):
            status, body = raw(door, g, post_head(len(within), BOX_KEY, chunked=chunk),
                               chunked(within) if chunk else within)
            assert status == 200 and json.loads(body)["length"] == len(within)
        assert asked(boxes) == [2]


# --- /health at the door -------------------------------------------------------------------------

def test_health_is_the_doors_own_answer_and_503_with_no_box_in_rotation(tmp_path):
    boxes = []
    clients = client_files(tmp_path, alice=KEY)
    with running_door(tmp_path, thors=2, servers_out=boxes,
                      gateway_data={"gateway_clients": clients}) as (door, g, _):
        for _ in range(3):  # no key needed, no box asked
            status, body = raw(door, g, b"GET /health HTTP/1.1\r\nHost: door", timeout=5)
            assert status == 200, status
        assert asked(boxes) == [0, 0]
        for box in ("thor-1", "thor-2"):
            admin(tmp_path, f"set server {layout.GATEWAY_BACKEND}/{box} state maint")
        status, body = raw(door, g, b"GET /health HTTP/1.1\r\nHost: door", timeout=5)
        assert status == 503, status
        assert json.loads(body)["error"]["type"] == "service_unavailable"
        admin(tmp_path, f"set server {layout.GATEWAY_BACKEND}/thor-2 state ready")
        status, _ = raw(door, g, b"GET /health HTTP/1.1\r\nHost: door", timeout=5)
        assert status == 200 and asked(boxes) == [0, 0], status


# --- failed answers: sent again before they begin, never after ---------------------------------

class _Failing(BaseHTTPRequestHandler):
    """A box whose server accepts and then fails: `how` is 503 (a server going down) or
    'empty' (the connection closed without an answer)."""

    how = 503

    def do_POST(self):
        self.server.asked = getattr(self.server, "asked", 0) + 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.how == "empty":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        body = b'{"error": "engine dead"}'
        self.send_response(self.how)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


class _Empty(_Failing):
    how = "empty"


class _Cut(BaseHTTPRequestHandler):
    """A box that starts streaming an answer and dies in the middle of it."""

    def do_POST(self):
        self.server.asked = getattr(self.server, "asked", 0) + 1
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        event = b'data: {"choices": [{"text": "def"}]}\n\n'
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()
        time.sleep(0.2)
        self.connection.shutdown(socket.SHUT_RDWR)  # no last chunk: the answer is cut

    def log_message(self, *_):
        pass


COMPLETION = json.dumps({"model": "/model", "prompt": "def fib(n):", "max_tokens": 8}).encode()


@pytest.mark.parametrize("failing", [_Failing, _Empty], ids=["503", "empty-response"])
def test_a_box_that_fails_before_answering_is_retried_on_another(tmp_path, failing):
    """The failing box is the first leastconn picks, every time (both idle): each request it
    fails is sent to the other, and the client gets 200 every time."""
    boxes = []
    with running_door(tmp_path, thors=2, handlers=(failing,), servers_out=boxes) as (door, g, _):
        answers = [raw(door, g, post_head(len(COMPLETION), BOX_KEY), COMPLETION)[0]
                   for _ in range(12)]
        assert answers == [200] * 12, answers
        assert asked(boxes)[1] == 12 and asked(boxes)[0] >= 1, asked(boxes)


@pytest.mark.parametrize("failing", [_Failing, _Empty], ids=["503", "empty-response"])
def test_a_box_that_keeps_failing_is_taken_out_by_the_door_until_its_checks(tmp_path, failing):
    """Alone in rotation (the other drained), its failures reach the door's count: out after
    ERROR_LIMIT requests, not restarted; its checks (the watchdog says 200 here) put it back
    after `rise`. (HAProxy 2.6 counts only a failure it did not retry: see docs/gateway.md.)"""
    boxes = []
    with running_door(tmp_path, thors=2, handlers=(failing,), servers_out=boxes,
                      gateway_data={"gateway_check_interval_s": 1}) as (door, g, _):
        admin(tmp_path, f"set server {layout.GATEWAY_BACKEND}/thor-2 state drain")
        answers = []
        while up(tmp_path, layout.GATEWAY_BACKEND)["thor-1"] and len(answers) < 10:
            answers.append(raw(door, g, post_head(len(COMPLETION), BOX_KEY), COMPLETION)[0])
        assert len(answers) == ERROR_LIMIT == g.error_limit, answers
        assert not up(tmp_path, layout.GATEWAY_BACKEND)["thor-1"]
        deadline = time.monotonic() + 15
        while not up(tmp_path, layout.GATEWAY_BACKEND)["thor-1"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert up(tmp_path, layout.GATEWAY_BACKEND)["thor-1"], "never put back by its checks"


def test_an_answer_that_began_is_never_sent_twice(tmp_path):
    """The box starts a stream and dies: the client sees the cut (a 200 whose body never ends),
    and no other box is asked for it."""
    boxes = []
    with running_door(tmp_path, thors=2, handlers=(_Cut,), servers_out=boxes) as (door, g, _):
        admin(tmp_path, f"set server {layout.GATEWAY_BACKEND}/thor-2 state drain")
        status, body = raw(door, g, post_head(len(COMPLETION), BOX_KEY), COMPLETION, timeout=5)
        admin(tmp_path, f"set server {layout.GATEWAY_BACKEND}/thor-2 state ready")
        assert status == 200, status
        assert 'data: {"choices"' in body and not body.endswith("0\r\n\r\n"), body
        assert asked(boxes) == [1, 0]
