"""Disk hygiene: once the host serves, remove what nothing serves any more (old checkpoint
revisions, derived images, build contexts), keeping the last good version a roll-back needs."""

from pyinfra.api import deploy

from thorfleet.layout import BOX_CLEAN, FILES
from thorfleet.operations import cleanup, files


@deploy("Cleanup")
def run(s):
    files.whole_file(name="Install the leftover finder", src=str(FILES / "bin" / "thorfleet-clean"),
                     path=BOX_CLEAN, mode="755")
    cleanup.leftovers_removed(name="Remove old revisions, images and build contexts",
                              weights_dir=s.weights_dir, keep_dirs=[s.model_dir, s.draft_dir],
                              image_name=s.image_name, keep_image=s.image_tag,
                              keep_context=s.image_inputs_hash[:12], service=s.service_name)
