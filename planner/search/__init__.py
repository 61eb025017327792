"""The search: enumerate outer choices, call the exact solvers, return the best plan with a bound."""

import sys
import types

from planner.search.api import SearchResult, search

__all__ = ["SearchResult", "search"]


class _SearchPackage(types.ModuleType):
    """`from planner import search; search(model, cluster, training, ...)`: the package is callable
    (it runs `planner.search.api.search`) and stays a package, so `import planner.search.units`
    and friends work as usual."""

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204 - see api.search
        return search(*args, **kwargs)


sys.modules[__name__].__class__ = _SearchPackage
