"""The node's own limits on what a pod may choose about its VM, whatever the annotations say.

The webhook strips or refuses a pinned instance type and a chosen VM image unless the operator
allows them, but annotations can reach CreateVM without it (a pod updated after admission, a
cluster without the webhook, a webhook configured more loosely). So the adaptor checks again:
`machine_type` must be one of `--allowed-machine-types` and `image` one of `--allowed-images`
(both empty by default: no pod may choose either). A refused choice is INVALID_ARGUMENT at
CreateVM naming the annotation, and nothing is recorded. `cc_init_data` is never passed to a VM
by this adaptor, so it needs no list.
"""

from __future__ import annotations

from dataclasses import dataclass

from providers.core.contract import IMAGE, MACHINE_TYPE, VMIntent
from providers.core.errors import AnnotationError

__all__ = ["VmPolicy"]


@dataclass(frozen=True)
class VmPolicy:
    """Instance types a pod may pin and images it may choose (flags of `peerpods serve`)."""

    machine_types: frozenset[str] = frozenset()
    images: frozenset[str] = frozenset()

    def check(self, intent: VMIntent) -> None:
        """AnnotationError for a choice this node does not allow."""
        if intent.machine_type and intent.machine_type not in self.machine_types:
            raise AnnotationError(
                MACHINE_TYPE,
                f"instance type {intent.machine_type!r} may not be pinned on this node "
                f"(--allowed-machine-types: {_listed(self.machine_types)})",
            )
        if intent.image and intent.image not in self.images:
            raise AnnotationError(
                IMAGE,
                f"pod VM image {intent.image[:80]!r} is not allowed on this node "
                f"(--allowed-images: {_listed(self.images)})",
            )


def _listed(values: frozenset[str]) -> str:
    return ", ".join(sorted(values)) or "none"
