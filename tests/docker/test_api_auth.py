# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""The API key guards every route the server mounts, against vLLM 0.19.0's own app.

vLLM 0.19.0's `--api-key` / `VLLM_API_KEY` middleware checks only paths that start with `/v1`
(entrypoints/openai/server_utils.py L38-83): `/invocations` (full chat completions, vllm #58144),
`/inference/v1/generate` (PR #42064), `/tokenize`, `/detokenize`, `/scale_elastic_ep` and others
answer without the key (docs/facts.md "Thor realities"). thorfleet's derived image carries
patches/vllm-api-key-every-route.diff: deny by default, open only ALLOWLIST.

The probe below runs in a container of the image under the nvidia runtime (vLLM imports torch,
which needs its libcuda.so.1). It builds the app with vLLM's own `build_app(args)` from the seed's
serve options (the config YAML, `--attention-backend TRITON_MLA --language-model-only`, key from
`VLLM_API_KEY` as thorfleet's unit passes it), walks every route `app.routes` mounts, and calls
each through the whole ASGI stack (CORS, auth, routing) three times: without the key, with a
wrong key, with the key. No engine stands behind it: with the key a handler may answer 4xx/5xx
for want of one; what is tested is only whether the key was asked for.
"""

import json

import docker.errors
import pytest

from sim.base.testing import (  # noqa: F401
    SEED_CONFIG,
    base_image,
    derived_image,
    docker_client,
)

# Liveness and load (probes, load balancers), /version, and /metrics: Prometheus scrapes it
# without a key and it holds counters only (no prompts, no outputs). Same list as the patch.
ALLOWLIST = {"/health", "/ping", "/load", "/version", "/metrics"}
# Mounted by vLLM 0.19.0 for a generate model outside /v1, so open before the patch
# (docs/facts.md "Thor realities").
OPEN_IN_0_19_0 = {"/invocations", "/inference/v1/generate", "/tokenize", "/detokenize"}

PROBE = r'''
import asyncio, json, os, re, sys, tempfile
os.environ["HF_HUB_OFFLINE"] = "1"  # docs/facts.md "Seen working here": else a hub lookup retries
os.environ["VLLM_API_KEY"] = KEY = "thorfleet-test-key"
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
import vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()  # no GPU behind the stand-in runtime
from vllm.entrypoints.openai.api_server import build_app
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser

with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as config:
    config.write(sys.argv[1])
args = make_arg_parser(FlexibleArgumentParser()).parse_args(
    ["/model", "--config", config.name, "--attention-backend", "TRITON_MLA",
     "--language-model-only"])
args.model = args.model_tag  # as the `vllm serve` CLI does
validate_parsed_serve_args(args)
# What the engine reports for this checkpoint (a generate model, language only).
app = build_app(args, supported_tasks=("generate",))

try:  # FastAPI >= 0.13x keeps included routers lazily; this walks them all
    from fastapi.routing import iter_route_contexts
    routes = [(c.path, sorted(c.methods or ["GET"]), type(c.route).__name__)
              for c in iter_route_contexts(app.routes)]
except ImportError:
    routes = [(r.path, sorted(getattr(r, "methods", None) or ["GET"]), type(r).__name__)
              for r in app.routes]

async def call(method, path, key=None, extra=()):
    statuses = []
    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}
    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
    headers = [(b"host", b"localhost:8002"), (b"content-type", b"application/json"), *extra]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
             "server": ("localhost", 8002), "client": ("10.0.0.9", 40000), "state": {}}
    try:
        await asyncio.wait_for(app(scope, receive, send), 20)
    except asyncio.TimeoutError:
        return statuses[0] if statuses else "timeout"
    except Exception as error:  # a handler with no engine behind it; the status was sent
        if not statuses:
            return f"raised {type(error).__name__}"
    return statuses[0]

async def main():
    results = []
    for path, methods, kind in routes:
        concrete = re.sub(r"\{[^}]*\}", "x", path)
        for method in methods:
            if method == "HEAD":
                continue
            results.append({"path": path, "method": method, "kind": kind,
                            "without": await call(method, concrete),
                            "wrong": await call(method, concrete, "not-the-key"),
                            "with": await call(method, concrete, KEY)})
    preflight = [(b"origin", b"http://example.com"), (b"access-control-request-method", b"POST")]
    extra = {"unknown": {"without": await call("POST", "/no/such/route"),
                         "with": await call("POST", "/no/such/route", KEY)},
             "preflight": await call("OPTIONS", "/v1/chat/completions", extra=preflight)}
    print("RESULT " + json.dumps({"routes": results, "extra": extra}))

asyncio.run(main())
'''


def probe(client, image: str) -> dict:
    """Every route of `image`'s vLLM app, called without, with a wrong and with the key."""
    try:
        out = client.containers.run(
            image, ["python3", "-c", PROBE, SEED_CONFIG], remove=True, network_mode="none",
            runtime="nvidia", entrypoint=[]).decode()
    except docker.errors.ContainerError as error:
        raise AssertionError(f"the probe failed in {image}:\n"
                             f"{error.stderr.decode(errors='replace')}") from None
    line = [x for x in out.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line.removeprefix("RESULT "))


@pytest.fixture(scope="module")
def serves_the_api(docker_client, base_image):
    """The base image must carry vLLM's API server's packages (fastapi and friends): a base that
    lost them is a broken base, and fails here rather than skipping the key's tests."""
    try:
        docker_client.containers.run(base_image, ["python3", "-c", "import fastapi, uvicorn"],
                                     remove=True, network_mode="none", entrypoint=[])
    except docker.errors.ContainerError as error:
        pytest.fail(f"{base_image} lacks vLLM's API server packages (fastapi, uvicorn): "
                    f"{error.stderr.decode(errors='replace').strip()[-500:]}", pytrace=False)
    return base_image


@pytest.fixture(scope="module")
def derived(docker_client, serves_the_api):
    tag = derived_image(docker_client, serves_the_api)
    assert "api-key-every-route=applied" in docker_client.images.get(tag).labels["thorfleet.patches"]
    return tag


def test_the_base_leaves_routes_open_without_the_key(docker_client, serves_the_api):
    """The hole is real in vLLM 0.19.0's own app, so the test below can see it closed."""
    results = probe(docker_client, serves_the_api)
    open_paths = {r["path"] for r in results["routes"] if r["without"] != 401}
    assert OPEN_IN_0_19_0 <= open_paths, open_paths
    assert all(r["without"] == 401 for r in results["routes"] if r["path"].startswith("/v1"))


def test_every_route_but_the_allowlist_needs_the_key(docker_client, derived):
    results = probe(docker_client, derived)
    routes = results["routes"]
    mounted = {r["path"] for r in routes}
    # What vLLM 0.19.0 mounts for this model (docs/facts.md "Thor realities"): the probe really
    # walked the app.
    assert OPEN_IN_0_19_0 | ALLOWLIST | {"/v1/chat/completions", "/v1/completions",
                                         "/v1/models", "/v1/chat/completions/render"} <= mounted
    wrong = [r for r in routes if (r["without"] == 401) == (r["path"] in ALLOWLIST)
             or (r["wrong"] == 401) == (r["path"] in ALLOWLIST) or r["with"] == 401]
    assert not wrong, json.dumps(wrong, indent=1)
    # A route no router knows asks for the key too (deny by default), and is unknown with it.
    assert results["extra"]["unknown"] == {"without": 401, "with": 404}
    # CORS preflight passes as vLLM lets it (the auth middleware skips OPTIONS).
    assert results["extra"]["preflight"] == 200
    print(f"{len(routes)} route/method pairs; open without the key: "
          f"{sorted({r['path'] for r in routes if r['without'] != 401})}")
