"""thorfleet's own commands, beside `pyinfra INVENTORY deploy.py`:

    python -m thorfleet pin INVENTORY [--ref main] [--image REPO:TAG] [--update] [--yes | --dry-run]
    python -m thorfleet check INVENTORY
    python -m thorfleet status INVENTORY [--json] [--watch [SECONDS]]
    python -m thorfleet doctor INVENTORY [--limit HOST] [--json]
    python -m thorfleet bench INVENTORY --out DIR [--model NAME] [--preset NAME]
                          [--max-concurrency 1,8] [--num-prompts N] [--random-input-len N]
                          [--random-output-len N] [--goodput ttft:MS ...] [--client NAME]
    python -m thorfleet client INVENTORY NAME [--json]

`pin` resolves the weights' hub ref to a commit and the base image's tag to a digest, shows the diff
of the inventory file and writes it (asks first, unless --yes). `check` runs the settings check that
every deploy runs first, and finds each box whose host key the laptop lacks (a strict check would
refuse the connection), without connecting to any host. `status` asks every Thor at once how it
serves now (read-only, one SSH command each) and exits non-zero naming the hosts that do not.
`doctor` checks, read only, each assumption thorfleet makes of a box (release, memory, power,
containers, the model's kernels, heat, the gateway's build) and exits non-zero when one blocks
serving. `bench` runs vLLM's own `vllm bench serve` on a Thor through the door, per model and
concurrency, and writes DIR/bench.json and DIR/bench.png. `client` prints what to hand gateway
client NAME: the door's URL, the CA and key files' paths, its models and an OpenAI SDK snippet
(read only: nothing is made, no host asked).
Run from the repository root, like pyinfra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_PROBLEMS = 2  # bad input: the settings check's and pyinfra config's code
EXIT_NOT_WRITTEN = 3  # pin: changes found but not written (no TTY without --yes, or answered no)
EXIT_INTERRUPTED = 130  # status: Ctrl-C before the boxes answered (the shell's 128 + SIGINT)


def _err(message: str) -> None:
    print(f"thorfleet: {message}", file=sys.stderr)


def _via(values: list[str]) -> dict:
    via = {}
    for value in values or []:
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise SystemExit(f"thorfleet: --via {value!r}: write REGISTRY=URL, e.g. "
                             "registry.lan:5000=http://127.0.0.1:25000")
        via[name] = url
    return via


def cmd_pin(args) -> int:
    from thorfleet.cli.pin import (
        PinError,
        describe,
        plan,
        render,
        unified_diff,
        unpinned_after,
        write,
    )

    path = Path(args.inventory)
    try:
        refs = {"weights_model_revision": args.model_ref, "weights_draft_revision": args.draft_ref}
        source, changes, errors = plan(path, ref=args.ref, image=args.image, update=args.update,
                                       via=_via(args.via), refs=refs)
    except PinError as error:
        _err(str(error))
        return EXIT_PROBLEMS
    for error in errors:
        _err(error)
    if errors:
        _err(f"nothing written to {path}: fix the above and run pin again")
        return EXIT_PROBLEMS
    if not changes:
        print(f"{path}: already pinned, nothing to change (use --update to re-resolve "
              "the refs and tags)")
        return 0
    new_text = render(source, changes)
    try:
        left = unpinned_after(path, new_text)
    except PinError as error:
        _err(f"the pinned inventory would not load: {error}")
        return EXIT_PROBLEMS
    sys.stdout.write(unified_diff(source, new_text))
    print()
    for change in changes:
        print(describe(change))
    for line in left:
        _err(f"{line}: give its group a data dict in {path}")
    if args.dry_run:
        print(f"--dry-run: {path} left as it is")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            _err(f"not written: no terminal to ask on; run again with --yes to write {path}")
            return EXIT_NOT_WRITTEN
        answer = input(f"Write these pins to {path}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print(f"{path} left as it is")
            return EXIT_NOT_WRITTEN
    write(path, new_text)
    print(f"{path}: {len(changes)} value(s) pinned; next: python -m thorfleet check {path}")
    return EXIT_PROBLEMS if left else 0


def _checked(source, host_keys=False):
    """(inventory, {name: Settings}) of an inventory file, or None once it said why not.
    `host_keys`: also refuse a box whose host key the laptop lacks (check's, not status')."""
    from thorfleet.cli.pin import PinError, load_inventory
    from thorfleet.plan import host_key_problems, no_hosts, settings_for_inventory
    from thorfleet.settings.schema import SettingsError

    try:
        inventory = load_inventory(source)
    except PinError as error:
        _err(str(error))
        return None
    if not list(inventory):
        _err(no_hosts(source))
        return None
    problems, settings = [], None
    try:
        settings = settings_for_inventory(inventory)
    except SettingsError as error:
        problems = list(error.problems)
    problems += host_key_problems(inventory) if host_keys else []
    if not problems:
        return inventory, settings
    for problem in problems:
        print(problem)
    _err(f"{len(problems)} problem(s) in {source}; no host was contacted")
    return None


def cmd_check(args) -> int:
    # the host keys too: with a strict check, the first deploy would fail on a box the laptop
    # does not know, after a check that passed
    checked = _checked(args.inventory, host_keys=True)
    if checked is None:
        return EXIT_PROBLEMS
    hosts = len(list(checked[0]))
    print(f"{hosts} host{'s' if hosts != 1 else ''} OK ({args.inventory})")
    return 0


def cmd_status(args) -> int:
    from thorfleet.cli import status
    from thorfleet.settings.roles import thors

    if args.watch is not None and args.watch <= 0:
        _err(f"--watch {args.watch:g}: give the seconds between two refreshes, more than 0")
        return EXIT_PROBLEMS
    checked = _checked(args.inventory)
    if checked is None:
        return EXIT_PROBLEMS
    inventory, settings = checked
    if not thors(inventory):
        _err(f"{args.inventory}: no Thor to ask (only a gateway): list the boxes in a group")
        return EXIT_PROBLEMS
    try:
        return status.show(inventory, settings, as_json=args.json, watch=args.watch,
                           timeout=args.timeout)
    except KeyboardInterrupt:  # before the first table: nothing to show
        return EXIT_INTERRUPTED


def cmd_doctor(args) -> int:
    from fnmatch import fnmatch

    from thorfleet.cli import doctor

    checked = _checked(args.inventory)
    if checked is None:
        return EXIT_PROBLEMS
    inventory, settings = checked
    names = None
    if args.limit:
        names = {h.name for h in inventory
                 if any(fnmatch(h.name, pattern) or pattern in h.groups
                        for pattern in args.limit.split(","))}
        if not names:
            _err(f"--limit {args.limit}: no host or group of {args.inventory} matches")
            return EXIT_PROBLEMS
    try:
        return doctor.show(inventory, settings, only=names, as_json=args.json,
                           timeout=args.timeout)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def cmd_bench(args) -> int:
    from thorfleet.cli import bench

    if args.conversations is not None:
        return _conversations(args)

    try:
        concurrencies = tuple(int(c) for c in args.max_concurrency.split(",")) \
            if args.max_concurrency else None
    except ValueError:
        _err(f"--max-concurrency {args.max_concurrency}: a number, or numbers joined by commas "
             "(1,8)")
        return EXIT_PROBLEMS
    custom = (args.random_input_len, args.random_output_len, args.num_prompts, concurrencies)
    if any(v is not None for v in custom) and args.preset:
        _err("--preset or the shape flags (--random-input-len, --random-output-len, "
             "--num-prompts, --max-concurrency), not both")
        return EXIT_PROBLEMS
    bad = [p for p in args.preset or () if p not in bench.PRESETS]
    if bad or any(v is not None and v < 1 for v in custom[:3]) or \
            any(c < 1 for c in concurrencies or ()):
        _err(f"--preset is one of {', '.join(bench.PRESETS)}; lengths, prompts and "
             "concurrencies are at least 1")
        return EXIT_PROBLEMS
    shapes = {p: bench.PRESETS[p] for p in args.preset} if args.preset else None
    if any(v is not None for v in custom):
        shapes = {"custom": (args.random_input_len or 1024, args.random_output_len or 128,
                             concurrencies or (1,), args.num_prompts or 8)}
    checked = _checked(args.inventory)  # the flags first: nothing is read for bad ones
    if checked is None:
        return EXIT_PROBLEMS
    inventory, settings = checked
    try:
        return bench.run_all(inventory, settings, Path(args.out), models=args.model,
                             shapes=shapes, client=args.client_name, on=args.on,
                             goodput=args.goodput or ())
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _conversations(args) -> int:
    from thorfleet.cli import conversations

    shape = (args.conversations, args.turns, args.first_tokens, args.grow_tokens,
             args.answer_tokens)
    if min(shape) < 1 or args.think_s < 0:
        _err("--conversations, --turns, --first-tokens, --grow-tokens and --answer-tokens are "
             "at least 1, --think-s at least 0")
        return EXIT_PROBLEMS
    if args.preset or args.random_input_len or args.num_prompts or args.max_concurrency:
        _err("--conversations or vllm bench serve's shapes (--preset, --random-input-len, ...), "
             "not both")
        return EXIT_PROBLEMS
    checked = _checked(args.inventory)
    if checked is None:
        return EXIT_PROBLEMS
    try:
        return conversations.run(
            *checked, args.out, conversations=args.conversations, turns=args.turns,
            first_tokens=args.first_tokens, grow_tokens=args.grow_tokens,
            answer_tokens=args.answer_tokens, think_s=args.think_s,
            model=(args.model or [None])[0], client=args.client_name,
            session=args.session_token)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def cmd_client(args) -> int:
    import json

    from thorfleet.cli import client

    checked = _checked(args.inventory)
    if checked is None:
        return EXIT_PROBLEMS
    try:
        found = client.handout(client.door(*checked, args.inventory), args.name, args.inventory)
    except client.ClientError as error:
        _err(str(error))
        return EXIT_PROBLEMS
    print(json.dumps(found, indent=2) if args.json else client.text(found))
    return 0


def parser() -> argparse.ArgumentParser:
    from thorfleet.cli.status import TIMEOUT_S, WATCH_S

    top = argparse.ArgumentParser(prog="python -m thorfleet", description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True)

    pin = commands.add_parser(
        "pin", help="pin the weights' commits and the base image's digest in the inventory",
        description="Resolve weights_model_repo/weights_draft_repo at a hub ref to a commit and "
        "image_base's tag to a digest, and write them into the inventory file's group data.")
    pin.add_argument("inventory", help="the inventory file, e.g. inventory/my-fleet.py")
    pin.add_argument("--ref", help="hub branch, tag or commit to pin the weights at (default main;"
                     " given explicitly, already pinned revisions are re-resolved too)")
    pin.add_argument("--model-ref", metavar="REF", help="--ref for weights_model_repo only")
    pin.add_argument("--draft-ref", metavar="REF", help="--ref for weights_draft_repo only")
    pin.add_argument("--image", metavar="REPO:TAG",
                     help="base image tag to pin (default: image_base's tag, else "
                     "ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor); re-resolves a pinned one")
    pin.add_argument("--update", action="store_true",
                     help="re-resolve everything already pinned (the ref's new commit, the tag's "
                     "new digest)")
    pin.add_argument("--via", action="append", metavar="REGISTRY=URL",
                     help="reach a registry at another address from this machine (repeatable)")
    mode = pin.add_mutually_exclusive_group()
    mode.add_argument("-y", "--yes", action="store_true", help="write without asking")
    mode.add_argument("--dry-run", action="store_true", help="show the diff, write nothing")
    pin.set_defaults(run=cmd_pin)

    check = commands.add_parser("check", help="check every host's settings, connecting to none")
    check.add_argument("inventory")
    check.set_defaults(run=cmd_check)

    status = commands.add_parser(
        "status", help="how every Thor serves now: one SSH command each, all at once, read-only",
        description="Ask every Thor's watchdog at once (one SSH command each, nothing changed) "
        "and print one line per host; exit 1 naming the hosts that do not serve.")
    status.add_argument("inventory")
    shown = status.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    shown.add_argument("--watch", nargs="?", type=float, const=WATCH_S, metavar="SECONDS",
                       help=f"refresh the table in place every SECONDS (default {WATCH_S:g}) "
                       "until Ctrl-C; the exit status is the last refresh's")
    status.add_argument("--timeout", type=float, default=TIMEOUT_S, metavar="SECONDS",
                        help=f"to connect and for each box's answer (default {TIMEOUT_S:g})")
    status.set_defaults(run=cmd_status)

    from thorfleet.cli.doctor import TIMEOUT_S as DOCTOR_TIMEOUT_S

    doctor = commands.add_parser(
        "doctor", help="which of thorfleet's assumptions hold on each box: read only",
        description="Read, on every Thor and gateway at once (one SSH command each, nothing "
        "installed, changed, restarted or pulled), each assumption thorfleet's deploy, proof, "
        "watchdog and metrics rely on; print one row each with a verdict (ok, copes, blocks, "
        "not checked yet) and exit 1 when one blocks serving.")
    doctor.add_argument("inventory")
    doctor.add_argument("--limit", metavar="HOST", help="only these hosts or groups (comma-"
                        "separated; glob patterns as pyinfra's --limit)")
    doctor.add_argument("--json", action="store_true", help="print the rows as a JSON list")
    doctor.add_argument("--timeout", type=float, default=DOCTOR_TIMEOUT_S, metavar="SECONDS",
                        help=f"for each host's answer (default {DOCTOR_TIMEOUT_S:g})")
    doctor.set_defaults(run=cmd_doctor)

    bench = commands.add_parser(
        "bench", help="the fleet's capacity, by vLLM's own `vllm bench serve` through the door",
        description="Run vLLM's own serving benchmark (vllm bench serve, in the image a Thor "
        "serves) through the door, per model and concurrency, as a client does (its key, its "
        "limits); print TTFT, TPOT and ITL (median, p99) and goodput, write DIR/bench.json and "
        "draw DIR/bench.png. Default shapes: seed 004's (1024 in / 512 out at 1) and Jetson AI "
        "Lab's (2048 in / 128 out at 1 and 8).")
    bench.add_argument("inventory")
    bench.add_argument("--out", required=True, metavar="DIR", help="where bench.json and "
                       "bench.png go")
    bench.add_argument("--model", action="append", metavar="NAME",
                       help="a model the door serves (repeatable; default: each)")
    bench.add_argument("--preset", action="append", metavar="NAME",
                       help="seed, jetson-ai-lab or seed-large (1000 prompts at 100: hours) "
                       "(repeatable; default: seed and jetson-ai-lab)")
    bench.add_argument("--max-concurrency", metavar="N[,N...]",
                       help="vLLM's flag; a list runs each")
    bench.add_argument("--num-prompts", type=int, metavar="N", help="vLLM's flag")
    bench.add_argument("--random-input-len", type=int, metavar="N", help="vLLM's flag")
    bench.add_argument("--random-output-len", type=int, metavar="N", help="vLLM's flag")
    bench.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                       help="vLLM's SLO for goodput, e.g. ttft:2000 tpot:100")
    bench.add_argument("--client", dest="client_name", metavar="NAME",
                       help="ask with this gateway_clients key (needed when the door has "
                       "clients; its limits apply)")
    bench.add_argument("--on", metavar="HOST", help="the Thor that runs the benchmark (default: "
                       "the first)")
    talk = bench.add_argument_group(
        "conversations", "multi-turn mode: N conversations at once from this machine through the "
        "door, each turn resending the whole history; time to first token by turn, the box each "
        "turn landed on and the prompt tokens served from cache (DIR/conversations.json, .png)")
    talk.add_argument("--conversations", type=int, metavar="N", help="turns on this mode")
    talk.add_argument("--turns", type=int, default=6, metavar="N", help="each (default 6)")
    talk.add_argument("--first-tokens", type=int, default=16000, metavar="N",
                      help="the first message's length (default 16000)")
    talk.add_argument("--grow-tokens", type=int, default=300, metavar="N",
                      help="each later message's (default 300)")
    talk.add_argument("--answer-tokens", type=int, default=64, metavar="N",
                      help="each answer's (default 64)")
    talk.add_argument("--think-s", type=float, default=2.0, metavar="SECONDS",
                      help="between an answer and the next turn (default 2)")
    talk.add_argument("--session-token", action="store_true",
                      help="send each conversation's own X-Session-Token (default: none, as the "
                      "OpenAI SDK sends)")
    bench.set_defaults(run=cmd_bench)

    client = commands.add_parser(
        "client", help="what to hand a gateway client: URL, CA, key file, models, a snippet",
        description="Print, for client NAME of the gateway's gateway_clients, the door's URL, "
        "the CA file and key file to hand over (their paths: the key is never printed), the "
        "models it may call and OpenAI SDK code that reads its key from the file. Reads the "
        "inventory only: no host is asked, no key or CA made (the deploy makes them).")
    client.add_argument("inventory")
    client.add_argument("name", help="a client of the gateway's gateway_clients")
    client.add_argument("--json", action="store_true", help="print the same as one JSON object")
    client.set_defaults(run=cmd_client)
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
