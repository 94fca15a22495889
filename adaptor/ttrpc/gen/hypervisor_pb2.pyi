from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class CreateVMRequest(_message.Message):
    __slots__ = ("id", "annotations", "networkNamespacePath")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    NETWORKNAMESPACEPATH_FIELD_NUMBER: _ClassVar[int]
    id: str
    annotations: _containers.ScalarMap[str, str]
    networkNamespacePath: str
    def __init__(self, id: _Optional[str] = ..., annotations: _Optional[_Mapping[str, str]] = ..., networkNamespacePath: _Optional[str] = ...) -> None: ...

class CreateVMResponse(_message.Message):
    __slots__ = ("agentSocketPath",)
    AGENTSOCKETPATH_FIELD_NUMBER: _ClassVar[int]
    agentSocketPath: str
    def __init__(self, agentSocketPath: _Optional[str] = ...) -> None: ...

class StartVMRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class StartVMResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopVMRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class StopVMResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VersionRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    def __init__(self, version: _Optional[str] = ...) -> None: ...

class VersionResponse(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: str
    def __init__(self, version: _Optional[str] = ...) -> None: ...
