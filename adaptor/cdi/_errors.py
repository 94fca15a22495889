"""CDI errors, part of the one PeerpodsError tree.

InvalidRequest
└── CdiError            anything CDI refused, with a message that names the culprit
    ├── SpecError       a spec file that does not load or validate (names the file)
    ├── DeviceNameError a malformed qualified device name or annotation
    ├── ResolveError    qualified names no loaded spec provides
    └── EditError       edits that cannot be applied here (e.g. would need a device stat)
"""

from __future__ import annotations

from providers.core.errors import InvalidRequest


class CdiError(InvalidRequest):
    """Base of every CDI refusal."""


class SpecError(CdiError):
    """A CDI spec that cannot be loaded: unreadable, malformed, or invalid."""


class DeviceNameError(CdiError):
    """A qualified device name, kind or annotation that breaks the naming rules."""


class ResolveError(CdiError):
    """Requested devices that no loaded spec provides."""

    def __init__(self, unresolved: list[str]) -> None:
        super().__init__("unresolvable CDI devices: " + ", ".join(unresolved))
        self.unresolved = unresolved


class EditError(CdiError):
    """Container edits that cannot be applied to this spec."""
