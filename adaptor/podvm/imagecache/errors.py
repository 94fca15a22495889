"""Why a pull failed, one class per cause, so each image's report says which.

PullError                   (PeerpodsError)
├── RegistryUnreachable     no connection, TLS failure, the connection broke
├── PullTimeout             a request ran past its deadline
├── AuthenticationFailed    the registry or its token service refused us
├── ImageNotFound           no such repository, tag or digest
├── RegistryResponseError   an answer the protocol does not allow (status, headers, body)
├── ContentMismatch         bytes that do not hash to the digest they were asked by
├── ContentTooLarge         a manifest or blob over its cap or its declared size
└── UnsupportedImage        a manifest kind or platform this puller cannot take
"""

from __future__ import annotations

from providers.core.errors import Fault, PeerpodsError


class PullError(PeerpodsError):
    """An image could not be pulled into the store."""

    fault = Fault.UNAVAILABLE


class RegistryUnreachable(PullError):
    """The registry could not be reached, or the connection broke."""


class PullTimeout(PullError):
    """A request ran past its deadline."""

    fault = Fault.TIMEOUT


class AuthenticationFailed(PullError):
    """The registry, or its token service, refused the credentials (or their absence)."""

    fault = Fault.INVALID


class ImageNotFound(PullError):
    """The registry has no such repository, tag or digest."""

    fault = Fault.NOT_FOUND


class RegistryResponseError(PullError):
    """The registry answered in a way the distribution protocol does not allow."""


class ContentMismatch(PullError):
    """Content whose bytes do not hash to the digest it was asked by."""

    fault = Fault.INTERNAL


class ContentTooLarge(PullError):
    """A manifest or blob over its cap, or over the size its descriptor declared."""

    fault = Fault.EXHAUSTED


class UnsupportedImage(PullError):
    """A manifest kind (Docker schema 1) or a platform this puller cannot take."""

    fault = Fault.INVALID
