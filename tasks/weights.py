"""Weights: the pinned checkpoint and draft, fetched with the image's own huggingface_hub.

With the fleet copy (weights_source), the run's first host fetches first, from the other boxes
where they have it and from the hub for the rest; then every other host copies from the boxes
(that first host first), falling back to the hub for what none of them gives.
"""

import shlex
from io import StringIO

from pyinfra import host, inventory, state
from pyinfra.api import deploy

from thorfleet.operations import files, weights
from thorfleet.run import peers as fleet
from thorfleet.settings.layout import (
    BOX_ETC,
    BOX_HF_TOKEN,
    BOX_MANIFESTS,
    BOX_PEER_HOME,
    BOX_PEER_KEY,
    BOX_PEER_KNOWN_HOSTS,
    BOX_WEIGHTS,
    PEER_USER,
    RRSYNC,
    THOR_FILES,
)


@deploy("Weights")
def run(settings):
    files.whole_file(
        name="Install the weights fetcher and verifier",
        src=str(THOR_FILES / "bin" / "thorfleet-weights"),
        path=BOX_WEIGHTS,
        mode="755",
    )
    files.directory(name=f"Create {BOX_ETC}", path=BOX_ETC, mode="755")
    if settings.hf_token:
        files.secret_file(name="Install the Hugging Face token (root-only)", path=BOX_HF_TOKEN,
                          src=StringIO(settings.hf_token + "\n"))
    else:
        files.absent(name="No Hugging Face token configured", path=BOX_HF_TOKEN)
    files.directory(name=f"Create {settings.weights_dir}", path=settings.weights_dir, mode="755")
    copying = fleet.fleet_copy(settings, inventory)
    if copying:
        peer_access(settings)
    else:  # the copy turned off (weights_source = "hub", or one box): nobody may read the box
        files.absent(name="No fleet copy access (the copy is off)",
                     path=f"{BOX_PEER_HOME}/.ssh/authorized_keys")
        files.absent(name="No fleet copy key (the copy is off)", path=BOX_PEER_KEY)
    first = fleet.first_of_run(inventory, state)
    checkpoints = (
        ("checkpoint (~71 GB; this takes a while)", settings.weights_model_repo, settings.model_dir,
         settings.weights_model_revision),
        ("EAGLE-3 draft (~0.4 GB)", settings.weights_draft_repo, settings.draft_dir,
         settings.weights_draft_revision),
    )
    where = {
        "image": settings.image_tag,
        "endpoint": settings.weights_hf_endpoint,
        "token_file": BOX_HF_TOKEN if settings.hf_token else None,
        "peers": fleet.sources(host.name, inventory, state) if copying else (),
        "root": settings.weights_dir,
        "progress_every": settings.weights_progress_interval_s,
    }
    for label, repo, folder, revision in checkpoints:
        if not copying or host.name == first:
            weights.checkpoint(name=f"Fetch and verify the {label}: {repo}@{revision[:12]}",
                               folder=folder, repo=repo, revision=revision, **where)
    for label, repo, folder, revision in checkpoints:
        if copying and host.name != first:  # a later line: after the first host's fetch above
            weights.checkpoint(name=f"Copy and verify the {label} from the fleet: "
                                    f"{repo}@{revision[:12]}",
                               folder=folder, repo=repo, revision=revision, **where)


def peer_access(settings):
    """What the boxes copy weights with: a user that may only read weights_dir (rrsync -ro), the
    fleet's shared key authorized for it, and that key for this box's own copies."""
    private, public = fleet.key_pair(settings.weights_peer_key_file)
    # sshd runs the command with the user's shell: the folder is one shell word
    files.key_only_user(PEER_USER, BOX_PEER_HOME, public,
                        f"{RRSYNC} -ro {shlex.quote(settings.weights_dir)}",
                        f"read {settings.weights_dir}")
    files.secret_file(name="Install the fleet's copy key (root-only)", path=BOX_PEER_KEY,
                      src=StringIO(private))
    files.directory(name=f"Create {BOX_MANIFESTS}", path=BOX_MANIFESTS, mode="755")
    # the laptop checked each box's host key when it connected: the boxes check them the same way
    files.whole_file(name="Install the boxes' host keys for the copy (as the laptop knows them)",
                     path=BOX_PEER_KNOWN_HOSTS, src=StringIO(fleet.peer_known_hosts(inventory)))
