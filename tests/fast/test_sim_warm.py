"""A warm box's disk (sim/fleet.py warm_disk): the base's image store shared by hard links, the
engine's own files each box's (temp folders, no Docker).

A box started on it holds the base as if pulled (tests/fleet stories on boxes outside conftest's
COLD); the cold boxes' first installs are what prove the pull.
"""

import os

from sim import fleet


def engine_disk(root):
    """The files a box's Docker leaves in /var/lib/docker after pulling one image and stopping."""
    files = {"image/overlay2/repositories.json": "{}",
             "image/overlay2/imagedb/content/sha256/a": "{}",
             "overlay2/abc/diff/opt/venv/bin/python3": "#!", "overlay2/abc/link": "XYZ",
             "engine-id": "one-engine", "network/files/local-kv.db": "bolt",
             "buildkit/metadata_v2.db": "bolt", "volumes/metadata.db": "bolt"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "overlay2" / "l").mkdir()
    os.symlink("../abc/diff", root / "overlay2" / "l" / "XYZ")  # overlay2's short lower names
    return root


def test_a_warm_disk_shares_the_image_store_and_nothing_of_the_engines_own(tmp_path):
    warm = engine_disk(tmp_path / "warm")
    box = tmp_path / "box" / "docker"
    fleet._seed_disk(warm, box)
    layer = "overlay2/abc/diff/opt/venv/bin/python3"
    assert os.path.samefile(warm / layer, box / layer)  # linked, not copied: no CPU, no disk
    assert (box / "overlay2/l/XYZ").is_symlink()
    assert (box / "image/overlay2/repositories.json").read_text() == "{}"
    # what each engine writes in place, or names itself by, is never shared
    assert sorted(p.name for p in box.iterdir()) == sorted(fleet.WARM_PARTS)
    # a box that removes the base (or prunes) takes nothing from the others
    (box / layer).unlink()
    assert (warm / layer).read_text() == "#!"


class Box:
    """A container as the Docker SDK gives it: put_archive extracts a tar into the box (here, a
    folder standing for its root)."""

    def __init__(self, root):
        self.root = root

    def put_archive(self, path, data):
        import io
        import tarfile

        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            self.members = tar.getmembers()
            tar.extractall(self.root / path.lstrip("/"), filter="tar")
        return True


def test_a_warm_box_holds_what_vllm_learnt_of_the_model_classes_where_the_unit_mounts_it(tmp_path):
    from thorfleet.settings.layout import BOX_VLLM_CACHE

    learnt = tmp_path / "warm" / "vllm"
    (learnt / "modelinfos").mkdir(parents=True)
    name = "vllm-model_executor-models-pixtral-PixtralForConditionalGeneration.json"
    (learnt / "modelinfos" / name).write_text('{"hash": "h"}')
    box = Box(tmp_path / "box")
    (box.root / "var/cache").mkdir(parents=True)

    class Client:
        class containers:  # as the SDK names it
            get = staticmethod(lambda name: box)

    fleet._seed_modelinfos(Client, learnt, "thorfleet-thor-2")
    seeded = box.root / BOX_VLLM_CACHE.lstrip("/") / "modelinfos" / name
    assert seeded.read_text() == '{"hash": "h"}'
    # every folder on the way is root's and 755, as the deploy's "Create the vLLM cache folder"
    assert {(m.name, m.uid, oct(m.mode)) for m in box.members if m.isdir()} == {
        ("thorfleet", 0, "0o755"), ("thorfleet/vllm", 0, "0o755"),
        ("thorfleet/vllm/modelinfos", 0, "0o755")}


def test_the_shared_derived_image_is_named_for_its_base_and_every_file_of_its_context(tmp_path):
    """The docker-tier modules share one derived image (sim/base/testing.py derived_image): a
    patch edited, added or renamed, or another base, must name another image, never reuse one
    built before the change."""
    from sim.base.testing import derived_tag

    context = tmp_path / "image"
    (context / "patches").mkdir(parents=True)
    (context / "chatfix.py").write_text("print('plan')\n")
    (context / "patches" / "a.diff").write_text("-old\n+new\n")
    first = derived_tag("sha256:base", context)
    assert derived_tag("sha256:base", context) == first  # the same inputs: the same image
    assert derived_tag("sha256:other", context) != first
    (context / "patches" / "a.diff").write_text("-old\n+newer\n")
    edited = derived_tag("sha256:base", context)
    assert edited != first
    (context / "patches" / "a.diff").rename(context / "patches" / "b.diff")
    renamed = derived_tag("sha256:base", context)
    assert renamed not in (first, edited)
    (context / "__pycache__").mkdir()  # what Python writes beside the context is not an input
    (context / "__pycache__" / "chatfix.pyc").write_bytes(b"\0")
    assert derived_tag("sha256:base", context) == renamed
