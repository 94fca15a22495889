"""Provider names -> where they live, imported on first use.

`peerpods serve --provider aws` imports `providers.clouds.aws` (and boto3) only then; a missing
SDK gives
an install hint instead of a traceback. A registry target is `module:attr`:

- "options" style (static, local): `attr(options)` checks the options and returns the step that
  builds the provider over the node's lease book;
- "settings" style (the clouds): `attr(settings, owner_id, resolve=, calls=)` with the
  provider's typed section (`Entry.settings`, from `providers.clouds.settings`, listed without
  importing the SDK; `peerpods serve` derives the provider's flags from it), the hook mapping a
  VM to the addresses the adaptor dials, and the daemon's `sdk.CloudCalls`.

A provider is built in two steps so that `serve` opens its state store only once the provider's
settings are known good, and builds the provider from the open store: `prepare` checks the
settings and does the slow start-up (a cloud's SDK client, its instance metadata) without
writing anything; `Prepared.finish` then builds the provider over the lease book (the state
store), at once and without IO.
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
        UserDataLimit(64 * 1024, "base64", "Azure user data (base64)"),
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


# The last step of a provider's build: the provider over the node's lease book (None: leases
# kept in memory), at once and without IO.
Finish = Callable[[LeaseBook | None], Provider]


@dataclass(frozen=True)
class Prepared:
    """A provider whose settings are checked and whose start-up is done, before anything is
    written (see the module): `finish` builds it over the lease book. `region` is the one its
    catalog is read for ("" for a provider without one)."""

    name: str
    region: str
    _finish: Finish

    @classmethod
    def built(cls, provider: Provider) -> Prepared:
        """A provider already built (one that keeps no leases, or a test's)."""
        return cls(provider.name, provider.region, lambda _leases: provider)

    def finish(self, leases: LeaseBook | None = None) -> Provider:
        """The provider, its pool's leases kept in `leases`."""
        provider = self._finish(leases)
        if not isinstance(provider, Provider):
            raise InvalidRequest(
                f"provider {self.name!r} does not implement the provider interface"
            )
        return provider


def prepare(name: str, options: ProviderOptions) -> Prepared:
    """Check the named provider's options and start it (a cloud provider is built here, asking
    the node's instance metadata service where it must); writes nothing. Blocking IO."""
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
            if not isinstance(provider, Provider):
                raise InvalidRequest(f"provider {name!r} does not implement the provider interface")
            return Prepared.built(provider)
        finish: Finish = target(options)
    except ModuleNotFoundError as exc:
        # The SDK is imported when the provider builds its client, not when its module loads.
        hint = f": pip install 'peerpods[{entry.extra}]'" if entry.extra else ""
        raise InvalidRequest(f"provider {name!r} needs the {exc.name} package{hint}") from None
    return Prepared(name, "", finish)


def create(name: str, options: ProviderOptions, leases: LeaseBook | None = None) -> Provider:
    """Build the named provider from `options` in one go (`prepare`, then `finish`)."""
    return prepare(name, options).finish(leases)


def _static(options: ProviderOptions) -> Finish:
    from providers.clouds.static import StaticProvider, pool_endpoints

    endpoints = tuple(pool_endpoints(options.static_endpoints))
    return lambda leases: StaticProvider(endpoints, leases)


def _local(options: ProviderOptions) -> Finish:
    from providers.clouds.local import LocalProvider

    if len(options.static_endpoints) > 1:
        raise InvalidRequest("the local provider takes exactly one endpoint")
    provider = LocalProvider(options.static_endpoints[0] if options.static_endpoints else None)
    return lambda _leases: provider
