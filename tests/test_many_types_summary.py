"""The summary `benchmarks/many_types.py` ends with (the README's many-type pool count comes from
it): draws that fit, how many end within the 2 % gap, which do not, and failed checks."""

from __future__ import annotations

from benchmarks.many_types import HEAD, summary


def _row(seed: int, pool: int, gap_pct: float, seconds: float, check: str = "ok", found: str = "0.50 (units)"
         ) -> list[str]:
    values = {"seed": str(seed), "#": str(pool), "pool": "p", "GPUs": "8", "search s": f"{seconds:.2f}",
              "plan found s": found,
              "step s": "1.0", "lower bound s": "1.0", "gap %": f"{gap_pct:.2f}", "GPUs used": "8", "chain": "-",
              "timed out": "False", "check": check}
    return [values[name] for name in HEAD]


def test_the_summary_counts_pools_within_the_gap_and_names_the_others() -> None:
    rows = [_row(1, 0, 1.48, 2.0), _row(1, 3, 2.0, 4.0), _row(2, 7, 2.26, 9.0, found="8.00 (lift_witness)"),
            _row(2, 8, 0.0, 1.0, "FAILED")]
    lines = summary(rows, drawn=6).splitlines()
    assert lines[0] == "4 of 6 draws fit; 3 of them end within a 2 % gap; above it: seed 2 pool 7 2.26 %"
    assert lines[1] == "search s: median 3.0, least 1.0, most 9.0"
    # when the final plans came, and what found them
    assert lines[2] == "plan found s: median 0.5, latest 8.0; by units 3, lift_witness 1"
    assert lines[3] == "1 of those plans FAILED the validator or the evaluator's step"
    assert summary([], drawn=2) == "0 of 2 draws fit; 0 of them end within a 2 % gap"
