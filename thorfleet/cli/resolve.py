"""Resolve what an inventory names to what it must pin: a hub ref to a commit, an image tag to a digest.

Runs on the operator's laptop, never on a box. Each failure is a `ResolveError` whose message is one
line naming the repo or image, what the hub or registry said, and the fix.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request

HEX40 = re.compile(r"^[0-9a-f]{40}$")


DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# NVIDIA's Jetson vLLM image for Thor, the recipe's base (a moving tag: pin resolves its digest).
DEFAULT_IMAGE = "ghcr.io/nvidia-ai-iot/vllm:latest-jetson-thor"
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "https://registry-1.docker.io"
# An index first: a multi-arch tag is pinned by its index digest, which `docker pull` accepts.
MANIFEST_ACCEPT = (
    "application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json"
)
TIMEOUT_S = 20


class ResolveError(Exception):
    """One line: what could not be resolved, why, and the fix."""


# --- the hub ---------------------------------------------------------------------------------------


def hub_commit(repo: str, ref: str, endpoint: str | None, token: str | None) -> str:
    """The 40-hex commit `ref` of the model repo `repo` points at, through huggingface_hub's API."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint or constants.ENDPOINT
    # token=False: never fall back to a token stored by `hf auth login` that the boxes will not have.
    api = HfApi(endpoint=endpoint, token=token or False)
    try:
        sha = api.model_info(repo, revision=ref, timeout=TIMEOUT_S).sha
    except GatedRepoError as error:
        raise ResolveError(_hub_auth_message(repo, where, token, error)) from None
    except RevisionNotFoundError:
        raise ResolveError(
            f"{repo}: the hub at {where} has no revision {ref!r} (404): pass --ref with a branch, "
            "tag or commit the repo has"
        ) from None
    except RepositoryNotFoundError as error:
        status = _status(error)
        if status == 401:  # the real hub answers 401 for a repo it will not show an anonymous user
            raise ResolveError(_hub_auth_message(repo, where, token, error)) from None
        raise ResolveError(
            f"{repo}: no such model repo on the hub at {where} ({status or 404}): check the repo "
            "name (weights_model_repo / weights_draft_repo)"
        ) from None
    except OfflineModeIsEnabled:
        raise ResolveError(
            f"{repo}: HF_HUB_OFFLINE is set, so the hub at {where} cannot be asked: unset it to pin"
        ) from None
    except HfHubHTTPError as error:
        status = _status(error)
        if status in (401, 403):
            raise ResolveError(_hub_auth_message(repo, where, token, error)) from None
        raise ResolveError(
            f"{repo}: the hub at {where} answered {status}: {_first_line(error)}"
        ) from None
    except Exception as error:  # noqa: BLE001 - transport errors of whichever HTTP library
        raise ResolveError(
            f"{repo}: cannot reach the hub at {where} ({type(error).__name__}: "
            f"{_first_line(error)}): check weights_hf_endpoint (or HF_ENDPOINT) and the network"
        ) from None
    if not isinstance(sha, str) or not HEX40.match(sha):
        raise ResolveError(f"{repo}: the hub at {where} gave no commit for {ref!r} (got {sha!r})")
    return sha


def _hub_auth_message(repo, where, token, error) -> str:
    status = _status(error) or 401
    if token:
        return (f"{repo}: the hub at {where} refused the token ({status}): put a valid token with "
                "access to this repo in weights_hf_token_file (or export HF_TOKEN)")
    return (f"{repo}: the hub at {where} needs a token ({status}): set weights_hf_token_file to a "
            "file holding your HF token (or export HF_TOKEN)")


def _status(error) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _first_line(error) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# --- registries ----------------------------------------------------------------------------------


def split_image(ref: str) -> tuple[str, str | None, str | None]:
    """(repository as written, tag, digest) of an image reference; tag and digest may be None."""
    name, _, digest = ref.partition("@")
    last = name.rsplit("/", 1)[-1]
    tag = None
    if ":" in last:
        name, _, tag = name.rpartition(":")
    return name, tag, digest or None


def registry_of(repository: str) -> tuple[str, str]:
    """(registry host, repository path on it), as docker reads a name."""
    first, sep, rest = repository.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = DOCKER_HUB, repository
    if host in (DOCKER_HUB, "index.docker.io", "registry-1.docker.io"):
        host = DOCKER_HUB
        if "/" not in path:
            path = f"library/{path}"
    return host, path


def registry_url(host: str, via: dict[str, str] | None = None) -> str:
    """Base URL of a registry's API: `via` maps a registry name to where this laptop reaches it."""
    if via and host in via:
        return via[host].rstrip("/")
    if host == DOCKER_HUB:
        return DOCKER_HUB_API
    bare = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    loopback = bare in ("localhost", "127.0.0.1", "[::1]") or bare.startswith("127.")
    return f"{'http' if loopback else 'https'}://{host}"  # docker, too, allows plain HTTP on loopback


def image_digest(image: str, via: dict[str, str] | None = None) -> str:
    """The sha256 digest a tag points at, from the registry's HTTP API (HEAD on the manifest,
    Docker-Content-Digest), with the anonymous bearer-token flow of ghcr.io and Docker Hub."""
    repository, tag, digest = split_image(image)
    if digest:
        raise ResolveError(f"{image}: already pinned by digest (nothing to resolve)")
    tag = tag or "latest"
    host, path = registry_of(repository)
    base = registry_url(host, via)
    url = f"{base}/v2/{path}/manifests/{urllib.parse.quote(tag)}"
    headers = {"Accept": MANIFEST_ACCEPT}
    where = host + (f" (via {base})" if via and host in via else "")
    status, reply_headers, body = _request("HEAD", url, headers, image, where)
    if status == 401:
        token = _bearer_token(reply_headers.get("WWW-Authenticate", ""), path, image, where)
        if token:
            headers["Authorization"] = f"Bearer {token}"
            status, reply_headers, body = _request("HEAD", url, headers, image, where)
    if status in (401, 403):
        raise ResolveError(
            f"{image}: the registry {where} refused an anonymous pull ({status}): the image is "
            "private or the name is wrong; check image_base's repository, or make it public")
    if status == 404:
        raise ResolveError(
            f"{image}: the registry {where} has no tag {tag!r} in {path} (404): check image_base's "
            "repository and tag")
    if status != 200:
        raise ResolveError(f"{image}: the registry {where} answered {status} for the manifest")
    found = reply_headers.get("Docker-Content-Digest")
    if not found:  # some registries only send it on GET: hash the manifest bytes ourselves
        status, reply_headers, body = _request("GET", url, headers, image, where)
        found = reply_headers.get("Docker-Content-Digest") or (
            "sha256:" + hashlib.sha256(body).hexdigest() if status == 200 else None)
    if not found or not DIGEST.match(found):
        raise ResolveError(f"{image}: the registry {where} gave no usable digest (got {found!r})")
    return found


def pinned_image(image: str, digest: str) -> str:
    """The repository exactly as the operator wrote it, by digest: the tag moves, the digest not."""
    repository, _, _ = split_image(image)
    return f"{repository}@{digest}"


def _request(method, url, headers, image, where):
    request = urllib.request.Request(url, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as reply:
            return reply.status, reply.headers, reply.read() if method == "GET" else b""
    except urllib.error.HTTPError as error:
        return error.code, error.headers, b""
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ResolveError(
            f"{image}: cannot reach the registry {where} ({reason}): check the network, or "
            "--via REGISTRY=URL if this machine reaches it at another address") from None


def _bearer_token(challenge: str, path: str, image: str, where: str) -> str | None:
    """The anonymous pull token of `WWW-Authenticate: Bearer realm=...,service=...,scope=...`."""
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", None)
    if not realm:
        return None
    params.setdefault("scope", f"repository:{path}:pull")
    url = f"{realm}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
            answer = json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError:
        return None  # no anonymous token: the manifest request says 401 below
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise ResolveError(
            f"{image}: cannot get a pull token from {realm} for {where} ({error})") from None
    return answer.get("token") or answer.get("access_token")
