"""Verification: (re)start the server when its inputs changed, and prove it serves."""

from pyinfra.api import deploy

from thorfleet import operations as thor


@deploy("Verification")
def run(s):
    thor.serving(
        name="Serve the rendered version and prove it (health, kernels, chat, reasoning, tools)",
        s=s,
    )
