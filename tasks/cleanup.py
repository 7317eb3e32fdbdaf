"""Disk hygiene: once the host serves, remove what nothing serves any more (old checkpoint
revisions, derived images, build contexts), keeping the last good version a roll-back needs."""

from pyinfra.api import deploy

from thorfleet.operations import cleanup, files
from thorfleet.settings.layout import BOX_CLEAN, THOR_FILES


@deploy("Cleanup")
def run(settings):
    files.whole_file(name="Install the leftover finder", src=str(THOR_FILES / "bin" / "thorfleet-clean"),
                     path=BOX_CLEAN, mode="755")
    cleanup.leftovers_removed(name="Remove old revisions, images and build contexts",
                              weights_dir=settings.weights_dir,
                              keep_dirs=[settings.model_dir, settings.draft_dir],
                              image_name=settings.image_name, keep_image=settings.image_tag,
                              keep_context=settings.image_inputs_hash[:12],
                              service=settings.service_name)
