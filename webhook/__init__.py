"""The admission webhook: pods' GPU, MIG, RDMA and DRA requests into the annotation contract.

Layers import one way: wire schema (`_reviews`), pure admission logic (`_resources`,
`_extended`, `_cel`, `_devices`, `_dra`, `_mutate`, `_admission`), then the server (`_server`).

Each public name is imported from its module on first use (PEP 562), so reading the settings
(`webhook._settings`, which every `peerpods` command's flags derive from) loads neither the
server, nor CEL, nor the API client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook._admission import ANSWER_OF_FAULT, Admission
    from webhook._allocate import AllocationFailed, Allocator
    from webhook._capacity import CAPACITY_ANNOTATION, CapacityPolicy, parse_namespace_policy
    from webhook._catalog_view import CatalogView
    from webhook._devices import POST_BOOT_ATTRIBUTES, DeviceSpace, SelectorLimits, VirtualDevice
    from webhook._dra import ClaimDenied
    from webhook._kube import KubeResolver
    from webhook._mutate import MutationResult, PodIntent, Settings, mutate_pod
    from webhook._patch import diff
    from webhook._policy import VmChoices
    from webhook._resolver import LookupFailed, MemoryResolver, ObjectNotFound, Resolver
    from webhook._resources import PodResources, pod_resources
    from webhook._sealkeys import SealKeyError, SealKeys, load_seal_keys
    from webhook._server import ServerConfig, TlsFiles, WebhookServer, build_app, running
    from webhook._settings import AdmissionPolicy, ServerSettings, WebhookPolicy

# public name -> the module it lives in
_WHERE = {
    "ANSWER_OF_FAULT": "_admission",
    "Admission": "_admission",
    "AllocationFailed": "_allocate",
    "Allocator": "_allocate",
    "AdmissionPolicy": "_settings",
    "CAPACITY_ANNOTATION": "_capacity",
    "CapacityPolicy": "_capacity",
    "CatalogView": "_catalog_view",
    "ClaimDenied": "_dra",
    "DeviceSpace": "_devices",
    "KubeResolver": "_kube",
    "LookupFailed": "_resolver",
    "MemoryResolver": "_resolver",
    "MutationResult": "_mutate",
    "ObjectNotFound": "_resolver",
    "POST_BOOT_ATTRIBUTES": "_devices",
    "PodIntent": "_mutate",
    "PodResources": "_resources",
    "Resolver": "_resolver",
    "SealKeyError": "_sealkeys",
    "SealKeys": "_sealkeys",
    "SelectorLimits": "_devices",
    "ServerConfig": "_server",
    "ServerSettings": "_settings",
    "Settings": "_mutate",
    "TlsFiles": "_server",
    "VirtualDevice": "_devices",
    "VmChoices": "_policy",
    "WebhookPolicy": "_settings",
    "WebhookServer": "_server",
    "build_app": "_server",
    "diff": "_patch",
    "load_seal_keys": "_sealkeys",
    "mutate_pod": "_mutate",
    "parse_namespace_policy": "_capacity",
    "pod_resources": "_resources",
    "running": "_server",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'webhook' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"webhook.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ANSWER_OF_FAULT",
    "CAPACITY_ANNOTATION",
    "POST_BOOT_ATTRIBUTES",
    "Admission",
    "AdmissionPolicy",
    "AllocationFailed",
    "Allocator",
    "CapacityPolicy",
    "CatalogView",
    "ClaimDenied",
    "DeviceSpace",
    "KubeResolver",
    "LookupFailed",
    "MemoryResolver",
    "MutationResult",
    "ObjectNotFound",
    "PodIntent",
    "PodResources",
    "Resolver",
    "SealKeyError",
    "SealKeys",
    "SelectorLimits",
    "ServerConfig",
    "ServerSettings",
    "Settings",
    "TlsFiles",
    "VirtualDevice",
    "VmChoices",
    "WebhookPolicy",
    "WebhookServer",
    "build_app",
    "diff",
    "load_seal_keys",
    "mutate_pod",
    "parse_namespace_policy",
    "pod_resources",
    "running",
]
