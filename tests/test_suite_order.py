"""The suite's own scheduling (tests/conftest.py): the files it starts first exist, so a rename
cannot quietly send a long file back to the end of the run."""

from __future__ import annotations

from tests.helpers import LONGEST_FILES, ROOT


def test_the_longest_files_named_for_the_schedule_exist():
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
    assert [f for f in LONGEST_FILES if not (ROOT / f).is_file()] == []
