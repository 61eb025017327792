"""Reading YAML/JSON documents safely and turning pydantic errors into one-line HetplanErrors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import HetplanError

M = TypeVar("M", bound=BaseModel)


def load_document(path: Path, field: str) -> Any:
    """Parse a YAML or JSON file (safe loader); errors name the file and the line."""
    if not path.is_file():
        raise HetplanError(field, f"file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise HetplanError(str(path), f"malformed JSON at line {exc.lineno}: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "could not parse"
        raise HetplanError(str(path), f"malformed YAML{where}: {problem}") from None


def first_error(exc: ValidationError, prefix: str) -> HetplanError:
    """The first pydantic error as 'prefix.loc: message'."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()))
    field = f"{prefix}.{loc}" if loc and prefix else (loc or prefix)
    msg = err.get("msg", "invalid").removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    return HetplanError(field, msg)


def parse_model(cls: type[M], data: Any, where: str) -> M:
    """Validate `data` as `cls`, raising a one-line HetplanError naming the field."""
    if not isinstance(data, dict):
        raise HetplanError(where, f"expected a mapping, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise first_error(exc, where) from None
