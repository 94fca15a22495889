"""A module whose SDK is missing: the registry must turn its import error into a hint."""

import peerpods_absent_sdk  # type: ignore[import-not-found]  # noqa: F401
