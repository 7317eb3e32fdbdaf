"""thorfleet sim: stands in for torchvision, whose only wheels here are CUDA builds (its _C links
libcudart and libtorch_cuda, which the CPU torch lacks). transformers 5 imports it with every
image processor, so a text-only start needs its names; using any of them raises."""

__version__ = "0.29.0"


class _Absent:
    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"torchvision.{self.name}: the sim's torchvision is a stand-in "
                           "(no CPU build here); images are served on the 0.19.0 base")

    def __getattr__(self, name):
        return _Absent(f"{self.name}.{name}")


def __getattr__(name):
    return _Absent(name)
