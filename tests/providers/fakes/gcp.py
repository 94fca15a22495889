"""Google Compute Engine behind a FakeCloud: real `compute_v1` clients whose HTTP goes to the fake.

Each client gets the SDK's own REST transport built with `AnonymousCredentials()`, with the fake
mounted on that transport's session, so request building, JSON parsing and pagers run for real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from tests.providers.fakes.http import FakeCloud, PageToken

__all__ = [
    "COMPUTE",
    "PAGE_TOKEN",
    "PROJECT",
    "client",
    "clients",
    "recorded",
    "serve_recorded",
]

PROJECT = "peerpods-test"
COMPUTE = "/compute/v1/projects/(?P<project>[^/]+)"
PAGE_TOKEN = PageToken(param="pageToken", field="nextPageToken")
DATA = Path(__file__).resolve().parent / "data"

C = TypeVar("C")


def client(fake: FakeCloud, client_class: type[C]) -> C:
    """A `compute_v1` client (MachineTypesClient, InstancesClient, ...) answered by `fake`."""
    from google.auth.credentials import AnonymousCredentials

    transport_class: Any = client_class.get_transport_class("rest")  # type: ignore[attr-defined]
    transport = transport_class(credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    fake.mount_on(transport._session)
    made: C = client_class(transport=transport)  # type: ignore[call-arg]
    return made


def clients(fake: FakeCloud) -> Any:
    """The loader's GcpClients bundle (regions, machine types, accelerator types) over `fake`."""
    from google.cloud import compute_v1

    from providers.clouds.loaders.gcp import GcpClients

    return GcpClients(
        regions=client(fake, compute_v1.RegionsClient),
        machine_types=client(fake, compute_v1.MachineTypesClient),
        accelerator_types=client(fake, compute_v1.AcceleratorTypesClient),
    )


def recorded(region: str) -> dict[str, Any]:
    """Recorded GCE responses for a region (data/gcp-<region>.json): the region resource and,
    per zone, the machine type and accelerator type list items."""
    data: dict[str, Any] = json.loads((DATA / f"gcp-{region}.json").read_text())
    return data


def serve_recorded(fake: FakeCloud, data: dict[str, Any], page_size: int = 20) -> None:
    """Answer regions.get, machineTypes.list and acceleratorTypes.list from recorded data,
    `page_size` items per page chained by nextPageToken."""
    region = data["region"]
    fake.reply("GET", rf"{COMPUTE}/regions/{region['name']}", region)
    for zone, listing in data["zones"].items():
        for kind, list_kind in (
            ("machineTypes", "compute#machineTypeList"),
            ("acceleratorTypes", "compute#acceleratorTypeList"),
        ):
            items = listing.get(kind, [])
            pages = [
                {"kind": list_kind, "id": f"projects/{PROJECT}/zones/{zone}/{kind}"}
                | ({"items": items[i : i + page_size]} if items else {})
                for i in range(0, max(len(items), 1), page_size)
            ]
            fake.pages("GET", rf"{COMPUTE}/zones/{zone}/{kind}", pages, PAGE_TOKEN)
