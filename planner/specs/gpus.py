"""GPU type catalog, read from the packaged copy of `shared/data/gpu_specs.csv` (sources kept there).

Peaks are dense (no 2:4 sparsity). Types without BF16 (Volta, Turing) fall back to their FP16 peak.
MI250X is planned per GCD (each GCD is one device to the framework), so the catalog splits it.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

from planner.errors import HetplanError, suggest

GIB = 2**30

# Raw CSV names that need a cleaner canonical name, and the aliases used by other tools
# (Sailor's profile folders, common shorthands).
_RENAME = {
    "GH200-96GB (GH-96)": "GH200-96GB",
    "B200 (HGX/DGX B200)": "B200",
    "GB200 (per B200 GPU in NVL72)": "GB200",
    "MI250X (per OAM = 2 GCDs)": "MI250X-GCD",
    "RTX 4090": "RTX-4090",
    "RTX 3090": "RTX-3090",
    "RTX 2080 Ti": "RTX-2080Ti",
    "Titan RTX": "Titan-RTX",
    "RTX A6000": "RTX-A6000",
}
_ALIASES = {
    "A100-SXM4-40GB": ("A100-40", "A100-40GB", "a100_40g"),
    "A100-SXM4-80GB": ("A100-80", "A100", "A100-80GB", "a100_80g"),
    "H100-SXM5-80GB": ("H100", "H100-80", "H100-SXM"),
    "H200-SXM-141GB": ("H200",),
    "GH200-96GB": ("GH-96", "GH200"),
    "V100-SXM2-16GB": ("V100-16", "V100"),
    "V100-SXM2-32GB": ("V100-32",),
    "RTX-2080Ti": ("RTX-2080", "RTX 2080 Ti"),
    "RTX-3090": ("RTX 3090",),
    "RTX-4090": ("RTX 4090",),
    "Titan-RTX": ("Titan RTX", "TITAN-RTX"),
    "RTX-A6000": ("RTX A6000", "A6000"),
}


@dataclass(frozen=True, slots=True)
class GPUType:
    """One accelerator type: dense peaks, memory and the links a typical node gives it."""

    name: str
    arch: str
    bf16_tflops: float
    fp16_tflops: float
    fp8_tflops: float | None
    fp32_tflops: float
    mem_bytes: int
    mem_bw_gbs: float
    intra_link: str
    intra_bw_gbs: float
    pcie_bw_gbs: float
    gpus_per_node: int
    nic_gbps: float
    tdp_w: float
    aliases: tuple[str, ...] = field(default=())

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor-core peak in FLOP/s for a compute dtype ('bf16', 'fp16', 'fp8')."""
        if dtype == "fp8":
            tflops = self.fp8_tflops or self.bf16_tflops
        elif dtype == "fp16":
            tflops = self.fp16_tflops
        else:
            tflops = self.bf16_tflops
        return tflops * 1e12

    @property
    def has_nvlink(self) -> bool:
        return self.intra_bw_gbs > self.pcie_bw_gbs


def _num(text: str) -> float | None:
    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", text or "")
    return float(m.group(1)) if m else None


def _rows() -> list[dict[str, str]]:
    path = resources.files("planner.data").joinpath("gpu_specs.csv")
    with path.open(encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _from_row(row: dict[str, str], name: str, scale: float = 1.0, mem_gb: float | None = None) -> GPUType:
    fp16 = _num(row["fp16_dense_tflops"]) or 0.0
    bf16 = _num(row["bf16_dense_tflops"]) or fp16
    fp8 = _num(row["fp8_dense_tflops"])
    return GPUType(
        name=name,
        arch=row["arch"],
        bf16_tflops=bf16 * scale,
        fp16_tflops=fp16 * scale,
        fp8_tflops=fp8 * scale if fp8 else None,
        fp32_tflops=(_num(row["fp32_nontensor_tflops"]) or 0.0) * scale,
        mem_bytes=int((mem_gb if mem_gb is not None else _num(row["mem_gb"]) or 0.0) * GIB),
        mem_bw_gbs=(_num(row["mem_bw_gbs"]) or 0.0) * scale,
        intra_link=row["intra_node_link"],
        intra_bw_gbs=_num(row["intra_node_bw_per_gpu_unidir_gbs"]) or 0.0,
        pcie_bw_gbs=_num(row["pcie_bw_unidir_gbs"]) or 0.0,
        gpus_per_node=int(_num(row["typical_gpus_per_node"]) or 8),
        nic_gbps=_num(row["typical_inter_node_nic_per_gpu_gbps"]) or 100.0,
        tdp_w=_num(row["tdp_w"]) or 0.0,
        aliases=_ALIASES.get(name, ()),
    )


@lru_cache(maxsize=1)
def gpu_catalog() -> dict[str, GPUType]:
    """Every catalog GPU by canonical name, in file order."""
    out: dict[str, GPUType] = {}
    for row in _rows():
        raw = row["gpu"].strip()
        if raw == "V100-PCIe-16GB/32GB":
            for size in (16, 32):
                name = f"V100-PCIe-{size}GB"
                out[name] = _from_row(row, name, mem_gb=size)
        elif raw.startswith("MI250X"):
            # One OAM is two GCDs; the framework sees each GCD as a GPU with half of everything.
            gpu = _from_row(row, "MI250X-GCD", scale=0.5, mem_gb=64)
            out[gpu.name] = gpu
        else:
            name = _RENAME.get(raw, raw)
            out[name] = _from_row(row, name)
    return out


@lru_cache(maxsize=1)
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for name, gpu in gpu_catalog().items():
        for key in (name, *gpu.aliases):
            index[key.lower()] = name
    return index


def resolve_gpu_name(name: str, field: str = "gpu") -> str:
    """Canonical name for a catalog name or alias; unknown names fail with suggestions."""
    key = name.strip().lower()
    index = _alias_index()
    if key not in index:
        names = list(gpu_catalog()) + [a for g in gpu_catalog().values() for a in g.aliases]
        raise HetplanError(field, f"unknown GPU type '{name}'" + suggest(name, names))
    return index[key]


def get_gpu(name: str, field: str = "gpu") -> GPUType:
    return gpu_catalog()[resolve_gpu_name(name, field)]
