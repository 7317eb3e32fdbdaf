"""Disk hygiene: what nothing serves any more, removed."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from thorfleet import facts
from thorfleet.operations.commands import sh
from thorfleet.run.snapshot import reads
from thorfleet.settings.layout import BOX_IMAGE_CONTEXT, BOX_LAST_GOOD_UNIT, box_unit


def _leftovers(weights_dir, keep_dirs, image_name, keep_image, keep_context, service, **_):
    return facts.serving.Leftovers, {
        "models": weights_dir, "contexts": BOX_IMAGE_CONTEXT, "image_name": image_name,
        "keep_context": keep_context, "keep_dirs": list(keep_dirs), "keep_images": [keep_image],
        "units": [box_unit(service), BOX_LAST_GOOD_UNIT]}


@reads(found=_leftovers)
@operation()
def leftovers_removed(weights_dir, keep_dirs, image_name, keep_image, keep_context, service, *,
                      found):
    """Old checkpoint revisions, derived images and build contexts removed: everything but the
    pinned weights, the current image and context, and what the live and last good units use.

    + weights_dir: where the checkpoints are, one folder per repository and revision
    + keep_dirs: the pinned checkpoint folders
    + image_name: the derived images' name (their tags are the inputs hashes)
    + keep_image: the current derived image
    + keep_context: the current build context's folder name (under layout.BOX_IMAGE_CONTEXT)
    + service: the systemd service, whose live and last good units name what they use

    .. code:: python

        leftovers_removed(name="Remove what nothing serves any more",
                          weights_dir=layout.BOX_MODELS, keep_dirs=[model_dir, draft_dir],
                          image_name="thorfleet/mistral-small4",
                          keep_image="thorfleet/mistral-small4:0123456789ab",
                          keep_context="0123456789ab", service="thorfleet-vllm")
    """
    paths = [*found["dirs"], *found["contexts"]]
    if not paths and not found["images"]:
        host.noop("nothing old to remove: only the served and last good versions are on disk")
        return
    if paths:
        yield sh("rm", "-rf", "--", *paths)
    if found["images"]:
        yield sh("docker", "rmi", *found["images"])
