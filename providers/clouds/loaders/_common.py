"""What every catalog loader shares: the progress callback, SDK import hints, region checks."""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable
from types import ModuleType

from providers.core.errors import CatalogError, InvalidRequest

__all__ = ["Progress", "import_sdk", "no_progress", "report", "require_region"]

log = logging.getLogger(__name__)

Progress = Callable[[str, int], None]
"""Called as `progress(stage, advance)` after each page: `stage` says what is being listed
("instance types", "offerings us-east-1a"), `advance` how many items that page held. A tqdm bar
maps it to `bar.set_description(stage); bar.update(advance)`. Totals are not known up front."""


def no_progress(_stage: str, _advance: int) -> None:
    """The default: report nothing."""


def report(progress: Progress | None, stage: str, advance: int) -> None:
    """Call the progress callback, never letting a broken one abort a listing."""
    if progress is None:
        return
    try:
        progress(stage, advance)
    except Exception:  # a display problem must not lose the catalog
        log.warning("progress callback failed", exc_info=True)


def import_sdk(module: str, extra: str) -> ModuleType:
    """Import a cloud SDK module, or say how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CatalogError(
            f"the {extra} catalog loader needs {module.split('.')[0]}: "
            f"pip install 'peerpods[{extra}]'"
        ) from exc


def require_region(cloud: str, region: str, pattern: str, example: str) -> str:
    """Reject a malformed region name before any API call is made."""
    if not isinstance(region, str) or not re.fullmatch(pattern, region):
        raise InvalidRequest(f"{cloud}: {region!r} is not a region name (like {example!r})")
    return region
