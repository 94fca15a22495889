"""One AdmissionReview in, one out: the webhook's protocol without any HTTP.

Two error channels (as admission webhooks must keep them apart): a body that is not an
AdmissionReview raises InvalidRequest, which the server answers with HTTP 400; a pod that cannot
be admitted is a normal review response with `allowed: false`, a code and a message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from providers.catalog import Catalog
from providers.errors import InvalidRequest, NoMatch, PeerpodsError
from webhook._mutate import Settings, mutate_pod
from webhook._resolver import LookupFailed, MemoryResolver, Resolver
from webhook._reviews import parse_review, response

log = logging.getLogger(__name__)

CatalogSource = Callable[[], Catalog | None]


class Admission:
    """Admission decisions for pods under one policy, catalog and resolver."""

    def __init__(
        self,
        settings: Settings,
        catalog: CatalogSource | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.settings = settings
        self.catalog: CatalogSource = catalog or (lambda: None)
        self.resolver: Resolver = resolver or MemoryResolver()

    def review(self, body: bytes) -> dict[str, Any]:
        """The response review for a request body; InvalidRequest when it is not a review."""
        review = parse_review(body)
        request = review.request
        uid = request.uid
        if request.kind.kind not in ("", "Pod") or request.object is None:
            return response(uid)
        if request.operation not in ("", "CREATE"):
            return response(uid)
        pod = request.object
        name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get(
            "generateName", ""
        )
        try:
            result = mutate_pod(
                pod,
                resolver=self.resolver,
                catalog=self.catalog(),
                settings=self.settings,
                namespace=request.namespace,
            )
        except NoMatch as exc:
            log.info("denied pod %s/%s: %s", request.namespace, name, exc)
            return response(uid, allowed=False, code=403, message=str(exc))
        except LookupFailed as exc:
            log.warning("denied pod %s/%s: %s", request.namespace, name, exc)
            return response(uid, allowed=False, code=503, message=f"peerpods: {exc}")
        except InvalidRequest as exc:
            log.info("denied pod %s/%s: %s", request.namespace, name, exc)
            return response(uid, allowed=False, code=400, message=str(exc))
        except PeerpodsError as exc:
            log.warning("denied pod %s/%s: %s", request.namespace, name, exc)
            return response(uid, allowed=False, code=500, message=str(exc))
        return response(uid, patch=result.patch, warnings=result.warnings)
