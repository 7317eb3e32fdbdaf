"""How a vLLM install reads thorfleet's vllm.yaml: run by that install's python (in a container of
each sim base, tests/docker/test_config_lands.py) as the unit runs it, `vllm serve /model --config ...`
plus the unit's options, through vLLM's own argument parser. Prints the parsed options as JSON.

    config_check.py /model --config A.yaml OPTIONS... [--next /model --config B.yaml OPTIONS...]

Each command line after a `--next` is parsed by a fresh parser in the same process, and printed
as a JSON object of its own, in order: importing vLLM is most of a check's cost (issue 32).

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

commands = [[]]
for arg in sys.argv[1:]:
    if arg == "--next":
        commands.append([])
    else:
        commands[-1].append(arg)
parsed = [vars(make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(command))
          for command in commands]
print(json.dumps(parsed, default=str))
