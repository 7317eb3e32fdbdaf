"""thorfleet sim: torchvision.transforms.v2's names (see torchvision/__init__.py)."""
from torchvision import _Absent


def __getattr__(name):
    return _Absent(f"transforms.v2.{name}")
