"""The stand-in bases on a fresh machine (sim/base, sim/fleet.py bases): what is downloaded or
built ahead, and what a run of `python -m sim bases NAME ...` waits for (no Docker: a stand-in
client that only knows which images exist).

The story is CI's on a fresh machine: `up` downloads the Jetson base's wheels while debootstrap
builds the rootfs, and the upstream bases build once `up` has the registry running, not once it
has booted the fleet.
"""

import docker.errors
import pytest

from sim import base, fleet


class Images:
    def __init__(self, tags):
        self.tags = set(tags)

    def get(self, tag):
        if tag not in self.tags:
            raise docker.errors.ImageNotFound(tag)
        return tag


class Client:
    def __init__(self, *tags):
        self.images = Images(tags)


@pytest.fixture
def downloads(monkeypatch):
    fetched = []
    monkeypatch.setattr(base, "_wheels", lambda b: fetched.append(b.name))
    return fetched


def test_the_wheels_are_fetched_ahead_only_for_a_base_not_built(downloads):
    rootfs = "thorfleet-sim/rootfs:0123456789abcdef"
    base.wheels_ahead(Client(), rootfs)
    assert downloads == [base.DEFAULT]
    # built from this rootfs: its tag is the one ensure_base_image looks for, so nothing to fetch
    base.wheels_ahead(Client(base._tag(rootfs, base.DEFAULT)), rootfs)
    assert downloads == [base.DEFAULT]
    # built from another rootfs is not built from this one
    base.wheels_ahead(Client(base._tag("thorfleet-sim/rootfs:other", base.DEFAULT)), rootfs)
    assert downloads == [base.DEFAULT, base.DEFAULT]


def test_a_base_named_that_does_not_exist_is_refused_before_anything_is_built(monkeypatch):
    monkeypatch.setattr(fleet, "_registry_ready", lambda client: pytest.fail("made a registry"))
    with pytest.raises(ValueError, match="no stand-in base upstream-9.9.9: the bases are "
                                         "jetson-0.19.0, "):
        fleet.bases(Client(), ["upstream-0.26.0", "upstream-9.9.9"])


def test_the_named_bases_are_built_and_only_those(monkeypatch):
    monkeypatch.setattr(fleet, "_registry_ready", lambda client: "rootfs")
    monkeypatch.setattr(fleet, "_push_base", lambda client, rootfs, name: f"ref-of-{name}")
    monkeypatch.setattr(fleet.docker, "from_env", lambda: Client())
    built = fleet.bases(Client(), ["upstream-0.33.0", "upstream-0.26.0"])
    assert built == [("upstream-0.33.0", "ref-of-upstream-0.33.0", "0.33.0"),
                     ("upstream-0.26.0", "ref-of-upstream-0.26.0", "0.26.0")]
    assert [name for name, _, _ in fleet.bases(Client())] == list(base.BASES)


def test_with_the_registry_running_no_one_waits_for_the_fleets_lock(monkeypatch):
    """`up` holds the fleet's lock for minutes (the Jetson base, the boxes' boot): a base needs
    only the rootfs and the registry, which `up` made first."""
    monkeypatch.setattr(fleet, "rootfs_tag", lambda: "rootfs-tag")
    monkeypatch.setattr(fleet.registry, "serving", lambda client, rootfs: rootfs == "rootfs-tag")
    monkeypatch.setattr(fleet, "locked", lambda name: pytest.fail(f"waited for {name}"))
    assert fleet._registry_ready(Client()) == "rootfs-tag"
    # without it, the lock and the three steps, as before
    monkeypatch.setattr(fleet.registry, "serving", lambda client, rootfs: False)
    with pytest.raises(pytest.fail.Exception, match="waited for fleet"):
        fleet._registry_ready(Client())
