"""python -m sim up|down|status|bases|exec|reboot|cut|heal: drive the simulated Thor fleet."""

import argparse
import sys

import docker

from sim import fleet


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="boxes, registry, base image, hub; write inventory")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--inventory", help="where to write the pyinfra inventory "
                                        "(default: <state>/inventory.py)")
    up.add_argument("--gateway", action="store_true",
                    help="also the gateway box gw-1 (SSH 127.0.0.1:22100, HTTPS "
                         "127.0.0.1:28443), in the inventory's group `gateway`")
    up.add_argument("--gateways", type=int, choices=(1, 2), default=None,
                    help="gateway boxes gw-1 and gw-2 (SSH 127.0.0.1:22100 and 22101), both in the "
                         "group `gateway` sharing gateway_virtual_ip, an address of the sim "
                         "network this machine reaches (--gateway is --gateways 1)")
    down = commands.add_parser("down", help="remove boxes, gateway, hub, registry and network")
    down.add_argument("--keep-registry", action="store_true",
                      help="leave the registry and the network up (images still being pushed)")
    commands.add_parser("status", help="each box's SSH port and systemd state; hub and registry")
    bases = commands.add_parser("bases", help="the stand-in vLLM bases, one line each: NAME "
                                "IMAGE@DIGEST VLLM_VERSION (built and pushed when missing)")
    bases.add_argument("names", nargs="*", metavar="NAME", help="only these (default: every base)")
    run = commands.add_parser("exec", help="run a command in a box as root (through Docker)")
    run.add_argument("host")
    run.add_argument("--user", default="root")
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    for name, text in (("reboot", "restart a box and wait for it to boot"),
                       ("cut", "drop SSH packets to a box (connections hang, nothing closes)"),
                       ("heal", "undo cut")):
        commands.add_parser(name, help=text).add_argument("host")
    args = parser.parse_args(argv)

    client = docker.from_env()
    if args.command == "up":
        fleet.up(args.hosts, args.inventory, client=client, gateway=args.gateway,
                 gateways=args.gateways)
    elif args.command == "down":
        fleet.down(client, keep_registry=args.keep_registry)
    elif args.command == "status":
        print("\n".join(fleet.status(client)))
    elif args.command == "bases":
        try:
            built = fleet.bases(client, args.names)
        except ValueError as unknown:
            parser.error(str(unknown))
        for name, ref, version in built:
            print(name, ref, version)
    elif args.command == "exec":
        cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        code, out = fleet.box_exec(client, args.host, cmd, user=args.user, timeout=3600)
        sys.stdout.write(out)
        return code
    else:
        getattr(fleet, args.command)(client, args.host)
    return 0


if __name__ == "__main__":
    sys.exit(main())
