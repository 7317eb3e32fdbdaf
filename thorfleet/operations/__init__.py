"""thorfleet's own operations, one module per concern as in tasks/: each reads the box and yields
only what closes the gap, or noops.

    commands      the shell helpers: quoting, commands shown as they run, failing a host
    files         files, folders, units and users, each replaced whole or left alone
    preflight     is this box a Thor that can run the model (reads only)
    power         nvpmodel's power mode and locked clocks
    image         the derived vLLM image: built, shared through a registry, or pulled
    weights       a verified checkpoint: copied from the fleet, fetched from the hub
    verification  serving the rendered version, proving it, benchmarking it
    cleanup       what nothing serves any more, removed

An operation that reads the box declares each read once (`snapshot.reads`) and gets its answers
as arguments. A host fails one way: `commands.fail_host(message)` (a command) or
`run_state(state).fail(host, message)` (inside one), which logs the message in red under the host's
name, records it for the report and fails the host. Every value put into a command is quoted.
"""
