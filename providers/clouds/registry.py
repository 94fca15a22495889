"""Provider names -> where they live, imported on first use.

`peerpods serve --provider aws` imports `providers.clouds.aws` (and boto3) only then; a missing
SDK gives
an install hint instead of a traceback. A registry target is `module:attr`:

- "options" style (static, local): `attr(options)`, or `attr.from_options(options)` when the
  attribute has that classmethod;
- "settings" style (the clouds): `attr(settings, owner_id, resolve=, calls=)` with the
  provider's typed section (`Entry.settings`, from `providers.clouds.settings`, listed without
  importing the SDK; `peerpods serve` derives the provider's flags from it), the hook mapping a
  VM to the addresses the adaptor dials, and the daemon's `sdk.CloudCalls`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from providers.clouds.sdk import CloudCalls
from providers.clouds.settings import AwsSettings, AzureSettings, CloudSettings, GcpSettings
from providers.clouds.static import Endpoint, LeaseBook
from providers.core.base import Instance, Provider, UserDataLimit
from providers.core.errors import InvalidRequest


@dataclass(frozen=True)
class ProviderOptions:
    """What the daemon can tell any provider; each reads the fields it needs."""

    static_endpoints: tuple[Endpoint, ...] = ()
    leases: LeaseBook | None = None
    # For "settings" style providers: their section, this node's owner tag value, and the hook
    # mapping a VM to the addresses the adaptor dials (tests map private ones to loopback).
    settings: CloudSettings | None = None
    owner_id: str = ""
    resolve: Callable[[Instance], Instance] | None = None
    # where a cloud provider's SDK calls run (the daemon's, shut down when it stops)
    calls: CloudCalls | None = None


@dataclass(frozen=True)
class Entry:
    """Where a provider lives and what installs its SDK."""

    target: str
    extra: str = ""  # pip extra carrying the SDK
    style: Literal["options", "settings"] = "options"
    settings: type[CloudSettings] | None = None  # the provider's own settings section
    user_data: UserDataLimit | None = None  # the cloud's limit on a VM's user data


PROVIDERS: dict[str, Entry] = {
    "aws": Entry(
        "providers.clouds.aws:from_settings",
        "aws",
        "settings",
        AwsSettings,
        UserDataLimit(16 * 1024, "raw", "EC2 user data"),
    ),
    "azure": Entry(
        "providers.clouds.azure:from_settings",
        "azure",
        "settings",
        AzureSettings,
        UserDataLimit(64 * 1024, "base64", "Azure custom data (base64)"),
    ),
    "gcp": Entry(
        "providers.clouds.gcp:from_settings",
        "gcp",
        "settings",
        GcpSettings,
        UserDataLimit(256 * 1024, "raw", "GCP metadata value user-data"),
    ),
    "static": Entry("providers.clouds.registry:_static"),
    "local": Entry("providers.clouds.registry:_local"),
}


def names() -> list[str]:
    """Every registered provider name."""
    return sorted(PROVIDERS)


def load(name: str) -> Callable[..., Any]:
    """Import the provider's class or factory; InvalidRequest with a hint when it cannot be."""
    entry = PROVIDERS.get(name)
    if entry is None:
        raise InvalidRequest(f"unknown provider {name!r} (choose from {', '.join(names())})")
    return _import(name, entry, entry.target)


def limit_of(name: str) -> UserDataLimit:
    """The named cloud's limit on a VM's user data; InvalidRequest for a provider that takes
    no user data (static, local) or an unknown one."""
    entry = PROVIDERS.get(name)
    if entry is None or entry.user_data is None:
        raise InvalidRequest(f"unknown cloud {name!r} for user data")
    return entry.user_data


def sections() -> list[type[CloudSettings]]:
    """Every provider's settings section, in name order (each once)."""
    found = [entry.settings for _, entry in sorted(PROVIDERS.items()) if entry.settings]
    return list(dict.fromkeys(found))


def section(name: str) -> type[CloudSettings] | None:
    """The named provider's settings section (None: it takes none)."""
    entry = PROVIDERS.get(name)
    return entry.settings if entry is not None else None


def _import(name: str, entry: Entry, target_path: str) -> Callable[..., Any]:
    module_name, _, attr = target_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise InvalidRequest(f"provider {name!r} is not available in this build") from None
        hint = f": pip install 'peerpods[{entry.extra}]'" if entry.extra else ""
        raise InvalidRequest(f"provider {name!r} needs the {missing} package{hint}") from None
    try:
        target: Callable[..., Any] = getattr(module, attr)
    except AttributeError:
        raise InvalidRequest(f"provider {name!r} is not available in this build") from None
    return target


def create(name: str, options: ProviderOptions) -> Provider:
    """Build the named provider from `options`."""
    target = load(name)
    entry = PROVIDERS[name]
    try:
        if entry.style == "settings":
            if entry.settings is None or not isinstance(options.settings, entry.settings):
                raise InvalidRequest(f"provider {name!r} is configured by `peerpods serve` flags")
            extra: dict[str, Any] = {"calls": options.calls} if options.calls else {}
            if options.resolve is not None:
                extra["resolve"] = options.resolve
            provider = target(options.settings, options.owner_id, **extra)
        else:
            factory = getattr(target, "from_options", target)
            provider = factory(options)
    except ModuleNotFoundError as exc:
        # The SDK is imported when the provider builds its client, not when its module loads.
        hint = f": pip install 'peerpods[{entry.extra}]'" if entry.extra else ""
        raise InvalidRequest(f"provider {name!r} needs the {exc.name} package{hint}") from None
    if not isinstance(provider, Provider):
        raise InvalidRequest(f"provider {name!r} does not implement the provider interface")
    return provider


def _static(options: ProviderOptions) -> Provider:
    from providers.clouds.static import StaticProvider

    return StaticProvider(options.static_endpoints, options.leases)


def _local(options: ProviderOptions) -> Provider:
    from providers.clouds.local import LocalProvider

    if len(options.static_endpoints) > 1:
        raise InvalidRequest("the local provider takes exactly one endpoint")
    return LocalProvider(options.static_endpoints[0] if options.static_endpoints else None)
