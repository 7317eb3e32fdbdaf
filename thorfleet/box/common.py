"""What thorfleet's programs on a Thor all need (stdlib only): the layout file the deploy writes,
the API key from the box's root-only secrets file, and a request to the local vLLM server.

In the package beside them (`thorfleet_box.common`, layout.BOX_LIB), where `python3 <program>`
finds it: thorfleet-serve, thorfleet-watchdog and thorfleet-bench import it.
"""

import json
import sys
import urllib.request
from pathlib import Path


def read_layout(path, program, required=()):
    """{KEY: value} of the layout file (KEY=value lines, # comments). With `required` keys, exits
    naming the file and the fix when it is missing or lacks one; without, {} when unreadable."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        if not required:
            return {}
        sys.exit(f"{program}: cannot read the layout {path} ({error.strerror}): run the deploy, "
                 "which writes it")
    found = dict(line.split("=", 1) for line in lines
                 if "=" in line and not line.lstrip().startswith("#"))
    missing = [key for key in required if not found.get(key)]
    if missing:
        sys.exit(f"{program}: {path} lacks {', '.join(missing)}: run the deploy again")
    return found


def api_key(secrets):
    """VLLM_API_KEY from the secrets file (systemd's EnvironmentFile), or None."""
    try:
        for line in Path(secrets).read_text().splitlines() if secrets else ():
            if line.startswith("VLLM_API_KEY="):
                return line.split("=", 1)[1]
    except OSError:
        pass
    return None


def request_to(url, key=None, body=None):
    """A JSON request to vLLM, the key as a header (never on a command line or in the journal)."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    return urllib.request.Request(url, data=data, headers=headers)


def local_request(port, path, key=None, body=None, timeout=20):
    """(status, text) of one request to the server on this box's port."""
    req = request_to(f"http://127.0.0.1:{port}{path}", key, body)
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.status, response.read().decode()
