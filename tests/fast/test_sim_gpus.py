"""The sim's stand-ins for `--gpus` on a Thor (sim/box/files: nvidia-container-runtime and
nvidia-container-runtime-hook), on temporary bundles: what a Thor's runtime and hook accept and
refuse, as their docstrings cite it from nvidia-container-toolkit. The edits that break them: the
hook exiting 0 for any request (as it once did), the runtime taking any device id, the runtime
leaving Docker's hook in the spec (then `--runtime nvidia --gpus all` would be refused too).
"""

import json
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[2] / "sim" / "box" / "files"
HOOK = {"path": "/usr/bin/nvidia-container-runtime-hook",
        "args": ["nvidia-container-runtime-hook", "prestart"]}
OTHER_HOOK = {"path": "/usr/bin/some-other-hook", "args": ["some-other-hook"]}


@pytest.fixture(scope="module")
def runtime():
    loader = SourceFileLoader("nvidia_runtime_standin", str(FILES / "nvidia-container-runtime"))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def bundle(tmp_path, devices):
    """A bundle whose spec is what dockerd writes for `--gpus`: the env and its prestart hook."""
    env = ["PATH=/usr/bin"] + ([f"NVIDIA_VISIBLE_DEVICES={devices}"] if devices is not None else [])
    spec = {"process": {"env": env}, "mounts": [], "hooks": {"prestart": [HOOK, OTHER_HOOK]}}
    (tmp_path / "config.json").write_text(json.dumps(spec))
    return tmp_path


# (docker run's --gpus, the NVIDIA_VISIBLE_DEVICES dockerd sets for it, the id refused or None)
GPUS = [
    ("all", "all", None),
    ("1", "0", None),                # a count N is "0,...,N-1" (moby countToDevices)
    ("device=0", "0", None),
    ("2", "0,1", "1"),               # more GPUs than a Thor has
    ("device=1", "1", "1"),
    ("device=GPU-4c1f", "GPU-4c1f", "GPU-4c1f"),  # csv mode knows "all" and "0" only
    ("0", "void", None),             # no GPU asked for: nothing to refuse
    ("(none)", None, None),
]


@pytest.mark.parametrize("gpus,devices,refused", GPUS, ids=[g[0] for g in GPUS])
def test_the_runtime_takes_what_a_thor_has_and_drops_dockers_hook(runtime, tmp_path, gpus,
                                                                   devices, refused):
    folder = bundle(tmp_path, devices)
    if refused:
        with pytest.raises(runtime.Refused, match=rf"unsupported device id: {refused}$"):
            runtime.edit_spec(str(folder))
        return
    runtime.edit_spec(str(folder))
    spec = json.loads((folder / "config.json").read_text())
    assert spec["hooks"]["prestart"] == [OTHER_HOOK]


def hook(tmp_path, devices, command="prestart"):
    folder = bundle(tmp_path, devices)
    return subprocess.run([sys.executable, str(FILES / "nvidia-container-runtime-hook"), command],
                          input=json.dumps({"pid": 1, "bundle": str(folder)}),
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("devices", ["all", "0"])
def test_the_hook_alone_refuses_any_gpu_on_a_thor(tmp_path, devices):
    done = hook(tmp_path, devices)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "Auto-detected mode as 'csv'",
        ("invoking the NVIDIA Container Runtime Hook directly (e.g. specifying the docker --gpus "
         "flag) is not supported. Please use the NVIDIA Container Runtime (e.g. specify the "
         "--runtime=nvidia flag) instead")]


@pytest.mark.parametrize("devices,command", [("void", "prestart"), (None, "prestart"),
                                             ("all", "poststop")])
def test_the_hook_lets_a_container_without_a_gpu_through(tmp_path, devices, command):
    done = hook(tmp_path, devices, command)
    assert done.returncode == 0 and done.stderr == ""


def test_a_refused_create_is_said_where_containerd_reads_it(runtime, tmp_path, monkeypatch):
    """containerd shows a runtime's error from runc's --log file (JSON lines), not its stderr."""
    (tmp_path / "bundle").mkdir()
    folder = bundle(tmp_path / "bundle", "0,1")
    log = tmp_path / "log.json"
    monkeypatch.setattr(sys, "argv", ["nvidia-container-runtime", "--root", "/run/x", "--log",
                                      str(log), "--log-format", "json", "create", "--bundle",
                                      str(folder), "box-1"])
    with pytest.raises(SystemExit) as stopped:
        runtime.main()
    assert stopped.value.code == 1
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and entry["msg"].endswith("unsupported device id: 1")
