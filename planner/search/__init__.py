"""The search: enumerate outer choices, call the exact solvers, return the best plan with a bound."""

from planner.search.api import SearchResult, search

__all__ = ["SearchResult", "search"]
