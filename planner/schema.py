"""JSON Schema of the public plan format `hetplan.plan/v1`, generated from `planner.plan.Plan`.

`python -m planner.schema > docs/plan.schema.json` regenerates the committed copy; a test checks the
two agree, so the schema other tools validate against never drifts from the code. Output is
deterministic (sorted keys, fixed indent).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from planner.plan import PLAN_FORMAT, Plan

SCHEMA_ID = "https://hetplan.dev/schema/plan.v1.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def plan_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a plan file as pydantic validates it."""
    schema = Plan.model_json_schema(mode="validation")
    return {"$schema": DIALECT, "$id": SCHEMA_ID, **schema,
            "description": f"hetplan plan file, format '{PLAN_FORMAT}' (see docs/plan_format.md)."}


def schema_text() -> str:
    return json.dumps(plan_schema(), indent=2, sort_keys=True) + "\n"


def main() -> None:
    sys.stdout.write(schema_text())


if __name__ == "__main__":
    main()
