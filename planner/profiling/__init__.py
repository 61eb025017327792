"""Measure per-layer and collective costs with PyTorch and write `hetplan.profile/v1` files.

Nothing here imports torch at import time: `import planner.profiling` and every hetplan command work
without it, and only `hetplan profile` / `hetplan profile-links` need the `profile` extra.

* `layers`: the catalog model's layers as torch modules, sharded the way tensor parallelism would shard
  them (per-rank shapes, no communication).
* `timing`: clocks (CUDA events on a GPU, `time.perf_counter` on the CPU) and the spread of repetitions.
* `build`: runs the layers and assembles the `Profile`.
* `links`: collective timings over `torch.distributed` (the `collectives` tables).
* `analytic_export`: profiles computed by the analytic model, marked `source: modelled`.
"""

from __future__ import annotations

TORCH_MISSING = "PyTorch is not installed: install the `profile` extra (pip install 'hetplan[profile]')"


def require_torch(field: str = "torch") -> object:
    """The torch module, or a one-line HetplanError telling the user which extra to install."""
    from planner.errors import HetplanError

    try:
        import torch
    except ImportError:
        raise HetplanError(field, TORCH_MISSING) from None
    return torch
