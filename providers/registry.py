"""Provider names -> where they live, imported on first use.

`peerpods serve --provider aws` imports `providers.aws` (and boto3) only then; a missing SDK gives
an install hint instead of a traceback. A registry target is `module:attr`; the attribute is a
provider class or factory, built with `from_options(options)` when it has that classmethod, else
called as `attr(options)`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.base import Provider
from providers.errors import InvalidRequest
from providers.static import Endpoint, LeaseBook


@dataclass(frozen=True)
class ProviderOptions:
    """What the daemon can tell any provider; each reads the fields it needs."""

    static_endpoints: tuple[Endpoint, ...] = ()
    leases: LeaseBook | None = None
    region: str = ""
    # Provider-specific settings (`--provider-option KEY=VALUE` style), never credentials.
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Entry:
    """Where a provider lives and what installs its SDK."""

    target: str
    extra: str = ""  # pip extra carrying the SDK


PROVIDERS: dict[str, Entry] = {
    "aws": Entry("providers.aws:AwsProvider", "aws"),
    "azure": Entry("providers.azure:AzureProvider", "azure"),
    "gcp": Entry("providers.gcp:GcpProvider", "gcp"),
    "static": Entry("providers.registry:_static"),
    "local": Entry("providers.registry:_local"),
}


def names() -> list[str]:
    """Every registered provider name."""
    return sorted(PROVIDERS)


def load(name: str) -> Callable[..., Any]:
    """Import the provider's class or factory; InvalidRequest with a hint when it cannot be."""
    entry = PROVIDERS.get(name)
    if entry is None:
        raise InvalidRequest(f"unknown provider {name!r} (choose from {', '.join(names())})")
    module_name, _, attr = entry.target.partition(":")
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
    factory = getattr(target, "from_options", target)
    provider = factory(options)
    if not isinstance(provider, Provider):
        raise InvalidRequest(f"provider {name!r} does not implement the provider interface")
    return provider


def _static(options: ProviderOptions) -> Provider:
    from providers.static import StaticProvider

    return StaticProvider(options.static_endpoints, options.leases)


def _local(options: ProviderOptions) -> Provider:
    from providers.local import LocalProvider

    if len(options.static_endpoints) > 1:
        raise InvalidRequest("the local provider takes exactly one endpoint")
    return LocalProvider(options.static_endpoints[0] if options.static_endpoints else None)
