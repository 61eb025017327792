"""Write the analytic model's per-layer numbers as `hetplan.profile/v1` files marked `source: modelled`.

One file per (catalog GPU type, model): the same tables `AnalyticCostModel` gives the search, frozen
into the profile format so they can be compared, edited or diffed against measured files. Nothing is
measured: `source` is `modelled` and `meta.method` says how the numbers were computed. The output is
deterministic (no dates; the knob set is recorded instead).

    python -m planner.profiling.analytic_export --out profiles/analytic [--models llama2-7b,gpt3-1.3b]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import DeviceClass, Shard
from planner.costmodel.knobs import Knobs, default_knobs
from planner.costmodel.profile import DTYPE_BYTES, PROFILE_FORMAT, Profile, ProfileEntry, dump_profile
from planner.errors import HetplanError
from planner.specs.gpus import GPUType, gpu_catalog
from planner.specs.models import ModelSpec, get_model
from planner.specs.training import TrainingSpec

# Not the models of profiles/sailor/: two profiles of one (GPU, model) below one folder are an error.
DEFAULT_MODELS = ("llama2-7b", "gpt3-1.3b")
TPS = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4, 8)
NO_BF16 = ("Volta", "Turing")  # these architectures have no bf16 tensor cores: fp16 profiles
ATTRIBUTION = "hetplan analytic cost model (planner.costmodel.analytic), computed, not measured"


def profile_dtype(gpu: GPUType) -> str:
    return "fp16" if gpu.arch in NO_BF16 else "bf16"


def _tps(model: ModelSpec, gpu: GPUType) -> list[int]:
    """TP degrees inside one node that split heads, KV heads and the MLP evenly."""
    return [t for t in TPS if t <= gpu.gpus_per_node and not model.num_heads % t
            and not model.kv_heads % t and not model.ffn_hidden % t]


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def _knobs_id(knobs: Knobs) -> str:
    text = json.dumps(knobs.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def analytic_profile(model: ModelSpec, gpu: GPUType, knobs: Knobs | None = None) -> Profile:
    """The analytic tables of one model on one GPU type (typical node links), as a modelled profile."""
    knobs = knobs or default_knobs()
    cost = AnalyticCostModel(knobs)
    dev = DeviceClass(gpu, gpu.gpus_per_node, gpu.intra_bw_gbs, gpu.nic_gbps / 8.0)
    dtype = profile_dtype(gpu)
    seq = model.seq_len
    head = model.num_layers + 1
    entries = []
    for tp in _tps(model, gpu):
        for mb in MICRO_BATCHES:
            training = TrainingSpec(global_batch=mb, seq_len=seq, dtype=dtype)  # type: ignore[arg-type]
            for mode in ("none", "selective", "full"):
                table = cost.layer_table(dev, Shard(tp, 1, 1, mb, mode, seq), model, training)
                picks = [("decoder", 1)] if mode != "none" else [("embedding", 0), ("decoder", 1), ("head", head)]
                for kind, i in picks:
                    entries.append(ProfileEntry(
                        layer=kind, tp=tp, micro_batch=mb, seq_len=seq, recompute=mode,  # type: ignore[arg-type]
                        fwd_ms=_sig(table.fwd_s[i] * 1e3), bwd_ms=_sig(table.bwd_s[i] * 1e3),
                        param_bytes=_sig(table.params_per_gpu[i] * DTYPE_BYTES[dtype]),
                        act_bytes=_sig(table.act_bytes[i])))
    if not entries:
        raise HetplanError("model", f"no TP degree of {TPS} fits {model.name} on {gpu.name}")
    meta = {
        "method": ("AnalyticCostModel.layer_table on one node of the typical size and links of this GPU "
                   f"({gpu.gpus_per_node} GPUs, {gpu.intra_bw_gbs:g} GB/s intra, {gpu.nic_gbps:g} Gb/s NIC), "
                   "flash attention, sequence parallelism with tp > 1, TP communication included"),
        "knobs": f"packaged default knobs, sha256 {_knobs_id(knobs)} (planner/data/knobs.json)",
        "generator": "python -m planner.profiling.analytic_export",
        "note": "computed, not measured; no date (deterministic output): regenerate when the model changes",
    }
    return Profile(format=PROFILE_FORMAT, gpu=gpu.name, model=model.name, source="modelled",
                   attribution=ATTRIBUTION, meta=meta, dtype=dtype, entries=sorted(entries, key=lambda e: e.key))


def export(models: Sequence[str], out_dir: Path) -> list[Path]:
    """Write one file per (catalog GPU, model) to `out_dir`; returns the paths written, sorted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in models:
        model = get_model(name, "--models")
        for gpu_name in sorted(gpu_catalog()):
            prof = analytic_profile(model, gpu_catalog()[gpu_name])
            path = out_dir / f"{model.name}__{gpu_name}.json"
            path.write_text(dump_profile(prof), encoding="utf-8")
            written.append(path)
    return sorted(written)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.profiling.analytic_export", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder to write (files are replaced)")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated catalog models")
    args = ap.parse_args(argv)
    try:
        paths = export([m.strip() for m in args.models.split(",") if m.strip()], args.out)
    except HetplanError as exc:
        sys.stderr.write(f"error: {exc.field}: {exc.reason}\n")
        return 2
    total = sum(p.stat().st_size for p in paths)
    sys.stderr.write(f"wrote {len(paths)} modelled profiles to {args.out} ({total / 1e6:.2f} MB)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
