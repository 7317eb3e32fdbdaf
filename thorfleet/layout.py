"""Where things live: on the laptop (this checkout) and on the box.

The one Python file that spells the box's paths; everything else imports them from here.
(group_data/all.py spells the default weights_dir for the operator; a test holds it to BOX_MODELS.)
"""

from pathlib import Path

# --- the laptop: this checkout ----------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "files"  # templates, box scripts, the image's build context
GROUP_DATA_DEFAULTS = ROOT / "group_data" / "all.py"

# --- the box ------------------------------------------------------------------------------------
BOX_HOME = "/opt/thorfleet"
BOX_BIN = f"{BOX_HOME}/bin"  # memory-gate, thorfleet-serve, thorfleet-weights
BOX_VENV = f"{BOX_HOME}/venv"  # huggingface_hub for thorfleet-weights
BOX_IMAGE_CONTEXT = f"{BOX_HOME}/image"  # one build context per image inputs hash
BOX_MODELS = f"{BOX_HOME}/models"  # the default weights_dir
BOX_ETC = "/etc/thorfleet"
BOX_CONFIG_DIR = f"{BOX_ETC}/vllm"  # mounted into the container as /config
BOX_CONFIG = f"{BOX_CONFIG_DIR}/vllm.yaml"
BOX_SECRETS_ENV = f"{BOX_ETC}/secrets.env"  # VLLM_API_KEY, root-only
BOX_HF_TOKEN = f"{BOX_ETC}/hf_token"
BOX_VLLM_CACHE = "/var/cache/thorfleet/vllm"  # vLLM's compile cache, kept across restarts
BOX_STATE = "/var/lib/thorfleet"  # proven fingerprint, last-good copies
BOX_UNIT_DIR = "/etc/systemd/system"
CLOCKS_UNIT = "thorfleet-clocks.service"
