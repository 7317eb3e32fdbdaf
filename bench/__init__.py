"""Measurements of thorfleet on the simulated fleet (see README: Rollouts and the benchmark)."""
