"""One error type for every bad input: it names the field and the reason in one line.

The CLI turns a `HetplanError` into that line on stderr and exit status 2; the Python API lets it
propagate. Nothing else in the package should raise for user-facing input problems.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class HetplanError(ValueError):
    """A user-facing error: `field` says where, `reason` says why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)

    def __reduce__(self) -> tuple:
        """Pickle as (field, reason): a search's worker processes send errors back to the parent,
        and the default (the message alone) could not be rebuilt there, which left the parent
        waiting forever on a pool whose result thread had died."""
        return type(self), (self.field, self.reason)


class InfeasibleError(HetplanError):
    """No plan exists for these inputs (memory, batch, cluster)."""


class SolverError(HetplanError):
    """A solver failed or ran out of time without any plan."""


def suggest(name: str, choices: Iterable[str], n: int = 3) -> str:
    """' (did you mean: a, b?)' for the nearest catalog names, or '' when none is close."""
    pool = list(choices)
    lowered = {c.lower(): c for c in pool}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.4)
    if not close:
        return ""
    return " (did you mean: " + ", ".join(lowered[c] for c in close) + "?)"
