#!/usr/bin/env python3
"""Write a version-15 *test* tekken tokenizer, derived from one shipped in the mistral_common wheel.

The real Mistral Small 4 tekken.json cannot be fetched here. Chat rendering only depends on the
tokenizer's version, its special tokens and its model-settings builder, so we take the wheel's
newest tekken file (BPE vocabulary and pattern unchanged) and give it what a v15 file has:
the v15 version tag, Small 3.1's image settings, the control tokens v13+ use ([ARGS], [CALL_ID], [THINK], [/THINK]) plus v15's
[MODEL_SETTINGS]/[/MODEL_SETTINGS], and a builder that accepts reasoning_effort "none" | "high".
The ranks of the added tokens are ours (not confirmed against the real file).

Shared by the image build's self-check (files/image/chatfix.py) and the sim hub, which serves the
output as the model repo's tekken.json. Output is deterministic for a given mistral_common.

    python3 v15_test_tokenizer.py OUT.json
"""

import json
import sys
from pathlib import Path

import mistral_common

SOURCE = "tekken_240911.json"  # the newest tekken file in mistral_common 1.11.0's data/

# rank -> token: ranks 0-19 are the classic tekken control tokens; the rest fill slots that
# newer tekken files use. Ranks not listed become <SPECIAL_n> fillers.
SPECIAL_TOKENS = {
    0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]",
    5: "[AVAILABLE_TOOLS]", 6: "[/AVAILABLE_TOOLS]", 7: "[TOOL_RESULTS]", 8: "[/TOOL_RESULTS]",
    9: "[TOOL_CALLS]", 10: "[IMG]", 11: "<pad>", 12: "[IMG_BREAK]", 13: "[IMG_END]",
    14: "[PREFIX]", 15: "[MIDDLE]", 16: "[SUFFIX]", 17: "[SYSTEM_PROMPT]", 18: "[/SYSTEM_PROMPT]",
    19: "[TOOL_CONTENT]",
    32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]",
    36: "[MODEL_SETTINGS]", 37: "[/MODEL_SETTINGS]",
}
LAST_RANK = max(SPECIAL_TOKENS)

# The image encoder's settings as Mistral Small 3.1's tekken.json states them (14-pixel patches,
# merged 2x2, images resized to at most 1540 pixels a side); Small 4's are assumed the same
# (unconfirmed). The source file's are Pixtral 12B's (16, 1024, unmerged).
IMAGE = {"image_patch_size": 14, "max_image_size": 1540, "spatial_merge_size": 2}

# Absent reasoning_effort means "none": the model answers directly unless asked to reason.
MODEL_SETTINGS_BUILDER = {
    "reasoning_effort": {
        "type": "enum", "accepts_none": True, "default": "none", "values": ["none", "high"],
    },
}


def derive(source: Path) -> dict:
    data = json.loads(source.read_text(encoding="utf-8"))
    data["config"]["version"] = "v15"
    # mistral_common pads the list up to default_num_special_tokens by position, so the list we
    # write must be contiguous from rank 0.
    data["special_tokens"] = [
        {"rank": rank, "token_str": SPECIAL_TOKENS.get(rank, f"<SPECIAL_{rank}>"), "is_control": True}
        for rank in range(LAST_RANK + 1)
    ]
    data["model_settings_builder"] = MODEL_SETTINGS_BUILDER
    data["image"] = IMAGE
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    source = Path(mistral_common.__file__).parent / "data" / SOURCE
    out = Path(argv[1])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(derive(source), ensure_ascii=False), encoding="utf-8")
    tmp.replace(out)
    print(f"wrote v15 test tokenizer {out} (from mistral_common {mistral_common.__version__} {SOURCE})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
