"""The base stand-in's kernel choice on a vLLM 0.33.0 base (sim/base/vllm_standin.py), read
from the shape of the installed code, never from its version.

No Docker, no vLLM: the stand-in module is loaded on its own, with stubs for the two vLLM modules
its choice reads (vllm.envs, vllm.utils.flashinfer), and VLLM_DIR is a tree of real excerpts of
the 0.33.0 wheel, each at its own line numbers (cited; the rest blank), so the shape checks and
the log lines' needles are checked against 0.33.0's text and the logged lines are 0.33.0's.
"""

import importlib.util
import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

STANDIN = Path(__file__).resolve().parents[2] / "sim" / "base" / "vllm_standin.py"
KERNELS = "model_executor/kernels/linear/__init__.py"
ORACLE = "model_executor/layers/fused_moe/oracle/nvfp4.py"

# vllm 0.33.0, {file: {first line: the lines from there}}
EXCERPTS_0_33_0 = {
    # L53-58: no NvFp4LinearBackend enum any more (0.19.0's rule)
    "model_executor/layers/quantization/utils/nvfp4_utils.py": {53: '''\
def cutlass_fp4_supported() -> bool:
    if not current_platform.is_cuda():
        return False
    capability_tuple = current_platform.get_device_capability()
    capability = -1 if capability_tuple is None else capability_tuple.to_int()
    return cutlass_scaled_mm_supports_fp4(capability)
'''},
    KERNELS: {
        264: '''\
        logger.info_once(
            "Applied linear backend override for %r: %r", quantization, override
        )
''',
        401: '''\
        logger.warning_once(
            "--linear-backend=%s has no kernel for this linear layer type; "
            "using automatic selection for that layer type.",
            backend,
        )
''',
        410: '''\
def _resolve_backend_kernels(
''',
        1259: '''\
        logger.info_once("Using %s for NVFP4 GEMM", force_kernel.__name__)
''',
        1303: '''\
        logger.info_once("Using %s for NVFP4 GEMM", kernel_cls.__name__)
''',
    },
    "model_executor/kernels/linear/nvfp4/marlin.py": {33: '''\
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        logger.warning_once(
            "Your GPU does not have native support for FP4 computation but "
            "FP4 quantization is being used. Weight-only FP4 compression "
'''},
    ORACLE: {
        166: '''\
        "b12x": NvFp4MoeBackend.B12X,
''',
        269: '''\
            if supported:
                logger.info_once(_make_log_backend(backend))
                return backend, k_cls
''',
        303: '''\
    # Select kernels in order of backend.
''',
        313: '''\
            if supported:
                logger.info_once(_make_log_backend(backend))
                return backend, k_cls
''',
    },
    "model_executor/layers/quantization/utils/marlin_utils_fp4.py": {340: '''\
    logger.warning_once(
        "Your GPU does not have native support for FP4 computation but "
'''},
}
POTENTIAL = ("['FLASHINFER_TRTLLM', 'FLASHINFER_CUTEDSL', 'FLASHINFER_CUTEDSL_BATCHED', "
             "'FLASHINFER_CUTLASS', 'VLLM_CUTLASS', 'MARLIN', 'HUMMING', 'EMULATION']")


def write_tree(root: Path, excerpts: dict) -> Path:
    for relpath, blocks in excerpts.items():
        lines: list[str] = []
        for first, text in sorted(blocks.items()):
            lines += [""] * (first - 1 - len(lines)) + text.splitlines()
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """vllm_standin loaded alone, on the 0.33.0 excerpts, with FlashInfer present (as on a Thor
    image) unless a test says otherwise through `standin.flashinfer`."""
    envs = types.SimpleNamespace(VLLM_DISABLED_KERNELS=[], VLLM_BATCH_INVARIANT=False)
    state = SimpleNamespace(flashinfer=True)
    flashinfer = types.ModuleType("vllm.utils.flashinfer")
    flashinfer.has_flashinfer = lambda: state.flashinfer
    vllm = types.ModuleType("vllm")
    vllm.__path__ = []
    vllm.envs = envs
    vllm.utils = types.ModuleType("vllm.utils")
    vllm.utils.__path__ = []
    vllm.utils.flashinfer = flashinfer
    for name, module in (("vllm", vllm), ("vllm.envs", envs), ("vllm.utils", vllm.utils),
                         ("vllm.utils.flashinfer", flashinfer)):
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location("vllm_standin_0_33_under_test", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.VLLM_DIR = write_tree(tmp_path / "vllm", EXCERPTS_0_33_0)
    module.envs, module.state = envs, state
    return module


def config(linear="auto", moe="auto", per_quant=None):
    return SimpleNamespace(kernel_config=SimpleNamespace(
        linear_backend=linear, moe_backend=moe, linear_backend_per_quant=per_quant))


def logged(caplog) -> list[tuple[str, int, str]]:
    return [(r.name, r.lineno, r.getMessage()) for r in caplog.records]


def test_a_thor_gets_flashinfer_cutlass_gemm_and_vllm_cutlass_moe(standin, caplog):
    """0.33.0 on (11, 0) with FlashInfer: the GEMM is FlashInfer's CUTLASS kernel, but the MoE is
    vLLM's CUTLASS: FlashInfer's CUTLASS MoE excludes SM110 (experts/flashinfer_cutlass_moe.py
    L128-139, flashinfer-ai/flashinfer#3134)."""
    caplog.set_level(logging.INFO)
    assert standin.select_nvfp4_gemm(config()) == "FlashInferCutlassNvFp4LinearKernel"
    assert standin.select_nvfp4_moe(config()) == "VLLM_CUTLASS"
    assert logged(caplog) == [
        ("vllm.model_executor.kernels.linear.__init__", 1303,
         "Using FlashInferCutlassNvFp4LinearKernel for NVFP4 GEMM"),
        ("vllm.model_executor.layers.fused_moe.oracle.nvfp4", 314,
         f"Using 'VLLM_CUTLASS' NvFp4 MoE backend out of potential backends: {POTENTIAL}."),
    ]


def test_without_flashinfer_the_gemm_is_vllms_cutlass(standin):
    standin.state.flashinfer = False
    assert standin.select_nvfp4_gemm(config()) == "CutlassNvFp4LinearKernel"
    assert standin.select_nvfp4_moe(config()) == "VLLM_CUTLASS"


def test_asking_for_flashinfer_cutlass_moe_is_refused_as_vllm_refuses_it(standin):
    with pytest.raises(ValueError, match=r"^NvFp4 MoE backend 'FLASHINFER_CUTLASS' does not "
                       r"support the deployment configuration since kernel does not support "
                       r"current device cuda\.$"):
        standin.select_nvfp4_moe(config(moe="flashinfer_cutlass"))
    with pytest.raises(ValueError, match=r"moe_backend='triton' is not supported for NvFP4 MoE"):
        standin.select_nvfp4_moe(config(moe="triton"))


def test_marlin_asked_for_is_served_with_vllms_warnings(standin, caplog):
    caplog.set_level(logging.INFO)
    assert standin.select_nvfp4_gemm(config(linear="marlin")) == "MarlinNvFp4LinearKernel"
    assert standin.select_nvfp4_moe(config(moe="marlin")) == "MARLIN"
    lines = logged(caplog)
    assert [(name.rsplit(".", 1)[-1], line) for name, line, _ in lines] == [
        ("__init__", 1303), ("marlin", 34), ("nvfp4", 270), ("marlin_utils_fp4", 340)]
    assert all("leveraging the Marlin kernel" in lines[i][2] for i in (1, 3))


def test_a_linear_backend_without_nvfp4_kernel_falls_back_with_a_warning(standin, caplog):
    """0.33.0 _filter_kernels_by_backend L393-407: no longer an error (0.26.0 failed)."""
    caplog.set_level(logging.INFO)
    assert standin.select_nvfp4_gemm(config(linear="triton")) == \
        "FlashInferCutlassNvFp4LinearKernel"
    assert logged(caplog)[0] == (
        "vllm.model_executor.kernels.linear.__init__", 401,
        ("--linear-backend=triton has no kernel for this linear layer type; using automatic "
         "selection for that layer type."))


def test_per_quant_override_disabled_kernels_and_batch_invariance(standin, caplog):
    caplog.set_level(logging.INFO)
    assert standin.select_nvfp4_gemm(config(per_quant={"nvfp4_w4a4": "cutlass"})) == \
        "CutlassNvFp4LinearKernel"
    assert logged(caplog)[0][1:] == (
        264, "Applied linear backend override for 'nvfp4_w4a4': 'cutlass'")
    standin.envs.VLLM_DISABLED_KERNELS = ["FlashInferCutlassNvFp4LinearKernel"]
    assert standin.select_nvfp4_gemm(config()) == "CutlassNvFp4LinearKernel"
    standin.envs.VLLM_BATCH_INVARIANT = True
    caplog.clear()
    assert standin.select_nvfp4_gemm(config()) == "CutlassNvFp4LinearKernel"
    assert logged(caplog)[-1][1] == 1259  # the forced kernel's line


def test_the_0_26_0_shape_keeps_its_own_rules(standin):
    """Without 0.33.0's _resolve_backend_kernels, the 0.26.0 rule applies: a --linear-backend with
    no NVFP4 kernel fails (0.26.0 kernels/linear/__init__.py L941-948)."""
    kernels = standin.VLLM_DIR / KERNELS
    kernels.write_text(kernels.read_text().replace("def _resolve_backend_kernels(", ""))
    with pytest.raises(ValueError, match="no 'triton' kernel exists for NVFP4 layers"):
        standin.select_nvfp4_gemm(config(linear="triton"))


def test_vllms_cutlass_kernel_is_chosen_by_cutlass_fp4_supported_as_upstream_reads_it(standin,
                                                                                    monkeypatch):
    """The FlashInfer-less base's refusal (tests/fleet/test_bases.py) rests on vLLM's CUTLASS kernel
    being supported on 11.0: cutlass_fp4_supported() as each base's source has it (its docstring
    cites them), and the choice follows it; a build without sm_110 FP4 kernels would get Marlin."""
    assert standin.cutlass_fp4_supported() is True
    standin.state.flashinfer = False
    monkeypatch.setattr(standin, "cutlass_fp4_supported", lambda: False)
    assert standin.select_nvfp4_gemm(config()) == "MarlinNvFp4LinearKernel"
    kernels = standin.VLLM_DIR / KERNELS  # the 0.26.0 shape (no _resolve_backend_kernels)
    kernels.write_text(kernels.read_text().replace("def _resolve_backend_kernels(", ""))
    assert standin.select_nvfp4_gemm(config()) == "MarlinNvFp4LinearKernel"
