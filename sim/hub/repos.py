"""Tiny, deterministic stand-ins for the two Hugging Face repos the deploy downloads.

The real checkpoint is ~70 GB; these repos keep its names and layout (params.json, tekken.json,
consolidated.safetensors.index.json, 13 consolidated-000NN-of-00013.safetensors shards; the EAGLE
draft's params.json and consolidated.safetensors) with a few hundred KB of valid safetensors each.

On disk (the server's --root):
    manifest.json       repos -> revisions -> files (size, sha256, git oid, LFS pointer info)
    blobs/<sha256>      file contents, shared by every revision that holds them

The model repo has two commits, so a deploy can be moved from one pinned revision to another:
the second changes params.json, README.md and the last shard, and keeps the other twelve shards.
Commit hashes are git-like hashes of the content, so the same inputs always give the same revisions.
"""

import hashlib
import json
import os
import random
import struct
from pathlib import Path

MODEL_REPO = "mistralai/Mistral-Small-4-119B-2603-NVFP4"
DRAFT_REPO = "mistralai/Mistral-Small-4-119B-2603-eagle"
SHARDS = 13
# The index's metadata.total_size, in bytes (docs/facts.md "Weights": ~66 GB).
MODEL_TOTAL_SIZE = 66_000_000_000
# Files the real hub keeps in Git LFS: served by redirect, with their sha256 as the etag.
LFS_SUFFIXES = (".safetensors", "tekken.json")
GITATTRIBUTES = (
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    b"tekken.json filter=lfs diff=lfs merge=lfs -text\n"
)
COMMIT_DATES = ("2026-03-16T10:00:00.000Z", "2026-03-24T09:30:00.000Z")

# The architecture as a Mistral-native params.json states it. The tensors below are tiny and do not
# match these sizes: nothing in the sim multiplies them, they only have to exist and parse.
MODEL_PARAMS = {
    "dim": 4096,
    "n_layers": 26,
    "head_dim": 128,
    "hidden_dim": 12288,
    "n_heads": 32,
    "n_kv_heads": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    # DeepSeek-V2-style MLA with a shared expert and Llama-4 scaling: vLLM 0.19.0 reads such a
    # params.json as MistralLarge3ForCausalLM (transformers_utils/configs/mistral.py); without
    # these keys it reads Mixtral and refuses the draft as EagleMistralForCausalLM.
    "qk_nope_head_dim": 64,
    "v_head_dim": 128,
    "llama_4_scaling": {"original_max_position_embeddings": 8192, "beta": 0.1},
    "rope_theta": 1000000.0,
    "norm_eps": 1e-05,
    "vocab_size": 131072,
    "max_position_embeddings": 262144,
    "tied_embeddings": False,
    "moe": {"num_experts": 128, "num_experts_per_tok": 4, "expert_hidden_dim": 1536,
            "num_shared_experts": 1},
    "quantization": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"},
    # The model takes images (seed 004 section 4.5; vLLM's recipe: image input through image_url),
    # so its params.json has a vision encoder, and vLLM reads the checkpoint as
    # PixtralForConditionalGeneration around the text model (configs/mistral.py L70-111): the text
    # profiles' --language-model-only sets its image limit to 0. Mistral Small 3.1's encoder as its
    # params.json states it (0.4B parameters); Small 4's is assumed the same (unconfirmed).
    "vision_encoder": {
        "hidden_size": 1024, "num_channels": 3, "max_image_size": 1540, "patch_size": 14,
        "rope_theta": 10000.0, "intermediate_size": 4096, "num_hidden_layers": 24,
        "num_attention_heads": 16, "adapter_bias": False, "mm_projector_id": "patch_merge",
        "spatial_merge_size": 2, "add_pre_mm_projector_layer_norm": True, "image_token_id": 10,
        "image_break_token_id": 12, "image_end_token_id": 13, "image_size": 1540,
    },
    "thorfleet_sim": "stand-in checkpoint: tiny tensors, real file layout",
}
DRAFT_PARAMS = {
    "dim": 4096,
    "n_layers": 2,
    "head_dim": 128,
    "n_heads": 32,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64,
    "v_head_dim": 128,
    "llama_4_scaling": {"original_max_position_embeddings": 8192, "beta": 0.1},
    "moe": {"num_experts": 128, "num_experts_per_tok": 4, "expert_hidden_dim": 1536,
            "num_shared_experts": 1},
    "norm_eps": 1e-05,
    "vocab_size": 131072,
    "eagle": {"method": "eagle", "target": MODEL_REPO},
    "thorfleet_sim": "stand-in EAGLE draft: tiny tensors, real file layout",
}
PLACEHOLDER_TEKKEN = {
    "thorfleet_sim": "placeholder tekken.json: no v15 test tokenizer was given to build_repos",
    "config": {"pattern": "", "num_vocab_tokens": 0, "default_vocab_size": 0, "version": "v15"},
    "vocab": [],
    "special_tokens": [],
}


def build_repos(dest_dir: Path, tekken_json: Path | None = None) -> dict[str, str]:
    """Write both repos under dest_dir (unless already there for the same inputs) and return
    {repo_id: pinned revision}. The pinned revision is each repo's first commit; the newer one is
    in repo_revisions()."""
    dest_dir = Path(dest_dir)
    tekken = Path(tekken_json).read_bytes() if tekken_json else _json(PLACEHOLDER_TEKKEN)
    inputs = hashlib.sha256(Path(__file__).read_bytes() + b"\0" + tekken).hexdigest()
    manifest_path = dest_dir / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("inputs") == inputs and _blobs_present(dest_dir, manifest):
            return _pins(manifest)

    (dest_dir / "blobs").mkdir(parents=True, exist_ok=True)
    repos = {
        MODEL_REPO: _model_commits(tekken),
        DRAFT_REPO: _draft_commits(),
    }
    manifest = {"inputs": inputs, "repos": {}}
    for repo_id, commits in repos.items():
        manifest["repos"][repo_id] = _record_commits(dest_dir, commits)
    # Written last and by rename: a running server (which reloads it) never sees half a manifest.
    tmp = manifest_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.replace(tmp, manifest_path)
    return _pins(manifest)


def repo_revisions(dest_dir: Path) -> dict[str, list[str]]:
    """Every commit of every repo built under dest_dir, oldest first (the last one is `main`)."""
    manifest = json.loads((Path(dest_dir) / "manifest.json").read_text())
    return {repo_id: list(repo["history"]) for repo_id, repo in manifest["repos"].items()}


def _pins(manifest: dict) -> dict[str, str]:
    return {repo_id: repo["history"][0] for repo_id, repo in manifest["repos"].items()}


def _blobs_present(dest_dir: Path, manifest: dict) -> bool:
    for repo in manifest["repos"].values():
        for commit in repo["commits"].values():
            for entry in commit["files"].values():
                if not (dest_dir / "blobs" / entry["sha256"]).is_file():
                    return False
    return True


# --- the repos' contents -------------------------------------------------------------------


def _model_commits(tekken: bytes) -> list[tuple[str, dict[str, bytes]]]:
    shards, weight_map = {}, {}
    for index in range(1, SHARDS + 1):
        name = f"consolidated-{index:05d}-of-{SHARDS:05d}.safetensors"
        tensors = _shard_tensors(index, revision=1)
        shards[name] = _safetensors(tensors)
        weight_map.update({tensor: name for tensor in tensors})
    # The shards are tiny, but the index declares the real checkpoint's size (docs/facts.md,
    # "Weights": ~66 GB by the seed), so the vLLM stand-in fills the box's page cache with what a
    # Thor's would hold after reading the model (sim/box/files/thorsim-memory).
    index_json = _json(
        {"metadata": {"total_size": MODEL_TOTAL_SIZE},
         "weight_map": dict(sorted(weight_map.items()))}
    )
    first = {
        ".gitattributes": GITATTRIBUTES,
        "README.md": _readme(MODEL_REPO, "Initial upload."),
        "params.json": _json(MODEL_PARAMS),
        "tekken.json": tekken,
        "consolidated.safetensors.index.json": index_json,
        **shards,
    }
    # The second commit re-exports the output layer (same tensor names, new bytes) and edits params.
    last = f"consolidated-{SHARDS:05d}-of-{SHARDS:05d}.safetensors"
    second = dict(first)
    second["README.md"] = _readme(
        MODEL_REPO, "Re-exported output layer; params.json states the draft."
    )
    second["params.json"] = _json({**MODEL_PARAMS, "speculative_draft": DRAFT_REPO})
    second[last] = _safetensors(_shard_tensors(SHARDS, revision=2))
    return [("Upload Mistral Small 4 NVFP4", first), ("Re-export output layer", second)]


def _draft_commits() -> list[tuple[str, dict[str, bytes]]]:
    tensors = {}
    for layer in range(2):
        tensors.update(_layer_tensors(f"draft.{layer}", layer))
    tensors["fc.weight"] = ("BF16", [64, 128], _bytes("draft.fc", 64 * 128 * 2))
    files = {
        ".gitattributes": GITATTRIBUTES,
        "README.md": _readme(DRAFT_REPO, "EAGLE draft for Mistral Small 4."),
        "params.json": _json(DRAFT_PARAMS),
        "consolidated.safetensors": _safetensors(tensors),
    }
    return [("Upload EAGLE draft", files)]


def _shard_tensors(index: int, revision: int) -> dict[str, tuple[str, list[int], bytes]]:
    """Two transformer layers per shard; the first shard also holds the embeddings, the last the
    final norm and output head (which revision 2 changes)."""
    tensors = {}
    if index == 1:
        tensors["tok_embeddings.weight"] = (
            "BF16",
            [256, 64],
            _bytes("tok_embeddings", 256 * 64 * 2),
        )
    for layer in (2 * (index - 1), 2 * (index - 1) + 1):
        tensors.update(_layer_tensors(f"layers.{layer}", layer))
    if index == SHARDS:
        tensors["norm.weight"] = ("BF16", [64], _bytes("norm", 128))
        tensors["output.weight"] = ("BF16", [256, 64], _bytes(f"output.r{revision}", 256 * 64 * 2))
    return tensors


def _layer_tensors(prefix: str, seed: int) -> dict[str, tuple[str, list[int], bytes]]:
    """NVFP4-shaped tensors: packed 4-bit weights (U8), FP8 block scales, an F32 global scale."""
    tensors = {}
    for name, rows, cols in (
        ("attention.wq_a", 64, 256),
        ("attention.wkv_a", 64, 256),
        ("feed_forward.experts.w13", 128, 512),
        ("feed_forward.experts.w2", 128, 256),
    ):
        key = f"{prefix}.{name}"
        tensors[f"{key}.weight"] = ("U8", [rows, cols], _bytes(key, rows * cols))
        tensors[f"{key}.weight_scale"] = (
            "F8_E4M3",
            [rows, cols // 8],
            _bytes(key + ".s", rows * cols // 8),
        )
        tensors[f"{key}.weight_global_scale"] = ("F32", [1], struct.pack("<f", 1.0 + seed / 64))
    tensors[f"{prefix}.attention_norm.weight"] = ("BF16", [64], _bytes(prefix + ".an", 128))
    tensors[f"{prefix}.ffn_norm.weight"] = ("BF16", [64], _bytes(prefix + ".fn", 128))
    return tensors


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]]) -> bytes:
    """The safetensors format: 8-byte little-endian header size, JSON header, raw tensor bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    raw += b" " * (-len(raw) % 8)  # the spec allows space padding; aligns the data
    return (
        struct.pack("<Q", len(raw)) + raw + b"".join(tensors[name][2] for name in sorted(tensors))
    )


def _bytes(seed: str, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _json(value) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def _readme(repo_id: str, note: str) -> bytes:
    return (
        f"---\nlicense: apache-2.0\nlibrary_name: vllm\n---\n# {repo_id} (thorfleet sim)\n\n"
        f"Tiny stand-in with the real file layout. {note}\n"
    ).encode()


# --- git-like bookkeeping --------------------------------------------------------------------


def _record_commits(dest_dir: Path, commits: list[tuple[str, dict[str, bytes]]]) -> dict:
    repo = {"commits": {}, "history": []}
    parent = ""
    for (message, files), date in zip(commits, COMMIT_DATES):
        entries = {path: _store(dest_dir, path, data) for path, data in sorted(files.items())}
        tree = hashlib.sha1(
            "".join(f"{p}\0{e['oid']}\n" for p, e in entries.items()).encode()
        ).hexdigest()
        commit = hashlib.sha1(
            f"tree {tree}\nparent {parent}\ndate {date}\n\n{message}\n".encode()
        ).hexdigest()
        repo["commits"][commit] = {
            "parent": parent or None,
            "date": date,
            "message": message,
            "files": entries,
        }
        repo["history"].append(commit)
        parent = commit
    repo["refs"] = {"main": parent}
    return repo


def _store(dest_dir: Path, path: str, data: bytes) -> dict:
    sha256 = hashlib.sha256(data).hexdigest()
    blob = dest_dir / "blobs" / sha256
    if not blob.is_file():
        tmp = blob.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, blob)
    entry = {"size": len(data), "sha256": sha256, "oid": _git_blob_oid(data), "lfs": None}
    if path.endswith(LFS_SUFFIXES):
        # Git stores an LFS pointer: the tree's oid is the pointer's, the etag the content's sha256.
        pointer = (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
        )
        pointer = pointer.encode()
        entry["oid"] = _git_blob_oid(pointer)
        entry["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": len(pointer)}
    return entry


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
