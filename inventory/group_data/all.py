"""Group data for the inventories kept in inventory/, read by pyinfra from beside the inventory
even when it runs from another folder (where it reads neither ../group_data/ nor ../config.py):
the host keys are checked strictly before the first connection, which is made before thorfleet's
own code can refuse the run. The rest of thorfleet's defaults come with ../group_data/all.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, wherever pyinfra runs
from thorfleet.settings.schema import defaults  # found through the line above

# pyinfra's own default would accept any new host key
ssh_strict_host_key_checking = defaults()["ssh_strict_host_key_checking"]
