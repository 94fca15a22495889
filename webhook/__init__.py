"""The admission webhook: pods' GPU, MIG, RDMA and DRA requests into the annotation contract.

Layers import one way: wire schema (`_reviews`), pure admission logic (`_resources`,
`_extended`, `_cel`, `_devices`, `_dra`, `_mutate`, `_admission`), then the server (`_server`).
"""

from webhook._admission import ANSWER_OF_FAULT, Admission
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

__all__ = [
    "ANSWER_OF_FAULT",
    "CAPACITY_ANNOTATION",
    "POST_BOOT_ATTRIBUTES",
    "Admission",
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
    "Settings",
    "TlsFiles",
    "VirtualDevice",
    "VmChoices",
    "WebhookServer",
    "build_app",
    "diff",
    "load_seal_keys",
    "mutate_pod",
    "parse_namespace_policy",
    "pod_resources",
    "running",
]
