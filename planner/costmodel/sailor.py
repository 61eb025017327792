"""Importer for Sailor's per-layer profiles (Sailor artifact, SOSP'25, ETH Zürich, MIT licence).

Sailor stores `<MODEL>/<GPU>/profile.json` = {microbatch: {tp: {layer_index: [fwd_s, bwd_s, update_s]}}}
and `llm_info.json` = {MODEL: {tp: {layer_index: {params_floats, act_mem_bytes, ...}}}}, all at
sequence length 2048. This module maps Sailor's layer indices onto hetplan's layer kinds and writes
`hetplan.profile/v1` files. It runs once, offline: the package reads only the converted files.

    python -m planner.costmodel.sailor SRC_DIR OUT_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.costmodel.analytic import AnalyticCostModel
from planner.costmodel.base import DeviceClass, Shard
from planner.costmodel.knobs import Knobs
from planner.costmodel.profile import PROFILE_FORMAT, Profile, ProfileEntry, dump_profile
from planner.costmodel.shapes import layer_fwd_flops, layer_params, layer_replicated_params
from planner.errors import HetplanError
from planner.specs.gpus import get_gpu
from planner.specs.models import ModelSpec, get_model
from planner.specs.training import TrainingSpec

SEQ_LEN = 2048
DTYPE = "fp16"
PARAM_TOLERANCE = 0.02  # llm_info parameter counts must match the catalog shape this closely
SLOW_WARN = 8.0  # measured decoder fwd+bwd this many times the analytic model's: flag the file
ATTRIBUTION = ("Sailor artifact (Strati et al., SOSP'25, ETH Zürich), MIT licence, see profiles/README.md; "
               "converted by planner.costmodel.sailor")


@dataclass(frozen=True, slots=True)
class Layout:
    """How one Sailor model's layer indices map onto embedding / decoder blocks / head."""

    model: str  # hetplan catalog name
    tail: int  # indices after the decoder blocks
    embedding: bool  # index 0 is a clean embedding measurement
    head: bool  # the tail indices together are the final norm + LM head (+ loss)
    note: str


LAYOUTS = {
    "OPT-350": Layout("opt-350m", 1, True, True, "index 0 embedding, 1..24 decoder blocks, 25 final norm + "
                      "LM head + loss"),
    "OPT-30": Layout("opt-30b", 1, True, True, "index 0 embedding, 1..48 decoder blocks, 49 final norm + "
                     "LM head + loss"),
    "LLAMA-3-8": Layout("llama3-8b", 2, True, True, "index 0 embedding, 1..32 decoder blocks, 33 the final "
                        "RMSNorm (4096 parameters in llm_info), 34 the LM head + loss; 33 and 34 are folded "
                        "into the head entry (times summed)"),
    "GPT-Neo-2.7": Layout("gpt-neo-2.7b", 1, False, False, "index 0 is the tied embedding module (3 ms "
                          "forward on A100-40, the cost of an LM-head GEMM rather than a lookup) and index 33 "
                          "holds only the final LayerNorm (5120 parameters): the tied LM head is not timed "
                          "on its own, so only the decoder blocks 1..32 are imported"),
}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise HetplanError(str(path), f"cannot read Sailor JSON: {exc}") from None


def _triples(raw: Any, path: Path) -> dict[int, dict[int, dict[int, tuple[float, float, float]]]]:
    """{mb: {tp: {index: (fwd_s, bwd_s, update_s)}}} with integer keys, checked."""
    if not isinstance(raw, dict):
        raise HetplanError(str(path), "expected {microbatch: {tp: {layer: [fwd, bwd, update]}}}")
    out: dict[int, dict[int, dict[int, tuple[float, float, float]]]] = {}
    for mb, by_tp in raw.items():
        for tp, layers in by_tp.items():
            for idx, v in layers.items():
                if not (isinstance(v, list) and len(v) == 3 and all(isinstance(x, (int, float)) for x in v)):
                    raise HetplanError(f"{path}[{mb}][{tp}][{idx}]",
                                       "expected [forward_s, backward_s, update_s]")
                out.setdefault(int(mb), {}).setdefault(int(tp), {})[int(idx)] = (
                    float(v[0]), float(v[1]), float(v[2]))
    return out


def _expected_params(model: ModelSpec, kind: str, tp: int) -> float:
    total, rep = layer_params(model, kind), layer_replicated_params(model, kind)
    return (total - rep) / tp + rep


def _sig2(x: float) -> float:
    return float(f"{x:.2g}")


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 6)


def _memory(info: dict[str, Any] | None, model: ModelSpec, kind: str, tp: int,
            indices: list[int]) -> tuple[float | None, float | None, str | None]:
    """(param_bytes in fp16, activation bytes per sequence, reason when omitted) from llm_info."""
    if info is None or str(tp) not in info:
        return None, None, f"llm_info has no tp {tp}"
    rows = [info[str(tp)].get(str(i)) for i in indices]
    if any(r is None for r in rows):
        return None, None, f"llm_info tp {tp} lacks layer indices {indices}"
    # blocks: the median block, like the times; embedding / head: the indices together
    pick = statistics.median if kind == "decoder" else sum
    floats = float(pick(float(r["params_floats"]) for r in rows))
    act = float(pick(float(r["act_mem_bytes"]) for r in rows))
    want = _expected_params(model, kind, tp)
    if abs(floats - want) > PARAM_TOLERANCE * want:
        return None, None, (f"{kind} tp {tp}: llm_info has {floats:.0f} parameters, the catalog shape "
                            f"{want:.0f}: a different model configuration, sizes not imported")
    # act_mem_bytes is the allocator delta over the layer's forward at one sequence of 2048 tokens
    return floats * 2, act, None


def _decoder_mfu(model: ModelSpec, gpu_name: str, tp: int, mb: int, fwd_s: float, bwd_s: float) -> float:
    fl = layer_fwd_flops(model, "decoder", mb, SEQ_LEN)
    work = 3.0 * (fl.gemm + fl.attn_full) / tp
    return work / (fwd_s + bwd_s) / get_gpu(gpu_name).peak_flops(DTYPE)


def _analytic_ratio(model: ModelSpec, gpu_name: str, entries: list[ProfileEntry]) -> list[float]:
    """Measured / analytic decoder fwd+bwd per entry, against the built-in knob constants (not the
    calibrated file, which is fitted on this data) with Sailor's setup: fp16, non-flash, no SP."""
    gpu = get_gpu(gpu_name)
    dev = DeviceClass(gpu, gpu.gpus_per_node, gpu.intra_bw_gbs, gpu.nic_gbps / 8.0)
    analytic = AnalyticCostModel(Knobs())
    out = []
    for e in entries:
        if e.layer != "decoder":
            continue
        training = TrainingSpec(global_batch=e.micro_batch, seq_len=SEQ_LEN, dtype=DTYPE,
                                attention="naive", sequence_parallel=False)
        table = analytic.layer_table(dev, Shard(e.tp, 1, 1, e.micro_batch, "none", SEQ_LEN), model, training)
        out.append((e.fwd_ms + e.bwd_ms) / 1e3 / float(table.fwd_s[1] + table.bwd_s[1]))
    return out


def convert_file(path: Path, sailor_model: str, sailor_gpu: str,
                 llm_info: dict[str, Any] | None) -> Profile:
    """One Sailor profile.json as a hetplan profile; HetplanError when its layout does not fit."""
    if sailor_model not in LAYOUTS:
        known = ", ".join(sorted(LAYOUTS))
        raise HetplanError(str(path), f"unknown Sailor model '{sailor_model}' (known: {known})")
    layout = LAYOUTS[sailor_model]
    model = get_model(layout.model)
    gpu = get_gpu(sailor_gpu, field=str(path)).name
    data = _triples(_read_json(path), path)
    n_blocks = model.num_layers
    expected = 1 + n_blocks + layout.tail
    blocks = list(range(1, 1 + n_blocks))
    tail = list(range(1 + n_blocks, expected))
    info = (llm_info or {}).get(sailor_model)
    entries: list[ProfileEntry] = []
    omitted: set[str] = set()
    spread_f = spread_b = 0.0
    distinct = 0
    odd: set[int] = set()
    mfus: list[float] = []
    for mb in sorted(data):
        for tp in sorted(data[mb]):
            layers = data[mb][tp]
            if sorted(layers) != list(range(expected)):
                raise HetplanError(f"{path}[{mb}][{tp}]", f"{len(layers)} layer entries, but {sailor_model} "
                                   f"({model.num_layers} blocks) should have {expected}")
            f_med = statistics.median(layers[i][0] for i in blocks)
            b_med = statistics.median(layers[i][1] for i in blocks)
            spread_f = max(spread_f, max(abs(layers[i][0] - f_med) / f_med for i in blocks))
            spread_b = max(spread_b, max(abs(layers[i][1] - b_med) / b_med for i in blocks))
            distinct = max(distinct, len({layers[i][:2] for i in blocks}))
            odd.update(i for i in blocks if layers[i][:2] != (f_med, b_med))
            mfus.append(_decoder_mfu(model, gpu, tp, mb, f_med, b_med))
            parts = [("decoder", blocks, f_med, b_med)]
            if layout.embedding:
                parts.append(("embedding", [0], layers[0][0], layers[0][1]))
            if layout.head:
                parts.append(("head", tail, sum(layers[i][0] for i in tail), sum(layers[i][1] for i in tail)))
            update = statistics.median(layers[i][2] for i in blocks)
            for kind, idx, f, b in parts:
                pbytes, act, why = _memory(info, model, kind, tp, idx)
                if why:
                    omitted.add(why)
                entries.append(ProfileEntry(
                    layer=kind, tp=tp, micro_batch=mb, seq_len=SEQ_LEN, recompute="none", fwd_ms=_ms(f),
                    bwd_ms=_ms(b), optimizer_ms=_ms(update) if kind == "decoder" and update > 0 else None,
                    param_bytes=pbytes, act_bytes=act * mb if act is not None else None))
    entries.sort(key=lambda e: e.key)
    mfu_med = statistics.median(mfus)
    ratios = _analytic_ratio(model, gpu, entries)
    ratio_med = statistics.median(ratios)
    warnings = []
    if ratio_med > SLOW_WARN:
        warnings.append(f"decoder fwd+bwd is a median {ratio_med:.0f}x the analytic model's time (flagged "
                        f"above {SLOW_WARN:g}x): the run looks anomalously slow, check before relying on it")
    if not any(e.optimizer_ms for e in entries):
        omitted.add("update times are 0 in the source: no optimizer_ms")
    meta: dict[str, Any] = {
        "source_file": f"{sailor_model}/{sailor_gpu}/profile.json",
        "sailor_model": sailor_model,
        "sailor_gpu": sailor_gpu,
        "date": "unknown (Sailor artifact, SOSP'25)",
        "method": "Sailor's profiler: CUDA events around forward/backward module hooks per layer, seconds "
                  "converted to ms; the TP communication of the run (inside one node) is included",
        "layer_mapping": layout.note,
        "decoder_blocks": {"rule": f"median over blocks 1..{n_blocks}",
                           "max_distinct_values": distinct,
                           "blocks_off_median": sorted(odd),
                           "max_rel_dev_fwd": round(spread_f, 4), "max_rel_dev_bwd": round(spread_b, 4)},
        "optimizer": "Sailor records one update time per (microbatch, tp), copied to every layer index; "
                     "it is kept on decoder entries only",
        "embedding_backward": "Sailor's hooks do not time the embedding backward (its input needs no "
                              "gradient) and record 0" if layout.embedding else "not imported",
        "attention": ("non-flash, inferred: for OPT and GPT-Neo, llm_info's activation bytes lie within 15% "
                      "of Korthikanti's 34sbh + 5as^2b"),
        "decoder_mfu": {"min": round(min(mfus), 4), "median": round(mfu_med, 4), "max": round(max(mfus), 4)},
        "analytic_check": {"measured_over_analytic": {"min": _sig2(min(ratios)), "median": _sig2(ratio_med),
                                                      "max": _sig2(max(ratios))},
                           "against": "AnalyticCostModel(Knobs()) at import time: fp16, naive attention, "
                                      "no sequence parallelism, catalog node links"},
        "omitted": sorted(omitted),
        "warnings": warnings,
    }
    return Profile(format=PROFILE_FORMAT, gpu=gpu, model=model.name, source="measured",
                   attribution=ATTRIBUTION, meta=meta, dtype=DTYPE, entries=entries)


def convert_dir(src: Path) -> tuple[dict[str, Profile], list[str]]:
    """{output file name: profile} for every convertible file, plus one line per skipped file."""
    info_path = src / "llm_info.json"
    llm_info = _read_json(info_path) if info_path.is_file() else None
    out: dict[str, Profile] = {}
    skipped: list[str] = []
    files = sorted(src.glob("*/*/profile.json"))
    by_content: dict[str, list[str]] = {}
    for path in files:
        rel = f"{path.parent.parent.name}/{path.parent.name}"
        by_content.setdefault(json.dumps(_read_json(path), sort_keys=True), []).append(rel)
    twins = {rel: [r for r in group if r != rel] for group in by_content.values() for rel in group}
    for path in files:
        sailor_model, sailor_gpu = path.parent.parent.name, path.parent.name
        rel = f"{sailor_model}/{sailor_gpu}"
        try:
            prof = convert_file(path, sailor_model, sailor_gpu, llm_info)
        except HetplanError as exc:
            same = ", ".join(f"{r}/profile.json" for r in twins[rel])
            copy = f"; its content is identical to {same}" if same else ""
            skipped.append(f"{rel}: {exc.reason}{copy}")
            continue
        out[f"{prof.model}__{prof.gpu}.json"] = prof
    return out, skipped


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m planner.costmodel.sailor SRC_DIR OUT_DIR", file=sys.stderr)
        return 2
    src, dst = Path(args[0]), Path(args[1])
    try:
        if not src.is_dir():
            raise HetplanError("SRC_DIR", f"not a directory: {src}")
        profiles, skipped = convert_dir(src)
    except HetplanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    dst.mkdir(parents=True, exist_ok=True)
    for name, prof in sorted(profiles.items()):
        (dst / name).write_text(dump_profile(prof), encoding="utf-8")
        flag = f"  WARNING: {prof.meta['warnings'][0]}" if prof.meta["warnings"] else ""
        print(f"wrote {dst / name} ({len(prof.entries)} entries){flag}")
    for line in skipped:
        print(f"skipped {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
