"""thorfleet's own operations: each reads a fact and yields only what closes the gap, or noops.

A host fails one way: `_fail(message)` (a command) or `run_state(state).fail(host, message)`
(inside one), which logs the message in red under the host's name, records it for the report and
fails the host. Every value put into a command is quoted (shlex.quote).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import statistics
import time
from io import BytesIO, StringIO
from pathlib import Path, PurePosixPath

from packaging.version import Version
from pyinfra import host
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand, operation
from pyinfra.facts.server import Which

from thorfleet import facts
from thorfleet.layout import (
    BOX_BENCH,
    BOX_IMAGE_CONTEXT,
    BOX_LAST_GOOD_UNIT,
    BOX_MANIFESTS,
    BOX_PEER_KEY,
    BOX_PEER_KNOWN_HOSTS,
    BOX_REBOOT_MARKER,
    BOX_SERVE,
    BOX_UPLOAD_STAGING,
    BOX_WEIGHTS,
    PEER_USER,
    RRSYNC,
    box_unit,
)
from thorfleet.runstate import run_state
from thorfleet.snapshot import key_of, read, reads

q = shlex.quote


def _command(*args):
    """One shell command from its words, each quoted."""
    return " ".join(q(str(a)) for a in args)


class ShownCommand(StringCommand):
    """A shell command whose output the operator sees as it comes, under the host's name, without
    -v: the progress of a long transfer or build. Fails the operation as any command does."""

    def execute(self, state, host, connector_arguments):
        connector_arguments.update(self.connector_arguments)
        return host.run_shell_command(self, print_output=True, print_input=state.print_input,
                                      **connector_arguments)


def _fail(message):
    """A command that fails the host with `message`: logged, recorded for the report, failed."""

    def fail(state, host):
        return run_state(state).fail(host, message)

    return FunctionCommand(fail, (), {})


def _ready_reads(s, fleet_copy):
    wanted = [(facts.L4TRelease, {}), (facts.MemTotalGiB, {}),
              (facts.FreeDiskGiB, {"path": s.weights_dir}),
              (facts.PinnedWeightsGiB, {"folders": [s.model_dir, s.draft_dir]}),
              (facts.DockerRuntimes, {})]
    return wanted + [(Which, {"command": c}) for c in ("rsync", RRSYNC) if fleet_copy]


@reads(_ready_reads)
@operation()
def thor_ready(s, fleet_copy=False):
    """Refuse a box that cannot run the model: not a Thor, too little memory or disk, no nvidia
    runtime, no sudo. Reads facts only; fails the host with one message per problem.

    .. code:: python

        thor_ready(name="Check the box is a Thor ready for the model", s=settings)
    """
    problems = []
    release = read(facts.L4TRelease)
    if release is None:
        problems.append("/etc/nv_tegra_release is missing: not a Jetson running L4T (JetPack)")
    elif Version(release) < Version(str(s.preflight_min_l4t_release)):
        problems.append(f"L4T R{release} is older than R{s.preflight_min_l4t_release}: "
                        "flash JetPack 7 (L4T r38) or newer")
    memory = read(facts.MemTotalGiB)
    if memory < s.preflight_min_memory_gib:
        problems.append(f"{memory:.1f} GiB of memory, the model needs {s.preflight_min_memory_gib}"
                        " (preflight_min_memory_gib)")
    disk = read(facts.FreeDiskGiB, path=s.weights_dir)
    # what the pinned weights already take counts as theirs: a converged box passes its re-run
    present = read(facts.PinnedWeightsGiB, folders=[s.model_dir, s.draft_dir])
    if disk + present < s.preflight_min_free_disk_gib:
        have = f" + {present:.1f} GiB of the pinned weights already there" if present else ""
        problems.append(f"{disk:.1f} GiB free under {s.weights_dir}{have}, need "
                        f"{s.preflight_min_free_disk_gib} (preflight_min_free_disk_gib): free space "
                        "or point weights_dir at a larger disk")
    if not host.get_fact(facts.SudoWorks, _sudo=False):  # as the SSH user: never in the snapshot
        problems.append(f"`sudo -n true` fails for {host.data.get('ssh_user') or 'the SSH user'}: "
                        "give it passwordless sudo (thorfleet cannot answer password prompts)")
    runtimes = read(facts.DockerRuntimes)
    if runtimes is None:
        problems.append("docker is not installed: install JetPack's Docker with nvidia-container-toolkit")
    elif "nvidia" not in runtimes:
        problems.append(f"Docker offers runtimes {runtimes} but not `nvidia`: install "
                        "nvidia-container-toolkit and run `nvidia-ctk runtime configure`")
    if fleet_copy:
        missing = [c for c in ("rsync", RRSYNC) if not read(Which, command=c)]
        if missing:
            problems.append(f"{' and '.join(missing)} not installed: weights_source copies the "
                            "weights between boxes with them: `apt-get install rsync` on the "
                            "box, or set weights_source = 'hub'")
    if problems:
        yield _fail("preflight failed:\n  - " + "\n  - ".join(problems))
    else:
        host.noop(f"Thor ready: L4T R{release}, {memory:.0f} GiB, {disk:.0f} GiB free")


@reads(lambda **_: [(facts.PowerMode, {})])
@operation()
def power_mode(mode, allow_reboot=False, reboot_timeout=900):
    """Set the nvpmodel power mode, never hanging on its reboot prompt.

    Modes that switch live are set at once. A mode that needs a reboot prints a YES/no prompt:
    nvpmodel gets a closed stdin, so it changes nothing, and the host fails with a clear message
    unless ``allow_reboot`` is set; then nvpmodel is answered YES and the box is waited for.

    .. code:: python

        power_mode(name="Set power mode 1 (120 W)", mode=1)
    """
    current = read(facts.PowerMode)
    if current is None:
        yield _fail("nvpmodel not found: this box is not a Jetson with JetPack")
        return
    if current == mode:
        host.noop(f"power mode is already {mode}")
        return
    # stdin closed: a mode that needs a reboot prints its prompt, reads EOF and changes nothing.
    yield StringCommand(f"nvpmodel -m {q(str(int(mode)))} </dev/null || true")

    def needs_reboot(state, host):
        if host.get_fact(facts.PowerMode) == mode:
            return True
        if not allow_reboot:
            return run_state(state).fail(
                host, f"power mode {mode} needs a reboot and power_allow_reboot is False: set "
                "power_allow_reboot = True to let thorfleet reboot it, or run "
                f"`sudo nvpmodel -m {mode}` and answer YES yourself")
        return _reboot_for_mode(state, host, mode, reboot_timeout)

    yield FunctionCommand(needs_reboot, (), {})


def _reboot_for_mode(state, host, mode, timeout):
    """Answer nvpmodel's prompt with YES (the operator allowed it) and wait for the box."""
    host.run_shell_command(_command("touch", BOX_REBOOT_MARKER), _sudo=True)
    answer = f"(sleep 2; echo YES | nvpmodel -m {q(str(int(mode)))}) </dev/null >/dev/null 2>&1 &"
    host.run_shell_command(_command("sh", "-c", answer), _sudo=True)
    time.sleep(5)
    deadline = time.monotonic() + timeout
    host.disconnect()
    while time.monotonic() < deadline:
        time.sleep(5)
        host.connect(show_errors=False)
        # /run is emptied by a boot: the marker gone means the box really rebooted
        if host.connected and not host.get_fact(facts.RebootMarker):
            if host.get_fact(facts.PowerMode) == mode:
                return True
            return run_state(state).fail(host, f"rebooted but power mode is not {mode}")
        if host.connected:
            host.disconnect()
    return run_state(state).fail(
        host, f"did not come back within {timeout}s of the reboot for power mode {mode} "
        "(power_reboot_timeout_s)")


@reads(lambda **_: [(facts.ClocksLocked, {})])
@operation()
def clocks_locked():
    """Lock the clocks at the power mode's maximum with jetson_clocks, unless they already are.

    .. code:: python

        clocks_locked(name="Lock clocks")
    """
    locked = read(facts.ClocksLocked)
    if locked is None:
        yield _fail("jetson_clocks not found: this box is not a Jetson with JetPack")
        return
    if locked:
        host.noop("clocks are already locked")
        return
    yield "jetson_clocks"


def _text_of(src):
    """Bytes of an upload source: a local path or a StringIO."""
    if isinstance(src, StringIO):
        return src.getvalue().encode()
    with open(src, "rb") as f:
        return f.read()


@reads(lambda path, **_: [(facts.FileState, {"path": path})])
@operation()
def whole_file(path, src, mode="644"):
    """A root-owned file at `path` with the content of `src` (a local path or a StringIO), only
    ever replaced whole: a reader (systemd, the container, the next run) sees the old file or the
    new one, never half of it, even when the SSH connection dies mid-upload.

    The upload goes as the SSH user (never through sudo's world-readable temporary file) into a
    0700 folder of its own, so a secret is never readable by others nor in a command line; then
    sudo installs it beside the destination under a temporary name and renames it into place.

    .. code:: python

        whole_file(name="Install the API key", path=layout.BOX_SECRETS_ENV,
                   src=StringIO("VLLM_API_KEY=...\\n"), mode="600")
    """
    content = _text_of(src)
    wanted = hashlib.sha256(content).hexdigest()
    current = read(facts.FileState, path=path)
    if current == {"sha256": wanted, "mode": mode, "user": "root", "group": "root"}:
        host.noop(f"{path} is already in place")
        return
    if current and current["sha256"] == wanted:
        yield f"{_command('chown', 'root:root', path)} && {_command('chmod', mode, path)}"
        return
    yield from _replace(path, content, wanted, mode)


def _replace(path, content, digest, mode):
    """The commands that put `content` (whose sha256 is `digest`) at `path` whole (whole_file)."""
    staged = f"{BOX_UPLOAD_STAGING}/{digest[:16]}"
    tmp = f"{path}.thorfleet-tmp"
    yield StringCommand(_command("install", "-d", "-m", "700", BOX_UPLOAD_STAGING), _sudo=False)
    yield FileUploadCommand(BytesIO(content), staged, _sudo=False)
    install = _command("sudo", "install", "-m", mode, "-o", "root", "-g", "root", staged, tmp)
    rename = _command("sudo", "mv", "-f", tmp, path)
    yield StringCommand(f"{install} && {rename}; status=$?; {_command('rm', '-f', staged)}; "
                        "exit $status", _sudo=False)


def secret_file(path, content, **kwargs):
    """A root-only (0600) file with secret `content`: whole_file with mode 600."""
    return whole_file(path=path, src=StringIO(content), mode="600", **kwargs)


@reads(lambda path, **_: [(facts.PathState, {"path": path})])
@operation()
def directory(path, mode="755", user="root", group="root"):
    """A directory at `path` (and its parents) with `mode` and owner; refuses to replace a file.

    .. code:: python

        directory(name="Create the weights folder", path=s.weights_dir)
    """
    current = read(facts.PathState, path=path)
    wanted = {"type": "directory", "mode": mode, "user": user, "group": group}
    if current == wanted:
        host.noop(f"{path} is already a directory ({mode} {user}:{group})")
        return
    if current and current["type"] != "directory":
        yield _fail(f"{path} is a {current['type']}, not a directory: move it away")
        return
    if current is None:
        yield _command("mkdir", "-p", path)
    yield f"{_command('chown', f'{user}:{group}', path)} && {_command('chmod', mode, path)}"


@reads(lambda path, **_: [(facts.PathState, {"path": path})])
@operation()
def absent(path):
    """Nothing at `path` (a file, or a directory and all it holds).

    .. code:: python

        absent(name="No Hugging Face token configured", path=layout.BOX_HF_TOKEN)
    """
    if read(facts.PathState, path=path) is None:
        host.noop(f"{path} is already absent")
        return
    yield _command("rm", "-rf", "--", path)


@reads(lambda unit, **_: [(facts.UnitEnabled, {"unit": unit})])
@operation()
def unit_enabled(unit):
    """A systemd unit enabled at boot (started or not: that is another operation's business).

    .. code:: python

        unit_enabled(name="Enable the clocks unit", unit="thorfleet-clocks.service")
    """
    if read(facts.UnitEnabled, unit=unit) == "enabled":
        host.noop(f"{unit} is already enabled")
        return
    yield _command("systemctl", "enable", unit)


@reads(lambda user, **_: [(facts.PasswdEntry, {"user": user})])
@operation()
def system_user(user, home, shell="/bin/sh"):
    """A system user with `home` (not created here) and `shell`.

    .. code:: python

        system_user(name="Create the copy user", user=layout.PEER_USER,
                    home=layout.BOX_PEER_HOME)
    """
    current = read(facts.PasswdEntry, user=user)
    if current is None:
        yield _command("useradd", "--system", "--home-dir", home, "--no-create-home",
                       "--shell", shell, user)
    elif (current["home"], current["shell"]) != (home, shell):
        yield _command("usermod", "--home", home, "--shell", shell, user)
    else:
        host.noop(f"{user} already exists")


def _tree(src):
    """{relative path: (content, {"sha256", "mode"})} of every file under the local folder `src`:
    each file's content and what facts.TreeState reads of it on the box."""
    tree = {}
    for path in sorted(Path(src).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            content = path.read_bytes()
            tree[str(path.relative_to(src))] = (content, {
                "sha256": hashlib.sha256(content).hexdigest(),
                "mode": "755" if path.stat().st_mode & 0o111 else "644"})
    return tree


@reads(lambda dest, **_: [(facts.TreeState, {"path": dest})])
@operation()
def tree(src, dest):
    """The folder `dest` holds exactly the files of the local folder `src` (their content and
    whether they are executable), each file replaced whole; files `src` does not have are removed.

    .. code:: python

        tree(name="Upload the build context", src="files/image", dest=f"{context}")
    """
    wanted = _tree(src)
    current = read(facts.TreeState, path=dest)
    if current == {name: state for name, (_, state) in wanted.items()}:
        host.noop(f"{dest} already holds {src}")
        return
    folders = sorted({str(PurePosixPath(dest, name).parent) for name in wanted})
    yield _command("mkdir", "-p", *folders)
    for name, (content, state) in wanted.items():
        if current.get(name) != state:
            yield from _replace(f"{dest}/{name}", content, state["sha256"], state["mode"])
    extra = sorted(set(current) - set(wanted))
    if extra:
        yield _command("rm", "-f", "--", *(f"{dest}/{name}" for name in extra))


@reads(lambda folder, revision, **_: [
    (facts.WeightsState, {"folder": folder, "revision": revision})])
@operation()
def checkpoint(folder, repo, revision, image, endpoint=None, token_file=None, peers=(),
               root=None, progress_every=10):
    """A complete, verified checkpoint of `repo` at `revision` in `folder`.

    Checked offline (the box's python3) against huggingface_hub's download metadata; only missing
    or damaged files are fetched, in a staging folder beside `folder`, moved into place once
    verified. The fetch runs huggingface_hub inside `image` (the vLLM image ships it): nothing is
    installed on the box from apt or PyPI. With `peers` (addresses of other boxes, best first) the
    box first copies what they have under `root` (their weights_dir) with rsync, each file checked
    against the hub's file list for `revision`; the hub gives only what no peer did. The transfer
    shows a progress line every `progress_every` seconds.

    .. code:: python

        checkpoint(name="Fetch the draft", folder=f"{s.weights_dir}/eagle/<rev>",
                   repo="mistralai/Mistral-Small-4-119B-2603-eagle", revision="<rev>",
                   image=s.image_tag, peers=["thor-1.lan"], root=s.weights_dir)
    """
    state = read(facts.WeightsState, folder=folder, revision=revision)
    if state["complete"]:
        host.noop(f"{repo}@{revision[:12]} is complete in {folder}")
        return
    parent = folder.rsplit("/", 1)[0]  # thorfleet-weights stages beside the folder
    # One fetch per revision at a time: a run whose SSH session died may have left one going.
    name = f"thorfleet-fetch-{revision[:12]}"
    run = ["docker", "run", "--rm", "--name", name, "--network", "host",
           "-e", "HF_HUB_DISABLE_XET=1",  # the seed's setting: plain HTTPS downloads
           "-e", "HF_HUB_DISABLE_PROGRESS_BARS=1",  # carriage returns: thorfleet-weights' lines instead
           "-v", f"{parent}:{parent}", "-v", f"{BOX_WEIGHTS}:{BOX_WEIGHTS}:ro"]
    hub = []
    if endpoint:
        hub += ["--endpoint", endpoint]
    if token_file:  # a file, read inside: never on a command line or in the container's env
        run += ["-v", f"{token_file}:{token_file}:ro"]
        hub += ["--token-file", token_file]
    fetch = _command(*run, "--entrypoint", "python3", image, BOX_WEIGHTS, "fetch", "--dir",
                     folder, "--repo", repo, "--revision", revision, *hub,
                     "--progress-every", progress_every)
    if not peers:
        yield ShownCommand(f"docker rm -f {q(name)} >/dev/null 2>&1; {fetch}")
        return
    expected = f"{BOX_MANIFESTS}/{revision}.json"
    manifest = _command(*run, "-v", f"{BOX_MANIFESTS}:{BOX_MANIFESTS}", "--entrypoint", "python3",
                        image, BOX_WEIGHTS, "manifest", "--repo", repo, "--revision", revision,
                        "--out", expected, *hub)
    copy = _command("python3", BOX_WEIGHTS, "copy", "--dir", folder, "--revision", revision,
                    "--expected", expected, "--root", root, "--key", BOX_PEER_KEY,
                    "--known-hosts", BOX_PEER_KNOWN_HOSTS, "--user", PEER_USER,
                    "--progress-every", progress_every,
                    *[arg for peer in peers for arg in ("--peer", peer)])
    # The hub fetch runs only when the copy left files missing (or no file list was had).
    yield ShownCommand(f"docker rm -f {q(name)} >/dev/null 2>&1; "
                       f"{{ {manifest} && {copy}; }} || {fetch}")


def _build(s, context):
    """The shell commands that build the derived image from `context` (the base pulled first)."""
    commands = []
    if read(facts.DockerImageLabels, ref=s.image_base) is None:
        commands.append(_command("docker", "pull", s.image_base))
    commands.append(_command("sh", f"{context}/build-image.sh", "--base", s.image_base, "--tag",
                             s.image_tag, "--think-prefill", int(bool(s.image_think_prefill)),
                             "--label", f"thorfleet.inputs={s.image_inputs_hash}"))
    return commands


def _pulled(s, image_id=None):
    """Shell that pulls the image from image_registry, checks on arrival that its thorfleet.inputs
    label is this run's hash of every input and, when the run's first host built or holds it,
    that its ID is that image's (the registry's digests check the bytes), and tags it under the
    local name; false when the registry does not have it as this run expects."""
    remote = s.image_shared_ref
    label = "{{index .Config.Labels \"thorfleet.inputs\"}}"
    same = (f" && [ \"$(docker inspect --format '{{{{.Id}}}}' {q(remote)})\" = {q(image_id)} ]"
            if image_id else "")
    return (f"docker pull -q {q(remote)} >/dev/null 2>&1 && "
            f"[ \"$(docker inspect --format '{label}' {q(remote)})\" = {q(s.image_inputs_hash)} ]"
            f"{same} && docker tag {q(remote)} {q(s.image_tag)} && "
            f"docker rmi {q(remote)} >/dev/null")


def _image_reads(s, push=False, **_):
    # the base is read only to build, which is slow anyway: not worth a query in every run
    return [(facts.DockerImageLabels, {"ref": s.image_tag}),
            *([(facts.DockerImageId, {"ref": s.image_tag})] if push else [])]


def _remember_id(tag):
    """Record the ID of `tag` on this host as the one the run's other hosts must pull."""

    def remember(state, host):
        fact = facts.DockerImageId()  # its command and parsing, run after the build
        ok, output = host.run_shell_command(fact.command(tag), _sudo=True)
        held = fact.process(output.stdout_lines) if ok else None
        if held:
            run_state(state).image_ids[tag] = held
        return bool(held)

    return FunctionCommand(remember, (), {})


@reads(_image_reads)
@operation()
def derived_image(s, context, push=False):
    """The derived vLLM image for these inputs: built from `context` on the box when absent, and
    with `push` shared through `image_registry`: pulled from it when an earlier run already
    pushed it there, else built and pushed for the other boxes of the run.

    The tag is a hash of every input (Dockerfile, patches, base digest, build options), so the image
    is built again only when one changed, and a failed build leaves the running image alone.

    .. code:: python

        derived_image(name="Build the derived image", s=settings,
                      context=f"{layout.BOX_IMAGE_CONTEXT}/<hash>")
    """
    labels = read(facts.DockerImageLabels, ref=s.image_tag)
    if labels is not None:
        if push and (held := read(facts.DockerImageId, ref=s.image_tag)):
            run_state(host.state).image_ids[s.image_tag] = held
            # built before image_registry was set, or the registry lost it: the run's boxes
            # that lack it pull it rather than build their own
            lacking = _lacking(s.image_tag)
            if lacking:
                yield ShownCommand(f"{_push(s)} && echo 'thorfleet: {s.image_tag} pushed to "
                                   f"{s.image_registry} for {', '.join(lacking)}'")
                return
        host.noop(f"{s.image_tag} is already built ({labels.get('thorfleet.patches', '?')})")
        return
    if not push:
        for command in _build(s, context):
            yield ShownCommand(command)  # the build's steps as they come
        return
    built = " && ".join(_build(s, context))
    yield ShownCommand(f"if {_pulled(s)}; then echo 'thorfleet: {s.image_tag} pulled from "
                       f"{s.image_registry}'; else {built} && {_push(s)}; fi")
    yield _remember_id(s.image_tag)


def _push(s):
    """Shell that pushes the local image to image_registry; the registry's tag is only a way to
    ship it, so it is untagged once pushed."""
    remote = s.image_shared_ref
    return (f"docker tag {q(s.image_tag)} {q(remote)} && docker push -q {q(remote)} && "
            f"docker rmi {q(remote)} >/dev/null")


def _lacking(tag):
    """The run's other active hosts that will look for `tag` (their image operation declared the
    read) and do not have it: read from their own one-round-trip reads, no extra query."""
    key = key_of(facts.DockerImageLabels, {"ref": tag})
    run = run_state(host.state)
    return sorted(other.name for other in host.state.inventory
                  if other is not host and other in host.state.active_hosts
                  and key in run.planned_reads.get(other.name, {})
                  and read(facts.DockerImageLabels, target=other, ref=tag) is None)


@reads(_image_reads)
@operation()
def shared_image(s, context):
    """The derived image from `image_registry`, where the run's first host pushed it: pulled,
    checked on arrival, tagged (see _pulled). Built here instead when the registry does not have
    it (the first host is down, or its build failed).

    .. code:: python

        shared_image(name="Pull the derived image", s=settings, context=f"{...}/<hash>")
    """
    labels = read(facts.DockerImageLabels, ref=s.image_tag)
    if labels is not None:
        host.noop(f"{s.image_tag} is already here ({labels.get('thorfleet.patches', '?')})")
        return
    built = " && ".join(_build(s, context))
    image_id = run_state(host.state).image_ids.get(s.image_tag)
    arrived = f"pulled from {s.image_registry}" + (f", ID {image_id[7:19]}" if image_id else "")
    yield ShownCommand(
        f"if {_pulled(s, image_id)}; then echo 'thorfleet: {s.image_tag} {arrived}'; "
        f"else echo 'thorfleet: {s.image_shared_ref} is not in the registry as this run expects: "
        f"building here'; {built}; fi")


@reads(lambda s, **_: [
    (facts.ServerState, {"service": s.service_name, "port": s.service_port})])
@operation()
def serving(s, wait_for=(), first_install=False):
    """The service runs the version rendered from group data and passes its checks.

    A different fingerprint (unit, config, secrets, image) or a stopped service is restarted and
    proven, and rolled back to the last good version if the proof fails. A running but unhealthy
    one (still loading after a reboot) is waited for. A healthy one is left alone. When a host of an
    earlier batch (`wait_for`) or a first install failed its start in this run, this one is not
    restarted. With `first_install`, only a host that never proved a version is started: no
    serving capacity is at stake there, so such hosts start together, before the batches.

    .. code:: python

        serving(name="Start the first installs", s=settings, first_install=True)
        serving(name="Serve and prove it", s=settings)
    """
    state = read(facts.ServerState, service=s.service_name, port=s.service_port)
    run = run_state(host.state)
    # before this run restarts anything: a host with no proven version is a first install
    run.proven_before.setdefault(host.name, state.get("proven_fingerprint"))

    def serve(command, *extra):
        return _command("python3", BOX_SERVE, command, "--service", s.service_name,
                        "--port", s.service_port, "--timeout", s.service_health_timeout_s, *extra)

    if first_install:
        # a host that proved a version before (serving, loading after a reboot, or stopped) is
        # restarted or proven in its batch: only a bare one starts here
        if state.get("proven_fingerprint"):
            host.noop("it has proven a version before: its batch restarts or proves it")
            return
        run.first_starts.add(host.name)
        yield _checked(serve("activate", "--fingerprint", s.fingerprint))
        return

    if state.get("proven_fingerprint") == s.fingerprint and state.get("active") == "active":
        if state.get("healthy"):
            host.noop(f"{s.service_name} is serving fingerprint {s.fingerprint[:12]}")
        else:
            yield _checked(serve("prove"))
        return
    stopped_by = sorted(run.failed_restarts.intersection({*wait_for, *run.first_starts}))
    if stopped_by:
        # The new unit and config are already on disk: put the serving version's back, so a crash
        # or reboot before the next run does not start what was never proven. The host is held,
        # not failed: recorded for the report, the run goes on.
        yield _held(f"not restarted: the rollout stopped after {', '.join(stopped_by)} failed")
        yield serve("hold")
        return
    yield _checked(serve("activate", "--fingerprint", s.fingerprint))


def _held(message):
    """A command that records why the host was left as it was, for the report (never fails)."""

    def note(state, host):
        run_state(state).note_error(host.name, message)
        return True

    return FunctionCommand(note, (), {})


def _checked(command):
    """Run a thorfleet-serve command; on failure fail the host with its reason and stop the
    rollout's later batches."""

    def run(state, host):
        ok, output = host.run_shell_command(command, _sudo=True)
        if not ok:
            run_state(state).failed_restarts.add(host.name)
            said = output.stdout_lines or output.stderr_lines  # its reason, or a traceback
            return run_state(state).fail(host, " ".join(said[-3:]),
                                         details=output.stdout_lines + output.stderr_lines)
        return ok

    return FunctionCommand(run, (), {})


def wants_benchmark(when, proven_before):
    """Whether a host is benchmarked: `when` is rollout_benchmark ("always", "never" or
    "first-install"), `proven_before` the fingerprint it had proven before the run (None on a
    first install)."""
    return when == "always" or (when == "first-install" and not proven_before)


@operation()
def benchmark(port, when="always"):
    """Measure the host's decode rate the seed's way (thorfleet-bench: /v1/completions, 512 tokens,
    a warm-up then 3 runs) and record tok/s, time to first token and EAGLE's acceptance for the
    fleet gate and the report, when `when` (rollout_benchmark) asks for it; "first-install" reads
    what `serving`, run before it, found. A benchmark that cannot run fails the host.

    .. code:: python

        benchmark(name="Benchmark the decode rate", port=8002, when="first-install")
    """
    if not wants_benchmark(when, run_state(host.state).proven_before.get(host.name)):
        host.noop(f"not benchmarked: it served a proven version before this run ({when})")
        return

    def measure(state, host):
        ok, output = host.run_shell_command(_command("python3", BOX_BENCH, "--port", port),
                                            _sudo=True)
        said = output.stdout_lines + output.stderr_lines
        try:
            result = json.loads(output.stdout_lines[-1])
        except (IndexError, ValueError):
            result = {"error": " / ".join(line.strip() for line in said[-3:]) or "no output"}
        result["as_of"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        run_state(state).benchmarks[host.name] = result
        if not ok or result.get("error"):
            return run_state(state).fail(host, f"benchmark failed: {result.get('error')}",
                                         details=said[-6:])
        acceptance = result.get("eagle_acceptance")
        host.log_styled(f"thorfleet: {result['tok_s']:.1f} tok/s, first token after "
                        f"{result['ttft_s']:.2f}s, EAGLE acceptance "
                        f"{'-' if acceptance is None else f'{acceptance:.2f}'}")
        return True

    yield FunctionCommand(measure, (), {})


def bench_verdict(rate, rates, min_fraction, floor):
    """(fleet median, [why `rate` fails the gate]) for one host's tok/s among the fleet's `rates`:
    below `floor` tok/s, or below `min_fraction` of the median."""
    median = statistics.median(rates)
    problems = []
    if rate < floor:
        problems.append(f"{rate:.1f} tok/s is below the floor of {floor} tok/s "
                        "(rollout_bench_min_toks)")
    if rate < min_fraction * median:
        problems.append(f"{rate:.1f} tok/s is {rate / median:.2f}x the fleet median "
                        f"{median:.1f} tok/s, below {min_fraction} (rollout_bench_min_fraction)")
    return median, problems


@operation()
def benchmark_gate(min_fraction, floor):
    """Fail a benchmarked host that is slower than the fleet: below `floor` tok/s or below
    `min_fraction` of the median of every host benchmarked in this run. Runs after every host's
    benchmark operation (pyinfra runs an operation on all hosts before the next one).

    .. code:: python

        benchmark_gate(name="Fleet benchmark gate", min_fraction=0.8, floor=27)
    """

    if host.name not in run_state(host.state).benchmarks:
        host.noop("not benchmarked in this run: nothing to judge")
        return

    def gate(state, host):
        results = run_state(state).benchmarks
        mine = results.get(host.name) or {}
        rates = [r["tok_s"] for r in results.values() if r.get("tok_s") is not None]
        if mine.get("tok_s") is None or not rates:
            return True
        median, problems = bench_verdict(mine["tok_s"], rates, min_fraction, floor)
        mine.update(fleet_median_tok_s=round(median, 2),
                    vs_median=round(mine["tok_s"] / median, 3) if median else None,
                    gate_problems=problems, passed=not problems)
        if problems:
            return run_state(state).fail(
                host, "too slow: " + "; ".join(problems) + " (EAGLE not engaged? the seed: "
                "~33.7 tok/s with EAGLE, ~17.5 without)")
        return True

    yield FunctionCommand(gate, (), {})


def _leftover_query(s):
    return {"models": s.weights_dir, "contexts": BOX_IMAGE_CONTEXT, "image_name": s.image_name,
            "keep_context": s.image_inputs_hash[:12], "keep_dirs": [s.model_dir, s.draft_dir],
            "keep_images": [s.image_tag],
            "units": [box_unit(s.service_name), BOX_LAST_GOOD_UNIT]}


@reads(lambda s, **_: [(facts.Leftovers, _leftover_query(s))])
@operation()
def leftovers_removed(s):
    """Old checkpoint revisions, derived images and build contexts removed: everything but the
    pinned weights, the current image and context, and what the live and last good units use.

    .. code:: python

        leftovers_removed(name="Remove what nothing serves any more", s=settings)
    """
    found = read(facts.Leftovers, **_leftover_query(s))
    paths = [*found["dirs"], *found["contexts"]]
    if not paths and not found["images"]:
        host.noop("nothing old to remove: only the served and last good versions are on disk")
        return
    if paths:
        yield _command("rm", "-rf", "--", *paths)
    if found["images"]:
        yield _command("docker", "rmi", *found["images"])
