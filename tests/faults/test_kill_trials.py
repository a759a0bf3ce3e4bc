"""kill -9 of the job's process group at random points, ≥ 20 trials, each equal to the oracle.

The trials themselves are in :mod:`tests.faults.killtrials` (shared with
``platform/fault-trials.sh N``, which runs 100 outside CI and prints the table). Seeded:
``SRT_FAULT_SEED`` replays a run exactly (the input, every kill point, every torn commit); by
default each run draws a new seed, and a failure prints it.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.faults.killtrials import Config, _record, record_final, run_kill_trials

pytestmark = pytest.mark.faults

TRIALS = int(os.environ.get("SRT_FAULT_TRIALS", "20"))


# ~20 Spark start-ups: 6-8 min on a quiet 2-core machine, far more under load.
@pytest.mark.timeout(3600)
def test_kill_dash_nine_at_random_points_every_trial_equals_oracle(tmp_path, job_env, trials):
    seed = int(os.environ.get("SRT_FAULT_SEED") or random.randrange(1 << 31))
    print(f"kill -9 trials: seed {seed} (replay: SRT_FAULT_SEED={seed})")
    cfg = Config(trials=TRIALS, seed=seed)
    out = run_kill_trials(tmp_path / "w", cfg, job_env, _record(trials, seed, cfg), say=print)
    record_final(trials, out, cfg)
    assert out.ok, (
        f"seed {seed} — replay with SRT_FAULT_SEED={seed} "
        f"pytest tests/faults/test_kill_trials.py\n{out.table()}"
    )


def test_after_two_fallbacks_each_window_must_hold_a_value_it_had_at_a_batch_end():
    from tests.faults.killtrials import _each_window_at_a_batch_end as check

    at_ledger = {("M1", 0): (2, 20), ("M2", 0): (1, 5)}
    later = {("M1", 0): (3, 30), ("M2", 0): (1, 5), ("M3", 1): (1, 7)}
    mixed = {("M1", 0): (2, 20), ("M2", 0): (1, 5), ("M3", 1): (1, 7)}  # M3 from the later end
    assert check(mixed, [at_ledger, later])
    assert not check({**mixed, ("M1", 0): (5, 50)}, [at_ledger, later])  # counted twice
    assert not check({("M2", 0): (1, 5)}, [at_ledger, later])  # M1 lost
    assert not check({**mixed, ("M1", 0): (1, 10)}, [at_ledger, later])  # behind the ledger


KEYED_TRIALS = int(os.environ.get("SRT_FAULT_KEYED_TRIALS", "3"))


# The same trials with the counts kept by the runtime's keyed operators in the Python worker's
# RocksDB: its versioned keyed files must be as crash-safe as Spark's state store, for a
# process function's map state and timers and for the window operator's windows and triggers.
# `python -m tests.faults.killtrials --keyed [--operator window]` runs more.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("operator", ["process", "window"])
def test_kill_dash_nine_of_a_keyed_operator_on_local_state_every_trial_equals_oracle(
    tmp_path, job_env, trials, operator
):
    seed = int(os.environ.get("SRT_FAULT_SEED") or random.randrange(1 << 31))
    print(f"kill -9 trials (keyed, {operator}): seed {seed} (replay: SRT_FAULT_SEED={seed})")
    cfg = Config(trials=KEYED_TRIALS, seed=seed, keyed=True, operator=operator)
    out = run_kill_trials(tmp_path / "w", cfg, job_env, _record(trials, seed, cfg), say=print)
    record_final(trials, out, cfg)
    assert out.ok, (
        f"seed {seed} — replay with SRT_FAULT_SEED={seed} pytest "
        f"tests/faults/test_kill_trials.py -k 'local_state and {operator}'\n{out.table()}"
    )
