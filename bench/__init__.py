"""Measurements of thorfleet on the simulated fleet (every figure, beside its JSON: bench/README.md)."""
