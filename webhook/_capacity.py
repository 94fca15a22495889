"""The capacity type a pod gets (Spot or on-demand): its annotation, checked against policy.

A pod asks with `peerpods.io/capacity-type: spot | on-demand | spot-or-on-demand`. Without it the
pod gets the webhook's default (`--default-capacity-type`, on-demand unless configured). An
operator limits which types each namespace may ask for (`--namespace-capacity-types`), so a user
cannot opt a namespace into (or out of) Spot against policy: a value outside the namespace's list
is denied with the list, and so is a value that is not one of the three. Where the default is not
allowed in a namespace, that namespace's first allowed type is its default.

The result is written into the contract (`providers.core.contract`), never read back from a
user-written contract key, so the policy cannot be bypassed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from providers.core.capacity import CAPACITY_TYPES, CapacityType, parse_capacity_types
from providers.core.errors import AnnotationError, InvalidRequest
from providers.core.settings import csv
from webhook._settings import POLICY, AdmissionPolicy

CAPACITY_ANNOTATION = "peerpods.io/capacity-type"
ANY_NAMESPACE = "*"


@dataclass(frozen=True)
class CapacityPolicy:
    """The default capacity type and, per namespace, the types a pod there may ask for."""

    default: CapacityType = POLICY.default_capacity_type
    # namespace -> allowed types, in order of preference; "*" for namespaces not listed. A
    # namespace covered by neither may ask for any type.
    allowed: Mapping[str, tuple[CapacityType, ...]] = field(default_factory=dict)

    def allowed_in(self, namespace: str) -> tuple[CapacityType, ...]:
        """The types pods of `namespace` may ask for (every type when the policy is silent)."""
        found = self.allowed.get(namespace, self.allowed.get(ANY_NAMESPACE))
        return found if found else tuple(CapacityType)

    def resolve(self, namespace: str, annotations: Mapping[str, str]) -> CapacityType:
        """The capacity type of a pod in `namespace`; InvalidRequest (naming the annotation)
        for a value that is not a capacity type or that the namespace may not ask for."""
        allowed = self.allowed_in(namespace)
        raw = annotations.get(CAPACITY_ANNOTATION)
        if raw is None:
            return self.default if self.default in allowed else allowed[0]
        text = str(raw).strip().lower()
        try:
            wanted = CapacityType(text)
        except ValueError:
            want = ", ".join(CAPACITY_TYPES)
            message = f"{str(raw)[:64]!r} is not a capacity type (want one of {want})"
            raise AnnotationError(CAPACITY_ANNOTATION, message) from None
        if wanted not in allowed:
            raise AnnotationError(
                CAPACITY_ANNOTATION,
                f"namespace {namespace} may not ask for {wanted} capacity "
                f"(allowed there: {', '.join(allowed)})",
            )
        return wanted

    @classmethod
    def of(cls, policy: AdmissionPolicy) -> CapacityPolicy:
        """The policy as the settings declare it (--default-capacity-type and
        --namespace-capacity-types); InvalidRequest for a namespace policy that does not parse."""
        return cls(
            policy.default_capacity_type, parse_namespace_policy(policy.namespace_capacity_types)
        )


def parse_namespace_policy(text: str) -> dict[str, tuple[CapacityType, ...]]:
    """`NAMESPACE=TYPE|TYPE,...` (`*` for every other namespace) as a policy mapping."""
    policy: dict[str, tuple[CapacityType, ...]] = {}
    for item in csv(text):
        namespace, sep, types = item.partition("=")
        namespace = namespace.strip()
        if not sep or not namespace or not types.strip():
            raise InvalidRequest(
                f"--namespace-capacity-types: {item!r} is not NAMESPACE=TYPE|TYPE "
                "(e.g. ml=spot|spot-or-on-demand,*=on-demand)"
            )
        if namespace in policy:
            raise InvalidRequest(f"--namespace-capacity-types: namespace {namespace} twice")
        policy[namespace] = parse_capacity_types(
            types.replace("|", ","), f"--namespace-capacity-types {namespace}"
        )
    return policy
