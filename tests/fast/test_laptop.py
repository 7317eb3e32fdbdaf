"""The laptop's one file writer (thorfleet/run/laptop.py): the report, the fleet CA's files and
the copy keys are each written whole or not at all. The edits that break it: writing in place
(a cut leaves half), a key made with the umask's mode before its chmod."""

import os
import stat

import pytest

from thorfleet.run import laptop


def test_a_private_file_is_0600_and_a_public_one_keeps_its_mode(tmp_path):
    key, report = tmp_path / "key", tmp_path / "report.json"
    laptop.write_whole(key, b"secret", private=True)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_bytes() == b"secret"
    report.write_text("old")
    report.chmod(0o640)
    laptop.write_whole(report, "new")
    assert stat.S_IMODE(report.stat().st_mode) == 0o640 and report.read_text() == "new"


def test_a_symlink_stays_a_link_to_the_file_it_names(tmp_path):
    (tmp_path / "reports").mkdir()
    target, link = tmp_path / "reports" / "last.json", tmp_path / "report.json"
    target.write_text("old")
    link.symlink_to(target)
    laptop.write_whole(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_cut_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    path.write_text("old")

    def cut(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt):
        laptop.write_whole(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]
