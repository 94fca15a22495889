"""The warm request a pool's VM boots with: the images to pull before it powers off.

Where it travels: as the `peerpods-warm` key of `/run/peerpod/apf.json`, the one file every pod
VM image writes from its user data (CAA's `process-user-data` writes only allow-listed files, and
apf.json is one of them; cloud-init writes it as any other `write_files` entry). A warm VM's
apf.json carries this key and no pod network: it serves no pod on that boot. A pod's apf.json
never carries it, which is how `peerpods podvm warm` tells a warm boot from a pod's.

This module owns the key in both directions: the adaptor's warm pool builds the document with
`apf_document`, the pod VM reads it back with `read_request`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adaptor.podvm.layout import APF_PATH, LayoutError, load_json

__all__ = [
    "APF_PATH",
    "WARM_KEY",
    "MalformedWarmRequest",
    "WarmRequest",
    "WarmRequestError",
    "apf_document",
    "check_images",
    "read_request",
]

WARM_KEY = "peerpods-warm"
MAX_IMAGES = 64
MAX_IMAGE_CHARS = 512


class WarmRequestError(LayoutError):
    """An apf.json that cannot be read (names the file and the problem)."""


class MalformedWarmRequest(WarmRequestError):
    """An apf.json whose `peerpods-warm` key is there but malformed: a warm boot all the same."""


class WarmRequest(BaseModel):
    """The `peerpods-warm` value: the images this VM pulls before it powers off."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    images: tuple[str, ...] = Field((), max_length=MAX_IMAGES)

    @field_validator("images")
    @classmethod
    def _names(cls, images: tuple[str, ...]) -> tuple[str, ...]:
        for image in images:
            if not image or len(image) > MAX_IMAGE_CHARS or not image.isprintable():
                raise ValueError(f"{image[:80]!r} is not an image name")
            if any(c.isspace() for c in image):
                raise ValueError(f"{image[:80]!r}: an image name has no spaces")
        return images

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def check_images(images: Sequence[str]) -> tuple[str, ...]:
    """`images` as a request carries them; ValueError names the first one it cannot carry."""
    try:
        return WarmRequest(images=tuple(images)).images
    except ValidationError as exc:
        raise ValueError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None


def apf_document(images: Sequence[str]) -> dict[str, Any]:
    """The whole apf.json of a warm VM: the warm request, no pod network (CAA's forwarder would
    have nothing to set up, and never starts on a warm boot: the VM powers off before it)."""
    return {WARM_KEY: WarmRequest(images=tuple(images)).to_dict()}


def read_request(apf_path: Path) -> WarmRequest | None:
    """The warm request in `apf_path`; None when the file or the key is absent (a pod's boot).

    A file that exists but is not a JSON object is a WarmRequestError: it is not this module's
    to say whether such a boot is a pod's. A key that is there with a malformed value is a
    MalformedWarmRequest: the boot is a warm one, whose request cannot be carried out.
    """
    try:
        text = apf_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise WarmRequestError(f"{apf_path}: not UTF-8 text") from None
    except OSError as exc:
        raise WarmRequestError(f"{apf_path}: {exc.strerror or exc}") from None
    try:
        apf = load_json(text, str(apf_path))
    except LayoutError as exc:
        raise WarmRequestError(str(exc)) from None
    if not isinstance(apf, dict):
        raise WarmRequestError(f"{apf_path}: not a JSON object")
    raw = apf.get(WARM_KEY)
    if raw is None:
        return None
    try:
        return WarmRequest.model_validate(raw)
    except ValidationError as exc:
        raise MalformedWarmRequest(f"{apf_path}: {WARM_KEY}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg
