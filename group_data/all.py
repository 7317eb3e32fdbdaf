"""Your fleet's settings, as pyinfra reads them for every host: thorfleet's defaults, then what this
fleet changes. Each setting is declared once, in thorfleet/settings/schema.py (its type, default,
one-line meaning and check); docs/settings.md lists them all. Set what differs below, in a group's
own file here, or per host in the inventory.
"""

import os

from thorfleet.settings.schema import defaults

# Every setting at its default, as host data (pyinfra's SSH connector reads the ssh_ ones itself).
globals().update(defaults())

# --- what this fleet changes -------------------------------------------------------------------
weights_hf_endpoint = os.environ.get("HF_ENDPOINT")  # the laptop's hub or site mirror, if it names one
