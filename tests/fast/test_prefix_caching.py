"""Prefix caching (issue 52): the setting, the file vLLM reads, the restart it takes, the proof's
check of a box with it on, and doctor's hit-rate row.

vLLM's formats are its own (0.19.0): the answers of /v1/completions with return_token_ids, the
usage's prompt_tokens_details.cached_tokens, and /metrics' prefix_cache_* counters.
"""

import json

import pytest
import yaml

from tests.helpers import box_program
from tests.parse_back import PINS
from thorfleet.run import rollout
from thorfleet.settings import schema
from thorfleet.settings.recipe import PROFILES
from thorfleet.settings.render import Settings

KEY = "sk-0123456789-prefix"
SERVE = box_program("thorfleet-serve")


def rendered(**changes):
    values, problems = schema.check({**PINS, **changes}, api_key=KEY)
    assert problems == [], problems
    return Settings(values, api_key=KEY)


# (profile, service_prefix_caching) -> whether vLLM caches prefixes on that box
CASES = [
    ("default", None, True), ("no-eagle", None, True), ("throughput", None, True),
    ("vision", None, False),
    ("default", False, False), ("vision", True, True), ("throughput", False, False),
    ("no-eagle", True, True),
]


@pytest.mark.parametrize("profile,setting,on", CASES)
def test_the_rendered_config_reads_back_as_the_setting_or_the_profile_says(profile, setting, on):
    s = rendered(service_profile=profile, service_prefix_caching=setting)
    config = yaml.safe_load(s.config_text)
    # on: vLLM's own key; off: `no-<key>: true`, as a false key would be dropped by --config
    expected = {"enable_prefix_caching": True} if on else {"no-enable-prefix-caching": True}
    assert {k: v for k, v in config.items() if "prefix_caching" in k.replace("-", "_")} == expected
    assert SERVE.caches_prefixes_in(s.config_text) is on  # as the proof reads the live file


def test_every_profile_has_its_default():
    assert all(isinstance(p.get("prefix_caching"), bool) for p in PROFILES.values())


def test_turning_it_over_restarts_the_box():
    off, on = (rendered(service_prefix_caching=v) for v in (False, True))
    assert off.fingerprint != on.fingerprint
    serving_off = {"active": "active", "proven_fingerprint": off.fingerprint,
                   "secrets_proven": True, "healthy": True}
    assert rollout.decide(serving_off, on.fingerprint).action == rollout.ACTIVATE
    assert rollout.decide(serving_off, off.fingerprint).action == rollout.NOOP


# --- the proof's check (files/thor/bin/thorfleet-serve) -------------------------------------------------

def answer(ids, cached=None):
    """A /v1/completions answer as vLLM 0.19.0 gives it with return_token_ids: prompt_tokens_details
    only when some prompt tokens were cached (completion/serving.py L424-427)."""
    usage = {"prompt_tokens": 400, "completion_tokens": len(ids), "total_tokens": 400 + len(ids)}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"choices": [{"index": 0, "text": "...", "token_ids": ids, "finish_reason": "length"}],
            "usage": usage}


IDS = list(range(100, 132))  # 32 tokens, the proof's max_tokens
BEFORE = {SERVE.PREFIX_HITS: 0.0, SERVE.PREFIX_QUERIES: 37.0}
AFTER = {SERVE.PREFIX_HITS: 384.0, SERVE.PREFIX_QUERIES: 837.0}


@pytest.mark.parametrize("first,second,expected", [
    (IDS, IDS, None),
    ([1, 2], [1, 2], None),
    ([], [], None),
    (IDS, [*IDS[:16], 7, *IDS[17:]], 16),
    (IDS, [*IDS[:15], 7, *IDS[16:]], 15),
    ([1, 2, 3], [1, 2, 3, 4], 3),  # one ended (EOS) where the other went on
    ([1, 2, 3, 4], [1, 2], 2),
    ([5], [6], 0),
])
def test_first_difference(first, second, expected):
    assert SERVE.first_difference(first, second) == expected


@pytest.mark.parametrize("first,second,before,after,problem", [
    (answer(IDS), answer(IDS, 384), BEFORE, AFTER, None),
    # the answers part late: a near-tie after the tokens that must agree
    (answer(IDS), answer([*IDS[:16], 7, *IDS[17:]], 384), BEFORE, AFTER, None),
    # both ended early on the same token (EOS)
    (answer(IDS[:5]), answer(IDS[:5], 384), BEFORE, AFTER, None),
    (answer(IDS), answer([*IDS[:15], 7, *IDS[16:]], 384), BEFORE, AFTER,
     "parts from the same prompt's uncached answer at token 16 of 16"),
    (answer(IDS), answer(IDS[:10], 384), BEFORE, AFTER, "at token 11 of 16"),
    (answer(IDS), answer(IDS), BEFORE, AFTER, "reports no cached tokens"),
    (answer(IDS), answer(IDS, 0), BEFORE, AFTER, "reports no cached tokens"),
    (answer(IDS), answer(IDS, 384), BEFORE, BEFORE,
     "vllm:prefix_cache_hits_total and vllm:prefix_cache_queries_total did not rise"),
    (answer(IDS), answer(IDS, 384), BEFORE, {**AFTER, SERVE.PREFIX_HITS: 0.0},
     "vllm:prefix_cache_hits_total did not rise over two equal prompts (0 then 0)"),
    (answer(IDS), answer(IDS, 384), None, AFTER, "/metrics lacks vllm:prefix_cache_hits_total"),
    (answer(IDS), answer(IDS, 384), {}, {}, "/metrics lacks"),
    ({"choices": [{"text": "x"}]}, answer(IDS, 384), BEFORE, AFTER, "carry no choices[0].token_ids"),
], ids=["agree", "part late", "both end early", "part at 16", "cached one short", "no details",
        "zero cached", "counters still", "hits still", "no metrics", "no counters", "no ids"])
def test_the_prefix_cache_problem(first, second, before, after, problem):
    found = SERVE.prefix_cache_problem(first, second, before, after)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


PROMETHEUS = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="/model"}} {queries}
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="/model"}} {hits}
vllm:prefix_cache_hits_created{{engine="0",model_name="/model"}} 1.7e+09
vllm:num_requests_running{{engine="0",model_name="/model"}} 0.0
"""


class CannedServer:
    """`request` of thorfleet-serve answered from canned vLLM answers: /metrics from a counter that
    each completion raises as vLLM would (queries by the prompt's tokens, hits by the cached ones),
    the completions in turn."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.bodies = []
        self.hits = self.queries = 0

    def __call__(self, port, path, body=None, timeout=120):
        if path == "/metrics":
            return 200, PROMETHEUS.format(hits=float(self.hits), queries=float(self.queries))
        assert path == "/v1/completions"
        self.bodies.append(body)
        got = self.answers.pop(0)
        self.queries += got["usage"]["prompt_tokens"]
        self.hits += (got["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        return 200, json.dumps(got)


@pytest.mark.parametrize("answers,failure", [
    ([answer(IDS), answer(IDS, 384)], None),
    ([answer(IDS), answer(IDS)], "reports no cached tokens"),
    ([answer(IDS), answer([9, *IDS[1:]], 384)], "parts from the same prompt's uncached answer"),
], ids=["served from the cache", "a miss", "a wrong hit"])
def test_the_proof_sends_one_prompt_twice_and_judges_the_answers(monkeypatch, answers, failure):
    server = CannedServer(answers)
    monkeypatch.setattr(SERVE, "request", server)
    monkeypatch.setattr(SERVE.time, "sleep", lambda s: None)
    if failure is None:
        SERVE.check_prefix_cache(8002)
    else:
        with pytest.raises(SERVE.NotServing) as error:
            SERVE.check_prefix_cache(8002)
        said = str(error.value)
        assert failure in said and "\n" not in said  # one line, with the fix
        assert said.endswith("turn service_prefix_caching off for this box (its host data) and "
                             "deploy again")
    first, second = server.bodies
    assert first == second  # one prompt twice, the same salt
    assert first["temperature"] == 0 and first["max_tokens"] == SERVE.PREFIX_MAX_TOKENS
    assert first["return_token_ids"] is True and len(first["cache_salt"]) >= 43
    # several whole 16-token KV blocks: ~200 numbers take far more than 32 tokens
    assert len(first["prompt"].split()) > 200


def test_each_proof_salts_its_prompts_afresh(monkeypatch):
    salts = []
    for _ in range(2):
        server = CannedServer([answer(IDS), answer(IDS, 384)])
        monkeypatch.setattr(SERVE, "request", server)
        SERVE.check_prefix_cache(8002)
        salts.append(server.bodies[0]["cache_salt"])
    assert salts[0] != salts[1]  # a proof's first answer is never served from an earlier one's
