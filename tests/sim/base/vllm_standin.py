"""`vllm serve` stand-in for the simulated base image (there is no GPU here).

What is real: the installed vLLM 0.19.0's own argument parser (`--config` YAML included; an
option vLLM does not know is refused with its usage error), its Mistral tokenizer wrapper and chat
preprocessing (so an unpatched image answers chat with the same 400 as on a Thor), its request
and error models, its memory check and message, and its log format. The log lines carry the
messages, files and line numbers of the vLLM sources that print them on a Thor.

What is stand-in: no weights are run. Loading takes THORFLEET_SIM_LOAD_SECONDS (default 5;
the port refuses meanwhile); answers are canned text (a tool call of the first tool when tools
are given; `stream: true` gets the answer as server-sent events), produced at
THORFLEET_SIM_DECODE_TOKS tokens/s (default the seed's Thor figures: 33.7 with speculative
decoding, 17.5 without). Free/total "device" memory are MemAvailable/MemTotal of
THORFLEET_SIM_MEMINFO (default /proc/meminfo). THORFLEET_SIM_MARLIN=1 makes the
kernel selection log the slow Marlin fallback instead of FlashInfer-CUTLASS.

    vllm serve /model --config /config/vllm.yaml --attention-backend TRITON_MLA --language-model-only
"""

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import vllm
import vllm.logger  # configures vLLM's own log handler and format

GIB = 1 << 30
VLLM_DIR = Path(vllm.__file__).parent
log = logging.getLogger("vllm")


# ------------------------------------------------------------------ logging as vLLM does

def _line_of(relpath: str, needle: str) -> int:
    """Line of `needle` in the installed vLLM source, so log lines point where vLLM's would."""
    try:
        for number, line in enumerate((VLLM_DIR / relpath).read_text().splitlines(), 1):
            if needle in line:
                return number
    except OSError:
        pass
    return 0


def vlog(relpath: str, needle: str, level: int, message: str, *args) -> None:
    name = "vllm." + relpath.removesuffix(".py").replace("/", ".")
    logger = logging.getLogger(name)
    record = logger.makeRecord(name, level, str(VLLM_DIR / relpath), _line_of(relpath, needle),
                               message, args, None)
    logger.handle(record)


def quiet_imports():
    """Import the heavy parts of vLLM with its logger muted: on a CPU box they complain about
    missing Triton and CUDA kernels, which a Thor would not print."""
    log.setLevel(logging.CRITICAL)
    try:
        import vllm.platforms
        from vllm.platforms.cpu import CpuPlatform

        # No CUDA here: tell vLLM which platform it is on, so its config classes can be built.
        vllm.platforms._current_platform = CpuPlatform()
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.v1.worker.utils import request_memory
        return SimpleNamespace(make_arg_parser=make_arg_parser, request_memory=request_memory,
                               validate=validate_parsed_serve_args, Parser=FlexibleArgumentParser)
    finally:
        log.setLevel(logging.INFO)


# ------------------------------------------------------------------ start-up

def parse_serve_args(v, argv: list[str]):
    parser = v.make_arg_parser(v.Parser(prog="vllm serve"))
    args = parser.parse_args(argv)  # unknown options: usage error, exit 2, as `vllm serve`
    v.validate(args)
    if args.model_tag is not None:
        args.model = args.model_tag
    defaults = vars(parser.parse_args([]))
    changed = {k: val for k, val in vars(args).items() if val != defaults.get(k) and k != "model_tag"}
    return args, changed


def meminfo() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in bytes: on Thor's unified memory these are what CUDA reports."""
    fields = {}
    for line in Path(os.environ.get("THORFLEET_SIM_MEMINFO", "/proc/meminfo")).read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = int(value.split()[0]) * 1024
    return fields["MemAvailable"], fields["MemTotal"]


def check_memory(v, args) -> None:
    free, total = meminfo()
    snapshot = SimpleNamespace(free_memory=free, total_memory=total, device_="cuda:0")
    v.request_memory(snapshot, SimpleNamespace(gpu_memory_utilization=args.gpu_memory_utilization))


def log_kernels(args) -> None:
    marlin = os.environ.get("THORFLEET_SIM_MARLIN") == "1"
    attention = args.attention_backend or "FLASH_ATTN"
    vlog("platforms/cuda.py", '"Using %s backend."', logging.INFO, "Using %s backend.",
         f"AttentionBackendEnum.{attention}")
    gemm = "MARLIN" if marlin else "FLASHINFER_CUTLASS"
    moe = "MARLIN" if marlin else "FLASHINFER_CUTLASS"
    if marlin:
        vlog("model_executor/layers/quantization/utils/marlin_utils_fp4.py",
             "Your GPU does not have native support for FP4", logging.WARNING,
             "Your GPU does not have native support for FP4 computation but FP4 quantization is "
             "being used. Weight-only FP4 compression will be used leveraging the Marlin kernel. "
             "This may degrade performance for compute-heavy workloads.")
    vlog("model_executor/layers/quantization/utils/nvfp4_utils.py", "for NVFP4 GEMM", logging.INFO,
         "Using NvFp4LinearBackend.%s for NVFP4 GEMM", gemm)
    backends = ["FLASHINFER_TRTLLM", "FLASHINFER_CUTEDSL", "FLASHINFER_CUTLASS", "VLLM_CUTLASS",
                "MARLIN"]
    vlog("model_executor/layers/fused_moe/oracle/nvfp4.py", "logger.info_once(_make_log_backend",
         logging.INFO, "Using '%s' NvFp4 MoE backend out of potential backends: %s.", moe, backends)


def load(args, started: float):
    """The tokenizer is really loaded from the model dir; the weights are waited for."""
    from vllm.tokenizers.mistral import MistralTokenizer

    model = Path(args.model)
    if not (model / "tekken.json").is_file():
        raise FileNotFoundError(f"No tekken.json in {model}: cannot load the Mistral tokenizer")
    tokenizer = MistralTokenizer.from_pretrained(str(model))
    log_kernels(args)
    seconds = float(os.environ.get("THORFLEET_SIM_LOAD_SECONDS", "5"))
    time.sleep(max(0.0, seconds - (time.time() - started)))
    vlog("model_executor/model_loader/default_loader.py", '"Loading weights took', logging.INFO,
         "Loading weights took %.2f seconds", time.time() - started)
    return tokenizer


# ------------------------------------------------------------------ serving

def decode_rate(args) -> float:
    default = 33.7 if args.speculative_config else 17.5
    return float(os.environ.get("THORFLEET_SIM_DECODE_TOKS", default))


CANNED = ("This is a canned answer from the thorfleet vLLM stand-in: the prompt was rendered by "
          "the real tokenizer, no weights were run.")
FILLER = " token"  # one tekken token per repeat, for completions that run to max_tokens


class Server:
    def __init__(self, args, tokenizer):
        self.args = args
        self.tokenizer = tokenizer
        keys = args.api_key or os.environ.get("VLLM_API_KEY")
        self.api_keys = [keys] if isinstance(keys, str) else list(keys or [])
        self.model_names = list(args.served_model_name or [args.model])
        self.metrics = {"prompt_tokens": 0, "generation_tokens": 0, "requests": 0}
        self.lock = threading.Lock()

    def authorized(self, headers) -> bool:
        if not self.api_keys:
            return True
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and token in self.api_keys

    # -- bodies
    def models(self) -> dict:
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
             "root": self.args.model, "parent": None, "max_model_len": self.args.max_model_len}
            for name in self.model_names]}

    def metrics_text(self) -> str:
        name = self.model_names[0]
        lines = []
        for key, kind in (("prompt_tokens", "counter"), ("generation_tokens", "counter"),
                          ("requests", "counter")):
            metric = f"vllm:{key}_total"
            lines += [f"# TYPE {metric} {kind}", f'{metric}{{model_name="{name}"}} {self.metrics[key]}.0']
        lines += ["# TYPE vllm:num_requests_running gauge",
                  f'vllm:num_requests_running{{model_name="{name}"}} 0.0']
        return "\n".join(lines) + "\n"

    def count(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self.lock:
            self.metrics["prompt_tokens"] += prompt_tokens
            self.metrics["generation_tokens"] += completion_tokens
            self.metrics["requests"] += 1

    def chat(self, body: dict) -> dict:
        """Render through vLLM's own chat preprocessing for a Mistral tokenizer; raises what vLLM
        turns into a 400 when rendering fails."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.renderers.mistral import safe_apply_chat_template
        from vllm.tokenizers import mistral as mt

        request = ChatCompletionRequest.model_validate(body)
        mt.maybe_serialize_tool_calls(request)
        mt.truncate_tool_call_ids(request)
        mt.validate_request_params(request)
        tools = None
        if request.tools is not None and not (
                request.tool_choice == "none" and self.args.exclude_tools_when_tool_choice_none):
            tools = [tool.model_dump() for tool in request.tools]
        params = request.build_chat_params(None, "auto").with_defaults(
            {**(self.args.default_chat_template_kwargs or {}), "tools": tools, "tokenize": True})
        prompt = safe_apply_chat_template(self.tokenizer, request.messages,
                                          **params.get_apply_chat_template_kwargs())
        message: dict = {"role": "assistant", "content": CANNED, "tool_calls": []}
        finish = "stop"
        if tools and request.tool_choice != "none":
            function = tools[0]["function"]
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": uuid.uuid4().hex[:9], "type": "function",
                "function": {"name": function["name"],
                             "arguments": json.dumps(sample_arguments(function))}}]}
            finish = "tool_calls"
        elif self.tokenizer.decode(prompt[-1:]) == "[THINK]":
            # The think block is open in the prompt: the trace lands inline, closed by [/THINK].
            message["content"] = "Thinking it over, step by step.[/THINK]" + CANNED
        text = message["content"] or message["tool_calls"][0]["function"]["arguments"]
        completion_tokens = len(self.tokenizer.encode(text, add_special_tokens=False))
        self.decode(completion_tokens)
        self.count(len(prompt), completion_tokens)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": request.model or self.model_names[0],
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                      "total_tokens": len(prompt) + completion_tokens},
        }

    def completion(self, body: dict) -> dict:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        request = CompletionRequest.model_validate(body)
        prompt = request.prompt if isinstance(request.prompt, str) else json.dumps(request.prompt)
        prompt_tokens = len(self.tokenizer.encode(prompt, add_special_tokens=True))
        # The model never stops early here: every completion runs to max_tokens.
        completion_tokens = request.max_tokens or 16
        self.decode(completion_tokens)
        self.count(prompt_tokens, completion_tokens)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": request.model or self.model_names[0],
            "choices": [{"index": 0, "text": FILLER * completion_tokens, "logprobs": None,
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }

    def decode(self, tokens: int) -> None:
        time.sleep(tokens / decode_rate(self.args))


def sample_arguments(function: dict) -> dict:
    """Arguments for a tool call: each required parameter gets a plausible value of its type."""
    parameters = function.get("parameters") or {}
    samples = {"string": "Paris", "integer": 1, "number": 1.0, "boolean": True}
    return {name: samples.get(spec.get("type"), None)
            for name, spec in (parameters.get("properties") or {}).items()
            if name in parameters.get("required", [])}


def error_body(error: Exception, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> dict:
    """vLLM's ErrorResponse shape: {"error": {"message", "type", "param", "code"}}."""
    from vllm.entrypoints.openai.engine.protocol import ErrorInfo, ErrorResponse

    kind = "BadRequestError" if status == HTTPStatus.BAD_REQUEST else "InternalServerError"
    return ErrorResponse(error=ErrorInfo(message=str(error), type=kind, code=status.value)).model_dump()


def make_handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def send(self, status: int, body, content_type: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else (
                body.encode() if isinstance(body, str) else json.dumps(body).encode())
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def stream(self, answer: dict) -> None:
            """Server-sent events as vLLM sends them: the answer as one delta chunk, a closing
            chunk with finish_reason and usage, then [DONE]."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            chat = answer["object"] == "chat.completion"
            kind = "chat.completion.chunk" if chat else "text_completion"
            choice = answer["choices"][0]
            if chat:
                first = {"index": 0, "delta": {k: v for k, v in choice["message"].items() if v}}
                last = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
            else:
                first = {"index": 0, "text": choice["text"], "finish_reason": None}
                last = {"index": 0, "text": "", "finish_reason": choice["finish_reason"]}
            for chunk in ({"choices": [first]}, {"choices": [last], "usage": answer["usage"]}):
                event = {"id": answer["id"], "object": kind, "created": answer["created"],
                         "model": answer["model"], **chunk}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

        def guarded(self) -> bool:
            # As vLLM's auth middleware: only /v1/* needs the key.
            if self.path.startswith("/v1") and not server.authorized(self.headers):
                self.send(401, {"error": "Unauthorized"})
                return False
            return True

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/health":
                self.send(200, b"")
            elif path == "/version":
                self.send(200, {"version": vllm.__version__})
            elif path == "/metrics":
                self.send(200, server.metrics_text(), "text/plain; version=0.0.4")
            elif not self.guarded():
                return
            elif path == "/v1/models":
                self.send(200, server.models())
            else:
                self.send(404, {"detail": "Not Found"})

        def do_POST(self):
            path = self.path.split("?")[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if not self.guarded():
                return
            handlers = {"/v1/chat/completions": server.chat, "/v1/completions": server.completion}
            if path not in handlers:
                self.send(404, {"detail": "Not Found"})
                return
            try:
                body = json.loads(raw or b"{}")
                answer = handlers[path](body)
                if body.get("stream"):
                    self.stream(answer)
                else:
                    self.send(200, answer)
            except (ValueError, TypeError) as error:  # pydantic's ValidationError is a ValueError
                self.send(400, error_body(error))
            except Exception as error:  # noqa: BLE001 - a server answers 500, it does not die
                traceback.print_exc()
                self.send(500, error_body(error, HTTPStatus.INTERNAL_SERVER_ERROR))

        def log_message(self, fmt, *args):
            # uvicorn's access log line, as vLLM's server prints it.
            print(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - '
                  f'"{self.requestline}" {args[1] if len(args) > 1 else ""}', flush=True)

    return Handler


# ------------------------------------------------------------------ main

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # PID 1 in a container ignores SIGTERM unless it handles it: stop as `docker stop` expects.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if not argv or argv[0] != "serve":
        print("usage: vllm serve [model_tag] [options]  (thorfleet stand-in: only `serve`)",
              file=sys.stderr)
        return 2
    started = time.time()
    v = quiet_imports()
    args, changed = parse_serve_args(v, argv[1:])
    vlog("entrypoints/utils.py", '"non-default args: %s"', logging.INFO, "non-default args: %s", changed)
    try:
        check_memory(v, args)
        tokenizer = load(args, started)
    except Exception:  # noqa: BLE001 - like vLLM's engine core: traceback, non-zero exit
        log.error("EngineCore failed to start.\n%s", traceback.format_exc().rstrip())
        return 1
    host, port = args.host or "0.0.0.0", args.port
    httpd = ThreadingHTTPServer((host, port), make_handler(Server(args, tokenizer)))
    vlog("entrypoints/openai/api_server.py", '"Starting vLLM server on %s"', logging.INFO,
         "Starting vLLM server on %s", f"http://{host}:{port}")
    print("INFO:     Application startup complete.", flush=True)
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
