"""The image copy's box tool (files/bin/thorfleet-image) on a temp folder: what the image key may
ask, what the sender refuses, and what the receiver keeps or throws away on arrival.

`docker`, `ssh` and `sudo` are small stand-ins on PATH: docker keeps images as files (a tag's
labels, ID and bytes), ssh runs the sender's forced command locally with SSH_ORIGINAL_COMMAND
set, as sshd does, and sudo runs its command as it is. The edits that break these: a request
matched with re.match or `$` instead of in full (the newline case), `save` not checking the label
(any image of that name leaves), `load` keeping what arrived with another ID.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from thorfleet.settings.layout import FILES

TOOL = FILES / "bin" / "thorfleet-image"
TAG = "thorfleet/mistral-small4:abcdef012345"
INPUTS = "abcdef012345" + "0" * 52

# docker: `image inspect --format T TAG` from images/<tag>.json, `save TAG` prints its bytes,
# `load -q` reads a "TAG\nJSON" stream back into images/, `image rm -f TAG` removes it.
DOCKER = r'''#!/usr/bin/env python3
import json, os, sys
root = os.environ["FAKE_IMAGES"]
def path(tag): return os.path.join(root, tag.replace("/", "_") + ".json")
args = sys.argv[1:]
if args[:2] == ["image", "inspect"]:
    template, tag = args[3], args[4]
    if not os.path.exists(path(tag)): sys.exit(1)
    image = json.load(open(path(tag)))
    print(image["id"] if template == "{{.Id}}" else image["size"] if template == "{{.Size}}"
          else image["labels"].get("thorfleet.inputs", ""))
elif args[0] == "save":
    image = json.load(open(path(args[1])))
    sys.stdout.write(args[1] + "\n" + json.dumps(image) + "\n" + image.get("pad", ""))
elif args[:2] == ["load", "-q"]:
    data = sys.stdin.read()
    tag, _, rest = data.partition("\n")
    try:
        image = json.loads(rest.partition("\n")[0])
    except ValueError:
        sys.exit("unexpected EOF")
    json.dump(image, open(path(tag), "w"))
elif args[:3] == ["image", "rm", "-f"]:
    if os.path.exists(path(args[3])): os.remove(path(args[3]))
else:
    sys.exit(f"fake docker: {args}")
'''
# ssh: the last argument is the request; the sender's forced command runs it, as sshd would.
SSH = f'''#!/bin/sh
for last; do :; done
SSH_ORIGINAL_COMMAND=$last exec {sys.executable} "$FAKE_TOOL" serve
'''
SUDO = '''#!/bin/sh
[ "$1" = -n ] && shift
exec "$@"
'''


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
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TOOL", str(tool))
    stores = {}
    for name in ("sender", "receiver"):
        stores[name] = tmp_path / name
        stores[name].mkdir()
    return tool, stores


def put(store, tag=TAG, inputs=INPUTS, image_id="sha256:" + "9" * 64, pad=""):
    (store / (tag.replace("/", "_") + ".json")).write_text(json.dumps(
        {"id": image_id, "size": 1234, "labels": {"thorfleet.inputs": inputs}, "pad": pad}))


def has(store, tag=TAG):
    return (store / (tag.replace("/", "_") + ".json")).exists()


def serve(tool, store, request):
    return subprocess.run([str(tool), "serve"], capture_output=True, text=True, check=False,
                          env={**os.environ, "FAKE_IMAGES": str(store),
                               "SSH_ORIGINAL_COMMAND": request})


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
])
def test_the_key_may_ask_for_a_derived_image_tag_and_nothing_else(boxes, request_):
    tool, stores = boxes
    put(stores["sender"])
    done = serve(tool, stores["sender"], request_)
    assert done.returncode == 2 and done.stdout == "", done
    assert "this key may only ask `save <derived image tag>`" in done.stderr


def test_a_derived_image_is_sent_whole(boxes):
    tool, stores = boxes
    put(stores["sender"], pad="x" * 5000)
    done = serve(tool, stores["sender"], f"save {TAG}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(TAG + "\n") and done.stdout.endswith("x" * 5000)
    assert f"sent {len(done.stdout.encode())} bytes of {TAG} (image 1234 bytes)" in done.stderr


def test_an_image_thorfleet_did_not_build_under_that_name_is_refused(boxes):
    tool, stores = boxes
    put(stores["sender"], inputs="")  # an operator's own image tagged like a derived one
    done = serve(tool, stores["sender"], f"save {TAG}")
    assert done.returncode == 2 and done.stdout == "" and "not an image thorfleet built" in done.stderr
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
