"""What thorfleet reads from a box or a gateway before deciding what to change, and what `thorfleet
doctor` reads: one package, by domain, as pyinfra's own facts are (pyinfra.facts.server, .files,
...). The deploy and doctor read the same classes, and no command is read by two of them.

Each fact is one command; every value put into it is quoted (shlex.quote), the box's paths come
from settings/layout.py. As pyinfra's own facts do, a fact says what it returns in its type, and
marks absence by printing nothing: pyinfra then gives the fact's `default()` (None unless said
otherwise), and a command the box lacks is named in `requires_command`.

    facts.box       the box: L4T, memory, disk, swap and page cache, Docker, sudo, temperatures
    facts.power     nvpmodel's mode and modes, the clocks
    facts.system    files, folders, units, users, packages
    facts.serving   the weights, the image, the server (thorfleet-serve's and the watchdog's JSON)
    facts.gateway   HAProxy, keepalived, the gateway's level, the firewall's mark
    facts.lock      the run lock (the one fact that takes something: see there why)
"""

from thorfleet.facts import box, gateway, lock, power, serving, system  # noqa: F401 - facts.<domain>
