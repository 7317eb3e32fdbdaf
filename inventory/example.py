"""An example inventory for a real fleet: copy it, uncomment and fill in your boxes.

    pyinfra inventory/my-fleet.py deploy.py

Every module-level list is a group; the group data below beats group_data/all.py's defaults.
Secrets are never written here: point at files on the laptop (or export THORFLEET_API_KEY / HF_TOKEN).
A gateway in front of the boxes is one more group, `gateway` (docs/gateway.md); README.md's "A first real fleet" has a complete one.
"""

thors = (
    [
        # ("thor-01", {"ssh_hostname": "10.0.0.21"}),
        # ("thor-02", {"ssh_hostname": "10.0.0.22"}),
        # ("thor-03", {"ssh_hostname": "10.0.0.23"}),
        # ("thor-04", {"ssh_hostname": "10.0.0.24"}),
    ],
    {
        "ssh_user": "ubuntu",  # an ordinary user with passwordless sudo
        "ssh_key": "~/.ssh/id_ed25519",
        # Host keys are checked: collect them once with `ssh-keyscan`, then keep "yes" here.
        "ssh_known_hosts_file": "~/.ssh/known_hosts",
        "ssh_strict_host_key_checking": "yes",
        # Pin what you serve: the base image by digest, the weights by commit.
        # "image_base": "ghcr.io/nvidia-ai-iot/vllm@sha256:<digest of latest-jetson-thor you tested>",
        # "weights_model_revision": "<40-hex commit of Mistral-Small-4-119B-2603-NVFP4>",
        # "weights_draft_revision": "<40-hex commit of Mistral-Small-4-119B-2603-eagle>",
        "service_api_key_file": "~/.config/thorfleet/api_key",  # chmod 600; never logged
        # "weights_hf_token_file": "~/.config/thorfleet/hf_token",
        # "weights_hf_endpoint": "http://hf-mirror.example.internal",  # a site mirror, if any
    },
)

# The gateway: one HTTPS address with the API key in front of the Thors (docs/gateway.md). A
# small Debian or Ubuntu box with passwordless sudo that reaches its distribution's package
# mirror (HAProxy, nftables, Prometheus come from there). The group's name must be exactly
# `gateway`. List your team in gateway_clients before the first deploy opens the door: a key each
# (the deploy makes the files). `python -m thorfleet client INVENTORY NAME` prints what to hand a
# client: https://<a gateway_names entry>:8443/v1, the fleet CA
# (~/.config/thorfleet/fleet-ca/fleet-ca.pem), its key file, and its model names ("mistral-small-4").
gateway = (
    [
        # ("thor-gw", {"ssh_hostname": "10.0.0.20"}),
    ],
    {
        "ssh_user": "ubuntu",
        "ssh_key": "~/.ssh/id_ed25519",
        "ssh_known_hosts_file": "~/.ssh/known_hosts",
        "ssh_strict_host_key_checking": "yes",
        # "gateway_names": ["thor-gw.lab"],  # the names clients use, beside its address
        # "gateway_clients": {"me": "~/.config/thorfleet/clients/me.key",  # a name: a-z first,
        #                     "alice": "~/.config/thorfleet/clients/alice.key"},  # a-z 0-9 - _
    },
)
