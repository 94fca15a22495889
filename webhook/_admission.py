"""One AdmissionReview in, one out: the webhook's protocol without any HTTP.

Two error channels (as admission webhooks must keep them apart): a body that is not an
AdmissionReview raises InvalidRequest, which the server answers with HTTP 400; a pod that cannot
be admitted is a normal review response with `allowed: false`, a code and a message.

`review` is `parse` then `decide`; the server calls them apart so that a pod whose admission
evaluates DRA selectors (`needs_selectors`) waits in its own queue, never in front of plain pods,
unless `decide_from_memory` can decide it at once (its objects read and its selectors evaluated
before, as for most pods made from one template).
Selectors of one admission are bounded together by `cel_timeout_seconds` and evaluated by
`cel_runner` (the server's worker processes; None: in this thread): the `SelectorLimits` each
decision passes down. What is derived from the catalog (its selector, device space and the ranks
of DRA requests) is the `CatalogView` this admission holds for the catalog in use. A peer pod's
UPDATE may not touch its contract annotations, and its VM image and initdata are removed at
CREATE unless `vm_choices` allows them (`_policy.py`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from providers.core.catalog import Catalog
from providers.core.contract import SEAL, seal, sealed
from providers.core.errors import Fault, InvalidRequest, PeerpodsError
from webhook._catalog_view import CatalogView
from webhook._devices import SelectorLimits, SelectorRunner
from webhook._metrics import observe
from webhook._mutate import MutationResult, Settings, is_sealed, mutate_pod
from webhook._patch import diff
from webhook._policy import VmChoices, protected_changes
from webhook._reapply import reapply
from webhook._resolver import MemoryResolver, NotInMemory, Resolver
from webhook._reviews import AdmissionReview, parse_review, response
from webhook._settings import POLICY

log = logging.getLogger(__name__)

# How a denial answers each fault (providers.core.errors.Fault): the HTTP code, the log level,
# and a prefix naming peerpods where the fault is ours or transient, not the pod's. The one
# table of this boundary; `peerpods plan` reports the same codes.
ANSWER_OF_FAULT: dict[Fault, tuple[int, int, str]] = {
    Fault.INVALID: (400, logging.INFO, ""),
    Fault.NOT_FOUND: (400, logging.INFO, ""),
    Fault.BUSY: (409, logging.INFO, ""),
    Fault.UNSERVABLE: (403, logging.INFO, ""),
    Fault.EXHAUSTED: (429, logging.INFO, "peerpods: "),
    Fault.UNAVAILABLE: (503, logging.WARNING, "peerpods: "),
    Fault.ABORTED: (503, logging.WARNING, "peerpods: "),
    Fault.TIMEOUT: (504, logging.WARNING, "peerpods: "),
    Fault.INTERNAL: (500, logging.WARNING, ""),
}

CatalogSource = Callable[[], Catalog | None]

# How long a decision from memory may use the catalog the source last gave before one decision
# asks the source again (the long way): a reloaded catalog is in use within this much more.
CATALOG_RECHECK_SECONDS = 1.0


class Admission:
    """Admission decisions for pods under one policy, catalog and resolver."""

    def __init__(
        self,
        settings: Settings,
        catalog: CatalogSource | None = None,
        resolver: Resolver | None = None,
        cel_timeout_seconds: float = POLICY.cel_timeout_seconds,
        cel_runner: SelectorRunner | None = None,
        vm_choices: VmChoices | None = None,
    ) -> None:
        self.settings = settings
        self.catalog: CatalogSource = catalog or (lambda: None)
        self.resolver: Resolver = resolver or MemoryResolver()
        self.cel_timeout_seconds = cel_timeout_seconds
        self.cel_runner = cel_runner
        self.vm_choices = vm_choices or VmChoices()
        self._view: CatalogView | None = None
        self._view_lock = threading.Lock()
        # (time.monotonic(), view) of the last `view()`: what a decision from memory uses
        self._viewed: tuple[float, CatalogView | None] | None = None

    def view(self) -> CatalogView | None:
        """The view of the catalog the source gives now (None: no catalog), built once per
        catalog: a reloaded catalog gets a new one, and the old one goes with it."""
        catalog = self.catalog()
        if catalog is None:
            self._viewed = (time.monotonic(), None)
            return None
        with self._view_lock:
            if self._view is None or self._view.catalog is not catalog:
                self._view = CatalogView(catalog)
            self._viewed = (time.monotonic(), self._view)
            return self._view

    def _remembered_view(self) -> CatalogView | None:
        """The view `view()` gave less than CATALOG_RECHECK_SECONDS ago, without asking the
        source (which may read a file or call a cloud's API); NotInMemory when older."""
        viewed = self._viewed
        if viewed is None or time.monotonic() - viewed[0] > CATALOG_RECHECK_SECONDS:
            raise NotInMemory("the catalog")
        return viewed[1]

    def review(self, body: bytes) -> dict[str, Any]:
        """The response review for a request body; InvalidRequest when it is not a review."""
        return self.decide(parse_review(body))

    @staticmethod
    def parse(body: bytes) -> AdmissionReview:
        """The review in a request body; InvalidRequest when it is not one."""
        return parse_review(body)

    def needs_selectors(self, review: AdmissionReview) -> bool:
        """Whether deciding this review may evaluate DRA selectors (a peer pod with claims)."""
        pod = review.request.object
        if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
            return False
        if self.settings.dra_driver:
            return False  # the scheduler allocates claims in the DRA-driver mode
        return self._is_peer(pod) and bool(pod["spec"].get("resourceClaims"))

    def decide(self, review: AdmissionReview, arrived: float | None = None) -> dict[str, Any]:
        """The response review for a parsed request; `arrived` (time.monotonic()) is when the
        request came in: the CEL time limit counts from then, queueing included. Counted in
        webhook._metrics."""
        started = time.monotonic() if arrived is None else arrived
        answer = self._decide(review, arrived)
        observe(review.request.operation, answer, time.monotonic() - started)
        return answer

    def decide_from_memory(
        self, review: AdmissionReview, arrived: float | None = None
    ) -> dict[str, Any] | None:
        """As `decide`, where nothing needed waits: the catalog as the source gave it within
        CATALOG_RECHECK_SECONDS, every DRA object read before (and not expired), every
        selector's outcome cached. None where something would: asking the catalog source, a
        lookup or a selector evaluation (the caller then calls `decide` where waiting is
        allowed); nothing is counted then. Most DRA pods of a cluster repeat the templates and
        classes of others."""
        started = time.monotonic() if arrived is None else arrived
        try:
            answer = self._decide(review, arrived, memory_only=True)
        except NotInMemory:
            return None
        observe(review.request.operation, answer, time.monotonic() - started)
        return answer

    def _decide(
        self, review: AdmissionReview, arrived: float | None, memory_only: bool = False
    ) -> dict[str, Any]:
        request = review.request
        uid = request.uid
        if request.kind.kind not in ("", "Pod") or request.object is None:
            return response(uid)
        if request.operation == "UPDATE":
            return self._update(review)
        if request.operation not in ("", "CREATE"):
            return response(uid)
        pod = request.object
        found = pod.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        name = str(meta.get("name") or meta.get("generateName") or "")
        own = meta.get("namespace")
        if own and request.namespace and own != request.namespace:
            message = f"the pod's namespace {own!r} is not the review's {request.namespace!r}"
            return response(uid, allowed=False, code=400, message=message)
        if not request.namespace and self.needs_selectors(review):
            # claims are read in the review's namespace only, never one the object names
            message = "a review of a pod with DRA claims must name its namespace"
            return response(uid, allowed=False, code=400, message=message)
        try:
            result = self._mutate(pod, request.namespace, arrived, memory_only)
        except PeerpodsError as exc:
            code, level, prefix = ANSWER_OF_FAULT[exc.fault]
            log.log(level, "denied pod %s/%s: %s", request.namespace, name, exc)
            return response(uid, allowed=False, code=code, message=f"{prefix}{exc}")
        except ValidationError as exc:
            # a value the contract models refuse (too many devices, a name too long)
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            message = f"the pod's device plan is invalid: {where}: {first['msg']}"
            log.info("denied pod %s/%s: %s", request.namespace, name, message)
            return response(uid, allowed=False, code=400, message=message)
        except (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError) as exc:
            # Mutating admission sees the object before the API server validates it: whatever
            # shape it has, the answer is a denial with a reason, never an HTTP 500.
            log.exception("denied pod %s/%s on an unexpected input", request.namespace, name)
            # the exception's text may quote a claim or template: only its class goes back
            message = f"peerpods: the pod cannot be admitted as written ({type(exc).__name__})"
            return response(uid, allowed=False, code=400, message=message)
        return self._admitted(uid, pod, result, request.namespace, name)

    def _mutate(
        self, pod: dict[str, Any], namespace: str, arrived: float | None, memory_only: bool
    ) -> MutationResult:
        limits = SelectorLimits.starting(
            self.cel_runner, self.cel_timeout_seconds, namespace, arrived
        )
        resolver = self.resolver
        if memory_only:
            limits = dataclasses.replace(limits, memory_only=True)
            resolver = resolver.from_memory()
        return mutate_pod(
            pod,
            resolver=resolver,
            catalog=self._remembered_view() if memory_only else self.view(),
            settings=self.settings,
            namespace=namespace,
            limits=limits,
        )

    def _admitted(
        self, uid: str, pod: dict[str, Any], result: MutationResult, namespace: str, name: str
    ) -> dict[str, Any]:
        """The answer admitting a pod: its patch, less the VM image/initdata annotations of a
        peer pod that the operator's policy does not allow (each removal a warning)."""
        patch, warnings = result.patch, list(result.warnings)
        if result.intent is not None:  # a peer pod: the operator decides its VM image/initdata
            annotations = result.pod.get("metadata", {}).get("annotations") or {}
            refused = self.vm_choices.disallowed(annotations, namespace)
            if refused:
                for key, why in refused:
                    del annotations[key]
                    warnings.append(f"annotation {key} removed: {why} (operator policy)")
                    log.info("pod %s/%s: %s removed: %s", namespace, name, key, why)
                patch = diff(pod, result.pod)
        return response(uid, patch=patch, warnings=warnings)

    def _is_peer(self, pod: Any) -> bool:
        spec = pod.get("spec") if isinstance(pod, dict) else None
        runtime_class = spec.get("runtimeClassName") if isinstance(spec, dict) else None
        return isinstance(runtime_class, str) and runtime_class in self.settings.runtime_classes

    def _update(self, review: AdmissionReview) -> dict[str, Any]:
        """A re-apply is mutated as the creation was (`webhook._reapply`); a peer pod's contract
        annotations are fixed at admission: changes are denied."""
        request = review.request
        old, new = request.old_object, request.object
        if not (self._is_peer(old) or self._is_peer(new)):
            return response(request.uid)
        meta = new.get("metadata") if isinstance(new, dict) else None
        name = str(meta.get("name") or "") if isinstance(meta, dict) else ""
        try:
            old_annotations = _pod_annotations(old)
            _pod_annotations(new)  # the shape is checked before anything reads it
            namespace = request.namespace

            def was_mutated(annotations: Mapping[str, str]) -> bool:
                return is_sealed(self.settings, namespace, annotations)

            stored = new
            if isinstance(old, dict) and isinstance(new, dict):
                stored = _reseal(
                    self.settings,
                    namespace,
                    reapply(old, new, was_mutated, self.settings.dra_driver),
                )
            changed = protected_changes(old_annotations, _pod_annotations(stored))
        except InvalidRequest as exc:
            return response(request.uid, allowed=False, code=400, message=str(exc))
        if not changed:
            return response(request.uid, patch=diff(new, stored))
        message = (
            f"annotation {', '.join(changed)} of a peer pod cannot change after creation "
            "(the pod VM is built from what was admitted)"
        )
        log.info("denied update of pod %s/%s: %s", request.namespace, name, message)
        return response(request.uid, allowed=False, code=403, message=message)


def _reseal(settings: Settings, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """A pod sealed under a key still accepted (a rotation's previous one) is sealed again
    under the current key, so the old key can be dropped once such pods were updated."""
    annotations = _pod_annotations(pod)
    if not is_sealed(settings, namespace, annotations) or sealed(
        settings.seal_key, namespace, annotations
    ):
        return pod
    resealed = copy.deepcopy(pod)
    resealed["metadata"]["annotations"][SEAL] = seal(settings.seal_key, namespace, annotations)
    return resealed


def _pod_annotations(pod: Any) -> dict[str, str]:
    if not isinstance(pod, dict):
        return {}
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if annotations is None:
        return {}
    if not isinstance(annotations, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise InvalidRequest("metadata.annotations must map strings to strings")
    return annotations
