"""Token budgets per client, held at the door: the boxes count each client's tokens (told who
asks by the door's X-Thorfleet-Client header) and answer /usage on their check port;
files/bin/thorfleet-door-usage sums them, decides who is over which budget (verdicts) and puts
it in the budget map, which HAProxy reads to answer 429 with Retry-After before any box is asked.

The decisions are tables; the door is HAProxy itself on the rendered config, in front of
stand-in boxes whose watchdogs answer /usage, with the usage service running as its unit runs it.

The edits that break them (each seen failing once; docs/gateway.md lists them): see the report
of the branch that added them, and docs/gateway.md's "Token budgets".
"""

import http.client
import json
import ssl

from tests.fast.test_gateway_render import (
    JsonBox,
    client_files,
    running_door,
)
from thorfleet.gateway.config import FLEET_CLIENT
from thorfleet.settings import layout

KEYS = {"alice": "alice-key-0123456789abcdef", "bob": "bob-key-0123456789abcdefg"}


# --- the door itself: HAProxy, stand-in boxes ------------------------------------------------------

class SeeingBox(JsonBox):
    """A vLLM stand-in answering with the X-Thorfleet-Client headers it got."""

    def do_GET(self):
        self.answer({"clients": self.headers.get_all(layout.GATEWAY_CLIENT_HEADER) or []})


def request(door, g, method, path, key, body=None, headers=()):
    """(status, headers (lower-case names), JSON answer) of a request through the door;
    `headers`: (name, value) pairs, sent as they are (a name twice is sent twice)."""
    connection = http.client.HTTPSConnection(
        "::1", door, timeout=30, context=ssl.create_default_context(cafile=g.ca_file))
    connection.putrequest(method, path)
    for name, value in [("Authorization", f"Bearer {key}"), *headers]:
        connection.putheader(name, value)
    if body is not None:
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
    connection.endheaders(body)
    answer = connection.getresponse()
    said = answer.status, {k.lower(): v for k, v in answer.getheaders()}, json.loads(answer.read())
    connection.close()
    return said


def test_the_box_is_told_which_client_asks_and_no_client_can_say_another(tmp_path):
    files = client_files(tmp_path, alice=KEYS["alice"], bob=KEYS["bob"])
    claims = [(layout.GATEWAY_CLIENT_HEADER, "bob"), ("x-thorfleet-client", FLEET_CLIENT)]
    (tmp_path / "clients-door").mkdir()
    with running_door(tmp_path / "clients-door", gateway_data={"gateway_clients": files},
                      handlers=[SeeingBox]) as (door, g, _):
        for key, name in ((KEYS["alice"], "alice"), (KEYS["bob"], "bob")):
            assert request(door, g, "GET", "/v1/models", key)[2] == {"clients": [name]}
            # a client's own header, in any case, once or twice: replaced by its name
            assert request(door, g, "GET", "/v1/models", key, headers=claims)[2] == {
                "clients": [name]}
    (tmp_path / "fleet-door").mkdir()
    with running_door(tmp_path / "fleet-door", handlers=[SeeingBox]) as (door, g, _):
        from tests.fast.test_gateway_render import BOX_KEY  # the fleet's one key opens it

        assert request(door, g, "GET", "/v1/models", BOX_KEY, headers=claims)[2] == {
            "clients": [FLEET_CLIENT]}
