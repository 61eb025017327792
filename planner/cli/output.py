"""Shared CLI output: human tables go to stderr (rich), machine JSON goes to stdout (and nothing else).

Keeping the two streams apart lets `hetplan ... --json | jq` work while a person still sees the
tables. Every command builds its whole result first and writes only at the end, so an error leaves
stdout empty.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

GIB = 2**30


def err_console() -> Console:
    """A rich console on the *current* sys.stderr (tests swap the stream, so never cache one)."""
    stream = sys.stderr
    width = None if stream.isatty() else 140  # pipes and logs get a wide, stable layout
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: map them to null so the output is always valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_text(data: Any) -> str:
    """Deterministic JSON text: insertion-ordered keys, 2-space indent, trailing newline."""
    return json.dumps(_finite(data), indent=2, allow_nan=False) + "\n"


def print_json(data: Any) -> None:
    """Write `data` as JSON on stdout: the only thing a `--json` command writes there."""
    sys.stdout.write(json_text(data))
    sys.stdout.flush()


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
          right: Iterable[str] = ()) -> Table:
    """A plain rich table; columns named in `right` are right-aligned (numbers)."""
    right_set = set(right)
    t = Table(title=title, title_justify="left", show_lines=False)
    for col in columns:
        t.add_column(col, justify="right" if col in right_set else "left", no_wrap=True)
    for row in rows:
        t.add_row(*(str(c) for c in row))
    return t


def key_values(title: str, pairs: Sequence[tuple[str, Any]]) -> Table:
    """A two-column summary table (metric, value)."""
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    for k, v in pairs:
        t.add_row(k, str(v))
    return t


def show(*renderables: Any) -> None:
    """Print tables / text for humans on stderr."""
    console = err_console()
    for r in renderables:
        console.print(r)


def warn(message: str) -> None:
    """One warning line on stderr (plain text, no markup interpretation)."""
    sys.stderr.write(f"warning: {message}\n")


def gib(nbytes: float) -> float:
    return nbytes / GIB


def fmt_gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"
