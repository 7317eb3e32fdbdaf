"""Each client of the door, as the operator declares it (gateway_clients): its policy.

An entry of gateway_clients is a key file path, or a dict of the client's own policy; the schema
checks each key of it and parses it (schema.check_gateway: GatewaySchema.client_policies), the
run's plan the models it names, the laptop its key (run/laptop.client_keys). What the door does
with a policy is gateway/policy.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Where a request waits in a pool's queue, by its client's priority: HAProxy dequeues the lowest
# class first (http-request set-priority-class), and within a class the first come. A person at
# a prompt is served before a robot that can wait.
PRIORITY_CLASS = {"interactive": 0, "batch": 1}
# A client's token budgets (prompt + completion, as the boxes count them), shortest period first:
# over one, the door refuses the client until it frees (files/gateway/bin/thorfleet-door-usage decides).
TOKEN_BUDGETS = ("tokens_per_minute", "tokens_per_day", "tokens_per_month")


@dataclass(frozen=True)
class ClientPolicy:
    """One client at the door: its key file on the laptop, its limits (its own, else the
    fleet's gateway_client_* settings), the model names it may call (None: every one), its
    priority in the queues, and its token budgets (None: no budget). `key`: what its file holds,
    once the run's plan has read it (run/laptop.client_keys); never in a repr."""

    name: str
    key_file: str
    max_inflight: int
    requests_per_minute: int
    models: tuple[str, ...] | None = None
    priority: str = "interactive"
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    key: str | None = field(default=None, repr=False)

    @property
    def budgets(self) -> dict[str, int | None]:
        """{budget name (TOKEN_BUDGETS): its tokens, or None}."""
        return {name: getattr(self, name) for name in TOKEN_BUDGETS}
