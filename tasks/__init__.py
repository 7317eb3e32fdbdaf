"""One module per concern, in the order an operator would do them by hand (see deploy.py)."""
