"""`thorfleet pin`: resolve what an inventory names (hub refs, image tags) and write the pins back.

The inventory is loaded exactly as pyinfra loads it (its own `make_inventory`, group_data/all.py
defaults). The pins are written into the inventory file's own data dict literals by editing the
source at the AST nodes' positions, so comments and layout survive. Where a key goes:

- a data dict (group or host) that already sets the key gets its value replaced;
- otherwise a data dict with the key commented out (as inventory/example.py has them) gets that
  line replaced by the real key;
- otherwise the groups' dicts that set the related key (the repo, the endpoint) get it added;
- otherwise the first group of the file with a data dict gets it added.

Afterwards the edited text is loaded again through pyinfra, and every host must read pinned values.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from thorfleet.cli.resolve import (
    DEFAULT_IMAGE,
    HEX40,
    ResolveError,
    hub_commit,
    image_digest,
    pinned_image,
    split_image,
)
from thorfleet.settings.schema import placeholder

ROOT = Path(__file__).resolve().parents[2]
IMAGE_PINNED = re.compile(r"@sha256:[0-9a-f]{64}$")
TAG_COMMENT = re.compile(r"#\s*tag\s+(\S+)")

# key -> (what it pins, the related keys whose dicts are the natural home for it)
PIN_KEYS = {
    "weights_model_revision": ("weights_model_repo", ("weights_model_repo", "weights_hf_endpoint")),
    "weights_draft_revision": ("weights_draft_repo", ("weights_draft_repo", "weights_hf_endpoint")),
    "image_base": ("image_base", ()),
}


class PinError(Exception):
    """A problem with the inventory itself (not with a hub or registry)."""


# --- loading the inventory as pyinfra does ----------------------------------------------------------


def group_data_cwd() -> str:
    """The directory whose group_data/ pyinfra reads: the working directory when it has
    group_data/all.py (pyinfra's rule, run from the repo root), else thorfleet's repo root."""
    here = Path.cwd()
    return str(here if (here / "group_data" / "all.py").exists() else ROOT)


def load_inventory(path):
    """pyinfra's own Inventory for an inventory file, group data included."""
    from click import ClickException
    from pyinfra.api.exceptions import PyinfraError

    from thorfleet.run.pyinfra_hooks import load_cli_inventory

    path = Path(path)
    if not path.is_file():
        raise PinError(f"{path}: no such inventory file (copy inventory/example.py and edit it)")
    cwd = group_data_cwd()
    try:
        # a file pin just wrote must be read afresh
        return load_cli_inventory(path, cwd, fresh=(path, Path(cwd) / "group_data"))
    except (ClickException, PyinfraError, SyntaxError, NameError, TypeError, ValueError) as error:
        message = error.format_message() if isinstance(error, ClickException) else str(error)
        raise PinError(f"{path}: pyinfra cannot load it: {message}") from error


# --- the inventory file's source ----------------------------------------------------------------


@dataclass
class DataDict:
    """A data dict literal in the inventory file: a group's, or a host's inside a group."""

    label: str  # "group thors" or "host thor-1"
    group: str | None
    host: str | None
    node: ast.Dict
    keys: dict = field(default_factory=dict)  # key -> (key node, value node)

    @classmethod
    def of(cls, label, group, host, node):
        keys = {}
        for key, value in zip(node.keys, node.values):
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                keys[key.value] = (key, value)
        return cls(label, group, host, node, keys)


class Source:
    """The inventory file as text and AST; edits are made on its UTF-8 bytes (AST columns are
    byte offsets)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.text = self.path.read_text()
        self.data = self.text.encode()
        try:
            self.tree = ast.parse(self.text, filename=str(path))
        except SyntaxError as error:
            raise PinError(f"{path}:{error.lineno}: not valid Python: {error.msg}") from error
        self.line_starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.line_starts.append(self.line_starts[-1] + len(line))
        self.groups: list[DataDict] = []  # file order
        self.hosts: list[DataDict] = []
        self.group_names: list[str] = []
        for statement in self.tree.body:
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name)):
                continue
            name = statement.targets[0].id
            if name.startswith("_"):
                continue
            value = statement.value
            hosts_node = value
            if isinstance(value, ast.Tuple) and len(value.elts) == 2:
                hosts_node = value.elts[0]
                if isinstance(value.elts[1], ast.Dict):
                    self.groups.append(DataDict.of(f"group {name}", name, None, value.elts[1]))
            if isinstance(hosts_node, ast.List):
                self.group_names.append(name)
                for element in hosts_node.elts:
                    if (isinstance(element, ast.Tuple) and len(element.elts) == 2
                            and isinstance(element.elts[0], ast.Constant)
                            and isinstance(element.elts[1], ast.Dict)):
                        host = element.elts[0].value
                        self.hosts.append(DataDict.of(f"host {host}", name, host, element.elts[1]))

    def offset(self, lineno: int, col: int) -> int:
        return self.line_starts[lineno - 1] + col

    def line_of(self, offset: int) -> tuple[int, int]:
        """(start, end without newline) of the line holding byte `offset`."""
        start = self.data.rfind(b"\n", 0, offset) + 1
        end = self.data.find(b"\n", offset)
        return start, len(self.data) if end < 0 else end

    def comment_after(self, node: ast.AST) -> str:
        """The comment on the line where `node` ends, if any."""
        end = self.offset(node.end_lineno, node.end_col_offset)
        _, line_end = self.line_of(end)
        rest = self.data[end:line_end].decode()
        return rest[rest.index("#"):] if "#" in rest else ""

    def commented_key(self, target: DataDict, key: str) -> tuple[int, int] | None:
        """Byte span of a line inside the dict that is only a commented-out `"key": ...`."""
        start = self.offset(target.node.lineno, target.node.col_offset)
        end = self.offset(target.node.end_lineno, target.node.end_col_offset)
        pattern = re.compile(rb"^[ \t]*#[ \t]*[\"']" + re.escape(key.encode()) + rb"[\"'][ \t]*:")
        position = start
        while position < end:
            line_start, line_end = self.line_of(position)
            if line_start >= start and pattern.match(self.data[line_start:line_end]):
                return line_start, line_end
            position = line_end + 1
        return None


def literal(value) -> str:
    """A Python literal in the example's style (double quotes)."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


class Edits:
    def __init__(self, source: Source):
        self.source = source
        self.spans: list[tuple[int, int, bytes]] = []

    def replace(self, start: int, end: int, text: str) -> None:
        self.spans.append((start, end, text.encode()))

    def set_key(self, target: DataDict, key: str, value: str, comment: str | None) -> None:
        """Set `key` to `value` in the dict: replace, uncomment or add."""
        src = self.source
        tail = f"  # {comment}" if comment else ""
        if key in target.keys:
            value_node = target.keys[key][1]
            start = src.offset(value_node.lineno, value_node.col_offset)
            end = src.offset(value_node.end_lineno, value_node.end_col_offset)
            if comment is not None:
                _, line_end = src.line_of(end)
                rest = src.data[end:line_end].decode()
                # Only our own comment (or none) is replaced; the operator's own note stays.
                if re.fullmatch(r"\s*,?\s*", rest) or TAG_COMMENT.search(rest):
                    # A trailing comma is always valid here: the rest of the line was only a
                    # comma and a comment, so the closing brace is on a later line.
                    self.replace(start, line_end, f"{literal(value)},{tail}")
                    return
            self.replace(start, end, literal(value))
            return
        line = src.commented_key(target, key)
        if line:
            indent = re.match(rb"[ \t]*", src.data[line[0]:line[1]]).group().decode()
            self.replace(line[0], line[1], f"{indent}{literal(key)}: {literal(value)},{tail}")
            return
        node = target.node
        close = src.offset(node.end_lineno, node.end_col_offset) - 1  # the "}"
        entry = f"{literal(key)}: {literal(value)}"
        if node.lineno == node.end_lineno:  # a one-line dict: {} or {"a": 1}
            sep = ", " if node.keys else ""
            if node.values:
                last = node.values[-1]
                last_end = src.offset(last.end_lineno, last.end_col_offset)
                between = src.data[last_end:close].decode()
                sep = " " if "," in between else ", "
            self.replace(close, close, f"{sep}{entry}")
            return
        if node.values:
            last = node.values[-1]
            last_end = src.offset(last.end_lineno, last.end_col_offset)
            after = src.data[last_end:close]
            covered = any(s < last_end <= e and b"," in text for s, e, text in self.spans)
            if not after.lstrip().startswith(b",") and not covered:
                self.replace(last_end, last_end, ",")
            first_key = node.keys[0]
            indent = " " * first_key.col_offset
        else:
            indent = " " * (node.col_offset + 4)
        close_line_start, _ = src.line_of(close)
        before_close = src.data[close_line_start:close]
        if before_close.strip():  # "}" follows other text on its line: break the line first
            self.replace(close, close, f"\n{indent}{entry},{tail}\n{' ' * node.col_offset}")
        else:
            self.replace(close_line_start, close_line_start, f"{indent}{entry},{tail}\n")

    def apply(self) -> str:
        data = self.source.data
        for start, end, text in sorted(self.spans, key=lambda s: (s[0], s[1]), reverse=True):
            data = data[:start] + text + data[end:]
        return data.decode()


# --- deciding what to pin where -------------------------------------------------------------------


@dataclass
class Change:
    target: DataDict
    key: str
    old: object
    new: str
    why: str  # "mistralai/... at main", "ghcr.io/...:tag"
    comment: str | None = None


def _read_token(data: dict) -> str | None:
    path = data.get("weights_hf_token_file")
    if path:
        try:
            return Path(path).expanduser().read_text().strip() or None
        except OSError as error:
            raise PinError(f"weights_hf_token_file={path!r}: cannot read it ({error.strerror}): "
                           "fix the path, or unset it and export HF_TOKEN") from None
    return os.environ.get("HF_TOKEN") or None


def _targets(source: Source, key: str) -> list[DataDict]:
    """Where `key` is written: see the module's docstring."""
    every = source.groups + source.hosts
    found = [d for d in every if key in d.keys]
    found += [d for d in source.groups if d not in found and source.commented_key(d, key)]
    if found:
        return found
    related = PIN_KEYS[key][1]
    found = [d for d in source.groups if any(k in d.keys for k in related)]
    if found:
        return found
    if source.groups:
        return source.groups[:1]
    raise PinError(f"{source.path}: no group with a data dict to write {key} into: write a group "
                   "as `name = ([hosts...], {...})`, as inventory/example.py does")


def _data_of(inventory, target: DataDict) -> dict:
    """What pyinfra reads for a target: a host's merged data, or defaults + the group's data."""
    if target.host is not None:
        return inventory.get_host(target.host).data.dict()
    return {**inventory.get_data(), **inventory.get_group_data(target.group)}


def plan(path, ref: str | None = None, image: str | None = None, update: bool = False,
         via: dict | None = None, refs: dict | None = None) -> tuple[Source, list[Change], list[str]]:
    """(source, changes, errors): resolve every unpinned (or, with ref/image/update, every) value.
    `refs` may name a ref per key (weights_model_revision: ...) over `ref`."""
    inventory = load_inventory(path)
    source = Source(path)
    hub_cache, image_cache = {}, {}
    changes, errors = [], []
    for key in PIN_KEYS:
        for target in _targets(source, key):
            data = _data_of(inventory, target)
            current = data.get(key)
            try:
                if key == "image_base":
                    change = _plan_image(source, target, current, image, update, via, image_cache)
                else:
                    change = _plan_revision(target, key, data, current, (refs or {}).get(key) or ref,
                                            update, hub_cache)
            except ResolveError as error:
                if str(error) not in errors:
                    errors.append(str(error))
                continue
            except PinError as error:
                errors.append(str(error))
                continue
            if change:
                changes.append(change)
    return source, changes, errors


def _plan_revision(target, key, data, current, ref, update, cache) -> Change | None:
    repo_key = PIN_KEYS[key][0]
    repo = data.get(repo_key)
    if not repo:
        raise PinError(f"{target.label}: {repo_key} is not set: name the hub repo to pin")
    pinned = isinstance(current, str) and HEX40.match(current) and not placeholder(current)
    if pinned and ref is None and not update:
        return None
    ref = ref or "main"
    endpoint = data.get("weights_hf_endpoint") or None
    token = _read_token(data)
    cache_key = (repo, ref, endpoint, token)
    if cache_key not in cache:
        cache[cache_key] = hub_commit(repo, ref, endpoint, token)
    commit = cache[cache_key]
    if commit == current:
        return None
    return Change(target, key, current, commit, f"{repo} at {ref}")


def _plan_image(source, target, current, image, update, via, cache) -> Change | None:
    comment_tag = None
    if target.keys.get("image_base"):
        found = TAG_COMMENT.search(source.comment_after(target.keys["image_base"][1]))
        comment_tag = found.group(1) if found else None
    pinned = isinstance(current, str) and IMAGE_PINNED.search(current) and \
        not placeholder(current)
    if image:
        wanted = image
    elif pinned and not update:
        return None
    elif pinned:  # --update: the tag this pin was made from, as its comment records it
        repository, _, _ = split_image(current)
        if comment_tag:
            wanted = f"{repository}:{comment_tag}"
        elif repository == split_image(DEFAULT_IMAGE)[0]:
            wanted = DEFAULT_IMAGE
        else:
            raise PinError(f"{target.label}: image_base={current!r} records no tag to re-resolve: "
                           "pass --image REPO:TAG")
    elif isinstance(current, str) and current:
        wanted = current  # a tag, as the operator wrote it
    else:
        wanted = DEFAULT_IMAGE
    repository, tag, digest = split_image(wanted)
    if digest:
        if wanted == current:
            return None
        return Change(target, "image_base", current, wanted, "as given")
    tag = tag or "latest"
    if wanted not in cache:
        cache[wanted] = image_digest(wanted, via)
    new = pinned_image(wanted, cache[wanted])
    comment = f"tag {tag}"
    if new == current and comment_tag == tag:
        return None
    if new == current and target.keys.get("image_base") is None:
        return None  # pinned by a value this file does not spell (defaults): leave it
    return Change(target, "image_base", current, new, f"{repository}:{tag}", comment)


def render(source: Source, changes: list[Change]) -> str:
    edits = Edits(source)
    # Values replaced in place first: an added key after them must see their trailing comma.
    for change in sorted(changes, key=lambda c: c.key not in c.target.keys):
        edits.set_key(change.target, change.key, change.new, change.comment)
    return edits.apply()


def unified_diff(source: Source, new_text: str) -> str:
    name = str(source.path)
    return "".join(difflib.unified_diff(source.text.splitlines(keepends=True),
                                        new_text.splitlines(keepends=True),
                                        fromfile=f"{name} (now)", tofile=f"{name} (pinned)"))


def describe(change: Change) -> str:
    old = "unset" if change.old is None else change.old
    return f"{change.target.label}: {change.key}: {old} -> {change.new}  ({change.why})"


def unpinned_after(path: Path, new_text: str) -> list[str]:
    """Load the edited text through pyinfra (beside the original, so group_data and relative
    names resolve the same) and list the hosts that still read an unpinned value."""
    fd, tmp = tempfile.mkstemp(prefix=".pin-", suffix=".py", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(new_text)
        inventory = load_inventory(tmp)
        found = []
        for host in inventory:
            data = host.data.dict()
            for key in ("weights_model_revision", "weights_draft_revision"):
                if not (isinstance(data.get(key), str) and HEX40.match(data[key])):
                    found.append(f"host {host.name}: {key}={data.get(key)!r} is still unpinned")
            if not (isinstance(data.get("image_base"), str)
                    and IMAGE_PINNED.search(data["image_base"])):
                found.append(f"host {host.name}: image_base={data.get('image_base')!r} is still "
                             "unpinned")
        return found
    finally:
        os.unlink(tmp)


def write(path: Path, text: str) -> None:
    """Replace the file atomically, keeping its mode."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".pin-", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, path.stat().st_mode & 0o7777)
    os.replace(tmp, path)
