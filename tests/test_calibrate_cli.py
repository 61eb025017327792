"""`hetplan calibrate`: fits shared knobs to measured rows, never does worse than where it started,
writes a knob file that `--knobs` loads, and never overwrites one silently."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from planner.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "planner" / "data" / "calibration_measurements.csv"
REPO = Path(__file__).resolve().parents[1]


def _subset(tmp_path: Path) -> Path:
    with DATA.open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    picked = [r for r in rows if "SC'21" in r["source"]][:4]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(picked)
    return path


def test_calibrate_fits_and_writes_a_loadable_knob_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    knobs = tmp_path / "knobs.json"
    code = main(["calibrate", str(_subset(tmp_path)), "--out", str(knobs), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["rows"] == 4
    assert doc["mape_after"] <= doc["mape_before"] + 1e-12
    assert json.loads(knobs.read_text())["format"] == "hetplan.knobs/v1"
    code = main(["evaluate", str(REPO / "examples" / "plan_tiny.json"), "--cluster",
                 str(REPO / "examples" / "tiny_cluster.yaml"), "--knobs", str(knobs), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["step_s"] > 0


def test_calibrate_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    knobs = tmp_path / "knobs.json"
    knobs.write_text("{}\n")
    code = main(["calibrate", str(_subset(tmp_path)), "--out", str(knobs)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "--force" in err
    assert knobs.read_text() == "{}\n"
