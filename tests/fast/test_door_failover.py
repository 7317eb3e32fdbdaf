"""bench/door_failover.py's arithmetic, without the sim: what a client saw of the door while the
gateway holding the address died, from a probe client's own (start, end, ok) times, and each
figure rounded to the probe's spacing, the resolution it is known to.

The edits that break them: a gap measured from the requests' starts rather than their answers (a
probe started before the kill but answered after it moves the door's return earlier); the first
served counted from a probe started before the kill; figures rounded finer than the probe's
spacing (reported to 0.01 s, as before, from a poll every 0.2 s and more); the address's move
reported as one moment rather than the bracket the polls give.
"""

import pytest

from bench import door_failover as failover

EVERY = failover.PROBE_EVERY_S


def probes(killed, back, answer_s=0.05, until=None):
    """A probe every EVERY from 0: answered in answer_s while the door serves, failing from
    `killed` until `back` (each failure answered at once)."""
    out, start = [], 0.0
    until = until if until is not None else back + 3
    while start < until:
        ok = not killed <= start < back
        out.append((start, start + answer_s if ok else start + 0.01, ok))
        start += EVERY
    return out


def test_the_door_is_lost_from_the_last_answer_before_to_the_first_after():
    seen = failover.outage(probes(killed=10.0, back=13.0), killed=10.0)
    # last success: the probe started at 9.75, answered 9.8; first after: started 13.0, at 13.05
    assert seen["door_lost_s"] == pytest.approx(13.05 - 9.8)
    assert seen["baseline_gap_s"] == pytest.approx(EVERY)
    assert seen["first_served_s"] == pytest.approx(3.05)


def test_a_probe_sent_before_the_kill_and_answered_after_it_is_no_first_served():
    # the probe started at 9.75 is answered only at 12.0 (a request already past the door): an
    # answer the client had at 12.0, so it splits the gap, but nothing sent after the kill was
    # served before 13.05
    log = [p for p in probes(killed=9.9, back=13.0) if p[0] != 9.75] + [(9.75, 12.0, True)]
    seen = failover.outage(log, killed=9.9)
    assert seen["first_served_s"] == pytest.approx(13.05 - 9.9)
    assert seen["door_lost_s"] == pytest.approx(12.0 - 9.55)


def test_nothing_served_after_the_kill_is_no_figure():
    seen = failover.outage(probes(killed=10.0, back=99.0, until=20.0), killed=10.0)
    assert seen["door_lost_s"] is None and seen["first_served_s"] is None


def test_figures_are_rounded_to_the_probes_spacing():
    assert failover.RESOLUTION_S == EVERY == 0.25
    assert [failover.rounded(x) for x in (3.43, 2.57, 3.86, 0.1, None)] == [
        3.5, 2.5, 3.75, 0.0, None]
    rows = [{"door_lost_s": failover.rounded(x), "baseline_gap_s": 0.25,
             "first_served_s": failover.rounded(x - 0.3), "failed_after_retry": 1,
             "requests_after_kill": 100} for x in (3.43, 3.24, 2.9)]
    summary = failover.summarised(rows)
    assert summary["door_lost_s_median"] == 3.25 and summary["first_served_s_median"] == 3.0
    assert summary["resolution_s"] == 0.25 and summary["failed_after_retry"] == 3


def test_the_address_move_is_a_bracket_of_two_polls():
    polls = [(10.1, 10.4, "gw-1"), (10.6, 10.9, "gw-1"), (11.1, 11.5, "gw-2")]
    # still on gw-1 when the read ending 10.9 began; on gw-2 by the end of the next read
    assert failover.moved_between(polls, 10.0, "gw-2") == [pytest.approx(0.9),
                                                           pytest.approx(1.5)]
    assert failover.moved_between(polls[:2], 10.0, "gw-2") is None
