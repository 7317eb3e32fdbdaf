"""The stand-in model hub: tiny repos under the real names, served the way huggingface.co serves
them, with run-time fault knobs.

    build_repos(dest_dir, tekken_json=None) -> {repo_id: pinned revision}
    repo_revisions(dest_dir)                -> {repo_id: [revisions, oldest first]}
    start(client, network, state_dir, rootfs_ref, *, token=None, tekken_json=None) -> endpoints
    stop(client); set_token(state_dir, token)
    HubFaults(endpoint)                     -> cut / bad-sha / slow / 401 / 404 at run time
    server.py                               -> the server itself (stdlib only)
"""

from sim.hub.container import CONTAINER, set_token, start, stop
from sim.hub.faults import HubFaults
from sim.hub.repos import DRAFT_REPO, MODEL_REPO, build_repos, repo_revisions

__all__ = [
    "CONTAINER",
    "DRAFT_REPO",
    "MODEL_REPO",
    "HubFaults",
    "build_repos",
    "repo_revisions",
    "set_token",
    "start",
    "stop",
]
