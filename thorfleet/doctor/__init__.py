"""`thorfleet doctor`: what it reads on a box (thorfleet/facts, the deploy's own; ask.py) and its verdicts (rows.py)."""
