"""`python -m thorfleet client INVENTORY NAME`: everything the operator hands gateway client NAME.

    g = door(inventory, settings, source)   # the gateway's settings, or ClientError with the fix
    found = handout(g, name, source)        # HANDOUT_FIELDS: URL, CA, key file, models, snippet
    text(found)                             # the same for a person (--json prints `found`)
    snippet(url, ca_file, key_file, model)  # OpenAI SDK code reading the key from its file

Read only, on the laptop alone: no host is asked, and nothing is made. A missing key file is the
deploy's to make (laptop.client_keys, as the run's plan reads the keys), as the fleet CA is, so
the handout says so rather than make one here that no door knows yet. The key itself is never
printed, only its file's path: the operator hands the file over, and a key never lands in a
terminal's scrollback.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from thorfleet.settings.schema import key_file

# What --json prints, in this order; text() shows the same.
HANDOUT_FIELDS = ("client", "url", "also", "ca_file", "ca_file_exists", "key_file", "key_file_exists",
                  "models", "snippet")

# The OpenAI SDK's own client class (DefaultHttpxClient, in openai 1 and 3), not httpx's: it keeps
# the SDK's timeouts (10 minutes, where httpx's 5 s cuts a long answer of a Thor) and imports no
# httpx of its own (openai 3 runs on httpx2). The CA goes in as an ssl context: a path given to
# `verify=` is deprecated (httpx 0.28, httpx2). Every value is a Python literal (repr).
SNIPPET = """\
import ssl

import openai

CA_FILE = {ca_file}  # the fleet's CA: the door's certificate is checked against it
KEY_FILE = {key_file}  # this client's key: keep the file 0600

with open(KEY_FILE) as file:
    key = file.read().strip()
http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=CA_FILE))
client = openai.OpenAI(base_url={url}, api_key=key, http_client=http_client)
answer = client.chat.completions.create(
    model={model}, messages=[{{"role": "user", "content": "Hello"}}])
print(answer.choices[0].message.content)
"""


class ClientError(ValueError):
    """No handout for this client: one line naming the inventory and the fix."""


def door(inventory, settings, source):
    """The gateway's settings (the first gateway's: a pair shares one door), or ClientError."""
    from thorfleet.settings.roles import gateways

    found = gateways(inventory)
    if not found:
        raise ClientError(f"{source} has no gateway: clients reach the fleet through its door; "
                          "add a group `gateway` with gateway_clients (docs/gateway.md)")
    return settings[found[0].name].gateway_role


def handout(g, name: str, source) -> dict:
    """{HANDOUT_FIELDS} of client `name` at the door `g`, or ClientError naming the fix."""
    clients = g.gateway_clients or {}
    fix = f"then run `pyinfra {source} deploy.py --limit gateway`"
    if not clients:
        raise ClientError(f"{source}: the gateway has no gateway_clients (its door opens to the "
                          f"fleet's one key): list {name!r} there with its key_file, {fix}")
    if name not in clients:
        raise ClientError(f"{source}: no client {name!r} in gateway_clients (it has "
                          f"{', '.join(sorted(clients))}): add it there, {fix}")
    ca = g.ca_file
    key = str(Path(key_file(clients[name])).expanduser())
    models = g.client_models(name)
    url, *also = g.api_urls
    return {"client": name, "url": url, "also": also, "ca_file": ca, "ca_file_exists": Path(ca).exists(),
            "key_file": key, "key_file_exists": Path(key).exists(), "models": models,
            "snippet": snippet(url, ca, key, models[0])}


def snippet(url: str, ca_file: str, key_file: str, model: str) -> str:
    """Python that asks the door as this client: the key read from its file, the door verified
    against the CA."""
    return SNIPPET.format(url=repr(url), ca_file=repr(ca_file), key_file=repr(key_file),
                          model=repr(model))


def text(found: dict) -> str:
    """The handout for a person: what to hand over, a curl line to try the key, the snippet."""
    lines = [f"client {found['client']}: hand over the CA and key files, and this",
             f"  url       {found['url']}",
             *(f"  or        {url}" for url in found["also"]),
             f"  CA        {found['ca_file']}",
             f"  key file  {found['key_file']}  (hand the file over: the key is never printed)",
             f"  models    {', '.join(found['models'])}"]
    lines += [f"  not yet   {what}: the deploy makes it; run it before handing this over"
              for what, there in (("the fleet CA", found["ca_file_exists"]),
                                  ("its key file", found["key_file_exists"])) if not there]
    curl = (f"curl --cacert {shlex.quote(found['ca_file'])} -H \"Authorization: Bearer "
            f"$(cat {shlex.quote(found['key_file'])})\" {shlex.quote(found['url'] + '/models')}")
    return "\n".join([*lines, "", "Try it (the paths are this laptop's: the client writes its own):",
                      f"  {curl}", "", "OpenAI SDK (Python):", "", found["snippet"]])
