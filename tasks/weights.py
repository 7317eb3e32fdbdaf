"""Weights: huggingface_hub in a venv on the box, then the pinned checkpoint and draft."""

from pyinfra.api import deploy
from pyinfra.operations import apt, files, pip

from thorfleet import operations as thor
from thorfleet.layout import BOX_ETC, BOX_HF_TOKEN, BOX_VENV, BOX_WEIGHTS, FILES


@deploy("Weights")
def run(s):
    apt.packages(name="Install python3-venv", packages=["python3-venv"])
    pip.venv(name="Create thorfleet's venv", path=BOX_VENV, python="python3")
    pip.packages(
        name=f"Install {s.weights_hub_pip_spec} in the venv",
        packages=[s.weights_hub_pip_spec],
        pip=f"{BOX_VENV}/bin/pip",
    )
    thor.whole_file(
        name="Install the weights fetcher and verifier",
        src=str(FILES / "bin" / "thorfleet-weights"),
        path=BOX_WEIGHTS,
        mode="755",
    )
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
            endpoint=s.weights_hf_endpoint,
            token_file=BOX_HF_TOKEN if s.hf_token else None,
        )
