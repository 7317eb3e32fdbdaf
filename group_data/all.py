"""Every thorfleet tunable, with its default. Override per fleet in your inventory's group data.

One line of comment per key; docs/settings.md's table is checked against this file by a test.
"""

import os

# --- ssh: how the laptop reaches the boxes ------------------------------------------------------
ssh_strict_host_key_checking = "yes"  # refuse unknown or changed host keys (pyinfra's own default accepts new ones)
ssh_keepalive_interval_s = 30  # SSH keepalive while a restart is proven, so NAT keeps the idle session

# --- preflight: refuse boxes that cannot run the model -------------------------------------------
preflight_min_l4t_release = "38.0"  # oldest L4T release accepted, from /etc/nv_tegra_release (JetPack 7)
preflight_min_memory_gib = 100  # least total memory (MemTotal) a box must have; a Thor has ~122 GiB
preflight_min_free_disk_gib = 100  # least free disk under weights_dir for weights (~71 GB) and image
preflight_lock_wait_s = 0  # how long a run waits for another thorfleet run holding a box (0: stop at once)

# --- power: nvpmodel mode and locked clocks -------------------------------------------------------
power_mode = 1  # nvpmodel mode; on the T5000 0=MAXN, 1=120W (the recipe's), 2=90W, 3=70W
power_allow_reboot = False  # allow a reboot when the mode needs one (2 and 3); otherwise fail clearly
power_reboot_timeout_s = 900  # how long to wait for a box to come back from that reboot

# --- memory: the page-cache gate run before every start of the server ----------------------------
memory_min_available_gib = None  # MemAvailable a start needs; None: gpu_memory_utilization x MemTotal + margin
memory_gate_margin_gib = 7  # derived gate's headroom: 0.72 x 122 + 7 = 94.8 GiB, the recipe's 95
memory_gate_timeout_s = 300  # give up waiting for the page cache to drain after this long
memory_gate_interval_s = 5  # seconds between drop_caches attempts

# --- weights: huggingface_hub downloads on the box ----------------------------------------------
weights_dir = "/opt/thorfleet/models"  # where checkpoints live on the box, one folder per revision
weights_model_repo = "mistralai/Mistral-Small-4-119B-2603-NVFP4"  # the NVFP4 checkpoint (~71 GB)
weights_model_revision = None  # REQUIRED: 40-hex commit of the checkpoint to serve (pin it)
weights_draft_repo = "mistralai/Mistral-Small-4-119B-2603-eagle"  # the EAGLE-3 draft (~0.4 GB)
weights_draft_revision = None  # REQUIRED: 40-hex commit of the draft to serve (pin it)
weights_hf_endpoint = os.environ.get("HF_ENDPOINT")  # hub or site mirror the boxes download from
weights_hf_allow_plain_http = False  # allow an http:// weights_hf_endpoint with a token: the token and the code the model runs (trust_remote_code) then travel unencrypted
weights_hf_token_file = None  # laptop path of a file holding HF_TOKEN (else env HF_TOKEN); never logged
weights_source = "auto"  # hub: every box downloads; fleet: the run's first box does, the others copy from boxes that have it (rsync over SSH); auto: fleet for 2+ hosts
weights_peer_address = None  # host[:port] the other boxes reach this one at over SSH, the gateway at its host (None: its ssh_hostname)
weights_progress_interval_s = 10  # seconds between the progress lines of a weights transfer (done, rate, time left)
weights_peer_key_file = "~/.config/thorfleet/peer_ed25519"  # laptop path of the boxes' shared copy key (may only read weights_dir); made when missing

# --- image: the derived vLLM image with the chat patches ----------------------------------------
image_base = None  # REQUIRED: base vLLM image pinned by digest, e.g. ghcr.io/nvidia-ai-iot/vllm@sha256:…
image_name = "thorfleet/mistral-small4"  # local name of the derived image; the tag is a hash of its inputs
image_registry = None  # registry the image is shared through: the run's first host builds and pushes, the others pull (None: see image_source)
image_source = "auto"  # without image_registry: fleet: the run's first box builds, the others load it from that box over SSH (docker save | docker load); build: every box builds its own; auto: fleet for 2+ hosts
image_peer_key_file = "~/.config/thorfleet/image_ed25519"  # laptop path of the boxes' image-copy key (may only docker-save thorfleet's derived image from another box); made when missing
image_think_prefill = True  # open [THINK] for reasoning_effort=high (this checkpoint does not by itself)

# --- service: the systemd-supervised vLLM container ----------------------------------------------
service_name = "thorfleet-vllm"  # systemd unit and container name
service_profile = "default"  # what the box serves, under its model name: "default" (mistral-small-4: EAGLE-3, 64K), "no-eagle" (mistral-small-4-256k), "throughput" (mistral-small-4-batch: 8 at once, 32K), "vision" (mistral-small-4-vision: images, 64K); may differ per host
service_images_per_prompt = 4  # vision profile: most images in one prompt (vLLM's limit_mm_per_prompt); each takes up to 3,080 tokens of the 64K context
service_media_domains = []  # vision profile: domains a box may fetch image URLs from, whole names (none: data: URLs only, the box fetches nothing)
service_prefix_caching = None  # vLLM's prefix caching (a prompt's start seen before is not computed again): True, False, or None for the profile's (on, but off for vision: docs/workloads.md)
service_host = None  # listen address; None: 0.0.0.0 with an API key, 127.0.0.1 without one
service_port = 8002  # port vLLM listens on
service_gpu_memory_utilization = 0.72  # share of unified memory vLLM may take (~96 GB on a Thor)
service_api_key_file = None  # laptop path of a file holding the API key (else env THORFLEET_API_KEY)
service_allow_no_api_key = False  # explicitly serve without an API key (then binds 127.0.0.1 unless set)
service_health_timeout_s = 1200  # how long a (re)start may take to answer /health (the recipe waits 20 min)
service_docker_gpus = "all"  # value of docker run --gpus
service_docker_ulimits = {"memlock": "-1", "stack": "67108864"}  # docker run --ulimit, as the recipe runs it
service_extra_env = {}  # extra environment for the container, merged over the recipe's (thorfleet/settings/recipe.py)

# --- rollout: how a fleet is converged -----------------------------------------------------------
rollout_batch = 1  # hosts restarted at once; each batch must serve before the next starts
rollout_canary_group = None  # inventory group restarted (and proven) before everyone else
rollout_drain_timeout_s = 120  # before a restart, wait this long for answers in flight; vLLM's shutdown_timeout too
rollout_benchmark = "first-install"  # benchmark after the proof: on a first install, always or never
rollout_bench_min_fraction = 0.8  # a host below this share of the fleet's median tok/s fails the run
rollout_bench_min_toks = 27  # a host below this many tok/s fails the run (a Thor: 33.7 EAGLE, 17.5 base)
rollout_report_path = "thorfleet-report.json"  # laptop path of the JSON report of the last run

# --- watchdog: proves between runs that each box generates (files/bin/thorfleet-watchdog) -------
watchdog_interval_s = 15  # seconds between two checks of the server
watchdog_failures = 3  # failed checks in a row before the watchdog restarts
watchdog_timeout_s = 20  # a 1-token completion must finish within this
watchdog_restart_backoff_s = 60  # wait after a restart before the next one may happen; doubles with each restart in the last hour
watchdog_max_restarts_per_hour = 3  # past it, no restart; the box is reported failed
watchdog_give_up_after = 6  # restarts in a row with no check passing: then none until one passes (you or a deploy restart it); the box is reported failed
watchdog_start_timeout_s = 1800  # a started server gets this long to answer /health before the watchdog judges it
watchdog_port = 9105  # the box exporter's port (/metrics, /healthy)

# --- gateway: one HTTPS endpoint in front of the boxes (the inventory group `gateway`) ---------
gateway_serves_model = False  # the gateway host is also a Thor that serves the model (False: a box of its own)
gateway_port = 8443  # HTTPS port clients use on the gateway
gateway_names = []  # more names or addresses clients use for the gateway (its inventory address is one)
gateway_tls_cert_file = None  # laptop path of your certificate chain for the gateway (None: the fleet CA signs one)
gateway_tls_key_file = None  # laptop path of that certificate's private key (chmod 600); never logged
gateway_ca_dir = "~/.config/thorfleet/fleet-ca"  # laptop folder of the fleet CA (made once; clients trust its fleet-ca.pem)
gateway_fleet_address = None  # IP address the boxes see the gateway connect from (None: its ssh_hostname)
gateway_virtual_ip = None  # address/prefix clients use when the group `gateway` has two hosts, held by one at a time (keepalived), like 192.168.1.50/24
gateway_vrrp_router_id = 51  # VRRP id of the two gateways' address, unique among VRRP routers on their LAN
gateway_clients = None  # {client name: laptop path of its key file (chmod 600, made when missing), or a dict of key_file and any of max_inflight, requests_per_minute, tokens_per_minute, tokens_per_day, tokens_per_month, models, priority}: only these keys open the door (None: the fleet's one key, service_api_key_file)
gateway_client_max_inflight = 4  # with gateway_clients: most requests one client has at the door at once (answering or queued), unless its own max_inflight says; over it, 429
gateway_client_requests_per_minute = 120  # with gateway_clients: most requests one client starts in any minute, unless its own requests_per_minute says; over it, 429
gateway_client_tokens_per_minute = None  # with gateway_clients: most tokens (prompt + completion) one client spends in any 60 s, unless its own tokens_per_minute says; over it, 429 until it frees (None: no budget)
gateway_client_tokens_per_day = None  # with gateway_clients: most tokens (prompt + completion) one client spends in a UTC day, unless its own tokens_per_day says; over it, 429 until 00:00 UTC (None: no budget)
gateway_client_tokens_per_month = None  # with gateway_clients: most tokens (prompt + completion) one client spends in a UTC calendar month, unless its own tokens_per_month says; over it, 429 until the 1st (None: no budget)
gateway_queue_timeout_s = 120  # how long a request waits at the gateway for a free box before a 503 (a pool whose longest prefill is longer waits that: the 256K pool 300 s)
gateway_retry_after_s = 5  # seconds a client is told to wait (Retry-After) when no box was free in time
gateway_check_interval_s = 2  # seconds between the gateway's health checks of each box
gateway_affinity_balance_factor = 150  # the load bound of a conversation's home, in percent of the mean: the gateway sends each later turn of a conversation (X-Session-Token, else its client and first messages) to the box that answered the turn before while that box holds under this share of the mean of its pool's requests and has a free slot (None: off, the least busy box)

# --- monitor: Prometheus on the gateway host (or the inventory group `monitor`) -----------------
monitor_scrape_interval_s = 15  # seconds between two scrapes of every box by Prometheus (and between rule evaluations)
monitor_fleet_address = None  # IP address the boxes see a monitor host of its own connect from (None: its ssh_hostname)
monitor_retention = "15d"  # how long Prometheus keeps samples (its duration: 15d, 12h, 1w2d)
