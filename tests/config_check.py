"""How a vLLM install reads thorfleet's vllm.yaml: run by that install's python (in a container of
each sim base, tests/docker/test_config_lands.py) as the unit runs it, `vllm serve /model --config ...`
plus the unit's options, through vLLM's own argument parser. Prints the parsed options as JSON.

The platform is set to CPU first: choosing one probes for a GPU, and the parser's defaults are not
what is checked here, only what the file sets.
"""

import json
import sys

import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

try:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
except ModuleNotFoundError:  # 0.3x: vllm/entrypoints/common/cli_args.py
    from vllm.entrypoints.common.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

parsed = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(sys.argv[1:])
print(json.dumps(vars(parsed), default=str))
