"""Calibration: read published measured runs, predict them with the analytic model, fit a few knobs.

The measurement file is `calibration_measurements.csv` (packaged copy in `planner/data/`, from
`shared/data/`): one row per published run with its parallel config and one metric. Every metric is
turned into seconds per optimizer step by its own convention (TFLOP/s that count recompute FLOPs,
tokens/s per GPU or aggregate, iteration seconds), so model and measurement meet on step time.
A row is evaluated as a Megatron uniform plan (`planner.uniform.uniform_plan`) scored by the one
evaluator. Interleaved pipelines are scored as plain 1F1B (interleaving is not modelled yet).

Fitting the knobs to these rows lives in `planner.knob_fit`.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path


from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.knobs import Knobs
from planner.errors import HetplanError
from planner.plan import Plan
from planner.specs.cluster import ClusterSpec, NodeGroup
from planner.specs.gpus import resolve_gpu_name
from planner.specs.models import ModelSpec, get_model, model_catalog
from planner.specs.training import TrainingSpec

KNOBS_FORMAT = "hetplan.knobs/v1"
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Measurement:
    """One usable measured run, with the config the planner needs and its step time in seconds."""

    row: int  # 1-based data row in the file
    source: str
    block: str  # short source label used to group errors
    label: str  # the row's model text
    model: ModelSpec
    gpu: str  # catalog GPU name
    gpu_note: str  # where the catalog GPU differs from the measured one ('' when it matches)
    power_cap_w: float | None  # measured GPUs ran below their TDP
    num_gpus: int
    tp: int
    pp: int
    dp: int
    cp: int
    micro_batch: int
    global_batch: int
    seq_len: int
    recompute: str
    dtype: str
    zero: int
    sequence_parallel: bool
    attention: str
    virtual_stages: int  # interleaved schedule chunks per GPU (1 = plain 1F1B)
    metric: str
    value: float
    step_s: float  # measured seconds per optimizer step, derived from the metric
    recalled: bool  # the notes mark the figure as less certain
    assumptions: tuple[str, ...] = ()

    @property
    def interleaved(self) -> bool:
        return self.virtual_stages > 1

    @property
    def config(self) -> str:
        cfg = f"tp{self.tp} pp{self.pp} dp{self.dp}" + (f" cp{self.cp}" if self.cp > 1 else "")
        cfg += f" mb{self.micro_batch} gbs{self.global_batch} s{self.seq_len} rc={self.recompute}"
        return cfg + (f" {self.dtype}" if self.dtype != "bf16" else "") + (f" zero{self.zero}" if self.zero else "")


@dataclass(frozen=True)
class Skipped:
    row: int
    source: str
    label: str
    reason: str


# -- reading --------------------------------------------------------------------------------------
_BLOCKS = (("SC'21", "Megatron SC'21"), ("Megatron-LM README", "Megatron README"),
           ("Korthikanti", "Korthikanti 2022"), ("MT-NLG", "MT-NLG"), ("NeMo-Megatron-Launcher", "NeMo launcher"),
           ("Megatron-Bridge", "Megatron-Bridge"))


def source_block(source: str) -> str:
    """Short label of a source ('torchtitan H100', 'Megatron SC\\'21', ...) for per-block errors."""
    for key, label in _BLOCKS:
        if key.lower() in source.lower():
            return label
    if "torchtitan" in source.lower():
        m = re.search(r"_(h\d+|b\d+)_", source.lower())
        return "torchtitan" + (f" {m.group(1).upper()}" if m else "")
    return source.split(" (")[0][:40]


def map_gpu(text: str) -> tuple[str, str]:
    """(catalog GPU name, note on how the measured GPU differs from the catalog one)."""
    t = text.upper()
    if "GB200" in t:
        return "GB200", "NVL72 rack (72-GPU NVLink domain) modelled as 8-GPU nodes"
    if "B200" in t:
        return "B200", ""
    if "H200" in t:
        return "H200-SXM-141GB", ""
    if "H100" in t:
        if "96GB" in t or "500W" in t:
            return "H100-SXM5-80GB", "measured H100 96 GB at a 500 W cap; catalog H100 80 GB at 700 W"
        return "H100-SXM5-80GB", ""
    if "A100" in t:
        if "40GB" in t:
            return "A100-SXM4-40GB", ""
        return "A100-SXM4-80GB", ""
    return resolve_gpu_name(text.split(" (")[0], "gpu_type"), ""


def map_model(text: str, params: float | None, seq_len: int) -> tuple[ModelSpec, str]:
    """A catalog model matching the row's name or shape, else a GPT-style spec built from the shape."""
    m = re.search(r"llama\s*-?\s*3(?:\.\d)?\s+(\d+)\s*B", text, re.I)
    if m:
        return get_model(f"llama3-{m.group(1)}b", "model"), ""
    m = re.search(r"l=(\d+),\s*h=(\d+)(?:,\s*a=(\d+))?", text) or re.search(r"(\d+)L,\s*h(\d+)()", text)
    if not m:
        raise HetplanError("model", f"cannot map '{text}' to a model (no catalog name, no l=/h= shape)")
    layers, hidden = int(m.group(1)), int(m.group(2))
    heads = int(m.group(3)) if m.group(3) else None
    cands = [mm for mm in model_catalog().values() if mm.learned_positions and mm.num_layers == layers
             and mm.hidden == hidden and (heads is None or mm.num_heads == heads)]
    if cands:
        best = min(cands, key=lambda mm: (abs(mm.params_count() - (params or 0)), mm.name))
        return best, ""
    heads = heads or max(1, hidden // 128)
    spec = ModelSpec(name=f"gpt-{layers}l-h{hidden}", num_layers=layers, hidden=hidden, ffn_hidden=4 * hidden,
                     num_heads=heads, vocab=51200, seq_len=seq_len)
    return spec, f"model built from its shape (l={layers}, h={hidden}, a={heads}, ffn 4h, vocab 51200)"


def _int(text: str) -> int | None:
    text = (text or "").strip()
    return int(float(text)) if text else None


def full_recompute_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """FLOPs per step counted by Megatron SC'21 with full recompute: 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    l, h, v = model.num_layers, model.hidden, model.vocab
    return 96.0 * batch * seq * l * h * h * (1 + seq / (6 * h) + v / (16 * l * h))


def _stated_recompute(low: str) -> str | None:
    if re.search(r"full (act\.? )?recompute|full ac\b", low):
        return "full"
    if "selective" in low:
        return "selective"
    if re.search(r"no (activation )?recompute|no ac\b", low):
        return "none"
    return None


def _virtual_stages(low: str, num_layers: int, pp: int) -> int:
    """Interleaved-schedule model chunks per GPU named in the notes (1 = not interleaved)."""
    if "non-interleaved" in low:
        return 1
    m = re.search(r"\bvp\s*=?\s*(\d+)", low)
    if m:
        return int(m.group(1))
    m = re.search(r"(\d+) layers?/virtual stage", low)
    if m:
        return max(2, num_layers // (pp * int(m.group(1))))
    m = re.search(r"interleave[d]?\s+(\d+)", low)
    if m:
        return int(m.group(1))
    return 2 if "interleave" in low else 1


def _infer_recompute(notes: str, metric: str, value: float, step_s: float, model: ModelSpec, gbs: int,
                     seq: int, n: int) -> tuple[str | None, str]:
    """Full recompute when a reported TFLOP/s figure matches the 96·B·s·l·h² count at the step time."""
    m = re.search(r"([0-9.]+) TFLOP/s per GPU reported", notes)
    tflops = float(m.group(1)) if m else value if metric.startswith("TFLOP/s") else None
    if tflops is None:
        return None, ""
    implied = full_recompute_flops(model, gbs, seq) / (step_s * n) / 1e12
    if abs(implied / tflops - 1) < 0.05:
        return "full", (f"full recompute inferred: {tflops:g} TFLOP/s matches the 96·B·s·l·h² count "
                        f"({implied:.0f}) at {step_s:g} s")
    return None, ""


def _parse_row(i: int, row: dict[str, str]) -> Measurement:
    notes, metric = row.get("notes", ""), row["measured_metric"].strip()
    low = notes.lower()
    assumed: list[str] = []
    seq = _int(row["seq_len"]) or 2048
    model, model_note = map_model(row["model"], float(row["params"]) if row.get("params") else None, seq)
    if model_note:
        assumed.append(model_note)
    gpu, gpu_note = map_gpu(row["gpu_type"])
    cap = re.search(r"(\d+)\s*W\b", row["gpu_type"])
    n, tp, pp = _int(row["num_gpus"]), _int(row["tp"]) or 1, _int(row["pp"]) or 1
    dp, cp = _int(row["dp"]) or 1, _int(row["cp"]) or 1
    if n is None or tp * pp * dp * cp != n:
        raise HetplanError("num_gpus", f"tp*pp*dp*cp = {tp * pp * dp * cp} does not match num_gpus {n}")
    mb, gbs = _int(row["microbatch"]), _int(row["global_batch"])
    local = re.search(r"local batch (\d+)", low)
    if gbs is None:
        stated = re.search(r"gbs (\d+)", low)
        if stated:
            gbs = int(stated.group(1))
            assumed.append(f"global batch {gbs} from the launcher config named in the notes")
        elif local:
            gbs = int(local.group(1)) * dp
            assumed.append(f"global batch = local batch {local.group(1)} x dp {dp}")
        else:
            raise HetplanError("global_batch", "no global batch and none assumable from the notes")
    if "torchtitan" in row["source"].lower() and pp > 1:
        # torchtitan splits the local batch into as many microbatches as pipeline stages by default
        mb = max(1, gbs // dp // pp)
        assumed.append(f"torchtitan PP: local batch split into {pp} microbatches of {mb}")
    if mb is None:
        raise HetplanError("microbatch", "no microbatch size and none assumable")
    if gbs % (mb * dp):
        raise HetplanError("global_batch", f"global batch {gbs} is not a multiple of microbatch x dp")
    recompute = _stated_recompute(low)
    dtype = "fp8" if re.search(r"float8|fp8", low) else "fp16" if "fp16" in low else "bf16"
    titan = "torchtitan" in row["source"].lower()
    zero = 3 if titan or ("fsdp" in low and "fsdp=no" not in low) else 0  # torchtitan always shards (FSDP2)
    if zero == 0 and any(k in row["source"] for k in ("Megatron-Bridge", "NeMo")):
        zero = 1
        assumed.append("distributed optimizer (NeMo / Megatron-Bridge default)")
    flash = titan or "megatron-bridge" in row["source"].lower()
    sp = tp > 1 and ("sequence" in low or flash)
    virtual = _virtual_stages(low, model.num_layers, pp)
    value = float(row["value"])
    it = re.search(r"iteration_s\s*=\s*([0-9.]+)", notes)
    tokens = gbs * seq
    if metric == "iteration_s":
        step_s = value
    elif it:
        step_s = float(it.group(1))
    elif metric.startswith("TFLOP/s") and "recompute" in metric:
        factor = 1.0 if recompute == "full" else 72.0 / 96.0
        step_s = factor * full_recompute_flops(model, gbs, seq) / (value * 1e12 * n)
    elif metric == "tokens/s per GPU":
        step_s = tokens / (value * n)
    elif metric == "tokens/s (aggregate)":
        step_s = tokens / value
    else:
        raise HetplanError("measured_metric", f"unknown metric convention '{metric}'")
    if recompute is None:
        recompute, why = _infer_recompute(notes, metric, value, step_s, model, gbs, seq, n)
        if recompute is None:
            recompute, why = "pending", "recompute not stated: the lightest mode that fits memory"
        assumed.append(why)
    return Measurement(
        row=i, source=row["source"], block=source_block(row["source"]), label=row["model"], model=model,
        gpu=gpu, gpu_note=gpu_note, power_cap_w=float(cap.group(1)) if cap else None, num_gpus=n, tp=tp, pp=pp, dp=dp, cp=cp, micro_batch=mb, global_batch=gbs,
        seq_len=seq, recompute=recompute, dtype=dtype, zero=zero, sequence_parallel=sp,
        attention="flash" if flash else "naive", virtual_stages=virtual, metric=metric, value=value,
        step_s=step_s, recalled="[recalled]" in low, assumptions=tuple(assumed))


def load_measurements(path: str | Path) -> tuple[list[Measurement], list[Skipped]]:
    """Usable rows and skipped rows (with the reason) of a measurement CSV."""
    p = Path(path)
    if not p.is_file():
        raise HetplanError("measurements", f"no such file: {p}")
    with p.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    need = {"source", "model", "seq_len", "global_batch", "gpu_type", "num_gpus", "tp", "pp", "dp", "cp",
            "microbatch", "measured_metric", "value"}
    if rows and not need <= set(rows[0]):
        raise HetplanError("measurements", f"missing columns: {', '.join(sorted(need - set(rows[0])))}")
    good, skipped = [], []
    for i, row in enumerate(rows, start=1):
        try:
            good.append(_parse_row(i, row))
        except (HetplanError, ValueError) as exc:
            reason = exc.reason if isinstance(exc, HetplanError) else str(exc)
            skipped.append(Skipped(i, row.get("source", ""), row.get("model", ""), reason))
    return _resolve_recompute(good), skipped


def _resolve_recompute(ms: list[Measurement]) -> list[Measurement]:
    """Unstated recompute: one mode per (source, model, tp, pp, microbatch) scaling series, the lightest
    that fits every row of the series (one launcher config serves the whole series)."""
    order = ("none", "selective", "full")
    series: dict[tuple, str] = {}
    for m in ms:
        if m.recompute == "pending":
            key = (m.block, m.model.name, m.tp, m.pp, m.cp, m.micro_batch)
            mode = _lightest_fitting_recompute(m).recompute
            series[key] = max(series.get(key, "none"), mode, key=order.index)
    return [replace(m, recompute=series[(m.block, m.model.name, m.tp, m.pp, m.cp, m.micro_batch)])
            if m.recompute == "pending" else m for m in ms]


def _lightest_fitting_recompute(m: Measurement) -> Measurement:
    """Resolve an unstated recompute mode to the lightest one whose plan fits memory (built-in knobs),
    which is what a user tuning the run would have picked."""
    from planner.evaluate import stage_memory_report

    cost = AnalyticCostModel(Knobs())
    for mode in ("none", "selective", "full"):
        cand = replace(m, recompute=mode)
        plan, cluster = measurement_plan(cand)
        if all(need <= cap for *_, need, cap in stage_memory_report(plan, cluster, cost)):
            return cand
    return replace(m, recompute="full", assumptions=(*m.assumptions[:-1], "recompute not stated and no "
                                                    "mode fits the catalog GPU's memory: full assumed"))


def read_measurements(path: str | Path) -> list[Measurement]:
    """The usable rows of a measurement CSV (see `load_measurements` for the skipped ones)."""
    return load_measurements(path)[0]


# -- predicting -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RowPrediction:
    step_s: float
    fits_memory: bool
    peak_memory_gib: float
    capacity_gib: float


@lru_cache(maxsize=512)
def measurement_plan(m: Measurement) -> tuple[Plan, ClusterSpec]:
    """The uniform Megatron plan of a row on num_gpus/8 nodes (knob-independent, so cached)."""
    from planner.uniform import uniform_plan

    per_node = min(GPUS_PER_NODE, m.num_gpus)
    cluster = ClusterSpec(nodes=[NodeGroup(gpu=m.gpu, nodes=-(-m.num_gpus // per_node), gpus_per_node=per_node)])
    training = TrainingSpec(global_batch=m.global_batch, seq_len=m.seq_len, dtype=m.dtype, zero=m.zero,
                            sequence_parallel=m.sequence_parallel, recompute=(m.recompute,),
                            attention=m.attention, max_tp=max(8, m.tp), max_cp=max(8, m.cp))
    plan = uniform_plan(m.model, training, cluster, tp=m.tp, pp=m.pp, cp=m.cp, micro_batch=m.micro_batch,
                        recompute=m.recompute, gpus=m.num_gpus)
    return plan, cluster


def power_cap_scale(m: Measurement) -> float:
    """Compute-throughput factor of a power-capped GPU: clock ~ power^(1/3) (dynamic power ~ f·V², V ~ f)."""
    from planner.specs.gpus import get_gpu

    tdp = get_gpu(m.gpu).tdp_w
    if not m.power_cap_w or not tdp or m.power_cap_w >= tdp:
        return 1.0
    return (m.power_cap_w / tdp) ** (1.0 / 3.0)


def measured_gpu_knobs(m: Measurement, knobs: Knobs) -> Knobs:
    """Knobs as seen by the measured GPU: compute efficiencies scaled down under a power cap."""
    scale = power_cap_scale(m)
    if scale == 1.0:
        return knobs
    g = knobs.for_gpu(m.gpu)
    capped = g.model_copy(update={"gemm_eff_max": g.gemm_eff_max * scale, "attn_eff_max": g.attn_eff_max * scale})
    return knobs.model_copy(update={"gpu": {**knobs.gpu, m.gpu: capped}})


def predict_row(m: Measurement, knobs: Knobs) -> RowPrediction:
    from planner.evaluate import evaluate

    plan, cluster = measurement_plan(m)
    pred = evaluate(plan, cluster, AnalyticCostModel(measured_gpu_knobs(m, knobs)), check=False)
    worst = max(pred.per_stage, key=lambda s: s.memory_bytes / s.memory_capacity_bytes)
    return RowPrediction(pred.step_s, all(s.memory_bytes <= s.memory_capacity_bytes for s in pred.per_stage),
                         worst.memory_bytes / 2**30, worst.memory_capacity_bytes / 2**30)


def predict_step_s(m: Measurement, knobs: Knobs) -> float:
    """Predicted seconds per step of a measured run (interleaved runs scored as plain 1F1B)."""
    return predict_row(m, knobs).step_s
