"""What a tenant may choose about its pod VM, and what it may never change afterwards.

- **VM image and initdata.** `io.katacontainers.config.hypervisor.image` picks the pod VM's boot
  image and `cc_init_data` its initdata (policy, keys, agent configuration): a tenant choosing
  them chooses what runs next to its workload with the node's trust. Both are removed from a
  peer pod (with a warning saying so) unless the operator's `VmChoices` policy allows them: the
  pod's namespace is listed (both allowed), or the image is on the list of allowed images.
- **Immutable contract.** Pod annotations can be changed after creation, and a scheduling gate
  gives time to change them before the sandbox starts; the adaptor reads them at CreateVM. On
  UPDATE of a peer pod, any change to `io.katacontainers.*` (the contract and Kata's own
  settings, including the device plan) or `cdi.k8s.io/*` is denied (`protected_changes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from providers.core.contract import CC_INIT_DATA, CDI_PREFIX, DEVICES, IMAGE
from webhook._settings import POLICY

__all__ = ["PROTECTED_PREFIXES", "VmChoices", "protected_changes"]

PROTECTED_PREFIXES = ("io.katacontainers.", CDI_PREFIX)


@dataclass(frozen=True)
class VmChoices:
    """The operator's policy on tenant-chosen pod VM images and initdata (flags of
    `peerpods webhook`: `--vm-image-namespaces`, `--allowed-vm-images`)."""

    namespaces: frozenset[str] = POLICY.vm_image_namespaces  # pods here may set image, initdata
    images: frozenset[str] = POLICY.allowed_vm_images  # images any peer pod may set

    def disallowed(self, annotations: Mapping[str, str], namespace: str) -> list[tuple[str, str]]:
        """(annotation, why) for each VM choice this pod may not make."""
        if namespace in self.namespaces:
            return []
        out: list[tuple[str, str]] = []
        image = annotations.get(IMAGE, "").strip()
        if image and image not in self.images:
            out.append((IMAGE, f"image {image[:80]!r} is not among the allowed pod VM images"))
        if annotations.get(CC_INIT_DATA, "").strip():
            out.append((CC_INIT_DATA, f"namespace {namespace!r} may not set pod VM initdata"))
        return out


def _protected(key: str) -> bool:
    return key.startswith(PROTECTED_PREFIXES) or key == DEVICES


def protected_changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """The protected annotation keys an update adds, removes or changes (sorted)."""
    keys = {k for k in (*old, *new) if _protected(k)}
    return sorted(k for k in keys if old.get(k) != new.get(k))
