"""`python -m thorfleet client INVENTORY NAME`: what the operator hands a gateway client, read from
the inventory alone, and a snippet that works: run with the real `openai` package against HAProxy
itself on the rendered door, it gets its answer (a 200: the SDK raises on any other).

The edits that break them (each seen failing once): the snippet's `verify=` given the CA's path
(a DeprecationWarning, an error here, as httpx 0.28 and httpx2 deprecate it); `api_urls` without
`/v1` (the door's 404); `client_models` giving the fleet's models, not the client's (the door's
403 to the model the snippet names).
"""

import json
import os
import subprocess
import sys

from tests.fast.test_client_policy import HF_ID, KEYS, MIXED
from tests.fast.test_gateway_render import BOX_KEY, PINS, JsonBox, client_files, running_door
from thorfleet.__main__ import main
from thorfleet.cli.client import HANDOUT_FIELDS, handout


def inventory_file(tmp_path, clients=None, gateway=True):
    """An inventory file of one Thor and (`gateway`) a gateway with `clients` (gateway_clients)."""
    key = tmp_path / "api_key"
    key.write_text(BOX_KEY + "\n")
    key.chmod(0o600)
    thors = ([("thor-1", {"ssh_hostname": "10.0.0.1"})],
             {**PINS, "weights_model_repo": HF_ID, "service_api_key_file": str(key)})
    door = ([("gw-1", {"ssh_hostname": "10.0.0.9"})],
            {"gateway_names": ["thor-gw.lab"], "gateway_ca_dir": str(tmp_path / "ca"),
             **({"gateway_clients": clients} if clients else {})})
    path = tmp_path / "fleet.py"
    path.write_text(f"thors = {thors!r}\n" + (f"gateway = {door!r}\n" if gateway else ""))
    return path


def files_under(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_the_handout_names_the_url_ca_key_file_and_models_and_makes_nothing(tmp_path, capsys):
    files = client_files(tmp_path, alice=KEYS["alice"], bob=None)  # bob's key: the deploy's
    path = inventory_file(tmp_path, {"alice": files["alice"], "bob": {"key_file": files["bob"]}})
    before = files_under(tmp_path)
    assert main(["client", str(path), "alice", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert list(found) == list(HANDOUT_FIELDS)
    ca = str(tmp_path / "ca" / "fleet-ca.pem")
    assert found | {"snippet": None} == {
        "client": "alice", "url": "https://10.0.0.9:8443/v1",  # the report's
        "also": ["https://thor-gw.lab:8443/v1"], "ca_file": ca,
        "ca_file_exists": False, "key_file": files["alice"], "key_file_exists": True,
        "models": ["mistral-small-4"], "snippet": None}
    assert main(["client", str(path), "bob"]) == 0
    said = capsys.readouterr().out
    assert f"  key file  {files['bob']}" in said and "  or        https://thor-gw.lab:8443/v1" in said
    assert "not yet   its key file: the deploy makes it" in said
    assert "not yet   the fleet CA: the deploy makes it" in said
    # read only: no key made, no CA, nothing else on the laptop; and no key shown
    assert files_under(tmp_path) == before
    assert KEYS["alice"] not in json.dumps(found) + said


def test_the_snippet_compiles_and_names_the_ca_the_key_file_and_the_model(tmp_path, capsys):
    files = client_files(tmp_path, alice=KEYS["alice"])
    path = inventory_file(tmp_path, {"alice": files["alice"]})
    assert main(["client", str(path), "alice", "--json"]) == 0
    code = json.loads(capsys.readouterr().out)["snippet"]
    compile(code, "snippet", "exec")
    assert f"CA_FILE = {str(tmp_path / 'ca' / 'fleet-ca.pem')!r}" in code
    assert f"KEY_FILE = {files['alice']!r}" in code and "model='mistral-small-4'" in code
    assert "verify=ssl.create_default_context(cafile=CA_FILE)" in code


def test_an_unknown_client_or_a_door_without_clients_is_one_line_naming_the_fix(tmp_path,
                                                                               capsys):
    files = client_files(tmp_path, alice=KEYS["alice"])
    path = inventory_file(tmp_path, {"alice": files["alice"]})
    assert main(["client", str(path), "mallory"]) == 2
    err = capsys.readouterr().err
    assert err == (f"thorfleet: {path}: no client 'mallory' in gateway_clients (it has alice): add "
                   f"it there, then run `pyinfra {path} deploy.py --limit gateway`\n")
    keyless = inventory_file(tmp_path)
    assert main(["client", str(keyless), "alice"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the gateway has no gateway_clients" in err
    assert "list 'alice' there with its key_file" in err
    doorless = inventory_file(tmp_path, gateway=False)
    assert main(["client", str(doorless), "alice"]) == 2
    assert "has no gateway: clients reach the fleet through its door" in capsys.readouterr().err


def chat_box(model_of=json.loads):
    """vLLM's chat route as the OpenAI SDK reads it: the answer names the model the request
    named; a key other than the boxes' own (the one the door sends) is vLLM's 401."""

    class Box(JsonBox):
        def do_POST(self):
            asked = model_of(self.rfile.read(int(self.headers["Content-Length"])))["model"]
            ok = self.headers["Authorization"] == f"Bearer {BOX_KEY}"
            answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                      "model": asked, "choices": [{"index": 0, "finish_reason": "stop", "message": {
                          "role": "assistant", "content": f"hello from {asked}"}}]}
            self.answer(answer if ok else {"error": {"message": "bad key"}}, 200 if ok else 401)

    return Box


def run_snippet(code):
    """The snippet run as a client runs it: a Python of its own, no proxy between it and the
    door, and a deprecation an error (httpx's `verify=<path>` is one)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    return subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=60, env=env, check=False)


def test_the_snippet_gets_its_answer_from_the_door_with_the_real_openai_sdk(tmp_path):
    files = client_files(tmp_path, alice=KEYS["alice"], ci=KEYS["ci"])
    clients = {"alice": files["alice"],
               "ci": {"key_file": files["ci"], "models": ["mistral-small-4-256k"]}}
    box = chat_box()
    with running_door(tmp_path, thors=2, thor_data=MIXED, gateway_data={"gateway_clients": clients},
                      handlers=[box, box]) as (_, g, _):
        found = handout(g, "ci", "fleet.py")
        assert found["models"] == ["mistral-small-4-256k"]  # its own, not the fleet's two
        ran = run_snippet(found["snippet"])
        assert ran.returncode == 0, ran.stderr[-2000:]
        assert ran.stdout == "hello from mistral-small-4-256k\n"
        # alice may call both: her snippet names the first
        ran = run_snippet(handout(g, "alice", "fleet.py")["snippet"])
        assert ran.stdout == "hello from mistral-small-4\n", ran.stderr[-2000:]
