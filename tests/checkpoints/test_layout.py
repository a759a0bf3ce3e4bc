"""The checkpoint directory's layout."""

from __future__ import annotations

import pytest

from stateful_runtime.checkpoints.layout import claim
from stateful_runtime.exceptions import CheckpointOwnershipError


def test_checkpoint_dir_is_bound_to_its_job(tmp_path):
    claim(tmp_path, "job-a", ["q"])
    claim(tmp_path, "job-a", ["q"])  # the same job may come back
    with pytest.raises(CheckpointOwnershipError, match="belongs to job 'job-a'"):
        claim(tmp_path, "job-b", ["q"])
