"""Azure Resource Manager behind a FakeCloud: real SDK clients whose HTTP goes to the fake.

`compute_client(fake)` is an `azure.mgmt.compute.ComputeManagementClient` using the SDK's own
`RequestsTransport` over a session with the fake mounted, a stub credential and no polling delay,
so every serializer, pager and poller of the SDK runs for real.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests

from tests.providers.fakes.http import FakeCloud, PageToken

__all__ = [
    "SKUS_PATH",
    "SUBSCRIPTION",
    "StubCredential",
    "compute_client",
    "network_client",
    "recorded_skus",
    "serve_skus",
]

SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
SKUS_PATH = rf"/subscriptions/{SUBSCRIPTION}/providers/Microsoft\.Compute/skus"
NEXT_LINK = PageToken(param="$skiptoken", field="nextLink", absolute=True)
DATA = Path(__file__).resolve().parent / "data"


class StubCredential:
    """A TokenCredential that hands out a fixed bearer token (never a real one)."""

    def get_token(self, *_scopes: str, **_kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        return AccessToken("fake-token", int(time.time()) + 3600)


def _session(fake: FakeCloud) -> requests.Session:
    session = requests.Session()
    fake.mount_on(session)
    return session


def compute_client(fake: FakeCloud, subscription: str = SUBSCRIPTION) -> Any:
    """A ComputeManagementClient whose every request is answered by `fake`."""
    from azure.core.pipeline.transport import RequestsTransport
    from azure.mgmt.compute import ComputeManagementClient

    transport = RequestsTransport(session=_session(fake), session_owner=False)
    return ComputeManagementClient(
        StubCredential(),
        subscription,
        transport=transport,
        polling_interval=0,
        retry_total=0,
    )


def network_client(fake: FakeCloud, subscription: str = SUBSCRIPTION) -> Any:
    """A NetworkManagementClient whose every request is answered by `fake`."""
    from azure.core.pipeline.transport import RequestsTransport
    from azure.mgmt.network import NetworkManagementClient

    transport = RequestsTransport(session=_session(fake), session_owner=False)
    return NetworkManagementClient(
        StubCredential(),
        subscription,
        transport=transport,
        polling_interval=0,
        retry_total=0,
    )


def recorded_skus(location: str) -> list[dict[str, Any]]:
    """The recorded `resource_skus.list` items for a location (data/azure-<location>-skus.json)."""
    recorded: dict[str, Any] = json.loads((DATA / f"azure-{location}-skus.json").read_text())
    items: list[dict[str, Any]] = recorded["value"]
    return items


def serve_skus(fake: FakeCloud, items: list[dict[str, Any]], page_size: int = 25) -> None:
    """Answer the resource SKU listing with `items`, `page_size` per page chained by nextLink."""
    pages = [{"value": items[i : i + page_size]} for i in range(0, max(len(items), 1), page_size)]
    fake.pages("GET", SKUS_PATH, pages, NEXT_LINK)
