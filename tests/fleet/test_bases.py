"""The base moves on (issue 22): a fleet on the Jetson 0.19.0 base moved to the upstream
vllm/vllm-openai:v0.26.0 base, as an operator does it, through the canary; then the newest
release, v0.33.0, checked on one box first.

The operator converges two boxes on the 0.19.0 base, then points image_base at a newer base with
the first box as the canary, one box at a time:
- first a build of the 0.26.0 image without FlashInfer: the canary builds, starts and fails its
  proof (vLLM picks vLLM's CUTLASS NVFP4 kernels, not FLASHINFER_CUTLASS), is rolled back to the
  0.19.0 version and serves it; the other is never restarted into it;
- then the 0.26.0 image itself: the canary proves it and the other follows. Each box serves the
  derived image whose label says what each patch was on that base (applied, or skipped because
  vLLM 0.26.0 or transformers 5 has the fix), the report says it too; streamed tool calls arrive
  as tool_calls, the reasoning split holds, every route but the liveness ones answers 401 without
  the key;
- then 0.33.0 on the canary alone (image_base in its host data, as the README says to check a new
  base): it builds, proves and serves with 0.33.0's verdicts in its label, the other is left
  alone; a re-run changes nothing.

The edits that break it: the proof's GEMM rule reading only 0.19.0's log line (the 0.26.0 canary
fails); a patch applied without its shape guard (the build refuses 0.26.0's code); a rollout that
does not stop at the canary (the other restarts into the FlashInfer-less base); the proof reading
the rendered prompt through /v1/chat/completions/render (403 on 0.33.0).

Uses boxes 13 and 14 (a group of their own). Two boxes, not three: what a canary holds back is
the same for one box behind it as for two, and a rollout of several boxes one at a time is
test_rollout's story; a third box here cost a first converge, two server starts and two image
loads (issue 32).
"""

import concurrent.futures
import json

import pytest

from sim import fleet as sim
from tests.helpers import SERVICE, box, changed_on, deploy, outcome

KEY_FILE = "/etc/thorfleet/secrets.env"


@pytest.fixture(scope="module")
def building(sim_fleet):
    """The stand-in bases, built (or found cached) while the first install runs: on a fresh
    machine each is minutes of wheels and build that need no box."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        yield pool.submit(sim.bases)  # its own Docker client: the SDK's is not shared by threads


@pytest.fixture(scope="module")
def bases(building):
    """{name: the in-sim reference by digest} of every stand-in base, pushed to the registry."""
    return {name: ref for name, ref, _ in building.result()}


@pytest.fixture(scope="module")
def moved(sim_fleet, my_boxes, tmp_path_factory, building):
    workdir = tmp_path_factory.mktemp("bases")

    def run(name, hosts=None, **group_data):
        report = workdir / f"{name}-report.json"
        inventory = sim_fleet.write_inventory(
            workdir / f"{name}.py", hosts=hosts or my_boxes,
            extra_data={"rollout_report_path": str(report), "rollout_canary_group": "canary",
                        "rollout_batch": 1, **group_data})
        with inventory.open("a") as f:
            f.write(f"canary = {[my_boxes[0]]!r}\n")
        done = deploy(inventory)
        return done, json.loads(report.read_text())["hosts"] if report.exists() else None

    first, _ = run("converge")
    assert first.returncode == 0, outcome(first, my_boxes[0])
    # a first install without a registry builds the image once (the run's first host); the
    # others load it from there (on a kept fleet, where they have it, nobody does anything)
    built = [h for h in my_boxes if any(op.startswith("Image | Build")
                                        for op in changed_on(first, h))]
    loaded = [h for h in my_boxes if any(op.startswith("Image | Load")
                                         for op in changed_on(first, h))]
    assert (built, loaded) in (([my_boxes[0]], my_boxes[1:]), ([], [])), (built, loaded)
    if built:  # each load took the image, not the build it falls back to
        assert first.stderr.count("==> built ") == 1, first.stderr[-4000:]
        assert first.stderr.count("thorfleet-image: loaded ") == len(my_boxes) - 1, \
            first.stderr[-4000:]
    # No way back to 0.19.0 after: no other story uses these boxes, and a kept fleet's next
    # converge is then a rollout back, which the canary proves like any other.
    return run


def serving_image(sim_fleet, host):
    unit = box(sim_fleet, host, f"cat /etc/systemd/system/{SERVICE}.service")
    return next(word for word in unit.split() if word.startswith("thorfleet/mistral-small4:"))


def on_box(sim_fleet, host, path, body=None, key=True):
    """(HTTP status, body) of a request to the box's own vLLM, the key read from its root-only
    secrets file into a root-only header file (never on a command line)."""
    data = f"-H 'Content-Type: application/json' -d '{json.dumps(body)}'" if body else ""
    header = ('printf "Authorization: Bearer %s\\n" "$VLLM_API_KEY" > "$h"; ' if key else "")
    code, out = sim_fleet.exec(host, (
        f"set -a; . {KEY_FILE}; set +a; umask 077; h=$(mktemp); {header}"
        f"curl -sS -N -m 60 -H @\"$h\" {data} -w '\\n%{{http_code}}' "
        f"http://127.0.0.1:8002{path}; c=$?; rm -f \"$h\"; exit $c"), timeout=90)
    assert code == 0, out
    text, _, status = out.rstrip().rpartition("\n")
    return int(status), text


def test_a_fleet_moves_to_the_newer_base_through_its_canary(sim_fleet, my_boxes, moved, bases):
    canary, others = my_boxes[0], my_boxes[1:]
    old = {h: serving_image(sim_fleet, h) for h in my_boxes}
    proven = {h: box(sim_fleet, h, "cat /var/lib/thorfleet/proven-fingerprint") for h in my_boxes}

    # A base the proof rejects: rolled back on the canary, nobody else restarted into it.
    done, report = moved("no-flashinfer", image_base=bases["upstream-0.26.0-no-flashinfer"])
    assert done.returncode != 0
    assert "FLASHINFER_CUTLASS NVFP4" in report[canary]["error"], report[canary]["error"]
    assert "CutlassNvFp4LinearKernel" in report[canary]["error"], report[canary]["error"]
    assert box(sim_fleet, canary, "cat /var/lib/thorfleet/proven-fingerprint") == proven[canary]
    assert serving_image(sim_fleet, canary) == old[canary]
    assert report[canary]["health"] and report[canary]["chat"]
    for host in others:
        assert serving_image(sim_fleet, host) == old[host], f"{host} runs the unproven base"
        assert "not restarted" in report[host]["error"], report[host]["error"]

    # The 0.26.0 base: the canary proves it, the others follow, one at a time.
    done, report = moved("upstream-0.26.0", image_base=bases["upstream-0.26.0"])
    assert done.returncode == 0, outcome(done, canary)
    new = {h: serving_image(sim_fleet, h) for h in my_boxes}
    assert len(set(new.values())) == 1 and set(new.values()).isdisjoint(old.values()), new
    # one build, on the canary (the run's first host); the others loaded it from there
    assert [h for h in my_boxes if any(op.startswith("Image | Build")
                                       for op in changed_on(done, h))] == [canary]
    assert done.stderr.count("==> built ") == 1, done.stderr[-4000:]
    assert done.stderr.count("thorfleet-image: loaded ") == len(others), done.stderr[-4000:]
    label = box(sim_fleet, canary, "docker inspect --format "
                "'{{index .Config.Labels \"thorfleet.patches\"}}' " + new[canary])
    assert "skipped" in label and "applied" in label, label
    assert all(report[h]["patches"] == label and not report[h]["error"] for h in my_boxes), report

    serves_as_a_newer_base_should(sim_fleet, others[-1])

    # The newest base, checked on one box first as the README says (image_base for that host
    # alone): the canary builds it, proves it and serves it; the others stay on 0.26.0.
    done, report = moved("upstream-0.33.0", image_base=bases["upstream-0.26.0"],
                         hosts=[(canary, {"image_base": bases["upstream-0.33.0"]}), *others])
    assert done.returncode == 0, outcome(done, canary)
    assert all(changed_on(done, h) == [] for h in others), [changed_on(done, h) for h in others]
    newest = serving_image(sim_fleet, canary)
    assert newest not in (new[canary], old[canary]), newest
    assert {h: serving_image(sim_fleet, h) for h in others} == {h: new[h] for h in others}
    label = box(sim_fleet, canary, "docker inspect --format "
                "'{{index .Config.Labels \"thorfleet.patches\"}}' " + newest)
    assert label == NEWEST_PATCHES, label
    assert report[canary]["patches"] == label and not report[canary]["error"], report[canary]
    serves_as_a_newer_base_should(sim_fleet, canary)

    # a re-run changes nothing, on either base
    again, _ = moved("again", image_base=bases["upstream-0.26.0"],
                     hosts=[(canary, {"image_base": bases["upstream-0.33.0"]}), *others])
    assert all(changed_on(again, h) == [] for h in my_boxes), \
        [changed_on(again, h) for h in my_boxes]


# What each patch is on vLLM 0.33.0 (files/image/chatfix.py): transformers 5 takes
# reasoning_effort, and 0.33.0 streams every delta through its parser engine, which ends reasoning
# at [TOOL_CALLS] and ends a tool call without reading what it never filled; the think prefill, the key on every route (the middleware moved again) and the
# split of a trace the prompt opened are still thorfleet's.
NEWEST_PATCHES = ("vllm-reasoning-effort=skipped,transformers-reasoning-effort=skipped,"
                  "think-prefill=applied,api-key-every-route=applied,"
                  "streamed-tool-calls=skipped,streamed-tool-call-end=skipped,"
                  "reasoning-split=applied")


def serves_as_a_newer_base_should(sim_fleet, host):
    """What the proof reads, asked again from outside it: streamed tool calls, the reasoning
    split, cached prompt tokens, the key on every route but the liveness ones."""
    # streamed tool calls arrive as tool_calls (the newer vLLM's own parser)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    # (temperature 0: the stand-in sometimes answers in words at a higher one, as a model may)
    status, text = on_box(sim_fleet, host, "/v1/chat/completions", {
        "model": "/model", "stream": True, "tools": [tool], "tool_choice": "auto",
        "temperature": 0, "max_tokens": 64,
        "messages": [{"role": "user", "content": "Weather in Paris? Use the tool."}]})
    assert status == 200 and '"tool_calls"' in text and "[TOOL_CALLS]" not in text, text[-2000:]
    # the reasoning split: a trace the prompt opened comes back apart from the answer
    status, text = on_box(sim_fleet, host, "/v1/chat/completions", {
        "model": "/model", "reasoning_effort": "high", "max_tokens": 1024, "temperature": 0,
        "messages": [{"role": "user", "content": "Why is the sky blue?"}]})
    message = json.loads(text)["choices"][0]["message"]
    assert status == 200 and (message.get("reasoning") or message.get("reasoning_content")), text
    assert "[/THINK]" not in (message.get("content") or ""), text
    # prefix caching (on in the default profile): the same long prompt again reports its cached
    # tokens where this vLLM reports them (0.26.0 moved them to the first token's prefill_stats)
    long = {"model": "/model", "prompt": "The sky is blue because " * 60, "max_tokens": 2,
            "temperature": 0}
    for _ in range(2):
        status, text = on_box(sim_fleet, host, "/v1/completions", long)
    details = json.loads(text)["usage"].get("prompt_tokens_details") or {}
    assert status == 200 and details.get("cached_tokens", 0) >= 16, text
    # the key on every route but the liveness ones (the patch's allowlist)
    prompt = {"model": "/model", "prompt": "hi"}
    for path, body in (("/v1/models", None), ("/invocations", prompt), ("/tokenize", prompt)):
        assert on_box(sim_fleet, host, path, body, key=False)[0] == 401, path
        assert on_box(sim_fleet, host, path, body)[0] != 401, path
    for path in ("/health", "/version", "/metrics"):
        assert on_box(sim_fleet, host, path, key=False)[0] == 200, path

