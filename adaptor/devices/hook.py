"""One-line wiring of the CreateContainer rewrite into the agent proxy."""

from __future__ import annotations

import logging
from collections.abc import Callable

from adaptor.cdi import Registry
from adaptor.devices.plan import DevicePlan
from adaptor.devices.rewrite import CdiMode, decode_request, rewrite_for_container
from adaptor.proxy import Completion, CreateContainerHook
from adaptor.ttrpc import Code, TtrpcError
from providers.core.contract import CONTAINER_NAME
from providers.core.errors import PeerpodsError

log = logging.getLogger(__name__)

# (container name, its devices) -> a completion for the agent's answer, or None.
# Called with devices () and no answer to come when the rewrite itself refused the request.
OutcomeObserver = Callable[[str, tuple[str, ...], str], Completion | None]


def make_hook(
    plan: DevicePlan | None,
    mode: CdiMode = "annotations",
    registry: Registry | None = None,
    observe: OutcomeObserver | None = None,
) -> CreateContainerHook:
    """`AgentProxy(..., create_container_hook=make_hook(plan, mode, registry))`.

    A request the rewrite refuses is answered INVALID_ARGUMENT with the reason; it never reaches
    the agent as a silently device-less container. `observe` learns, per app container, which
    devices it was given and (through the completion it returns) whether the agent accepted them.
    """

    def hook(payload: bytes) -> bytes | tuple[bytes, Completion]:
        try:
            rewritten = rewrite_for_container(payload, plan, mode=mode, registry=registry)
        except PeerpodsError as exc:
            log.warning("CreateContainer refused: %s", exc)
            if observe is not None:
                observe(_container_name(payload), (), f"refused by the adaptor: {exc}")
            raise TtrpcError(Code.INVALID_ARGUMENT, str(exc)) from None
        if observe is None or not rewritten.container:
            return rewritten.payload
        completion = observe(rewritten.container, rewritten.devices, "")
        return (rewritten.payload, completion) if completion else rewritten.payload

    return hook


def _container_name(payload: bytes) -> str:
    """The container a refused request was for, when it can be told at all."""
    try:
        return str(decode_request(payload).OCI.Annotations.get(CONTAINER_NAME, ""))
    except PeerpodsError:
        return ""
