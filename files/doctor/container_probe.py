"""thorfleet doctor's probe, run by python3 in a throwaway container of the base image, as the
server runs (`--runtime nvidia`): one JSON line of what the image carries and the GPU it sees.
Read only; stdlib and the image's own packages; every failure is reported, never raised."""

import json
from importlib import metadata

found = {}
for package in ("vllm", "torch", "flashinfer-python", "transformers", "mistral_common"):
    try:
        found[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
        found[package] = None
try:
    import torch

    found["torch_cuda"] = torch.version.cuda
    # the CUDA architectures this PyTorch was built for (torch/cuda/__init__.py get_arch_list)
    found["arch_list"] = torch.cuda.get_arch_list()
    found["capability"] = list(torch.cuda.get_device_capability(0))
    found["device"] = torch.cuda.get_device_name(0)
except Exception as error:  # noqa: BLE001 - the row says what failed
    found["torch_error"] = f"{type(error).__name__}: {error}"[:300]
try:
    # vLLM's own answer to whether FlashInfer's kernels are there (it picks NVFP4 kernels by it)
    from vllm.utils.flashinfer import has_flashinfer

    found["has_flashinfer"] = has_flashinfer()
except Exception as error:  # noqa: BLE001 - another layout: the package's presence then
    found["has_flashinfer"] = None
    found["has_flashinfer_error"] = f"{type(error).__name__}: {error}"[:300]
print(json.dumps(found))
