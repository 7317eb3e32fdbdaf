"""`python -m thorfleet pin` and `check`, run as an operator runs them, on a copy of
inventory/example.py.

The weights are resolved by the real huggingface_hub client against the stand-in hub
(sim/hub/server.py on 127.0.0.1, no Docker, as tests/docker/test_hub.py runs it). The base image is
resolved against the sim's own registry (Debian's docker-registry in the `thorfleet-registry`
container, sim/registry.py): those tests are marked `sim` (Docker, no boxes). Nothing else on
the network is touched.
"""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sim.hub import DRAFT_REPO, MODEL_REPO, build_repos, repo_revisions
from sim.registry import REGISTRY_LOCAL_PORT
from tests.helpers import known_hosts
from thorfleet.cli.pin import Change, Source, render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example.py"
SERVER = ROOT / "sim" / "hub" / "server.py"
# What the boxes call the sim's registry, and where this machine reaches it.
REGISTRY_IN_SIM = "thorfleet-registry:5000"
TEST_REPO = "thorfleet-pin-test/vllm"  # a repository of our own: no other test moves its tag
TAG = "latest-jetson-thor"
HEX40 = re.compile(r"^[0-9a-f]{40}$")
PINNED_DIGEST = "sha256:" + "c" * 64


# --- the stand-in hub and the sim registry -------------------------------------------------------


class Hub:
    def __init__(self, root, endpoint, token_file):
        self.root, self.endpoint, self.token_file = root, endpoint, token_file
        self.revisions = repo_revisions(root)  # oldest first; the last is `main`

    def main(self, repo):
        return self.revisions[repo][-1]


@pytest.fixture(scope="module")
def hub_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub") / "repos"
    build_repos(root)
    token_file = root.parent / "token"
    token_file.write_text("")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--root", str(root), "--port", str(port),
         "--host", "127.0.0.1", "--token-file", str(token_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{endpoint}/_sim/health", timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    yield Hub(root, endpoint, token_file)
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def hub(hub_server):
    hub_server.token_file.write_text("")
    yield hub_server
    hub_server.token_file.write_text("")


@pytest.fixture(scope="module")
def sim_registry():
    """The sim's registry, with a base image pushed under our own repository; returns
    (the tag as the boxes name it, the digest the registry gave the push, --via for this machine)."""
    import docker

    from sim import registry
    from sim.rootfs import ensure_rootfs

    client = docker.from_env()
    rootfs = ensure_rootfs(client)
    registry.ensure_registry(client, rootfs)
    digest = registry.push(client, rootfs, f"{TEST_REPO}:{TAG}")
    via = f"{REGISTRY_IN_SIM}=http://127.0.0.1:{registry.REGISTRY_LOCAL_PORT}"
    return f"{REGISTRY_IN_SIM}/{TEST_REPO}:{TAG}", digest, via


# --- the operator's side -------------------------------------------------------------------------


def new_inventory(tmp_path, hub, image_base=None, token_file=None) -> Path:
    """What a new user has after `cp inventory/example.py inventory/my-fleet.py`: two boxes
    uncommented, an API key file, the site's hub, and the base image named by its tag (or left
    commented out, as the example has it, when image_base is None)."""
    text = EXAMPLE.read_text()
    api_key = tmp_path / "api_key"
    api_key.write_text("k" * 32 + "\n")
    api_key.chmod(0o600)
    api_key.chmod(0o600)
    for host in ("thor-01", "thor-02"):
        text = _sub(text, rf'# (\("{host}",)', r"\1")
    text = _sub(text, r'"~/\.config/thorfleet/api_key"', f'"{api_key}"')
    for name in ("id_ed25519", "known_hosts"):  # the new user's own SSH files (check reads them)
        (tmp_path / name).touch()
        text = text.replace(f'"~/.ssh/{name}"', f'"{tmp_path / name}"')
    known_hosts(tmp_path / "known_hosts", "10.0.0.21", "10.0.0.22")  # the README's ssh-keyscan
    text = _sub(text, r'# ("weights_hf_endpoint": )"[^"]*"', rf'\1"{hub.endpoint}"')
    if image_base:
        text = _sub(text, r'# ("image_base": )"[^"]*"', rf'\1"{image_base}"')
    if token_file:
        text = _sub(text, r'# ("weights_hf_token_file": )"[^"]*"', rf'\1"{token_file}"')
    path = tmp_path / "inventory" / "my-fleet.py"
    path.parent.mkdir()
    path.write_text(text)
    return path


def _sub(text, pattern, replacement):
    new, count = re.subn(pattern, replacement, text)
    assert count == 1, f"inventory/example.py changed: {pattern!r} matched {count} times"
    return new


def thorfleet(*args, env=None, tmp_path=None) -> subprocess.CompletedProcess:
    """`python -m thorfleet ...` from the repo root, stdin not a terminal, no HF_* of ours."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    clean.update(NO_COLOR="1", **(env or {}))
    if tmp_path:
        clean["HF_HOME"] = str(tmp_path / "hf-home")
    return subprocess.run([sys.executable, "-m", "thorfleet", *map(str, args)], cwd=ROOT,
                          env=clean, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, check=False)


def values(path) -> dict:
    """The thors group's data, as the inventory file spells it."""
    namespace = {}
    exec(Path(path).read_text(), namespace)  # noqa: S102 - our own test inventory
    return namespace["thors"][1]


# --- one command: from a copied example to a pinned, checked inventory ---------------------------


def test_one_pin_takes_a_copied_example_to_a_pinned_checked_inventory(hub, sim_registry, tmp_path):
    image_tag, digest, via = sim_registry
    path = new_inventory(tmp_path, hub, image_base=image_tag)
    before = path.read_text()

    check = thorfleet("check", path)
    assert check.returncode == 2, check.stdout + check.stderr
    for key in ("weights_model_revision", "weights_draft_revision", "image_base"):
        assert f"thor-01: {key}=" in check.stdout

    started = time.monotonic()
    pin = thorfleet("pin", path, "--via", via, "--yes", tmp_path=tmp_path)
    assert pin.returncode == 0, pin.stdout + pin.stderr
    assert time.monotonic() - started < 30

    data = values(path)
    assert data["weights_model_revision"] == hub.main(MODEL_REPO)
    assert data["weights_draft_revision"] == hub.main(DRAFT_REPO)
    assert data["image_base"] == f"{REGISTRY_IN_SIM}/{TEST_REPO}@{digest}"  # the repo name kept
    # What changed is said, the diff shown.
    assert f"weights_model_revision: unset -> {hub.main(MODEL_REPO)}" in pin.stdout
    assert f"image_base: {image_tag} -> {REGISTRY_IN_SIM}/{TEST_REPO}@{digest}" in pin.stdout
    assert f"+        \"weights_draft_revision\": \"{hub.main(DRAFT_REPO)}\"," in pin.stdout
    # Comments and layout survive: only the three lines changed, the commented-out keys replaced.
    old_lines, new_lines = before.splitlines(), path.read_text().splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert len(changed) == 3, changed
    assert "# Pin what you serve: the base image by digest, the weights by commit." in new_lines[
        new_lines.index(next(b for _, b in changed)) - 1]
    assert f'"image_base": "{REGISTRY_IN_SIM}/{TEST_REPO}@{digest}",  # tag {TAG}' in path.read_text()

    check = thorfleet("check", path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.strip().startswith("2 hosts OK")

    # A re-run with nothing new changes nothing and says so; so does --update (tag and main
    # have not moved).
    pinned = path.read_bytes()
    for extra in ([], ["--update"]):
        again = thorfleet("pin", path, "--via", via, "--yes", *extra, tmp_path=tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already pinned, nothing to change" in again.stdout
        assert path.read_bytes() == pinned


def test_a_tag_that_moved_is_left_alone_until_update_asks(hub, sim_registry, tmp_path):
    image_tag, digest, via = sim_registry
    path = new_inventory(tmp_path, hub, image_base=image_tag)
    text = path.read_text().replace(  # an older pin of the same tag, recorded by pin's comment
        f'"image_base": "{image_tag}",',
        f'"image_base": "{REGISTRY_IN_SIM}/{TEST_REPO}@{PINNED_DIGEST}",  # tag {TAG}')
    path.write_text(text)

    run = thorfleet("pin", path, "--via", via, "--yes", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert values(path)["image_base"].endswith(PINNED_DIGEST)  # pinned: not touched

    run = thorfleet("pin", path, "--via", via, "--yes", "--update", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert values(path)["image_base"] == f"{REGISTRY_IN_SIM}/{TEST_REPO}@{digest}"
    assert f"@{PINNED_DIGEST} -> {REGISTRY_IN_SIM}/{TEST_REPO}@{digest}" in run.stdout


@pytest.mark.parametrize("image, via, expected", [
    (f"{REGISTRY_IN_SIM}/{TEST_REPO}:no-such-tag", True,
     (f"{REGISTRY_IN_SIM}/{TEST_REPO}:no-such-tag: the registry {REGISTRY_IN_SIM} (via "
      f"http://127.0.0.1:{REGISTRY_LOCAL_PORT}) has no tag 'no-such-tag' in thorfleet-pin-test/vllm (404): "
      "check image_base's repository and tag")),
    (f"{REGISTRY_IN_SIM}/{TEST_REPO}:{TAG}", False,
     f"{REGISTRY_IN_SIM}/{TEST_REPO}:{TAG}: cannot reach the registry {REGISTRY_IN_SIM} ("),
])
def test_a_registry_error_is_one_line_naming_the_image_and_the_fix(hub, sim_registry, tmp_path,
                                                                     image, via, expected):
    path = new_inventory(tmp_path, hub, image_base=image)
    before = path.read_text()
    run = thorfleet("pin", path, "--yes", *(["--via", sim_registry[2]] if via else []),
                    tmp_path=tmp_path)
    assert run.returncode == 2
    errors = run.stderr.splitlines()
    assert errors[0].startswith(f"thorfleet: {expected}"), run.stderr
    assert errors[1:] == [f"thorfleet: nothing written to {path}: fix the above and run pin again"]
    assert path.read_text() == before


# --- the hub: no Docker --------------------------------------------------------------------------


def pinned_image_inventory(tmp_path, hub, **kwargs):
    """A new inventory whose image is already pinned, so only the hub is asked."""
    return new_inventory(tmp_path, hub, image_base=f"ghcr.io/nvidia-ai-iot/vllm@{PINNED_DIGEST}",
                         **kwargs)


def test_without_a_terminal_pin_shows_the_diff_and_writes_nothing(hub, tmp_path):
    path = pinned_image_inventory(tmp_path, hub)
    before = path.read_text()
    run = thorfleet("pin", path, tmp_path=tmp_path)
    assert run.returncode == 3
    assert f"+        \"weights_model_revision\": \"{hub.main(MODEL_REPO)}\"," in run.stdout
    assert "-        # \"weights_model_revision\":" in run.stdout
    assert "--yes" in run.stderr
    assert path.read_text() == before

    dry = thorfleet("pin", path, "--dry-run", tmp_path=tmp_path)
    assert dry.returncode == 0 and "+++" in dry.stdout
    assert path.read_text() == before


def test_a_ref_pins_that_commit_and_only_the_changed_line_moves(hub, tmp_path):
    path = pinned_image_inventory(tmp_path, hub)
    assert thorfleet("pin", path, "--yes", tmp_path=tmp_path).returncode == 0
    oldest = hub.revisions[MODEL_REPO][0]
    assert oldest != hub.main(MODEL_REPO)
    run = thorfleet("pin", path, "--yes", "--model-ref", oldest, tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"weights_model_revision: {hub.main(MODEL_REPO)} -> {oldest}" in run.stdout
    assert values(path)["weights_model_revision"] == oldest
    assert values(path)["weights_draft_revision"] == hub.main(DRAFT_REPO)


def test_placeholder_pins_are_looked_up_not_called_pinned(hub, tmp_path):
    """All zeros has a pin's shape: `pin --dry-run` once called it "already pinned"."""
    path = pinned_image_inventory(tmp_path, hub)
    assert thorfleet("pin", path, "--yes", tmp_path=tmp_path).returncode == 0
    text = path.read_text()
    for repo in (MODEL_REPO, DRAFT_REPO):
        text = text.replace(hub.main(repo), "0" * 40)
    path.write_text(text)
    dry = thorfleet("pin", path, "--dry-run", tmp_path=tmp_path)
    assert dry.returncode == 0 and "already pinned" not in dry.stdout, dry.stdout
    assert f"+        \"weights_model_revision\": \"{hub.main(MODEL_REPO)}\"," in dry.stdout
    assert f"+        \"weights_draft_revision\": \"{hub.main(DRAFT_REPO)}\"," in dry.stdout


def test_a_token_the_hub_needs_is_read_from_the_file_and_never_printed(hub, tmp_path):
    token = "hf_" + "s3cret" * 5
    hub.token_file.write_text(token)
    token_file = tmp_path / "hf_token"
    token_file.write_text(token + "\n")
    path = pinned_image_inventory(tmp_path, hub, token_file=token_file)
    run = thorfleet("pin", path, "--yes", tmp_path=tmp_path)
    assert run.returncode == 0, run.stderr
    assert token not in run.stdout + run.stderr
    assert values(path)["weights_model_revision"] == hub.main(MODEL_REPO)


@pytest.mark.parametrize("case", ["no token", "wrong token", "misspelt repo", "no hub"])
def test_a_hub_error_is_one_line_naming_the_repo_and_the_fix(hub, tmp_path, case):
    env = {}
    path = pinned_image_inventory(tmp_path, hub)
    repo, where = MODEL_REPO, hub.endpoint
    if case in ("no token", "wrong token"):
        hub.token_file.write_text("hf_the_right_one")
    if case == "wrong token":
        env["HF_TOKEN"] = "hf_a_wrong_one"
    if case == "misspelt repo":
        repo = "mistralai/Mistral-Small-4-119B-2603-NVFP5"
        path.write_text(path.read_text().replace(
            '"ssh_user": "ubuntu",', f'"ssh_user": "ubuntu",\n        "weights_model_repo": "{repo}",'))
    if case == "no hub":
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            where = f"http://127.0.0.1:{sock.getsockname()[1]}"
        path.write_text(path.read_text().replace(hub.endpoint, where))
    before = path.read_text()
    run = thorfleet("pin", path, "--yes", env=env, tmp_path=tmp_path)
    assert run.returncode == 2
    expected = {
        "no token": f"{repo}: the hub at {where} needs a token (401): set weights_hf_token_file "
                    "to a file holding your HF token (or export HF_TOKEN)",
        "wrong token": f"{repo}: the hub at {where} refused the token (401): put a valid token "
                       "with access to this repo in weights_hf_token_file (or export HF_TOKEN)",
        "misspelt repo": f"{repo}: no such model repo on the hub at {where} (404): check the repo "
                         "name (weights_model_repo / weights_draft_repo)",
        "no hub": f"{repo}: cannot reach the hub at {where} (",
    }[case]
    errors = run.stderr.splitlines()
    assert errors[0].startswith(f"thorfleet: {expected}"), run.stderr
    assert errors[0].endswith("and the network") if case == "no hub" else True
    # The draft fails the same way unless only the model's name was wrong; nothing else is said.
    assert len(errors) == (2 if case == "misspelt repo" else 3), run.stderr
    assert errors[-1] == f"thorfleet: nothing written to {path}: fix the above and run pin again"
    assert "hf_a_wrong_one" not in run.stdout + run.stderr
    assert path.read_text() == before


# --- check ---------------------------------------------------------------------------------------


def test_check_of_the_example_as_shipped_says_there_are_no_hosts():
    run = thorfleet("check", EXAMPLE)
    assert run.returncode == 2
    assert run.stderr.strip() == (f"thorfleet: {EXAMPLE}: no hosts: list your boxes in a group "
                                  "(uncomment the examples in inventory/example.py)")


def test_check_and_pin_name_a_missing_inventory():
    for command in ("check", "pin"):
        run = thorfleet(command, "inventory/nope.py")
        assert run.returncode == 2
        assert run.stderr.strip() == ("thorfleet: inventory/nope.py: no such inventory file "
                                      "(copy inventory/example.py and edit it)")


# --- the source edits themselves (no network) ------------------------------------------------------


def test_edits_keep_layout_in_every_dict_shape(tmp_path):
    path = tmp_path / "inv.py"
    path.write_text(
        "# my fleet\n"
        "lab = (\n"
        "    [(\"thor-9\", {\"weights_model_revision\": \"main\"}),  # the odd one\n"
        "     \"thor-8\"],\n"
        "    {\"ssh_user\": \"me\"}\n"
        ")\n"
        "prod = (\n"
        "    [\"thor-1\"],\n"
        "    {\n"
        "        \"ssh_user\": \"ubuntu\",  # ops\n"
        "        \"image_base\": \"ghcr.io/x/vllm:t\"  # my note\n"
        "    },\n"
        ")\n")
    source = Source(path)
    lab, prod = source.groups
    host = source.hosts[0]
    text = render(source, [
        Change(host, "weights_model_revision", "main", "a" * 40, ""),
        Change(lab, "weights_draft_revision", None, "b" * 40, ""),
        Change(prod, "image_base", "ghcr.io/x/vllm:t", "ghcr.io/x/vllm@sha256:" + "d" * 64, "",
               comment="tag t"),
        Change(prod, "weights_draft_revision", None, "b" * 40, ""),
    ])
    assert text == (
        "# my fleet\n"
        "lab = (\n"
        f"    [(\"thor-9\", {{\"weights_model_revision\": \"{'a' * 40}\"}}),  # the odd one\n"
        "     \"thor-8\"],\n"
        f"    {{\"ssh_user\": \"me\", \"weights_draft_revision\": \"{'b' * 40}\"}}\n"
        ")\n"
        "prod = (\n"
        "    [\"thor-1\"],\n"
        "    {\n"
        "        \"ssh_user\": \"ubuntu\",  # ops\n"
        f"        \"image_base\": \"ghcr.io/x/vllm@sha256:{'d' * 64}\",  # my note\n"
        f"        \"weights_draft_revision\": \"{'b' * 40}\",\n"
        "    },\n"
        ")\n")
    compile(text, "inv.py", "exec")


# --- a registry that wants the anonymous bearer-token dance, as ghcr.io does (no network) ----------


class FakeGhcr:
    """ghcr.io's answers, on 127.0.0.1: HEAD a manifest -> 401 with a Bearer challenge; GET the
    realm -> an anonymous pull token; HEAD again with it -> 200 and Docker-Content-Digest.
    Docker Hub answers the same way (its registry and auth service), for its repository."""

    DIGEST = "sha256:" + "e" * 64

    def __init__(self, service="ghcr.io", repository="nvidia-ai-iot/vllm",
                 tag="latest-jetson-thor"):
        import http.server
        import threading

        fake = self
        self.seen = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake.seen.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path.startswith("/token?"):
                    body = b'{"token": "anon-pull-token"}'
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_error(404)

            def do_HEAD(self):
                fake.seen.append(("HEAD", self.path, self.headers.get("Authorization")))
                accept = self.headers.get("Accept", "")
                if self.headers.get("Authorization") != "Bearer anon-pull-token":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", (
                        f'Bearer realm="http://127.0.0.1:{fake.port}/token",service="{service}",'
                        f'scope="repository:{repository}:pull"'))
                elif (self.path == f"/v2/{repository}/manifests/{tag}"
                      and "application/vnd.oci.image.index.v1+json" in accept):
                    self.send_response(200)
                    self.send_header("Docker-Content-Digest", fake.DIGEST)
                else:
                    self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.via = f"{service}=http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def ghcr():
    fake = FakeGhcr()
    yield fake
    fake.close()


def test_the_example_as_copied_gets_the_default_base_image_pinned_through_a_bearer_token(
        hub, ghcr, tmp_path):
    """image_base left commented out, as the example ships it: pin resolves the seed's
    ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor and writes the key where the comment was."""
    path = new_inventory(tmp_path, hub)
    run = thorfleet("pin", path, "--via", ghcr.via, "--yes", tmp_path=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert values(path)["image_base"] == f"ghcr.io/nvidia-ai-iot/vllm@{FakeGhcr.DIGEST}"
    assert ('-        # "image_base": "ghcr.io/nvidia-ai-iot/vllm@sha256:<digest of '
            'latest-jetson-thor you tested>",') in run.stdout
    assert "image_base: unset -> ghcr.io/nvidia-ai-iot/vllm@sha256:" in run.stdout
    token_requests = [s for s in ghcr.seen if s[1].startswith("/token?")]
    assert token_requests and "scope=repository%3Anvidia-ai-iot%2Fvllm%3Apull" in token_requests[0][1]
    assert ghcr.seen[-1] == ("HEAD", "/v2/nvidia-ai-iot/vllm/manifests/latest-jetson-thor",
                             "Bearer anon-pull-token")
    assert thorfleet("check", path).returncode == 0


def test_the_upstream_vllm_image_is_pinned_from_docker_hub_as_the_jetson_one_is(hub, tmp_path):
    """The base moves on: `pin --image vllm/vllm-openai:v0.26.0` resolves Docker Hub's tag to its
    digest through the same bearer-token dance, records the tag, and --update re-resolves it."""
    fake = FakeGhcr(service="docker.io", repository="vllm/vllm-openai", tag="v0.26.0")
    try:
        path = new_inventory(tmp_path, hub)
        run = thorfleet("pin", path, "--image", "vllm/vllm-openai:v0.26.0", "--via", fake.via,
                        "--yes", tmp_path=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert values(path)["image_base"] == f"vllm/vllm-openai@{FakeGhcr.DIGEST}"
        assert f"vllm/vllm-openai@{FakeGhcr.DIGEST}\",  # tag v0.26.0" in path.read_text()
        assert fake.seen[-1] == ("HEAD", "/v2/vllm/vllm-openai/manifests/v0.26.0",
                                 "Bearer anon-pull-token")
        fake.seen.clear()
        run = thorfleet("pin", path, "--update", "--via", fake.via, "--yes", tmp_path=tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert fake.seen[-1] == ("HEAD", "/v2/vllm/vllm-openai/manifests/v0.26.0",
                                 "Bearer anon-pull-token")  # the tag the comment records
        assert thorfleet("check", path).returncode == 0
    finally:
        fake.close()


def test_image_names_are_read_as_docker_reads_them():
    from thorfleet.cli.resolve import registry_of, registry_url, split_image

    assert split_image("ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor") == (
        "ghcr.io/nvidia-ai-iot/vllm", "latest-jetson-thor", None)
    assert split_image("registry.lan:5000/vllm") == ("registry.lan:5000/vllm", None, None)
    assert registry_of("ghcr.io/nvidia-ai-iot/vllm") == ("ghcr.io", "nvidia-ai-iot/vllm")
    assert registry_of("vllm/vllm-openai") == ("docker.io", "vllm/vllm-openai")
    assert registry_of("ubuntu") == ("docker.io", "library/ubuntu")
    assert registry_of("localhost:5000/x") == ("localhost:5000", "x")
    assert registry_url("docker.io") == "https://registry-1.docker.io"
    assert registry_url("127.0.0.1:25000") == "http://127.0.0.1:25000"
    assert registry_url("registry.lan:5000") == "https://registry.lan:5000"
