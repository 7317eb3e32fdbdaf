"""Two runs at once on one box (issue 19, §4): a config change started, a second run of it one
second later that may wait, a third that stops at once. The second waits for the first and then
finds nothing to do, the third stops naming the run that holds the box, and the box serves the
change. The edit that breaks it: preflight without its run lock (the second run restarts the box
under the first; the third does not stop).
"""

import re
import threading
import time

from tests.helpers import changed_on, deploy, outcome

HOLDER = re.compile(r"this box is held by another thorfleet run: \S+@\S+ pid \d+, since "
                    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def test_two_runs_a_second_apart_serve_the_change_once_and_the_third_is_told_who_holds_it(
        sim_fleet, my_boxes, tmp_path):
    host = my_boxes[0]
    base = sim_fleet.write_inventory(tmp_path / "base.py", hosts=[host])
    assert deploy(base).returncode == 0
    change = {"service_extra_env": {"THORFLEET_TWO_RUNS": "1"},
              "rollout_report_path": str(tmp_path / "report.json")}
    first = sim_fleet.write_inventory(tmp_path / "first.py", hosts=[host], extra_data=change)
    second = sim_fleet.write_inventory(tmp_path / "second.py", hosts=[host],
                                       extra_data={**change, "preflight_lock_wait_s": 600})
    runs = {}

    def run(name, inventory):
        runs[name] = deploy(inventory)

    threads = [threading.Thread(target=run, args=("first", first))]
    threads[0].start()
    time.sleep(1)
    threads.append(threading.Thread(target=run, args=("second", second)))
    threads[1].start()
    time.sleep(4)
    third = deploy(first)  # the default: stop at once
    for thread in threads:
        thread.join(timeout=900)
    try:
        assert third.returncode != 0, third.stderr[-3000:]
        assert HOLDER.search(third.stderr), third.stderr[-3000:]
        assert runs["first"].returncode == 0, outcome(runs["first"], host)
        assert "Batch 1/1: serve the rendered version" in " ".join(changed_on(runs["first"], host))
        assert runs["second"].returncode == 0, outcome(runs["second"], host)
        assert HOLDER.search(runs["second"].stderr) and "waiting up to 600 s" in \
            runs["second"].stderr, runs["second"].stderr[-3000:]
        # the second run held the box only once the first had let go: the change was there, and
        # all it did was wait for the box (its hold is the one operation it reports as run)
        assert changed_on(runs["second"], host) == [
            "Preflight | Hold the box for this run (one thorfleet run at a time)"], \
            outcome(runs["second"], host)
        unit = sim_fleet.exec(host, "cat /etc/systemd/system/thorfleet-vllm.service")[1]
        assert "THORFLEET_TWO_RUNS" in unit
        assert changed_on(deploy(first), host) == []
    finally:
        deploy(base)  # the box as the other stories on it expect it
