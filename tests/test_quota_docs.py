"""Point the operator at the namespace GPU quota trap where they look: docs/webhook.md says plainly
that a `requests.nvidia.com/gpu` quota does not see annotation-path peer pods, that
`requests.kata.peerpods.io/gpu` does, and that the DRA-driver mode binds the former natively."""

from __future__ import annotations

import re
from pathlib import Path

WEBHOOK = Path(__file__).resolve().parent.parent / "docs" / "webhook.md"


def test_the_quota_section_opens_with_the_trap_and_the_two_ways_out() -> None:
    section = WEBHOOK.read_text().split("## Namespace GPU quotas", 1)[1].split("\n## ", 1)[0]
    opening = re.sub(r"\s+", " ", section.strip().split("\n\n", 1)[0])
    assert "A `requests.nvidia.com/gpu` quota does not see peer pods" in opening
    assert "`requests.kata.peerpods.io/gpu`" in opening and "does bind them" in opening
    assert "DRA-driver mode" in opening and "bind it natively" in opening
