"""Speculative decoding: drafts proposed from the request's own tokens (n-grams),
verified inside the running batch (see scheduler/acceptance.py)."""
