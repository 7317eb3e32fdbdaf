# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""The chat-template patches, against the real packages (vLLM 0.19.0, transformers 4.57.3,
mistral_common 1.11.0 from PyPI) in the stand-in base image, with the v15 test tokenizer.

The operator's story: the base image fails every chat request; build-image.sh plans, patches and
self-checks a derived image in which chat works, reasoning_effort is honoured and labelled; a base
that moved on is either left alone (already fixed) or refused loudly at build time.
"""

import contextlib

import docker.errors
import pytest

from tests.sim.base.testing import base_image, derive, docker_client, render, variant  # noqa: F401

# What transformers 4.57.3 raises for the keyword vLLM 0.19.0 always passes (FACTS.md); the
# real message quotes the method name in backticks.
KWARGS_ERROR = ("ValueError: Kwargs ['reasoning_effort'] are not supported by "
                "`MistralCommonTokenizer.apply_chat_template`.")
HIGH_SETTINGS = '[MODEL_SETTINGS]{"reasoning_effort": "high"}[/MODEL_SETTINGS]'
ALL_APPLIED = ("vllm-reasoning-effort=applied,transformers-reasoning-effort=applied,"
               "think-prefill=applied")


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
def patched(images, base_image):
    tag, code, output = images(base_image, "patched", labels=["thorfleet.test=1"])
    assert code == 0, output
    return tag, output


def labels(client, tag: str) -> dict:
    return client.images.get(tag).labels


def test_unpatched_base_refuses_every_chat_request(docker_client, base_image):
    rendered = render(docker_client, base_image)
    for case in ("absent", "none", "high", "tools"):
        assert rendered[case] == {"ok": False, "error": KWARGS_ERROR}, case


def test_build_plans_patches_and_labels_the_image(docker_client, patched):
    tag, output = patched
    assert "found vllm 0.19.0, transformers 4.57.3, mistral_common 1.11.0" in output
    assert "self-check passed" in output
    assert labels(docker_client, tag)["thorfleet.patches"] == ALL_APPLIED
    assert labels(docker_client, tag)["thorfleet.test"] == "1"  # the deploy's own --label flags


def test_patched_image_honours_reasoning_effort(docker_client, patched):
    rendered = render(docker_client, patched[0])
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


def test_patched_image_refuses_an_unknown_effort_clearly(docker_client, patched):
    unknown = render(docker_client, patched[0])["unknown"]
    assert not unknown["ok"]
    assert "reasoning_effort" in unknown["error"] and "'none' or 'high'" in unknown["error"]


def test_think_prefill_is_a_build_option(docker_client, images, base_image):
    tag, code, output = images(base_image, "no-think", think_prefill=False)
    assert code == 0, output
    assert labels(docker_client, tag)["thorfleet.patches"].endswith("think-prefill=off")
    high = render(docker_client, tag)["high"]["text"]
    assert HIGH_SETTINGS in high and "[THINK]" not in high


def test_transformers_5_base_keeps_its_own_fix(docker_client, images, base_image):
    base5 = variant(docker_client, base_image, "transformers5")
    tag, code, output = images(base5, "transformers5")
    assert code == 0, output
    assert "skip  transformers-reasoning-effort: transformers 5.24.0" in output
    assert labels(docker_client, tag)["thorfleet.patches"] == (
        "vllm-reasoning-effort=applied,transformers-reasoning-effort=skipped,"
        "think-prefill=applied")
    rendered = render(docker_client, tag)
    for case in ("absent", "none", "high", "tools"):
        assert rendered[case]["ok"], rendered[case]
    assert HIGH_SETTINGS in rendered["high"]["text"]
    assert rendered["high"]["text"].endswith("[THINK]")


def test_rebuilding_on_a_patched_image_stands_aside(docker_client, images, patched):
    tag, code, output = images(patched[0], "again")
    assert code == 0, output
    assert labels(docker_client, tag)["thorfleet.patches"].startswith(
        "vllm-reasoning-effort=skipped,transformers-reasoning-effort=skipped")


@pytest.mark.parametrize("name, expected", [
    ("moved-code", [
        "vllm-reasoning-effort: vllm/tokenizers/mistral.py (vllm 0.19.0) no longer has the code",
        '|             version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort")',
        'version_kwargs["reasoning_effort"] = kwargs.get("reasoning_effort", None)',
    ]),
    ("vllm-0.20", ["found vllm 0.20.0, expected vllm~=0.19.0"]),
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
