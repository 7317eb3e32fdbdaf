"""`vllm serve` for the simulated base image: vLLM 0.19.0's own API server, a stand-in engine.

    vllm serve /model --config /config/vllm.yaml --attention-backend TRITON_MLA --language-model-only

REAL (the installed vLLM 0.19.0 code, called as `vllm serve` calls it; docs/facts.md "Seen
working here: vLLM 0.19.0's own API server on CPU with a stand-in engine"):
- argument parsing (`make_arg_parser`, `--config` YAML, usage error and exit 2 for unknown options),
  `validate_parsed_serve_args`, `api_server.setup_server` (port bound early, refused until serving);
- `AsyncEngineArgs.from_cli_args(args).create_engine_config()`: ModelConfig from the Mistral-format
  folder (params.json), the tokenizer (tekken.json), SpeculativeConfig (the draft folder at
  `speculative_config.model`), so their errors are vLLM's own;
- `api_server.build_and_serve`: build_app, init_app_state, every router vLLM mounts, the `/v1`-only
  API-key middleware, Prometheus `/metrics`, uvicorn, the serving classes, the chat renderer (so an
  unpatched image answers chat 400 word for word), the Mistral tool and reasoning parsers,
  streaming;
- `AsyncLLM` itself (renderer, InputProcessor with its validation, OutputProcessor with vLLM's
  IncrementalDetokenizer, output kinds, stop handling, stat loggers): only its EngineCore client is
  replaced (`StandInCore`), the part that would run a model on the GPU;
- the start-up memory check: `vllm.v1.worker.utils.request_memory` with its real message.

IMITATED (cannot run without a CUDA GPU and 66 GB of weights), each rule citing its source:
- The platform: vLLM is told it is on CpuPlatform so its config classes build; where vLLM asks the
  GPU, the stand-in answers as a Thor would (compute capability 11.0, FlashInfer present).
- The memory snapshot (vllm/utils/mem_utils.py L104-122): on cc 11.0 free = psutil's MemAvailable,
  total = cudaMemGetInfo's total (MemTotal here), minus 2.65 GiB of CUDA context (docs/facts.md
  "Thor realities", llamastash PR #81). After the check the server holds gpu_memory_utilization x
  total (a locked file under /run/thorsim/holds, for the box's memory model) and reading the model
  fills the page cache (/run/thorsim/cache/<dev>-<ino>: index total_size + draft file sizes).
  Without /run/thorsim (plain Docker) both are skipped.
- Kernel choice: attention, NVFP4 GEMM and NVFP4 MoE are chosen by the rules of
  platforms/cuda.py, quantization/utils/nvfp4_utils.py, fused_moe/oracle/nvfp4.py and
  quantization/utils/flashinfer_utils.py for capability (11, 0) with FlashInfer present (cited per
  rule below), from the same options and env vars (read through vllm.envs, so invalid values fail
  as in vLLM), and logged with the messages, logger names and line numbers vLLM logs them with.
  The real functions need CUDA kernels and torch.cuda to be importable, so they are not called.
  Newer releases moved these rules (0.26.0 and 0.33.0: kernels/linear/__init__.py and a MoE oracle
  without env switches); which rules apply is read from the installed code's shape, never from its
  version number.
- Loading: the index, every shard it names and the draft's files must exist (a shard missing fails
  with default_loader's "Following weights were not initialized" error; NOTE vLLM 0.19.0 only
  makes that check for unquantized models (default_loader.py L389-397): a real Thor would load a
  quantized checkpoint with a missing shard and serve garbage. The sim fails instead). Loading takes
  THORFLEET_SIM_LOAD_SECONDS (default 5) from start; the port refuses meanwhile.
- The engine core is a process of its own, titled `VLLM::EngineCore` as vLLM titles it
  (standin_core.py cites the split): frozen with SIGSTOP, the API server answers /health 200 and
  every request waits, as with a hung GPU; killed, the engine is dead and /health says so.
- Scheduling and time (in that process, standin_core.py): the engine runs in steps, each filled
  from one token budget (max_num_batched_tokens) by vLLM's scheduler's rules: the running
  requests' decode tokens (1 + the drafts to verify with EAGLE) and prefill chunks first, then
  waiting requests admitted first come first served up to max_num_seqs (the rest reported as
  waiting, vllm:num_requests_waiting). A step takes what thor.py's roofline says a Thor takes
  for what it holds (its weights read, its KV cache, its FLOPs, a fixed cost fitted to the seed's
  17.5 tok/s), so a long prompt delays the others' decode and a batch decodes slower each and
  faster in all; prefill chunks fill KV-cache blocks that vllm:kv_cache_usage_perc reports, and
  the first token comes with the last chunk. THORFLEET_SIM_DECODE_TOKS (tests only) runs the
  same box's clock faster.
- Prefix caching, when vLLM's parsed config has it on (cache_config.enable_prefix_caching): the
  client hashes the prompt's full blocks (then the answer's) with vLLM's own hash_block_tokens,
  the engine core keeps vLLM's block pool (LRU free queue, hits in whole blocks from the prompt's
  start, never the last token, one block less with EAGLE; standin_core.py cites each rule); a hit
  is prefilled already, so the first token comes sooner, and it is reported as vLLM reports it:
  EngineCoreOutput.num_cached_tokens (usage.prompt_tokens_details.cached_tokens with
  --enable-prompt-tokens-details) and vllm:prefix_cache_queries/_hits. The blocks are a Thor's:
  16 tokens (TRITON_MLA keeps CacheConfig.DEFAULT_BLOCK_SIZE), as many as the KV memory left
  after the weights holds. Running vLLM's own KVCacheManager instead was measured: importing
  vllm.v1.core.block_pool pulls in torch, 5.7 CPU-s a process in the base image, against the
  engine core's stdlib start. THORFLEET_SIM_HIT_ANSWERS_DIFFER=1 (tests only) answers a request
  that had a cache hit with other tokens, so a proof that answers agree on a hit can be seen
  to fail.
- Decoding: token ids are chosen, not computed; alone, a box decodes at the seed's Thor rates
  (33.7 tok/s with the EAGLE draft, 17.5 without), with EAGLE 1 + the accepted drafts a step
  (1.87 of 3 on average, fitted to 33.7) in one output, as vLLM delivers a step's tokens:
  with tools in the prompt, the Mistral v11+ tool-call tokens `[TOOL_CALLS]name[ARGS]{json}` (so
  tool_calls appear only if vLLM's own parser is on; at temperature > 0 the tool is sometimes
  skipped); a prompt ending in `[THINK]` gets a trace, `[/THINK]`, then an answer; another chat
  prompt a short answer; a raw completion prompt runs to max_tokens.
"""

import asyncio
import fcntl
import inspect
import json
import logging
import os
import random
import socket
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from types import SimpleNamespace

GIB = 1 << 30
# docs/facts.md "Thor realities": vLLM reads 2.6-2.7 GiB below MemAvailable
CUDA_CONTEXT_BYTES = int(2.65 * GIB)
THOR_CAPABILITY = (11, 0)
THORSIM = Path("/run/thorsim")
log = logging.getLogger("vllm")
VLLM_DIR: Path


# ------------------------------------------------------------------ logging as vLLM does

def _line_of(relpath: str, needle: str, after: str | None = None) -> int:
    """Line of `needle` in the installed vLLM source, so log lines point where vLLM's would; with
    `after`, the first `needle` below the line holding `after` (a call written twice alike)."""
    try:
        lines = (VLLM_DIR / relpath).read_text().splitlines()
    except OSError:
        return 0
    start = 0
    if after is not None:
        start = next((n for n, line in enumerate(lines) if after in line), len(lines))
    for number, line in enumerate(lines[start:], start + 1):
        if needle in line:
            # A call spread over lines logs the line where it starts: `logger.xxx(`.
            for back in range(number, max(0, number - 6), -1):
                if "logger." in lines[back - 1]:
                    return back
            return number
    return 0


def vlog(relpath: str, needle: str, level: int, message: str, *args,
         after: str | None = None) -> None:
    """Log `message` as the vLLM module `relpath` does, at the line holding `needle`."""
    name = "vllm." + relpath.removesuffix(".py").replace("/", ".")
    logger = logging.getLogger(name)
    record = logger.makeRecord(name, level, str(VLLM_DIR / relpath),
                               _line_of(relpath, needle, after), message, args, None)
    logger.handle(record)


# ------------------------------------------------------------------ memory (item 4)

def check_memory(cache_config) -> int:
    """vLLM 0.19.0's own check, fed what a Thor's snapshot reads."""
    import psutil
    from vllm.v1.worker.utils import request_memory

    vm = psutil.virtual_memory()  # /proc/meminfo: the box's modelled memory under --runtime nvidia
    # mem_utils.py L105-121: on (11, 0) free_memory = psutil.virtual_memory().available; the
    # process's own CUDA context already took its share (docs/facts.md "Thor realities").
    snapshot = SimpleNamespace(free_memory=vm.available - CUDA_CONTEXT_BYTES,
                               total_memory=vm.total, device_="cuda:0")
    return request_memory(snapshot, cache_config)


_held = []  # open, flock'ed files: the hold lasts as long as the process


def hold(path_dir: Path, nbytes: int, name: str) -> None:
    """The box's memory protocol: a file whose first line is the bytes, kept LOCK_EX while held."""
    if not THORSIM.is_dir():
        return  # plain Docker (host tests): no box memory model
    path_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path_dir / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, f"{nbytes}\n".encode())
    fcntl.flock(fd, fcntl.LOCK_EX)
    _held.append(fd)


def fill_page_cache(model: Path, draft: Path | None) -> None:
    """Reading the model puts its real size in the page cache (the sim's shards are tiny: the
    index's metadata.total_size says how big they really are)."""
    if not THORSIM.is_dir():
        return
    index = model / "consolidated.safetensors.index.json"
    size = int(json.loads(index.read_text()).get("metadata", {}).get("total_size", 0))
    if draft is not None:
        size += sum(f.stat().st_size for f in draft.rglob("*") if f.is_file())
    st = index.stat()
    cache = THORSIM / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{st.st_dev}-{st.st_ino}.{os.getpid()}"
    tmp.write_text(f"{size}\n")
    os.replace(tmp, cache / f"{st.st_dev}-{st.st_ino}")


# ------------------------------------------------------------------ kernels (item 2)

def _cc(major: int) -> bool:
    """Platform.is_device_capability_family(major*10): same major (platforms/interface.py)."""
    return THOR_CAPABILITY[0] == major


# Validity per attention backend on an MLA model (head size 576 = kv_lora_rank + rope dim), from
# each backend's supports_* (v1/attention/backend.py validate_configuration L266-307):
# non-MLA backends: "head_size not supported", "MLA not supported"; MLA backends by capability:
# FLASH_ATTN_MLA major 9 (mla/flashattn_mla.py L68), FLASHMLA 9/10 (mla/flashmla.py L73),
# FLASHINFER_MLA 10 (mla/flashinfer_mla.py L65), CUTLASS_MLA 10 (mla/cutlass_mla.py L65),
# TRITON_MLA any (mla/triton_mla.py L61), FLASHMLA_SPARSE 9/10 and sparse only.
MLA_CAPABILITY = {"FLASH_ATTN_MLA": (9,), "FLASHMLA": (9, 10), "FLASHINFER_MLA": (10,),
                  "CUTLASS_MLA": (10,), "TRITON_MLA": None, "FLASHMLA_SPARSE": (9, 10),
                  "FLASHINFER_MLA_SPARSE": (10,)}
SPARSE = {"FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"}


def attention_reasons(name: str) -> list[str]:
    if name not in MLA_CAPABILITY:
        return ["head_size not supported", "MLA not supported"]
    reasons = []
    if name in SPARSE:
        reasons.append("non-sparse not supported")
    majors = MLA_CAPABILITY[name]
    if majors is not None and THOR_CAPABILITY[0] not in majors:
        reasons.append("compute capability not supported")
    return reasons


def select_attention(vllm_config) -> str:
    """platforms/cuda.py get_attn_backend_cls L249-338 for an MLA model on (11, 0); the same rule
    in 0.33.0 (L419-518: a forced backend validated then logged L448, else the valid ones of
    _get_backend_priorities, logged L508)."""
    selected = vllm_config.attention_config.backend  # --attention-backend, an AttentionBackendEnum
    if selected is not None:
        reasons = attention_reasons(selected.name)
        if reasons:  # cuda.py L268-272
            raise ValueError(f"Selected backend {selected} is not valid for this configuration. "
                             f"Reason: {reasons}")
        vlog("platforms/cuda.py", 'logger.info("Using %s backend.", selected_backend)',
             logging.INFO, "Using %s backend.", selected)
        return selected.name
    # cuda.py L51-97: major 11 is not 10, so the "else" MLA order. 0.33.0 (L139-155) adds only
    # sparse backends behind TRITON_MLA (FLASH_ATTN_MLA_SPARSE, FLASHINFER_MLA_SPARSE_SM90: major
    # 9, sparse), so the valid list is the same.
    order = ["FLASH_ATTN_MLA", "FLASHMLA", "FLASHINFER_MLA", "TRITON_MLA", "FLASHMLA_SPARSE"]
    valid = [name for name in order if not attention_reasons(name)]
    vlog("platforms/cuda.py", '"Using %s attention backend out of potential backends: %s."',
         logging.INFO, "Using %s attention backend out of potential backends: %s.", valid[0],
         "[" + ", ".join(f"'{b}'" for b in valid) + "]")
    return valid[0]


# vLLM 0.2x moved the NVFP4 GEMM choice into kernel classes (this file) and dropped the MoE
# oracle's FlashInfer env switches: which rule a base follows is read from its code, as vLLM would
# run it, never from its version.
KERNELS_LINEAR = "model_executor/kernels/linear/__init__.py"
MOE_ORACLE = "model_executor/layers/fused_moe/oracle/nvfp4.py"


NVFP4_UTILS = "model_executor/layers/quantization/utils/nvfp4_utils.py"


def cutlass_fp4_supported() -> bool:
    """vLLM's cutlass_fp4_supported() on (11, 0): true on each base, for reasons that differ.

    Its Python is the same in all three (0.19.0 quantization/utils/nvfp4_utils.py L315-320, 0.26.0
    L56-61, 0.33.0 L53-58): the CUDA op cutlass_scaled_mm_supports_fp4(capability), 110 here.
    - 0.19.0 csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu L63-67: `capability >= 100 &&
      runtimeVersion >= 12080`, a run-time check only (the image's CUDA is 13).
    - 0.26.0 csrc/libtorch_stable/quantization/fp4/nvfp4_scaled_mm_entry.cu L71-87 and 0.33.0
      csrc/quantization/fp4/nvfp4_scaled_mm_entry.cu L71-87: 100 <= capability < 120 when built
      with ENABLE_NVFP4_SM100, which CMakeLists.txt sets when its FP4 archs (10.0f;11.0f on CUDA
      >= 13: 0.26.0 L984-1006, 0.33.0 L1061-1084) meet the build's list; the aarch64 release
      wheel is built with CUDA 13.0.2 for a list with 11.0 (.buildkite/release-pipeline.yaml
      L11-12: "Thor (11.0, CUDA 13+)").
    Read from the release source tarballs on PyPI (csrc, CMakeLists.txt and .buildkite ship in
    them); the compiled wheel itself was not inspected."""
    return THOR_CAPABILITY >= (10, 0)


def select_nvfp4_gemm(vllm_config=None) -> str:
    if "class NvFp4LinearBackend" in (VLLM_DIR / NVFP4_UTILS).read_text():  # 0.19.0's enum
        return select_nvfp4_gemm_backend()
    if "def _resolve_backend_kernels(" in (VLLM_DIR / KERNELS_LINEAR).read_text():  # 0.33.0's
        return select_nvfp4_gemm_resolved(vllm_config)
    return select_nvfp4_gemm_kernel(vllm_config)


# vLLM 0.26.0 kernels/linear/__init__.py _POSSIBLE_NVFP4_KERNELS[CUDA] (L446-460), in order, and
# whether each kernel's is_supported() holds on (11, 0): CuteDSL needs capability family 100
# (nvfp4/flashinfer.py L36-39); FlashInfer CUTLASS cutlass_fp4_supported(), >= 100 and FlashInfer
# (L82-95), whose presence vLLM's own has_flashinfer() reads; vLLM's CUTLASS kernel
# cutlass_fp4_supported() alone (nvfp4/cutlass.py L23-29; the function below). The rest are not
# reached.
NVFP4_KERNELS = ["FlashInferCuteDslNvFp4LinearKernel", "FlashInferCutlassNvFp4LinearKernel",
                 "CutlassNvFp4LinearKernel", "MarlinNvFp4LinearKernel",
                 "FlashInferTrtllmNvFp4LinearKernel", "FlashInferCudnnNvFp4LinearKernel",
                 "FbgemmNvFp4LinearKernel", "EmulationNvFp4LinearKernel",
                 "HummingNvFp4LinearKernel"]
# --linear-backend's filter (_LINEAR_BACKEND_KERNEL_MAP, L216-...) for the NVFP4 kernels
NVFP4_LINEAR_BACKENDS = {"cutlass": "CutlassNvFp4LinearKernel",
                         "flashinfer_cutlass": "FlashInferCutlassNvFp4LinearKernel",
                         "marlin": "MarlinNvFp4LinearKernel",
                         "emulation": "EmulationNvFp4LinearKernel"}


def select_nvfp4_gemm_kernel(vllm_config) -> str:
    """vLLM 0.26.0 kernels/linear/__init__.py init_nvfp4_linear_kernel L884-985 on (11, 0): the
    first kernel class of the CUDA list that is not disabled and is supported."""
    from vllm import envs
    from vllm.utils.flashinfer import has_flashinfer

    supported = {"FlashInferCuteDslNvFp4LinearKernel": _cc(10) and has_flashinfer(),
                 "FlashInferCutlassNvFp4LinearKernel": cutlass_fp4_supported() and has_flashinfer(),
                 "CutlassNvFp4LinearKernel": cutlass_fp4_supported()}
    backend = getattr(getattr(vllm_config, "kernel_config", None), "linear_backend", "auto")
    possible = NVFP4_KERNELS
    if backend and backend != "auto":  # L941-948
        if backend not in NVFP4_LINEAR_BACKENDS:
            raise ValueError(f"--linear-backend={backend} was requested but no '{backend}' "
                             "kernel exists for NVFP4 layers.")
        possible = [NVFP4_LINEAR_BACKENDS[backend]]
    for kernel in possible:
        if kernel in envs.VLLM_DISABLED_KERNELS or not supported.get(kernel, True):  # L952-962
            continue
        vlog(KERNELS_LINEAR, 'logger.info_once("Using %s for NVFP4 GEMM", kernel_cls.__name__)',
             logging.INFO, "Using %s for NVFP4 GEMM", kernel)
        return kernel
    raise ValueError("Failed to find a kernel that can implement the NVFP4 linear layer.")


# vLLM 0.33.0 kernels/linear/__init__.py _POSSIBLE_NVFP4_KERNELS[CUDA] (L592-609), in order, with
# each kernel's is_supported() on (11, 0) and its reason when not (kernels/linear/nvfp4/...):
# CuteDSL needs family 100 (flashinfer.py L118-125); FlashInfer CUTLASS cutlass_fp4_supported(),
# >= 100 and FlashInfer (L195-208); FlashInfer b12x >= 120 (L402-411); vLLM's CUTLASS
# cutlass_fp4_supported() (cutlass.py L25-31; the function below);
# CuteDSL W4A16 100/103/12x (flashinfer.py L39-56); Marlin >= 7.5 (marlin_utils_fp4.py L34-35);
# TRT-LLM and cuDNN FlashInfer only (flashinfer.py L272-277, L341-346); FBGEMM fbgemm_gpu, not in
# the image (fbgemm.py L21-26); B12X family 120 (b12x.py L56-69); Torch family 100 (pytorch.py
# L27-36); emulation always (emulation.py L18-22); Humming its package, a Requires-Dist of 0.33.0
# and so in the real image, and >= 7.5 (humming.py L28-40).
NVFP4_KERNELS_RESOLVED = [
    ("FlashInferCuteDslNvFp4LinearKernel", False, "FlashInfer cutedsl requires sm_10x"),
    ("FlashInferCutlassNvFp4LinearKernel", None, "FlashInfer + >=sm_100 required"),
    ("FlashInferB12xNvFp4LinearKernel", False,
     "FlashInfer b12x requires SM120+ and FlashInfer with Sm120BlockScaledDenseGemmKernel"),
    ("CutlassNvFp4LinearKernel", True, None),
    ("FlashInferCuteDslNvFp4W4A16LinearKernel", False,
     "FlashInfer CuTe-DSL W4A16 requires sm_100 or sm_12x"),
    ("MarlinNvFp4LinearKernel", True, None),
    ("FlashInferTrtllmNvFp4LinearKernel", None, "FlashInfer required"),
    ("FlashInferCudnnNvFp4LinearKernel", None, "FlashInfer required"),
    ("FbgemmNvFp4LinearKernel", False, "fbgemm_gpu required"),
    ("B12xNvFp4LinearKernel", False, "B12X NVFP4 kernels require a Blackwell 12x device"),
    ("B12xNvFp4W4A16LinearKernel", False, "B12X NVFP4 kernels require a Blackwell 12x device"),
    ("TorchNvFp4LinearKernel", False, "Torch NVFP4 requires sm_10x (Blackwell)"),
    ("EmulationNvFp4LinearKernel", True, None),
    ("HummingNvFp4LinearKernel", True, None),
]  # None: supported exactly when FlashInfer is there
# --linear-backend's NVFP4 kernels in 0.33.0 (_LINEAR_BACKEND_KERNEL_MAP L285-391)
NVFP4_LINEAR_BACKENDS_RESOLVED = {
    "b12x": {"B12xNvFp4LinearKernel", "B12xNvFp4W4A16LinearKernel"},
    "cutlass": {"CutlassNvFp4LinearKernel"},
    "flashinfer_cutlass": {"FlashInferCutlassNvFp4LinearKernel"},
    "flashinfer_cutedsl": {"FlashInferCuteDslNvFp4LinearKernel",
                           "FlashInferCuteDslNvFp4W4A16LinearKernel"},
    "flashinfer_trtllm": {"FlashInferTrtllmNvFp4LinearKernel"},
    "flashinfer_cudnn": {"FlashInferCudnnNvFp4LinearKernel"},
    "flashinfer_b12x": {"FlashInferB12xNvFp4LinearKernel"},
    "humming": {"HummingNvFp4LinearKernel"},
    "marlin": {"MarlinNvFp4LinearKernel"},
    "torch": {"TorchNvFp4LinearKernel"},
    "fbgemm": {"FbgemmNvFp4LinearKernel"},
    "emulation": {"EmulationNvFp4LinearKernel"},
}


def select_nvfp4_gemm_resolved(vllm_config) -> str:
    """vLLM 0.33.0 kernels/linear/__init__.py init_nvfp4_linear_kernel L1191-1309 for the model's
    W4A4 layers (use_a16 False) on (11, 0). New since 0.26.0: a per-quantization override
    (linear_backend_per_quant, _get_linear_backend L256-268), a --linear-backend with no NVFP4
    kernel falling back to the automatic order with a warning instead of failing
    (_filter_kernels_by_backend L393-407), new kernels in the order. Also imitated here (0.26.0
    has them too; its rule above leaves them out): VLLM_BATCH_INVARIANT forcing vLLM's CUTLASS
    (L1208-1236), the emulation fallback warning (L1293-1301), Marlin's warning."""
    from vllm import envs
    from vllm.utils.flashinfer import has_flashinfer

    flashinfer = has_flashinfer()
    support = {name: (flashinfer if ok is None else ok, reason)
               for name, ok, reason in NVFP4_KERNELS_RESOLVED}
    support["FlashInferCutlassNvFp4LinearKernel"] = (
        flashinfer and cutlass_fp4_supported(), "FlashInfer + >=sm_100 required")
    support["CutlassNvFp4LinearKernel"] = (cutlass_fp4_supported(),
                                           "CUTLASS FP4 kernels not available")
    kernel_config = getattr(vllm_config, "kernel_config", None)
    backend = getattr(kernel_config, "linear_backend", "auto") or "auto"
    override = (getattr(kernel_config, "linear_backend_per_quant", None) or {}).get("nvfp4_w4a4")
    if override:  # L262-267
        vlog(KERNELS_LINEAR, '"Applied linear backend override for %r: %r"', logging.INFO,
             "Applied linear backend override for %r: %r", "nvfp4_w4a4", override)
        backend = override

    def chosen(kernel: str, needle: str) -> str:
        vlog(KERNELS_LINEAR, needle, logging.INFO, "Using %s for NVFP4 GEMM", kernel)
        if kernel == "MarlinNvFp4LinearKernel":  # its process_weights_after_loading (L33-38)
            vlog("model_executor/kernels/linear/nvfp4/marlin.py",
                 '"Your GPU does not have native support for FP4 computation but "',
                 logging.WARNING,
                 "Your GPU does not have native support for FP4 computation but FP4 quantization "
                 "is being used. Weight-only FP4 compression will be used leveraging the Marlin "
                 "kernel. This may degrade performance for compute-heavy workloads.")
        return kernel

    if envs.VLLM_BATCH_INVARIANT:  # CUTLASS is supported here (above), so it is forced
        if backend not in ("auto", "cutlass"):
            vlog(KERNELS_LINEAR, '"using the CUTLASS backend for deterministic execution."',
                 logging.WARNING, "VLLM_BATCH_INVARIANT overrides --linear-backend=%s; using the "
                 "CUTLASS backend for deterministic execution.", backend)
        else:
            vlog(KERNELS_LINEAR, '"VLLM_BATCH_INVARIANT forces NVFP4 linear to use the "',
                 logging.INFO, "VLLM_BATCH_INVARIANT forces NVFP4 linear to use the CUTLASS "
                 "backend for deterministic execution.")
        return chosen("CutlassNvFp4LinearKernel",
                      'logger.info_once("Using %s for NVFP4 GEMM", force_kernel.__name__)')
    possible = [name for name, _, _ in NVFP4_KERNELS_RESOLVED]
    if backend != "auto":  # _resolve_backend_kernels L410-438 (prioritize_humming: 9.0 only)
        wanted = NVFP4_LINEAR_BACKENDS_RESOLVED.get(backend, set())
        filtered = [name for name in possible if name in wanted]
        if filtered:
            possible = filtered
        else:
            vlog(KERNELS_LINEAR, '"--linear-backend=%s has no kernel for this linear layer type; "',
                 logging.WARNING, "--linear-backend=%s has no kernel for this linear layer type; "
                 "using automatic selection for that layer type.", backend)
    failures = []
    for kernel in possible:  # L1276-1304
        supported, reason = support[kernel]
        if kernel in envs.VLLM_DISABLED_KERNELS:
            failures.append(f" {kernel} disabled by environment variable")
            continue
        if not supported:
            failures.append(f"{kernel}: {reason}")
            continue
        if kernel == "EmulationNvFp4LinearKernel" and failures:
            vlog(KERNELS_LINEAR, '"NVFP4 linear falling back to the slow and unoptimized "',
                 logging.WARNING, "NVFP4 linear falling back to the slow and unoptimized emulation "
                 "backend as no optimized backend is available (unavailable reasons:\n - %s\n). "
                 "In case you expect one of these backends to be used, please verify your "
                 "environment.", "\n - ".join(failures))
        return chosen(kernel, 'logger.info_once("Using %s for NVFP4 GEMM", kernel_cls.__name__)')
    raise ValueError("Failed to find a kernel that can implement the NVFP4 linear layer. "
                     "Reasons: \n" + "\n".join(failures))


def select_nvfp4_gemm_backend() -> str:
    """quantization/utils/nvfp4_utils.py select_nvfp4_linear_backend L39-86 on (11, 0)."""
    from vllm import envs
    from vllm.model_executor.layers.quantization.utils.nvfp4_utils import NvFp4LinearBackend

    if envs.VLLM_USE_FBGEMM:  # L46-54: fbgemm_gpu is not in the image
        raise ImportError("Backend fbgemm requires fbgemm.f4f4bf16 operator, "
                          "Please install with: pip install fbgemm-gpu-genai")
    if envs.VLLM_USE_NVFP4_CT_EMULATIONS:
        backend = NvFp4LinearBackend.EMULATION
    elif envs.VLLM_NVFP4_GEMM_BACKEND is None:
        # L59: has_device_capability(100) (11.0 >= 10.0) and has_flashinfer(): the Jetson image
        # ships FlashInfer (the seed's flashinfer-cutlass runs there), which this stand-in base,
        # unlike the upstream ones, does not carry as packages
        backend = NvFp4LinearBackend.FLASHINFER_CUTLASS
    else:
        backend = NvFp4LinearBackend(envs.VLLM_NVFP4_GEMM_BACKEND)
    if backend == NvFp4LinearBackend.VLLM_CUTLASS and not cutlass_fp4_supported():  # L75-76
        raise AssertionError(f"Cutlass is required for {backend}")
    vlog("model_executor/layers/quantization/utils/nvfp4_utils.py", "for NVFP4 GEMM",
         logging.INFO, f"Using {backend} for NVFP4 GEMM")
    if backend == NvFp4LinearBackend.MARLIN:  # convert_to_nvfp4_linear_kernel_format L143-149
        vlog("model_executor/layers/quantization/utils/nvfp4_utils.py",
             "Your GPU does not have native support for FP4 computation but", logging.WARNING,
             "Your GPU does not have native support for FP4 computation but FP4 quantization is "
             "being used. Weight-only FP4 compression will be used leveraging the Marlin kernel. "
             "This may degrade performance for compute-heavy workloads.")
    return backend.name


def select_nvfp4_moe(vllm_config) -> str:
    oracle = (VLLM_DIR / MOE_ORACLE).read_text()
    if '"b12x": NvFp4MoeBackend.B12X' in oracle:  # 0.33.0's map_nvfp4_backend (L166)
        return select_nvfp4_moe_by_device(vllm_config)
    if "VLLM_USE_FLASHINFER_MOE_FP4" not in oracle:
        return select_nvfp4_moe_in_order(vllm_config)
    return select_nvfp4_moe_with_env(vllm_config)


# vLLM 0.33.0 fused_moe/oracle/nvfp4.py: AVAILABLE_BACKENDS (L203-212; prioritize_humming L213
# reorders on 9.0 only, quantization/utils/humming/priority.py L10-23), and each backend's
# experts' _supports_current_device on (11, 0), which is what decides here
# (modular_kernel.py is_supported_config L580-591; the rest of its checks hold for this W4A4 MoE):
# TRT-LLM and both CuteDSL need family 100 (experts/trtllm_nvfp4_moe.py L204-211,
# flashinfer_cutedsl_moe.py L88-94, flashinfer_cutedsl_batched_moe.py L65-71); FlashInfer CUTLASS
# 9.0 or family 100 or 120, "SM110 excluded: flashinfer-ai/flashinfer#3134"
# (flashinfer_cutlass_moe.py L128-139), so FlashInfer or not, a Thor does not get it; vLLM's
# CUTLASS family 100, 110 or 120 (cutlass_moe.py CutlassExpertsFp4 L716-722); Marlin >= 7.5
# (marlin_moe.py L592-594); Humming its package and >= 7.5 (fused_humming_moe.py L403-409);
# emulation any CUDA (triton_moe.py L658-659). Only asked for by name: B12X and FlashInfer b12x
# family 120 (b12x.py L499-508, flashinfer_b12x_moe.py L165-171), FlashInfer MoE-EP CuteDSL 10.0
# and 10.3 only (fused_moe/flashinfer_moe_ep.py L40-47).
MOE_BACKENDS_BY_DEVICE = ["FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED",
                          "FLASHINFER_CUTLASS", "VLLM_CUTLASS", "MARLIN", "HUMMING", "EMULATION"]
MOE_ON_THOR = {"FLASHINFER_TRTLLM": False, "FLASHINFER_CUTEDSL": False,
               "FLASHINFER_CUTEDSL_BATCHED": False, "FLASHINFER_CUTLASS": False,
               "VLLM_CUTLASS": True, "MARLIN": True, "HUMMING": True, "EMULATION": True,
               "B12X": False, "FLASHINFER_B12X": False, "FLASHINFER_MOE_EP_CUTEDSL": False}
# map_nvfp4_backend (L163-182): moe_backend -> NvFp4MoeBackend
MOE_BACKEND_NAMES = {"b12x": "B12X", "cutlass": "VLLM_CUTLASS",
                     "flashinfer_trtllm": "FLASHINFER_TRTLLM",
                     "flashinfer_cutlass": "FLASHINFER_CUTLASS",
                     "flashinfer_cutedsl": "FLASHINFER_CUTEDSL",
                     "flashinfer_moe_ep_cutedsl": "FLASHINFER_MOE_EP_CUTEDSL",
                     "flashinfer_b12x": "FLASHINFER_B12X", "marlin": "MARLIN",
                     "humming": "HUMMING", "emulation": "EMULATION"}


def select_nvfp4_moe_by_device(vllm_config) -> str:
    """vLLM 0.33.0 fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend L191-321 on (11, 0): an
    explicit moe_backend (L275-301) or the first backend of AVAILABLE_BACKENDS whose experts
    support the device (L303-321). Unlike 0.19.0 no env var takes part, and unlike what the
    FlashInfer switch suggests, a Thor gets vLLM's CUTLASS MoE with or without FlashInfer (the
    table above). Then the layer is converted for it: Marlin warns (convert_to_nvfp4_moe_kernel_format
    -> marlin_utils_fp4.py prepare_nvfp4_moe_layer_for_marlin L340-345)."""

    def chosen(backend: str, needle_after: str | None) -> str:
        if not MOE_ON_THOR[backend]:  # _return_or_raise L258-273, _make_log_unsupported L246-256
            raise ValueError(f"NvFp4 MoE backend '{backend}' does not support the deployment "
                             "configuration since kernel does not support current device cuda.")
        # _make_log_backend L239-244: the list as AVAILABLE_BACKENDS' values
        vlog(MOE_ORACLE, "logger.info_once(_make_log_backend(backend))", logging.INFO,
             "Using '%s' NvFp4 MoE backend out of potential backends: %s.", backend,
             MOE_BACKENDS_BY_DEVICE, after=needle_after)
        if backend == "MARLIN":
            vlog("model_executor/layers/quantization/utils/marlin_utils_fp4.py",
                 '"Your GPU does not have native support for FP4 computation but "',
                 logging.WARNING,
                 "Your GPU does not have native support for FP4 computation but FP4 quantization "
                 "is being used. Weight-only FP4 compression will be used leveraging the Marlin "
                 "kernel. This may degrade performance for compute-heavy workloads.")
        return backend

    runner = getattr(getattr(vllm_config, "kernel_config", None), "moe_backend", "auto")
    if runner and runner != "auto":
        if runner not in MOE_BACKEND_NAMES:  # L177-182
            raise ValueError(f"moe_backend='{runner}' is not supported for NvFP4 MoE. "
                             f"Expected one of {list(MOE_BACKEND_NAMES.keys())}.")
        return chosen(MOE_BACKEND_NAMES[runner], None)  # logged in _return_or_raise (L270)
    for backend in MOE_BACKENDS_BY_DEVICE:
        if MOE_ON_THOR[backend]:  # logged by the loop (L314), below L303
            return chosen(backend, "# Select kernels in order of backend.")
    raise NotImplementedError("No NvFp4 MoE backend supports the deployment configuration.")


def select_nvfp4_moe_in_order(vllm_config) -> str:
    """vLLM 0.26.0 fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend L165-293 on (11, 0): no
    FlashInfer env switch any more; an explicit moe_backend (L243-266, map_nvfp4_backend L145-162)
    or the first supported backend of AVAILABLE_BACKENDS (L178-187). TRTLLM and CuteDSL need
    capability family 100 (experts/trtllm_nvfp4_moe.py L173-179), every FlashInfer one FlashInfer
    itself, and FlashInfer CUTLASS excludes SM110 ("SM110 excluded: flashinfer-ai/flashinfer#3134",
    experts/flashinfer_cutlass_moe.py L131-142, where 0.19.0 listed family 110), so (11, 0) gets
    vLLM's CUTLASS, FlashInfer or not."""
    from vllm.utils.flashinfer import has_flashinfer

    available = ["FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED",
                 "FLASHINFER_CUTLASS", "VLLM_CUTLASS", "MARLIN", "HUMMING", "EMULATION"]
    family100 = {"FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTEDSL_BATCHED"}
    unsupported = {b for b in family100 if not _cc(10)}
    if _cc(11):  # flashinfer_cutlass_moe.py L131-142
        unsupported.add("FLASHINFER_CUTLASS")
    if not has_flashinfer():
        unsupported |= {b for b in available if b.startswith("FLASHINFER")}

    def chosen(backend):
        if backend in unsupported:
            raise ValueError(f"NvFp4 MoE backend '{backend}' does not support the deployment "
                             "configuration.")
        vlog(MOE_ORACLE, "logger.info_once(_make_log_backend(backend))", logging.INFO,
             "Using '%s' NvFp4 MoE backend out of potential backends: %s.", backend, available)
        return backend

    runner = getattr(getattr(vllm_config, "kernel_config", None), "moe_backend", "auto")
    if runner and runner != "auto":
        mapping = {"cutlass": "VLLM_CUTLASS", "flashinfer_trtllm": "FLASHINFER_TRTLLM",
                   "flashinfer_cutlass": "FLASHINFER_CUTLASS",
                   "flashinfer_cutedsl": "FLASHINFER_CUTEDSL", "marlin": "MARLIN",
                   "humming": "HUMMING", "emulation": "EMULATION"}
        if runner not in mapping:
            raise ValueError(f"moe_backend='{runner}' is not supported for NvFP4 MoE. "
                             f"Expected one of {list(mapping.keys())}.")
        return chosen(mapping[runner])
    return chosen(next(b for b in available if b not in unsupported))


def select_nvfp4_moe_with_env(vllm_config) -> str:
    """fused_moe/oracle/nvfp4.py select_nvfp4_moe_backend L134-260 on (11, 0)."""
    from vllm import envs

    oracle = "model_executor/layers/fused_moe/oracle/nvfp4.py"
    available = ["FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTLASS", "VLLM_CUTLASS",
                 "MARLIN"]
    flashinfer = ["FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "FLASHINFER_CUTEDSL"]
    # _supports_current_device of each kernel: TRTLLM family 100 (experts/trtllm_nvfp4_moe.py L82),
    # CUTEDSL family 100 (experts/flashinfer_cutedsl_moe.py L62), FlashInfer CUTLASS 90/100/110/120
    # (flashinfer_cutlass_moe.py L125), CutlassExpertsFp4 100/110/120 (cutlass_moe.py L681),
    # Marlin >= 7.5 (fused_marlin_moe.py L565).
    supported = {"FLASHINFER_TRTLLM": _cc(10), "FLASHINFER_CUTEDSL": _cc(10),
                 "FLASHINFER_CUTLASS": True, "VLLM_CUTLASS": True, "MARLIN": True}

    def chosen(backend: str, needle: str = "logger.info_once(_make_log_backend(backend))"):
        if not supported[backend]:  # L187
            raise ValueError(f"NvFp4 MoE backend '{backend}' does not support the deployment "
                             "configuration since kernel does not support current device cuda.")
        vlog(oracle, needle, logging.INFO,
             "Using '%s' NvFp4 MoE backend out of potential backends: %s.", backend, available)
        if backend == "MARLIN":  # oracle L324 -> marlin_utils_fp4.prepare_nvfp4_moe_layer_for_marlin
            vlog("model_executor/layers/quantization/utils/marlin_utils_fp4.py",
                 "be used leveraging the Marlin kernel. This may degrade", logging.WARNING,
                 "Your GPU does not have native support for FP4 computation but FP4 quantization "
                 "is being used. Weight-only FP4 compression will be used leveraging the Marlin "
                 "kernel. This may degrade performance for compute-heavy workloads.")
        return backend

    runner = vllm_config.kernel_config.moe_backend if hasattr(vllm_config, "kernel_config") else "auto"
    if runner and runner != "auto":  # L192-196, map_nvfp4_backend L116-131
        mapping = {"cutlass": "VLLM_CUTLASS", "flashinfer_trtllm": "FLASHINFER_TRTLLM",
                   "flashinfer_cutlass": "FLASHINFER_CUTLASS",
                   "flashinfer_cutedsl": "FLASHINFER_CUTEDSL", "marlin": "MARLIN"}
        if runner not in mapping:
            raise ValueError(f"moe_backend='{runner}' is not supported for NvFP4 MoE. "
                             f"Expected one of {list(mapping.keys())}.")
        return chosen(mapping[runner])
    if envs.is_set("VLLM_USE_FLASHINFER_MOE_FP4"):  # L198
        if not envs.VLLM_USE_FLASHINFER_MOE_FP4:
            for b in flashinfer:
                available.remove(b)
        elif envs.is_set("VLLM_FLASHINFER_MOE_BACKEND"):
            # flashinfer_utils.py get_flashinfer_moe_backend L98-124
            name = envs.VLLM_FLASHINFER_MOE_BACKEND
            if name == "latency" and not _cc(10):
                vlog("model_executor/layers/quantization/utils/flashinfer_utils.py",
                     '"Flashinfer TRTLLM MOE backend is only supported on "', logging.INFO,
                     "Flashinfer TRTLLM MOE backend is only supported on SM100 and later, "
                     "using CUTLASS backend instead")
                return chosen("FLASHINFER_CUTLASS")
            return chosen({"throughput": "FLASHINFER_CUTLASS", "latency": "FLASHINFER_TRTLLM",
                           "masked_gemm": "FLASHINFER_CUTEDSL"}[name])
        else:
            for backend in flashinfer:
                if supported[backend]:
                    return chosen(backend, "logger.info_once(_make_log_backend(backend), scope")
            raise NotImplementedError("Found VLLM_USE_FLASHINFER_MOE_FP4=1, but no FlashInfer "
                                      "NVFP4 MoE backend supports the configuration.")
    if envs.VLLM_TEST_FORCE_FP8_MARLIN:  # L240
        return chosen("MARLIN")
    for backend in available:  # L246
        if supported[backend]:
            return chosen(backend, "logger.info_once(_make_log_backend(backend), scope")
    raise NotImplementedError("No NvFp4 MoE backend supports the deployment configuration.")


# ------------------------------------------------------------------ the model (item 3)

def check_model_files(model: Path, draft: Path | None) -> None:
    """model_loader/default_loader.py _prepare_weights L89-200 for load_format auto on a
    Mistral-format folder (consolidated*.safetensors + consolidated.safetensors.index.json)."""
    index = model / "consolidated.safetensors.index.json"
    shards = sorted(model.glob("consolidated*.safetensors"))
    if index.is_file():  # weight_utils.py filter_duplicate_safetensors_files L633-651
        weight_map = json.loads(index.read_text())["weight_map"]
        named = {str(model / f) for f in weight_map.values()}
        shards = [s for s in shards if str(s) in named]
    if not shards:
        raise RuntimeError(f"Cannot find any model weights with `{model}`")  # L197
    if index.is_file():
        present = {s.name for s in shards}
        missing = {t for t, f in weight_map.items() if f not in present}
        if missing:
            # default_loader.py L389-397's message (see the module docstring).
            raise ValueError(f"Following weights were not initialized from checkpoint: {missing}")
    if draft is not None and not sorted(draft.glob("*.safetensors")):
        raise RuntimeError(f"Cannot find any model weights with `{draft}`")


# ------------------------------------------------------------------ the engine

# The seed's decode rates on a Thor (docs/facts.md "Benchmark method"): what thor.py's step model is
# fitted to, and what THORFLEET_SIM_DECODE_TOKS (tests only) scales the box's clock against.
EAGLE_TOKS, BASE_TOKS = 33.7, 17.5
# The engine's token budget a step is the max_num_batched_tokens the operator set, as a Thor's
# scheduler keeps it ("Chunked prefill is enabled with max_num_batched_tokens=8192"); vLLM's CPU
# platform, which the sim runs on, then turns chunked prefill off for an MLA model and sets the
# budget to max_model_len (platforms/cpu.py: 0.19.0 L362-371, 0.26.0 L318-326, 0.33.0 L538-547), so
# it is read from the arguments (serve()).
PREFILL_CHUNK: int | None = None


def time_scale(vllm_config) -> float:
    """1 on a Thor's clock; tests may run the same box faster (THORFLEET_SIM_DECODE_TOKS: the
    single-stream rate they want in place of the seed's)."""
    seed = EAGLE_TOKS if vllm_config.speculative_config is not None else BASE_TOKS
    return seed / float(os.environ.get("THORFLEET_SIM_DECODE_TOKS", seed))


ANSWER = ("This is the thorfleet stand-in engine answering: the prompt went through vLLM's own "
          "renderer, no weights were run.")
TRACE = "Thinking it over, step by step."
FILLER = " token"
HIT_FILLER = " cached"  # THORFLEET_SIM_HIT_ANSWERS_DIFFER's answer to a request that hit


def sample_arguments(tool: dict) -> dict:
    """Arguments for a tool call: each required parameter gets a plausible value of its type."""
    parameters = tool.get("parameters") or {}
    samples = {"string": "Paris", "integer": 1, "number": 1.0, "boolean": True}
    return {name: samples.get(spec.get("type"))
            for name, spec in (parameters.get("properties") or {}).items()
            if name in parameters.get("required", [])}



def cached_tokens(event: dict, prompt: int) -> dict:
    """The prompt tokens a step's output says were served from the prefix cache, in the field
    the installed vLLM reads: 0.19.0's EngineCoreOutput.num_cached_tokens (v1/engine/__init__.py),
    or, from 0.26.0 on, the first token's `prefill_stats` (PrefillStats.set, v1/metrics/stats.py;
    output_processor.py reads its num_cached_tokens for the answer's usage)."""
    from vllm.v1.engine import EngineCoreOutput

    if "num_cached_tokens" in EngineCoreOutput.__struct_fields__:
        return {"num_cached_tokens": event["cached"]}
    if event["step"] != 0:
        return {}
    from vllm.v1.metrics.stats import PrefillStats

    stats = PrefillStats()
    stats.set(num_prompt_tokens=prompt, num_local_cached_tokens=min(event["cached"], prompt),
              num_external_cached_tokens=0)
    return {"prefill_stats": stats}

class StandInCore:
    """The EngineCore client AsyncLLM talks to (v1/engine/core_client.py's async interface), in
    the API server's process; the engine core it sends requests to is a process of its own
    (standin_core.py), as MPClient runs it. Token ids are chosen here (the tokenizer is here),
    as many per output as the engine core's step yielded, as EngineCoreOutputs."""

    engine_ranks_managed = [0]

    def __init__(self, vllm_config, tokenizer):
        from vllm import envs

        self.vllm_config = vllm_config
        self.tokenizer = tokenizer
        # The engine core's death is what vLLM's /health reports (AsyncLLM.errored); a process
        # that is alive but stopped is not dead.
        self.resources = SimpleNamespace(engine_dead=False)
        spec = vllm_config.speculative_config
        self.spec_tokens = spec.num_speculative_tokens if spec is not None else 0
        self.queue: asyncio.Queue = asyncio.Queue()
        self.in_flight: dict[str, list[int]] = {}  # request id -> its token ids
        self.prompts: dict[str, int] = {}  # request id -> its prompt's tokens (the prefill's stats)
        self.draining = False
        self.loop = None
        vocab = tokenizer.get_vocab()
        self.special = {name: vocab.get(name) for name in (
            "[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]", "[INST]", "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]")}
        self.eos = tokenizer.eos_token_id
        self.filler = self.encode(FILLER)[0]
        cache_config = vllm_config.cache_config
        self.block_size = cache_config.block_size
        self.caching = bool(cache_config.enable_prefix_caching)
        if self.caching:
            # as the engine core sets its hasher up (v1/engine/core.py L199-208)
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_utils import init_none_hash

            self.hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
            init_none_hash(self.hash_fn)
        self.hit_differs = os.environ.get("THORFLEET_SIM_HIT_ANSWERS_DIFFER") == "1"
        self.other = self.encode(HIT_FILLER)[0]
        ours, theirs = socket.socketpair()
        self.sock = ours
        self.received = b""
        # The title vLLM gives its engine core (v1/engine/core.py L1054-1055,
        # utils/system_utils.py L193): `ps` and `docker top` find it by that name.
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("standin_core.py")),
             "--fd", str(theirs.fileno()), "--title", f"{envs.VLLM_PROCESS_NAME_PREFIX}::EngineCore",
             "--spec-tokens", str(self.spec_tokens),
             "--max-running", str(vllm_config.scheduler_config.max_num_seqs),
             "--budget", str(PREFILL_CHUNK or vllm_config.scheduler_config.max_num_batched_tokens),
             "--time-scale", str(time_scale(vllm_config)),
             "--kv-blocks", str(vllm_config.cache_config.num_gpu_blocks),
             "--block-size", str(self.block_size),
             *(["--prefix-caching"] if self.caching else []),
             *(["--eagle"] if spec is not None and spec.use_eagle() else [])],
            pass_fds=(theirs.fileno(),))
        theirs.close()
        ours.setblocking(False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def block_hashes(self, request, answer: list[int]) -> list[str]:
        """The hash chain of every full block of the prompt and then the answer, as the engine
        core's Request computes it (kv_cache_utils.py get_request_block_hasher L565-617, with
        vLLM's own hash_block_tokens L535-562); a cache_salt keys the first block (L518-520)."""
        from vllm.v1.core.kv_cache_utils import hash_block_tokens

        tokens = [*(request.prompt_token_ids or []), *answer]
        salt = getattr(request, "cache_salt", None)
        hashes, parent = [], None
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            extra = (salt,) if start == 0 and salt else None
            parent = hash_block_tokens(self.hash_fn, parent,
                                       tokens[start:start + self.block_size], extra)
            hashes.append(bytes(parent).hex())
        return hashes

    def plan(self, request) -> tuple[list[int], bool]:
        """(token ids, ends with EOS) for this prompt, as a model would answer it."""
        prompt = list(request.prompt_token_ids or [])
        params = request.sampling_params
        sp = self.special
        if sp["[INST]"] is None or sp["[INST]"] not in prompt:
            return [], False  # a raw completion prompt: filler to max_tokens
        if sp["[AVAILABLE_TOOLS]"] in prompt and sp["[/AVAILABLE_TOOLS]"] in prompt:
            start = len(prompt) - 1 - prompt[::-1].index(sp["[AVAILABLE_TOOLS]"])
            end = prompt.index(sp["[/AVAILABLE_TOOLS]"], start)
            tools = json.loads(self.tokenizer.decode(prompt[start + 1:end]))
            rng = random.Random(params.seed if params.seed is not None else request.request_id)
            # At temperature > 0 a model sometimes answers in text instead (issue 9 item 4).
            if tools and not (params.temperature > 0 and rng.random() < 0.3):
                tool = tools[0].get("function", tools[0])
                return ([sp["[TOOL_CALLS]"], *self.encode(tool["name"]), sp["[ARGS]"],
                         *self.encode(json.dumps(sample_arguments(tool)))], True)
        if prompt[-1] == sp["[THINK]"]:
            return [*self.encode(TRACE), sp["[/THINK]"], *self.encode(ANSWER)], True
        return self.encode(ANSWER), True

    def send(self, **message) -> None:
        try:
            self.sock.send((json.dumps(message) + "\n").encode())
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            pass  # a stopped or dead engine core reads nothing: what it misses stays undone

    def start_reading(self) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
            self.loop.add_reader(self.sock.fileno(), self.receive)

    def receive(self) -> None:
        """The engine core's outputs, as AsyncMPClient's output socket delivers them."""
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason
        from vllm.v1.metrics.stats import SchedulerStats

        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        if not data:  # the engine core died: vLLM's MPClient marks the engine dead
            self.loop.remove_reader(self.sock.fileno())
            self.resources.engine_dead = True
            for rid in list(self.in_flight):
                self.end(rid, report=True)
            return
        self.received += data
        *lines, self.received = self.received.split(b"\n")
        for line in lines:
            event = json.loads(line)
            # vLLM's Prometheus vllm:num_requests_running/_waiting come from these stats
            # (v1/metrics/loggers.py)
            stats = SchedulerStats(num_running_reqs=event["running"],
                                   num_waiting_reqs=event["waiting"], kv_cache_usage=event["kv"])
            if event.get("prefix"):
                # the step's lookups, as Scheduler.make_stats hands them on (scheduler.py
                # L1940-1960) to vllm:prefix_cache_queries/_hits (v1/metrics/loggers.py L1048-1053)
                prefix = stats.prefix_cache_stats
                prefix.requests, prefix.queries, prefix.hits = event["prefix"]
            outputs = []
            rid = event["rid"]
            if rid is not None and rid in self.in_flight:
                if event["spec"] is not None:
                    from vllm.v1.spec_decode.metrics import SpecDecodingStats

                    stats.spec_decoding_stats = SpecDecodingStats.new(self.spec_tokens)
                    stats.spec_decoding_stats.observe_draft(self.spec_tokens, event["spec"])
                ids, step = self.in_flight[rid], event["step"]
                tokens = [ids[i] if i < len(ids) else self.filler
                          for i in range(step, step + event["n"])]
                if self.hit_differs and event["cached"] > 0:  # tests only: see the docstring
                    tokens = [t if t == self.eos else self.other for t in tokens]
                finish = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}.get(
                    event["finish"])
                if finish is not None:  # FinishReason.STOP is 0: falsy
                    del self.in_flight[rid]
                outputs = [EngineCoreOutput(rid, tokens, finish_reason=finish,
                                            **cached_tokens(event, self.prompts.get(rid, 0)))]
                if finish is not None:
                    self.prompts.pop(rid, None)
            self.queue.put_nowait(EngineCoreOutputs(outputs=outputs, scheduler_stats=stats))

    def end(self, request_id: str, report: bool) -> None:
        """Stop a request; `report` sends its last output (finish_reason abort), as the engine
        core does for requests it aborts itself (v1/engine/core.py)."""
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, FinishReason

        if self.in_flight.pop(request_id, None) is not None:
            self.send(op="abort", rid=request_id)
        if report:
            self.queue.put_nowait(EngineCoreOutputs(
                outputs=[EngineCoreOutput(request_id, [], finish_reason=FinishReason.ABORT)]))

    # -- the async client interface AsyncLLM uses
    async def add_request_async(self, request) -> None:
        self.start_reading()
        rid = request.request_id
        if self.draining or self.resources.engine_dead:  # shutting down: refused at once
            self.end(rid, report=True)
            return
        ids, natural = self.plan(request)
        # ignore_eos (what `vllm bench serve --ignore-eos` sends): the answer goes on past its end
        # to max_tokens, as vLLM's SamplingParams.ignore_eos says ("continue generating tokens
        # after the EOS token is generated", sampling_params.py L216-218)
        natural = natural and not request.sampling_params.ignore_eos
        if natural:
            ids = [*ids, self.eos]
        max_tokens = request.sampling_params.max_tokens or 16
        self.in_flight[rid] = ids
        self.prompts[rid] = len(request.prompt_token_ids or [])
        stop = natural and len(ids) <= max_tokens
        steps = len(ids) if stop else max_tokens
        answer = [ids[i] if i < len(ids) else self.filler for i in range(steps)]
        self.send(op="add", rid=rid, prompt=len(request.prompt_token_ids or []), steps=steps,
                  finish="stop" if stop else "length",
                  blocks=self.block_hashes(request, answer) if self.caching else [])

    async def get_output_async(self):
        return await self.queue.get()

    async def abort_requests_async(self, request_ids) -> None:
        # AsyncLLM aborts (e.g. the client went away) and reports them itself; the running count
        # must still come down, as the scheduler's next stats say
        for rid in request_ids:
            self.end(rid, report=False)

    async def get_supported_tasks_async(self):
        return ("generate",)

    def get_kv_event_sources(self) -> dict:
        # 0.33.0: AsyncLLM.get_kv_event_sources (v1/engine/async_llm.py L1446-1447) asks its client,
        # for GET /kv_event_sources (entrypoints/serve/instrumentator/basic.py L63); a client
        # without KV-event publishers answers {} (v1/engine/core_client.py L93-95)
        return {}

    async def is_scheduler_paused_async(self) -> bool:
        return False

    async def is_sleeping_async(self) -> bool:
        return False

    def dp_engines_running(self) -> bool:
        return False

    def shutdown(self, timeout=None) -> None:
        """On SIGTERM vLLM calls this with --shutdown-timeout (entrypoints/launcher.py L95-115;
        0.33.0 entrypoints/launchers/launcher.py L264-280, through AsyncLLM.shutdown L305-313):
        requests in flight are finished for up to that long while new ones are refused, then the
        rest are aborted (docs/facts.md, "Thor realities"). Runs in an executor thread."""
        self.draining = True
        deadline = time.monotonic() + (timeout or 0)
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.in_flight and self.loop is not None and not self.loop.is_closed():
            for rid in list(self.in_flight):
                self.loop.call_soon_threadsafe(self.end, rid, True)
            time.sleep(0.3)  # let the aborts reach their streams before the server exits
        # the engine core goes with its server (MPClient's shutdown terminates it); a stopped one
        # too: SIGKILL reaches a stopped process
        if self.process.poll() is None:
            self.process.kill()

    def __getattr__(self, name):
        if name.endswith("_async"):  # resets, profiling, loras...: nothing to do without a GPU
            async def nothing(*_, **__):
                return None
            return nothing
        raise AttributeError(name)


def thor_block_size(cache_config) -> int:
    """The KV block a Thor's vLLM uses for this MLA model: the user's --block-size, else
    CacheConfig.DEFAULT_BLOCK_SIZE (16, config/cache.py L34), which TRITON_MLA, the one MLA
    backend valid on sm_110 (select_attention), supports (multiples of 16: triton_mla.py L43-50),
    so get_preferred_block_size keeps it (v1/attention/backend.py L189-197)."""
    if getattr(cache_config, "user_specified_block_size", False):
        return cache_config.block_size
    return 16


def weight_bytes(model: Path, draft: Path | None) -> int:
    """What loading puts in memory: the index's total_size (the sim's shards are tiny) and the
    draft's files."""
    index = model / "consolidated.safetensors.index.json"
    size = int(json.loads(index.read_text()).get("metadata", {}).get("total_size", 0)) \
        if index.is_file() else 0
    if draft is not None:
        size += sum(f.stat().st_size for f in draft.rglob("*") if f.is_file())
    return size


def kv_blocks(requested: int, weights: int, block_size: int, draft: bool,
              max_model_len: int) -> int:
    """KV blocks as vLLM sizes them after profiling (gpu_worker.py determine_available_memory:
    the requested memory less what the model takes; kv_cache_utils.py get_num_blocks: that over
    a block's bytes in every layer), the draft's layers included. The activations' peak that
    profiling also subtracts is not modelled (no figure for a Thor), so this errs a few GiB
    large. Never below one max_model_len sequence: vLLM refuses to start there
    (kv_cache_utils.py check_enough_kv_cache_memory)."""
    import thor

    model = thor.MISTRAL_SMALL_4
    per_token = model.kv_bytes // model.attention_layers \
        * (model.attention_layers + (thor.DRAFT_LAYERS if draft else 0))
    return max((requested - weights) // (block_size * per_token), -(-max_model_len // block_size))


def start_engine_core(vllm_config, started: float) -> None:
    """What the EngineCore process does before it answers (v1/engine/core.py, worker init, model
    load): memory check, kernel choice, weights. Raises what vLLM raises."""
    cache_config = vllm_config.cache_config
    requested = check_memory(cache_config)  # gpu_worker.py init_device -> request_memory
    # the executor sets the backend's block size before the KV cache is sized (uniproc_executor.py
    # L53 -> platforms/interface.py update_block_size_for_backend L427-474); the sim's CpuPlatform
    # set its own 128 (platforms/cpu.py L165-166), which a Thor never does
    cache_config.block_size = thor_block_size(cache_config)
    hold(THORSIM / "holds", requested, f"vllm-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    select_attention(vllm_config)
    select_nvfp4_gemm(vllm_config)
    select_nvfp4_moe(vllm_config)
    model = Path(vllm_config.model_config.model)
    spec = vllm_config.speculative_config
    draft = Path(spec.model) if spec is not None and spec.model else None
    check_model_files(model, draft)
    fill_page_cache(model, draft)
    seconds = float(os.environ.get("THORFLEET_SIM_LOAD_SECONDS", "5"))
    time.sleep(max(0.0, seconds - (time.time() - started)))
    vlog("model_executor/model_loader/default_loader.py", '"Loading weights took %.2f seconds"',
         logging.INFO, "Loading weights took %.2f seconds", time.time() - started)
    cache_config.num_gpu_blocks = cache_config.num_gpu_blocks or kv_blocks(
        requested, weight_bytes(model, draft), cache_config.block_size, draft is not None,
        vllm_config.model_config.max_model_len)


def make_engine(vllm_config):
    """AsyncLLM exactly as vLLM builds it, but with the stand-in EngineCore client."""
    from vllm.v1.engine import async_llm
    from vllm.v1.engine.core_client import EngineCoreClient

    made = {}

    def make_async_mp_client(vllm_config, **_):
        made["core"] = StandInCore(vllm_config, made["tokenizer"])
        return made["core"]

    renderer_from_config = async_llm.renderer_from_config

    def capture_renderer(config):
        renderer = renderer_from_config(config)
        made["tokenizer"] = renderer.tokenizer
        return renderer

    async_llm.renderer_from_config = capture_renderer
    original = EngineCoreClient.make_async_mp_client
    EngineCoreClient.make_async_mp_client = staticmethod(make_async_mp_client)
    try:
        return async_llm.AsyncLLM(vllm_config, executor_class=None, log_stats=True,
                                  log_requests=False)
    finally:
        EngineCoreClient.make_async_mp_client = original
        async_llm.renderer_from_config = renderer_from_config


# ------------------------------------------------------------------ main

def _bootstrap():
    """Import vLLM as on a CPU box, told which platform it is on."""
    global VLLM_DIR
    # docs/facts.md "Seen working here": else a speculators lookup retries the hub ~30 s
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import vllm
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    VLLM_DIR = Path(vllm.__file__).parent
    vllm.platforms._current_platform = CpuPlatform()


async def serve(args, started: float) -> int:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    if (VLLM_DIR / "entrypoints/launchers/api_server/entry.py").is_file():
        # 0.33.0: `vllm serve` takes setup_server and build_and_serve from here (cli/serve.py L19,
        # launchers/api_server/entry.py L24, L115); entrypoints/openai/api_server.py is left as a
        # re-export that warns DeprecationWarning on import (L1-31)
        from vllm.entrypoints.launchers.api_server import entry as api_server
    else:
        from vllm.entrypoints.openai import api_server

    # 0.2x: setup_server(args, *, reuse_port) (0.26.0 entrypoints/openai/api_server.py L616;
    # 0.33.0 entrypoints/launchers/launcher.py L365); 0.19.0: setup_server(args)
    reuse = "reuse_port" in inspect.signature(api_server.setup_server).parameters
    listen_address, sock = api_server.setup_server(args, **({"reuse_port": False} if reuse else {}))
    engine_args = AsyncEngineArgs.from_cli_args(args)
    global PREFILL_CHUNK
    PREFILL_CHUNK = engine_args.max_num_batched_tokens if engine_args.enable_chunked_prefill \
        is not False else None
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    # Prefix caching as the operator asked for it: vLLM 0.33.0's CPU platform, which the sim runs
    # on, also turns it off for an MLA model (platforms/cpu.py L533-545; 0.19.0's and 0.26.0's
    # rule leaves it on), and a Thor's CUDA platform never does.
    if engine_args.enable_prefix_caching and not vllm_config.cache_config.enable_prefix_caching:
        vllm_config.cache_config.enable_prefix_caching = True
    try:
        start_engine_core(vllm_config, started)
    except Exception:  # noqa: BLE001 - as v1/engine/core.py run_engine_core: logged, then fatal
        logging.getLogger("vllm.v1.engine.core").error(
            "EngineCore failed to start.\n%s", traceback.format_exc().rstrip())
        raise RuntimeError("Engine core initialization failed. See root cause above. "
                           "Failed core proc(s): {}") from None
    engine = make_engine(vllm_config)
    try:
        shutdown_task = await api_server.build_and_serve(engine, listen_address, sock, args)
        await shutdown_task
    finally:
        engine.shutdown()
        sock.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":
        # vLLM's own benchmark, nothing of it stood in: its CLI (entrypoints/cli/main.py) runs
        # `vllm bench serve` (entrypoints/cli/benchmark/serve.py -> benchmarks/serve.py), a client
        # of the door on CPU as on a Thor
        from vllm.entrypoints.cli.main import main as vllm_main

        sys.argv = ["vllm", *argv]
        vllm_main()
        return 0
    if not argv or argv[0] != "serve":
        print("usage: vllm serve [model_tag] [options]  (thorfleet stand-in: `serve`; `bench` is "
              "vLLM's own)", file=sys.stderr)
        return 2
    started = time.time()
    _bootstrap()
    import uvloop
    if (VLLM_DIR / "entrypoints/common/cli_args.py").is_file():
        # 0.33.0 moved the serve CLI's parser here (entrypoints/common/cli_args.py L431, L531;
        # cli/serve.py L13): entrypoints/openai/cli_args.py is gone
        from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    else:
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    args = parser.parse_args(argv[1:])  # unknown options: usage error, exit 2, as `vllm serve`
    if args.model_tag is not None:  # entrypoints/cli/serve.py L45-46
        args.model = args.model_tag
    validate_parsed_serve_args(args)
    try:
        return uvloop.run(serve(args, started))
    except KeyboardInterrupt:  # setup_server's SIGTERM handler while starting
        return 0
    except Exception:  # noqa: BLE001 - `vllm serve` dies with the traceback, exit 1
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
