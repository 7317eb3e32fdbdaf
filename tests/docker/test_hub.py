"""The stand-in model hub, exercised with the real huggingface_hub client.

The operator's command is `hf download REPO --revision R --local-dir D` with HF_ENDPOINT pointing at
a hub; these stories run exactly that against sim/hub/server.py on 127.0.0.1 (no Docker), and
assert what huggingface_hub really does when the transfer goes wrong.
"""

import hashlib
import http.client
import json
import os
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from sim.hub import DRAFT_REPO, MODEL_REPO, HubFaults, build_repos, repo_revisions
from sim.hub.repos import SHARDS
from tests.helpers import free_port

SERVER = Path(__file__).resolve().parents[2] / "sim" / "hub" / "server.py"
HF = Path(sys.executable).with_name("hf")
SHARD_NAMES = [f"consolidated-{i:05d}-of-{SHARDS:05d}.safetensors" for i in range(1, SHARDS + 1)]
MODEL_FILES = {
    ".gitattributes",
    "README.md",
    "params.json",
    "tekken.json",
    "consolidated.safetensors.index.json",
    *SHARD_NAMES,
}
# The newest 1.x release: what a box gets from `pip install "huggingface_hub>=1,<2"`.
HF_1X = "huggingface_hub==1.33.0"


# --- fixtures ------------------------------------------------------------------------------------


class Hub:
    def __init__(self, root: Path, endpoint: str, token_file: Path):
        self.root, self.endpoint, self.token_file = root, endpoint, token_file
        self.faults = HubFaults(endpoint)
        self.revisions = repo_revisions(root)

    def download(
        self,
        repo: str,
        dest: Path,
        revision: str | None = None,
        token: str | None = None,
        hf: Path = HF,
    ) -> subprocess.CompletedProcess:
        """The operator's command, in a clean HF_HOME so no stored token or cache leaks in."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(HF_ENDPOINT=self.endpoint, HF_HOME=str(dest.parent / "hf-home"), NO_COLOR="1")
        if token:
            env["HF_TOKEN"] = token
        command = [str(hf), "download", repo, "--local-dir", str(dest)]
        if revision:
            command += ["--revision", revision]
        return subprocess.run(
            command, check=False, env=env, capture_output=True, text=True, timeout=120
        )

    def bodies_fetched(self) -> list[str]:
        """Files whose bytes the server sent since the last forget (not HEADs, not redirects)."""
        return sorted(
            r["path"].rsplit("/", 1)[-1]
            for r in self.faults.requests()
            if r["method"] == "GET" and r["bytes"] > 0 and not r["path"].startswith("/api/")
        )


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub") / "repos"
    build_repos(root)
    token_file = root.parent / "token"
    token_file.write_text("")
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(SERVER),
            "--root",
            str(root),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--token-file",
            str(token_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    _wait_up(endpoint)
    yield Hub(root, endpoint, token_file)
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def hub(hub_server):
    """The module's server with no faults, no token and an empty request log."""
    hub_server.faults.clear()
    hub_server.token_file.write_text("")
    hub_server.faults.forget_requests()
    yield hub_server
    hub_server.faults.clear()
    hub_server.token_file.write_text("")


def _wait_up(endpoint: str) -> None:
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{endpoint}/_sim/health", timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("stand-in hub did not start")


# --- what a finished download looks like ---------------------------------------------------------


def _metadata(dest: Path, name: str) -> tuple[str, str]:
    """(commit, etag) from huggingface_hub's .cache/huggingface/download/<file>.metadata."""
    lines = (
        (dest / ".cache" / "huggingface" / "download" / f"{name}.metadata").read_text().splitlines()
    )
    return lines[0], lines[1]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _incomplete(dest: Path) -> list[Path]:
    return list(dest.rglob("*.incomplete"))


def _safetensors_tensors(path: Path) -> dict:
    """Parse a safetensors file the way loaders do; fail if the header does not cover the data."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    header.pop("__metadata__", None)
    end = 0
    for info in sorted(header.values(), key=lambda i: i["data_offsets"]):
        assert info["data_offsets"][0] == end, f"{path.name}: gap or overlap in tensor data"
        end = info["data_offsets"][1]
    assert 8 + size + end == len(data), f"{path.name}: header does not match file size"
    return header


# --- stories -------------------------------------------------------------------------------------


def test_hf_download_of_the_pinned_revision_fetches_the_real_layout(hub, tmp_path):
    pinned = hub.revisions[MODEL_REPO][0]
    dest = tmp_path / "model"
    result = hub.download(MODEL_REPO, dest, revision=pinned)
    assert result.returncode == 0, result.stderr

    assert {p.name for p in dest.iterdir() if p.is_file()} == MODEL_FILES
    index = json.loads((dest / "consolidated.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(SHARD_NAMES)
    for shard in SHARD_NAMES:
        tensors = _safetensors_tensors(dest / shard)
        assert {n for n, s in index["weight_map"].items() if s == shard} == set(tensors)

    # The offline completeness check's inputs: the commit, and the sha256 as etag for LFS files.
    for name in MODEL_FILES:
        commit, etag = _metadata(dest, name)
        assert commit == pinned
        if name.endswith(".safetensors") or name == "tekken.json":
            assert etag == _sha256(dest / name), name
        else:
            assert len(etag) == 40, f"{name}: small files carry their git blob id"
    assert not _incomplete(dest)


def test_the_eagle_draft_downloads_too(hub, tmp_path):
    dest = tmp_path / "eagle"
    result = hub.download(DRAFT_REPO, dest, revision=hub.revisions[DRAFT_REPO][0])
    assert result.returncode == 0, result.stderr
    assert {p.name for p in dest.iterdir() if p.is_file()} >= {
        "params.json",
        "consolidated.safetensors",
    }
    assert json.loads((dest / "params.json").read_text())["n_layers"] == 2
    assert _safetensors_tensors(dest / "consolidated.safetensors")
    assert _metadata(dest, "consolidated.safetensors")[1] == _sha256(
        dest / "consolidated.safetensors"
    )


def test_a_rerun_skips_finished_files(hub, tmp_path):
    pinned = hub.revisions[MODEL_REPO][0]
    dest = tmp_path / "model"
    assert hub.download(MODEL_REPO, dest, revision=pinned).returncode == 0
    hub.faults.forget_requests()

    assert hub.download(MODEL_REPO, dest, revision=pinned).returncode == 0
    assert hub.bodies_fetched() == []


def test_moving_the_pin_fetches_only_the_files_that_changed(hub, tmp_path):
    first, second = hub.revisions[MODEL_REPO]
    dest = tmp_path / "model"
    assert hub.download(MODEL_REPO, dest, revision=first).returncode == 0
    hub.faults.forget_requests()

    assert hub.download(MODEL_REPO, dest, revision=second).returncode == 0
    assert hub.bodies_fetched() == sorted(["README.md", "params.json", SHARD_NAMES[-1]])
    for name in MODEL_FILES:
        assert _metadata(dest, name)[0] == second


def test_without_a_revision_main_is_the_newest_commit(hub, tmp_path):
    dest = tmp_path / "model"
    assert hub.download(MODEL_REPO, dest).returncode == 0
    assert _metadata(dest, "params.json")[0] == hub.revisions[MODEL_REPO][-1]


def test_a_single_cut_is_retried_within_the_same_run(hub, tmp_path):
    shard = SHARD_NAMES[6]
    hub.faults.add("cut", path=shard, count=1)
    dest = tmp_path / "model"

    result = hub.download(MODEL_REPO, dest, revision=hub.revisions[MODEL_REPO][0])
    assert result.returncode == 0, result.stderr
    assert _sha256(dest / shard) == _metadata(dest, shard)[1]
    assert hub.bodies_fetched().count(shard) == 2  # the cut transfer, then the retry


def test_a_transfer_that_keeps_breaking_leaves_no_file_and_a_rerun_completes(hub, tmp_path):
    shard = SHARD_NAMES[6]
    pinned = hub.revisions[MODEL_REPO][0]
    hub.faults.add("cut", path=shard)  # every time, until cleared
    dest = tmp_path / "model"

    result = hub.download(MODEL_REPO, dest, revision=pinned)
    assert result.returncode != 0
    assert "peer closed connection" in result.stderr
    assert not (dest / shard).exists()
    assert not _incomplete(dest)
    # huggingface_hub gives up after its 5 retries, each from a fresh connection.
    assert hub.bodies_fetched().count(shard) == 6

    hub.faults.clear()
    assert hub.download(MODEL_REPO, dest, revision=pinned).returncode == 0
    assert _sha256(dest / shard) == _metadata(dest, shard)[1]
    assert not _incomplete(dest)


def test_bytes_that_do_not_match_the_sha256_land_unchecked(hub, tmp_path):
    """huggingface_hub does not hash what it downloads over plain HTTP: the damaged shard
    reaches its final path and the metadata records the advertised sha256. Only comparing the
    two (the offline completeness check) catches it; a rerun at the same commit leaves it."""
    shard = SHARD_NAMES[4]
    pinned = hub.revisions[MODEL_REPO][0]
    hub.faults.add("bad-sha", path=shard, count=1)
    dest = tmp_path / "model"

    assert hub.download(MODEL_REPO, dest, revision=pinned).returncode == 0
    commit, etag = _metadata(dest, shard)
    assert (commit, (dest / shard).stat().st_size) == (
        pinned,
        len((hub.root / "blobs" / etag).read_bytes()),
    )
    assert _sha256(dest / shard) != etag

    hub.faults.forget_requests()
    assert hub.download(MODEL_REPO, dest, revision=pinned).returncode == 0
    assert hub.bodies_fetched() == []
    assert _sha256(dest / shard) != etag

    # What repairs it: remove the damaged file, download again.
    (dest / shard).unlink()
    assert hub.download(MODEL_REPO, dest, revision=pinned).returncode == 0
    assert _sha256(dest / shard) == etag


def test_a_required_token_is_enforced_like_the_hub(hub, tmp_path):
    hub.token_file.write_text("hf_sim_secret")
    pinned = hub.revisions[DRAFT_REPO][0]

    # No token: a 401 GatedRepo, which hf reports as a repo that "requires approval".
    missing = hub.download(DRAFT_REPO, tmp_path / "a", revision=pinned)
    assert missing.returncode != 0
    assert not any((tmp_path / "a").glob("*.safetensors"))
    wrong = hub.download(DRAFT_REPO, tmp_path / "b", revision=pinned, token="hf_wrong")
    assert wrong.returncode != 0 and "401" in wrong.stderr
    assert not any((tmp_path / "b").glob("*.safetensors"))

    right = hub.download(DRAFT_REPO, tmp_path / "c", revision=pinned, token="hf_sim_secret")
    assert right.returncode == 0, right.stderr


def test_a_token_for_one_box_is_asked_of_that_box_alone(hub, tmp_path):
    # stories on other boxes share the hub: a token one story needs must not refuse the rest
    from sim.hub.container import write_token

    pinned = hub.revisions[DRAFT_REPO][0]
    write_token(hub.token_file, "hf_other", client="10.9.9.9")
    assert hub.download(DRAFT_REPO, tmp_path / "a", revision=pinned).returncode == 0
    write_token(hub.token_file, "hf_mine", client="127.0.0.1")
    assert hub.download(DRAFT_REPO, tmp_path / "b", revision=pinned).returncode != 0
    right = hub.download(DRAFT_REPO, tmp_path / "c", revision=pinned, token="hf_mine")
    assert right.returncode == 0, right.stderr
    write_token(hub.token_file, None, client="127.0.0.1")
    assert hub.download(DRAFT_REPO, tmp_path / "d", revision=pinned).returncode == 0
    assert hub.token_file.read_text() == "10.9.9.9 hf_other\n"


@pytest.mark.parametrize("mode, says", [("401", "401"), ("404", "not found")])
def test_a_refused_file_fails_the_download_and_leaves_no_file(hub, tmp_path, mode, says):
    shard = SHARD_NAMES[2]
    hub.faults.add(mode, path=shard, repo=MODEL_REPO)
    dest = tmp_path / "model"

    result = hub.download(MODEL_REPO, dest, revision=hub.revisions[MODEL_REPO][0])
    assert result.returncode != 0
    assert says in result.stderr.lower()
    assert not (dest / shard).exists()
    assert not _incomplete(dest)


def test_a_refused_repo_fails_before_any_file(hub, tmp_path):
    hub.faults.add("401", path="*", repo=DRAFT_REPO)
    result = hub.download(DRAFT_REPO, tmp_path / "eagle")  # `main`: asks the API first
    assert result.returncode != 0 and "401" in result.stderr
    assert hub.bodies_fetched() == []


def test_byte_ranges_and_a_slow_transfer(hub):
    pinned = hub.revisions[MODEL_REPO][0]
    shard = SHARD_NAMES[0]
    url = f"{hub.endpoint}/_sim/lfs/{MODEL_REPO}/{pinned}/{shard}"
    whole = (
        hub.root
        / "blobs"
        / json.loads((hub.root / "manifest.json").read_text())["repos"][MODEL_REPO]["commits"][
            pinned
        ]["files"][shard]["sha256"]
    ).read_bytes()

    request = urllib.request.Request(url, headers={"Range": "bytes=1000-"})
    with urllib.request.urlopen(request) as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes 1000-{len(whole) - 1}/{len(whole)}"
        assert response.read() == whole[1000:]

    hub.faults.add("slow", path=shard, count=1, rate=len(whole) * 2)  # about half a second
    started = time.monotonic()
    with urllib.request.urlopen(url) as response:
        assert response.read() == whole
    assert time.monotonic() - started >= 0.4


def test_an_uplink_is_shared_by_every_response_it_carries(hub):
    # The bench's WAN: boxes behind one office uplink share its rate, where "slow" holds each
    # response to it on its own (so eight parallel downloads would get eight times the link).
    pinned = hub.revisions[MODEL_REPO][0]
    urls = [f"{hub.endpoint}/_sim/lfs/{MODEL_REPO}/{pinned}/{name}" for name in SHARD_NAMES[:2]]
    sizes = []

    def fetch(url):
        with urllib.request.urlopen(url) as response:
            sizes.append(len(response.read()))

    for mode, least, most in (("slow", 0.4, 0.9), ("uplink", 0.9, 3)):
        with urllib.request.urlopen(urls[0]) as response:
            rate = len(response.read()) * 2  # each file alone: about half a second
        hub.faults.add(mode, path="*", rate=rate)
        started = time.monotonic()
        workers = [threading.Thread(target=fetch, args=(url,)) for url in urls]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        took = time.monotonic() - started
        hub.faults.clear()
        assert least <= took <= most, (mode, took, sizes)


def test_a_busy_box_cannot_push_another_boxs_requests_out_of_its_log(hub):
    # Nine boxes share the fleet's hub; a story reads its own box's log (by address), so a box
    # busy elsewhere must not evict it: each box keeps its own last 5000.
    port = int(hub.endpoint.rsplit(":", 1)[1])

    def get(source, path):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10,
                                                source_address=(source, 0))
        connection.request("GET", path)
        connection.getresponse().read()
        connection.close()

    get("127.0.0.2", f"/api/models/{MODEL_REPO}")
    for _ in range(5001):
        get("127.0.0.1", "/busy")
    quiet = HubFaults(hub.endpoint, client="127.0.0.2")
    assert [r["path"] for r in quiet.requests()] == [f"/api/models/{MODEL_REPO}"]
    quiet.forget_requests()  # and forgetting one box's log leaves the others'
    assert quiet.requests() == [] and len(HubFaults(hub.endpoint, client="127.0.0.1").requests())


def test_repos_are_deterministic_and_not_rebuilt(tmp_path):
    first = build_repos(tmp_path / "a")
    manifest = tmp_path / "a" / "manifest.json"
    built_at = manifest.stat().st_mtime_ns
    assert build_repos(tmp_path / "a") == first
    assert manifest.stat().st_mtime_ns == built_at
    assert build_repos(tmp_path / "b") == first

    tekken = tmp_path / "tekken.json"
    tekken.write_text('{"config": {"version": "v15"}, "vocab": []}\n')
    with_tokenizer = build_repos(tmp_path / "a", tekken_json=tekken)
    assert with_tokenizer[MODEL_REPO] != first[MODEL_REPO]
    assert with_tokenizer[DRAFT_REPO] == first[DRAFT_REPO]


# --- the 1.x client the boxes install ------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_1x() -> Path:
    """A venv with the newest huggingface_hub 1.x, kept in the sim state dir between runs."""
    state = Path(os.environ.get("THORFLEET_SIM_STATE", "/var/tmp/thorfleet-sim"))
    venv = state / "venvs" / HF_1X.replace("==", "-")
    if not (venv / "bin" / "hf").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", HF_1X], check=True, timeout=300)
    return venv / "bin" / "hf"


def test_huggingface_hub_1x_downloads_and_recovers_too(hub, tmp_path, hf_1x):
    pinned = hub.revisions[MODEL_REPO][0]
    shard = SHARD_NAMES[9]
    dest = tmp_path / "model"

    hub.faults.add("cut", path=shard)
    broken = hub.download(MODEL_REPO, dest, revision=pinned, hf=hf_1x)
    assert broken.returncode != 0 and not (dest / shard).exists() and not _incomplete(dest)

    hub.faults.clear()
    result = hub.download(MODEL_REPO, dest, revision=pinned, hf=hf_1x)
    assert result.returncode == 0, result.stderr
    assert {p.name for p in dest.iterdir() if p.is_file()} == MODEL_FILES
    for name in SHARD_NAMES + ["tekken.json"]:
        assert _metadata(dest, name) == (pinned, _sha256(dest / name))

    draft = hub.download(
        DRAFT_REPO, tmp_path / "eagle", revision=hub.revisions[DRAFT_REPO][0], hf=hf_1x
    )
    assert draft.returncode == 0, draft.stderr


# --- in the sim: the thorfleet-hub container ---------------------------------------------------


def test_the_hub_container_serves_the_sim_network_and_is_kept_when_current(tmp_path):
    docker = pytest.importorskip("docker")
    from sim.hub import CONTAINER, start
    from sim.rootfs import ensure_rootfs

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as error:  # no engine: the host stories still ran
        pytest.skip(f"no Docker engine: {error}")
    rootfs = ensure_rootfs(client)
    state = Path(os.environ.get("THORFLEET_SIM_STATE", "/var/tmp/thorfleet-sim"))

    # The fleet's own hub serves the test tokenizer the base image made: start it the same way, or
    # the repos (and their revisions, pinned in the fleet's inventory) would change under the
    # other stories.
    made = sorted((state / "tokenizer").glob("*/tekken.json"), key=lambda p: p.stat().st_mtime)
    tekken = made[-1] if made else None
    hub = start(client, state_dir=state, rootfs_ref=rootfs, tekken_json=tekken)
    first_id = client.containers.get(CONTAINER).id
    assert start(client, state_dir=state, rootfs_ref=rootfs, tekken_json=tekken) == hub
    assert client.containers.get(CONTAINER).id == first_id

    local = Hub(state / "hub" / "repos", hub["endpoint_local"], state / "hub" / "token")
    dest = tmp_path / "eagle"
    result = local.download(DRAFT_REPO, dest, revision=hub["revisions"][DRAFT_REPO])
    assert result.returncode == 0, result.stderr

    # A box on the network reaches it by name, and the LFS redirect stays on that name.
    # curl retries as huggingface_hub does: under CI's load one lookup of the name came back
    # empty once (Docker's embedded DNS), and -sS says why if every try fails.
    head = client.containers.run(
        rootfs,
        ["curl", "-sSI", "--retry", "5", "--retry-all-errors", "--retry-delay", "1",
         f"{hub['endpoint_in_sim']}/{MODEL_REPO}/resolve/main/tekken.json"],
        network="thorfleet-sim",
        remove=True,
        stderr=True,
    ).decode()
    assert head.startswith("HTTP/1.1 302"), head
    assert f"Location: {hub['endpoint_in_sim']}/_sim/lfs/" in head
