"""Provider names -> where they live, imported on first use.

`peerpods serve --provider aws` imports `providers.clouds.aws` (and boto3) only then; a missing
SDK gives
an install hint instead of a traceback. A registry target is `module:attr`:

- "options" style (static, local): `attr(options)`, or `attr.from_options(options)` when the
  attribute has that classmethod;
- "args" style (the clouds): `attr(args, owner_id, resolve)` with the parsed `serve` flags, and
  the module's flags added to `serve` by `add_flags` (`Entry.flags`, imported without the SDK).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from providers.clouds.static import Endpoint, LeaseBook
from providers.core.base import Instance, Provider
from providers.core.errors import InvalidRequest


@dataclass(frozen=True)
class ProviderOptions:
    """What the daemon can tell any provider; each reads the fields it needs."""

    static_endpoints: tuple[Endpoint, ...] = ()
    leases: LeaseBook | None = None
    # For "args" style providers: the parsed `serve` flags, this node's owner tag value, and the
    # hook mapping a VM to the addresses the adaptor dials (tests map private ones to loopback).
    args: argparse.Namespace | None = None
    owner_id: str = ""
    resolve: Callable[[Instance], Instance] | None = None


@dataclass(frozen=True)
class Entry:
    """Where a provider lives and what installs its SDK."""

    target: str
    extra: str = ""  # pip extra carrying the SDK
    style: Literal["options", "args"] = "options"
    flags: str = ""  # `module:add_flags`, a function adding the provider's flags to `serve`


PROVIDERS: dict[str, Entry] = {
    "aws": Entry("providers.clouds.aws:from_args", "aws", "args", "providers.clouds.aws:add_flags"),
    "azure": Entry(
        "providers.clouds.azure:from_args", "azure", "args", "providers.clouds.azure:add_flags"
    ),
    "gcp": Entry("providers.clouds.gcp:from_args", "gcp", "args", "providers.clouds.gcp:add_flags"),
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


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Add every available provider's own flags to `serve` (providers not in this build: none)."""
    for name, entry in sorted(PROVIDERS.items()):
        if not entry.flags:
            continue
        try:
            add = _import(name, entry, entry.flags)
        except InvalidRequest:
            continue
        add(parser)


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
        if entry.style == "args":
            if options.args is None:
                raise InvalidRequest(f"provider {name!r} is configured by `peerpods serve` flags")
            if options.resolve is not None:
                provider = target(options.args, options.owner_id, options.resolve)
            else:
                provider = target(options.args, options.owner_id)
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
