"""StepBudget: every share of a step is checked before it is taken, so a refusal
leaves nothing behind; admitting a request charges what locking its prefix takes from
eviction."""

from __future__ import annotations

from test_scheduler import make_scheduler, run_all, submit

from radixlm.scheduler.budget import StepBudget


def test_checks_come_before_actions() -> None:
    budget = StepBudget(num_tokens=10, num_slots=12, chunk_size=4)
    budget.add_decode()
    assert (budget.num_tokens_left, budget.num_slots_left) == (9, 11)
    assert budget.chunk_len(100) == 4 and budget.chunk_len(3) == 3
    assert budget.can_extend(4) and not budget.can_extend(0) and not budget.can_extend(12)
    budget.extend(4)
    assert (budget.num_tokens_left, budget.num_slots_left) == (5, 7)
    # Admission: the lock cost counts against the slots, the reserve only when others run.
    assert budget.can_admit(4, lock_cost=3, reserve=None)
    assert not budget.can_admit(5, lock_cost=3, reserve=None)
    assert not budget.can_admit(4, lock_cost=3, reserve=1)
    assert budget.can_admit(3, lock_cost=3, reserve=1)
    budget.admit(3, lock_cost=3)
    assert (budget.num_tokens_left, budget.num_slots_left) == (2, 1)
    assert budget.has_tokens and budget.chunk_len(10) == 2


def test_refused_admission_locks_nothing() -> None:
    """A prompt whose cached prefix is all that eviction could free waits (locking it
    would leave too little for the running request's reserve), and the refusal locked
    nothing: the cache's evictable size is what it was."""
    s = make_scheduler(num_tokens=64, schedule_conservativeness=1.0)
    prefix = list(range(1, 31))
    submit(s, "warm", prefix, max_new_tokens=2)
    run_all(s)
    submit(s, "long", list(range(60, 80)), max_new_tokens=20)
    s.step()  # prefills "long", which now reserves room for its next tokens
    evictable, protected = s.kv.cache.evictable_size(), s.kv.cache.protected_size()
    assert evictable >= len(prefix)
    submit(s, "shares", prefix + [90, 91], max_new_tokens=20)
    s.step()
    assert [r.rid for r in s.waiting] == ["shares"]
    assert s.waiting[0].req_pool_idx is None and s.waiting[0].last_node is None
    assert s.kv.cache.evictable_size() == evictable
    assert s.kv.cache.protected_size() == protected  # "long"'s own prompt, nothing more
    s.check_integrity()
    results = run_all(s)
    assert set(results) == {"long", "shares"}
