"""Baseline planners: each returns a `hetplan.plan/v1` Plan scored by the one evaluator."""

from benchmarks.baselines.megatron_uniform import best_uniform_plan

__all__ = ["best_uniform_plan"]
