"""The operator's security story: the API key and the HF token the operator supplies live in
root-only files on the box and nowhere else: not in a command line, the journal, a unit file, a file
another user can read, pyinfra's output at -vv, or the report. The deploy user is an ordinary user
with sudo, and SSH host keys are checked.
"""

import os
import secrets
import subprocess

import pytest

from sim import fleet as sim
from sim.hub import set_token
from tests.helpers import SERVICE, SHARD, box, deploy, downloads, hub, model_dir
from thorfleet.plan import settings_for

# Where another user (nobody) could read a secret on the box; Docker's image layers are skipped
# (they hold no deploy data), its container configs and logs are searched.
READABLE = "/etc /opt /var /tmp /home /run /root /usr/local /srv"


def leaks(sim_fleet, host, needles):
    """Where on the box any of `needles` shows up, apart from the root-only secrets files."""
    patterns = " ".join(f"-e {n}" for n in needles)
    found = {}
    checks = {
        "process list": f"ps auxww | grep -F {patterns} | grep -v grep",
        "journal": f"journalctl --no-pager -o cat | grep -F {patterns}",
        "unit": f"systemctl cat {SERVICE} thorfleet-clocks.service | grep -F {patterns}",
        "systemctl show": f"systemctl show {SERVICE} | grep -F {patterns}",
        "files another user can read": (
            f"runuser -u nobody -- grep -rlsF --exclude-dir=overlay2 --exclude-dir=image "
            f"{patterns} {READABLE}"),
    }
    for where, command in checks.items():
        # What each check printed is the finding, not its exit code: grep exits 2 whenever a file
        # was unreadable (as nobody, /root and /etc/shadow always are), even when it printed a
        # match. Anything else printed (an error) is reported too: a check that cannot look fails.
        _, out = sim_fleet.exec(host, command)
        if out.strip():
            found[where] = out.strip()[:500]
    return found


def planted_leaks(sim_fleet, host, secret):
    """What leaks() reports with the secret planted where a careless hand would leave it: a file
    anyone can read and a process's command line. Removed again before this returns."""
    planted = "/var/tmp/thorfleet-planted-leak"
    box(sim_fleet, host, f"umask 022; echo {secret} > {planted}; "
                         f"setsid sh -c 'sleep 120' {secret} >/dev/null 2>&1 & echo $! > /run/planted.pid")
    try:
        return leaks(sim_fleet, host, [secret])
    finally:
        box(sim_fleet, host, f"kill $(cat /run/planted.pid); rm -f /run/planted.pid {planted}")


@pytest.fixture
def hub_token(sim_fleet, my_boxes):
    """The hub requires a token of this module's box from now on (like a gated repo), and of it
    alone: the stories on other boxes download meanwhile; back to none afterwards."""
    token = "hf_" + secrets.token_hex(16)
    set_token(sim_fleet.state, token, client=sim_fleet.ip(my_boxes[0]))
    try:
        yield token
    finally:
        set_token(sim_fleet.state, None, client=sim_fleet.ip(my_boxes[0]))


def test_secrets_never_leave_their_root_only_files(sim_fleet, my_boxes, hub_token, tmp_path):
    host = my_boxes[0]
    api_key = (sim_fleet.state / "api_key").read_text().strip()
    token_file = tmp_path / "hf_token"
    token_file.touch(mode=0o600)
    token_file.write_text(hub_token + "\n")
    report = tmp_path / "report.json"
    inventory = sim_fleet.write_inventory(tmp_path / "sec.py", hosts=[host], extra_data={
        "weights_hf_token_file": str(token_file), "rollout_report_path": str(report)})
    # A shard to fetch, so the token is really used against the hub.
    box(sim_fleet, host, f"rm {model_dir(sim_fleet)}/{SHARD.format(11)}")
    faults = hub(sim_fleet, host)
    faults.forget_requests()
    run = deploy(inventory, "-vv", as_json=False)
    assert run.returncode == 0, run.stderr[-4000:]
    assert downloads(faults) == [SHARD.format(11)]  # fetched with the token
    for secret in (api_key, hub_token):
        assert secret not in run.stdout + run.stderr, "pyinfra -vv output"
        assert secret not in report.read_text(), "the report"
    assert leaks(sim_fleet, host, [api_key, hub_token]) == {}
    # ...and it would have said so: the key planted in a world-readable file and a command line
    found = planted_leaks(sim_fleet, host, api_key)
    assert found.keys() == {"files another user can read", "process list"}, found
    assert found["files another user can read"] == "/var/tmp/thorfleet-planted-leak", found
    for path in ("/etc/thorfleet/secrets.env", "/etc/thorfleet/hf_token"):
        assert box(sim_fleet, host, f"stat -c '%a %U %G' {path}") == "600 root root", path
    # The key guards the API (the server has it), the unit names it only by variable.
    assert "-e VLLM_API_KEY \\" in box(sim_fleet, host, f"systemctl cat {SERVICE}")
    # Back to no token: the token file is removed from the box.
    set_token(sim_fleet.state, None, client=sim_fleet.ip(host))
    inventory = sim_fleet.write_inventory(tmp_path / "sec.py", hosts=[host], extra_data={
        "rollout_report_path": str(report)})
    again = deploy(inventory)
    assert again.returncode == 0, again.stderr[-4000:]
    assert sim_fleet.exec(host, "test -e /etc/thorfleet/hf_token")[0] != 0


def test_the_deploy_user_is_an_ordinary_user_with_sudo(sim_fleet, my_boxes):
    host = my_boxes[0]
    assert sim_fleet.ssh(host, "id -u").stdout.strip() != "0"
    assert sim_fleet.ssh(host, "sudo -n id -u").stdout.strip() == "0"
    data = sim.sim_group_data()
    assert data["ssh_user"] != "root"
    # host keys are checked by thorfleet's own default, and the tests run on it
    assert _defaults()["ssh_strict_host_key_checking"] == "yes"
    assert "ssh_strict_host_key_checking" not in data


def test_an_unknown_host_key_is_refused(sim_fleet, my_boxes, tmp_path):
    host = my_boxes[0]
    stranger = tmp_path / "known_hosts"
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    # known_hosts names the box with another key: a man in the middle, as far as SSH can tell
    stranger.write_text(f"[127.0.0.1]:{sim_fleet.ssh_port(host)} "
                        f"{' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    inventory = sim_fleet.write_inventory(tmp_path / "mitm.py", hosts=[host], extra_data={
        "ssh_known_hosts_file": str(stranger), "rollout_report_path": str(tmp_path / "r.json")})
    run = deploy(inventory, timeout=120)
    assert run.returncode != 0
    assert f"[{host}] thorfleet: could not connect over SSH" in run.stderr, run.stderr[-2000:]
    assert "ssh-keygen -R" in run.stderr and "Connected" not in run.stderr, run.stderr[-2000:]
    # a box known_hosts does not name at all is refused too (pyinfra's own default would add it)
    stranger.write_text("")
    run = deploy(inventory, timeout=120)
    assert run.returncode != 0 and "Connected" not in run.stderr, run.stderr[-2000:]
    assert stranger.read_text() == ""


def _defaults():
    path = sim.BOX_DIR.parents[1] / "group_data" / "all.py"
    scope = {"__name__": "group_data_all", "os": os}
    exec(compile(path.read_text(), str(path), "exec"), scope)  # noqa: S102 - our own file
    return {k: v for k, v in scope.items() if not k.startswith("_") and k != "os"}


def test_serving_without_a_key_must_be_explicit_and_binds_localhost(monkeypatch):
    monkeypatch.delenv("THORFLEET_API_KEY", raising=False)
    data = {**_defaults(), "weights_model_revision": "a" * 40, "weights_draft_revision": "b" * 40,
            "image_base": "r/vllm@sha256:" + "c" * 64}
    with pytest.raises(ValueError, match="no API key"):
        settings_for(data)
    s = settings_for({**data, "service_allow_no_api_key": True})
    assert 'host: "127.0.0.1"' in s.config_text and s.secrets_env_text == ""
