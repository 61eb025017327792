"""Collective timings over torch.distributed: the `collectives` tables of `hetplan.profile/v1`.

`run_links` either spawns `nproc` local processes itself (torch.multiprocessing, MASTER_ADDR 127.0.0.1,
a free port) or, when torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR) are set, runs as one rank of
that job. Every rank runs every op at every size; each repetition starts after a barrier, and the time
of a repetition is the slowest rank's. p2p is a ping-pong between rank 0 and the last rank (another
node under a multi-node torchrun), half the round trip. Sizes are bytes of the whole tensor
(docs/profile_format.md), rounded up to a multiple of 4 x world size bytes (fp32 elements that split
evenly across ranks).

The result is a `hetplan.links/v1` document (`LinkProfile`): the same `Collective` tables a profile
carries, without layer entries; `merge_into` copies them into a layer profile.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from planner.costmodel.profile import Collective, load_profile, write_profile
from planner.errors import HetplanError
from planner.profiling.timing import spread
from planner.specs.gpus import resolve_gpu_name

LINKS_FORMAT = "hetplan.links/v1"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
ELEM_BYTES = 4  # fp32 tensors


class LinkProfile(BaseModel):
    """Measured collective times of one group of ranks (written by `hetplan profile-links`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["hetplan.links/v1"] = LINKS_FORMAT
    gpu: str | None = Field(default=None, description="catalog GPU type of the ranks; none for CPU processes")
    backend: Literal["nccl", "gloo"]
    source: Literal["measured", "modelled"] = "measured"
    attribution: str = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)
    collectives: list[Collective] = Field(min_length=1)

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return resolve_gpu_name(value)
        except HetplanError as exc:
            raise ValueError(exc.reason) from None


@dataclass(frozen=True, slots=True)
class LinksRequest:
    backend: Literal["nccl", "gloo"]
    nproc: int
    sizes: tuple[int, ...]
    ops: tuple[str, ...] = OPS
    warmup: int = 2
    reps: int = 5
    gpu_name: str | None = None
    init_timeout_s: float = 120.0


def default_sizes(backend: str) -> tuple[int, ...]:
    """Powers of 4 from 1 KiB: to 256 MiB on GPUs (NCCL), to 4 MiB for CPU processes (gloo)."""
    top = 256 * 2**20 if backend == "nccl" else 4 * 2**20
    out, size = [], 2**10
    while size <= top:
        out.append(size)
        size *= 4
    return tuple(out)


def _numels(sizes: tuple[int, ...], world: int) -> list[int]:
    """Element counts: each size rounded up to a multiple of the world size, duplicates dropped."""
    out: list[int] = []
    for size in sizes:
        n = -(-size // ELEM_BYTES)
        n = -(-n // world) * world
        if not out or n > out[-1]:
            out.append(n)
    return out


# -- one rank ---------------------------------------------------------------------------------------
def _op_call(torch: Any, dist: Any, op: str, n: int, world: int, rank: int, dev: Any) -> Any:
    """A zero-argument call running the op once on n elements (the whole tensor)."""
    full = torch.ones(n, device=dev)
    part = torch.ones(n // world, device=dev)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    if op == "all_gather":
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(full, part)
    if op == "reduce_scatter":
        fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: fn(part, full)
    if op == "all_to_all":
        recv = torch.empty(n, device=dev)
        return lambda: dist.all_to_all_single(recv, full)
    peer = world - 1

    def ping_pong() -> None:
        if rank == 0:
            dist.send(full, peer)
            dist.recv(full, peer)
        elif rank == peer:
            dist.recv(full, 0)
            dist.send(full, 0)

    return ping_pong


def _rank_tables(torch: Any, dist: Any, rank: int, world: int, dev: Any, req: LinksRequest) -> dict[str, Any]:
    """Time every op and size on this rank; rank 0's return value holds the slowest rank's times."""
    cuda = dev.type == "cuda"
    barrier = (lambda: dist.barrier(device_ids=[dev.index])) if cuda else dist.barrier
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    tables: dict[str, Any] = {}
    for op in req.ops:
        rows = []
        for n in _numels(req.sizes, world):
            call = _op_call(torch, dist, op, n, world, rank, dev)
            times = []
            for i in range(req.warmup + req.reps):
                barrier()
                sync()
                t0 = time.perf_counter()
                call()
                sync()
                ms = (time.perf_counter() - t0) * 1e3
                if op == "p2p":  # rank 0 holds the round trip; the others only served it
                    ms = ms / 2 if rank == 0 else 0.0
                if i >= req.warmup:
                    times.append(ms)
            slowest = torch.tensor(times, dtype=torch.float64, device=dev)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            rows.append((n * ELEM_BYTES, [float(t) for t in slowest.cpu().tolist()]))
        tables[op] = rows
    return tables


def _device_name(torch: Any, dev: Any) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    from planner.profiling.build import _cpu_name

    return f"cpu: {_cpu_name()}"


def _run_rank(rank: int, world: int, local_world: int, req: LinksRequest) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    dev = torch.device("cuda", local_rank) if req.backend == "nccl" else torch.device("cpu")
    if req.backend == "nccl":
        torch.cuda.set_device(dev)
    dist.init_process_group(req.backend, rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=req.init_timeout_s))
    try:
        tables = _rank_tables(torch, dist, rank, world, dev, req)
    finally:
        dist.destroy_process_group()
    meta = {"world_size": world, "local_world_size": local_world, "device": _device_name(torch, dev),
            "torch": str(torch.__version__)}
    if req.backend == "nccl":
        meta["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    return {"tables": tables, "meta": meta}


def _spawned(rank: int, world: int, port: int, req: LinksRequest, result: str) -> None:
    """Entry point of one spawned process (module level, so `spawn` can pickle it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    raw = _run_rank(rank, world, world, req)
    if rank == 0:
        import json

        Path(result).write_text(json.dumps(raw), encoding="utf-8")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


# -- the document -----------------------------------------------------------------------------------
def _document(raw: dict[str, Any], req: LinksRequest, link: str) -> LinkProfile:
    world = int(raw["meta"]["world_size"])
    collectives, spreads = [], {}
    for op in req.ops:
        rows = raw["tables"][op]
        med = [max(statistics.median(t), 1e-6) for _, t in rows]
        spreads[op] = round(max(spread(t) for _, t in rows), 4)
        collectives.append(Collective(link=link, op=op, ranks=2 if op == "p2p" else world,  # type: ignore[arg-type]
                                      bytes=[float(b) for b, _ in rows], time_ms=[float(f"{m:.6g}") for m in med]))
    collectives.sort(key=lambda c: (c.link, c.op, c.ranks))
    meta = dict(raw["meta"])
    meta.update(
        date=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        backend=req.backend, dtype="fp32", warmup=req.warmup, reps=req.reps,
        method=("torch.distributed, a barrier before each repetition, time.perf_counter around the op "
                "(+ cuda synchronize on GPUs), the slowest rank's time per repetition, median kept; "
                "bytes = the whole tensor (all_gather: output, reduce_scatter: input, all_to_all: one "
                "rank's send buffer, p2p: the message, timed as half a ping-pong between rank 0 and the "
                "last rank)"),
        spread={"definition": "(max - min) / median over repetitions, worst size", **spreads},
        launcher="torchrun" if _under_torchrun() else "torch.multiprocessing.spawn",
    )
    return LinkProfile(gpu=req.gpu_name, backend=req.backend, attribution=f"measured with `hetplan "
                       f"profile-links` ({req.backend}, {world} ranks) on {meta['device']}", meta=meta,
                       collectives=collectives)


def run_links(req: LinksRequest) -> LinkProfile | None:
    """Measure the collectives; the document on rank 0 (or in the spawning process), None elsewhere."""
    from planner.profiling import require_torch

    torch: Any = require_torch("profile-links")
    if req.gpu_name is not None:
        resolve_gpu_name(req.gpu_name, "--gpu-name")
    if req.backend == "nccl" and not torch.cuda.is_available():
        raise HetplanError("--backend", "nccl needs CUDA GPUs; use --backend gloo for CPU processes")
    if _under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        raw = _run_rank(rank, world, local_world, req)
        return _document(raw, req, "inter" if world > local_world else "intra") if rank == 0 else None
    if req.backend == "nccl" and torch.cuda.device_count() < req.nproc:
        raise HetplanError("--nproc", f"{req.nproc} processes but {torch.cuda.device_count()} GPUs visible")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="hetplan-links-") as tmp:
        result = Path(tmp) / "rank0.json"
        try:
            mp.spawn(_spawned, args=(req.nproc, _free_port(), req, str(result)), nprocs=req.nproc, join=True)
        except Exception as exc:  # noqa: BLE001 - a child's failure, reported as one line
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            raise HetplanError("profile-links", f"a rank failed: {lines[-1] if lines else exc!r}") from None
        import json

        raw = json.loads(result.read_text(encoding="utf-8"))
    return _document(raw, req, "intra")


def dump_links(doc: LinkProfile) -> str:
    import json

    return json.dumps(doc.model_dump(mode="json", exclude_none=True), sort_keys=True, indent=1) + "\n"


def write_links(doc: LinkProfile, path: str | Path) -> None:
    Path(path).write_text(dump_links(doc), encoding="utf-8")


def load_links(path: str | Path) -> LinkProfile:
    from planner.specs.loading import load_document, parse_model

    p = Path(path)
    return parse_model(LinkProfile, load_document(p, "links"), str(p))


def merge_into(profile_path: Path, doc: LinkProfile) -> None:
    """Copy the document's tables into a layer profile, replacing tables of the same (link, op, ranks)."""
    prof = load_profile(profile_path)
    if doc.gpu is not None and doc.gpu != prof.gpu:
        raise HetplanError("--into", f"{profile_path} is a {prof.gpu} profile, the links ran on {doc.gpu}")
    new = {(c.link, c.op, c.ranks) for c in doc.collectives}
    kept = [c for c in prof.collectives if (c.link, c.op, c.ranks) not in new]
    merged = sorted(kept + list(doc.collectives), key=lambda c: (c.link, c.op, c.ranks))
    write_profile(prof.model_copy(update={"collectives": merged}), profile_path)
