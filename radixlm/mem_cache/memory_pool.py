"""The two memory pools: request rows and KV slots.

`ReqToTokenPool` maps (request row, token position) to a KV slot; the model
runner gathers each request's KV through its row. `TokenToKVPool` holds the K
and V tensors of every layer, indexed by KV slot, and the allocator of those
slots.

K and V are stored as `--kv-cache-dtype` says (kv_format.py): in the model's
dtype, or quantized when written (int8 with a scale per token and head, fp8), which
the attention kernels read directly; `dtype` stays the dtype K/V are written and
read back in, `kv_format` says how they are stored.

On the CPU both pools' tables are `lazy_zeros`: memory the kernel zeroes on first
touch, so a page of K/V counts in RSS once a token is written to it, not at start.

Slot 0 of the KV pool is a reserved dummy: padding positions in a batch point
at it, so it is never handed out and its contents are garbage. Usable slots
are 1..size.

Allocation runs every step for every request, so both operations are cheap:
`alloc(n)` slices the head off a tensor of freed slots (then takes slots never
handed out, lowest first), and `free()` only appends to a list of pending frees,
merged into the freed tensor when an allocation needs them. Neither synchronizes
with the device. Double frees are caught at once in `debug` mode, and otherwise
by `check_integrity()` (a slot free twice appears twice in the free list).
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable

import torch

from radixlm.mem_cache.kv_format import KVFormat, kv_format, quantize_rows

# NOTE: frees are merged into the free tensor at the latest when this many are
# pending, to bound the list's length when allocation never runs short.
_MAX_PENDING_FREES = 1024


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype, device=device), except that on the CPU no byte is
    written: the tensor is a private anonymous mapping of its own (page aligned), whose
    pages the kernel gives as zeros on first touch, so a page counts in the process's
    RSS only once something writes (or reads) it. A pool sized for its most tokens then
    costs resident memory for the tokens it holds. (torch.zeros memsets every byte.)
    The mapping is unmapped when the tensor's storage is freed."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    # NOTE: MAP_PRIVATE (Python's default is MAP_SHARED, shared memory that a fork would
    # share); not MAP_NORESERVE, so that under strict overcommit a pool larger than
    # memory is refused here rather than killed once it fills.
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(shape)


class ReqToTokenPool:
    """Rows of the request × position → KV slot table, one row per running request.

    Invariant: every row index in 0..size-1 is either free or allocated, never
    both; `free()` of a row that is already free raises ValueError.
    """

    def __init__(self, size: int, max_context_len: int, device: str = "cpu") -> None:
        if size < 1 or max_context_len < 1:
            raise ValueError(f"bad ReqToTokenPool shape ({size}, {max_context_len})")
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = lazy_zeros(
            (size, max_context_len), torch.int64, device
        )  # [size, max_context_len]
        self._free_rows: list[int] = list(range(size - 1, -1, -1))  # pop() gives row 0 first
        self._is_free = [True] * size

    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        """A free row, or None when all rows are in use. The row's old contents remain."""
        if not self._free_rows:
            return None
        idx = self._free_rows.pop()
        self._is_free[idx] = False
        return idx

    def free(self, idx: int) -> None:
        """Return a row. Raises ValueError on an unknown or already free row."""
        if not 0 <= idx < self.size:
            raise ValueError(f"request row {idx} out of range [0, {self.size})")
        if self._is_free[idx]:
            raise ValueError(f"double free of request row {idx}")
        self._is_free[idx] = True
        self._free_rows.append(idx)

    def clear(self) -> None:
        """Every row free again."""
        self._free_rows = list(range(self.size - 1, -1, -1))
        self._is_free = [True] * self.size

    def check_integrity(self) -> None:
        """Raise AssertionError if the free list and the free flags disagree."""
        assert len(set(self._free_rows)) == len(self._free_rows), "request row freed twice"
        assert sorted(self._free_rows) == [i for i, f in enumerate(self._is_free) if f]


class TokenToKVPool:
    """Per-layer K and V buffers of `size + 1` slots, and the allocator of slots 1..size.

    Each buffer is [size + 1, num_kv_heads, kv_format.row_width] of kv_format.storage:
    with `kv_cache_dtype="auto"` [.., head_dim] in `dtype`; quantized formats hold what
    kv_format.py describes (an int8 row carries its scale in its last 4 bytes).

    Ownership: a slot returned by `alloc()` belongs to the caller until it is
    passed to `free()` (directly, or through the prefix cache that took it
    over). `free()` accepts slots in any order and any number of calls, and
    copies its argument, so the caller may reuse the tensor it passed.
    """

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str = "cpu",
        *,
        kv_cache_dtype: str = "auto",
        debug: bool = False,
    ) -> None:
        if size < 1:
            raise ValueError(f"KV pool size must be at least 1, got {size}")
        self.size = size
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype  # K/V as written and read back
        self.kv_format: KVFormat = kv_format(kv_cache_dtype, dtype, head_dim)
        self.device = device
        # In debug mode every free is checked against a per-slot flag (a device sync).
        self.debug = debug
        shape = (size + 1, num_kv_heads, self.kv_format.row_width)
        storage = self.kv_format.storage
        self.k_buffers = [lazy_zeros(shape, storage, device) for _ in range(num_layers)]
        self.v_buffers = [lazy_zeros(shape, storage, device) for _ in range(num_layers)]
        # The C++ store (quantizing in one pass) for quantized pools on the CPU, if built.
        self._store_kernel: Callable[..., None] | None = None
        if self.kv_format.quantized and torch.device(device).type == "cpu":
            self._store_kernel = _cpu_store_kernel()
        self._free_slots: torch.Tensor  # [num_free] int64: freed slots, allocated from the head
        self._pending: list[torch.Tensor]  # freed since the last merge
        self._num_pending: int
        self._fresh: int  # slots _fresh..size have not been handed out since clear()
        self._is_free: torch.Tensor  # [size + 1] bool, maintained in debug mode only
        self.clear()

    @staticmethod
    def bytes_per_token(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
        kv_cache_dtype: str = "auto",
    ) -> int:
        """Bytes of K plus V that one slot takes over all layers (scales included)."""
        return kv_format(kv_cache_dtype, dtype, head_dim).bytes_per_token(num_layers,
                                                                         num_kv_heads)

    @property
    def kv_cache_dtype(self) -> str:
        """How K/V are stored, as the user names it ("bfloat16" for auto in bf16, "int8"):
        part of the disk tier's key, so pools of two formats never share entries."""
        return self.kv_format.name

    def tokens_vs_auto(self) -> float:
        """How many times as many tokens this pool holds as one in the model's dtype
        (auto) would in the same memory: 1.0 for auto, ~1.9 for int8 over bfloat16."""
        auto = kv_format("auto", self.dtype, self.head_dim)
        return auto.row_bytes() / self.kv_format.row_bytes()

    def info(self) -> dict[str, int | float | str]:
        """What /get_server_info says of the pool: capacity, format, real bytes, and the
        capacity against an auto pool of the same bytes."""
        per_token = self.kv_format.bytes_per_token(self.num_layers, self.num_kv_heads)
        return {"max_total_num_tokens": self.size, "kv_cache_dtype": self.kv_cache_dtype,
                "kv_bytes_per_token": per_token, "kv_cache_bytes": per_token * (self.size + 1),
                "kv_tokens_vs_auto": round(self.tokens_vs_auto(), 3)}

    # ---- KV storage ----

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as stored, each [size + 1, num_kv_heads, row_width]
        (kv_format.gather_rows reads rows back in `dtype`)."""
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write K and V of T tokens, quantizing where the pool is quantized.
        loc: [T] int64; k, v: [T, num_kv_heads, head_dim]."""
        k_buf, v_buf = self.k_buffers[layer_id], self.v_buffers[layer_id]
        if self._store_kernel is not None:
            self._store_kernel(k_buf, v_buf, loc, k, v)
            return
        # index_copy_, not `buf[loc] = k`: advanced-index assignment (index_put_) took
        # ~7% of a batch-32 decode step on the CPU; index_copy_ is a plain row copy.
        k_buf.index_copy_(0, loc, quantize_rows(k, self.kv_format))
        v_buf.index_copy_(0, loc, quantize_rows(v, self.kv_format))

    def slot_buffers(self) -> list[tuple[str, torch.Tensor]]:
        """Every buffer indexed by KV slot, each [size + 1, ...], named: what one slot's KV is.

        The disk tier stores and restores exactly these rows, bytes as they are, so
        a pool that keeps more per slot (an int8 pool's scales) must list it here.
        """
        return [(f"{kind}{i}", buf) for i in range(self.num_layers)
                for kind, buf in (("k", self.k_buffers[i]), ("v", self.v_buffers[i]))]

    # ---- allocator ----

    def available_size(self) -> int:
        return self._free_slots.numel() + self._num_pending + self.size + 1 - self._fresh

    def alloc(self, n: int) -> torch.Tensor | None:
        """n free slots as a new [n] int64 tensor on the pool's device; None if fewer are free.

        Slots freed before (pending frees merged first) come before slots never handed
        out, and those go lowest first: the slots ever written stay 1..peak use, so the
        pool's pages that hold K/V (and count in RSS on the CPU) are as few as the most
        tokens held at once need."""
        if n < 0:
            raise ValueError(f"cannot allocate {n} slots")
        if n > self._free_slots.numel():
            self._merge_pending()
        num_reused = min(n, self._free_slots.numel())
        num_fresh = n - num_reused
        if num_fresh > self.size + 1 - self._fresh:
            return None
        # NOTE: clone, so callers never hold a view that keeps an old free tensor alive.
        out = self._free_slots[:num_reused].clone()
        self._free_slots = self._free_slots[num_reused:]
        if num_fresh:
            fresh = torch.arange(self._fresh, self._fresh + num_fresh, dtype=torch.int64,
                                 device=self.device)
            out = torch.cat([out, fresh]) if num_reused else fresh
            self._fresh += num_fresh
        if self.debug:
            self._is_free[out] = False
        return out

    def free(self, indices: torch.Tensor) -> None:
        """Give slots back. In debug mode, raises ValueError on slot 0, out of range or reuse."""
        if indices.numel() == 0:
            return
        indices = indices.reshape(-1).to(device=self.device, dtype=torch.int64)
        if self.debug:
            self._check_free(indices)
            self._is_free[indices] = True
        self._pending.append(indices.clone())
        self._num_pending += indices.numel()
        if len(self._pending) >= _MAX_PENDING_FREES:
            self._merge_pending()

    def clear(self) -> None:
        """Every slot free again (the buffers keep their contents)."""
        self._free_slots = torch.empty(0, dtype=torch.int64, device=self.device)
        self._pending = []
        self._num_pending = 0
        self._fresh = 1
        self._is_free = torch.ones(self.size + 1, dtype=torch.bool, device=self.device)
        self._is_free[0] = False

    def free_slots(self) -> torch.Tensor:
        """All free slots as one int64 tensor (a merge: O(size), for checks and tests)."""
        self._merge_pending()
        fresh = torch.arange(self._fresh, self.size + 1, dtype=torch.int64, device=self.device)
        return torch.cat([self._free_slots, fresh])

    def check_integrity(self) -> None:
        """Raise AssertionError if a slot is free twice, or a free slot is 0 or out of range."""
        free = self.free_slots()
        assert free.numel() <= self.size, f"{free.numel()} free slots in a pool of {self.size}"
        if free.numel():
            assert int(free.min()) >= 1 and int(free.max()) <= self.size, "free slot out of range"
            assert torch.unique(free).numel() == free.numel(), "a slot was freed twice"
        if self.debug:
            mask = torch.zeros_like(self._is_free)
            mask[free] = True
            assert torch.equal(mask, self._is_free), "free flags disagree with the free list"

    def _merge_pending(self) -> None:
        if self._pending:
            self._free_slots = torch.cat([self._free_slots, *self._pending])
            self._pending = []
            self._num_pending = 0

    def _check_free(self, indices: torch.Tensor) -> None:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 1 or hi > self.size:
            raise ValueError(f"freeing slot outside 1..{self.size}: [{lo}, {hi}]")
        if torch.unique(indices).numel() != indices.numel():
            raise ValueError("the same slot appears twice in one free()")
        if bool(self._is_free[indices].any()):
            raise ValueError("double free of a KV slot")


def _cpu_store_kernel() -> Callable[..., None] | None:
    """torch.ops.radixlm.kv_store where the CPU kernels are built (csrc/kv_store.cpp)."""
    # NOTE: a lazy import: the pool itself needs no kernels, and the kernels' module
    # loads (or builds) the library on first use.
    from radixlm.layers.cpu_kernels import load_cpu_kernels

    if load_cpu_kernels() is None:
        return None
    store: Callable[..., None] = torch.ops.radixlm.kv_store
    return store
