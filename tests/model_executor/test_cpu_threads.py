"""The adaptive CPU thread policy: its decisions on fed samples, /proc/stat parsing, the
children's OpenMP environment, and the real scheduler reacting to a busy process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from radixlm import Engine
from radixlm.entrypoints.launch import child_env
from radixlm.model_executor.cpu_threads import (
    ThreadGovernor,
    busy_seconds,
    openmp_env,
    usable_cpus,
)
from radixlm.server_args import ServerArgs


class FakeMachine:
    """A clock and CPU counters the test advances by hand."""

    def __init__(self) -> None:
        self.now, self.machine, self.own = 100.0, 1000.0, 10.0

    def advance(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.now += seconds
        self.own += own_cores * seconds
        self.machine += (own_cores + other_cores) * seconds


def make_governor(max_threads: int = 2) -> tuple[ThreadGovernor, FakeMachine, list[int]]:
    fake, calls = FakeMachine(), []
    gov = ThreadGovernor(max_threads, calls.append, machine_seconds=lambda: fake.machine,
                         self_seconds=lambda: fake.own, clock=lambda: fake.now)
    return gov, fake, calls


def test_governor_drops_to_one_thread_under_load_and_returns_when_quiet() -> None:
    gov, fake, calls = make_governor()
    for _ in range(4):  # our own two spinning threads are not "others"
        fake.advance(0.5, own_cores=2.0, other_cores=0.05)
        gov.tick()
    assert gov.threads == 2 and calls == []
    fake.advance(0.5, own_cores=1.6, other_cores=0.4)  # one busy sample: a burst
    gov.tick()
    fake.advance(0.5, own_cores=2.0, other_cores=0.05)
    gov.tick()
    assert gov.threads == 2 and calls == []
    fake.advance(0.5, own_cores=1.4, other_cores=0.6)
    gov.tick()
    assert gov.threads == 2
    fake.advance(0.5, own_cores=1.4, other_cores=0.6)  # the second in a row: one thread
    gov.tick()
    assert gov.threads == 1 and calls == [1]
    assert gov.others_load == pytest.approx(0.6)
    fake.advance(0.5, own_cores=1.0, other_cores=1.0)
    gov.tick()
    fake.advance(0.5, own_cores=1.0, other_cores=0.05)  # one quiet sample is not enough
    gov.tick()
    assert gov.threads == 1
    fake.advance(0.5, own_cores=1.0, other_cores=0.2)  # not quiet: the count restarts
    gov.tick()
    fake.advance(0.5, own_cores=1.0, other_cores=0.05)
    gov.tick()
    assert gov.threads == 1
    fake.advance(0.5, own_cores=1.0, other_cores=0.05)
    gov.tick()
    assert gov.threads == 2 and calls == [1, 2]
    assert gov.stats() == {"cpu_threads": 2, "cpu_others_load": 0.05, "cpu_thread_switches": 2}


def test_governor_samples_once_per_interval() -> None:
    reads = []
    gov = ThreadGovernor(2, lambda n: None, machine_seconds=lambda: reads.append(1) or 0.0,
                         self_seconds=lambda: 0.0, clock=lambda: 5.0)
    for _ in range(100):
        gov.tick()
    assert len(reads) == 1  # the first sample, at construction


def test_governor_without_proc_stat_keeps_its_threads() -> None:
    clock = [0.0]
    gov = ThreadGovernor(2, lambda n: None, machine_seconds=lambda: None,
                         self_seconds=lambda: 0.0, clock=lambda: clock[0])
    for _ in range(5):
        clock[0] += 1.0
        gov.tick()
    assert gov.threads == 2


def test_busy_seconds_counts_only_our_cpus(tmp_path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  900 0 900 900 9 9 9 9 0 0\n"
                    "cpu0 100 10 20 500 7 1 2 3 0 0\n"
                    "cpu1 200 0 30 400 0 0 0 5 0 0\n"
                    "cpu2 5000 0 0 0 0 0 0 0 0 0\n"
                    "intr 12345\n")
    ticks = (100 + 10 + 20 + 1 + 2 + 3) + (200 + 30 + 5)  # idle and iowait left out
    from radixlm.model_executor import cpu_threads

    assert busy_seconds({0, 1}, str(stat)) == pytest.approx(ticks / cpu_threads._CLOCK_TICKS)
    assert busy_seconds({0}, str(tmp_path / "missing")) is None
    assert busy_seconds(usable_cpus()) is not None  # this machine's /proc/stat parses


def test_openmp_env_leaves_the_users_settings(monkeypatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert openmp_env(True) == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "10000"}
    assert openmp_env(False) == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert openmp_env(True) == {"GOMP_SPINCOUNT": "10000"}


def test_child_env_spins_only_the_one_model_process(monkeypatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    args = ServerArgs()
    assert child_env(args, spin=True)["OMP_WAIT_POLICY"] == "ACTIVE"
    assert child_env(args)["OMP_WAIT_POLICY"] == "PASSIVE"  # detokenizer, DP controller
    assert child_env(ServerArgs(thread_policy="passive"), spin=True)["OMP_WAIT_POLICY"] == "PASSIVE"
    assert child_env(ServerArgs(thread_policy="spin", dp_size=2), spin=True)[
        "OMP_WAIT_POLICY"] == "ACTIVE"
    assert child_env(ServerArgs(dp_size=2), spin=True)["OMP_WAIT_POLICY"] == "PASSIVE"
    with pytest.raises(ValueError):
        ServerArgs(thread_policy="sometimes")


def _wait_for_threads(engine: Engine, threads: int, timeout: float,
                      min_others: float = 0.0) -> dict:
    """The scheduler's server info once it runs `threads` threads (and has measured at
    least `min_others` cores of other load), or at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        info = engine.get_server_info()
        if info["cpu_threads"] == threads and info["cpu_others_load"] >= min_others:
            return info
        if time.monotonic() > deadline:
            return info
        time.sleep(0.25)


@pytest.mark.skipif(len(usable_cpus()) < 2, reason="one core: nothing to adapt")
def test_scheduler_runs_one_thread_beside_a_busy_process() -> None:
    with Engine(max_total_tokens=1024) as engine:
        info = _wait_for_threads(engine, 2, timeout=30)
        assert info["cpu_threads"] == 2, info
        before = info["cpu_thread_switches"]
        greedy = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
        quiet = engine.generate("The capital of France is", greedy)
        busy = subprocess.Popen([sys.executable, "-c",
                                 "import time\nend = time.time() + 60\n"
                                 "while time.time() < end: pass\n"])
        try:
            info = _wait_for_threads(engine, 1, timeout=20, min_others=0.5)
            assert info["cpu_threads"] == 1 and info["cpu_others_load"] >= 0.5, info
            # one thread decodes the same tokens (float32 here: bitwise the same logits)
            assert engine.generate("The capital of France is", greedy)["text"] == quiet["text"]
        finally:
            busy.kill()
            busy.wait()
        info = _wait_for_threads(engine, 2, timeout=30)
        assert info["cpu_threads"] == 2 and info["cpu_thread_switches"] >= before + 2, info
