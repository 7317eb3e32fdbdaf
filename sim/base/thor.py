"""What one step of vLLM's engine takes on a Jetson AGX Thor: a roofline, as the field's simulators
predict a step (LLM-Viewer from bytes and FLOPs; Vidur, MLSys 2024, as a sum of its operators'
times). A step reads the weights its tokens touch (the dense part once, each routed expert the
batch's tokens select once) and every sequence's KV cache, and does 2 FLOPs per active weight per
token plus attention over each token's context. Its time is a fixed cost a step (launches,
sampling, the scheduler: `Box.overhead`), plus bytes over the box's sustained bandwidth, plus
FLOPs over the FP4 throughput a Thor reaches in a prefill. Fitted to this model's own two points
only: the overhead to the seed's single-stream 17.5 tok/s, EAGLE's acceptance to its 33.7. Held
against figures it was not fitted to: bench/standin_model.py writes
bench/results/standin-model.json, sim/README.md quotes it.

Why a fixed cost and not one efficiency for everything: 17.5 tok/s is a quarter of what the
bandwidth allows a step of one token, and EAGLE's 33.7 says a step verifying 4 tokens (which
touch up to 4 times the experts) costs under twice one of 1 token. A stack that only read weights
slowly could not do that; one whose step is three quarters fixed cost can.

Every constant is here, with its source. Stdlib only: the engine core imports it (standin_core.py)
and so do the fast tests and the benchmark.
"""

import math
from dataclasses import dataclass

NVFP4 = 0.5625  # bytes a weight: 4 bits and one FP8 scale per 16 weights (NVIDIA's NVFP4 format)
INT4_GPTQ = 0.52  # bytes a weight: 4 bits and an FP16 scale per 128 (GPTQ's group size 128)


@dataclass(frozen=True)
class Machine:
    bandwidth: float  # bytes/s a long read sustains
    fp4: float  # FLOP/s a prefill reaches


# Jetson AGX Thor T5000: "128GB LPDDR5x DRAM 4266 MHz 256-bit, 273 GB/s" (NVIDIA's module table, as
# RidgeRun's Jetson AGX Thor SoM overview copies it); a sustained 635 MB read reached 264 GB/s on a
# T5000 (FlashRT issue #153), the figure used. Its "2070 FP4 TFLOPS" is a tensor-core peak no
# prefill reaches; what one does: TensorRT Edge-LLM v0.9.0's llm_bench prefills 2,048 tokens of
# Qwen3-30B-A3B (3.3B active, NVFP4) at batch 1 in 137.0 ms on a Thor (user_guide/performance,
# performance-benchmarks.md), 2 x 3.3e9 x 2048 / 0.137 = 98.7 TFLOP/s, counting the whole time as
# compute. That is the one figure not of this model the stand-in uses, for want of any prefill
# figure of Mistral Small 4 on a Thor; its v0.7.0 prefills stay held out.
THOR = Machine(bandwidth=264e9, fp4=2 * 3.3e9 * 2048 / 0.137)


@dataclass(frozen=True)
class Model:
    name: str
    total: float  # parameters
    active: float  # parameters a token uses (dense part, its experts, the shared ones)
    experts: int  # routed experts a MoE layer
    per_token: int  # routed experts a token selects
    bytes_per_weight: float
    attention_layers: int
    heads: int
    head_flops: int  # qk + v head dims: attention's FLOPs are 2 x heads x this a context token
    kv_bytes: int  # KV cache bytes a token of context, all layers

    @property
    def routed(self) -> float:
        """Parameters in routed experts: active = dense + routed x per_token / experts, total =
        dense + routed."""
        return (self.total - self.active) / (1 - self.per_token / self.experts)

    @property
    def dense(self) -> float:
        return self.total - self.routed

    def touched(self, tokens: int) -> float:
        """Routed experts a MoE layer reads for `tokens` tokens, each choosing per_token of them
        uniformly: the expected size of the union (routing is not uniform on a real model; a
        skewed one touches fewer, so this errs toward slower batches)."""
        return self.experts * (1 - (1 - self.per_token / self.experts) ** tokens)

    def weight_bytes(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return (self.dense + self.routed * self.touched(tokens) / self.experts) \
            * self.bytes_per_weight


# Mistral Small 4: "119B total parameters, with 6B active parameters per token (8B including
# embedding and output layers)", "128 experts, with 4 active per token" (Mistral's announcement);
# the seed (000) says 6.5B active, the figure every sim doc uses. MLA in each of 36 layers, 32 heads,
# qk_nope 64 + qk_rope 64 and v 128, kv_lora_rank 256 + qk_rope 64 cached a token (NeMo AutoModel's
# Mistral4Config, model_type mistral4: num_hidden_layers=36, kv_lora_rank=256, qk_rope_head_dim=64,
# v_head_dim=128, qk_nope_head_dim=64; the checkpoint's params.json was not read), the cache in
# BF16 (kv_cache_dtype auto). NVFP4 (the checkpoint's quantization).
MISTRAL_SMALL_4 = Model("Mistral Small 4 119B", total=119e9, active=6.5e9, experts=128,
                        per_token=4, bytes_per_weight=NVFP4, attention_layers=36, heads=32,
                        head_flops=64 + 64 + 128, kv_bytes=36 * (256 + 64) * 2)
# Its EAGLE draft: ~0.4 GB (docs/facts.md, "Weights"), read once a drafted token; its 2 MLA
# layers (docs/facts.md, "Weights") hold a KV cache beside the target's.
DRAFT_BYTES = 0.4e9
DRAFT_LAYERS = 2
# The seed's measurements (docs/facts.md "Benchmark method": /v1/completions, one prompt, 512
# tokens, single stream, rate = completion tokens / whole request time): the two points the model is
# fitted to. The prompt's length is not given; 200 tokens is taken (a short coding request).
SEED_BASE, SEED_EAGLE, SEED_PROMPT, SEED_TOKENS = 17.5, 33.7, 200, 512


@dataclass(frozen=True)
class Work:
    """One sequence's part of a step: `tokens` new tokens after `context` already cached."""
    tokens: int
    context: int


def step_seconds(model: Model, machine: Machine, overhead: float, works, draft: int = 0) \
        -> float:
    """A step's time: its fixed cost + bytes / bandwidth + FLOPs / FP4 throughput. With EAGLE,
    `draft` drafted tokens a sequence follow, each a pass of the draft (its weights read once)."""
    works = list(works)
    tokens = sum(w.tokens for w in works)
    kv = sum(w.context + w.tokens for w in works) * model.kv_bytes
    # attention: each new token against its context (causal inside the chunk)
    attention = sum(2 * model.heads * model.head_flops * model.attention_layers
                    * (w.tokens * w.context + w.tokens * (w.tokens + 1) / 2) for w in works)
    flops = 2 * model.active * tokens + attention
    seconds = overhead + (model.weight_bytes(tokens) + kv) / machine.bandwidth \
        + flops / machine.fp4
    if draft and works:
        seconds += draft * DRAFT_BYTES / machine.bandwidth
    return seconds


def solve(f, low: float, high: float, target: float) -> float:
    """x in [low, high] with f(x) = target, f increasing; bisection."""
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) < target else (low, middle)
    return (low + high) / 2


def single_stream(model, machine, overhead, prompt, tokens, spec=0, accept=0.0) -> float:
    """tok/s of one request alone, the seed's way: tokens / (prefill + decode). With EAGLE a step
    verifies 1 + spec tokens and yields 1 + accept of them on average."""
    seconds = step_seconds(model, machine, overhead, [Work(prompt, 0)])
    made, context = 1, prompt
    while made < tokens:
        seconds += step_seconds(model, machine, overhead, [Work(1 + spec, context)], spec)
        made += 1 + accept
        context += 1 + accept
    return tokens / seconds


@dataclass(frozen=True)
class Box:
    """A Thor serving one model: its stack's fixed cost a step and EAGLE's acceptance, fitted to
    the seed's single-stream rates."""
    model: Model
    machine: Machine
    spec_tokens: int = 0
    # whose seed rates the fixed cost and the acceptance are fitted to: the served model's, or,
    # for the held-out figures, Mistral Small 4's stack serving another model's weights
    fitted_on: Model | None = None

    @property
    def overhead(self) -> float:
        return _overhead(self.fitted_on or self.model, self.machine)

    @property
    def accept_mean(self) -> float:
        """Draft tokens accepted a step, so that the seed's 33.7 tok/s comes out."""
        if not self.spec_tokens:
            return 0.0
        return _accept(self.fitted_on or self.model, self.machine, self.spec_tokens)

    def step_seconds(self, works, decoding: bool) -> float:
        """A step's time for its (new tokens, cached context) pairs; with decodes in it, an EAGLE
        box's step carries the draft's passes."""
        return step_seconds(self.model, self.machine, self.overhead, works,
                            self.spec_tokens if decoding else 0)


_fitted: dict = {}


def _overhead(model, machine) -> float:
    """The fixed cost a step that gives the seed's 17.5 tok/s (the rate falls as it grows:
    solved on the rate's negative)."""
    key = ("overhead", model, machine)
    if key not in _fitted:
        _fitted[key] = solve(lambda c: -single_stream(model, machine, c, SEED_PROMPT,
                                                     SEED_TOKENS), 0.0, 1.0, -SEED_BASE)
    return _fitted[key]


def _accept(model, machine, spec) -> float:
    key = ("accept", model, machine, spec)
    if key not in _fitted:
        overhead = _overhead(model, machine)
        _fitted[key] = solve(lambda a: single_stream(model, machine, overhead, SEED_PROMPT,
                                                     SEED_TOKENS, spec, a),
                             0.0, float(spec), SEED_EAGLE)
    return _fitted[key]


def rounded(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}") if x and math.isfinite(x) else x
