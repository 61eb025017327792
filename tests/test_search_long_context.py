"""Long sequences: context parallelism decides what fits, and units with no feasible template at all
must not break the best-first order of the large-pool search."""

from __future__ import annotations

from planner import search, violations
from planner.specs import ClusterSpec, NodeGroup, TrainingSpec
from planner.specs.models import get_model


def test_128k_context_plans_with_context_parallelism() -> None:
    cluster = ClusterSpec(nodes=[NodeGroup(gpu="H100-SXM5-80GB", nodes=2, gpus_per_node=8),
                                 NodeGroup(gpu="A100-SXM4-80GB", nodes=2, gpus_per_node=8)])
    training = TrainingSpec(global_batch=16, seq_len=131072, zero=1, micro_batches=(1, 16))  # 16 fits nowhere
    result = search(get_model("llama3-8b"), cluster, training, time_limit=60)
    assert violations(result.plan, cluster) == []
    assert any(s.cp * s.hp > 1 for p in result.plan.pipelines for s in p.stages)
    assert result.lower_bound_s <= result.prediction.step_s
