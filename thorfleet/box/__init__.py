"""The Python thorfleet's programs on a Thor share, stdlib only, shipped whole: this folder lands as
the package `thorfleet_box` beside them (layout.BOX_LIB), where `python3 <program>` finds it, as
Ansible ships module_utils with its modules; a change to any file restarts the watchdog.

- `common`: the layout file the deploy writes, the API key, a request to the local server;
- `readings`: the parsers of what a box prints, which the laptop's facts import from here too;
- `usage`: each client's tokens, vLLM's middleware (mounted into the server's container).
"""
