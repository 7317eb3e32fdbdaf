"""thorfleet sim: torchvision.io's names (see torchvision/__init__.py)."""
import enum

from torchvision import _Absent


class ImageReadMode(enum.Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


def __getattr__(name):
    return _Absent(f"io.{name}")
