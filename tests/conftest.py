"""Fixtures shared by every test module.

`sim_fleet` brings the simulated Thor fleet up once per test run (`python -m sim up`), the
gateway box `gw-1` with it, and takes it down at the end. Under pytest-xdist (`-n 4 --dist loadgroup`, as CI runs the fleet
stories) the first worker brings it up, the others attach, and the controller takes it down.

Each module that acts on boxes owns them, in BOXES below: its tests run in one worker, one after
another, while the stories on other boxes run beside them. Knobs for a developer:

    THORFLEET_SIM_HOSTS=9      boxes to bring up (default: as many as BOXES names)
    THORFLEET_SIM_KEEP=1       leave the fleet running after the run, to look around
                               (`python -m sim status`, `ssh -p 22001 ...`, then `down`)
    THORFLEET_SIM_STATE=DIR    where keys, disks and caches live (default /var/tmp/thorfleet-sim)
"""

import dataclasses
import json
import os
import resource
import time
import uuid
from pathlib import Path

import docker
import pytest

from sim import fleet, operator

# Which boxes (1-based, `thor-<i>`) each fleet module acts on. Modules that share a box share a
# group, so they never run at the same time; the rest run in parallel.
BOXES = {
    "test_deploy": (1, 7), "test_bad_input": (1, 7), "test_drift": (1,), "test_security": (1,),
    "test_disk_hygiene": (1,), "test_fleet_weights": (1, 7),
    "test_faults": (2, 9),  # 9 is only ever cut: the host that is down at the start
    "test_thor_says_no": (8,),
    "test_rollout": (3, 4, 5), "test_benchmark": (3, 4, 5), "test_shared_image": (3, 4, 5),
    "test_air_gapped": (6,), "test_drain": (6,), "test_sim_box": (6,), "test_two_runs": (6,),
    "test_doctor": (6,),  # after the air-gapped story converged it
    "test_gateway": (10, 11, 12),  # and the gateway box, gw-1
    "test_watch": (10, 11, 12),  # and gw-1's Prometheus
    "test_workloads": (10, 11, 12),  # and gw-1: after the watch stories (file order), mixed
    "test_bases": (13, 14),  # the newer base
    "test_gateway_pair": (2, 9),  # after the faults: and the gateway boxes gw-2 and gw-3
    "test_soak": (2, 9),  # after the gateway pair (file order): gw-2 and gw-3 too
    "test_team": (2, 9),  # after the soak (file order): gw-2 and gw-3 with clients
}
# The gateway boxes a module uses besides its Thors (the sim brings up gw-1 ... gw-3).
GATEWAYS = {"test_gateway": ("gw-1",), "test_watch": ("gw-1",), "test_workloads": ("gw-1",),
            "test_gateway_pair": ("gw-2", "gw-3"), "test_soak": ("gw-2", "gw-3"),
            "test_team": ("gw-2", "gw-3")}
# The boxes whose stories prove a first install from nothing (the base pulled: test_deploy's
# first run, the air-gapped box). The others start warm, their disks holding the base already
# (sim/fleet.py warm_disk): their stories are about what comes after.
COLD = (1, 6, 7)
# Longest first (seconds each took in a 4-worker clean-clone .ci/run of fed516b, images cached:
# bench/results/ci-cost-19.json), so the longest start at once and the short ones fill in: xdist
# hands groups out in this order (--no-loadscope-reorder), one at a time.
GROUP_ORDER = [
    "thor-2+9",  # 1494 in a 3-worker run of 7e97bf8 (the longest since the team's story): faults,
    # two gateways with one address, the soak, the team's door
    "thor-10+11+12",  # 1563: the gateway, the watchdog, Prometheus and the workloads
    "thor-3+4+5",  # 1193: rollout, benchmark, shared image
    "thor-1+7",  # 1052: deploy, drift, disk hygiene, security (+ the weights copy)
    "thor-13+14",  # 1021 with a third box: the newer bases (0.26.0 through a canary, 0.33.0)
    "thor-8",  # 600: says no
    "thor-6",  # 527: air-gapped, doctor, drain, the bare box
    "test_patches",  # 285
    "test_base_standin",  # 282 (the rest, 42 to 127 s each, after these)
]


def _group_of(module: str) -> str:
    owners = [boxes for name, boxes in BOXES.items() if name == module]
    if not owners:
        return module  # no box: its own group, so module fixtures are set up once
    # Modules whose boxes overlap must share a group: the group is the union's closure.
    boxes = set(owners[0])
    grew = True
    while grew:
        grew = False
        for other in BOXES.values():
            if boxes & set(other) and not set(other) <= boxes:
                boxes |= set(other)
                grew = True
    return "thor-" + "+".join(str(b) for b in sorted(boxes))


# A test's tier is the folder it lives in, and only that: the marker `-m fast` selects by is
# given here, never written in a test module.
TIERS = ("fast", "docker", "fleet")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group markers, and -m selects
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = item.path.parent.name
        if tier not in TIERS or item.path.parent.parent != Path(__file__).parent:
            raise pytest.UsageError(f"{item.nodeid}: a test module lives in tests/fast, "
                                    "tests/docker or tests/fleet, by what it needs")
        if written := [m.name for m in item.iter_markers() if m.name in TIERS]:
            raise pytest.UsageError(f"{item.nodeid} is marked {written[0]}: its folder, "
                                    f"tests/{tier}, is its tier")
        item.add_marker(getattr(pytest.mark, tier))
        module = item.module.__name__.rsplit(".", 1)[-1]
        uses_fleet = "sim_fleet" in getattr(item, "fixturenames", ())
        if uses_fleet and module not in BOXES:
            raise pytest.UsageError(f"{item.nodeid} uses the fleet: name its boxes in "
                                    "tests/conftest.py BOXES")
        item.add_marker(pytest.mark.xdist_group(_group_of(module)))
    rank = {group: i for i, group in enumerate(GROUP_ORDER)}
    items.sort(key=lambda item: rank.get(_xdist_group(item), len(rank)))  # stable: file order within a group


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's loadgroup, but a worker takes its next group only on the last test of the one it
    has (xdist's own gives one more while two are left: a long group then holds a short one back
    while other workers sit idle), and a one-test group's worker, which needs a next group before
    it starts, takes the shortest waiting (tests/fast/test_scheduling.py)."""
    from xdist.scheduler import LoadGroupScheduling

    class OneGroupAhead(LoadGroupScheduling):
        def _reschedule(self, node):
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            # a worker runs a test once it knows the next one, so it needs the next group while
            # it has one test left, not before
            work = self.assigned_work[node]
            if self._pending_of(work) > 1:
                return
            if not any(done for unit in work.values() for done in unit.values()):
                # a one-test group just handed out (thor-13+14) needs its next
                # group before it can start: the queue's last, a short one, not the next long
                # one (thor-1+7 once waited 31 min behind it and ended 3 min after the rest)
                self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
            self._assign_work_unit(node)

    if config.getvalue("dist") == "loadgroup":
        return OneGroupAhead(config, log)
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A box group's last test retires its boxes (fleet.retire): nothing else uses them, and a
    finished group's images would hold disk the running groups need. xdist hands a worker a
    group whole, so a next item from another group (or none) means this one is done."""
    yield  # after the module's own fixtures have finished with the boxes
    group = _xdist_group(item)
    if nextitem is not None and _xdist_group(nextitem) == group:
        return
    # when each group ended and how long it took: what GROUP_ORDER is balanced by (.ci/run prints
    # it), and what bench/ci_cost.py reads each group's window and laptop side from
    began = _group_started.pop(group, None) or _Began.now()
    took = time.time() - began.time
    if item.get_closest_marker("fast") is None:
        logs = fleet.state_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / "groups.log").open("a") as out:
            out.write(f"{time.strftime('%H:%M:%S')} {group} ended, {took:.0f}s\n")
        with (logs / "groups.jsonl").open("a") as out:
            out.write(json.dumps(began.record(group, _boxes_of(group, item))) + "\n")
    if (not group.startswith("thor-") or "sim_fleet" not in item.fixturenames
            or os.environ.get("THORFLEET_SIM_KEEP") == "1"):
        return
    fleet.retire(docker.from_env(),
                 [fleet.host_name(int(i)) for i in group[len("thor-"):].split("+")])


_FLEET_UP_S = [0.0]  # this process's time bringing the fleet up or attaching to it


@dataclasses.dataclass
class _Began:
    """A group's start, as its worker saw it: the time and the counters its end is measured by."""
    time: float
    cpu_s: float
    children_cpu_s: float
    deploy_s: float
    fleet_up_s: float
    tests: int = 0
    # each test's start ([module::test, epoch s]): what bench/ci_cost.py charges a server start to
    marks: list = dataclasses.field(default_factory=list)

    @classmethod
    def now(cls):
        own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                               resource.RUSAGE_CHILDREN))
        return cls(time.time(), own.ru_utime + own.ru_stime,
                   children.ru_utime + children.ru_stime, operator.SPENT["deploy_s"],
                   _FLEET_UP_S[0])

    def record(self, group: str, boxes: list[str]) -> dict:
        end = _Began.now()
        return {"group": group, "boxes": boxes, "tests": self.tests, "started": self.time,
                "ended": end.time, "worker_cpu_s": round(end.cpu_s - self.cpu_s, 1),
                "children_cpu_s": round(end.children_cpu_s - self.children_cpu_s, 1),
                "deploy_s": round(end.deploy_s - self.deploy_s, 1),
                "fleet_up_s": round(end.fleet_up_s - self.fleet_up_s, 1), "marks": self.marks}


_group_started: dict[str, _Began] = {}  # this process's groups, from their first test


def _boxes_of(group: str, item) -> list[str]:
    if not group.startswith("thor-"):
        return []
    boxes = [fleet.host_name(int(i)) for i in group[len("thor-"):].split("+")]
    return boxes + sorted({g for m in BOXES if _group_of(m) == group for g in GATEWAYS.get(m, ())})


def pytest_runtest_setup(item):
    began = _group_started.setdefault(_xdist_group(item), _Began.now())
    began.tests += 1
    began.marks.append([f"{item.module.__name__.rsplit('.', 1)[-1]}::{item.name}", time.time()])


def _xdist_group(item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker else ""


def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        config.thorfleet_run = uuid.uuid4().hex


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):  # xdist, in the controller: the workers share the run's id
    node.workerinput["thorfleet_run"] = node.config.thorfleet_run


def _run_id(config) -> str:
    workerinput = getattr(config, "workerinput", None)
    return workerinput["thorfleet_run"] if workerinput else config.thorfleet_run


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return  # a worker: the controller takes the fleet down once every worker is done
    if fleet.end_run(_run_id(session.config)):
        if os.environ.get("THORFLEET_SIM_KEEP") == "1":
            print("\nTHORFLEET_SIM_KEEP=1: fleet left running; `python -m sim down` ends it")
        else:
            fleet.down()


@pytest.fixture(scope="session")
def sim_fleet(request):
    """The fleet: `.hosts`, `.gateway` (`gw-1`), `.inventory` (the Thors only),
    `.ssh(host, cmd)`, `.exec(host, cmd)` (as root through Docker), `.ip(host)`, `.reboot(host)`,
    `.cut(host)`, `.heal(host)` (a host may be the gateway),
    `.write_inventory(path, hosts, extra_data, gateway)` (gateway=sim_fleet.gateway adds it)."""
    hosts = int(os.environ.get("THORFLEET_SIM_HOSTS", max(max(b) for b in BOXES.values())))
    started = time.monotonic()
    try:
        warm = tuple(sorted({i for boxes in BOXES.values() for i in boxes} - set(COLD)))
        gateways = max(int(g.removeprefix("gw-")) for names in GATEWAYS.values() for g in names)
        return fleet.up_for_run(hosts, _run_id(request.config), warm=warm, gateways=gateways)
    finally:
        _FLEET_UP_S[0] += time.monotonic() - started


@pytest.fixture(scope="module")
def my_boxes(request, sim_fleet):
    """The hosts BOXES gives the requesting module, in its order."""
    module = request.module.__name__.rsplit(".", 1)[-1]
    return [sim_fleet.hosts[i - 1] for i in BOXES[module]]
