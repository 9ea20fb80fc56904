"""Tensor parallelism on torch.distributed: the rank group, the per-step broadcast
from rank 0, and the worker ranks' loop (see parallel_state.py, step_sync.py, worker.py)."""
