"""Image: the derived vLLM image with the chat patches, built on the box from a pinned base."""

from pyinfra.api import deploy
from pyinfra.operations import files

from thorfleet import operations as thor
from thorfleet.layout import BOX_IMAGE_CONTEXT, FILES


@deploy("Image")
def run(s):
    context = f"{BOX_IMAGE_CONTEXT}/{s.image_inputs_hash[:12]}"
    files.sync(
        name="Upload the image build context (Dockerfile, patches)",
        src=str(FILES / "image"),
        dest=context,
        exclude=["__pycache__", "*.pyc"],
    )
    thor.derived_image(name=f"Build {s.image_tag} unless it exists", s=s, context=context)
