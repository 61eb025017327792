"""Calibration: reading the measured runs with their metric conventions, recovering known knobs from
synthetic measurements, and the packaged knobs predicting the Megatron README GPT-3 175B run."""

from __future__ import annotations

import dataclasses
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from planner.calibrate import load_measurements, predict_row, predict_step_s, read_measurements
from planner.knob_fit import fit_knobs, get_knob, set_knob, write_knobs
from planner.costmodel.knobs import Knobs, default_knobs, load_knobs
from planner.errors import HetplanError

CSV = Path(str(resources.files("planner.data").joinpath("calibration_measurements.csv")))
SHARED_CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "calibration_measurements.csv"


@pytest.fixture(scope="module")
def rows():
    return load_measurements(CSV)


def test_packaged_file_gives_61_usable_rows(rows) -> None:
    good, skipped = rows
    assert len(good) == 61, f"expected every one of the 61 rows usable, got {len(good)}: {skipped}"
    assert not skipped


def test_packaged_copy_matches_shared_data() -> None:
    if not SHARED_CSV.is_file():
        pytest.skip("../shared/data not present")
    assert SHARED_CSV.read_bytes() == CSV.read_bytes()


def test_every_row_maps_to_a_consistent_config(rows) -> None:
    for m in rows[0]:
        assert m.tp * m.pp * m.dp * m.cp == m.num_gpus, m
        assert m.global_batch % (m.micro_batch * m.dp) == 0, m
        assert m.step_s > 0 and m.recompute in ("none", "selective", "full"), m


def test_tflops_rows_reproduce_the_implied_iteration_in_their_notes() -> None:
    """SC'21 rows count recompute FLOPs: 96·B·s·l·h²·(1 + s/6h + V/16lh) / (TFLOP/s · N) = notes' iteration."""
    with CSV.open(encoding="utf-8") as fh:
        import csv

        notes = {i: r["notes"] for i, r in enumerate(csv.DictReader(fh), start=1)}
    checked = 0
    for m in read_measurements(CSV):
        hit = re.search(r"implied iter ~([0-9.]+)s", notes[m.row])
        if hit:
            checked += 1
            assert abs(m.step_s / float(hit.group(1)) - 1) < 0.01, (m.row, m.step_s, hit.group(1))
    assert checked == 10


def test_metric_conventions_give_step_seconds(rows) -> None:
    by_row = {m.row: m for m in rows[0]}
    readme = next(m for m in rows[0] if m.block == "Megatron README")
    assert readme.step_s == 32.0 and readme.recompute == "full"
    for m in rows[0]:
        if m.metric == "tokens/s per GPU":
            assert abs(m.global_batch * m.seq_len / (m.step_s * m.num_gpus) / m.value - 1) < 1e-9
        if m.metric == "tokens/s (aggregate)":
            assert abs(m.global_batch * m.seq_len / m.step_s / m.value - 1) < 1e-9
    assert all(by_row[r].dtype == "fp8" for r in (25, 54, 57)), "Float8 / FP8-CS rows are fp8"
    assert by_row[23].zero == 3 and by_row[23].power_cap_w == 500 and by_row[23].gpu_note


def test_row_without_global_batch_is_skipped_with_reason(tmp_path: Path) -> None:
    header = CSV.read_text(encoding="utf-8").splitlines()[0]
    row = ('src X,"GPT 1.7B (l=24,h=2304,a=24)",1.7e9,2048,,A100-SXM4-80GB,8,1,1,8,1,4,'
           "tokens/s per GPU,1000,no batch given")
    path = tmp_path / "m.csv"
    path.write_text(header + "\n" + row + "\n", encoding="utf-8")
    good, skipped = load_measurements(path)
    assert not good and len(skipped) == 1 and "global batch" in skipped[0].reason


def test_missing_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(HetplanError, match="measurements"):
        read_measurements(tmp_path / "nope.csv")


def test_fit_recovers_knobs_from_synthetic_measurements(rows) -> None:
    """Step times generated from known knobs; a fit from a perturbed start lands back on them."""
    picks = [m for m in rows[0] if m.block in ("Korthikanti 2022", "NeMo launcher") and not m.interleaved][:6]
    truth = set_knob(set_knob(Knobs(), "gpu.A100-SXM4-80GB.gemm_eff_max", 0.62), "step_overhead_s", 0.3)
    synthetic = [dataclasses.replace(m, step_s=predict_step_s(m, truth)) for m in picks]
    start = set_knob(set_knob(Knobs(), "gpu.A100-SXM4-80GB.gemm_eff_max", 0.8), "step_overhead_s", 0.0)
    got = fit_knobs(synthetic, start, ("gemm_eff_max per GPU type", "step_overhead_s"), sweeps=3, iters=24)
    assert abs(get_knob(got, "gpu.A100-SXM4-80GB.gemm_eff_max") / 0.62 - 1) < 0.02
    assert abs(get_knob(got, "step_overhead_s") - 0.3) < 0.05


def test_fit_refuses_unknown_knob(rows) -> None:
    with pytest.raises(HetplanError, match="fit"):
        fit_knobs(rows[0][:2], Knobs(), ("warp_speed",))


def test_packaged_knobs_predict_gpt3_175b_within_15_percent(rows) -> None:
    """Megatron README: 1024 A100-80GB, tp 8, pp 16, mbs 1, gbs 1536, full recompute, ~32 s per step."""
    m = next(m for m in rows[0] if m.block == "Megatron README")
    assert (m.num_gpus, m.tp, m.pp, m.micro_batch, m.global_batch) == (1024, 8, 16, 1, 1536)
    pred = predict_row(m, default_knobs())
    assert abs(pred.step_s / 32.0 - 1) < 0.15, f"predicted {pred.step_s:.2f} s vs 32 s"
    assert pred.fits_memory


def test_packaged_knobs_overall_mape_within_15_percent(rows) -> None:
    errs = [abs(predict_step_s(m, default_knobs()) / m.step_s - 1) for m in rows[0]]
    assert sum(errs) / len(errs) < 0.15, f"MAPE {100 * sum(errs) / len(errs):.1f}%"


def test_write_knobs_is_deterministic_and_round_trips(tmp_path: Path) -> None:
    k = set_knob(set_knob(Knobs(), "gpu.H100-SXM5-80GB.gemm_eff_max", 0.61), "gpu.A100-SXM4-80GB.mem_eff", 0.8)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_knobs(k, a)
    write_knobs(load_knobs(a), b)
    assert a.read_bytes() == b.read_bytes()
    data = json.loads(a.read_text())
    assert data["format"] == "hetplan.knobs/v1" and list(data["gpu"]) == sorted(data["gpu"])
    assert load_knobs(a).for_gpu("H100-SXM5-80GB").gemm_eff_max == 0.61
