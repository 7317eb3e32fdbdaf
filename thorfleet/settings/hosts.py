"""One host's group data, checked, as the Settings the deploy renders from, and the laptop
secrets it names.

    settings_for(data)  # Settings, or SettingsError naming every problem

The declaration and the per-host checks are in schema.py, rendering and the fingerprint in
render.py, the box's paths in layout.py. What crosses hosts (the gateway, the monitors, the
canary and the batches) is the run's plan: thorfleet/plan.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from thorfleet.settings.render import Settings
from thorfleet.settings.schema import SettingsError, check

__all__ = ["Settings", "SettingsError", "no_hosts", "private_file_problems",
           "refuse_outside_the_repository", "settings_for"]


def refuse_outside_the_repository(cwd=None) -> None:
    """Exit 2 with one line when pyinfra runs from another folder than this checkout: it reads
    config.py and group_data/ from its working directory only, so thorfleet's check of every
    host's data before connecting and its strict host-key default would be off."""
    from thorfleet.settings.layout import ROOT

    here = Path(cwd or os.getcwd()).resolve()
    if here != ROOT:
        print(f"thorfleet: run pyinfra from the repository root, not {here}: cd {ROOT} && "
              "pyinfra INVENTORY deploy.py (pyinfra reads config.py and group_data/ from the "
              "working directory; without them the settings check and strict host keys are "
              "off). No operation ran.", file=sys.stderr)
        sys.exit(2)


def no_hosts(source) -> str:
    """What `check` and a deploy say of an inventory with no host in it (the example as shipped)."""
    return (f"{source}: no hosts: list your boxes in a group "
            "(uncomment the examples in inventory/example.py)")


def _read_secret(path, env_name):
    if path:
        return Path(path).expanduser().read_text().strip() or None
    return os.environ.get(env_name) or None


def _read_secret_of(data, key, env_name):
    """(the secret or None, None), or (None, the problem) when `key`'s file cannot be read."""
    try:
        return _read_secret(data.get(key), env_name), None
    except (OSError, TypeError) as error:
        path = Path(str(data.get(key))).expanduser()
        fix = (f"make it: mkdir -p -m 700 {path.parent}; (umask 077; openssl rand -hex 24 > "
               f"{path})" if key == "service_api_key_file" else "put the token alone in it")
        why = getattr(error, "strerror", None) or str(error)
        return None, (f"{key}={data.get(key)!r} cannot be read ({why}): {fix}, or point {key} at "
                      "the file that holds it")


def private_file_problems(key, path) -> list[str]:
    """A laptop secret (the API key, the hub token, the gateway's TLS key, a client's key, the
    boxes' copy keys) that another user could read, or replace: the file readable by others, or
    a folder it is in another user can write (private_folder_problems). Refused, with the fix;
    a missing file is reported where it is read (or made), but its folders are still checked."""
    if not path:
        return []
    file = Path(path).expanduser()
    problems = []
    try:
        mode = file.stat().st_mode
    except OSError:
        mode = None
    if mode is not None and mode & 0o077:
        problems.append(f"{key}={str(path)!r} can be read by other users (mode {mode & 0o777:o}): "
                        f"chmod 600 {file}")
    folders = [file.parent] + ([file.resolve().parent] if file.is_symlink() else [])
    for folder in folders:
        problems += [p for p in private_folder_problems(key, path, folder) if p not in problems]
    return problems


def private_folder_problems(key, path, folder) -> list[str]:
    """`folder`, which holds (or will hold) the laptop secret `key`=`path`, and every folder above
    it up to the user's home (else up to /), as OpenSSH's StrictModes holds ~/.ssh: each must be
    this user's or root's and writable by neither group nor others, or another user could put
    their own secret in its place (a CA key before the first run, a client key thorfleet makes
    when missing) or swap the folder holding it. A sticky folder (/tmp, 1777) only keeps others
    from renaming what is in it already: it is safe above a folder of ours that is there, never
    as the folder that holds the secret, nor above one not made yet (anyone may make it first).
    """
    current = Path(os.path.realpath(Path(folder).expanduser()))
    home = Path(os.path.realpath(Path.home()))
    missing = None  # the first folder of the path not there yet: thorfleet makes it (0700)
    while not current.is_dir() and current.parent != current:
        missing, current = current, current.parent
    problems, below, me = [], None, os.getuid()
    said = f"{key}={str(path)!r}"
    while True:
        try:
            stat = current.stat()
        except OSError:
            return problems  # unreadable: reported where the secret is read or made
        mode = stat.st_mode & 0o7777
        if stat.st_uid not in (0, me):
            problems.append(f"{said}: {current} belongs to another user (uid {stat.st_uid}), who "
                            "could replace what it holds: keep the secret in a folder of yours, "
                            "like ~/.config/thorfleet")
        elif stat.st_mode & 0o022:
            sticky = stat.st_mode & 0o1000
            if below is None and missing is None:
                problems.append(f"{said} is in {current}, which other users can write (mode "
                                f"{mode:o}): they could replace it; chmod go-w {current}")
            elif below is None:
                fix = (f"mkdir -m 700 {missing} yourself now, or keep it under your home"
                       if sticky else f"chmod go-w {current}")
                problems.append(f"{said}: {missing} is not there yet, and other users can write "
                                f"{current} (mode {mode:o}): one could make it first and hold "
                                f"what thorfleet puts there; {fix}")
            elif not sticky:
                problems.append(f"{said}: {current}, above it, can be written by other users "
                                f"(mode {mode:o}): they could swap {below} for their own; "
                                f"chmod go-w {current}")
        if current == home or current.parent == current:
            return problems
        below, current = current, current.parent


def settings_for(data, *, groups=None, image_files=None):
    """Settings for one host's data, or SettingsError naming every problem.

    `groups`: the inventory's group names (rollout_canary_group must be one); `image_files`: the
    run's image_files_hash(), so the image's files are read once, not once per host.
    """
    data = dict(data)
    api_key, key_unread = _read_secret_of(data, "service_api_key_file", "THORFLEET_API_KEY")
    hf_token, token_unread = _read_secret_of(data, "weights_hf_token_file", "HF_TOKEN")
    # a key file that cannot be read is its own problem, not "no API key": the rest still checked
    values, problems = check(data, api_key=api_key or key_unread is not None, hf_token=hf_token,
                             groups=groups)
    problems = [p for p in (key_unread, token_unread) if p] + problems
    for key in ("service_api_key_file", "weights_hf_token_file"):
        problems += private_file_problems(key, data.get(key))
    if problems:
        raise SettingsError(problems)
    return Settings(values, api_key=api_key, hf_token=hf_token, image_files=image_files)


