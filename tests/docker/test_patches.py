# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""The derived image's patches, against the real packages (vLLM 0.19.0, transformers 4.57.3,
mistral_common 1.11.0 from PyPI) in the stand-in base image, with the v15 test tokenizer.

The operator's story: the base image fails every chat request; build-image.sh plans (text only),
patches (text + py_compile only), self-checks the image under the nvidia runtime and only then
tags a derived image in which chat works, reasoning_effort is honoured and labelled, and the API
key guards every route. A base that moved on is built when its code has the shapes the patches
expect, whatever its version string, left alone where already fixed, and refused loudly when its
code moved. A Jetson's `docker build` has no nvidia runtime (docs/facts.md "Thor realities"), so
nothing in plan or build may import vLLM, transformers or torch.
"""

import contextlib
import json
import subprocess

import docker.errors
import pytest

from sim.base import IMAGE_CONTEXT
from sim.base.testing import base_image, derive, docker_client, variant  # noqa: F401

# What transformers 4.57.3 raises for the keyword vLLM 0.19.0 always passes (docs/facts.md "The
# chat-template bug"); the real message quotes the method name in backticks.
KWARGS_ERROR = ("ValueError: Kwargs ['reasoning_effort'] are not supported by "
                "`MistralCommonTokenizer.apply_chat_template`.")
HIGH_SETTINGS = '[MODEL_SETTINGS]{"reasoning_effort": "high"}[/MODEL_SETTINGS]'
ALL_APPLIED = ("vllm-reasoning-effort=applied,transformers-reasoning-effort=applied,"
               "think-prefill=applied,api-key-every-route=applied,streamed-tool-calls=applied,"
               "streamed-tool-call-end=applied,reasoning-split=applied")
NVIDIA = "nvidia"  # the runtime that mounts libcuda.so.1 (docs/facts.md "Thor realities")


def render(client, image: str) -> dict:
    """`chatfix.py render` in a throwaway container under the nvidia runtime (vLLM imports torch,
    which needs libcuda.so.1): each case through vLLM's own MistralTokenizer.apply_chat_template,
    with the v15 test tokenizer."""
    out = client.containers.run(
        image, ["python3", "/ctx/chatfix.py", "render"], remove=True, network_mode="none",
        runtime=NVIDIA, volumes={str(IMAGE_CONTEXT): {"bind": "/ctx", "mode": "ro"}},
        stderr=False)
    return json.loads(out.decode().strip().splitlines()[-1])


def candidate_tags(client, tag: str) -> list[str]:
    """The temporary tags build-image.sh gives its builds of `tag`:
    thorfleet-candidate:<cksum of tag>-<pid>."""
    crc = subprocess.run(["cksum"], input=tag, capture_output=True, text=True,
                         check=True).stdout.split()[0]
    return [t for image in client.images.list("thorfleet-candidate") for t in image.tags
            if t.startswith(f"thorfleet-candidate:{crc}-")]


@pytest.fixture(scope="module")
def images(docker_client, base_image):
    """Derived images built during this module; removed at the end."""
    made = []

    def build(base, name, **kwargs):
        tag = f"thorfleet-test/chat:{name}"
        made.append(tag)
        return tag, *derive(base, tag, **kwargs)

    yield build
    for tag in made:
        with contextlib.suppress(docker.errors.ImageNotFound):  # a failed build left no tag
            docker_client.images.remove(tag, force=True)


@pytest.fixture(scope="module")
def patched(images, base_image, docker_client):
    # candidates a build killed half-way left earlier are not this build's to clean up
    earlier = candidate_tags(docker_client, "thorfleet-test/chat:patched")
    tag, code, output = images(base_image, "patched", labels=["thorfleet.test=1"])
    assert code == 0, output
    return tag, output, earlier


@pytest.fixture(scope="module")
def patched_rendered(patched, docker_client) -> dict:
    """The patched image's render, read by the stories below (one container importing vLLM)."""
    return render(docker_client, patched[0])


def labels(client, tag: str) -> dict:
    return client.images.get(tag).labels


def test_unpatched_base_refuses_every_chat_request(docker_client, base_image):
    rendered = render(docker_client, base_image)
    for case in ("absent", "none", "high", "tools"):
        assert rendered[case] == {"ok": False, "error": KWARGS_ERROR}, case


def test_build_plans_patches_and_labels_the_image(docker_client, patched):
    tag, output, earlier = patched
    assert "found vllm 0.19.0, transformers 4.57.3, mistral_common 1.11.0" in output
    assert "self-check passed" in output
    assert "under the nvidia runtime" in output
    assert labels(docker_client, tag)["thorfleet.patches"] == ALL_APPLIED
    assert labels(docker_client, tag)["thorfleet.test"] == "1"  # the deploy's own --label flags
    assert candidate_tags(docker_client, tag) == earlier  # its temporary tag is gone


# Run chatfix.py's plan and apply as the build runs them, then list which of these were imported.
NEVER_IMPORTED = ("vllm", "transformers", "torch", "mistral_common", "fastapi")
WATCH_IMPORTS = f"""
import runpy, sys
sys.argv = ["chatfix.py", sys.argv[1], "--think-prefill", "1"]
try:
    runpy.run_path("/ctx/chatfix.py", run_name="__main__")
except SystemExit as done:
    assert not done.code, done.code
print("IMPORTED", sorted({{m.split(".")[0] for m in sys.modules}} & set({NEVER_IMPORTED!r})))
"""


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_plan_and_build_import_nothing_that_needs_a_gpu(docker_client, base_image, command):
    """A Jetson's `docker build` (and a plain `docker run`) has no libcuda.so.1, so importing
    torch, and with it vLLM, fails there: planning and patching read and write text only."""
    out = docker_client.containers.run(
        base_image, ["python3", "-c", WATCH_IMPORTS, command], remove=True, network_mode="none",
        volumes={str(IMAGE_CONTEXT): {"bind": "/ctx", "mode": "ro"}}, stderr=True).decode()
    assert "IMPORTED []" in out, out


def test_a_plain_run_of_the_base_cannot_import_torch(docker_client, base_image):
    """The base is Jetson-like: a build step that imported torch would have failed. The derived
    image's own build passing (above) therefore proves it never imported it."""
    with pytest.raises(docker.errors.ContainerError) as failed:
        docker_client.containers.run(base_image, ["python3", "-c", "import torch"], remove=True,
                                     network_mode="none")
    assert "libcuda.so.1" in failed.value.stderr.decode(errors="replace")
    out = docker_client.containers.run(
        base_image, ["python3", "-c", "import torch, vllm.tokenizers.mistral; print('ok')"],
        remove=True, network_mode="none", runtime=NVIDIA).decode()
    assert "ok" in out


@pytest.mark.parametrize("version, version_tuple", [
    ("0.19.1.dev3+g1234abc", '(0, 19, 1, "dev3", "g1234abc")'),  # docs/facts.md "Thor realities":
    ("0.19.0rc2", '(0, 19, 0, "rc2")'),  # ~=0.19.0 rejects both of these under packaging 24.x
    ("0.20.0", "(0, 20, 0)"),  # a newer version with 0.19.0's code shape builds too
])
def test_a_base_with_another_version_string_but_the_same_code_builds(
        docker_client, images, base_image, version, version_tuple):
    base = variant(docker_client, base_image, "vllm-version", VERSION=version,
                   VERSION_TUPLE=version_tuple)
    tag, code, output = images(base, f"vllm-{version.replace('+', '-')}")
    assert code == 0, output
    assert f"found vllm {version}, transformers 4.57.3" in output
    assert "self-check passed" in output
    assert labels(docker_client, tag)["thorfleet.patches"] == ALL_APPLIED
    rendered = render(docker_client, tag)
    assert HIGH_SETTINGS in rendered["high"]["text"]
    assert rendered["high"]["text"].endswith("[THINK]")


def test_patched_image_honours_reasoning_effort(patched_rendered):
    rendered = patched_rendered
    for case in ("absent", "none", "high", "tools", "tools-high"):
        assert rendered[case]["ok"], rendered[case]
    high = rendered["high"]["text"]
    assert HIGH_SETTINGS in high
    assert high.endswith("[/INST][THINK]"), high  # the think block is opened, once
    for case in ("absent", "none"):
        assert "[THINK]" not in rendered[case]["text"]
        assert '"reasoning_effort": "high"' not in rendered[case]["text"]
    assert "[AVAILABLE_TOOLS]" in rendered["tools"]["text"]
    assert "get_weather" in rendered["tools"]["text"]
    assert HIGH_SETTINGS in rendered["tools-high"]["text"]


def test_patched_image_refuses_an_unknown_effort_clearly(patched_rendered):
    unknown = patched_rendered["unknown"]
    assert not unknown["ok"]
    assert "reasoning_effort" in unknown["error"] and "'none' or 'high'" in unknown["error"]


def test_think_prefill_is_a_build_option(docker_client, images, base_image):
    tag, code, output = images(base_image, "no-think", think_prefill=False)
    assert code == 0, output
    assert {"think-prefill=off", "reasoning-split=off"} <= set(
        labels(docker_client, tag)["thorfleet.patches"].split(","))
    high = render(docker_client, tag)["high"]["text"]
    assert HIGH_SETTINGS in high and "[THINK]" not in high


def test_transformers_5_base_keeps_its_own_fix(docker_client, images, base_image):
    base5 = variant(docker_client, base_image, "transformers5")
    tag, code, output = images(base5, "transformers5")
    assert code == 0, output
    assert "skip  transformers-reasoning-effort: transformers 5.24.0" in output
    # the bug is the pair: transformers 5 takes the None vLLM 0.19.0 passes on, so vLLM's side
    # needs nothing either
    assert "skip  vllm-reasoning-effort: transformers 5.24.0" in output
    assert labels(docker_client, tag)["thorfleet.patches"] == (
        "vllm-reasoning-effort=skipped,transformers-reasoning-effort=skipped,"
        "think-prefill=applied,api-key-every-route=applied,streamed-tool-calls=applied,"
        "streamed-tool-call-end=applied,reasoning-split=applied")
    rendered = render(docker_client, tag)
    for case in ("absent", "none", "high", "tools"):
        assert rendered[case]["ok"], rendered[case]
    assert HIGH_SETTINGS in rendered["high"]["text"]
    assert rendered["high"]["text"].endswith("[THINK]")


def test_rebuilding_on_a_patched_image_stands_aside(docker_client, images, patched):
    tag, code, output = images(patched[0], "again")
    assert code == 0, output
    assert labels(docker_client, tag)["thorfleet.patches"] == (
        "vllm-reasoning-effort=skipped,transformers-reasoning-effort=skipped,"
        "think-prefill=skipped,api-key-every-route=skipped,streamed-tool-calls=skipped,"
        "streamed-tool-call-end=skipped,reasoning-split=applied")  # a plugin, not a diff: copied
    # in again, the base unchanged
    assert "skip  api-key-every-route: the base already carries this patch" in output
    assert "skip  streamed-tool-calls: the base already carries this patch" in output


@pytest.mark.parametrize("name, expected", [
    ("moved-code", [
        "vllm-reasoning-effort: vllm/tokenizers/mistral.py (vllm 0.19.0) no longer has the code",
        '|             version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort")',
        'version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort", None)',
    ]),
    ("breaks-at-import", [
        "RuntimeError: thorfleet test: this vLLM breaks at import",
        "the built image failed its self-check",
    ]),
])
def test_a_base_that_no_longer_fits_fails_the_build(docker_client, images, base_image, name,
                                                     expected):
    moved = variant(docker_client, base_image, name)
    tag = f"thorfleet-test/chat:{name}"
    docker_client.images.get(base_image).tag(tag)  # stands for the image a previous build made
    before = docker_client.images.get(tag).id
    _, code, output = images(moved, name)
    assert code != 0
    for text in expected:
        assert text in output, output
    assert "left as it was" in output
    assert docker_client.images.get(tag).id == before
    assert candidate_tags(docker_client, tag) == []
