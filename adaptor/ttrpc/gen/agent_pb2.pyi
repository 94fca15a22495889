from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StringUser(_message.Message):
    __slots__ = ("uid", "gid", "additionalGids")
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    ADDITIONALGIDS_FIELD_NUMBER: _ClassVar[int]
    uid: str
    gid: str
    additionalGids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, uid: _Optional[str] = ..., gid: _Optional[str] = ..., additionalGids: _Optional[_Iterable[str]] = ...) -> None: ...

class Device(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Storage(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SharedMount(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateContainerRequest(_message.Message):
    __slots__ = ("container_id", "exec_id", "string_user", "devices", "storages", "OCI", "sandbox_pidns", "shared_mounts", "stdin_port", "stdout_port", "stderr_port")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    STRING_USER_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    STORAGES_FIELD_NUMBER: _ClassVar[int]
    OCI_FIELD_NUMBER: _ClassVar[int]
    SANDBOX_PIDNS_FIELD_NUMBER: _ClassVar[int]
    SHARED_MOUNTS_FIELD_NUMBER: _ClassVar[int]
    STDIN_PORT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_PORT_FIELD_NUMBER: _ClassVar[int]
    STDERR_PORT_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    exec_id: str
    string_user: StringUser
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    storages: _containers.RepeatedCompositeFieldContainer[Storage]
    OCI: Spec
    sandbox_pidns: bool
    shared_mounts: _containers.RepeatedCompositeFieldContainer[SharedMount]
    stdin_port: int
    stdout_port: int
    stderr_port: int
    def __init__(self, container_id: _Optional[str] = ..., exec_id: _Optional[str] = ..., string_user: _Optional[_Union[StringUser, _Mapping]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., storages: _Optional[_Iterable[_Union[Storage, _Mapping]]] = ..., OCI: _Optional[_Union[Spec, _Mapping]] = ..., sandbox_pidns: _Optional[bool] = ..., shared_mounts: _Optional[_Iterable[_Union[SharedMount, _Mapping]]] = ..., stdin_port: _Optional[int] = ..., stdout_port: _Optional[int] = ..., stderr_port: _Optional[int] = ...) -> None: ...

class StartContainerRequest(_message.Message):
    __slots__ = ("container_id",)
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    def __init__(self, container_id: _Optional[str] = ...) -> None: ...

class WaitProcessRequest(_message.Message):
    __slots__ = ("container_id", "exec_id")
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    container_id: str
    exec_id: str
    def __init__(self, container_id: _Optional[str] = ..., exec_id: _Optional[str] = ...) -> None: ...

class WaitProcessResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: int
    def __init__(self, status: _Optional[int] = ...) -> None: ...

class Spec(_message.Message):
    __slots__ = ("Version", "Process", "Root", "Hostname", "Mounts", "Hooks", "Annotations", "Linux")
    class AnnotationsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    HOOKS_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    LINUX_FIELD_NUMBER: _ClassVar[int]
    Version: str
    Process: Process
    Root: Root
    Hostname: str
    Mounts: _containers.RepeatedCompositeFieldContainer[Mount]
    Hooks: Hooks
    Annotations: _containers.ScalarMap[str, str]
    Linux: Linux
    def __init__(self, Version: _Optional[str] = ..., Process: _Optional[_Union[Process, _Mapping]] = ..., Root: _Optional[_Union[Root, _Mapping]] = ..., Hostname: _Optional[str] = ..., Mounts: _Optional[_Iterable[_Union[Mount, _Mapping]]] = ..., Hooks: _Optional[_Union[Hooks, _Mapping]] = ..., Annotations: _Optional[_Mapping[str, str]] = ..., Linux: _Optional[_Union[Linux, _Mapping]] = ...) -> None: ...

class Process(_message.Message):
    __slots__ = ("Args", "Env", "Cwd")
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    Args: _containers.RepeatedScalarFieldContainer[str]
    Env: _containers.RepeatedScalarFieldContainer[str]
    Cwd: str
    def __init__(self, Args: _Optional[_Iterable[str]] = ..., Env: _Optional[_Iterable[str]] = ..., Cwd: _Optional[str] = ...) -> None: ...

class Root(_message.Message):
    __slots__ = ("Path", "Readonly")
    PATH_FIELD_NUMBER: _ClassVar[int]
    READONLY_FIELD_NUMBER: _ClassVar[int]
    Path: str
    Readonly: bool
    def __init__(self, Path: _Optional[str] = ..., Readonly: _Optional[bool] = ...) -> None: ...

class Mount(_message.Message):
    __slots__ = ("destination", "source", "type", "options")
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    destination: str
    source: str
    type: str
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, destination: _Optional[str] = ..., source: _Optional[str] = ..., type: _Optional[str] = ..., options: _Optional[_Iterable[str]] = ...) -> None: ...

class Hooks(_message.Message):
    __slots__ = ("Prestart", "Poststart", "Poststop", "CreateRuntime", "CreateContainer", "StartContainer")
    PRESTART_FIELD_NUMBER: _ClassVar[int]
    POSTSTART_FIELD_NUMBER: _ClassVar[int]
    POSTSTOP_FIELD_NUMBER: _ClassVar[int]
    CREATERUNTIME_FIELD_NUMBER: _ClassVar[int]
    CREATECONTAINER_FIELD_NUMBER: _ClassVar[int]
    STARTCONTAINER_FIELD_NUMBER: _ClassVar[int]
    Prestart: _containers.RepeatedCompositeFieldContainer[Hook]
    Poststart: _containers.RepeatedCompositeFieldContainer[Hook]
    Poststop: _containers.RepeatedCompositeFieldContainer[Hook]
    CreateRuntime: _containers.RepeatedCompositeFieldContainer[Hook]
    CreateContainer: _containers.RepeatedCompositeFieldContainer[Hook]
    StartContainer: _containers.RepeatedCompositeFieldContainer[Hook]
    def __init__(self, Prestart: _Optional[_Iterable[_Union[Hook, _Mapping]]] = ..., Poststart: _Optional[_Iterable[_Union[Hook, _Mapping]]] = ..., Poststop: _Optional[_Iterable[_Union[Hook, _Mapping]]] = ..., CreateRuntime: _Optional[_Iterable[_Union[Hook, _Mapping]]] = ..., CreateContainer: _Optional[_Iterable[_Union[Hook, _Mapping]]] = ..., StartContainer: _Optional[_Iterable[_Union[Hook, _Mapping]]] = ...) -> None: ...

class Hook(_message.Message):
    __slots__ = ("Path", "Args", "Env", "Timeout")
    PATH_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    Path: str
    Args: _containers.RepeatedScalarFieldContainer[str]
    Env: _containers.RepeatedScalarFieldContainer[str]
    Timeout: int
    def __init__(self, Path: _Optional[str] = ..., Args: _Optional[_Iterable[str]] = ..., Env: _Optional[_Iterable[str]] = ..., Timeout: _Optional[int] = ...) -> None: ...

class Linux(_message.Message):
    __slots__ = ("Resources", "CgroupsPath", "Devices")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    CGROUPSPATH_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    Resources: LinuxResources
    CgroupsPath: str
    Devices: _containers.RepeatedCompositeFieldContainer[LinuxDevice]
    def __init__(self, Resources: _Optional[_Union[LinuxResources, _Mapping]] = ..., CgroupsPath: _Optional[str] = ..., Devices: _Optional[_Iterable[_Union[LinuxDevice, _Mapping]]] = ...) -> None: ...

class LinuxDevice(_message.Message):
    __slots__ = ("Path", "Type", "Major", "Minor", "FileMode", "UID", "GID")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    FILEMODE_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    Path: str
    Type: str
    Major: int
    Minor: int
    FileMode: int
    UID: int
    GID: int
    def __init__(self, Path: _Optional[str] = ..., Type: _Optional[str] = ..., Major: _Optional[int] = ..., Minor: _Optional[int] = ..., FileMode: _Optional[int] = ..., UID: _Optional[int] = ..., GID: _Optional[int] = ...) -> None: ...

class LinuxResources(_message.Message):
    __slots__ = ("Devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    Devices: _containers.RepeatedCompositeFieldContainer[LinuxDeviceCgroup]
    def __init__(self, Devices: _Optional[_Iterable[_Union[LinuxDeviceCgroup, _Mapping]]] = ...) -> None: ...

class LinuxDeviceCgroup(_message.Message):
    __slots__ = ("Allow", "Type", "Major", "Minor", "Access")
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MAJOR_FIELD_NUMBER: _ClassVar[int]
    MINOR_FIELD_NUMBER: _ClassVar[int]
    ACCESS_FIELD_NUMBER: _ClassVar[int]
    Allow: bool
    Type: str
    Major: int
    Minor: int
    Access: str
    def __init__(self, Allow: _Optional[bool] = ..., Type: _Optional[str] = ..., Major: _Optional[int] = ..., Minor: _Optional[int] = ..., Access: _Optional[str] = ...) -> None: ...
