"""Boxes serve a profile each, under a model name of its own, and the door sends each request to
the boxes of the model its body names: HAProxy itself, on the rendered config, in front of
stand-in boxes that say which of them took a request and how much of its body arrived.

The edits that break them: no `http-request wait-for-body` (no `model` is read: every request
goes to the first pool); tune.bufsize left at 16 KB (a body over it is routed on its start, and a
`model` written after the messages is never seen); the 413 rule dropped (a body over the door's
buffer goes to the first pool cut to what it read); the pools' order not the profiles' (the old
name goes to another pool); a batch of the rollout holding every box of a model.
"""

import http.client
import json
import ssl
import subprocess

import pytest
import yaml
from pyinfra.api import Inventory

from tests.fast.test_gateway_render import (
    BOX_KEY,
    gateway_settings,
    haproxy_check,
    inventory,
    running_door,
)
from thorfleet.gateway.config import Backend, GatewaySettings
from thorfleet.plan import make_door_files, settings_for_inventory
from thorfleet.run import rollout
from thorfleet.settings import layout
from thorfleet.settings.recipe import PROFILES, served_names
from thorfleet.settings.schema import check_gateway

HF_ID = "mistralai/Mistral-Small-4-119B-2603-NVFP4"
MIXED = ({}, {}, {"service_profile": "no-eagle"})  # two EAGLE boxes, one long-context box


def post(door, g, body: bytes, chunked=False, key=BOX_KEY):
    """(status, JSON answer) of a POST of `body` through the door; `chunked`: sent by curl with
    no length declared, reading the answer as it sends, so a 413 the door gives before the body
    ends is seen as a client sees it (http.client only reads once it has sent the whole body)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    if chunked:
        out = subprocess.run(
            ["curl", "-sS", "--cacert", str(g.ca_file), "--data-binary", "@-",
             "-H", "Transfer-Encoding: chunked", *[a for k, v in headers.items()
                                                   for a in ("-H", f"{k}: {v}")],
             "-w", "\n%{http_code}", f"https://[::1]:{door}/v1/chat/completions"],
            input=body, capture_output=True, timeout=60, check=True).stdout
        answer, _, status = out.rpartition(b"\n")
        return int(status), json.loads(answer)
    connection = http.client.HTTPSConnection(
        "::1", door, timeout=60, context=ssl.create_default_context(cafile=g.ca_file))
    connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
    answer = connection.getresponse()
    return answer.status, json.loads(answer.read())


def chat(model=None, content="Hello", model_last=True) -> bytes:
    """A chat request as the OpenAI SDK writes one: `model` after the messages."""
    messages = {"messages": [{"role": "user", "content": content}]}
    named = {"model": model} if model is not None else {}
    return json.dumps({**messages, **named} if model_last else {**named, **messages}).encode()


def test_each_profile_serves_under_its_own_name_and_answers_the_old_one():
    assert served_names("default", HF_ID) == ["mistral-small-4", HF_ID, "/model"]
    assert served_names("no-eagle", HF_ID) == ["mistral-small-4-256k", "/model"]
    assert served_names("throughput", HF_ID) == ["mistral-small-4-batch", "/model"]
    assert served_names("vision", HF_ID) == ["mistral-small-4-vision", "/model"]
    names = [p["model"] for p in PROFILES.values()]
    assert len(set(names)) == len(names)


def test_a_fleet_of_one_model_has_the_door_it_had(tmp_path):
    g = gateway_settings(tmp_path)
    assert not g.routed and list(g.pools) == [layout.GATEWAY_BACKEND]
    # no body read to route (affinity reads one for its conversation, unless a header names it
    # and its length is declared); one chunked is read, to hold it to the limit
    assert "txn.model" not in g.config_text
    assert "wait-for-body time 30s unless { req.hdr(content-length) -m found }" in g.config_text


def test_a_mixed_fleet_has_a_pool_per_model_and_batches_follow_max_num_seqs(tmp_path):
    values, problems = check_gateway({"gateway_ca_dir": str(tmp_path / "ca")})
    assert not problems
    boxes = [Backend(f"thor-{n}", f"10.0.0.{n}", 8002, PROFILES[p]["max_num_seqs"], 9105, p,
                     tuple(served_names(p, HF_ID)))
             for n, p in ((1, "default"), (2, "throughput"), (3, "no-eagle"), (4, "default"))]
    g = GatewaySettings(values, "gw-1", "127.0.0.1", boxes, box_key=BOX_KEY)
    make_door_files(g)
    checked = haproxy_check(tmp_path, g)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {pool: [b.name for b in members] for pool, members in g.pools.items()} == {
        "thors-mistral-small-4": ["thor-1", "thor-4"],
        "thors-mistral-small-4-256k": ["thor-3"],
        "thors-mistral-small-4-batch": ["thor-2"]}
    lines = [line.strip() for line in g.config_text.splitlines()]
    assert "server thor-2 10.0.0.2:8002 port 9105 maxconn 8 id 1" in lines
    # the longest context read whole: 256K tokens at 16 bytes, and the headers
    assert f"tune.bufsize {262144 * 16 + 65536}" in lines
    # a request queued behind a whole 256K prefill (~250 s on a Thor) waits it out; the other
    # pools keep gateway_queue_timeout_s, and so does the door's own 503 everywhere else
    assert g.queue_timeouts == {"thors-mistral-small-4": 120, "thors-mistral-small-4-256k": 300,
                                "thors-mistral-small-4-batch": 120}
    pools = {block.split("\n", 1)[0]: block for block in g.config_text.split("\nbackend ")[1:]}
    assert "timeout queue 300s" in pools["thors-mistral-small-4-256k"]
    assert "no box was free within 300 s" in pools["thors-mistral-small-4-256k"]
    assert "timeout queue" not in pools["thors-mistral-small-4"]
    assert "timeout queue 120s" in lines and "no box was free within 120 s" in g.config_text
    assert "default_backend thors-mistral-small-4" in lines
    assert [m["id"] for m in json.loads(g.models_body)["data"]] == [
        "mistral-small-4", "mistral-small-4-256k", "mistral-small-4-batch"]


def test_each_request_reaches_the_boxes_of_the_model_it_names_whatever_its_size(tmp_path):
    boxes = []
    with running_door(tmp_path, thors=3, thor_data=MIXED, servers_out=boxes) as (door, g, _):
        eagle = {boxes[0].server_address[1], boxes[2].server_address[1]}
        long_box = boxes[4].server_address[1]
        for model in ("mistral-small-4", HF_ID, "/model", None):
            status, seen = post(door, g, chat(model))
            assert status == 200 and seen["box"] in eagle, (model, seen)
        status, seen = post(door, g, chat("mistral-small-4-256k", model_last=False))
        assert status == 200 and seen["box"] == long_box, seen
        # a 256K-profile prompt of 1.5 MB, `model` written last: read whole, routed, not cut
        big = chat("mistral-small-4-256k", "lorem ipsum " * 130_000)
        assert len(big) > 1_500_000
        for chunked in (False, True):
            status, seen = post(door, g, big, chunked=chunked)
            assert status == 200 and seen["box"] == long_box, seen
            assert seen["length"] == len(big), seen
        # a model no box serves: 404 from the door, as vLLM words it; no box asked
        asked = [getattr(b, "completions", 0) for b in boxes]
        status, said = post(door, g, chat("gpt-4o"))
        assert status == 404 and said["error"]["type"] == "NotFoundError", said
        assert "GET /v1/models lists" in said["error"]["message"]
        # a body over what the door reads whole: 413, never routed on its start (chunked: no
        # length declared, so read up to the limit first; a declared one is refused from its
        # headers, tests/fast/test_door_guard.py)
        status, said = post(door, g, chat("mistral-small-4-256k", "x" * (g.body_limit + 1)),
                            chunked=True)
        assert status == 413 and str(g.body_limit) in said["error"]["message"], said
        assert [getattr(b, "completions", 0) for b in boxes] == asked


def test_a_vision_pool_reads_its_images_whole(tmp_path):
    values, problems = check_gateway({"gateway_ca_dir": str(tmp_path / "ca")})
    assert not problems
    boxes = [Backend("thor-1", "10.0.0.1", 8002, 1, 9105, "default"),
             Backend("thor-2", "10.0.0.2", 8002, 1, 9105, "vision",
                     tuple(served_names("vision", HF_ID)), images=4)]
    g = GatewaySettings(values, "gw-1", "127.0.0.1", boxes, box_key=BOX_KEY)
    make_door_files(g)
    # 64K tokens of text at 16 bytes, and 4 images of a MiB each
    assert g.body_limit == 65536 * 16 + 4 * (1 << 20)
    assert list(g.pools) == ["thors-mistral-small-4", "thors-mistral-small-4-vision"]
    assert haproxy_check(tmp_path, g).returncode == 0


def test_the_doors_model_list_is_the_fleets_once_a_box_took_the_key(tmp_path):
    from tests.fast.test_gateway_render import ask
    with running_door(tmp_path, thors=3, thor_data=MIXED) as (door, g, _):
        status, listed = ask(door, g, "/v1/models", BOX_KEY)
        assert status == 200 and [m["id"] for m in listed["data"]] == [
            "mistral-small-4", "mistral-small-4-256k"], listed
        status, said = ask(door, g, "/v1/models", "not-the-key-0123456789")
        assert status == 401 and "data" not in said, said


def test_each_box_is_drained_in_its_own_pool(tmp_path):
    inv = inventory(tmp_path, thor_hosts=[
        ("thor-1", {"ssh_hostname": "10.0.0.1"}),
        ("thor-2", {"ssh_hostname": "10.0.0.2", "service_profile": "no-eagle"})])
    settings = settings_for_inventory(inv)
    assert settings["thor-1"].gateway_pool == "thors-mistral-small-4"
    assert settings["thor-2"].gateway_pool == "thors-mistral-small-4-256k"
    config = yaml.safe_load(settings["thor-2"].config_text)
    assert config["served_model_name"] == ["mistral-small-4-256k", "/model"]


def fleet(*hosts, canaries=()):
    """An inventory of (name, profile) hosts; `canaries`: the group `canary`."""
    return Inventory(([(name, {"service_profile": profile}) for name, profile in hosts], {}),
                     **({"canary": (list(canaries), {})} if canaries else {}))


def batches(inv, size, canary_group=None):
    return rollout.plan(inv, size, canary_group,
                        model_of=lambda h: h.data.get("service_profile")).batches


@pytest.mark.parametrize("hosts, size, canaries, expected", [
    # two EAGLE boxes and a long-context one, 2 at a time: never both EAGLE boxes together
    ((("a", "default"), ("b", "default"), ("c", "no-eagle")), 2, (), [["a", "c"], ["b"]]),
    # one at a time: as before
    ((("a", "default"), ("b", "default"), ("c", "no-eagle")), 1, (), [["a"], ["b"], ["c"]]),
    # a canary per profile first, then the rest, one box of each model kept serving
    ((("a", "default"), ("b", "default"), ("c", "no-eagle"), ("d", "no-eagle")), 4, ("a", "c"),
     [["a", "c"], ["b", "d"]]),
    # a model served by one box only: its restart cannot keep it serving (said in the docs)
    ((("a", "default"), ("b", "no-eagle")), 2, (), [["a", "b"]]),
    # one model, a batch as large as the fleet: one box stays serving
    ((("a", "default"), ("b", "default"), ("c", "default")), 3, (), [["a", "b"], ["c"]]),
])
def test_a_batch_never_takes_every_box_of_a_model(hosts, size, canaries, expected):
    inv = fleet(*hosts, canaries=canaries)
    assert batches(inv, size, "canary" if canaries else None) == expected
