"""thorfleet sim: torchvision.transforms' names (see torchvision/__init__.py)."""
import enum

from torchvision import _Absent


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


def __getattr__(name):
    return _Absent(f"transforms.{name}")
