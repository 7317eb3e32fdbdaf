"""Memory: the page-cache gate the service runs before every start (its ExecStartPre)."""

from pyinfra.api import deploy

from thorfleet.operations import files
from thorfleet.settings.layout import BOX_BIN, BOX_MEMORY_GATE, THOR_FILES


@deploy("Memory")
def run(settings):
    files.directory(name="Create thorfleet's bin folder", path=BOX_BIN, mode="755")
    files.whole_file(
        name="Install the memory gate (drop caches until MemAvailable is enough)",
        src=str(THOR_FILES / "bin" / "memory-gate"),
        path=BOX_MEMORY_GATE,
        mode="755",
    )
