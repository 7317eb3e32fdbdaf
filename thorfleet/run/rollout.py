"""The rollout in one place: which hosts restart together (`plan`) and what one host does at its
turn (`decide`). The rest only reads facts and runs what the decision names: operations.serving
reads the box and the run, tasks/verification.py gives each batch its own operation, and
files/thor/bin/thorfleet-serve does the work on the box.

How a run goes. The slow steps (preflight, weights, image) run on every host at once. Then the
first installs, hosts that never proved a version, start together: none of them takes serving
capacity away. Then the restart rolls: the canary group first, then the others in inventory order,
`rollout_batch` hosts at a time. Each batch is one operation, so pyinfra finishes (and proves) a
batch on every host before the next starts, and each host's turn is decided when it executes, from
what the turns before it did in this run.

One host's turn, `decide(served, rendered, first_install, earlier, canaries)`:

    step           what the box serves                    turns before it     decision
    first install  a version it proved (any)              -                   noop
    first install  nothing proven                         -                   activate
    batch          the rendered version, healthy          -                   noop
    batch          the rendered version, not healthy      -                   prove
    (the rendered version: its fingerprint, and the live secrets are the ones it was proven with;
    a rotated key is a new version)
    batch          anything else (or stopped)             one failed, or a    hold
                                                          canary did not pass
    batch          anything else (or stopped)             the others          activate

What each decision does (thorfleet-serve's command of the same name):
- noop: nothing; a first install's step leaves a host that proved a version to its batch.
- prove: no restart: wait for /health, then the proof (start-up kernels, chat, reasoning, tool
  call, completion). A failure fails the host and stops the rollout, as a failed activate does.
- activate: drain, restart into the rendered version and prove it. A failure rolls the host back to
  its last good version (or stops the service when it has none), fails the host and stops the
  rollout.
- hold: no restart. The new unit and config are already on disk: the last proven unit, config and
  secrets are put back as the live files, so a crash or reboot before the next run starts what the
  host serves, not the untested change. The host is recorded "not restarted" in the report, not
  failed.

The operator's questions:
- Batch 1 failed: what happens to batch 2? A host of batch 1 failed its proof (or activate): its
  box rolled back to its last good version and the host failed. Every later batch holds: each of its
  hosts keeps serving what it served, and the report says "not restarted: the rollout stopped after
  thor-1 failed". A host of batch 2 that already serves the rendered version is left alone (noop),
  and one still loading it is proven, not restarted.
- A first install failed? The same: a bare box failing its proof tells that the rendered version
  does not serve, so every batch holds, the first one included. The other first installs started
  with it, together.
- A canary dropped out before its restart (unreachable, or its preflight, build or fetch failed)?
  It never proved the change, so the rollout stops as for a failed proof: the later batches hold
  unless every canary passed its turn, and the report says "the rollout stopped: canary thor-1
  dropped out before proving the change". So does a canary outside the run (`--limit` without
  it): add it to the limit. A host of another batch that drops out proves nothing either way and
  stops nothing: the batches after it roll on.
- A host already serving the rendered version? noop when healthy; prove when it runs it but does not
  answer /health yet (loading after a reboot). Neither restarts it, whatever the turns before it did.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

NOOP, PROVE, ACTIVATE, HOLD = "noop", "prove", "activate", "hold"
# What a turn before this one did in this run (`earlier`, one per host).
PASSED = "passed"  # its step went through: started, proven, left alone or held
FAILED = "failed"  # its activate or prove failed: a failed restart
DROPPED = "dropped"  # it left the run before its turn: unreachable, or a step before failed
OUTSIDE = "outside"  # never in this run (outside --limit)


@dataclass(frozen=True)
class Plan:
    """The run's restart order: `batches` of host names, the canary group's (`canaries`) first."""

    batches: list[list[str]]
    canaries: frozenset[str]

    def before(self, index):
        """The hosts whose batch comes before batch `index` (0-based)."""
        return [name for batch in self.batches[:index] for name in batch]


def plan(inventory, size, canary_group=None, serves=lambda h: True, model_of=lambda h: None):
    """The restart order of every host of `inventory`, `size` at a time, the hosts of the group
    `canary_group` first, then the others in inventory order. Each host computes it from its own
    settings; the settings check makes it one plan (settings.settings_for_inventory): a canary group
    named in one group's data is every host's, and hosts that disagree are refused. `serves`
    tells the hosts that run a server (roles.is_thor: a gateway of its own has no turn).
    `model_of` tells the model a host serves (its service_profile): a batch never holds every box
    of a model served by more than one, so one of them serves while the others restart; a host
    left out for that goes in the next batch."""
    hosts = [h for h in inventory if serves(h)]
    model = {h.name: model_of(h) for h in hosts}
    boxes = Counter(model.values())
    names = [h.name for h in hosts]
    canaries = [h.name for h in inventory.get_group(canary_group, []) if serves(h)] \
        if canary_group else []
    rest = [n for n in names if n not in canaries]

    def fits(batch, name):
        of_its_model = sum(model[b] == model[name] for b in batch)
        return len(batch) < size and (boxes[model[name]] == 1 or
                                      of_its_model < boxes[model[name]] - 1)

    def chunk(items):
        batches, left = [], list(items)
        while left:
            batch = []
            for name in left:
                if fits(batch, name):
                    batch.append(name)
            batches.append(batch)
            left = [n for n in left if n not in batch]
        return batches

    return Plan(chunk(canaries) + chunk(rest), frozenset(canaries))


@dataclass(frozen=True)
class Decision:
    """What one host does at its turn: `action` (NOOP, PROVE, ACTIVATE or HOLD) and `why`, in the
    operator's words (a noop's message; the line a held host gets in the report)."""

    action: str
    why: str


def decide(served, rendered, first_install=False, earlier=None, canaries=()):
    """One host's turn (see the module's table).

    + served: what the box serves, facts.serving.ServerState: {"active", "proven_fingerprint",
      "secrets_proven", "healthy"} ({} on a bare box)
    + rendered: the fingerprint rendered from group data (render.Settings.fingerprint)
    + first_install: the first installs' step (before the batches), not the host's batch
    + earlier: {host name: PASSED, FAILED, DROPPED or OUTSIDE} of every turn before this one in
      this run (the first installs, the hosts of earlier batches)
    + canaries: the canary group's hosts (rollout.Plan.canaries): each must pass its turn

    .. code:: python

        decide({"active": "active", "proven_fingerprint": "v1", "healthy": True}, "v2",
               earlier={"thor-1": FAILED})
        # Decision(action="hold", why="not restarted: the rollout stopped after thor-1 failed")
    """
    proven = served.get("proven_fingerprint")
    if first_install:
        if proven:
            return Decision(NOOP, "it has proven a version before: its batch restarts or proves it")
        return Decision(ACTIVATE, "it never proved a version: it starts with the first installs")
    if proven == rendered and served.get("active") == "active" and served.get("secrets_proven"):
        if served.get("healthy"):
            return Decision(NOOP, f"it is serving fingerprint {rendered[:12]}, the rendered version")
        return Decision(PROVE, f"it runs fingerprint {rendered[:12]}, not answering yet: proven, "
                               "not restarted")
    why = _why_stopped(earlier or {}, canaries)
    if why:
        return Decision(HOLD, f"not restarted: the rollout stopped{why}")
    if proven == rendered and served.get("active") == "active":
        return Decision(ACTIVATE, f"it serves fingerprint {rendered[:12]} with other secrets than "
                                  "the live ones (a rotated key): restarted with them and proven")
    return Decision(ACTIVATE, f"it does not serve fingerprint {rendered[:12]}: restarted into it "
                              "and proven")


def _why_stopped(earlier, canaries):
    """Why the turns before stop the rollout ("" when they do not): a failed restart anywhere, or a
    canary that did not pass its turn (it never proved the change)."""

    def named(did):
        return sorted(name for name, its in earlier.items() if its == did and
                      (did == FAILED or name in canaries))

    def canary(names):
        return f"{'canary' if len(names) == 1 else 'canaries'} {', '.join(names)}"

    failed, dropped, outside = named(FAILED), named(DROPPED), named(OUTSIDE)
    why = [f" after {', '.join(failed)} failed"] if failed else []
    if dropped:
        why.append(f"{canary(dropped)} dropped out before proving the change")
    if outside:
        why.append(f"{canary(outside)} not in this run: add {'it' if len(outside) == 1 else 'them'}"
                   " to --limit, so the canary group proves the change first")
    if not why:
        return ""
    return "; ".join(why) if failed else ": " + "; ".join(why)
