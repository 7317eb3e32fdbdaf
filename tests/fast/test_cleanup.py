"""Disk hygiene, the box side: files/thor/bin/thorfleet-clean on temporary folders lists what nothing
serves any more and keeps what the live and the last good versions need (issue 12, item 4).
`docker images` is a stand-in script on PATH printing the tags a box has."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

TOOL = ROOT / "files" / "thor" / "bin" / "thorfleet-clean"
NAME = "thorfleet/mistral-small4"
OLD, LAST_GOOD, PINNED, DRAFT = "1" * 40, "2" * 40, "3" * 40, "4" * 40


def unit(model, draft, tag):
    """The lines of a thorfleet-vllm unit that name weights and image, as the template writes them."""
    return (f"ExecStart=/usr/bin/docker run --rm --init --name thorfleet-vllm \\\n"
            f"    -v {model}:/model:ro \\\n    -v {draft}:/eagle:ro \\\n"
            f"    -v /var/cache/thorfleet/vllm:/root/.cache/vllm \\\n"
            f"    {NAME}:{tag} vllm serve /model --config /config/vllm.yaml\n")


@pytest.fixture
def box(tmp_path):
    models, contexts = tmp_path / "models", tmp_path / "image"
    repo, eagle = models / "Mistral-Small-4-119B-2603-NVFP4", models / "Mistral-Small-4-119B-2603-eagle"
    for folder in (repo / OLD, repo / LAST_GOOD, repo / PINNED, repo / f".{PINNED}.partial",
                   repo / f".{OLD}.partial", eagle / DRAFT, models / "operators-own" / OLD,
                   repo / "notes", contexts / "aaaaaaaaaaaa", contexts / "bbbbbbbbbbbb",
                   contexts / "cccccccccccc"):
        folder.mkdir(parents=True)
    live, last_good = tmp_path / "thorfleet-vllm.service", tmp_path / "last-good-unit"
    live.write_text(unit(repo / PINNED, eagle / DRAFT, "aaaaaaaaaaaa"))
    last_good.write_text(unit(repo / LAST_GOOD, eagle / DRAFT, "bbbbbbbbbbbb"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\nprintf '%s\\n' " + " ".join(f"'{NAME}:{t}'" for t in (
            "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd", "<none>")) + "\n")
    (bin_dir / "docker").chmod(0o755)
    args = ["--models", str(models), "--contexts", str(contexts), "--image-name", NAME,
            "--keep-context", "aaaaaaaaaaaa", "--keep-dir", str(repo / PINNED),
            "--keep-dir", str(eagle / DRAFT), "--keep-image", f"{NAME}:aaaaaaaaaaaa",
            "--unit", str(live), "--unit", str(last_good)]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def leftovers(*extra):
        done = subprocess.run([sys.executable, str(TOOL), *args, *extra], env=env,
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    return repo, contexts, leftovers, last_good


def test_only_what_neither_the_live_nor_the_last_good_version_uses_is_listed(box):
    repo, contexts, leftovers, _ = box
    assert leftovers() == {
        # an old revision and its staging; not the pinned one's staging (a cut download resumes),
        # not the last good version's, not folders thorfleet did not name (notes, operators-own)
        "dirs": sorted([str(repo / OLD), str(repo / f".{OLD}.partial")]),
        "images": [f"{NAME}:cccccccccccc", f"{NAME}:dddddddddddd"],
        "contexts": [str(contexts / "bbbbbbbbbbbb"), str(contexts / "cccccccccccc")]}


def test_without_a_last_good_copy_its_weights_and_image_go_too(box):
    repo, _, leftovers, last_good = box
    last_good.unlink()
    found = leftovers()
    assert str(repo / LAST_GOOD) in found["dirs"] and f"{NAME}:bbbbbbbbbbbb" in found["images"]


def test_nothing_installed_yet_lists_nothing(tmp_path):
    done = subprocess.run([sys.executable, str(TOOL), "--models", str(tmp_path / "no"),
                           "--contexts", str(tmp_path / "none"), "--image-name", NAME,
                           "--keep-context", "a" * 12, "--unit", str(tmp_path / "no-unit")],
                          env={**os.environ, "PATH": "/nonexistent"}, capture_output=True, check=False,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"dirs": [], "images": [], "contexts": []}
