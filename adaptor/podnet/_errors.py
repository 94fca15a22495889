"""Errors of the pod network, inside peerpods' one tree (providers.core.errors).

    PeerpodsError
    └── PodNetError             the pod network cannot be built, checked or removed
        ├── BadNetns            (also an InvalidRequest) CreateVM's netns path is unusable:
        │                       missing, not a network namespace, no single IPv4 address
        ├── NetnsGone           a recorded pod netns no longer exists (the pod is gone)
        ├── VniExhausted        every VNI of the configured range is held
        └── TunnelError         a netlink or nftables call failed; the message names the step

pyroute2's NetlinkError and OSError are translated here, at the one boundary that calls them.
"""

from __future__ import annotations

from providers.core.errors import Fault, InvalidRequest, PeerpodsError


class PodNetError(PeerpodsError):
    """The pod network could not be inspected, set up, checked or torn down."""


class BadNetns(PodNetError, InvalidRequest):
    """CreateVM's network namespace path cannot carry a pod network (nothing was created)."""


class NetnsGone(PodNetError):
    """The pod's network namespace no longer exists."""


class VniExhausted(PodNetError):
    """No VNI of the configured range is free."""

    fault = Fault.EXHAUSTED


class TunnelError(PodNetError):
    """A kernel operation on the tunnel failed."""
