"""Replica classes: the ranges of pipeline counts a unit of the search covers, and how a class
is split when refinement needs its bound finer (`UnitPool.split`)."""

from __future__ import annotations


def replica_classes(r_max: int, exact_upto: int = 8, ratio: float = 1.1,
                    edges: tuple[int, ...] | None = None) -> list[tuple[int, int]]:
    """Singletons up to `exact_upto`, then classes [lo, hi] with hi <= lo·ratio, or (with `edges`)
    classes ending at each edge and a last one up to `r_max`.

    Any class gives a valid bound (templates are costed for its `lo`); a wide class only loosens
    it by the gradient sync it under-costs, and refinement splits the class whose bound is lowest
    (`UnitPool.split`). The ring all-reduce's 2(R-1)/R factor changes by at most 1/3 between
    consecutive counts above 2 and by at most 11 % past 8 pipelines, so wide classes there cost
    little bound (1,024 GPUs: 7.4853 s with one class past 8 against 7.4861 s with six) and save a
    unit per class per microbatch size."""
    out = [(r, r) for r in range(1, min(r_max, exact_upto) + 1)]
    lo = exact_upto + 1
    ends = iter(edges) if edges is not None else None
    while lo <= r_max:
        if ends is None:
            hi = min(r_max, max(lo, int(lo * ratio)))
        else:
            hi = min(r_max, max(lo, next(ends, r_max)))
        out.append((lo, hi))
        lo = hi + 1
    return out


SPLIT_SINGLETONS = 8  # a narrow class (at most this many counts) splits into single counts at once


def narrow_class(lo: int, hi: int) -> bool:
    """Whether a replica class [lo, hi] (lo < hi) is narrow: its counts lie within about 1.5x of
    each other, so its [lo, 1.5 lo] part would reach hi - 1 (`split_counts`)."""
    return int(lo * 1.5) >= hi - 1


def split_counts(lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts a replica class [lo, hi] is split into: [lo, m] and [m + 1, hi] with m about
    1.5 lo; a narrow class (m would be hi - 1, at most `SPLIT_SINGLETONS` counts) into single
    counts at once. Halving a narrow class peels one count off the top and leaves the lower part's
    bound where it was (its lowest count sets it): on `benchmarks/chain_check.py`'s slowest pool
    (35 GPUs), [9, 13] went through four splits and four refinements of parts whose bound did not
    move before [9, 9] and [10, 10] were reached. Either way every part starts from at least the
    class's bound (`UnitPool.split`)."""
    mid = max(lo, min(hi - 1, int(lo * 1.5)))
    if narrow_class(lo, hi) and hi - lo < SPLIT_SINGLETONS:
        return [(r, r) for r in range(lo, hi + 1)]
    return [(lo, mid), (mid + 1, hi)]
