"""The fleet benchmark's own arithmetic (bench/rollout.py): where a converge's time went."""

from types import SimpleNamespace

from bench import rollout
from bench.rollout import sections
from sim import operator


def test_each_operation_lasts_until_the_next_starts_and_counts_for_its_section():
    # pyinfra's stderr, as (seconds since the CLI started, line)
    lines = [(0.4, "--> Loading config...\n"),
             (1.5, "--> Starting operation: Preflight | Check the box \n"),
             (1.6, "    [thor-3] Success\n"),
             (2.0, "--> Starting operation: Weights | Fetch the checkpoint \n"),
             (9.0, "--> Starting operation: Weights | Fetch the draft \n"),
             (10.0, "--> Starting operation: Record the host's state for the report \n")]
    assert sections(lines, total=10.5) == {
        "start": 1.5, "Preflight": 0.5, "Weights": 8.0, "other": 0.5}
    assert sections([], total=3.0) == {"start": 3.0}


def test_a_timed_deploy_keeps_each_line_with_when_it_came(tmp_path):
    inventory = tmp_path / "inventory.py"
    inventory.write_text("hosts = ['thor-1']\n")  # no group data: refused before connecting
    run = operator.deploy(inventory, as_json=False, timed=True, timeout=120)
    assert run.returncode != 0 and "refusing to run" in run.stderr, run.stderr[-2000:]
    assert "".join(line for _, line in run.marks) == run.stderr
    times = [at for at, _ in run.marks]
    assert times == sorted(times) and 0 < times[-1] <= run.seconds


TAG = "thorfleet/mistral-small4:abcdef012345"


def test_the_image_moved_to_each_box_is_read_from_the_senders_last_line():
    lines = [f"[thor-14] thorfleet-image: sending {TAG} (image 1.2 GiB)",
             "[thor-14] thorfleet-image: 0.50 GiB sent",
             f"[thor-14] thorfleet-image: sent 1288490188 bytes of {TAG} (image 1288000000 bytes)",
             f"[thor-15] thorfleet-image: loaded {TAG} from thor-13",
             f"[thor-15] thorfleet-image: sent 99 bytes of {TAG} (image 98 bytes)"]
    assert rollout.image_moved(SimpleNamespace(stderr="\n".join(lines))) == {
        "thor-14": {"bytes": 1288490188, "image_bytes": 1288000000},
        "thor-15": {"bytes": 99, "image_bytes": 98}}


def test_ci_cost_charges_each_server_start_to_the_test_running_when_it_was_first_seen():
    from bench.ci_cost import _starts_by_test

    server = {"kind": "vLLM server", "box": "thor-3"}
    samples = {"containers": {
        "a": {**server, "first": 101.0},  # the module fixture's converge, in the first test
        "b": {**server, "first": 102.0},
        "c": {**server, "first": 205.0},
        "d": {**server, "first": 206.0, "box": "thor-9"},  # another group's box
        "e": {"kind": "image self-check", "box": "thor-3", "first": 207.0},
        "f": {**server, "first": 400.0},  # after the group ended
    }}
    group = {"boxes": ["thor-3"], "started": 100.0, "ended": 300.0,
             "marks": [["test_rollout::test_two", 200.0], ["test_rollout::test_one", 100.0]]}
    assert _starts_by_test(samples, group) == {"test_rollout::test_one": 2,
                                               "test_rollout::test_two": 1}


def test_ci_cost_gives_each_test_what_its_boxes_spent_until_the_next_began():
    from bench.ci_cost import BOX_SYSTEM, _box_cpu_by_test

    samples = {
        # cumulative CPU seconds of what thor-3's Docker runs (vLLM, self-checks), by time
        "parents": {"thor-3": [[100.0, 0.0], [150.0, 30.0], [250.0, 40.0], [300.0, 41.0]],
                    "thor-9": [[100.0, 0.0], [300.0, 500.0]]},  # another group's box
        "containers": {
            "box": {"kind": BOX_SYSTEM, "box": "thor-3",
                    "series": [[100.0, 5.0], [200.0, 9.0], [300.0, 10.0]]},
            "other": {"kind": BOX_SYSTEM, "box": "thor-9", "series": [[100.0, 0.0], [300.0, 99.0]]},
        }}
    group = {"boxes": ["thor-3"], "started": 100.0, "ended": 300.0,
             "marks": [["test_rollout::test_two", 200.0], ["test_rollout::test_one", 100.0]]}
    # test_one: 100 to 200 s (the inner 30, its own 4); test_two: 200 s to the group's end
    assert _box_cpu_by_test(samples, group) == {"test_rollout::test_one": 34.0,
                                                "test_rollout::test_two": 12.0}
