"""The `local` provider, for development: every sandbox's "VM" is the same forwarder.

Point it at one pod VM forwarder (or a kata-agent behind a forwarder) running on your machine;
unlike `static`, any number of sandboxes share it, and creating or deleting does nothing remote.
"""

from __future__ import annotations

from providers.clouds.static import Endpoint
from providers.core.base import (
    TAG_OWNER,
    TAG_POD_NAME,
    TAG_POD_NAMESPACE,
    TAG_SANDBOX,
    Instance,
    VMSpec,
)
from providers.core.errors import InvalidRequest


class LocalProvider:
    """Maps every sandbox to one fixed endpoint; remembers which sandboxes it handed out."""

    name = "local"
    # One local forwarder: no region, zones or instance types to choose.
    region = ""
    zones: tuple[str, ...] = ()
    allowed_types: tuple[str, ...] = ()
    default_type = ""

    def __init__(self, endpoint: Endpoint | None) -> None:
        if endpoint is None:
            raise InvalidRequest("the local provider needs --static-endpoints HOST:PORT (one)")
        self.endpoint = endpoint
        self._owned: dict[str, Instance] = {}

    async def create(self, spec: VMSpec) -> Instance:
        instance = Instance(
            id=f"local-{spec.sandbox_id}",
            name=f"local-{spec.sandbox_id}",
            addresses=(self.endpoint.host,),
            instance_type="local",
            port=self.endpoint.port,
            tags={
                TAG_OWNER: "peerpods",
                TAG_SANDBOX: spec.sandbox_id,
                TAG_POD_NAMESPACE: spec.pod_namespace,
                TAG_POD_NAME: spec.pod_name,
            },
        )
        self._owned[instance.id] = instance
        return instance

    async def delete(self, instance_id: str) -> None:
        self._owned.pop(instance_id, None)

    async def list_owned(self) -> list[Instance]:
        return list(self._owned.values())
