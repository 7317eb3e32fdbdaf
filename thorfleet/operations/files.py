"""Files, folders, units and users on the box, the way thorfleet needs them: a file is only ever
replaced whole, and nothing is touched that is already right."""

from __future__ import annotations

import functools
import hashlib
from io import BytesIO, StringIO
from pathlib import Path, PurePosixPath
from secrets import token_hex

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation

from thorfleet import facts
from thorfleet.operations.commands import fail_host, sh
from thorfleet.run.snapshot import reads
from thorfleet.settings.layout import BOX_UPLOAD_STAGING


def _text_of(src):
    """Bytes of an upload source: a local path or a StringIO."""
    if isinstance(src, StringIO):
        return src.getvalue().encode()
    with open(src, "rb") as f:
        return f.read()


@reads(current=lambda path, **_: (facts.system.FileState, {"path": path}))
@operation()
def whole_file(path, src, mode="644", check=(), *, current):
    """A root-owned file at `path` with the content of `src`, only ever replaced whole: a reader
    (systemd, the container, the next run) sees the old file or the new one, never half of it,
    even when the SSH connection dies mid-upload.

    + path: where the file goes on the box
    + src: its content: a local path or a StringIO
    + mode: its permissions, as chmod takes them
    + check: a command (its words) that must accept the new file, given as its last argument,
      before it replaces the old one (`haproxy -c -f`): a file it refuses never goes live

    The upload goes as the SSH user (never through sudo's world-readable temporary file) into a
    0700 folder of its own, so a secret is never readable by others nor in a command line; then
    sudo installs it beside the destination under a temporary name and renames it into place.

    .. code:: python

        whole_file(name="Install the API key", path=layout.BOX_SECRETS_ENV,
                   src=StringIO("VLLM_API_KEY=...\\n"), mode="600")
    """
    yield from _put(path, _text_of(src), mode, check, current)


@reads(current=lambda path, **_: (facts.system.FileState, {"path": path}))
@operation()
def template(path, src, settings, mode="644", *, current):
    """A root-owned file at `path` rendered from the template `src` (its name under files/, as
    the settings' emitters render it: a unit's words as systemd reads them, YAML by PyYAML's
    emitter) with `settings`, one host's; replaced whole, as whole_file does.

    + path: where the file goes on the box
    + src: the template, by its name under files/ (``thor/systemd/thorfleet-watchdog.service.j2``)
    + settings: the host's settings the template reads (``s``)
    + mode: its permissions, as chmod takes them

    .. code:: python

        template(name="Write the watchdog's unit", path="/etc/systemd/system/x.service",
                 src="thor/systemd/thorfleet-watchdog.service.j2", settings=settings)
    """
    yield from _put(path, settings.render(src).encode(), mode, (), current)


def _put(path, content, mode, check, current):
    """The commands that make `path` hold `content` with `mode` (whole_file, template): none when
    it does already."""
    wanted = hashlib.sha256(content).hexdigest()
    if current == {"type": "regular file", "sha256": wanted, "mode": mode, "user": "root",
                   "group": "root"}:
        host.noop(f"{path} is already in place")
        return
    if current and current["type"] == "directory":
        yield fail_host(f"{path} is a directory, not the file thorfleet installs there: move it "
                        "away, then run again")
        return
    if current and current["type"] == "regular file" and current["sha256"] == wanted:
        yield f"{sh('chown', 'root:root', path)} && {sh('chmod', mode, path)}"
        return
    # anything else (no file, other content, a link even to the same content) is replaced whole
    yield from _replace(path, content, mode, check)


def _replace(path, content, mode, check=()):
    """The commands that put `content` at `path` whole (whole_file).

    The staged copy's name is random, never of the content: it shows in the box's process list
    (`sudo install STAGED ...`), and a digest of a secret there (secrets.env, the door's key map)
    could be checked against guesses. Whether to upload at all is the caller's, from the sha256
    the box reports of the live file against the content's (facts.system.FileState, facts.system.TreeState)."""
    staged = f"{BOX_UPLOAD_STAGING}/{token_hex(16)}"
    tmp = f"{path}.thorfleet-tmp"
    yield StringCommand(sh("install", "-d", "-m", "700", BOX_UPLOAD_STAGING), _sudo=False)
    yield FileUploadCommand(BytesIO(content), staged, _sudo=False)
    install = sh("sudo", "install", "-m", mode, "-o", "root", "-g", "root", staged, tmp)
    rename = sh("sudo", "mv", "-fT", tmp, path)  # -T: a link at `path` is replaced, not followed
    if check:
        refused = sh("sudo", "rm", "-f", tmp)
        rename = f"{{ {sh('sudo', *check, tmp)} || {{ {refused}; false; }}; }} && {rename}"
    yield StringCommand(f"{install} && {rename}; status=$?; {sh('rm', '-f', staged)}; "
                        "exit $status", _sudo=False)


# A root-only (0600) file of secret content (src: a StringIO): whole_file with mode 600.
secret_file = functools.partial(whole_file, mode="600")


@reads(current=lambda path, **_: (facts.system.PathState, {"path": path}))
@operation()
def directory(path, mode="755", user="root", group="root", *, current):
    """A directory at `path` (and its parents) with `mode` and owner; refuses to replace a file.

    + path: the directory
    + mode, user, group: its permissions and owner (only the directory's own, not its files')

    .. code:: python

        directory(name="Create the weights folder", path=layout.BOX_MODELS)
    """
    wanted = {"type": "directory", "mode": mode, "user": user, "group": group}
    if current == wanted:
        host.noop(f"{path} is already a directory ({mode} {user}:{group})")
        return
    if current and current["type"] != "directory":
        yield fail_host(f"{path} is a {current['type']}, not a directory: move it away")
        return
    if current is None:
        yield sh("mkdir", "-p", path)
    yield f"{sh('chown', f'{user}:{group}', path)} && {sh('chmod', mode, path)}"


@reads(current=lambda path, **_: (facts.system.PathState, {"path": path}))
@operation()
def absent(path, *, current):
    """Nothing at `path` (a file, or a directory and all it holds).

    + path: what must not be there

    .. code:: python

        absent(name="No Hugging Face token configured", path=layout.BOX_HF_TOKEN)
    """
    if current is None:
        host.noop(f"{path} is already absent")
        return
    yield sh("rm", "-rf", "--", path)


# Each state `systemctl is-enabled` can print (systemctl(1)) and the least that makes it
# "enabled": a mask (also one for this boot only, --runtime) goes first, else enable would fail;
# a link, an alias, an enabling for this boot only or none at all are enabled for good.
UNIT_STATES = {
    "disabled": [("enable",)],
    "enabled-runtime": [("enable",)],
    "linked": [("enable",)],
    "linked-runtime": [("enable",)],
    "alias": [("enable",)],
    "indirect": [("enable",)],
    "masked": [("unmask",), ("enable",)],
    "masked-runtime": [("unmask", "--runtime"), ("enable",)],
}
# The states a run cannot put right by itself, and what the operator does.
UNCHANGEABLE = {
    "static": "its unit file has no [Install] section: run the deploy again to restore thorfleet's",
    "generated": "a systemd generator made it (/run/systemd/generator*): remove what made it",
    "transient": "systemd-run made it: `systemctl stop` it, then run the deploy again",
    "bad": "its unit file does not parse: run the deploy again to restore thorfleet's",
    None: "`systemctl daemon-reload`, then run the deploy again",
}


@reads(enabled=lambda unit, **_: (facts.system.UnitEnabled, {"unit": unit}))
@operation()
def unit_enabled(unit, *, enabled):
    """A systemd unit enabled at boot (started or not: that is another operation's business).

    + unit: the unit's name, as systemctl takes it

    .. code:: python

        unit_enabled(name="Enable the clocks unit", unit="thorfleet-clocks.service")
    """
    if enabled == "enabled":
        host.noop(f"{unit} is already enabled")
        return
    fix = UNIT_STATES.get(enabled)
    if fix is None:
        yield fail_host(f"{unit} is {enabled or 'unknown to systemd'}: "
                        f"{UNCHANGEABLE.get(enabled, UNCHANGEABLE[None])}")
        return
    yield " && ".join(sh("systemctl", *words, unit) for words in fix)


@reads(current=lambda user, **_: (facts.system.PasswdEntry, {"user": user}))
@operation()
def system_user(user, home, shell="/bin/sh", *, current):
    """A system user with `home` (not created here) and `shell`.

    + user: the user's name
    + home: its home directory (another operation creates it)
    + shell: its login shell

    .. code:: python

        system_user(name="Create the copy user", user=layout.PEER_USER,
                    home=layout.BOX_PEER_HOME)
    """
    if current is None:
        yield sh("useradd", "--system", "--home-dir", home, "--no-create-home", "--shell", shell,
                 user)
    elif (current["home"], current["shell"]) != (home, shell):
        yield sh("usermod", "--home", home, "--shell", shell, user)
    else:
        host.noop(f"{user} already exists")


def _tree(src):
    """{relative path: (content, {"sha256", "mode"})} of every file under the local folder `src`:
    each file's content and what facts.system.TreeState reads of it on the box."""
    tree = {}
    for path in sorted(Path(src).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            content = path.read_bytes()
            tree[str(path.relative_to(src))] = (content, {
                "sha256": hashlib.sha256(content).hexdigest(),
                "mode": "755" if path.stat().st_mode & 0o111 else "644", "owner": "root:root"})
    return tree


@reads(current=lambda dest, **_: (facts.system.TreeState, {"path": dest}))
@operation()
def tree(src, dest, *, current):
    """The folder `dest` holds exactly the files of the local folder `src` (their content and
    whether they are executable), each file replaced whole; files `src` does not have are removed.

    + src: the local folder
    + dest: the folder on the box

    .. code:: python

        tree(name="Upload the build context", src="files/image", dest=f"{context}")
    """
    wanted = _tree(src)
    if current == {name: on_box for name, (_, on_box) in wanted.items()}:
        host.noop(f"{dest} already holds {src}")
        return
    folders = sorted({str(PurePosixPath(dest, name).parent) for name in wanted})
    yield sh("mkdir", "-p", *folders)
    for name, (content, on_box) in wanted.items():
        found, path = current.get(name), f"{dest}/{name}"
        if found == on_box:
            continue
        if found and found.get("sha256") == on_box["sha256"]:  # the content is right: its mode
            yield f"{sh('chown', on_box['owner'], path)} && {sh('chmod', on_box['mode'], path)}"
        else:
            yield from _replace(path, content, on_box["mode"])
    extra = sorted(set(current) - set(wanted))
    if extra:
        yield sh("rm", "-f", "--", *(f"{dest}/{name}" for name in extra))


def key_only_user(user, home, key, command, why):
    """A system user whose one way in is `key` running `command` (authorized_keys' command=,
    restrict: no shell, no forwarding, no pty): three operations, named for `why`."""
    system_user(name=f"Create {user}, who may only {why}", user=user, home=home, shell="/bin/sh")
    directory(name=f"Create {home}/.ssh", path=f"{home}/.ssh", mode="755")
    whole_file(name=f"Authorize the fleet's key for {user}: {why}",
               path=f"{home}/.ssh/authorized_keys",
               src=StringIO(f'command="{command}",restrict {key}\n'))
