"""One-line wiring of the CreateContainer rewrite into the agent proxy."""

from __future__ import annotations

import logging
from collections.abc import Callable

from adaptor.cdi import Registry
from adaptor.devices.plan import DevicePlan
from adaptor.devices.rewrite import CdiMode, rewrite_create_container
from adaptor.ttrpc import Code, TtrpcError
from providers.errors import PeerpodsError

log = logging.getLogger(__name__)
CreateContainerHook = Callable[[bytes], bytes]


def make_hook(
    plan: DevicePlan | None, mode: CdiMode = "annotations", registry: Registry | None = None
) -> CreateContainerHook:
    """`AgentProxy(..., create_container_hook=make_hook(plan, mode, registry))`.

    A request the rewrite refuses is answered INVALID_ARGUMENT with the reason; it never reaches
    the agent as a silently device-less container.
    """

    def hook(payload: bytes) -> bytes:
        try:
            return rewrite_create_container(payload, plan, mode=mode, registry=registry)
        except PeerpodsError as exc:
            log.warning("CreateContainer refused: %s", exc)
            raise TtrpcError(Code.INVALID_ARGUMENT, str(exc)) from None

    return hook
