"""The box-side weights verifier on a temporary folder: huggingface_hub's local-dir metadata in,
a verdict out, no network (FACTS.md, "Weights": commit + etag per file, sha256 for LFS files)."""

import hashlib
import json
import subprocess
import sys

import pytest

from tests.deploy_run import ROOT

pytestmark = pytest.mark.fast

TOOL = ROOT / "files" / "bin" / "thorfleet-weights"
REVISION = "4" * 40


def checkpoint(folder, files, revision=REVISION):
    """A folder as `hf download --local-dir` leaves it, plus the manifest thorfleet writes."""
    manifest = {}
    for name, data in files.items():
        (folder / name).write_bytes(data)
        if name.endswith(".safetensors"):
            etag = hashlib.sha256(data).hexdigest()  # LFS: the etag is the sha256
        else:
            etag = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git blob sha1
        meta = folder / ".cache" / "huggingface" / "download" / f"{name}.metadata"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(f"{revision}\n{etag}\n1700000000.0\n")
        manifest[name] = [revision, etag]
    (folder / ".thorfleet").mkdir()
    (folder / ".thorfleet" / "manifest.json").write_text(json.dumps(manifest))
    return folder


FILES = {
    "params.json": b'{"dim": 4096}',
    "consolidated.safetensors.index.json": json.dumps(
        {"metadata": {"total_size": 66000000000},
         "weight_map": {"a": "consolidated-00001-of-00002.safetensors",
                        "b": "consolidated-00002-of-00002.safetensors"}}).encode(),
    "consolidated-00001-of-00002.safetensors": b"\x01" * 1000,
    "consolidated-00002-of-00002.safetensors": b"\x02" * 1000,
}


def verify(folder, revision=REVISION):
    done = subprocess.run([sys.executable, str(TOOL), "verify", "--dir", str(folder),
                           "--revision", revision], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_complete_checkpoint_verifies(tmp_path):
    assert verify(checkpoint(tmp_path, FILES)) == {"complete": True, "problems": []}


def test_a_damaged_shard_is_named(tmp_path):
    folder = checkpoint(tmp_path, FILES)
    (folder / "consolidated-00002-of-00002.safetensors").write_bytes(b"\x03" * 1000)
    result = verify(folder)
    assert not result["complete"]
    assert result["problems"] == [
        ("consolidated-00002-of-00002.safetensors: content does not match its sha256 "
        f"{hashlib.sha256(FILES['consolidated-00002-of-00002.safetensors']).hexdigest()[:12]}…")]


def test_a_shard_the_index_names_but_the_manifest_lacks_is_missing(tmp_path):
    files = {k: v for k, v in FILES.items() if k != "consolidated-00002-of-00002.safetensors"}
    result = verify(checkpoint(tmp_path, files))
    assert result["problems"] == [
        "consolidated-00002-of-00002.safetensors: named by the index but missing"]


def test_another_revision_is_not_complete(tmp_path):
    result = verify(checkpoint(tmp_path, FILES), revision="0" * 40)
    assert not result["complete"] and all("from commit 444444444444" in p for p in result["problems"])


def test_an_unfinished_download_is_not_complete(tmp_path):
    folder = checkpoint(tmp_path, FILES)
    (folder / ".cache" / "huggingface" / "download" / "x.incomplete").write_bytes(b"")
    assert verify(folder)["problems"] == ["x.incomplete: unfinished download"]


def test_a_folder_never_downloaded(tmp_path):
    assert verify(tmp_path / "nope")["problems"] == ["not downloaded"]
