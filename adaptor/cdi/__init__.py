"""A CDI (Container Device Interface) library: strict spec loading, qualified names, a registry
over spec directories, and container edits applied to OCI JSON or to the agent's protobuf Spec."""

from adaptor.cdi._apply import JsonTarget, apply_to, combine, host_stat
from adaptor.cdi._errors import (
    CdiError,
    DeviceNameError,
    EditError,
    ResolveError,
    SpecError,
)
from adaptor.cdi._names import (
    ANNOTATION_PREFIX,
    QualifiedName,
    annotation_value,
    is_qualified_name,
    parse_annotations,
    parse_qualified_name,
)
from adaptor.cdi._pbapply import ProtoTarget, apply_to_proto
from adaptor.cdi._registry import DEFAULT_SPEC_DIRS, Registry, Resolved
from adaptor.cdi._spec import (
    VALID_VERSIONS,
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    Mount,
    Spec,
    load_spec,
    minimum_version,
    parse_spec,
    spec_to_dict,
)

__all__ = [
    "ANNOTATION_PREFIX",
    "DEFAULT_SPEC_DIRS",
    "VALID_VERSIONS",
    "CdiError",
    "ContainerEdits",
    "Device",
    "DeviceNameError",
    "DeviceNode",
    "EditError",
    "Hook",
    "JsonTarget",
    "Mount",
    "ProtoTarget",
    "QualifiedName",
    "Registry",
    "ResolveError",
    "Resolved",
    "Spec",
    "SpecError",
    "annotation_value",
    "apply_to",
    "apply_to_proto",
    "combine",
    "host_stat",
    "is_qualified_name",
    "load_spec",
    "minimum_version",
    "parse_annotations",
    "parse_qualified_name",
    "parse_spec",
    "spec_to_dict",
]
