"""Image: the derived vLLM image, built on the box from a pinned base, once per run: shared through
a registry (built and pushed by the run's first box, pulled and checked by the others) or, without
one, loaded by the others from that first box over SSH and checked the same way."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FunctionCommand, operation

from thorfleet import facts
from thorfleet.operations.commands import ShownCommand, q, sh
from thorfleet.run import pyinfra_hooks
from thorfleet.run.runstate import run_state
from thorfleet.run.snapshot import is_planned, read, reads
from thorfleet.settings.layout import (
    BOX_IMAGE_KEY,
    BOX_IMAGE_TOOL,
    BOX_PEER_KNOWN_HOSTS,
    IMAGE_USER,
)
from thorfleet.settings.roles import thors


def _labels(tag, **_):
    return facts.serving.DockerImageLabels, {"ref": tag}


def _base_labels(base, **_):  # the base is pulled first when the box does not have it
    return facts.serving.DockerImageLabels, {"ref": base}


def _build(tag, base, inputs_hash, think_prefill, context, base_present):
    """The shell commands that build the derived image from `context` (the base pulled first)."""
    commands = [] if base_present else [sh("docker", "pull", base)]
    commands.append(sh("sh", f"{context}/build-image.sh", "--base", base, "--tag", tag,
                       "--think-prefill", int(bool(think_prefill)),
                       "--label", f"thorfleet.inputs={inputs_hash}"))
    return commands


def _fallback(tag, base, inputs_hash, think_prefill, context, base_labels):
    """(the local build as one command, the ID the run's first host holds or None): what a box
    that receives the image from that host checks it against, and builds when it cannot."""
    built = " && ".join(_build(tag, base, inputs_hash, think_prefill, context,
                               base_labels is not None))
    return built, run_state(host.state).image_ids.get(tag)


def _pulled(tag, inputs_hash, shared_ref, image_id=None):
    """Shell that pulls the image from image_registry, checks on arrival that its thorfleet.inputs
    label is this run's hash of every input and, when the run's first host built or holds it,
    that its ID is that image's (the registry's digests check the bytes), and tags it under the
    local name; false when the registry does not have it as this run expects."""
    label = "{{index .Config.Labels \"thorfleet.inputs\"}}"
    same = (f" && [ \"$(docker inspect --format '{{{{.Id}}}}' {q(shared_ref)})\" = {q(image_id)} ]"
            if image_id else "")
    return (f"docker pull -q {q(shared_ref)} >/dev/null 2>&1 && "
            f"[ \"$(docker inspect --format '{label}' {q(shared_ref)})\" = {q(inputs_hash)} ]"
            f"{same} && docker tag {q(shared_ref)} {q(tag)} && "
            f"docker rmi {q(shared_ref)} >/dev/null")


def _push(tag, shared_ref):
    """Shell that pushes the local image to image_registry; the registry's tag is only a way to
    ship it, so it is untagged once pushed."""
    return (f"docker tag {q(tag)} {q(shared_ref)} && docker push -q {q(shared_ref)} && "
            f"docker rmi {q(shared_ref)} >/dev/null")


def _remember_id(tag):
    """Record the ID of `tag` on this host as the one the run's other hosts must pull."""

    def remember(state, host):
        fact = facts.serving.DockerImageId()  # its command and parsing, run after the build
        ok, output = host.run_shell_command(fact.command(tag), _sudo=True)
        image_id = fact.process(output.stdout_lines) if ok and output.stdout_lines else None
        if image_id:
            run_state(state).image_ids[tag] = image_id
        return bool(image_id)

    return FunctionCommand(remember, (), {})


def _lacking(tag):
    """The run's other active hosts that will look for `tag` (their image operation declared the
    read) and do not have it: read from their own one-round-trip reads, no extra query."""
    fact, args = _labels(tag)
    return sorted(other.name for other in thors(host.state.inventory)
                  if other is not host and other in pyinfra_hooks.active_hosts(host.state)
                  and is_planned(other, fact, **args) and read(fact, other, **args) is None)


@reads(labels=_labels, base_labels=_base_labels,
       image_id=lambda tag, registry=None, shared=False, **_: (
           (facts.serving.DockerImageId, {"ref": tag}) if registry or shared else None))
@operation()
def derived_image(tag, base, inputs_hash, think_prefill, context, registry=None, shared_ref=None,
                  shared=False, *, labels, base_labels, image_id):
    """The derived vLLM image for these inputs: built from `context` on the box when absent, and
    with `registry` shared through it: pulled from it when an earlier run already pushed it
    there, else built and pushed for the other boxes of the run. `shared` (the image copy, no
    registry): its ID is recorded for the boxes that load it from this one (loaded_image).

    The tag is a hash of every input (Dockerfile, patches, base digest, build options), so the image
    is built again only when one changed, and a failed build leaves the running image alone.

    + tag: the derived image's local name (its tag: the hash of every input)
    + base: the pinned base image, by digest
    + inputs_hash: the hash of every input, put in the image's thorfleet.inputs label
    + think_prefill: the build option of the reasoning prefill patch
    + context: the build context's folder on the box (tree)
    + registry: image_registry, shared through (None: the box builds its own)
    + shared_ref: the image's name in `registry`
    + shared: the run's other boxes load it from this one (image_source)

    .. code:: python

        derived_image(name="Build the derived image", tag="thorfleet/mistral-small4:<hash>",
                      base="<registry>/vllm@sha256:<digest>", inputs_hash="<hash>",
                      think_prefill=True, context=f"{layout.BOX_IMAGE_CONTEXT}/<hash>")
    """
    if labels is not None:
        if (registry or shared) and image_id:  # what the other boxes check theirs against
            run_state(host.state).image_ids[tag] = image_id
        if registry and image_id:
            # built before image_registry was set, or the registry lost it: the run's boxes
            # that lack it pull it rather than build their own
            lacking = _lacking(tag)
            if lacking:
                yield ShownCommand(f"{_push(tag, shared_ref)} && echo 'thorfleet: {tag} pushed to "
                                   f"{registry} for {', '.join(lacking)}'")
                return
        host.noop(f"{tag} is already built ({labels.get('thorfleet.patches', '?')})")
        return
    build = _build(tag, base, inputs_hash, think_prefill, context, base_labels is not None)
    if not registry:
        for command in build:
            yield ShownCommand(command)  # the build's steps as they come
        if shared:
            yield _remember_id(tag)
        return
    yield ShownCommand(f"if {_pulled(tag, inputs_hash, shared_ref)}; then echo 'thorfleet: {tag} "
                       f"pulled from {registry}'; else {' && '.join(build)} && "
                       f"{_push(tag, shared_ref)}; fi")
    yield _remember_id(tag)


@reads(labels=_labels, base_labels=_base_labels)
@operation()
def shared_image(tag, base, inputs_hash, think_prefill, context, registry, shared_ref, *, labels,
                 base_labels):
    """The derived image from `registry`, where the run's first host pushed it: pulled, checked on
    arrival, tagged (see _pulled). Built here instead when the registry does not have it (the
    first host is down, or its build failed).

    + tag, base, inputs_hash, think_prefill, context: as derived_image's
    + registry: image_registry, where the first host pushed it
    + shared_ref: the image's name in `registry`

    .. code:: python

        shared_image(name="Pull the derived image", tag="thorfleet/mistral-small4:<hash>",
                     base="<registry>/vllm@sha256:<digest>", inputs_hash="<hash>",
                     think_prefill=True, context=f"{layout.BOX_IMAGE_CONTEXT}/<hash>",
                     registry="registry.lan:5000/team",
                     shared_ref="registry.lan:5000/team/mistral-small4:<hash>")
    """
    if labels is not None:
        host.noop(f"{tag} is already here ({labels.get('thorfleet.patches', '?')})")
        return
    built, image_id = _fallback(tag, base, inputs_hash, think_prefill, context, base_labels)
    arrived = f"pulled from {registry}" + (f", ID {image_id[7:19]}" if image_id else "")
    yield ShownCommand(
        f"if {_pulled(tag, inputs_hash, shared_ref, image_id)}; then echo 'thorfleet: {tag} "
        f"{arrived}'; else echo 'thorfleet: {shared_ref} is not in the registry as this run "
        f"expects: building here'; {built}; fi")


@reads(labels=_labels, base_labels=_base_labels)
@operation()
def loaded_image(tag, base, inputs_hash, think_prefill, context, source, *, labels, base_labels):
    """The derived image loaded from `source`, the run's first box, which built it or holds it:
    `docker save` there, `docker load` here, over SSH as the image user (files/thor/bin/thorfleet-image:
    its key may only save a derived image), checked on arrival (its thorfleet.inputs label, and
    the ID the first box holds). Built here instead when that fails: the first box is down, its
    build failed, the transfer was cut, or what arrived is another image.

    + tag, base, inputs_hash, think_prefill, context: as derived_image's
    + source: how this box dials the run's first box (host[:ssh port])

    .. code:: python

        loaded_image(name="Load the derived image", tag="thorfleet/mistral-small4:<hash>",
                     base="<registry>/vllm@sha256:<digest>", inputs_hash="<hash>",
                     think_prefill=True, context=f"{layout.BOX_IMAGE_CONTEXT}/<hash>",
                     source="thor-1.lan")
    """
    if labels is not None:
        host.noop(f"{tag} is already here ({labels.get('thorfleet.patches', '?')})")
        return
    built, image_id = _fallback(tag, base, inputs_hash, think_prefill, context, base_labels)
    load = sh(BOX_IMAGE_TOOL, "load", "--from", source, "--tag", tag, "--inputs", inputs_hash,
              *(("--id", image_id) if image_id else ()), "--key", BOX_IMAGE_KEY,
              "--known-hosts", BOX_PEER_KNOWN_HOSTS, "--user", IMAGE_USER)
    yield ShownCommand(f"if {load}; then :; else echo 'thorfleet: building {tag} here "
                       f"instead'; {built}; fi")
