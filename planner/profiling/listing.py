"""What profile files a folder holds: one summary row per file, for `hetplan profiles`.

Reads JSON only (no torch). A file that is neither a valid `hetplan.profile/v1` nor a
`hetplan.links/v1` document is listed as `invalid` with the one-line reason, so one bad file does not
hide the others.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner.costmodel.profile import Profile, load_profile
from planner.errors import HetplanError


def _files(roots: Sequence[Path]) -> list[Path]:
    seen: dict[Path, Path] = {}
    for root in roots:
        found = [root] if root.is_file() else sorted(root.rglob("*.json"))
        for f in found:
            seen.setdefault(f.resolve(), f)
    return list(seen.values())


def _date(meta: dict[str, Any]) -> str | None:
    """The ISO day of the measurement, or the first words of a free-form date ('unknown')."""
    value = meta.get("date")
    if not isinstance(value, str) or not value.strip():
        return None
    if re.match(r"\d{4}-\d{2}-\d{2}", value):
        return value[:10]
    return value.split(" (")[0].strip()


def _profile_row(path: Path, prof: Profile) -> dict[str, Any]:
    return {"path": str(path), "kind": "profile", "gpu": prof.gpu, "model": prof.model, "source": prof.source,
            "dtype": prof.dtype,
            "tp": sorted({e.tp for e in prof.entries}),
            "micro_batch": sorted({e.micro_batch for e in prof.entries}),
            "seq": sorted({e.seq_len for e in prof.entries}),
            "recompute": sorted({e.recompute for e in prof.entries}),
            "layers": sorted({e.layer for e in prof.entries}),
            "entries": len(prof.entries), "collectives": len(prof.collectives),
            "date": _date(prof.meta)}


def summarize(path: Path) -> dict[str, Any]:
    """One row describing the file at `path`."""
    try:
        head = json.loads(path.read_text(encoding="utf-8"))
        fmt = head.get("format") if isinstance(head, dict) else None
    except (OSError, json.JSONDecodeError) as exc:
        return {"path": str(path), "kind": "invalid", "error": f"not JSON: {exc}"}
    try:
        if fmt == "hetplan.links/v1":
            from planner.profiling.links import load_links

            doc = load_links(path)
            return {"path": str(path), "kind": "links", "gpu": doc.gpu, "model": None, "source": doc.source,
                    "dtype": doc.meta.get("dtype"), "tp": [], "micro_batch": [], "seq": [],
                    "ops": sorted({c.op for c in doc.collectives}),
                    "ranks": sorted({c.ranks for c in doc.collectives}),
                    "collectives": len(doc.collectives), "date": _date(doc.meta)}
        return _profile_row(path, load_profile(path))
    except HetplanError as exc:
        return {"path": str(path), "kind": "invalid", "error": f"{exc.field}: {exc.reason}"}


def list_profiles(roots: Sequence[Path]) -> list[dict[str, Any]]:
    """Rows for every *.json below the roots (files are taken as given), sorted by path, no repeats."""
    return sorted((summarize(f) for f in _files(roots)), key=lambda r: r["path"])
