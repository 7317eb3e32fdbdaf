"""Files, units, users and packages: what a file, a folder or a tree holds, a systemd unit's
state, a user's passwd entry, the distribution's packages installed.
"""

from __future__ import annotations

from shlex import quote as q

from pyinfra.api import FactBase


class FileState(FactBase[dict | None]):
    """What is at a file's path (read as root, never through a symbolic link): {"type", "mode",
    "user", "group", "sha256"}; the sha256 only of a regular file (None for a link, a folder...),
    so a link to a copy with the same content is seen as what it is. None when nothing is there."""

    def command(self, path):
        return (f"if [ -e {q(path)} ] || [ -L {q(path)} ]; then stat -c '%a %U %G %F' {q(path)}; "
                f"if [ -f {q(path)} ] && [ ! -L {q(path)} ]; then "
                f"sha256sum {q(path)} | cut -d' ' -f1; fi; fi")

    def process(self, output):
        if not output or not output[0].strip():
            return None
        mode, user, group, kind = output[0].split(" ", 3)
        return {"type": kind, "mode": mode, "user": user, "group": group,
                "sha256": output[1].strip() if len(output) > 1 else None}


class PathState(FactBase[dict | None]):
    """What is at `path`: {"type": "directory" | "regular file" | ..., "mode", "user", "group"},
    or None when nothing is."""

    def command(self, path):
        return f"if [ -e {q(path)} ] || [ -L {q(path)} ]; then stat -c '%a %U %G %F' {q(path)}; fi"

    def process(self, output):
        mode, user, group, kind = output[0].split(" ", 3)
        return {"type": kind, "mode": mode, "user": user, "group": group}


class UnitEnabled(FactBase[str | None]):
    """`systemctl is-enabled` of a unit: "enabled", "disabled", "static", ... (None when systemd
    does not know it: it prints nothing on stdout)."""

    def command(self, unit):
        return f"systemctl is-enabled {q(unit)} 2>/dev/null || true"

    def process(self, output):
        return output[-1].strip() or None


class PasswdEntry(FactBase[dict | None]):
    """A user's passwd entry as {"uid", "home", "shell"}, or None when there is no such user."""

    def command(self, user):
        return f"getent passwd {q(user)} || true"

    def process(self, output):
        fields = output[-1].split(":")
        return {"uid": int(fields[2]), "home": fields[5], "shell": fields[6]}


_NO_CACHE = "-name __pycache__ -prune -o"


class TreeState(FactBase[dict]):
    """Every file under `path` as {relative path: {"sha256", "mode", "owner"}} ({} when `path` is
    absent); anything that is not a regular file (a link, a fifo) is listed with type "other".
    Python's bytecode caches (`__pycache__`, which python3 writes beside what it imports on the
    box) are not listed: derived from the files, and checked against them by python itself."""

    @staticmethod
    def default():
        return {}

    def command(self, path):
        return (f"if [ -d {q(path)} ]; then cd {q(path)} && "
                f"find . {_NO_CACHE} -type f -exec stat -c 'mode %a %U:%G %n' {{}} + && "
                f"find . {_NO_CACHE} ! -type f ! -type d -exec stat -c 'other %F %n' {{}} + && "
                f"find . {_NO_CACHE} -type f -exec sha256sum {{}} +; fi")

    def process(self, output):
        tree = {}
        for line in output:
            if line.startswith("mode "):
                _, mode, owner, name = line.split(" ", 3)
                tree.setdefault(name[2:], {}).update(mode=mode, owner=owner)
            elif line.startswith("other "):
                name = line.rsplit(" ./", 1)[1]
                tree[name] = {"type": "other"}
            else:
                digest, name = line.split("  ", 1)
                tree.setdefault(name[2:], {})["sha256"] = digest
        return tree


class DebInstalled(FactBase[list]):
    """Which of `packages` dpkg has installed (a sorted list; [] when none is)."""

    def command(self, packages):
        words = " ".join(q(p) for p in packages)
        return (f"dpkg-query -W -f='${{Package}} ${{db:Status-Status}}\\n' {words} 2>/dev/null "
                "| awk '$2 == \"installed\" {print $1}' || true")

    def default(self):
        return []

    def process(self, output):
        return sorted(line.strip() for line in output if line.strip())


class UnitActive(FactBase[str]):
    """`systemctl is-active` of a unit: "active", "inactive", "failed", ..."""

    def command(self, unit):
        return f"systemctl is-active {q(unit)} 2>/dev/null || true"

    def default(self):
        return "unknown"

    def process(self, output):
        return output[-1].strip() or "unknown"


class FirstLine(FactBase[str | None]):
    """The first line of a file (None when there is none): whose a config file is, by its
    header."""

    def command(self, path):
        return f"head -n 1 {q(path)} 2>/dev/null || true"

    def process(self, output):
        return output[0] if output else None
