"""`hetplan models` and `hetplan gpus`: the built-in catalogs, as tables or JSON."""

from __future__ import annotations

from typing import Any

import typer

from planner.cli.output import GIB, print_json, show, table
from planner.specs.gpus import GPUType, gpu_catalog
from planner.specs.models import ModelSpec, model_catalog

JSON_OPT = typer.Option(False, "--json", help="print JSON on stdout instead of a table on stderr")


def model_record(m: ModelSpec) -> dict[str, Any]:
    """One catalog model as plain data (params counted by planner.costmodel.shapes)."""
    return {
        "name": m.name,
        "num_layers": m.num_layers,
        "hidden": m.hidden,
        "ffn_hidden": m.ffn_hidden,
        "num_heads": m.num_heads,
        "num_kv_heads": m.kv_heads,
        "vocab": m.vocab,
        "seq_len": m.seq_len,
        "activation": m.activation,
        "params": m.params_count(),
    }


def gpu_record(g: GPUType) -> dict[str, Any]:
    """One catalog GPU type as plain data (dense peaks, GiB, GB/s, Gb/s as in gpu_specs.csv)."""
    return {
        "name": g.name,
        "arch": g.arch,
        "bf16_tflops": g.bf16_tflops,
        "fp16_tflops": g.fp16_tflops,
        "fp8_tflops": g.fp8_tflops,
        "memory_gib": g.mem_bytes / GIB,
        "mem_bw_gbs": g.mem_bw_gbs,
        "intra_link": g.intra_link,
        "intra_bw_gbs": g.intra_bw_gbs,
        "gpus_per_node": g.gpus_per_node,
        "nic_gbps": g.nic_gbps,
        "aliases": list(g.aliases),
    }


def models(json_out: bool = JSON_OPT) -> None:
    """List the built-in models (a YAML/JSON ModelSpec file works wherever a name does)."""
    records = [model_record(m) for m in model_catalog().values()]
    if json_out:
        print_json(records)
        return
    rows = [(r["name"], r["num_layers"], r["hidden"], r["ffn_hidden"], r["num_heads"], r["num_kv_heads"],
             r["vocab"], r["seq_len"], f"{r['params'] / 1e9:.2f}") for r in records]
    show(table("Models", ["name", "layers", "hidden", "ffn", "heads", "kv heads", "vocab", "seq", "params (B)"],
               rows, right=["layers", "hidden", "ffn", "heads", "kv heads", "vocab", "seq", "params (B)"]))


def gpus(json_out: bool = JSON_OPT) -> None:
    """List the GPU catalog: dense peaks, memory and typical node links."""
    records = [gpu_record(g) for g in gpu_catalog().values()]
    if json_out:
        print_json(records)
        return
    nums = ["BF16 TFLOP/s", "memory GiB", "HBM GB/s", "intra GB/s", "GPUs/node", "NIC Gb/s"]
    rows = [(r["name"], r["arch"], f"{r['bf16_tflops']:g}", f"{r['memory_gib']:g}", f"{r['mem_bw_gbs']:g}",
             f"{r['intra_bw_gbs']:g}", r["gpus_per_node"], f"{r['nic_gbps']:g}", ", ".join(r["aliases"]))
            for r in records]
    show(table("GPU types (dense peaks; BF16 falls back to FP16 where the GPU has no BF16)",
               ["name", "arch", *nums, "aliases"], rows, right=nums))


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("gpus")(gpus)
