# ruff: noqa: F811 - pytest fixtures are imported by name and then requested by name
"""Every key of the vllm.yaml thorfleet renders lands in vLLM as written, on each base the sim
has (0.19.0, 0.26.0, 0.33.0): vLLM's own parser reads the file in a container of the base
(tests/config_check.py), with the unit's options after it.

Why: `--config` turns `key: true` into `--key`, and a false one into nothing (0.19.0
utils/argparse_utils.py L501-504) or into `--no-key` only when that exact option exists (0.33.0
L654-658, never for a key written with underscores), so `enable_prefix_caching: false`, the
seed's setting, left prefix caching at vLLM's default. The edit that breaks it: writing off that
way in files/thor/vllm.yaml.j2 (a vision box's prefix caching is off, a default box's on). A vision box's image limit and media domains land as vLLM's own
limit_mm_per_prompt and allowed_media_domains (the edit that breaks it: a domain list rendered as
one string).
"""


import pytest
import yaml

from sim.base.testing import SERVE_ARGS, docker_client, run_check  # noqa: F401
from tests.docker.test_reasoning_split import rendered_config

VISION = {"service_profile": "vision", "service_images_per_prompt": 3,
          "service_media_domains": ["images.example.com", "cdn.example.org"]}


@pytest.fixture(scope="module", params=["jetson-0.19.0", "upstream-0.26.0", "upstream-0.33.0"])
def parsed_both(request, docker_client, tmp_path_factory):
    """(the default box's options, a vision box's), each file parsed as its unit passes it, by one
    container of the base (importing vLLM is most of a check's cost)."""
    folder = tmp_path_factory.mktemp("config")
    (folder / "vllm.yaml").write_text(rendered_config())
    (folder / "vision.yaml").write_text(rendered_config(**VISION))
    vision = [a if a != "/config/vllm.yaml" else "/config/vision.yaml"
              for a in SERVE_ARGS if a != "--language-model-only"]  # as the vision unit runs it
    return run_check(docker_client, request.param,
                     ["/repo/tests/config_check.py", "/model", *SERVE_ARGS,
                      "--next", "/model", *vision],
                     volumes={str(folder): {"bind": "/config", "mode": "ro"}})


@pytest.fixture
def parsed(parsed_both):
    return parsed_both[0]


@pytest.fixture
def parsed_vision(parsed_both):
    return parsed_both[1]


def test_every_setting_of_the_file_lands_as_written(parsed):
    config = yaml.safe_load(rendered_config())
    for key, value in config.items():
        if isinstance(value, dict):  # speculative_config, compilation_config: JSON, read below
            continue
        name = key.replace("-", "_")
        if name.startswith("no_"):  # `no-x: true` is `--no-x`: x off
            name, value = name[3:], not value
        assert parsed[name] == value, (key, parsed[name])


def test_prefix_caching_lands_as_the_profile_says(parsed, parsed_vision):
    # on (`enable_prefix_caching: true`) for the default profile, off (`no-...: true`) for vision
    assert parsed["enable_prefix_caching"] is True
    assert parsed_vision["enable_prefix_caching"] is False


def test_the_draft_and_the_graphs_are_read(parsed):
    config = yaml.safe_load(rendered_config())
    assert parsed["speculative_config"] == config["speculative_config"]
    graphs = str(parsed["compilation_config"])  # a CompilationConfig, or its dict
    assert "PIECEWISE" in graphs and "'cudagraph_capture_sizes': [4, 8, 12]" in graphs, graphs


def test_a_vision_boxs_images_and_domains_land_as_vllms_own(parsed_vision):
    assert parsed_vision["limit_mm_per_prompt"] == {"image": 3}
    assert parsed_vision["allowed_media_domains"] == ["images.example.com", "cdn.example.org"]
    assert not parsed_vision["language_model_only"]
