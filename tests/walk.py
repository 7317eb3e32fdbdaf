"""Follow one value from where the operator sets it to where it lands, and list the files it
crosses: the walk docs/layout.md ("Following one value") counts.

    python -m tests.walk watchdog_interval_s   # a setting, to the watchdog's command line
    python -m tests.walk client_key            # a client's key, to the door's map

The walk runs what a deploy runs, on pyinfra's API with no box contacted: the operator's
inventory (a file of its own, holding a value no other setting has), the run's plan, the task
that installs the value, and each of its operations' bodies; then the box's program reads the
file that landed, with its own parser.

A file counts where its code has the value in hand: a line runs with it in a local variable
(itself, in text rendered from it, or in a list or mapping of such), or a function of it returns
it, or a call it made returns it. A file that only hands on an object holding the value (the
run's Settings, pyinfra's host), or a wrapper's `*args` and `**kwargs`, does not count: a reader
follows the value past it without opening it. A visit lasts while the file's frames that were
running when the value arrived run; a return is the value arriving again in a file whose every
visit had ended.

THORFLEET_WALK_EVERY=1 in the environment also prints, on stderr, every line that has the value
in hand: where to look when a walk grows.
"""

from __future__ import annotations

import argparse
import dis
import hashlib
import inspect
import io
import os
import shlex
import sys
import tempfile
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The house's own code: not the tests (this walker and their fixtures), not the sim or bench.
NOT_THE_HOUSE = (ROOT / "tests", ROOT / "sim", ROOT / "bench")


@dataclass
class Walk:
    """The files the value crossed, in the order it reached them, each with the first line where
    it was in hand at that visit."""

    forms: tuple  # the value as the operator sets it, and as later code holds it (a digest)
    watched: tuple[Path, ...] = ()  # files outside the house that count (the operator's)
    steps: list[tuple[str, int, str, bool]] = field(default_factory=list)  # (file, line, function, a return)
    _open: dict = field(default_factory=dict)  # {file: the frame its open visit lasts for}

    def counts(self, filename: str) -> bool:
        path = Path(filename)
        if path in self.watched:
            return True
        return path.is_relative_to(ROOT) and not any(path.is_relative_to(p) for p in NOT_THE_HOUSE)

    def holds(self, value, depth=3) -> bool:
        if isinstance(value, bool):
            return False
        if isinstance(value, (int, float)):
            return any(isinstance(f, int) and value == f for f in self.forms)
        if isinstance(value, str):
            return any(str(f) in value for f in self.forms)
        if isinstance(value, bytes):
            return any(str(f).encode() in value for f in self.forms)
        if isinstance(value, (io.StringIO, io.BytesIO)):
            return self.holds(value.getvalue(), depth)
        if depth == 0:
            return False
        if isinstance(value, dict):
            return any(self.holds(k, depth - 1) or self.holds(v, depth - 1)
                       for k, v in list(value.items()))
        if isinstance(value, (list, tuple, set, frozenset)):
            return any(self.holds(v, depth - 1) for v in list(value))
        return False

    def seen(self, frame) -> None:
        """The value is in hand in `frame`: a new visit to its file, unless one is open (a frame
        of the file that was running when the value last arrived there still runs)."""
        file = frame.f_code.co_filename
        if os.environ.get("THORFLEET_WALK_EVERY"):  # every line with the value in hand
            print(f"   {os.path.relpath(file, ROOT)}:{frame.f_lineno} {frame.f_code.co_name}",
                  file=sys.stderr)
        if file in self._open:
            return
        anchor, f = frame, frame.f_back
        while f is not None:  # the oldest running frame of the same file holds the visit open
            if f.f_code.co_filename == file:
                anchor = f
            f = f.f_back
        self._open[file] = anchor
        again = any(step[0] == file for step in self.steps)
        line = frame.f_lineno
        template = frame.f_globals.get("__jinja_template__")
        if template is not None:  # a template's code: its own line, not the compiled one's
            line = template.get_corresponding_lineno(line)
        self.steps.append((file, line, frame.f_code.co_name, again))

    def trace(self, frame, event, arg):
        if not self.counts(frame.f_code.co_filename):
            return None
        self._look(frame, event, arg)
        return self._local

    def _local(self, frame, event, arg):
        self._look(frame, event, arg)
        return self._local

    def _look(self, frame, event, arg):
        code = frame.f_code
        handed_on = _handed_on(code)
        if event == "return" and self.holds(arg) or any(
                self.holds(v) for k, v in frame.f_locals.items()
                if k not in handed_on and not k.startswith("__")):
            self.seen(frame)
        if event == "return" and self.holds(arg):
            caller = frame.f_back  # what a call returns is in the hands of the code that made it
            while caller is not None and not self.counts(caller.f_code.co_filename):
                caller = caller.f_back
            if caller is not None:
                self.seen(caller)
        if event == "return" and self._open.get(code.co_filename) is frame and not _yields(frame):
            del self._open[code.co_filename]

    @contextmanager
    def following(self):
        sys.settrace(self.trace)
        try:
            yield self
        finally:
            sys.settrace(None)

    def lands(self, program: Path, line: int, how: str) -> None:
        """The last step, taken on the box: `program` reads the file that landed (`how`)."""
        self.steps.append((str(program), line, how, False))

    def files(self) -> list[str]:
        return list(dict.fromkeys(step[0] for step in self.steps))

    def returns(self) -> list[str]:
        return [step[0] for step in self.steps if step[3]]

    def report(self) -> str:
        lines = []
        for n, (file, line, function, again) in enumerate(self.steps, 1):
            name = os.path.relpath(file, ROOT) if Path(file).is_relative_to(ROOT) else "the inventory"
            lines.append(f"{n:>2}. {name}:{line} {function}" + ("  (a return)" if again else ""))
        lines.append(f"{len(self.files())} files, {len(self.returns())} returns")
        return "\n".join(lines)


def _handed_on(code) -> set[str]:
    """A wrapper's `*args` and `**kwargs`: a call handed on whole, its values not looked at (nor
    in a comprehension of the wrapper, which sees them by the same names)."""
    names = {"args", "kwargs"}
    count = code.co_argcount + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        names.add(code.co_varnames[count])
        count += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        names.add(code.co_varnames[count])
    return names


_YIELD = dis.opmap["YIELD_VALUE"]


def _yields(frame) -> bool:
    """Whether a generator's frame is only pausing at a yield (it runs on), not ending."""
    return bool(frame.f_code.co_flags & inspect.CO_GENERATOR) and \
        frame.f_code.co_code[frame.f_lasti] == _YIELD


def _inventory(walk: Walk, folder: Path, text: str):
    """The operator's inventory file, loaded as pyinfra's CLI loads one (group_data/ beside it
    is the repository's own, as `pyinfra inventory/... deploy.py` run from the root reads it)."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    path = folder / "inventory.py"
    path.write_text(textwrap.dedent(text))
    walk.watched = (path,)
    with ctx_state.use(State()):  # the CLI's loader records the file it runs on a state
        return make_inventory(str(path), cwd=str(ROOT))


def _plan(inventory):
    from pyinfra.api import Config, State
    from pyinfra.api.state import StateStage

    from thorfleet.plan import settings_for_run

    state = State(check_for_changes=False)
    state.init(inventory, Config())
    state.current_stage = StateStage.Prepare
    return state, settings_for_run(state)


def _run_bodies(state, host) -> list[bytes]:
    """Each operation's body planned for `host`, as pyinfra runs it: its commands made, the
    box's reads answered with nothing in place. Returns what the commands upload."""
    from pyinfra.api import FileUploadCommand
    from pyinfra.context import ctx_host

    uploads = []
    with ctx_host.use(host):
        for op_hash in state.get_op_order():
            if op_hash in state.ops[host]:
                for command in state.ops[host][op_hash].command_generator():
                    if isinstance(command, FileUploadCommand):
                        uploads.append(command.src.getvalue())
    return uploads


def _planned(state, host, task):
    from pyinfra.context import ctx_host, ctx_inventory, ctx_state

    from thorfleet import facts

    held = {facts.lock.RunLock: {"held": True, "why": None}}  # this run holds the box
    host.get_fact = lambda fact, **_: held[fact] if fact in held else fact().default()
    with ctx_state.use(state), ctx_inventory.use(state.inventory), ctx_host.use(host):
        task()
        return _run_bodies(state, host)


WATCHDOG_INTERVAL = 7919  # no other setting of the inventory below has it


def watchdog_interval_s(folder: Path) -> Walk:
    """watchdog_interval_s, set in the inventory, to the watchdog's `--interval`."""
    from tasks import watch

    os.environ.setdefault("THORFLEET_API_KEY", "sk-walk-0123456789abcdef0123")
    os.environ["THORFLEET_BATCH_READS"] = "0"
    walk = Walk(forms=(WATCHDOG_INTERVAL,))
    with walk.following():
        inventory = _inventory(walk, folder, f"""
            thors = (["thor-1"], {{"weights_model_revision": "4" * 40,
                                   "weights_draft_revision": "5" * 40,
                                   "image_base": "registry.example/vllm@sha256:" + "a" * 64,
                                   "watchdog_interval_s": {WATCHDOG_INTERVAL}}})
            """)
        state, settings = _plan(inventory)
        host = inventory.get_host("thor-1")
        uploads = _planned(state, host, lambda: watch.run(settings[host.name]))
    # on the box: the watchdog reads the unit's command line with its own parser
    from tests.helpers import box_program

    program = ROOT / "files" / "thor" / "bin" / "thorfleet-watchdog"
    starts = [line.removeprefix("ExecStart=") for upload in uploads
              for line in upload.decode(errors="replace").splitlines()
              if line.startswith("ExecStart=") and f"{program.name} run" in line]
    words = shlex.split(starts[0])
    parsed = box_program(program.name).arguments().parse_args(words[words.index("run"):])
    if parsed.interval != WATCHDOG_INTERVAL:
        raise SystemExit(f"the watchdog reads --interval {parsed.interval}, not the inventory's")
    line = next(n for n, text in enumerate(program.read_text().splitlines(), 1)
                if '"--interval"' in text)
    walk.lands(program, line, "arguments (--interval, from the unit's ExecStart)")
    return walk


CLIENT_KEY = "walk-5f0c93e7b2d4869a1c0e5b7d3f2a8e6c"  # what the operator put in the key file


def client_key(folder: Path) -> Walk:
    """A client's key, from the key file the inventory names (gateway_clients) to the door's
    map of keys: the file's path, the key in it, and the key's SHA-256 as the map holds it."""
    from tasks import gateway

    os.environ.setdefault("THORFLEET_API_KEY", "sk-walk-0123456789abcdef0123")
    os.environ["THORFLEET_BATCH_READS"] = "0"
    keys = folder / "keys"
    keys.mkdir(mode=0o700)
    key_file = keys / "walker.key"
    key_file.write_text(CLIENT_KEY + "\n")
    key_file.chmod(0o600)
    digest = hashlib.sha256(CLIENT_KEY.encode()).hexdigest()
    walk = Walk(forms=(str(key_file), CLIENT_KEY, digest))
    with walk.following():
        inventory = _inventory(walk, folder, f"""
            pins = {{"weights_model_revision": "4" * 40, "weights_draft_revision": "5" * 40,
                     "image_base": "registry.example/vllm@sha256:" + "a" * 64}}
            thors = ([("thor-1", {{"ssh_hostname": "10.0.0.1"}})], pins)
            gateway = ([("gw-1", {{"ssh_hostname": "10.0.0.9"}})],
                       {{"gateway_ca_dir": {str(folder / "ca")!r},
                         "gateway_clients": {{"walker": {str(key_file)!r}}}}})
            """)
        state, settings = _plan(inventory)
        host = inventory.get_host("gw-1")
        _planned(state, host, lambda: gateway.run(settings[host.name]))
    return walk


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.walk", description=__doc__.splitlines()[0])
    parser.add_argument("value", choices=["watchdog_interval_s", "client_key"])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        walk = {"watchdog_interval_s": watchdog_interval_s,
                "client_key": client_key}[args.value](Path(folder))
    print(walk.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
