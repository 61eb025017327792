"""hetplan: exact parallelism plans for LLM training on heterogeneous GPU pools."""

from planner.evaluate import evaluate
from planner import emit  # a callable package: emit(plan, cluster, target) -> files and refusals
from planner import search  # a callable package: search(model, cluster, training, ...) -> SearchResult
from planner.search import SearchResult
from planner.plan import Plan, load_plan
from planner.specs import ClusterSpec, ModelSpec, TrainingSpec, get_gpu, get_model, load_cluster, load_model
from planner.validate import validate, violations

__all__ = ["search", "SearchResult", "evaluate", "emit", "Plan", "load_plan", "ClusterSpec", "ModelSpec", "TrainingSpec", "get_gpu",
           "get_model", "load_cluster", "load_model", "validate", "violations"]
