"""Weights: a complete, verified checkpoint at its pinned revision, copied from the other boxes
where they have it and fetched from the hub for the rest."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from thorfleet import facts
from thorfleet.operations.commands import ShownCommand, q, sh
from thorfleet.run.snapshot import reads
from thorfleet.settings.layout import (
    BOX_MANIFESTS,
    BOX_PEER_KEY,
    BOX_PEER_KNOWN_HOSTS,
    BOX_WEIGHTS,
    FETCH_CONTAINER,
    PEER_USER,
)


@reads(weights=lambda folder, revision, **_: (
    facts.serving.WeightsState, {"folder": folder, "revision": revision}))
@operation()
def checkpoint(folder, repo, revision, image, endpoint=None, token_file=None, peers=(),
               root=None, progress_every=10, *, weights):
    """A complete, verified checkpoint of `repo` at `revision` in `folder`.

    Checked offline (the box's python3) against huggingface_hub's download metadata; only missing
    or damaged files are fetched, in a staging folder beside `folder`, moved into place once
    verified. The fetch runs huggingface_hub inside `image` (the vLLM image ships it): nothing is
    installed on the box from apt or PyPI.

    + folder: where the checkpoint goes
    + repo, revision: the hub repository and its pinned commit
    + image: the image whose huggingface_hub fetches it
    + endpoint: the hub (None: huggingface.co)
    + token_file: a file on the box holding the hub token, mounted read-only for the fetch
    + peers: other boxes' addresses, best first: the box first copies what they have under
      `root` (their weights_dir) with rsync, each file checked against the hub's file list for
      `revision`; the hub gives only what no peer did
    + progress_every: seconds between the transfer's progress lines

    .. code:: python

        checkpoint(name="Fetch the draft", folder=f"{layout.BOX_MODELS}/eagle/<rev>",
                   repo="mistralai/Mistral-Small-4-119B-2603-eagle", revision="<rev>",
                   image="thorfleet/mistral-small4:<hash>", peers=["thor-1.lan"],
                   root=layout.BOX_MODELS)
    """
    if weights["complete"] and weights.get("modes"):
        # the content is right: its owner and modes are put back, nothing is fetched
        yield (f"{sh('chown', '-R', 'root:root', folder)} && "
               f"{sh('chmod', '-R', 'u+rwX,go+rX,go-w', folder)}")
        return
    if weights["complete"]:
        host.noop(f"{repo}@{revision[:12]} is complete in {folder}")
        return
    parent = folder.rsplit("/", 1)[0]  # thorfleet-weights stages beside the folder
    # One fetch per revision at a time: a run whose SSH session died may have left one going.
    name = f"{FETCH_CONTAINER}-{revision[:12]}"
    docker_run = ["docker", "run", "--rm", "--name", name, "--network", "host",
                  "-e", "HF_HUB_DISABLE_XET=1",  # plain HTTPS downloads, no Xet storage client
                  # carriage returns: thorfleet-weights' progress lines instead
                  "-e", "HF_HUB_DISABLE_PROGRESS_BARS=1",
                  "-v", f"{parent}:{parent}", "-v", f"{BOX_WEIGHTS}:{BOX_WEIGHTS}:ro"]
    hub = []
    if endpoint:
        hub += ["--endpoint", endpoint]
    if token_file:  # a file, read inside: never on a command line or in the container's env
        docker_run += ["-v", f"{token_file}:{token_file}:ro"]
        hub += ["--token-file", token_file]
    fetch = sh(*docker_run, "--entrypoint", "python3", image, BOX_WEIGHTS, "fetch", "--dir",
               folder, "--repo", repo, "--revision", revision, *hub,
               "--progress-every", progress_every)
    if not peers:
        yield ShownCommand(f"docker rm -f {q(name)} >/dev/null 2>&1; {fetch}")
        return
    expected = f"{BOX_MANIFESTS}/{revision}.json"
    manifest = sh(*docker_run, "-v", f"{BOX_MANIFESTS}:{BOX_MANIFESTS}", "--entrypoint", "python3",
                  image, BOX_WEIGHTS, "manifest", "--repo", repo, "--revision", revision,
                  "--out", expected, *hub)
    copy = sh("python3", BOX_WEIGHTS, "copy", "--dir", folder, "--revision", revision,
              "--expected", expected, "--root", root, "--key", BOX_PEER_KEY,
              "--known-hosts", BOX_PEER_KNOWN_HOSTS, "--user", PEER_USER,
              "--progress-every", progress_every,
              *[arg for peer in peers for arg in ("--peer", peer)])
    # The hub fetch runs only when the copy left files missing (or no file list was had).
    yield ShownCommand(f"docker rm -f {q(name)} >/dev/null 2>&1; "
                       f"{{ {manifest} && {copy}; }} || {fetch}")
