"""Two gateways, one address: the door survives its own loss (issue 36, part 4).

The operator puts two gateway boxes in the group `gateway` with gateway_virtual_ip (the sim
writes an address of its network, which this machine reaches through Docker's bridge) and
converges. keepalived holds the address on the first gateway; both carry one HAProxy config, one
certificate naming the address, and each Thor's firewall lets both in. Then:
- the gateway holding the address is killed under load (its container, as a host dies): the other
  takes the address within seconds and requests through it succeed again; the one back up does
  not take it back (nopreempt); HAProxy stopped on the holder moves it too;
- a rollout behind the two drains each box on both and fails no request;
- a gateway that was down during a run that changed the door never takes the address: it stays
  out (keepalived's level check) even when the other dies, until a run reaches it;
- keepalived's config edited by hand is put back by a re-run, which otherwise changes nothing;
- a ruleset loaded by hand on a Thor never leaves its vLLM port open: `nft -f` of the system's
  file loads thorfleet's table in its own transaction, and after a flush the watchdog loads it;
- a run that dies on a gateway between its level file and its reload leaves that gateway out;
- VRRP adverts at priority 255 from another LAN host never move the address.

The edits that break them: no track script (the address stays on a gateway whose HAProxy is
stopped); a level check that passes when it cannot read its own level or when the digests
differ (the stale gateway takes the address), or keepalived not started on a gateway that comes
back (nothing holds the address, and the story used to pass on that absence); a drain on the first gateway only (the holder, if
it is the second, cuts requests in the rollout); a firewall naming one gateway (the other's
health checks are dropped, every box is down behind it); the system's ruleset not including
thorfleet's (the table is gone after `nft -f /etc/nftables.conf`); the watchdog's firewall guard
not started (`nft flush ruleset` leaves the port open to every host); the door-check reading
its own level from the file a run writes (the stale gateway takes the address); no
`check_unicast_src` and VRRP accepted from anyone (the rogue's advert takes the address).

Uses boxes 2 and 9 (after the fault stories) and the gateway boxes gw-2 and gw-3.
"""

import ipaddress
import json
import subprocess
import sys
import time

import pytest

from tests.fleet.test_gateway import Front, Load
from tests.helpers import ROOT, box, changed_on, deploy, outcome, wait_for
from thorfleet.settings import layout

PAIR = ("gw-2", "gw-3")
MOVED_S = 20  # the address moves within this (keepalived: advert 1 s, checks 1-3 s) and serves
BEHIND_OUT_S = 17  # a gateway that falls behind while it runs is out within this (docs/gateway.md)


@pytest.fixture(scope="module")
def door(sim_fleet, my_boxes, tmp_path_factory):
    """converge(name, gateways=PAIR, **group data) -> (run, report); the first is done."""
    workdir = tmp_path_factory.mktemp("pair")
    key = (sim_fleet.state / "api_key").read_text().strip()

    def converge(name="converge", gateways=PAIR, gateway_data=None, **group_data):
        report_path = workdir / f"{name}-report.json"
        inventory = sim_fleet.write_inventory(
            workdir / f"{name}.py", hosts=my_boxes,
            gateway=[(g, gateway_data or {}) for g in gateways],
            extra_data={"rollout_report_path": str(report_path), **group_data})
        run = deploy(inventory)
        run.inventory = inventory  # for `thorfleet status` on the same inventory
        report = json.loads(report_path.read_text()) if report_path.exists() else {}
        return run, report

    for gateway in PAIR:  # as the fleet started them: running, not cut
        sim_fleet.heal(gateway)
    run, report = converge()
    assert run.returncode == 0, outcome(run, PAIR[0])
    front = Front(converge, report["endpoint"], key, my_boxes)
    front.sim = sim_fleet
    front.address = front.host
    return front


def holder(sim_fleet, address):
    """Which gateway of the pair has the shared address on an interface (None: neither)."""
    found = [g for g in PAIR if sim_fleet.exec(g, f"ip -o -4 addr show | grep -qw {address}")[0]
             == 0]
    assert len(found) <= 1, found  # two holders: the LAN would see the address twice
    return found[0] if found else None


def test_two_gateways_hold_one_address_and_a_rerun_changes_nothing(sim_fleet, door, my_boxes):
    assert ipaddress.ip_address(door.address)  # the report's URL is the shared address
    assert wait_for(lambda: holder(sim_fleet, door.address), MOVED_S) == PAIR[0]
    ok, said = door.completion(4)
    assert ok, said
    # one config (but for each one's own peer line: the peers section hands the conversations'
    # homes to the other) and one certificate on both
    for path in ("/etc/haproxy/haproxy.cfg", "/etc/haproxy/thorfleet/gateway.pem",
                 "/etc/haproxy/thorfleet/level"):
        digests = {box(sim_fleet, g, f"grep -v '^    localpeer ' {path} | sha256sum").split()[0]
                   for g in PAIR}
        assert len(digests) == 1, path
    assert {box(sim_fleet, g, "grep '^    localpeer ' /etc/haproxy/haproxy.cfg") for g in PAIR} == {
        "localpeer gateway-1", "localpeer gateway-2"}
    # each Thor lets both gateways in
    for thor in my_boxes:
        table = box(sim_fleet, thor, "nft list table inet thorfleet")
        assert all(sim_fleet.ip(g) in table for g in PAIR), table
    run, _ = door.converge("again")
    assert run.returncode == 0, run.stderr[-4000:]
    assert {h: changed_on(run, h) for h in [*my_boxes, *PAIR]} == {
        h: [] for h in [*my_boxes, *PAIR]}
    # status says who holds the address, and that the other stands by
    shown = subprocess.run([sys.executable, "-m", "thorfleet", "status", str(run.inventory)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert (f"the door's address {door.address}: held by {PAIR[0]} ({PAIR[1]}: backup)"
            in shown.stdout), shown.stdout
    # doctor on the two gateways: HAProxy's build, keepalived, sudo, the mirror (issue 38)
    asked = subprocess.run([sys.executable, "-m", "thorfleet", "doctor", str(run.inventory),
                            "--limit", "gateway", "--json"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, check=False)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    rows = {(r["host"], r["check"]): r for r in json.loads(asked.stdout)}
    for gateway in PAIR:
        for check in ("passwordless sudo", "HAProxy", "keepalived"):
            assert rows[gateway, check]["verdict"] == "ok", rows[gateway, check]
        assert rows[gateway, "package mirror"]["found"].startswith("http"), rows


def test_the_holder_killed_under_load_the_other_takes_the_address(sim_fleet, door):
    first, second = PAIR
    assert wait_for(lambda: holder(sim_fleet, door.address), MOVED_S) == first
    with Load(door, clients=2, max_tokens=4, retries=1) as load:
        time.sleep(3)
        killed = time.monotonic()
        sim_fleet.client.containers.get(f"thorfleet-{first}").kill()  # the host dies
        assert wait_for(lambda: holder(sim_fleet, door.address) == second, MOVED_S)
        moved = time.monotonic() - killed
        time.sleep(8)
    served = [r for r in load.results if r[0] >= killed + MOVED_S / 2 and r[1]]
    assert served and not load.failed(since=killed + MOVED_S / 2), load.failed(killed)[:3]
    print(f"the address moved {moved:.1f} s after the holder was killed")
    # back up, it does not take the address back (nopreempt): no second move
    sim_fleet.client.containers.get(f"thorfleet-{first}").start()
    sim_fleet.wait_booted(first)
    time.sleep(5)
    assert holder(sim_fleet, door.address) == second
    # HAProxy stopped on the holder: its check fails, the address goes to the other
    box(sim_fleet, second, "systemctl stop haproxy")
    try:
        assert wait_for(lambda: holder(sim_fleet, door.address) == first, MOVED_S)
        assert wait_for(lambda: door.completion(4)[0], MOVED_S, every=1)
    finally:
        box(sim_fleet, second, "systemctl start haproxy")


def test_a_rollout_behind_two_gateways_drains_on_both_and_fails_no_request(sim_fleet, door,
                                                                           my_boxes):
    with Load(door, clients=2) as load:
        time.sleep(2)
        run, report = door.converge("roll", service_extra_env={"THORFLEET_PAIR_TEST": "roll"})
        time.sleep(2)
    assert run.returncode == 0, outcome(run, my_boxes[0])
    assert len(load.results) > 20 and load.failed() == [], load.failed()[:5]
    for thor in my_boxes:  # drained on each gateway before its restart
        for gateway in PAIR:
            assert f"[{thor}] thorfleet: {gateway}: " in run.stderr.replace("\x1b", ""), gateway
    assert report["gateway"]["out_of_rotation"] == {}


def test_a_gateway_that_missed_a_run_never_takes_the_address(sim_fleet, door):
    holding = wait_for(lambda: holder(sim_fleet, door.address), MOVED_S)
    away = next(g for g in PAIR if g != holding)
    sim_fleet.client.containers.get(f"thorfleet-{away}").stop(timeout=10)
    try:
        # the door changes while `away` is down: the run converges what it reaches, names it
        run, report = door.converge("missed", gateway_data={"gateway_retry_after_s": 7})
        assert run.returncode != 0 and list(report["gateway"]["not_level"]) == [away], report
        assert f"gateway {away} is not level with this run" in run.stderr
        assert holder(sim_fleet, door.address) == holding
    finally:
        sim_fleet.client.containers.get(f"thorfleet-{away}").start()
        sim_fleet.wait_booted(away)
    # back, it learns it is behind (the other's level is newer) and stays out...
    assert wait_for(lambda: box(sim_fleet, away, "cat /var/lib/thorfleet/peer-level || true")
                    == box(sim_fleet, holding, "cat /etc/haproxy/thorfleet/level"), 30)
    sim_fleet.client.containers.get(f"thorfleet-{holding}").kill()
    try:
        # ...because keepalived there runs and its level check fails (not merely slow to take
        # over, nor not running), through the whole time the address takes to move (MOVED_S), in
        # which it never holds it
        until = time.monotonic() + MOVED_S
        while time.monotonic() < until:
            assert holder(sim_fleet, door.address) != away, "a gateway behind took the address"
            time.sleep(1)
        assert box(sim_fleet, away, "systemctl is-active keepalived") == "active"
        level = box(sim_fleet, away, "sed -n 's/^ *script \"\\(.* level .*\\)\"$/\\1/p' "
                                     "/etc/keepalived/keepalived.conf")
        assert sim_fleet.exec(away, level)[0] == 1, level  # the check keepalived runs: behind
        # ...until a run reaches it: level again, it takes the address, with the new config
        run, _ = door.converge("level", gateway_data={"gateway_retry_after_s": 7})
        assert away in {h for h in PAIR if changed_on(run, h)}
        assert wait_for(lambda: holder(sim_fleet, door.address) == away, MOVED_S)
        assert wait_for(lambda: door.completion(4)[0], MOVED_S, every=1)
    finally:
        sim_fleet.client.containers.get(f"thorfleet-{holding}").start()
        sim_fleet.wait_booted(holding)
    run, _ = door.converge("both", gateway_data={"gateway_retry_after_s": 7})
    assert run.returncode == 0, outcome(run, holding)


def test_keepalived_config_edited_by_hand_is_put_back(sim_fleet, door):
    target = PAIR[1]
    box(sim_fleet, target, "sed -i 's/advert_int 1/advert_int 9/' /etc/keepalived/keepalived.conf")
    run, _ = door.converge("drift", gateway_data={"gateway_retry_after_s": 7})
    assert run.returncode == 0, outcome(run, target)
    changed = changed_on(run, target)
    assert any(op.startswith("Gateway | Write keepalived's config") for op in changed), changed
    assert any(op.startswith("Gateway | Reload keepalived") for op in changed), changed
    assert "advert_int 1" in box(sim_fleet, target, "cat /etc/keepalived/keepalived.conf")
    run, _ = door.converge("drift-again", gateway_data={"gateway_retry_after_s": 7})
    assert [changed_on(run, h) for h in PAIR] == [[], []]


FIREWALL_BACK_S = 5  # the watchdog looks every second; nft loads in well under one


def test_a_ruleset_loaded_by_hand_never_opens_a_boxs_port(sim_fleet, door, my_boxes):
    """`nft -f /etc/nftables.conf` by hand on a Thor (Debian's file: `flush ruleset` first, and
    the deploy's include of thorfleet's script last): thorfleet's table is there the moment the
    load returns, before any look of the watchdog's (the soak's prober once found the port open in
    between). `nft flush ruleset` by hand loads no file: within seconds the watchdog loads the
    table again and the vLLM port answers no other host. The gateways still reach the box."""
    thor, other = my_boxes[0], my_boxes[1]
    probe = (f"curl -s -o /dev/null -m 2 -w '%{{http_code}}' "
             f"http://{sim_fleet.ip(thor)}:8002/health")
    assert sim_fleet.exec(other, probe)[1].strip() == "000"
    assert box(sim_fleet, thor, f"tail -n1 {layout.SYSTEM_RULESET}") == layout.RULESET_INCLUDE
    # listed in the same breath as the load: no watchdog look fits between the two
    box(sim_fleet, thor, f"nft -f {layout.SYSTEM_RULESET} && nft list table inet thorfleet")
    assert sim_fleet.exec(other, probe)[1].strip() == "000"
    since = box(sim_fleet, thor, "date +%s")
    box(sim_fleet, thor, "nft flush ruleset")
    assert wait_for(lambda: sim_fleet.exec(thor, "nft list table inet thorfleet")[0] == 0
                    and sim_fleet.exec(other, probe)[1].strip() == "000", FIREWALL_BACK_S)
    assert "loaded it again" in box(sim_fleet, thor, f"journalctl -t thorfleet-watchdog "
                                                     f"--no-pager -o cat --since @{since}")
    assert wait_for(lambda: door.completion(4)[0], MOVED_S, every=1)


def test_a_run_that_dies_before_a_gateways_reload_leaves_it_out(sim_fleet, door):
    """The run changes the door; on the gateway not holding the address its level file and
    config are written, then the reload fails (as a run dies there): its HAProxy still serves
    the old door, so with the holder gone it must not hold the address past its second failed
    level check. It knows it is behind once a check has read the holder's new level (every 3 s);
    a holder lost before that read leaves it unaware (docs/gateway.md), so the kill waits for it."""
    holding = wait_for(lambda: holder(sim_fleet, door.address), MOVED_S)
    away = next(g for g in PAIR if g != holding)
    dropin = "/etc/systemd/system/haproxy.service.d/zz-test-reload-fails.conf"
    box(sim_fleet, away, f"mkdir -p {dropin.rsplit('/', 1)[0]} && printf '[Service]\\n"
                         f"ExecReload=\\nExecReload=/bin/false\\n' > {dropin} && "
                         "systemctl daemon-reload")
    try:
        run, _ = door.converge("dies", gateway_data={"gateway_retry_after_s": 9})
        assert run.returncode != 0, outcome(run, away)
        level = "cat /etc/haproxy/thorfleet/level"
        assert box(sim_fleet, away, level) == box(sim_fleet, holding, level)  # the file says level
        assert wait_for(lambda: box(sim_fleet, away, f"cat {layout.GATEWAY_PEER_LEVEL}")
                        == box(sim_fleet, holding, level), MOVED_S), "never read the new level"
        sim_fleet.client.containers.get(f"thorfleet-{holding}").kill()
        # out at its second failed level check in a row, BEHIND_OUT_S at most after the holder's
        # reload (till then it may take the address): the end of the wait is what counts
        time.sleep(max(MOVED_S / 2, BEHIND_OUT_S))
        assert holder(sim_fleet, door.address) is None, "a gateway serving the old door took it"
    finally:
        box(sim_fleet, away, f"rm -f {dropin} && systemctl daemon-reload")
        container = sim_fleet.client.containers.get(f"thorfleet-{holding}")
        if container.status != "running":
            container.start()
            sim_fleet.wait_booted(holding)
        # level again whatever happened above: the stories after this one need the pair whole
        run, _ = door.converge("after-dies", gateway_data={"gateway_retry_after_s": 9})
    assert run.returncode == 0, outcome(run, away)


SEND_ADVERTS = """import socket, struct, sys, time
vrid, target, vip = int(sys.argv[1]), sys.argv[2], sys.argv[3]
head = struct.pack("!BBBBBBH", 0x21, vrid, 255, 1, 0, 1, 0) + socket.inet_aton(vip) + bytes(8)
words = sum(struct.unpack("!%dH" % (len(head) // 2), head))
while words >> 16:
    words = (words & 0xFFFF) + (words >> 16)
packet = head[:6] + struct.pack("!H", ~words & 0xFFFF) + head[8:]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, 112)
s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 255)
for _ in range(8):
    s.sendto(packet, (target, 0))
    time.sleep(1)
"""


def test_an_advert_from_another_lan_host_never_moves_the_address(sim_fleet, door, my_boxes):
    """A Thor (any LAN host) sends the holder VRRP adverts at priority 255 for the door's
    router id, with a valid checksum, for eight seconds: the address stays where it is."""
    holding = wait_for(lambda: holder(sim_fleet, door.address), MOVED_S)
    rogue = my_boxes[0]
    box(sim_fleet, rogue, f"cat > /tmp/adverts.py <<'EOF'\n{SEND_ADVERTS}EOF")
    box(sim_fleet, rogue, f"nohup python3 /tmp/adverts.py 51 {sim_fleet.ip(holding)} "
                          f"{door.address} >/dev/null 2>&1 &")
    deadline = time.monotonic() + 10  # the adverts' 8 s, and a master-down interval after
    while time.monotonic() < deadline:
        assert holder(sim_fleet, door.address) == holding, "a LAN host's advert moved it"
        time.sleep(0.5)
    assert "counter packets 0 " not in box(sim_fleet, holding,
                                           "nft list table inet thorfleet_gateway | grep l4proto")
