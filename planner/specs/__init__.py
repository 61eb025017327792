"""Inputs: models, GPU types, clusters and training settings, validated at the edge."""

from planner.specs.cluster import ClusterSpec, NodeGroup, ZoneLink, load_cluster
from planner.specs.gpus import GPUType, get_gpu, gpu_catalog
from planner.specs.models import Layer, ModelSpec, get_model, load_model, model_catalog
from planner.specs.training import TrainingSpec

__all__ = [
    "ClusterSpec", "NodeGroup", "ZoneLink", "load_cluster",
    "GPUType", "get_gpu", "gpu_catalog",
    "Layer", "ModelSpec", "get_model", "load_model", "model_catalog",
    "TrainingSpec",
]
