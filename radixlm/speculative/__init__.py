"""Speculative decoding: drafts proposed from the request's own tokens (n-grams),
verified inside the running batch (see scheduler/acceptance.py). This package holds
the n-gram index and a request's drafting state; the scheduler's drafter, which
reads its requests, is scheduler/ngram_drafter.py."""
