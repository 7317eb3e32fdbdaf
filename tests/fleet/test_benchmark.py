"""The operator benchmarks the fleet the seed's way and a box where EAGLE does not engage fails.

On the sim the stand-in decodes at the seed's Thor rates: 33.7 tok/s with the EAGLE draft loaded
and speculation on, 17.5 without (sim/base/vllm_standin.py). The benchmark is the seed's
(/v1/completions, 512 tokens, a warm-up and 3 runs, TTFT included), so the report should read
about those figures, and a box configured without EAGLE (service_profile = "no-eagle") falls below
both the floor and 0.8 of the fleet median.

Uses the rollout boxes (the third to the fifth) and leaves them converged on the default profile.
"""

import json
from pathlib import Path

import pytest

from tests.helpers import deploy

# The seed's figures (docs/facts.md "Benchmark method"); the sim's request path adds a little on
# top of the modelled decode, so the measured rate sits a few percent under them.
EAGLE_TOKS, BASE_TOKS = 33.7, 17.5
# the acceptance rate the stand-in's EAGLE reports (bench/results/standin-model.json)
MODEL = Path(__file__).resolve().parents[2] / "bench" / "results" / "standin-model.json"
ACCEPTANCE = json.loads(MODEL.read_text())["mistral_small_4"]["fitted"]["eagle_acceptance_rate"]


@pytest.fixture(scope="module")
def hosts(sim_fleet, my_boxes):
    mine = my_boxes
    if len(mine) < 2:
        pytest.skip("the benchmark stories need at least two boxes beyond the first two")
    return mine


@pytest.fixture(scope="module")
def bench(sim_fleet, hosts, tmp_path_factory):
    """bench(name, *args, slow=None, **group_data) -> (run, report rows, report path)."""
    workdir = tmp_path_factory.mktemp("benchmark")
    report_path = workdir / "report.json"

    def run(name, *args, slow=None, **group_data):
        on = [(h, {"service_profile": "no-eagle"}) if h == slow else h for h in hosts]
        inventory = sim_fleet.write_inventory(
            workdir / f"{name}.py", hosts=on,
            extra_data={"rollout_report_path": str(report_path), **group_data})
        done = deploy(inventory, *args)
        rows = json.loads(report_path.read_text())["hosts"] if report_path.exists() else None
        return done, rows, report_path

    yield run
    last, _, _ = run("leave-converged", rollout_benchmark="never")
    assert last.returncode == 0, last.stderr[-4000:]


def test_a_benchmarked_fleet_reports_the_seeds_eagle_rate_and_passes(bench, hosts):
    done, rows, report_path = bench("eagle", "--data", "rollout_benchmark=always")
    assert done.returncode == 0, done.stderr[-4000:]
    figures = {h: (rows[h]["tok_s"], rows[h]["ttft_s"], rows[h]["eagle_acceptance"]) for h in hosts}
    served = {h: rows[h]["serving_fingerprint"] for h in hosts}
    print(f"benchmark figures (tok/s, TTFT s, acceptance): {figures}")
    for h in hosts:
        row = rows[h]
        assert row["tok_s"] == pytest.approx(EAGLE_TOKS, rel=0.12), row["benchmark"]
        assert 0 < row["ttft_s"] < 2, row["benchmark"]
        assert row["vs_median"] == pytest.approx(1, abs=0.1)
        assert len(row["benchmark"]["runs"]) == 3
        assert all(r["tokens"] == 512 for r in row["benchmark"]["runs"])
        assert row["benchmark"]["passed"] is True and row["error"] is None
        # the stand-in counts EAGLE's drafts in vLLM's own spec-decode stats: 1.87 of 3 drafted
        # tokens accepted a step, fitted to the seed's 33.7 tok/s (sim/base/thor.py Box.accept_mean)
        assert row["benchmark"]["spec_decode_metrics"] is True
        assert row["eagle_acceptance"] == pytest.approx(ACCEPTANCE, abs=0.02), row["benchmark"]
    # a dry run leaves this report alone and writes its plan beside it
    before = report_path.read_text()
    dry, _, _ = bench("eagle-dry", "--dry", rollout_benchmark="never")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert report_path.read_text() == before
    assert json.loads(report_path.with_name("report.json.dry.json").read_text())["dry_run"]
    # a limited run reports its host and keeps the others' rows, marked stale
    limited, rows, _ = bench("eagle-limit", "--limit", hosts[0], rollout_benchmark="never")
    assert limited.returncode == 0, limited.stderr[-4000:]
    assert rows[hosts[0]]["stale"] is False
    for h in hosts[1:]:
        assert rows[h]["stale"] is True and rows[h]["tok_s"] == figures[h][0]
    # not benchmarked again: serving the version it measured, its figures stay, marked; restarted
    # on another version (the checkout changed in between), they are not its figures any more
    if rows[hosts[0]]["serving_fingerprint"] == served[hosts[0]]:
        assert rows[hosts[0]]["tok_s"] == figures[hosts[0]][0]
        assert rows[hosts[0]]["benchmark"]["from_earlier_run"] is True
    else:
        assert rows[hosts[0]]["tok_s"] is None and rows[hosts[0]]["benchmark"] is None


def test_a_box_without_eagle_is_flagged_and_fails_the_run(bench, hosts):
    slow = hosts[-1]
    done, rows, _ = bench("no-eagle", slow=slow, rollout_benchmark="always")
    assert done.returncode != 0
    assert done.failed_hosts == [slow], done.stderr[-4000:]
    assert rows[slow]["tok_s"] == pytest.approx(BASE_TOKS, rel=0.12), rows[slow]["benchmark"]
    assert rows[slow]["eagle_acceptance"] is None
    assert rows[slow]["benchmark"]["spec_decode_metrics"] is False  # no draft, no counters
    assert "too slow" in rows[slow]["error"] and "rollout_bench_min_toks" in rows[slow]["error"]
    assert "rollout_bench_min_fraction" in rows[slow]["error"]
    for h in hosts[:-1]:
        assert rows[h]["tok_s"] == pytest.approx(EAGLE_TOKS, rel=0.12)
        assert rows[h]["error"] is None
    # the slow box still serves (it passed its proof): the gate reports, it does not roll back
    assert rows[slow]["health"] is True
