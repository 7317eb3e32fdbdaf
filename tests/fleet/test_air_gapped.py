"""A box with no route to the internet converges from the fleet's own hub mirror and registry
(issue 12, item 3): nothing on a box comes from apt or PyPI at deploy time. The weights are
fetched with the derived image's own huggingface_hub, the image's base comes from the registry.

The box is the sixth, bare until now (this module runs before the drain stories that use it);
its default route is removed, so only the sim's network (hub, registry) answers, as on a site
whose Thors see a mirror and a registry and nothing else. The edit that breaks it: thorfleet as it
was, installing huggingface_hub from PyPI into a venv on the box.
"""


from tests.helpers import box, changed_on, deploy, serves


def test_a_box_with_no_route_out_converges_and_a_rerun_changes_nothing(sim_fleet, my_boxes,
                                                                     tmp_path):
    host = my_boxes[0]
    route = box(sim_fleet, host, "ip route show default")
    box(sim_fleet, host, "ip route del default")
    try:
        # PyPI and Debian's mirrors are out of reach; the hub mirror and the registry are not
        assert sim_fleet.exec(host, "timeout 5 curl -sI https://pypi.org/simple/")[0] != 0
        assert sim_fleet.exec(host, "timeout 5 curl -sI http://deb.debian.org/debian/")[0] != 0
        inventory = sim_fleet.write_inventory(tmp_path / "air_gapped.py", hosts=[host],
                                              extra_data={"rollout_report_path":
                                                          str(tmp_path / "report.json")})
        first = deploy(inventory)
        assert first.returncode == 0, first.stderr[-4000:]
        assert serves(sim_fleet, host, timeout=30)
        assert box(sim_fleet, host, "test -e /opt/thorfleet/venv || echo absent") == "absent"
        assert changed_on(deploy(inventory), host) == []
    finally:
        box(sim_fleet, host, f"ip route replace {route}")
