"""Group data for the inventories kept in inventory/, read by pyinfra from beside the inventory
even when it runs from another folder (where it reads neither ../group_data/ nor ../config.py):
the host keys are checked strictly before the first connection, which is made before thorfleet's
own code can refuse the run. The rest of thorfleet's defaults are in ../group_data/all.py.
"""

ssh_strict_host_key_checking = "yes"  # pyinfra's own default would accept any new host key
