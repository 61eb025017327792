"""Run the layers of a catalog model with PyTorch and assemble a `hetplan.profile/v1` Profile.

For every (layer kind, tp, micro_batch, recompute) one module of one TP rank's shape is built
(`layers`), run `warmup` times unrecorded and `reps` times recorded; each repetition times the forward
and the backward separately. The profile records the median; the spread of the repetitions decides
whether the profile may be written (`check_spread`).

Recompute `full` (decoder only) means activation checkpointing: the block runs under
`torch.utils.checkpoint` (non-reentrant), so its forward stashes only the block input and its backward
runs the forward again before the gradients: `bwd_ms` includes the recompute, as the format defines.
`selective` checkpoints only the part the cost model's selective recompute drops (`layers.Decoder`).
"""

from __future__ import annotations

import functools

import datetime as dt
import platform
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planner.costmodel.profile import PROFILE_FORMAT, Profile, ProfileEntry
from planner.errors import HetplanError
from planner.profiling import require_torch
from planner.profiling.timing import Clock, CudaEventClock, PerfCounterClock, Samples, worst
from planner.specs.gpus import gpu_catalog, resolve_gpu_name
from planner.specs.models import ModelSpec

KINDS = ("embedding", "decoder", "head")
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
RECOMPUTE_MEANING = ("full (decoder only): the block runs under torch.utils.checkpoint (non-reentrant); "
                     "fwd_ms is that forward, bwd_ms the forward again plus the backward, act_bytes the "
                     "block input; selective (decoder only): with flash attention the MLP activation "
                     "function, with naive attention the attention core, runs under it, bwd_ms includes "
                     "recomputing it and act_bytes is what autograd then saves; embedding and head have "
                     "no recompute")
SPREAD_MEANING = "(max - min) / median over the recorded repetitions of one forward or backward"


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    """What to measure. `gpu_name` labels the profile with a catalog GPU type (required on CPU)."""

    model: ModelSpec
    tps: tuple[int, ...]
    micro_batches: tuple[int, ...]
    seq_len: int
    device: Literal["cuda", "cpu"] = "cpu"
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    warmup: int = 2
    reps: int = 5
    recompute: tuple[str, ...] = ("none", "selective", "full")
    attention: Literal["flash", "naive"] = "flash"
    gpu_name: str | None = None
    seed: int = 0
    threads: int | None = None  # CPU: torch intra-op threads for the run (restored afterwards)


@dataclass(frozen=True, slots=True)
class Measurement:
    """One configuration's repetitions and sizes."""

    layer: str
    tp: int
    micro_batch: int
    recompute: str
    fwd: Samples
    bwd: Samples
    param_bytes: int
    act_bytes: int
    peak_bytes: int | None  # allocator peak over forward + backward above the inputs (GPU only)

    @property
    def spread(self) -> float:
        return max(self.fwd.spread, self.bwd.spread)


@dataclass(frozen=True, slots=True)
class ProfileRun:
    profile: Profile
    measurements: tuple[Measurement, ...]
    worst: Samples


# -- device naming ----------------------------------------------------------------------------------
def catalog_gpu_for(device_name: str, mem_bytes: int | None = None) -> str | None:
    """The catalog GPU type a CUDA device name denotes ('NVIDIA A100-SXM4-80GB', 'Tesla V100-SXM2-16GB',
    'NVIDIA H100 80GB HBM3'), or None when it is ambiguous or unknown."""
    name = device_name
    for prefix in ("NVIDIA ", "Tesla ", "GeForce ", "Quadro "):
        name = name.replace(prefix, "")
    name = name.strip()
    for candidate in (name, name.replace(" ", "-")):
        try:
            return resolve_gpu_name(candidate)
        except HetplanError:
            pass
    tokens = name.upper().replace("-", " ").split()
    if not tokens:
        return None
    family = [n for n in gpu_catalog() if n.upper().replace("-", " ").split()[0] == tokens[0]]
    if "PCIE" in tokens:
        family = [n for n in family if "PCIE" in n.upper()]
    else:
        family = [n for n in family if "PCIE" not in n.upper()] or family
    if mem_bytes is not None and len(family) > 1:
        gib = mem_bytes / 2**30
        best = min(abs(gpu_catalog()[n].mem_bytes / 2**30 - gib) for n in family)
        family = [n for n in family if abs(gpu_catalog()[n].mem_bytes / 2**30 - gib) == best]
    return family[0] if len(family) == 1 else None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# -- measuring --------------------------------------------------------------------------------------
def make_clock(torch: Any, device: str) -> Clock:
    """CUDA events on a GPU, the wall clock on the CPU. Tests replace this to inject timings."""
    return CudaEventClock(torch) if device == "cuda" else PerfCounterClock()


def _saved_bytes(torch: Any, run: Callable[[], Any], skip_ptrs: set[int]) -> tuple[Any, int]:
    """Run a forward and sum the bytes of the distinct storages autograd saves for the backward,
    parameters excluded: the activation bytes one microbatch keeps alive until its backward."""
    seen: dict[int, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        if st.data_ptr() not in skip_ptrs:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return out, sum(seen.values())


def _measure(torch: Any, clock: Clock, module: Any, kind: str, tp: int, b: int, req: ProfileRequest,
             recompute: str) -> Measurement:
    dev, dtype = torch.device(req.device), getattr(torch, TORCH_DTYPES[req.dtype])
    s, h = req.seq_len, req.model.hidden
    vocab_shard = getattr(module, "vocab_shard", req.model.vocab)
    grad_out = torch.randn(b, s, h, device=dev, dtype=dtype)

    def inputs() -> tuple[Any, ...]:
        if kind == "embedding":
            return (torch.randint(0, vocab_shard, (b, s), device=dev),)
        x = torch.randn(b, s, h, device=dev, dtype=dtype, requires_grad=True)
        return (x, torch.randint(0, vocab_shard, (b, s), device=dev)) if kind == "head" else (x,)

    if hasattr(module, "selective"):
        module.selective = recompute == "selective"

    def forward(args: tuple[Any, ...]) -> Any:
        if recompute == "full":
            from torch.utils.checkpoint import checkpoint

            return checkpoint(module, *args, use_reentrant=False)
        return module(*args)

    def backward(out: Any) -> None:
        out.backward() if out.dim() == 0 else out.backward(grad_out)

    fwd_ms, bwd_ms = [], []
    for i in range(req.warmup + req.reps):
        args = inputs()
        out, f = clock.time(lambda: forward(args))
        _, bk = clock.time(functools.partial(backward, out))
        if i >= req.warmup:
            fwd_ms.append(f)
            bwd_ms.append(bk)
        del out, args
    args = inputs()
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    if recompute == "full":
        act = args[0].numel() * args[0].element_size()  # checkpoint keeps the block input only
    else:
        _, act = _saved_bytes(torch, lambda: forward(args), params)
    peak = None
    if req.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        backward(forward(args))
        torch.cuda.synchronize()
        peak = int(torch.cuda.max_memory_allocated() - base)
    from planner.profiling.layers import param_bytes

    label = f"{kind} tp {tp} micro_batch {b} recompute {recompute}"
    return Measurement(kind, tp, b, recompute, Samples(f"{label} forward", tuple(fwd_ms)),
                       Samples(f"{label} backward", tuple(bwd_ms)), param_bytes(module), act, peak)


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def _resolve_device(torch: Any, req: ProfileRequest) -> tuple[str, str]:
    """(catalog GPU name, device description); the catalog name comes from --gpu-name or the device."""
    if req.device == "cuda":
        if not torch.cuda.is_available():
            raise HetplanError("--device", "CUDA is not available to this torch build (use --device cpu)")
        props = torch.cuda.get_device_properties(0)
        desc = torch.cuda.get_device_name(0)
        gpu = req.gpu_name or catalog_gpu_for(desc, int(props.total_memory))
        if gpu is None:
            raise HetplanError("--gpu-name", f"device '{desc}' is not a catalog GPU type: name it with "
                               "--gpu-name (see `hetplan gpus`)")
        return resolve_gpu_name(gpu, "--gpu-name"), desc
    if req.gpu_name is None:
        raise HetplanError("--gpu-name", "a CPU profile has no GPU type: label it with --gpu-name TYPE "
                           "(for tests and dry runs; the times are CPU times)")
    return resolve_gpu_name(req.gpu_name, "--gpu-name"), f"cpu: {_cpu_name()}"


def _check_request(req: ProfileRequest) -> None:
    from planner.profiling.layers import check_tp

    if not req.tps or not req.micro_batches:
        raise HetplanError("--tp" if not req.tps else "--mbs", "give at least one value")
    if req.reps < 1 or req.warmup < 0:
        raise HetplanError("--reps", "reps must be >= 1 and warmup >= 0")
    if req.threads is not None and req.threads < 1:
        raise HetplanError("--threads", "must be >= 1")
    for mode in req.recompute:
        if mode not in ("none", "selective", "full"):
            raise HetplanError("--recompute", f"'{mode}' cannot be measured (none, selective, full)")
    if "none" not in req.recompute:
        raise HetplanError("--recompute", "'none' is required (embedding and head are measured without)")
    for tp in req.tps:
        check_tp(req.model, tp)


def _meta(torch: Any, req: ProfileRequest, desc: str, clock: Clock, ms: Sequence[Measurement],
          bad: Samples) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        "device": desc,
        "device_kind": req.device,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "method": ("hetplan profile: one TP rank's layer modules (per-rank shapes, no communication), "
                   f"{req.warmup} warm-up + {req.reps} recorded repetitions, median recorded"),
        "tp_communication": "not executed: fwd_ms / bwd_ms are one rank's compute for every tp",
        "attention": "torch scaled_dot_product_attention (causal)" if req.attention == "flash"
        else "naive: explicit causal softmax(QK^T)V, score matrix stored",
        "clock": clock.name,
        "recompute": RECOMPUTE_MEANING,
        "spread": {"definition": SPREAD_MEANING, "max": round(bad.spread, 4), "worst": bad.label},
        "seed": req.seed,
    }
    if req.device == "cuda":
        meta.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), driver=_driver_version(),
                    peak_bytes={f"{m.layer} tp {m.tp} micro_batch {m.micro_batch} {m.recompute}": m.peak_bytes
                                for m in ms})
        meta["memory"] = ("peak_bytes: torch.cuda.max_memory_allocated over one forward + backward, above "
                          "the parameters and inputs; act_bytes: storages saved for the backward")
    else:
        meta["cpu_threads"] = torch.get_num_threads()
        meta["memory"] = ("peak not measured on CPU; param_bytes and act_bytes are computed from the tensors "
                          "(act_bytes: distinct storages autograd saves for the backward, parameters excluded)")
    if req.gpu_name is not None:
        meta["labelled_as"] = f"labelled with --gpu-name {req.gpu_name}; measured on {desc}"
    return meta


def run_profile(req: ProfileRequest, progress: Callable[[str], None] | None = None) -> ProfileRun:
    """Measure every configuration and build the profile (no spread check: see `check_spread`)."""
    torch: Any = require_torch("profile")
    _check_request(req)
    gpu, desc = _resolve_device(torch, req)
    threads = torch.get_num_threads()
    if req.threads is not None:
        torch.set_num_threads(req.threads)
    try:
        return _run(torch, req, gpu, desc, progress)
    finally:
        torch.set_num_threads(threads)


def _run(torch: Any, req: ProfileRequest, gpu: str, desc: str,
         progress: Callable[[str], None] | None) -> ProfileRun:
    from planner.profiling.layers import build_layer

    clock = make_clock(torch, req.device)
    dtype = getattr(torch, TORCH_DTYPES[req.dtype])
    out: list[Measurement] = []
    for kind in KINDS:
        modes = [m for m in req.recompute if kind == "decoder" or m == "none"]
        for tp in sorted(set(req.tps)):
            torch.manual_seed(req.seed)
            module = build_layer(kind, req.model, tp, req.seq_len, req.attention)
            module = module.to(device=torch.device(req.device), dtype=dtype).train()
            for b in sorted(set(req.micro_batches)):
                for mode in modes:
                    if progress is not None:
                        progress(f"{kind} tp {tp} micro_batch {b} {mode}")
                    out.append(_measure(torch, clock, module, kind, tp, b, req, mode))
            del module
    bad = worst([s for m in out for s in (m.fwd, m.bwd)])
    entries = sorted((ProfileEntry(layer=m.layer, tp=m.tp, micro_batch=m.micro_batch, seq_len=req.seq_len,
                                   recompute=m.recompute, fwd_ms=_sig(m.fwd.median_ms),
                                   bwd_ms=_sig(m.bwd.median_ms), param_bytes=float(m.param_bytes),
                                   act_bytes=float(m.act_bytes)) for m in out), key=lambda e: e.key)
    profile = Profile(format=PROFILE_FORMAT, gpu=gpu, model=req.model.name, source="measured",
                      attribution=f"measured with `hetplan profile` on {desc}", dtype=req.dtype,
                      meta=_meta(torch, req, desc, clock, out, bad), entries=entries)
    return ProfileRun(profile, tuple(out), bad)


def check_spread(run: ProfileRun, max_spread: float) -> None:
    """Refuse a profile whose repetitions disagree more than `max_spread` (see SPREAD_MEANING)."""
    if run.worst.spread > max_spread:
        raise HetplanError("--max-spread", f"{run.worst.label}: repetitions spread {run.worst.spread:.3f} > "
                           f"{max_spread:g} ({SPREAD_MEANING}); timings are unstable, nothing written "
                           "(quiet the machine, raise --reps/--warmup, or raise --max-spread)")
