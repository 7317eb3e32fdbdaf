"""thorfleet/box/readings.py: the parsers the laptop's facts and the box's watchdog share. The box
runs its package (thorfleet/box, shipped whole) with its system python3 and nothing else, so each
of its modules may import the standard library only."""

import ast
import sys

from thorfleet.box import readings
from thorfleet.settings.layout import ROOT


def test_the_box_package_imports_the_standard_library_only():
    """Breaks with: a box module importing thorfleet (the box has no thorfleet, only this folder)
    or a package the box's python3 lacks (yaml), or one of its own by a relative import (the
    token counter is mounted alone into the server's container)."""
    modules = sorted((ROOT / "thorfleet" / "box").glob("*.py"))
    assert [m.name for m in modules] == ["__init__.py", "common.py", "readings.py", "usage.py"]
    for module in modules:
        tree = ast.parse(module.read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                    if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module.split(".")[0] if node.module else "." for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom)}
        assert imported - {"__future__"} <= set(sys.stdlib_module_names), (module.name, imported)


# vLLM 0.19.0's /metrics as prometheus_client writes it: one sample per engine and model, HELP and
# TYPE lines, a label value holding a space and a brace.
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/model"} 2.0
vllm:num_requests_running{engine="1",model_name="/model"} 1.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="a }b \\"c\\""} 1500.0 1733050000000
vllm:generation_tokens_created{engine="0",model_name="/model"} 1.7e+09
vllm:num_requests_waiting 0
vllm:kv_cache_usage_perc{engine="0"} NaN
"""


def test_metric_sums_adds_every_label_set_and_skips_what_was_not_asked():
    sums = readings.metric_sums(VLLM_METRICS, ["vllm:num_requests_running",
                                               "vllm:generation_tokens_total",
                                               "vllm:num_requests_waiting",
                                               "vllm:spec_decode_num_draft_tokens_total"])
    assert sums == {"vllm:num_requests_running": 3.0, "vllm:generation_tokens_total": 1500.0,
                    "vllm:num_requests_waiting": 0.0}


def test_metric_sums_reads_the_special_values():
    sums = readings.metric_sums("a +Inf\nb{x=\"1\"} -Inf\nc NaN\n", ["a", "b", "c"])
    assert sums["a"] == float("inf") and sums["b"] == float("-inf") and sums["c"] != sums["c"]


def test_mem_available_is_in_bytes():
    text = "MemTotal:       127534464 kB\nMemFree:         2000000 kB\nMemAvailable:   99000000 kB\n"
    assert readings.mem_available_bytes(text) == 99000000 * 1024
    assert readings.mem_available_bytes("MemTotal: 1 kB\n") is None


def test_thermal_zones_are_celsius_by_type(tmp_path):
    for index, (kind, temp) in enumerate([("cpu-thermal", "45500"), ("gpu-thermal", "52250"),
                                          ("gpu-thermal", "51000"), ("tj-thermal", "oops")]):
        zone = tmp_path / f"thermal_zone{index}"
        zone.mkdir()
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(temp + "\n")
    (tmp_path / "cooling_device0").mkdir()
    assert readings.thermal_zones(tmp_path) == {"cpu-thermal": 45.5, "gpu-thermal": 52.25}
    assert readings.thermal_zones(tmp_path / "absent") == {}
