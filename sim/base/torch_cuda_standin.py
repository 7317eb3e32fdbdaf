"""Stand-in (the sim's Jetson base and its variants): this CPU build of PyTorch answers the device
queries of torch.cuda as the CUDA build in NVIDIA's Jetson image answers them on a Thor, for the
GPU that `--runtime nvidia` gives a container (sim/box/files/nvidia-container-runtime: this
torch imports only where that runtime mounted libcuda.so.1, as on a Jetson).

Installed as thorsim_torch_cuda in the image's site-packages and called at the end of
torch/cuda/__init__.py (sim/base/Dockerfile). Only what describes the build and the device is
answered; `is_available()` stays this build's False, so nothing vLLM's API server does changes:

- get_arch_list(): the CUDA architectures the build carries (torch/cuda/__init__.py returns
  torch._C._cuda_getArchFlags().split() where a GPU is available), read from ARCH_LIST, which
  the image's build writes: the Jetson image's PyTorch is built for Thor (sm_110; jetson-containers
  builds it with TORCH_CUDA_ARCH_LIST from the board's CUDA_ARCHITECTURES: the exact list is
  unconfirmed), and a variant writes a list without it (variants/no-sm110: as the upstream
  v0.19.0-cu130 image had no sm_110 kernels, docs/facts.md "Checked again in December 2026");
- get_device_capability(): (11, 0), a Thor's (docs/facts.md "The target box": sm_110);
- get_device_name(): "NVIDIA Thor" (the name CUDA reports on a Thor: unconfirmed).
"""

ARCH_LIST = "/opt/thorfleet-standin/torch-cuda-arch-list"
CAPABILITY = (11, 0)
NAME = "NVIDIA Thor"


def get_arch_list():
    with open(ARCH_LIST) as f:
        return f.read().split()


def get_device_capability(device=None):
    return CAPABILITY


def get_device_name(device=None):
    return NAME


def install(cuda):
    """Put the answers above on the torch.cuda module `cuda`."""
    cuda.get_arch_list = get_arch_list
    cuda.get_device_capability = get_device_capability
    cuda.get_device_name = get_device_name
