"""The run: the state a run shares (runstate), what is read from the boxes in one round trip
(snapshot), the restart order (rollout), who copies from whom (peers), the report, and every use of
pyinfra beyond its documented API (pyinfra_hooks)."""
