"""The image copy's box tool (files/thor/bin/thorfleet-image) on a temp folder: what the image key may
ask, what the sender refuses or leaves out, and what the receiver keeps or throws away on arrival.

`docker`, `ssh` and `sudo` are small stand-ins on PATH: docker keeps images as files (a tag's
labels, ID and layers) and saves and loads real tar streams, ssh runs the sender's forced command
locally with SSH_ORIGINAL_COMMAND set, as sshd does, and sudo runs its command as it is. The edits
that break these: a request matched with re.match or `$` instead of in full (the newline case),
`save` not checking the label (any image of that name leaves), `load` keeping what arrived with
another ID, a skip that drops the top layer or a layer the box lacks, v1 IDs built another way
than Docker's (the real folder names), no whole retry after a refused layers-only load.
"""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers import box_program
from thorfleet.settings.layout import FILES

TOOL = FILES / "thor" / "bin" / "thorfleet-image"
TAG = "thorfleet/mistral-small4:abcdef012345"
INPUTS = "abcdef012345" + "0" * 52

# docker: images/<tag>.json (ID, size, labels, layer diff IDs, which `docker save` layout).
# `image inspect --format T REF...` and `image ls -aq` read them; `save TAG` writes a real tar in
# that layout (legacy: <v1 ID>/layer.tar, the names the tool computes, held to a real Docker's by
# test_v1_ids_name_the_folders_a_real_docker_saved; oci: blobs/sha256/<diff ID>) with a
# manifest.json; `load -q` reads it back as moby's load does: a layer whose file is missing is
# fine when the box has that layer stack already (lss.Get of its chain ID), else it fails; with
# FAKE_LOAD_WANTS_ALL (a store that wants every file) a missing file always fails.
DOCKER = r"""#!/usr/bin/env python3
import io, json, os, sys, tarfile
sys.path.insert(0, os.environ["FAKE_TOOL_DIR"])
tool = __import__("thorfleet_image")
root = os.environ["FAKE_IMAGES"]
def path(tag): return os.path.join(root, tag.replace("/", "_") + ".json")
def images():
    return [json.load(open(os.path.join(root, n))) for n in sorted(os.listdir(root)) if n.endswith(".json")]
def find(ref):
    return next((i for i in images() if ref in (i["tag"], i["id"])), None)
def show(image, template):
    return {"{{.Id}}": image["id"], "{{.Size}}": image["size"],
            "{{json .RootFS.Layers}}": json.dumps(image["layers"])}.get(
                template, image["labels"].get("thorfleet.inputs", ""))
args = sys.argv[1:]
if args[:2] == ["image", "inspect"]:
    found = [find(ref) for ref in args[4:]]
    if None in found: sys.exit(1)
    print("\n".join(str(show(image, args[3])) for image in found))
elif args[:2] == ["image", "ls"]:
    print("\n".join(i["id"] for i in images()))
elif args[:2] == ["info", "--format"]:
    print(os.environ.get("FAKE_DRIVER_STATUS", '[["Backing Filesystem","extfs"]]'))
elif args[0] == "save":
    image = find(args[1])
    names = ([f"blobs/sha256/{d[7:]}" for d in image["layers"]] if image.get("layout") == "oci"
             else [f"{v[7:]}/layer.tar" for v in tool.v1_ids(image["layers"])])
    out = tarfile.open(fileobj=sys.stdout.buffer, mode="w|")
    def add(name, data):
        member = tarfile.TarInfo(name); member.size = len(data); out.addfile(member, io.BytesIO(data))
    for name, diff_id in zip(names, image["layers"]):
        add(name, (diff_id + "\n").encode() * image.get("pad", 1))
    add("manifest.json", json.dumps({"image": image, "layers": names}).encode())
    out.close()
elif args[:2] == ["load", "-q"]:
    try:
        tin = tarfile.open(fileobj=sys.stdin.buffer, mode="r|")
        files = {m.name: tin.extractfile(m).read() for m in tin if m.isfile()}
        manifest = json.loads(files["manifest.json"])
    except (tarfile.TarError, KeyError, ValueError) as e:
        sys.exit(f"unexpected EOF: {e}")
    here = {c for i in images() for c in tool.chain_ids(i["layers"])}
    chains = tool.chain_ids(manifest["image"]["layers"])
    for name, chain in zip(manifest["layers"], chains):
        if name not in files and (chain not in here or os.environ.get("FAKE_LOAD_WANTS_ALL")):
            sys.exit(f"open {name}: no such file or directory")
    json.dump(manifest["image"], open(path(manifest["image"]["tag"]), "w"))
elif args[:3] == ["image", "rm", "-f"]:
    if os.path.exists(path(args[3])): os.remove(path(args[3]))
else:
    sys.exit(f"fake docker: {args}")
"""
# ssh: the last argument is the request; the sender's forced command runs it, as sshd would.
SSH = f'''#!/bin/sh
for last; do :; done
SSH_ORIGINAL_COMMAND=$last exec {sys.executable} "$FAKE_TOOL" serve
'''
SUDO = '''#!/bin/sh
[ "$1" = -n ] && shift
exec "$@"
'''


def image_tool():
    """The box tool as a module, for its pure functions."""
    return box_program("thorfleet-image")


@pytest.fixture
def boxes(tmp_path, monkeypatch):
    """Two boxes' image stores (`sender`, `receiver`) and the fake commands on PATH."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, text in (("docker", DOCKER), ("ssh", SSH), ("sudo", SUDO)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    tool = tmp_path / "thorfleet-image"
    # the tool execs /usr/bin/sudo by its full path, as the sudo rule names it: here, the fake
    tool.write_text(TOOL.read_text().replace('"/usr/bin/sudo"', f'"{bin_ / "sudo"}"')
                    .replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    tool.chmod(0o755)
    (tmp_path / "thorfleet_image.py").write_text(TOOL.read_text())  # for the fake docker's names
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TOOL", str(tool))
    monkeypatch.setenv("FAKE_TOOL_DIR", str(tmp_path))
    stores = {}
    for name in ("sender", "receiver"):
        stores[name] = tmp_path / name
        stores[name].mkdir()
    return tool, stores


BASE_LAYERS = ["sha256:" + c * 64 for c in "abc"]  # the base's, bottom up
PATCH_LAYERS = ["sha256:" + c * 64 for c in "de"]  # thorfleet's patches on top


def put(store, tag=TAG, inputs=INPUTS, image_id="sha256:" + "9" * 64, layers=None, pad=1,
        layout="legacy"):
    (store / (tag.replace("/", "_") + ".json")).write_text(json.dumps(
        {"tag": tag, "id": image_id, "size": 1234, "labels": {"thorfleet.inputs": inputs},
         "layers": layers or BASE_LAYERS + PATCH_LAYERS, "pad": pad, "layout": layout}))


def has(store, tag=TAG):
    return (store / (tag.replace("/", "_") + ".json")).exists()


def serve(tool, store, request):
    """What the sender's forced command answers `request` with: stdout as bytes (a tar)."""
    done = subprocess.run([str(tool), "serve"], capture_output=True, check=False,
                          env={**os.environ, "FAKE_IMAGES": str(store),
                               "SSH_ORIGINAL_COMMAND": request})
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout,
                                       done.stderr.decode())


def members(stream):
    """{name: bytes} of a tar stream."""
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def load(tool, store, sender, *extra):
    # the receiver's docker is its own store; the sender's forced command reads the other one
    # (the fake ssh runs it here, with FAKE_IMAGES pointing at the sender through SENDER below)
    env = {**os.environ, "FAKE_IMAGES": str(store)}
    wrapper = Path(os.environ["FAKE_TOOL"]).parent / "bin" / "ssh"
    wrapper.write_text(f"#!/bin/sh\nfor last; do :; done\nFAKE_IMAGES={sender} "
                       f"SSH_ORIGINAL_COMMAND=$last exec {sys.executable} {tool} serve\n")
    return subprocess.run([str(tool), "load", "--from", "thor-1:2201", "--tag", TAG,
                           "--inputs", INPUTS, "--key", "/k", "--known-hosts", "/kh",
                           "--user", "thorfleet-image", *extra],
                          capture_output=True, text=True, check=False, env=env)


@pytest.mark.parametrize("request_", [
    "", "save", f"save {TAG} extra", f"save {TAG}\n", f"save {TAG}\nsave {TAG}", f"rm {TAG}",
    "save thorfleet/mistral-small4:latest", "save ubuntu:22.04", f"save {TAG};id",
    "save $(id)", "cat /etc/shadow",
    f"save {TAG} skip 0", f"save {TAG} skip 1000", f"save {TAG} skip -1", f"save {TAG} skip 01",
    f"save {TAG} skip 2 ", f"layers {TAG} skip 2", f"layers {TAG}\n", "layers ubuntu:22.04",
    f"save {TAG} skip 2;id",
])
def test_the_key_may_ask_for_a_derived_image_tag_and_nothing_else(boxes, request_):
    tool, stores = boxes
    put(stores["sender"])
    done = serve(tool, stores["sender"], request_)
    assert done.returncode == 2 and done.stdout == b"", done
    assert "this key may only ask `save <derived image tag>`" in done.stderr


def test_a_derived_image_is_sent_whole(boxes):
    tool, stores = boxes
    put(stores["sender"], pad=5000)
    done = serve(tool, stores["sender"], f"save {TAG}")
    assert done.returncode == 0, done.stderr
    sent = members(done.stdout)
    assert [sent[name].splitlines()[0].decode() for name in json.loads(sent["manifest.json"])[
        "layers"]] == BASE_LAYERS + PATCH_LAYERS
    assert f"sent {len(done.stdout)} bytes of {TAG} (image 1234 bytes)" in done.stderr


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_asked_to_skip_the_bottom_layers_the_sender_leaves_their_files_out(boxes, layout):
    tool, stores = boxes
    put(stores["sender"], pad=5000, layout=layout)
    listed = serve(tool, stores["sender"], f"layers {TAG}")
    assert listed.returncode == 0 and json.loads(listed.stdout) == BASE_LAYERS + PATCH_LAYERS
    whole = serve(tool, stores["sender"], f"save {TAG}").stdout
    done = serve(tool, stores["sender"], f"save {TAG} skip 3")
    assert done.returncode == 0, done.stderr
    sent = members(done.stdout)
    names = json.loads(sent["manifest.json"])["layers"]
    assert [name in sent for name in names] == [False] * 3 + [True] * 2
    assert len(done.stdout) < len(whole) / 2
    assert "2 of its 5 layers, the box has the other 3" in done.stderr
    # the top layer always goes: a skip of every layer is refused
    assert serve(tool, stores["sender"], f"save {TAG} skip 5").returncode == 2


def test_v1_ids_name_the_folders_a_real_docker_saved():
    # Docker 20.10.24's `docker save` of a derived image on a sim box (its RootFS.Layers, and
    # manifest.json's Layers): every folder but the top layer's is named by v1_ids
    diff_ids = ["sha256:234b81d780a4d290711f1fc39271aea4d0a2ab08e5e3fd513d459662486524b4",
                "sha256:7be084785e3f61981928416c691fc75af86f2a81f00ac5025ecf386f63334fe1",
                "sha256:7c520919c72736e83e69bc43347394baeaa97dd8de2a4b517bc08ad3da7293d4",
                "sha256:106fd788943b50b59004a691aea28c7a47ff7ecc2fb9501fecbf172f677b5f67",
                "sha256:aee27f611ef8bcd2dcf3a45f4411010acc64916152c3bc690d002abb5d029059",
                "sha256:6c1c7ab8406f0d8aa616e303065bc654eb513f42964220899615c88b795e5225"]
    saved = ["d7877729909d37eb8e59620420e052189e3b61180abde6fe1e7ad66cea86d400",
             "4bb24bbef85ece55538521019f346bbbc2e83b874fed3a440a9df474c2c781b6",
             "59ee204998926d98dd6cb226f0b4c5405524139755e23b2d39f14acf4eab5faf",
             "d8384d7c892bc8315231376bdda1fdcb7f6377ff43077d88a531b7a075c55864",
             "e66d507168c233ee431232e3fc879756b8e2baebe16988b7c5443feeaaf76db7"]
    assert [v[7:] for v in image_tool().v1_ids(diff_ids)[:5]] == saved


def test_chain_ids_and_the_shared_bottom_are_the_oci_definition():
    tool = image_tool()
    a, b, c = BASE_LAYERS
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()  # image-spec config.md
    assert tool.chain_ids([a, b]) == [a, ab]
    here = set(tool.chain_ids([a, b]))
    assert tool.shared_layers([a, b, c], here) == 2
    assert tool.shared_layers([b, a, c], here) == 0  # same layers, another stack: none shared
    assert tool.shared_layers([a, b], set()) == 0


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_a_box_with_the_base_gets_only_the_layers_it_lacks(boxes, layout):
    tool, stores = boxes
    put(stores["sender"], pad=5000, layout=layout)
    put(stores["receiver"], tag="thorfleet/base:abcdef012345", image_id="sha256:" + "1" * 64,
        layers=BASE_LAYERS)
    done = load(tool, stores["receiver"], stores["sender"], "--id", "sha256:" + "9" * 64)
    assert done.returncode == 0 and has(stores["receiver"]), done.stderr
    assert "the bottom 3 of its layers are here already" in done.stderr
    sent = int(done.stderr.split("sent ")[-1].split(" bytes")[0])
    assert sent < 3 * 5000 * 72, done.stderr  # not the base's three layers


def test_a_box_without_the_base_or_with_containerd_store_gets_it_whole(boxes, monkeypatch):
    tool, stores = boxes
    put(stores["sender"], pad=5000)
    done = load(tool, stores["receiver"], stores["sender"])
    assert done.returncode == 0 and "here already" not in done.stderr, done.stderr
    put(stores["receiver"], tag="thorfleet/base:abcdef012345", image_id="sha256:" + "1" * 64,
        layers=BASE_LAYERS)
    (stores["receiver"] / (TAG.replace("/", "_") + ".json")).unlink()
    monkeypatch.setenv("FAKE_DRIVER_STATUS", '[["driver-type","io.containerd.snapshotter.v1"]]')
    done = load(tool, stores["receiver"], stores["sender"])
    assert done.returncode == 0 and "here already" not in done.stderr, done.stderr


def test_a_stream_without_the_base_that_docker_load_refuses_is_asked_for_whole(boxes,
                                                                             monkeypatch):
    tool, stores = boxes
    put(stores["sender"], pad=5000)
    put(stores["receiver"], tag="thorfleet/base:abcdef012345", image_id="sha256:" + "1" * 64,
        layers=BASE_LAYERS)
    monkeypatch.setenv("FAKE_LOAD_WANTS_ALL", "1")
    done = load(tool, stores["receiver"], stores["sender"], "--id", "sha256:" + "9" * 64)
    assert done.returncode == 0 and has(stores["receiver"]), done.stderr
    assert "asking thor-1 for it whole" in done.stderr


def test_an_image_thorfleet_did_not_build_under_that_name_is_refused(boxes):
    tool, stores = boxes
    put(stores["sender"], inputs="")  # an operator's own image tagged like a derived one
    done = serve(tool, stores["sender"], f"save {TAG}")
    assert done.returncode == 2 and done.stdout == b"" and "not an image thorfleet built" in done.stderr
    done = serve(tool, stores["receiver"], f"save {TAG}")  # not there at all
    assert done.returncode == 3 and "is not on this box" in done.stderr


def test_the_image_arrives_checked_by_its_inputs_and_the_builders_id(boxes):
    tool, stores = boxes
    put(stores["sender"])
    done = load(tool, stores["receiver"], stores["sender"], "--id", "sha256:" + "9" * 64)
    assert done.returncode == 0, done.stderr
    assert has(stores["receiver"]) and f"loaded {TAG} from thor-1, ID 999999999999" in done.stderr


def test_another_id_than_the_builders_is_thrown_away(boxes):
    tool, stores = boxes
    put(stores["sender"], image_id="sha256:" + "8" * 64)  # rebuilt since the run read it
    done = load(tool, stores["receiver"], stores["sender"], "--id", "sha256:" + "9" * 64)
    assert done.returncode == 1 and not has(stores["receiver"])
    assert "arrived as 888888888888, not the builder's 999999999999" in done.stderr


def test_another_runs_inputs_are_thrown_away(boxes):
    tool, stores = boxes
    put(stores["sender"], inputs="abcdef012345" + "1" * 52)
    done = load(tool, stores["receiver"], stores["sender"])
    assert done.returncode == 1 and not has(stores["receiver"]) and "not this run's" in done.stderr


def test_a_builder_without_the_image_or_a_cut_transfer_is_a_failure_to_build_after(boxes):
    tool, stores = boxes
    done = load(tool, stores["receiver"], stores["sender"])  # the builder's build failed
    assert done.returncode == 1 and not has(stores["receiver"])
    assert "the transfer from thor-1 stopped (ssh exit 3)" in done.stderr


def test_a_source_that_is_not_a_plain_address_is_never_dialled(boxes):
    tool, _ = boxes
    done = subprocess.run([str(tool), "load", "--from", "thor-1 -oProxyCommand=x", "--tag", TAG,
                           "--inputs", INPUTS, "--key", "/k", "--known-hosts", "/kh", "--user",
                           "u"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "refusing source" in done.stderr
