"""RELIABILITY.md is rendered from tests/faults/report.py's template: every section the file has
is in the template too, so re-rendering it after a trial run drops none."""

from __future__ import annotations

import re

from tests.faults.report import HEADER
from tests.helpers import ROOT


def _headings(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, flags=re.M)


def test_the_template_holds_every_section_of_reliability_md():
    assert _headings(HEADER) == _headings((ROOT / "RELIABILITY.md").read_text())
