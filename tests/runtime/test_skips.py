"""The records ``srt run --skip`` passes, as the checkpoint keeps them (runtime/skips.py): every
skip a run gave stays recorded, whatever runs follow, whatever they give and however a writer
before them ended."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.runtime import skips

SKIP = st.tuples(st.sampled_from(["payments", "refunds"]), st.integers(0, 3), st.integers(0, 500))
# One run's --skip list; a stale temporary file: a writer killed before its rename (None: none).
RUN = st.tuples(st.lists(SKIP, max_size=4), st.none() | st.binary(max_size=40))


@settings(max_examples=60, deadline=None)
@given(runs=st.lists(RUN, min_size=1, max_size=8))
def test_every_skip_given_stays_recorded_whatever_runs_follow(runs):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ck" / "_dead_letters" / "skips.json"
        given_so_far: set[skips.Skip] = set()
        for run, stale in runs:
            if stale is not None:  # a writer killed between its write and its rename
                path.parent.mkdir(parents=True, exist_ok=True)
                path.with_name(f".{path.name}.{os.getpid() + 1}.tmp").write_bytes(stale)
            before = path.stat().st_mtime_ns if path.exists() else None
            returned = skips.record(path, run)
            new = set(run) - given_so_far
            given_so_far |= new
            assert skips.listed(returned) == sorted(given_so_far)
            assert skips.listed(skips.load(path)) == sorted(given_so_far)  # the next run's view
            if not new:  # nothing new: the record is not written again
                assert (path.stat().st_mtime_ns if path.exists() else None) == before


def test_an_unreadable_record_of_skips_is_refused_with_the_way_on(tmp_path):
    path = tmp_path / "skips.json"
    path.write_text('[["payments", 0')
    with pytest.raises(ConfigError, match="fix or delete it and give --skip again"):
        skips.load(path)
