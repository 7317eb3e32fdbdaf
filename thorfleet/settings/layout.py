"""Where things live: on the laptop (this checkout) and on the box.

The one Python file that spells the box's paths; everything else imports them from here.
(The schema's default weights_dir is BOX_MODELS itself.)
"""

from pathlib import Path

# --- the laptop: this checkout ----------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "files"  # what thorfleet ships, one folder for each place it lands:
THOR_FILES = FILES / "thor"  # a Thor's programs (bin/), units (systemd/) and vLLM config
GATEWAY_FILES = FILES / "gateway"  # a gateway's templates, programs (bin/) and units (systemd/)

# --- the box ------------------------------------------------------------------------------------
BOX_HOME = "/opt/thorfleet"
BOX_BIN = f"{BOX_HOME}/bin"
BOX_MEMORY_GATE = f"{BOX_BIN}/memory-gate"  # the unit's ExecStartPre
BOX_SERVE = f"{BOX_BIN}/thorfleet-serve"  # start, prove, roll back (system python3)
BOX_PROOF_IMAGE = f"{BOX_BIN}/thorfleet-proof.png"  # the picture thorfleet-serve proves a vision box with
BOX_WEIGHTS = f"{BOX_BIN}/thorfleet-weights"  # verify (system python3), fetch (in the image)
BOX_CLEAN = f"{BOX_BIN}/thorfleet-clean"  # what old revisions, images and build contexts to remove
BOX_BENCH = f"{BOX_BIN}/thorfleet-bench"  # the recipe's decode benchmark (system python3)
# Proves between runs that the server generates, restarts it when wedged, exports the box's figures
# (system python3).
BOX_WATCHDOG = f"{BOX_BIN}/thorfleet-watchdog"
# What the box programs share (thorfleet/box/: the layout file, the API key, a local request, the
# readings' parsers, the token counter), one package beside them: `import thorfleet_box` finds it.
BOX_LIB = f"{BOX_BIN}/thorfleet_box"
# Where releases before the package installed those files, one by one: each run removes them.
BOX_FORMER_LIB = tuple(f"{BOX_BIN}/{name}" for name in (
    "thorfleet_box.py", "thorfleet_readings.py", "thorfleet_usage.py"))
WATCHDOG_UNIT = "thorfleet-watchdog.service"
WATCHDOG_SOCKET = "thorfleet-watchdog.socket"  # its port, held across its restarts
BOX_IMAGE_CONTEXT = f"{BOX_HOME}/image"  # one build context per image inputs hash
BOX_MODELS = f"{BOX_HOME}/models"  # the default weights_dir
# Inside the derived image, not on the box: where files/image/Dockerfile copies chatfix and the
# reasoning parser plugin the rendered config names.
IMAGE_HOME = "/opt/thorfleet/image"
BOX_ETC = "/etc/thorfleet"
BOX_CONFIG_DIR = f"{BOX_ETC}/vllm"  # mounted into the container as /config
BOX_CONFIG = f"{BOX_CONFIG_DIR}/vllm.yaml"
BOX_SECRETS_ENV = f"{BOX_ETC}/secrets.env"  # VLLM_API_KEY, root-only
BOX_HF_TOKEN = f"{BOX_ETC}/hf_token"
BOX_LAYOUT_ENV = f"{BOX_ETC}/layout.env"  # where thorfleet-serve reads the paths below from
BOX_VLLM_CACHE = "/var/cache/thorfleet/vllm"  # vLLM's compile cache, kept across restarts
BOX_STATE = "/var/lib/thorfleet"  # proven fingerprint, last-good copies, serve.lock
# Each client's tokens: the server's journal of its answers' usage (thorfleet/box/usage.py, vLLM's
# middleware, mounted into the container at the same path with this code beside it).
BOX_USAGE_DIR = f"{BOX_STATE}/usage"
BOX_USAGE_CODE = f"{BOX_LIB}/usage.py"  # mounted as thorfleet_usage.py; the watchdog's GET /usage
IMAGE_USAGE_HOME = "/opt/thorfleet/usage"  # where the container finds it (its PYTHONPATH)
# the counter's name there, the module vllm.yaml's `middleware` names (thorfleet_usage.Usage)
IMAGE_USAGE_CODE = f"{IMAGE_USAGE_HOME}/thorfleet_usage.py"
# thorfleet-serve's copy of the last good version's unit (STATE_DIR/last-good/unit): what a
# roll-back starts, so disk hygiene keeps the weights and image it names.
BOX_LAST_GOOD_UNIT = f"{BOX_STATE}/last-good/unit"
BOX_UNIT_DIR = "/etc/systemd/system"
# The fleet copy of the weights: boxes read each other's weights_dir over SSH as PEER_USER, whose
# one authorized key may only run `rrsync -ro <weights_dir>`.
PEER_USER = "thorfleet-peer"
# Not under BOX_STATE: that is root-only, and sshd reads authorized_keys as the user.
BOX_PEER_HOME = "/var/lib/thorfleet-peer"
BOX_PEER_KEY = f"{BOX_ETC}/peer_key"  # the fleet's box-to-box private key, root-only
BOX_PEER_KNOWN_HOSTS = f"{BOX_STATE}/peer_known_hosts"  # peers' host keys, as the laptop knows them
# The fleet copy of the derived image: the boxes load it from the run's first box as IMAGE_USER,
# whose one authorized key may only run BOX_IMAGE_TOOL's `serve` (a `docker save` of a derived
# image, through the one sudo rule in BOX_IMAGE_SUDOERS). A key and user of their own: the weights
# copy key stays read-only on weights_dir.
BOX_IMAGE_TOOL = f"{BOX_BIN}/thorfleet-image"
IMAGE_USER = "thorfleet-image"
BOX_IMAGE_HOME = "/var/lib/thorfleet-image"
BOX_IMAGE_KEY = f"{BOX_ETC}/image_key"  # the boxes' image-copy private key, root-only
BOX_IMAGE_SUDOERS = "/etc/sudoers.d/thorfleet-image"
BOX_MANIFESTS = f"{BOX_STATE}/manifests"  # the hub's file list of each pinned revision
RRSYNC = "/usr/bin/rrsync"  # rsync's own restricted-rsync wrapper (Debian and Ubuntu ship it)
BOX_REBOOT_MARKER = "/run/thorfleet-before-reboot"  # /run is emptied by every boot
# The run lock (files/thor/bin/thorfleet-run-lock, sent with the command that takes it, so a bare box
# is held too); on tmpfs: a reboot frees it with the keeper that held it.
BOX_RUN_LOCK_DIR = "/run/thorfleet"
# The watchdog's last check, rewritten after each (what its `status` and exporter read); on tmpfs,
# beside the run lock it tests.
BOX_WATCHDOG_STATE = f"{BOX_RUN_LOCK_DIR}/watchdog.json"
BOX_UPLOAD_STAGING = ".thorfleet-upload"  # in the SSH user's home: uploads wait here, 0700
CLOCKS_UNIT = "thorfleet-clocks.service"
# With a gateway: the Thor's nftables table (the vLLM port answers the gateway and the box only),
# loaded at boot by its own unit.
BOX_FIREWALL = f"{BOX_ETC}/firewall.nft"
FIREWALL_UNIT = "thorfleet-firewall.service"
# Debian's (and Ubuntu's) ruleset, which `systemctl start|reload nftables` and `nft -f` by hand
# load, `flush ruleset` first: with a gateway it ends by including BOX_FIREWALL, so that load
# puts thorfleet's table back in the same transaction (no moment with the port open).
SYSTEM_RULESET = "/etc/nftables.conf"
RULESET_INCLUDE = f'include "{BOX_FIREWALL}"'
# The table as nft listed it once loaded (its digest, written by the firewall unit): a listing
# that differs later is a table edited by hand.
BOX_FIREWALL_LISTED = f"{BOX_STATE}/firewall.listed"
FIREWALL_DROPIN = "thorfleet-firewall.conf"  # in the server's <service_name>.service.d
START_LIMIT_DROPIN = "thorfleet-start-limit.conf"  # there too: its restarts an hour, at most
FIREWALL_TABLE = ("inet", "thorfleet")
FETCH_CONTAINER = "thorfleet-fetch"  # the weights fetch's containers: thorfleet-fetch-<revision>
# Every name thorfleet gives a unit, a container or a user on a box besides the server's own: the
# server (service_name) may take none of them, since its unit file and `docker rm -f` would
# replace theirs. tests/fast/test_settings.py holds it to files/*/systemd and the names above.
BOX_OWN_NAMES = (CLOCKS_UNIT.removesuffix(".service"), FIREWALL_UNIT.removesuffix(".service"),
                 WATCHDOG_UNIT.removesuffix(".service"), FETCH_CONTAINER, PEER_USER, IMAGE_USER,
                 "thorfleet-door-usage")  # GATEWAY_DOOR_USAGE_UNIT's: a Thor may be the gateway

# --- the gateway (Debian's haproxy package) ------------------------------------------------------
GATEWAY_CONFIG = "/etc/haproxy/haproxy.cfg"  # the package's unit reads this one
GATEWAY_PEM = "/etc/haproxy/thorfleet/gateway.pem"  # certificate chain and key, root-only
GATEWAY_CLIENTS_MAP = "/etc/haproxy/thorfleet/clients.map"  # SHA-256 of each client key -> its name
GATEWAY_BOX_KEY_MAP = "/etc/haproxy/thorfleet/box-key.map"  # the key the door sends the boxes
# Each client's own policy (gateway_clients), keyed by its name as the clients map gives it:
GATEWAY_INFLIGHT_MAP = "/etc/haproxy/thorfleet/client-inflight.map"  # -> its max_inflight
GATEWAY_RATE_MAP = "/etc/haproxy/thorfleet/client-rate.map"  # -> its requests_per_minute
GATEWAY_CLASS_MAP = "/etc/haproxy/thorfleet/client-class.map"  # -> its priority's queue class
GATEWAY_POOLS_MAP = "/etc/haproxy/thorfleet/client-pools.map"  # "<client>:<pool>" it may call -> 1
GATEWAY_MODELS_MAP = "/etc/haproxy/thorfleet/client-models.map"  # -> its /v1/models answer
GATEWAY_ADMIN_SOCKET = "/run/haproxy/admin.sock"  # the runtime API: drain, ready, sessions
GATEWAY_SERVER_STATE = "/var/lib/haproxy/server-state"  # the boxes' states HAProxy starts with
GATEWAY_STATE_LOCK = f"{GATEWAY_SERVER_STATE}.lock"  # held while a state is set and saved
GATEWAY_STATE_DROPIN = f"{BOX_UNIT_DIR}/haproxy.service.d/thorfleet-state.conf"
GATEWAY_ROTATION = "/usr/local/sbin/thorfleet-rotation"  # drain/ready a box through that API
GATEWAY_DOOR_USAGE = "/usr/local/sbin/thorfleet-door-usage"  # each client's counts (gateway_clients)
GATEWAY_DOOR_USAGE_UNIT = "thorfleet-door-usage.service"  # ...served to Prometheus on loopback
GATEWAY_DOOR_USAGE_LISTEN = ("127.0.0.1", 9106)  # files/gateway/systemd/thorfleet-door-usage.service
# Its config (gateway_clients' token budgets, the boxes it asks for their counts), written by the
# deploy; its state: each box's last good answer, and the budget map it keeps HAProxy's runtime
# copy and this file of (a client over a budget -> "<frees epoch>:<budget>:<tokens>"). State,
# not config: rewritten as clients spend, never by the deploy, which makes it empty when missing.
GATEWAY_DOOR_USAGE_CONFIG = f"{BOX_ETC}/door-usage.json"
GATEWAY_DOOR_USAGE_STATE = f"{BOX_STATE}/door-usage"
GATEWAY_BUDGET_MAP = f"{GATEWAY_DOOR_USAGE_STATE}/budget.map"
# The door tells each box which client asks (its name, or FLEET_CLIENT without gateway_clients),
# replacing any a client sent: the boxes count tokens per client by it.
GATEWAY_CLIENT_HEADER = "X-Thorfleet-Client"
# What the door adds to each box's answer: the box that gave it, and how long the request waited
# at the door for one of its slots (milliseconds, HAProxy's %Tw): what a client's latency is made of.
GATEWAY_BOX_HEADER = "X-Thorfleet-Box"
GATEWAY_QUEUED_HEADER = "X-Thorfleet-Queued-Ms"
GATEWAY_BACKEND = "thors"  # HAProxy's backend of the Thors' vLLM ports
GATEWAY_CLIENT_TABLE = "clients"  # HAProxy's stick table of each client's requests (gateway_clients)
GATEWAY_SHARE_TABLE = "client-pools"  # ...and of its requests at the door per pool (fair shares)
# HAProxy's peers section of the clients table: at a reload the old process hands its rows to the
# new one at the local peer's address, so no client's counts start again (two gateways: the other's
# too). The port is the local peer's, on loopback alone (two gateways: on each one's own address).
GATEWAY_PEERS = "door"
GATEWAY_PEERS_PORT = 9108
# --- two gateways, one address (gateway_virtual_ip: Debian's keepalived package) -----------------
KEEPALIVED_CONFIG = "/etc/keepalived/keepalived.conf"  # the package's unit reads this one
KEEPALIVED_UNIT = "keepalived.service"
GATEWAY_LEVEL = "/etc/haproxy/thorfleet/level"  # "<since> <digest>" of what the last run set here
GATEWAY_LEVEL_PORT = 9107  # HAProxy answers the other gateway with this gateway's level there
GATEWAY_PEER_LEVEL = "/var/lib/thorfleet/peer-level"  # the other gateway's level, as last read
GATEWAY_DOOR_CHECK = "/usr/local/sbin/thorfleet-door-check"  # keepalived's check: HAProxy, level


def box_unit(service):
    """The systemd unit file of `service` on the box."""
    return f"{BOX_UNIT_DIR}/{service}.service"


def layout_env_text():
    """The box's /etc/thorfleet/layout.env: thorfleet-serve's and the watchdog's paths, one
    KEY=value a line.

    The box scripts spell none of the paths above; thorfleet-serve and thorfleet-watchdog read
    these (each tool's only built-in path is BOX_LAYOUT_ENV, the place it looks, and each ignores
    the keys it does not need; tests hold them to each other), and thorfleet-weights and
    memory-gate take theirs as arguments. RUN_DIR holds the run lock (thorfleet-run-lock) and the
    watchdog's state (BOX_WATCHDOG_STATE).
    """
    paths = {
        "STATE_DIR": BOX_STATE,
        "CONFIG": BOX_CONFIG,
        "SECRETS_ENV": BOX_SECRETS_ENV,
        "UNIT_DIR": BOX_UNIT_DIR,
        "RUN_DIR": BOX_RUN_LOCK_DIR,
        "USAGE_DIR": BOX_USAGE_DIR,
    }
    return ("# Managed by thorfleet (thorfleet/settings/layout.py): where the box's tools find their files.\n"
            + "".join(f"{key}={value}\n" for key, value in paths.items()))
