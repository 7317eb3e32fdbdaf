"""The box-side weights tool on temporary folders.

verify: huggingface_hub's local-dir metadata in, a verdict out, no network (docs/facts.md,
"Weights": commit + etag per file, sha256 for LFS files). fetch: the real huggingface_hub against
the sim's stand-in hub (sim/hub/server.py, stdlib only) run as a local process, no Docker: what
lands in the folder the server mounts, what stays in staging, what is fetched again.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import time

import pytest

from sim.hub import DRAFT_REPO, MODEL_REPO, HubFaults, build_repos
from tests.helpers import ROOT

TOOL = ROOT / "files" / "thor" / "bin" / "thorfleet-weights"
REVISION = "4" * 40


def checkpoint(folder, files, revision=REVISION):
    """A folder as `hf download --local-dir` leaves it, plus the manifest thorfleet writes."""
    folder.chmod(0o755)  # pytest's own folders are 0700; a checkpoint's is everyone's to read
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


# --- fetch, against the stand-in hub ------------------------------------------------------------

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The sim's stand-in hub on 127.0.0.1 (a free port): (endpoint, {repo: pinned revision})."""
    root = tmp_path_factory.mktemp("hub")
    pins = build_repos(root)
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "sim" / "hub" / "server.py"), "--root", str(root),
         "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, text=True)
    port = server.stdout.readline().rsplit(":", 1)[1].strip()  # "... serving ROOT on HOST:PORT"
    endpoint = f"http://127.0.0.1:{port}"
    yield endpoint, pins
    server.terminate()
    server.wait(timeout=10)


def fetch(hub, folder, repo=DRAFT_REPO, revision=None):
    endpoint, pins = hub
    env = {**os.environ, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, str(TOOL), "fetch", "--dir", str(folder), "--repo", repo,
                           "--revision", revision or pins[repo], "--endpoint", endpoint,
                           "--progress-every", "10"],
                          capture_output=True, text=True, timeout=120, check=False, env=env)


def fetched(hub):
    """Paths of the repo files the hub sent a body for since the last call (API calls aside)."""
    faults = HubFaults(hub[0])
    sent = [r["path"] for r in faults.requests()
            if r["method"] == "GET" and r.get("bytes") and not r["path"].startswith("/api/")]
    faults.forget_requests()
    return sent


def test_fetch_puts_a_verified_folder_in_place_whole(hub, tmp_path):
    folder = tmp_path / "eagle" / hub[1][DRAFT_REPO]
    done = fetch(hub, folder)
    assert done.returncode == 0, done.stderr
    assert verify(folder, hub[1][DRAFT_REPO]) == {"complete": True, "problems": []}
    assert not (folder.parent / f".{folder.name}.partial").exists()  # staging renamed into place
    assert "complete and verified" in done.stderr
    fetched(hub)
    assert fetch(hub, folder).returncode == 0 and fetched(hub) == []  # complete: nothing fetched


def test_fetch_of_a_damaged_folder_fetches_only_the_damaged_file(hub, tmp_path):
    revision = hub[1][MODEL_REPO]
    folder = tmp_path / "model" / revision
    assert fetch(hub, folder, MODEL_REPO).returncode == 0
    shard = folder / "consolidated-00004-of-00013.safetensors"
    kept = folder / "consolidated-00005-of-00013.safetensors"
    inode = kept.stat().st_ino
    shard.write_bytes(b"\0" * shard.stat().st_size)  # same size, other bytes
    fetched(hub)
    done = fetch(hub, folder, MODEL_REPO)
    assert done.returncode == 0, done.stderr
    assert [p.rsplit("/", 1)[-1] for p in fetched(hub)] == [shard.name]
    assert kept.stat().st_ino == inode  # the good files were never replaced
    assert verify(folder, revision)["complete"]


def test_a_failed_download_leaves_the_folder_alone_and_keeps_what_finished(hub, tmp_path):
    # (a connection cut mid-file is resumed by huggingface_hub itself, after 1 s pauses: the
    # fleet's fault stories cover it; a refusal fails the download at once)
    revision = hub[1][MODEL_REPO]
    folder = tmp_path / "model" / revision
    staging = folder.parent / f".{folder.name}.partial"
    faults = HubFaults(hub[0])
    with faults.injected("404", path="consolidated-00013-of-00013.safetensors", repo=MODEL_REPO):
        done = fetch(hub, folder, MODEL_REPO)
    assert done.returncode == 1 and "hub answered 404" in done.stderr
    assert not folder.exists()  # the server's folder never saw a byte
    finished = {p.name for p in staging.glob("consolidated-*.safetensors")}
    assert finished  # ... but what finished waits in staging
    fetched(hub)
    assert fetch(hub, folder, MODEL_REPO).returncode == 0
    refetched = {p.rsplit("/", 1)[-1] for p in fetched(hub)}
    assert "consolidated-00013-of-00013.safetensors" in refetched
    assert not refetched & finished
    assert verify(folder, revision)["complete"] and not staging.exists()


def test_a_slow_fetch_says_how_far_it_is_as_it_goes(hub, tmp_path):
    # the hub sends the draft slowly (200 kB/s per response): a line every 0.2 s, on stdout
    revision = hub[1][DRAFT_REPO]
    faults = HubFaults(hub[0])
    with faults.injected("slow", path="*.safetensors", repo=DRAFT_REPO, rate=200_000):
        done = subprocess.run(
            [sys.executable, str(TOOL), "fetch", "--dir", str(tmp_path / "eagle" / revision),
             "--repo", DRAFT_REPO, "--revision", revision, "--endpoint", hub[0],
             "--progress-every", "0.2"],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("thorfleet: ")]
    name = DRAFT_REPO.rsplit("/", 1)[1]
    assert lines and all(line.startswith(f"thorfleet: {name} ") for line in lines), done.stdout
    # the total comes from the hub's file list: a share of it, a rate, and the time left
    assert any(re.search(r" of \d+\.\d MB \(\d+%\), \d+\.\d MB/s, about \d+ s left$", line)
               for line in lines), lines
    fetched(hub)


def test_a_progress_line_reads_done_total_rate_and_time_left():
    tool = load_tool()
    assert tool.progress_line("M", 12.3e9, 71e9, 98e6) == \
        "thorfleet: M 12.3 of 71.0 GB (17%), 98.0 MB/s, about 10 min left"
    assert tool.progress_line("M", 70e9, 71e9, 50e6).endswith("about 20 s left")
    assert tool.progress_line("M", 1e9, 71e9, 1e6).endswith("about 19.4 h left")
    assert tool.progress_line("M", 1e9, None, 0) == "thorfleet: M 1.0 GB, 0.0 MB/s"  # no total
    assert tool.progress_line("D", 0.2e9, 0.4e9, 1e6) == \
        "thorfleet: D 200.0 of 400.0 MB (50%), 1.0 MB/s, about 3 min left"
    assert tool.progress_line("M", 5e9, 71e9, 0).endswith("0.0 MB/s")  # stalled: no guess


def test_progress_counts_the_bytes_arriving_in_staging(tmp_path, capsys):
    tool = load_tool()
    (tmp_path / ".cache").mkdir()
    with tool.Progress("M", tmp_path, 4_000_000, 0.1):
        for _ in range(4):  # unfinished files under .cache count: they are bytes already had
            with open(tmp_path / ".cache" / "x.incomplete", "ab") as growing:
                growing.write(b"\0" * 1_000_000)
            time.sleep(0.15)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 3 and lines[-1].startswith("thorfleet: M 4.0 of 4.0 MB (100%)"), lines


def load_tool():
    """thorfleet-weights as a module (it is a script without .py)."""
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    loader = SourceFileLoader("thorfleet_weights", str(TOOL))
    module = module_from_spec(spec_from_loader("thorfleet_weights", loader))
    loader.exec_module(module)
    return module


def test_bytes_that_do_not_match_their_sha256_never_reach_the_folder(hub, tmp_path):
    folder = tmp_path / "eagle" / hub[1][DRAFT_REPO]
    with HubFaults(hub[0]).injected("bad-sha", path="consolidated.safetensors", repo=DRAFT_REPO):
        done = fetch(hub, folder)
    assert done.returncode == 1, done.stderr
    assert not folder.exists()


def test_an_unknown_revision_is_named_with_its_fix(hub, tmp_path):
    done = fetch(hub, tmp_path / "x", DRAFT_REPO, "9" * 40)
    assert done.returncode == 1
    assert "hub answered 404" in done.stderr and "weights_*_revision" in done.stderr


# --- copy: rsync from other boxes, each file checked against the hub's list --------------------
# rsync is real; so is the giving box's restriction, rrsync -ro (the forced command thorfleet puts
# on its copy key). Only ssh is stood in for: it runs that forced command here, on the peer's
# folder, or fails like an unreachable box (exit 255) for a peer with no folder.

FAKE_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
    case "$1" in -i|-o|-p|-l) shift 2 ;; -*) shift ;; *) host=${1#*@}; shift; break ;; esac
done
[ -d "$PEERS/$host" ] || { echo "ssh: connect to host $host port 22: No route to host" >&2; exit 255; }
SSH_CONNECTION="127.0.0.1 50000 127.0.0.1 22" SSH_ORIGINAL_COMMAND="$*" exec rrsync -ro "$PEERS/$host"
"""
RELATIVE = f"{MODEL_REPO.split('/')[-1]}/{REVISION}"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """Peers' weights_dirs under tmp/peers/<host>, this box's under tmp/box, and fake ssh."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ssh").write_text(FAKE_SSH)
    (tmp_path / "bin" / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("PEERS", str(tmp_path / "peers"))
    return tmp_path


def peer(fleet, host, files=FILES):
    folder = fleet / "peers" / host / RELATIVE
    folder.mkdir(parents=True)
    return checkpoint(folder, files)


def copy(fleet, *peers):
    """`thorfleet-weights copy` into tmp/box from `peers`, against the pinned list of FILES."""
    pinned = {"files": {}, "sizes": {}}
    for name, data in FILES.items():
        etag = (hashlib.sha256(data).hexdigest() if name.endswith(".safetensors")
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        pinned["files"][name] = [REVISION, etag]
        pinned["sizes"][name] = len(data)
    (fleet / "expected.json").write_text(json.dumps(pinned))
    folder = fleet / "box" / RELATIVE
    folder.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(TOOL), "copy", "--dir", str(folder), "--revision", REVISION,
            "--expected", str(fleet / "expected.json"), "--root", str(fleet / "box"),
            "--key", str(fleet / "key"), "--known-hosts", str(fleet / "known_hosts"),
            "--user", "thorfleet-peer", "--progress-every", "10"]
    for name in peers:
        argv += ["--peer", name]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    return done, folder


def test_copy_takes_a_whole_checkpoint_from_a_peer_and_puts_it_in_place(fleet):
    peer(fleet, "thor-1")
    done, folder = copy(fleet, "thor-1")
    assert done.returncode == 0, done.stderr
    assert verify(folder) == {"complete": True, "problems": []}
    assert not (folder.parent / f".{REVISION}.partial").exists()


def test_copy_refuses_a_damaged_file_and_takes_it_from_the_next_peer(fleet):
    shard = "consolidated-00002-of-00002.safetensors"
    (peer(fleet, "thor-1") / shard).write_bytes(b"\x03" * 1000)  # same size, other bytes
    peer(fleet, "thor-2")
    done, folder = copy(fleet, "thor-unreachable", "thor-1", "thor-2")
    assert done.returncode == 0, done.stderr
    assert f"{shard} from thor-1 does not match its sha256" in done.stderr
    assert (folder / shard).read_bytes() == FILES[shard]


def test_copy_says_plainly_that_a_peer_has_no_copy_yet(fleet):
    # any other rsync error is shown whole: a peer that cannot be reached
    done, _ = copy(fleet, "thor-unreachable")
    assert "No route to host" in done.stderr
    # rsync's exit code for a remote shell that failed: 255 (ssh's own) from 3.2.7, 12 ("error
    # in rsync protocol data stream") from 3.5.0, Debian 12's security update of 2026
    assert re.search(r"rsync from thor-unreachable stopped \(exit [1-9][0-9]*\); trying the next "
                     r"source", done.stderr), done.stderr
    # a first install: the other boxes are fetching too, so their weights_dir has no revision yet
    (fleet / "peers" / "thor-2").mkdir(parents=True)
    peer(fleet, "thor-1")
    done, folder = copy(fleet, "thor-2", "thor-1")
    assert done.returncode == 0, done.stderr
    assert f"thor-2 has no copy of {REVISION[:12]} yet; trying the next source" in done.stderr
    assert "No such file or directory" not in done.stderr and "rsync error" not in done.stderr
    assert verify(folder) == {"complete": True, "problems": []}


def test_copy_leaves_to_the_hub_what_no_peer_has_and_stages_the_rest(fleet):
    shard = "consolidated-00001-of-00002.safetensors"
    (peer(fleet, "thor-1") / shard).unlink()
    done, folder = copy(fleet, "thor-1")
    assert done.returncode == 3, done.stderr
    assert "1 file(s) not had from any peer" in done.stderr
    assert not folder.exists()  # nothing in place until every file is verified
    staging = folder.parent / f".{REVISION}.partial"
    # the copied files carry huggingface_hub's metadata, so the hub fetch skips them
    meta = staging / ".cache" / "huggingface" / "download"
    assert sorted(p.name for p in meta.glob("*.metadata")) == sorted(
        f"{name}.metadata" for name in FILES if name != shard)


def test_copy_appends_to_a_file_cut_short_instead_of_starting_again(fleet):
    shard = "consolidated-00002-of-00002.safetensors"
    peer(fleet, "thor-1")
    staging = fleet / "box" / RELATIVE.rsplit("/", 1)[0] / f".{REVISION}.partial"
    staging.mkdir(parents=True)
    (staging / shard).write_bytes(FILES[shard][:400])  # what a cut transfer left
    inode = (staging / shard).stat().st_ino
    done, folder = copy(fleet, "thor-1")
    assert done.returncode == 0, done.stderr
    assert (folder / shard).read_bytes() == FILES[shard]
    assert (folder / shard).stat().st_ino == inode  # appended in place, not copied anew


def test_a_complete_checkpoint_with_a_file_others_cannot_read_says_which(tmp_path):
    # the other boxes copy it as thorfleet-peer: a 600 shard would be refused to them
    folder = checkpoint(tmp_path, FILES)
    name = min(FILES)
    (folder / name).chmod(0o600)
    folder.chmod(0o700)
    result = verify(folder)
    assert result["complete"] is True and result["modes"] == [".", name]
