"""Weights: the pinned checkpoint and draft, fetched with the image's own huggingface_hub."""

from pyinfra.api import deploy
from pyinfra.operations import files

from thorfleet import operations as thor
from thorfleet.layout import BOX_ETC, BOX_HF_TOKEN, BOX_OLD_VENV, BOX_WEIGHTS, FILES


@deploy("Weights")
def run(s):
    thor.whole_file(
        name="Install the weights fetcher and verifier",
        src=str(FILES / "bin" / "thorfleet-weights"),
        path=BOX_WEIGHTS,
        mode="755",
    )
    # Older thorfleet installed huggingface_hub from PyPI here; the fetch now runs in the image.
    files.directory(name="Remove the venv older thorfleet installed", path=BOX_OLD_VENV,
                    present=False)
    files.directory(name=f"Create {BOX_ETC}", path=BOX_ETC, mode="755")
    if s.hf_token:
        thor.secret_file(name="Install the Hugging Face token (root-only)", path=BOX_HF_TOKEN,
                         content=s.hf_token + "\n")
    else:
        files.file(name="No Hugging Face token configured", path=BOX_HF_TOKEN, present=False)
    files.directory(name=f"Create {s.weights_dir}", path=s.weights_dir, mode="755")
    for label, repo, folder, revision in (
        ("checkpoint (~71 GB; this takes a while)", s.weights_model_repo, s.model_dir,
         s.weights_model_revision),
        ("EAGLE-3 draft (~0.4 GB)", s.weights_draft_repo, s.draft_dir, s.weights_draft_revision),
    ):
        thor.checkpoint(
            name=f"Fetch and verify the {label}: {repo}@{revision[:12]}",
            folder=folder,
            repo=repo,
            revision=revision,
            image=s.image_tag,
            endpoint=s.weights_hf_endpoint,
            token_file=BOX_HF_TOKEN if s.hf_token else None,
        )
