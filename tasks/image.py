"""Image: the derived vLLM image with the chat patches, built on the box from a pinned base.

With image_registry set it is built once per run: the first host of the run builds and pushes it,
the others pull it (a separate operation, so the push comes first) and build it only when the
registry does not have it.
"""

from pyinfra import host, inventory, state
from pyinfra.api import deploy

from thorfleet.layout import BOX_IMAGE_CONTEXT, FILES
from thorfleet.operations import files, image
from thorfleet.peers import first_of_run


@deploy("Image")
def run(settings):
    context = f"{BOX_IMAGE_CONTEXT}/{settings.image_inputs_hash[:12]}"
    files.tree(name="Upload the image build context (Dockerfile, patches)",
               src=str(FILES / "image"), dest=context)
    built_from = {"tag": settings.image_tag, "base": settings.image_base,
                  "inputs_hash": settings.image_inputs_hash,
                  "think_prefill": settings.image_think_prefill, "context": context}
    if not settings.image_registry or host.name == first_of_run(inventory, state):
        image.derived_image(name=f"Build {settings.image_tag} unless it exists", **built_from,
                            registry=settings.image_registry,
                            shared_ref=settings.image_shared_ref)
    else:  # a later line: pyinfra runs it after the build (and push) above on every host
        image.shared_image(
            name=f"Pull {settings.image_tag} from {settings.image_registry} unless it exists",
            **built_from, registry=settings.image_registry, shared_ref=settings.image_shared_ref)
