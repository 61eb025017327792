"""Small helpers shared by the benchmark scripts."""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path: Path, fields: list[str], rows: list[dict]) -> None:
    """Rows as CSV with a header; keys outside `fields` are left out."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
