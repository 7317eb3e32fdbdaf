"""`thorfleet doctor`: what it reads on a box (facts.py, ask.py) and its verdicts (rows.py)."""
