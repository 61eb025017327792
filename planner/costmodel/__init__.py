"""Cost models: per-layer tables (analytic or measured) and the stage-level terms built on them."""

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import CostModel, DeviceClass, LayerTable, Shard, device_class_of
from planner.costmodel.knobs import GPUKnobs, Knobs, default_knobs, load_knobs
from planner.costmodel.profile import MeasuredCostModel, Profile, load_profile, load_profiles

__all__ = ["AnalyticCostModel", "CostModel", "DeviceClass", "LayerTable", "Shard", "device_class_of",
           "GPUKnobs", "Knobs", "default_knobs", "load_knobs",
           "MeasuredCostModel", "Profile", "load_profile", "load_profiles"]
