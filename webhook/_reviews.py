"""AdmissionReview v1 on the wire: the request we read and the response we write.

Only the fields the webhook uses are modelled; anything else in a review is ignored. A review
that does not parse is the caller's error (HTTP 400), never a denied pod.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from providers.core.errors import InvalidRequest

API_VERSION = "admission.k8s.io/v1"


class GroupVersionKind(BaseModel):
    model_config = ConfigDict(extra="ignore")

    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(BaseModel):
    """`request` of an AdmissionReview: the pod is `object` (a raw JSON object)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    uid: str = Field(min_length=1)
    kind: GroupVersionKind = Field(default_factory=GroupVersionKind)
    namespace: str = ""
    operation: str = ""
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(None, alias="oldObject")
    dry_run: bool = Field(False, alias="dryRun")


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: str = Field(alias="apiVersion")
    kind: str
    request: AdmissionRequest


def parse_review(body: bytes) -> AdmissionReview:
    """Decode a review; InvalidRequest with a one-line reason when it is not one."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError also covers integers longer than Python's 4300-digit conversion limit
        raise InvalidRequest(f"body is not JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("body is not a JSON object")
    try:
        review = AdmissionReview.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidRequest(f"not an AdmissionReview: {where}: {first['msg']}") from None
    if review.kind != "AdmissionReview" or review.api_version != API_VERSION:
        raise InvalidRequest(
            f"expected kind AdmissionReview, apiVersion {API_VERSION}; "
            f"got {review.kind} {review.api_version}"
        )
    return review


def response(
    uid: str,
    *,
    allowed: bool = True,
    patch: list[dict[str, Any]] | None = None,
    warnings: list[str] | None = None,
    code: int = 0,
    message: str = "",
) -> dict[str, Any]:
    """The AdmissionReview to send back (a patch only when it has operations)."""
    body: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    if warnings:
        body["warnings"] = warnings
    if not allowed:
        body["status"] = {"code": code or 403, "message": message, "reason": "Forbidden"}
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": body}
