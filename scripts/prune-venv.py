"""Remove from an installed virtual environment what peerpods never imports (the image build).

The dependencies bring more than peerpods uses: the Kubernetes client's asyncio twin
(`kubernetes.aio`, about 70 MB, with aiohttp under it), the Azure SDKs' asyncio clients, and
botocore's models of some 400 AWS services when peerpods calls EC2 alone. Each removal is named
below with the reason it is safe; a path that is not there is skipped (an extra not installed).

    python3 scripts/prune-venv.py /opt/peerpods/lib/python3.*/site-packages
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

# Packages imported by nothing peerpods runs (kubernetes.aio and what only it needs).
UNUSED = (
    "kubernetes/aio",  # the asyncio client; peerpods uses kubernetes.client
    "aiohttp",
    "aiohttp_retry",
    "aiohappyeyeballs",
    "aiosignal",
    "frozenlist",
    "multidict",
    "propcache",
    "yarl",
    "azure/mgmt/compute/aio",  # the asyncio clients; providers.clouds.azure uses the others
    "azure/mgmt/network/aio",
    "azure/identity/aio",
    "grpc_tools",  # protoc: a build tool, never a runtime import
)
# The botocore service models providers.clouds.aws reaches (EC2; STS and SSO for credentials).
BOTOCORE_SERVICES = frozenset({"ec2", "sts", "sso", "sso-oidc", "pricing"})


def prune(site: Path) -> int:
    """Remove what peerpods never imports under `site`; the bytes removed."""
    removed = 0
    targets = [site / name for name in UNUSED]
    data = site / "botocore" / "data"
    if data.is_dir():
        targets += [p for p in data.iterdir() if p.is_dir() and p.name not in BOTOCORE_SERVICES]
    targets += list(site.glob("*/tests")) + list(site.glob("*/*/tests"))
    for path in targets:
        if not path.is_dir():
            continue
        removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path)
    return removed


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not Path(argv[1]).is_dir():
        print("usage: prune-venv.py SITE-PACKAGES", file=sys.stderr)
        return 2
    removed = prune(Path(argv[1]))
    print(f"prune-venv: {removed / 2**20:.0f} MiB removed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
