"""The serving recipe (Mistral Small 4 NVFP4 with EAGLE-3 in NVIDIA's Jetson vLLM container on a
Jetson AGX Thor): the profiles a host can serve and the container's environment.

Facts of the model on a Thor, not settings: group data picks a profile by name
(service_profile) and adds to the environment (service_extra_env), it does not restate them.
"""

# Serving profiles: EAGLE-3 limits the context to 64K, without it 256K fits.
PROFILES = {
    "default": {"eagle": True, "max_model_len": 65536},
    "no-eagle": {"eagle": False, "max_model_len": 262144},
}

# A Thor's GPU: compute capability 11.0, sm_110 (FACTS.md "The target box"): the image's PyTorch and
# vLLM kernels must be built for it (`thorfleet doctor` reads both in the base image).
THOR_CAPABILITY = (11, 0)
THOR_ARCH = "sm_110"
# nvpmodel's modes on the T5000 (FACTS.md "The target box": third-party measurements, not an
# NVIDIA table); 0 and 1 switch live, the others change the GPU power-gating mask.
POWER_MODE_NAMES = {0: "MAXN", 1: "120W", 2: "90W", 3: "70W"}
# FlashInfer up to this release has no SM110 MoE cubins: vLLM turns its CUTLASS MoE off on SM110
# and falls back (FACTS.md "Checked again in December 2026": vllm PR #40808, flashinfer #3134).
FLASHINFER_NO_SM110_MOE_UP_TO = "0.6.8.post1"

# The container environment the recipe was validated with on a Thor (FlashInfer CUTLASS NVFP4
# kernels, the Jetson libcuda preloaded); service_extra_env is merged over it.
RECIPE_ENV = {
    "VLLM_USE_FLASHINFER_MOE_FP4": "1",
    "VLLM_FLASHINFER_MOE_BACKEND": "latency",
    "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass",
    "VLLM_USE_FUSED_MOE_GROUPED_TOPK": "1",
    "VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE": "524288000",
    "VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE": "163840",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "USE_FASTSAFETENSOR": "true",
    "VLLM_ENABLE_CUDAGRAPH_GC": "0",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    "HF_HUB_DISABLE_XET": "1",
    "LD_PRELOAD": "/usr/lib/aarch64-linux-gnu/nvidia/libcuda.so.1",
}

# Never in service_extra_env: they would land in the unit file and in `systemctl show`.
SECRET_ENV = ("VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
