"""Exact inner solvers: plain arrays in, plain results out (no files, no CLI)."""
