"""The settings: every setting declared and checked (schema), read per host and per run (hosts),
which host plays which role (roles), the serving recipe, the box's paths (layout), and what is
rendered from them for a Thor (render)."""
