"""The scheduler's CPU thread policy (`--thread-policy`).

OpenMP threads wait at the end of each parallel region (every linear layer, the
attention kernel, most torch operators) either by spinning or by sleeping. On
cores the server has to itself spinning is much faster (no wake-up per region:
1.6-1.8x at batch 1, 1.2x at batch 32 on a 2-core AVX-512 EPYC). On cores another
process also wants, it is much slower: a thread at a barrier spins while the
sibling it waits for is descheduled, and whole time slices are lost (0.35x at
batch 1 beside one busy process). One thread has no barriers at all and runs as
fast beside a busy process as two sleeping threads did.

So `adaptive` (the default with one scheduler process on the CPU) lets the
threads spin and watches the cores it may run on: when other processes (or the
hypervisor, as steal time) keep them busy, the scheduler runs one thread; when
they are free again, all of them. `spin` and `passive` fix the wait policy and
the thread count. The wait policy is libgomp's environment (OMP_WAIT_POLICY,
GOMP_SPINCOUNT), read once when a process loads it: the launcher sets it for
each child (see `openmp_env`); a value already in the environment wins.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

SPIN_COUNT = "10000"  # iterations before a spinning thread sleeps (~tens of microseconds)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def spins(policy: str, num_processes: int) -> bool:
    """Whether the scheduler's threads spin: `spin`, or `adaptive` with one process on the
    cores (TP ranks and DP replicas split the cores; each would see the others as load)."""
    return policy == "spin" or (policy == "adaptive" and num_processes == 1)


def openmp_env(spin: bool) -> dict[str, str]:
    """libgomp's settings for a child process; those already in the environment stay."""
    wanted = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": SPIN_COUNT} if spin else {
        "OMP_WAIT_POLICY": "PASSIVE"}
    return {k: v for k, v in wanted.items() if k not in os.environ}


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask: taskset, cgroups)."""
    try:
        return set(os.sched_getaffinity(0)) or {0}
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def busy_seconds(cpus: set[int], path: str = "/proc/stat") -> float | None:
    """CPU time spent on `cpus` by everything (user, system, interrupts, steal), in
    seconds since boot; None where /proc/stat is missing."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        # user nice system idle iowait irq softirq steal (guest time is inside user)
        ticks = [int(x) for x in rest.split()[:8]]
        total += sum(ticks) - ticks[3] - ticks[4]
    return total / _CLOCK_TICKS


def own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class ThreadGovernor:
    """Runs `max_threads` threads while the cores are otherwise free, one once others'
    load exceeds BUSY cores for SETTLE samples in a row; back to all once it stays under
    IDLE for SETTLE samples. (One sample is not enough either way: the server's own HTTP
    process takes ~0.4 cores for a moment when 32 requests arrive at once.)

    tick() is called every scheduler iteration and samples every INTERVAL seconds.
    """

    INTERVAL = 0.5
    BUSY = 0.3
    IDLE = 0.15
    SETTLE = 2

    def __init__(self, max_threads: int, set_threads: Callable[[int], None],
                 machine_seconds: Callable[[], float | None] | None = None,
                 self_seconds: Callable[[], float] = own_seconds,
                 clock: Callable[[], float] = time.monotonic) -> None:
        cpus = usable_cpus()
        self.max_threads = max_threads
        self.threads = max_threads
        self.num_switches = 0
        self.others_load = 0.0  # other processes' CPU on our cores, in cores, last sample
        self._set_threads = set_threads
        self._machine = machine_seconds or (lambda: busy_seconds(cpus))
        self._self, self._clock = self_seconds, clock
        self._quiet = self._busy = 0
        self._last = self._sample()
        self._next = self._last[0] + self.INTERVAL

    def _sample(self) -> tuple[float, float | None, float]:
        return self._clock(), self._machine(), self._self()

    def tick(self) -> None:
        if self._clock() < self._next:
            return
        now = self._sample()
        (t0, m0, s0), (t1, m1, s1) = self._last, now
        self._last, self._next = now, t1 + self.INTERVAL
        if m0 is None or m1 is None or t1 <= t0:
            return
        self.others_load = max((m1 - m0) - (s1 - s0), 0.0) / (t1 - t0)
        if self.threads > 1:
            self._busy = self._busy + 1 if self.others_load > self.BUSY else 0
            if self._busy >= self.SETTLE:
                self._switch(1)
        else:
            self._quiet = self._quiet + 1 if self.others_load < self.IDLE else 0
            if self._quiet >= self.SETTLE:
                self._switch(self.max_threads)

    def _switch(self, threads: int) -> None:
        self._quiet = self._busy = 0
        self.threads = threads
        self.num_switches += 1
        self._set_threads(threads)
        logger.info("CPU threads: %d (other processes use %.2f of our cores)", threads,
                    self.others_load)

    def stats(self) -> dict[str, float | int]:
        return {"cpu_threads": self.threads, "cpu_others_load": round(self.others_load, 3),
                "cpu_thread_switches": self.num_switches}
