"""The boxes serve what a request asks for: a mixed fleet behind the door, routed by model.

The operator puts one box on the long-context profile (its host data: service_profile
"no-eagle") beside two EAGLE boxes, with a canary of each profile, and converges under load.
The long-context box restarts into its profile with the canaries, the other EAGLE box after
them: the EAGLE clients never lose their last box. Then clients ask by name:
- `mistral-small-4` reaches only the EAGLE boxes and `mistral-small-4-256k` only the long one,
  counted per box at the door, under load from both at once;
- a request for the long-context model whose body is over a megabyte, `model` written last (as
  the OpenAI SDK writes it), is read whole and answered by the long-context box;
- a model no box serves is answered 404 with an OpenAI error, and /v1/models lists the fleet's
  models by name;
- `python -m thorfleet bench` runs vLLM's own `vllm bench serve` on a box through the door, per
  model and concurrency (tiny shapes; each answer its full length, as --ignore-eos asks), and
  writes bench.json and bench.png; the long-context
  model's second request waits at the door, and the result says so; while it runs the key is on
  no command line on the box and not in the bench container's `docker inspect`, and after it no
  file under the box's /tmp holds it.

Then the operator turns the long-context box into a vision box (service_profile "vision", image
URLs allowed from one domain): its proof sends the repository's picture, which vLLM's own
multimodal processing turns into image tokens; a picture is answered there and refused with a
400 by the text boxes; an image URL on another domain, a file that is no image and one image too
many are each a 400, and the box still serves.

The edits that break them: a box drained in the backend `thors` rather than its model's pool
(HAProxy has no such backend: the drain fails and the rollout with it); the door without http-buffer-request or with HAProxy's 16 KB buffer (the large request
goes to an EAGLE box, which answers with its own name); served_model_name not rendered (the boxes
answer `mistral-small-4-256k` with 404); the stand-in stopping at its answer's end despite
--ignore-eos (bench's outputs fall short); the bench key given to the container by -e or
--env-file (docker inspect shows it) or on the box's command line; --language-model-only kept for the vision profile
(the picture is refused: "At most 0 image(s)"); allowed_media_domains left empty (vLLM fetches
the other domain's URL, and the 400 does not name the allowed domains); the operator's domains not
rendered (the allowed domain is refused with a 400, never fetched). A batch holding every box
of a model is tests/fast/test_models.py's table.

Uses boxes 10, 11 and 12 and the gateway box gw-1, after the gateway's and the watchdog's stories
(one group; the modules run in file order).
"""

import base64
import http.client
import json
import ssl
import subprocess
import sys
import time
from urllib.parse import urlparse

import pytest

from sim.fleet import GATEWAY_HTTPS_PORT
from tests.helpers import ROOT, Clients, box, changed_on, deploy, outcome
from thorfleet.cli import conversations
from thorfleet.settings import layout

GATEWAY = "gw-1"
EAGLE, LONG, VISION = "mistral-small-4", "mistral-small-4-256k", "mistral-small-4-vision"
QUESTION = {"type": "text", "text": "What is in this picture?"}


class Door:
    """Clients of the door, asking by model name, with the fleet's key."""

    def __init__(self, endpoint, key):
        url = urlparse(endpoint["url"])
        self.host, self.port, self.key = url.hostname, url.port, key
        self.tls = ssl.create_default_context(cafile=endpoint["ca_file"])

    def send(self, method, path, body: bytes | None = None, timeout=300):
        """(status, JSON answer)."""
        connection = http.client.HTTPSConnection(self.host, self.port, context=self.tls,
                                                 timeout=timeout)
        try:
            connection.request(method, path, body=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
            answer = connection.getresponse()
            return answer.status, json.loads(answer.read() or b"{}")
        finally:
            connection.close()

    def chat(self, model, content="Hello", max_tokens=8, padding=0):
        """A chat as the OpenAI SDK writes it (`model` after the messages); `padding`: that many
        bytes of JSON whitespace before `model`, so the body is large and `model` comes late."""
        messages = json.dumps([{"role": "user", "content": content}])
        body = (f'{{"messages": {messages}, "max_tokens": {max_tokens}, "temperature": 0,'
                f'{" " * padding}"model": {json.dumps(model)}}}').encode()
        return self.send("POST", "/v1/chat/completions", body)


class Load(Clients):
    """A client per model in `models`, chatting one request after another until stopped."""

    def __init__(self, door, models):
        self.door, self.results = door, []
        super().__init__(self._client, [(m,) for m in models])

    def _client(self, model):
        while not self.stopping.is_set():
            try:
                status, answer = self.door.chat(model)
            except OSError as error:
                status, answer = None, {"error": repr(error)}
            self.results.append((model, status, answer.get("model") or answer))

    def failed(self):
        return [r for r in self.results if r[1] != 200]


def sessions(sim_fleet):
    """{box: requests the door ever sent it} (HAProxy's stot per server, every pool)."""
    text = box(sim_fleet, GATEWAY, "echo 'show stat' | socat stdio UNIX-CONNECT:"
                                   "/run/haproxy/admin.sock")
    return {f[1]: int(f[7]) for f in (line.split(",") for line in text.splitlines())
            if len(f) > 7 and f[0].startswith("thors") and f[1] not in ("FRONTEND", "BACKEND")}


def mixed_inventory(sim_fleet, my_boxes, path, **gateway_data):
    eagle_a, eagle_b, long_box = my_boxes
    # the door's certificate names the address the boxes reach it at, so `bench` can run on one
    inventory = sim_fleet.write_inventory(
        path, hosts=[eagle_a, eagle_b, (long_box, {"service_profile": "no-eagle"})],
        gateway=(GATEWAY, {"gateway_names": [sim_fleet.ip(GATEWAY)], **gateway_data}),
        extra_data={"rollout_report_path": str(path.with_suffix(".json")), "rollout_batch": 2,
                    "rollout_canary_group": "canary"})
    with inventory.open("a") as f:  # a canary of each profile
        f.write(f"canary = {[eagle_a, long_box]!r}\n")
    return inventory


@pytest.fixture(scope="module")
def mixed(sim_fleet, my_boxes, tmp_path_factory):
    """The fleet converged mixed under EAGLE load; yields (door, the run, the load's results)."""
    workdir = tmp_path_factory.mktemp("workloads")
    inventory = mixed_inventory(sim_fleet, my_boxes, workdir / "mixed.py")
    key = (sim_fleet.state / "api_key").read_text().strip()
    # the door the earlier stories set up (its report's endpoint): the sim's published port
    door = Door({"url": f"https://127.0.0.1:{GATEWAY_HTTPS_PORT}",
                 "ca_file": str(sim_fleet.state / "fleet-ca" / "fleet-ca.pem")}, key)
    with Load(door, [EAGLE]) as load:
        time.sleep(2)
        run = deploy(inventory)
        time.sleep(2)
    assert run.returncode == 0, run.stderr[-4000:]
    door.inventory = inventory
    return door, run, load


def test_a_mixed_fleet_rolls_a_canary_of_each_profile_and_keeps_a_box_of_each_model(
        sim_fleet, my_boxes, mixed):
    _, run, load = mixed
    _, eagle_b, long_box = my_boxes
    batches = {h: [n for n in changed_on(run, h) if n.startswith("Verification | Batch")]
               for h in my_boxes}
    assert any("Batch 1/" in n for n in batches[long_box]), outcome(run, long_box)
    assert not any("Batch 1/" in n for n in batches[eagle_b]), outcome(run, eagle_b)
    # the EAGLE clients always had a box: not one request failed through the rollout
    assert len(load.results) > 10 and load.failed() == [], load.failed()[:3]


def test_each_request_reaches_only_the_boxes_of_its_model_under_load(sim_fleet, my_boxes, mixed):
    door, _, _ = mixed
    eagle_a, eagle_b, long_box = my_boxes
    before = sessions(sim_fleet)
    with Load(door, [EAGLE, EAGLE, LONG]) as load:
        time.sleep(20)
    after = sessions(sim_fleet)
    asked = {h: after[h] - before.get(h, 0) for h in my_boxes}
    answered = {m: [r for r in load.results if r[0] == m] for m in (EAGLE, LONG)}
    assert load.failed() == [], load.failed()[:3]
    # each answer names the model asked (vLLM answers with the box's first served name)
    assert all(r[2] == r[0] for r in load.results), load.results[:3]
    assert asked[long_box] == len(answered[LONG]) > 3, (asked, len(answered[LONG]))
    assert asked[eagle_a] + asked[eagle_b] == len(answered[EAGLE]), asked
    assert asked[eagle_a] > 0 and asked[eagle_b] > 0, asked


def test_a_request_over_a_megabyte_naming_the_long_model_last_reaches_the_long_box(mixed):
    door, _, _ = mixed
    status, answer = door.chat(LONG, padding=1_100_000)
    assert status == 200 and answer["model"] == LONG, answer


def test_a_model_no_box_serves_is_404_and_the_list_is_the_fleets(mixed):
    door, _, _ = mixed
    status, answer = door.chat("gpt-4o")
    assert status == 404 and answer["error"]["code"] == 404, answer
    assert "/v1/models" in answer["error"]["message"], answer
    status, listed = door.send("GET", "/v1/models")
    assert status == 200 and [m["id"] for m in listed["data"]] == [EAGLE, LONG], listed
    # the old name still works, on the first model's boxes
    status, answer = door.chat("/model")
    assert status == 200 and answer["model"] == EAGLE, answer


def test_bench_runs_vllms_own_benchmark_through_the_door_per_model(sim_fleet, my_boxes, mixed,
                                                                    tmp_path):
    door, _, _ = mixed
    runner = my_boxes[0]  # bench runs on the inventory's first Thor
    out = tmp_path / "bench"
    bench = subprocess.Popen(
        [sys.executable, "-m", "thorfleet", "bench", str(door.inventory), "--out", str(out),
         "--max-concurrency", "1,2", "--num-prompts", "4", "--random-input-len", "16",
         "--random-output-len", "40"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    # while it runs: the key is on no process's command line on the box, and not in the bench
    # container's configuration (docker inspect: Config.Env, Cmd, Args)
    inspected = []
    while bench.poll() is None:
        names = box(sim_fleet, runner, "docker ps --filter name=thorfleet-bench- "
                                       "--format '{{.Names}}'").split()
        processes = box(sim_fleet, runner, "ps -ww -eo args")
        assert door.key not in processes, "the key on a command line on the box"
        for name in names:
            code, shown = sim_fleet.exec(runner, f"docker inspect {name}")
            if code == 0:  # (gone between the two reads: the next run's is read)
                assert door.key not in shown, f"the key in docker inspect {name}"
                inspected.append(name)
        time.sleep(0.5)
    said, log = bench.communicate()
    done = subprocess.CompletedProcess(bench.args, bench.returncode, said, log)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert inspected, "no bench container was seen running: nothing was checked"
    # after it: no file under the box's /tmp holds the key (the pattern read from a root-only
    # file, so grep's own command line does not carry it)
    sim_fleet.put(runner, "/root/bench-key-probe", door.key + "\n")
    code, found = sim_fleet.exec(runner, "grep -rlF -D skip -f /root/bench-key-probe /tmp; "
                                         "rc=$?; rm -f /root/bench-key-probe; exit $rc")
    assert code == 1 and found.strip() == "", (code, found)  # 1: read, and found nowhere
    runs = json.loads((out / "bench.json").read_text())["runs"]
    assert [(r["model_id"], r["max_concurrency"]) for r in runs] == [
        (EAGLE, 1), (EAGLE, 2), (LONG, 1), (LONG, 2)], runs
    for r in runs:  # vLLM's own result keys, every request answered
        assert r["completed"] == 4 and r["failed"] == 0, r
        # every answer its whole 40 tokens (--ignore-eos), past the sim's 28-token chat answer
        assert r["total_output_tokens"] == 4 * 40, r
        assert r["output_throughput"] > 0 and r["p99_ttft_ms"] >= r["median_ttft_ms"] > 0, r
        assert r["median_tpot_ms"] > 0 and r["median_itl_ms"] > 0, r
    # two EAGLE boxes take 2 at once; the one long-context box takes 1, the other waits
    assert [r["queued"] for r in runs] == [0, 0, 0, 1], runs
    assert "1 of 2 requests waited at the door" in done.stdout, done.stdout
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert door.key not in done.stdout + done.stderr  # the key is never shown


# The bench's own first turn (16K tokens): its prefill, modelled on a Thor at ~3.5 s, is what a
# warm turn saves. At 3K the modelled prefill (~0.6 s) is near this machine's own API-server time
# for a turn when four story groups run at once (0.5-0.8 s), and the ratio measured that instead.
# One conversation a box: with two a box of one slot, a turn often finds its home busy with the
# other's 3.5 s prefill and goes to the free box, as it should (a turn never waits for its home).
FIRST = 16000


def test_a_conversation_stays_warm_on_its_box_and_moves_cold_when_the_box_drains(
        sim_fleet, my_boxes, mixed, tmp_path):
    """Issue 52: the door keeps each conversation on the box holding its prefix (affinity, on by
    default), and the box serves its later turns from its prefix cache. `thorfleet bench
    --conversations`: 2 conversations on the 2 EAGLE boxes, each turn resending the whole
    history. Then the box of one is drained as a rollout drains it (thorfleet-rotation): its
    next turn is answered by the other box, cold, and nothing fails."""
    door, _, _ = mixed
    inventory = mixed_inventory(sim_fleet, my_boxes, tmp_path / "affinity.py")
    out = tmp_path / "bench"
    done = subprocess.run(
        [sys.executable, "-m", "thorfleet", "bench", str(inventory), "--out", str(out),
         "--conversations", "2", "--turns", "4", "--first-tokens", str(FIRST), "--grow-tokens", "200",
         "--answer-tokens", "16", "--think-s", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads((out / "conversations.json").read_text())
    rows, summary = result["turns"], result["summary"]
    assert {r["box"] for r in rows} <= set(my_boxes[:2]), rows  # the EAGLE pool's
    # each later turn where the turn before it was, and served from that box's cache
    assert summary["later_turns_on_their_box"] >= 0.9, rows
    later = [r for r in rows if r["turn"] > 1]
    assert sum(r["cached_tokens"] for r in later) >= 0.8 * sum(r["prompt_tokens"] for r in later), rows
    # the prompts as long as asked, within the bench's words-per-token estimate
    assert all(r["prompt_tokens"] >= 0.95 * FIRST for r in rows), rows
    assert summary["later_vs_first_ttft"] < 0.5, summary

    # a new conversation's box drained at the door: its next turn goes to the other box, cold
    client = conversations.Door(f"https://127.0.0.1:{GATEWAY_HTTPS_PORT}/v1",
                                str(sim_fleet.state / "fleet-ca" / "fleet-ca.pem"), door.key)
    first, second = conversations.plan(1, 2, 3000, 200)
    # named for this run (the bench's run id): a box must not hold it from an earlier run
    run = result["run"]
    sent = [conversations.text(99, 1, first.words, run), conversations.text(99, 2, second.words, run)]
    opened = client.ask(EAGLE, conversations.history(sent[:1], []), 16)
    assert "error" not in opened, opened
    home = opened["box"]
    other = next(b for b in my_boxes[:2] if b != home)
    admin = f"socat stdio UNIX-CONNECT:{layout.GATEWAY_ADMIN_SOCKET}"
    backend = next(line.split(",")[0] for line in box(
        sim_fleet, GATEWAY, f"echo 'show stat' | {admin}").splitlines()
        if line.split(",")[1:2] == [home])
    rotation = (f"{layout.GATEWAY_ROTATION} {layout.GATEWAY_ADMIN_SOCKET} "
                f"{layout.GATEWAY_SERVER_STATE}")
    box(sim_fleet, GATEWAY, f"{rotation} drain {backend} {home} 30")
    try:
        moved = client.ask(EAGLE, conversations.history(sent, [opened["answer"]]), 16)
    finally:
        box(sim_fleet, GATEWAY, f"{rotation} ready {backend} {home}")
    assert "error" not in moved, moved
    assert moved["box"] == other, moved
    assert moved["cached_tokens"] < opened["prompt_tokens"] / 2, moved  # cold: its prefix stayed


def picture(url=None):
    """An image_url part: the repository's picture as a data: URL, or `url`."""
    if url is None:
        data = (ROOT / "files" / "thor" / "bin" / "thorfleet-proof.png").read_bytes()
        url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def vision(sim_fleet, my_boxes, mixed, tmp_path_factory):
    """The long-context box turned into a vision box, image URLs allowed from one domain."""
    door, _, _ = mixed
    eagle_a, eagle_b, long_box = my_boxes
    inventory = sim_fleet.write_inventory(
        tmp_path_factory.mktemp("vision") / "vision.py",
        hosts=[eagle_a, eagle_b, (long_box, {"service_profile": "vision",
                                             "service_media_domains": ["images.example.com"],
                                             "service_images_per_prompt": 2})],
        gateway=(GATEWAY, {"gateway_names": [sim_fleet.ip(GATEWAY)]}))
    run = deploy(inventory)
    assert run.returncode == 0, run.stderr[-4000:]
    return door, run


def test_a_vision_box_is_proven_with_a_picture_and_answers_one(my_boxes, vision):
    door, run = vision
    eagle_a, _, long_box = my_boxes
    assert any(n.startswith("Verification | ") for n in changed_on(run, long_box)), \
        outcome(run, long_box)
    assert not any(n.startswith("Verification | Batch") for n in changed_on(run, eagle_a))
    status, seen = door.chat(VISION, [QUESTION, picture()])
    assert status == 200 and seen["model"] == VISION, seen
    status, alone = door.chat(VISION, [QUESTION])
    assert status == 200, alone
    # vLLM took it as an image: 84x56 pixels are 3x2 merged patches, a row end each: 8 tokens
    assert seen["usage"]["prompt_tokens"] == alone["usage"]["prompt_tokens"] + 8, (seen, alone)
    status, listed = door.send("GET", "/v1/models")
    assert [m["id"] for m in listed["data"]] == [EAGLE, VISION], listed


def test_a_text_box_refuses_a_picture_with_a_400(vision):
    door, _ = vision
    status, said = door.chat(EAGLE, [QUESTION, picture()])
    assert status == 400, said
    assert said["error"]["message"] == "At most 0 image(s) may be provided in one prompt.", said


@pytest.mark.parametrize("part, says", [
    (picture("http://10.1.2.3/cat.png"),
     ("The URL must be from one of the allowed domains: ['images.example.com']. Input URL "
      "domain: 10.1.2.3")),
    (picture("data:image/png;base64," + base64.b64encode(b"not a picture").decode()),
     "cannot identify image file"),
])
def test_a_bad_image_is_a_400_and_the_box_still_serves(vision, part, says):
    door, _ = vision
    status, said = door.chat(VISION, [QUESTION, part])
    assert status == 400 and says in said["error"]["message"], said
    status, answer = door.chat(VISION, [QUESTION])
    assert status == 200, answer


def test_images_over_the_limit_are_a_400_and_an_allowed_domain_is_fetched(vision):
    door, _ = vision
    status, said = door.chat(VISION, [QUESTION, picture(), picture(), picture()])
    assert status == 400, said
    assert said["error"]["message"] == "At most 2 image(s) may be provided in one prompt.", said
    # the allowed domain passes the check and the box tries it (the sim has no such host): vLLM
    # 0.19.0's fetch raises aiohttp's connector error, no ValueError, which its handler answers
    # 500 InternalServerError with the error's text (entrypoints/utils.py create_error_response;
    # aiohttp ClientConnectorError.__str__). Any other error (the door's, a 400) is not this.
    status, said = door.chat(VISION, [QUESTION, picture("http://images.example.com/cat.png")])
    assert status == 500 and said["error"]["type"] == "InternalServerError", said
    assert said["error"]["message"].startswith(
        "Cannot connect to host images.example.com:80 ssl:default ["), said
