"""The serving recipe (Mistral Small 4 NVFP4 with EAGLE-3 in NVIDIA's Jetson vLLM container on a
Jetson AGX Thor): the profiles a host can serve and the container's environment.

Facts of the model on a Thor, not settings: group data picks a profile by name
(service_profile) and adds to the environment (service_extra_env), it does not restate them.
"""

# Serving profiles: what a box serves, under which name. `model`: the name clients write (vLLM's
# served_model_name; the box also answers "/model", the name before profiles, and the default
# profile the checkpoint's Hugging Face id). EAGLE-3 limits the context to 64K (vLLM's recipe for
# the draft: max_model_len 65536, docs/facts.md "Checked again"); without it 256K fits.
# `max_num_seqs`: the requests a box decodes at once (docs/facts.md "Front door": the seed's 1;
# the gateway's maxconn follows it). The throughput profile batches 8: reported on Thor for a
# 120B NVFP4 MoE, 15 tok/s at concurrency 1 and 40 at 8 (jetson-ai-lab PR #410), with no EAGLE
# (its drafts are verified per sequence, so its gain shrinks as the batch grows) and 32K a
# request: 8 of them hold the tokens of one 256K request, which the no-eagle profile's KV cache
# holds. `prefix_caching`: vLLM's prefix caching when service_prefix_caching leaves it to the
# profile (docs/workloads.md "Prefix caching" has vLLM 0.19.0's code and bugs behind each choice). `prefill_s`: a whole
# max_model_len prompt's prefill on a Thor, in 8,192-token chunks, as the sim's step model gives
# it (sim/README.md "The step model": no prefill figure of this model on a Thor is published);
# a request queued behind one waits that long, so its pool's queue timeout covers it.
# A fifth over the model: its single-prompt prefill came within 2 % of the one held-out figure
# (another model's), and no figure of this model exists to check it against.
PREFILL_MARGIN = 1.2
PROFILES = {
    "default": {"model": "mistral-small-4", "eagle": True, "max_model_len": 65536,
                "max_num_seqs": 1, "prefix_caching": True, "prefill_s": 24},
    "no-eagle": {"model": "mistral-small-4-256k", "eagle": False, "max_model_len": 262144,
                 "max_num_seqs": 1, "prefix_caching": True, "prefill_s": 250},
    "throughput": {"model": "mistral-small-4-batch", "eagle": False, "max_model_len": 32768,
                   "max_num_seqs": 8, "prefix_caching": True, "prefill_s": 9},
    # Images as seed 004 section 4.5 sends them (image_url). Without EAGLE: its draft head was
    # trained on text, and whether vLLM drafts for a Pixtral-wrapped target is unconfirmed; the
    # draft's ~0.4 GB goes to the vision encoder (VISION_ENCODER_BYTES). 64K, as the default.
    # Prefix caching off, the seed's: an open report of cached prefixes mixing images up (vLLM
    # #20261), which the proof's text-only check could not catch.
    "vision": {"model": "mistral-small-4-vision", "eagle": False, "max_model_len": 65536,
               "max_num_seqs": 1, "vision": True, "prefix_caching": False, "prefill_s": 24},
}
# The name every box answers besides its own (the only one before profiles): old clients keep
# working, and the door sends it to the fleet's first model (the order above).
LEGACY_MODEL = "/model"
# The largest request body the door reads to route by `model`, per token of context: a request's
# text is ~4 bytes a token in Tekken on prose; 16 covers code, JSON escapes and the request's own
# fields (the door answers 413 above it, never a cut body).
BODY_BYTES_PER_TOKEN = 16


# The vision encoder's facts (the checkpoint's params.json `vision_encoder`, Mistral Small 3.1's,
# assumed for 4): 14-pixel patches merged 2x2, images resized to at most 1540 pixels a side, so an
# image is at most (1540/28)^2 [IMG] tokens plus a [IMG_BREAK]/[IMG_END] a row: 55*55 + 55 tokens
# of the context (mistral_common's ImageEncoder counts them so).
IMAGE_TOKENS_MAX = 55 * 55 + 55
# Its weights in BF16: 24 layers of 4*1024^2 attention + 3*1024*4096 MLP, the patch merger and the
# projector into the text model's 4096: ~0.43B parameters, ~0.86 GB, in place of the draft's 0.4.
VISION_ENCODER_BYTES = 860_000_000
# The images of a prompt may take at most this share of the profile's context: the rest is text.
IMAGE_CONTEXT_SHARE = 0.5
# Body bytes the door reads per image allowed (a 1540-pixel JPEG base64'd is ~0.5-1 MB; a larger
# one is resized to 1540 by the encoder anyway): over the body limit, 413.
IMAGE_BODY_BYTES = 1 << 20
# What the vision profile's allowed_media_domains holds when the operator allows none: vLLM 0.19.0
# to 0.33.0 read an empty list as "any domain" (multimodal/media/connector.py
# _assert_url_in_allowed_media_domains), so a box would fetch any URL a client names. A name under
# .invalid never resolves (RFC 6761 section 6.4), and vLLM's 400 names it to the client.
NO_MEDIA_DOMAIN = "no-image-urls.invalid"


def max_images(profile: str) -> int:
    """The most images a prompt of `profile` may hold: IMAGE_CONTEXT_SHARE of its context."""
    return int(PROFILES[profile]["max_model_len"] * IMAGE_CONTEXT_SHARE) // IMAGE_TOKENS_MAX


def prefix_caching(profile: str, setting: bool | None) -> bool:
    """Whether a box of `profile` caches prompt prefixes: service_prefix_caching when set, else
    the profile's default."""
    return PROFILES[profile]["prefix_caching"] if setting is None else setting


def served_names(profile: str, hf_id: str) -> list[str]:
    """The names a box of `profile` answers to, its own first (vLLM answers with the first)."""
    own = PROFILES[profile]["model"]
    return [own, *([hf_id] if profile == "default" else []), LEGACY_MODEL]


# A Thor's GPU: compute capability 11.0, sm_110 (docs/facts.md "The target box"): the image's
# PyTorch and vLLM kernels must be built for it (`thorfleet doctor` reads both in the base image).
THOR_CAPABILITY = (11, 0)
THOR_ARCH = "sm_110"
# nvpmodel's modes on the T5000 (docs/facts.md "The target box": third-party measurements, not
# an NVIDIA table); 0 and 1 switch live, the others change the GPU power-gating mask.
POWER_MODE_NAMES = {0: "MAXN", 1: "120W", 2: "90W", 3: "70W"}
# FlashInfer up to this release has no SM110 MoE cubins: vLLM turns its CUTLASS MoE off on SM110
# and falls back (docs/facts.md "Checked again in December 2026": vllm PR #40808, flashinfer
# #3134).
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
