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
def run(s):
    context = f"{BOX_IMAGE_CONTEXT}/{s.image_inputs_hash[:12]}"
    files.tree(name="Upload the image build context (Dockerfile, patches)",
               src=str(FILES / "image"), dest=context)
    built_from = {"tag": s.image_tag, "base": s.image_base, "inputs_hash": s.image_inputs_hash,
                  "think_prefill": s.image_think_prefill, "context": context}
    if not s.image_registry or host.name == first_of_run(inventory, state):
        image.derived_image(name=f"Build {s.image_tag} unless it exists", **built_from,
                            registry=s.image_registry, shared_ref=s.image_shared_ref)
    else:  # a later line: pyinfra runs it after the build (and push) above on every host
        image.shared_image(name=f"Pull {s.image_tag} from {s.image_registry} unless it exists",
                           **built_from, registry=s.image_registry, shared_ref=s.image_shared_ref)
