"""The region a catalog is read for when `--region` is empty: the provider's own region setting
of `peerpods serve` (`--aws-region`, `--azure-region`, the region of the first `--gcp-zones`
zone), from their environment twins, which the webhook's Deployment and the catalog refresh
CronJob take from the adaptor's ConfigMap. One region set there serves all three, on every
cloud, and the default region only when none is set."""

from __future__ import annotations

import os
from collections.abc import Mapping

from providers.core.settings import env_name

AWS_REGION = env_name("--aws-region")
AZURE_REGION = env_name("--azure-region")
GCP_ZONES = env_name("--gcp-zones")


def catalog_region(provider: str, region: str, environ: Mapping[str, str] | None = None) -> str:
    """`region` when given, else the provider's region setting in `environ`; "" when neither
    (the caller's default region then)."""
    if region.strip():
        return region.strip()
    environ = os.environ if environ is None else environ
    if provider == "aws":
        return environ.get(AWS_REGION, "").strip()
    if provider == "azure":
        return environ.get(AZURE_REGION, "").strip()
    if provider == "gcp":
        zones = [z.strip() for z in environ.get(GCP_ZONES, "").split(",") if z.strip()]
        return zones[0].rsplit("-", 1)[0] if zones else ""
    return ""
