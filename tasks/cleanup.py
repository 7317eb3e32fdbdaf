"""Disk hygiene: once the host serves, remove what nothing serves any more (old checkpoint
revisions, derived images, build contexts), keeping the last good version a roll-back needs."""

from pyinfra.api import deploy

from thorfleet import operations as thor
from thorfleet.layout import BOX_CLEAN, FILES


@deploy("Cleanup")
def run(s):
    thor.whole_file(name="Install the leftover finder", src=str(FILES / "bin" / "thorfleet-clean"),
                    path=BOX_CLEAN, mode="755")
    thor.leftovers_removed(name="Remove old revisions, images and build contexts", s=s)
