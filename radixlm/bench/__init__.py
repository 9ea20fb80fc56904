"""Benchmarks, each a script that prints numbers: `python -m radixlm.bench.<name>`.

serving (an HTTP server under load), offline (Engine throughput beside transformers),
stream (a long stream's per-token cost), parallel (TP / DP configurations),
constrained (the grammar backends). Nothing in the runtime imports this package.
"""
