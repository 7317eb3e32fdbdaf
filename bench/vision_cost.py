"""Benchmark what an image costs on the vision profile: its tokens, its bytes, its first token.

    python -m bench.vision_cost --out bench/results/vision-cost.json [--runs 3]

On the sim's fleet as tests/fleet/test_workloads.py leaves it (thor-12 on the vision profile
behind gw-1): for pictures of several sizes, sent as JPEG data: URLs through the door with one
question, the request body's bytes, the prompt tokens vLLM counted with the picture and without
it (vLLM's own multimodal processing and mistral_common's image encoder, on CPU), and the time to
an answer of one token (median of --runs), against the question alone. The tokens are vLLM's own
count; the time is the sim's: its engine prefills as sim/base/thor.py's step model says a Thor
does (bench/results/vision-cost.json was measured with the stand-in before that model, at a flat
1,500 tok/s), so it shows what the tokens cost there, not a Thor's encoder pass.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import sys
import time
from pathlib import Path

SIZES = ((84, 56), (512, 512), (1024, 768), (1540, 1540), (3000, 2000))


def picture(width: int, height: int) -> bytes:
    """A JPEG (quality 85) of shapes on a gradient: compresses as a photo of a part would."""
    from PIL import Image, ImageDraw

    image = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    draw = ImageDraw.Draw(image)
    for n in range(12):
        x, y = width * n // 12, height * ((n * 7) % 12) // 12
        draw.ellipse((x, y, x + width // 8, y + height // 8), fill=(40 + 17 * n, 80, 200 - 13 * n))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=85)
    return out.getvalue()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)

    from sim import fleet
    from tests.fleet.test_workloads import QUESTION, VISION, Door

    key = (fleet.state_dir() / "api_key").read_text().strip()
    door = Door({"url": f"https://127.0.0.1:{fleet.GATEWAY_HTTPS_PORT}",
                 "ca_file": str(fleet.state_dir() / "fleet-ca" / "fleet-ca.pem")}, key)

    def ask(content):
        """(prompt tokens, seconds to the answer, body bytes) of one request of one token."""
        body = json.dumps({"model": VISION, "max_tokens": 1, "temperature": 0,
                           "messages": [{"role": "user", "content": content}]}).encode()
        started = time.monotonic()
        status, answer = door.send("POST", "/v1/chat/completions", body)
        took = time.monotonic() - started
        if status != 200:
            raise SystemExit(f"{status}: {answer}")
        return answer["usage"]["prompt_tokens"], took, len(body)

    def measured(content):
        runs = [ask(content) for _ in range(args.runs)]
        return {"prompt_tokens": runs[0][0], "body_bytes": runs[0][2],
                "seconds_median": round(statistics.median(r[1] for r in runs), 3)}

    alone = measured([QUESTION])
    rows = []
    for width, height in SIZES:
        jpeg = picture(width, height)
        url = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
        row = measured([QUESTION, {"type": "image_url", "image_url": {"url": url}}])
        row.update({"width": width, "height": height, "jpeg_bytes": len(jpeg),
                    "image_tokens": row["prompt_tokens"] - alone["prompt_tokens"],
                    "seconds_added": round(row["seconds_median"] - alone["seconds_median"], 3)})
        rows.append(row)
        print(f"{width}x{height}: {row['image_tokens']} image tokens, {len(jpeg)} JPEG bytes, "
              f"+{row['seconds_added']} s to the first token", flush=True)
    result = {"as_of": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": args.runs,
              "model": VISION, "question_alone": alone, "pictures": rows}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
