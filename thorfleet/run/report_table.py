"""The report as a table on the terminal: one line per host, at most TABLE_WIDTH columns.

Long values (the patches, the weights, the whole error) are only in the JSON file.
"""

from __future__ import annotations

TABLE_WIDTH = 120  # the terminal table never needs more: long values stay in the JSON


def _mark(value):
    if value is True or value is False:
        return "yes" if value else "NO"
    return "-" if value is None else str(value)


COLUMNS = (("host", "left"), ("version", "left"), ("health", "left"), ("chat", "left"),
           ("think", "left"), ("tok/s", "right"), ("vs med", "right"), ("TTFT", "right"),
           ("EAGLE", "right"), ("chg", "right"), ("error", "left"))
HOST_WIDTH = 16  # a longer host name is cut with an ellipsis (in full in the JSON)


def _cells(name, row):
    """One host's cells, as the table shows them."""
    bench = row.get("benchmark") or {}
    tok_s, ratio = row.get("tok_s"), row.get("vs_median")
    acceptance = row.get("eagle_acceptance")
    error = row.get("error") or ""
    if row.get("stale"):
        error = f"stale: as of {row.get('as_of') or '?'}" + \
            (f"; {error}" if error else "")
    return (
        name,
        (row.get("serving_fingerprint") or "-")[:8],
        _mark(row.get("health")),
        _mark(row.get("chat")),
        _mark(row.get("reasoning_split")),
        "-" if tok_s is None else f"{tok_s:.1f}{'*' if bench.get('from_earlier_run') else ''}",
        "-" if ratio is None else f"{ratio:.2f}x",
        "-" if row.get("ttft_s") is None else f"{row['ttft_s']:.2f}s",
        "-" if acceptance is None else f"{acceptance:.2f}",
        str(len(row.get("changed") or ())),
        error,
    )


def table(rows, median=None, width=TABLE_WIDTH):
    """The report as a rich Table of at most `width` columns, one line per host: every column but
    the error is as wide as its widest cell, the error gets the rest and is cut with an ellipsis;
    long values (patches, weights, the whole error) are in the JSON."""
    from rich.table import Table

    cells = [_cells(name, row) for name, row in rows.items()]
    widths = [max([len(header), *(len(c[i]) for c in cells)])
              for i, (header, _) in enumerate(COLUMNS[:-1])]
    widths[0] = min(widths[0], HOST_WIDTH)
    # no rules and no padding at the edges: two spaces between columns
    rest = width - sum(widths) - 2 * (len(COLUMNS) - 1)
    title = "thorfleet report" + (f": fleet median {median:.1f} tok/s" if median else "")
    grid = Table(title=title, title_justify="left", box=None, pad_edge=False,
                 header_style="bold underline")
    for (header, justify), size in zip(COLUMNS, [*widths, max(rest, len("error"))]):
        grid.add_column(header, justify=justify, no_wrap=True, overflow="ellipsis",
                        min_width=size if header != "error" else None, max_width=size)
    for row in cells:
        grid.add_row(*row)
    return grid


def print_table(rows, path, median=None):
    from rich.console import Console

    console = Console(stderr=True, width=TABLE_WIDTH)
    console.print(table(rows, median))
    console.print(f"Every field is in {path} (tok/s with *: measured in an earlier run; "
                  "stale: a host not in this run)",
                  soft_wrap=True)
