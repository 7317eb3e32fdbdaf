"""Faults under load, counted: bench/soak.py's short schedule (CI's) as a story.

The operator converges two boxes behind the gateway pair (gw-2 and gw-3, one address held by
keepalived) with three client keys (alice, bob, carol). Clients on the real OpenAI SDK (its
default two retries) send their mixes through the door (short chats, streamed tool calls,
streamed reasoning, long prompts) while a prober on this machine asks each box's vLLM port every
second, and, about two minutes long, one after another:
- a box's engine core is frozen (SIGSTOP on VLLM::EngineCore), until the watchdog restarts it;
- `nft -f /etc/nftables.conf` is run by hand on a box (Debian's file: `flush ruleset` first);
- carol's key is revoked by a run limited to the gateways, then given back by another.
Then the goal's four counts are 0: no request failed after its retries (no gateway is lost in
this schedule, so nothing is excused), no stream ended without a finish_reason or an error, no
prober answer from any box's port, no request answered with carol's key while it was revoked.
And what would make those zeros hollow is checked: requests were answered in every window and
outside them (the door, on the sim network, answers this machine: so does a box's open port),
carol was refused while revoked, and each fault's window ended with the fleet whole.

The edits that break it (named from the code; not each made and run on the fleet):
- the door's `retries` and `option redispatch` removed (haproxy.cfg.j2): a connection refused by
  the frozen box's restart reaches the client, and the SDK's two retries can land on it too;
- the gateway's health check back to vLLM's /health (not the watchdog's /healthy): the frozen
  box stays in rotation and its requests wait until the SDK's timeout;
- the system's ruleset not including thorfleet's (tasks/gateway.py, in_system_ruleset): after
  `nft -f` by hand the port is open until the watchdog's guard loads the table again, and the
  prober, asking every second, can be answered in between (CI saw it once);
- no reload of HAProxy when only the clients changed (tasks/gateway.py): carol is served with a
  revoked key.
A stream already answering on the box whose engine froze fails with an error event: the goal
counts it apart (soak.goal, BOX_LOSS), as the issue counts the gateway's own loss.

Uses boxes 2 and 9 and the gateway boxes gw-2 and gw-3, after the fault stories and the gateway
pair's (one group, file order).
"""

import json

import pytest

from bench import soak

PAIR = ("gw-2", "gw-3")
MINUTES = 2.0


@pytest.fixture(scope="module")
def soaked(sim_fleet, my_boxes, tmp_path_factory):
    """(records, windows, probes, the soak) of the short schedule on the module's boxes."""
    workdir = tmp_path_factory.mktemp("soak")
    fleet = soak.Soak(sim_fleet, my_boxes, workdir, gateways=PAIR)
    for gateway in PAIR:  # as the fleet started them: running, not cut
        sim_fleet.heal(gateway)
    run = fleet.converge("converge")
    assert run.returncode == 0, run.stderr[-4000:]
    fleet.addresses = {h: sim_fleet.ip(h) for h in my_boxes}
    assert fleet.whole(), "the fleet is not whole before the first fault"
    records, windows, probes = soak.soak_run(fleet, soak.schedule(soak.SHORT, MINUTES), MINUTES)
    # (nothing converges back: the team's story after it converges its own clients)
    return records, windows, probes, fleet


def test_the_short_schedule_fails_no_request_cuts_no_stream_opens_no_port_serves_no_revoked_key(
        soaked):
    records, windows, probes, fleet = soaked
    rows, totals = soak.report(records, windows, probes)
    verdict = soak.goal(records, windows, probes)
    shown = "\n".join(str(r) for r in rows)
    assert [w.name for w in windows] == list(soak.SHORT)
    # the zeros are not absence: every window and the rest answered requests, the prober asked
    # each box throughout, carol was refused while revoked
    assert all(r["answered"] > 0 for r in rows), shown
    assert {p[1] for p in probes} == set(fleet.hosts) and len(probes) > 100, len(probes)
    revoked = next(r for r in rows if r["window"] == "key_revoked")
    assert revoked["refused_revoked"] > 0, shown
    failures = [r for r in records if r.outcome != "ok" and r.outcome != "refused_revoked"]
    assert {k: verdict[k] for k in ("failed_after_retries", "cut_silently", "prober_answers",
                                    "served_revoked")} == {
        "failed_after_retries": 0, "cut_silently": 0, "prober_answers": 0,
        "served_revoked": 0}, (verdict, failures[:5], shown)
    assert verdict["met"]
    # each fault's window closed with the fleet whole, by itself (no converge needed)
    assert all(w.healed_at is not None and not w.remedied for w in windows), shown
    assert totals["ttft_p50_s"] is not None


def test_each_clients_tokens_are_what_its_answers_carried_through_the_faults(soaked):
    """The boxes count each client's tokens from their answers' usage; both gateways read every
    box. Over the schedule (a frozen engine restarted, a key revoked and given back, a rolling
    change), each gateway's count is the usage the client received, plus at most what its
    abandoned or cut streams' boxes sent past what reached it (soak.exactness)."""
    records, _, _, fleet = soaked
    tokens = soak.exactness(records, fleet.counted)
    assert all(row["received"] > 0 for row in tokens["clients"].values()), tokens
    assert any(r.kind == "abandoned" for r in records)
    assert tokens["met"], json.dumps(tokens, indent=1)
