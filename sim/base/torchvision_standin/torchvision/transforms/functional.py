"""thorfleet sim: torchvision.transforms.functional's names (see torchvision/__init__.py)."""
from torchvision import _Absent
from torchvision.transforms import InterpolationMode  # noqa: F401


def __getattr__(name):
    return _Absent(f"transforms.functional.{name}")
