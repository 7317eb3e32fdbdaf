"""The command line beyond a deploy: `python -m thorfleet pin|check|status|doctor|bench|client`."""
