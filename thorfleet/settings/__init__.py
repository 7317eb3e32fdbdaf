"""The settings, a leaf: every setting declared and checked (schema), one host's data read with
its secrets (hosts), each client's policy (clients), which host plays which role (roles), the
serving recipe, the box's paths (layout), and what is rendered from them for a Thor (render).
What crosses hosts is the run's plan (thorfleet/plan.py)."""
