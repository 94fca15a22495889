"""Each cloud's image (`scripts/build-image --cloud aws|azure|gcp`) builds from Containerfile,
runs `peerpods` as uid 65532 with that cloud's SDK clients and offline catalog working, and is at
most 200 MiB, base included (the size is printed).

Registries for base images are out of reach here, so the base is made locally: a minimal Debian
with python3 from Debian's own packages (mmdebstrap), imported into buildah as an image. Both the
root file system and the imported image are cached between runs (PEERPODS_TEST_CACHE, default
~/.cache/peerpods-tests), so a warm run only builds peerpods itself. buildah runs as root with
the vfs storage driver and chroot isolation: no overlay mounts, no user namespaces, no daemon.

Needs root, buildah and mmdebstrap (tests/run installs the latter two); outside CI it skips when
they are missing. Slow: minutes, most of it vfs copying layers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SUITE = "bookworm"  # python3 3.11: the oldest Python peerpods supports
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Leave out what a runtime image never reads: documentation, manual pages, translations.
EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
# mmdebstrap merges /usr with Debian's usrmerge package, which brings perl (45 MiB) along: gone
# once the merge is done, as in the slim Python images this base stands in for.
CUSTOMIZE = (
    'chroot "$1" apt-get -y -q purge usrmerge perl libperl5.36 perl-modules-5.36 '
    "libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl"
)
# A TLS-inspecting proxy between this machine and PyPI: the base must trust what the host trusts.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The goal for each cloud's image, base included (the base here is about 122 MiB, as the slim
# Python image is): docs/install.md, "The image".
IMAGE_MIB = 200
CLOUDS = ("aws", "azure", "gcp")


def _cache() -> Path:
    default = Path.home() / ".cache" / "peerpods-tests"
    path = Path(os.environ.get("PEERPODS_TEST_CACHE", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def buildah(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The buildah command with this test's storage: vfs under the cache, run state in tmp."""
    missing = [tool for tool in ("buildah", "mmdebstrap") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        reason = f"needs root and {', '.join(missing) or 'buildah, mmdebstrap'}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"the image test {reason} (tests/run installs them)")
        pytest.skip(f"the image test {reason}")
    runroot = tmp_path_factory.mktemp("buildah-run")
    return [
        "buildah",
        "--storage-driver",
        "vfs",
        "--root",
        str(_cache() / "storage"),
        "--runroot",
        str(runroot),
    ]


def run(*command: str, timeout: float = 600, **kwargs: object) -> str:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return str(done.stdout)


def _key() -> str:
    parts = [SUITE, *PACKAGES, *EXCLUDES, CUSTOMIZE]
    if HOST_CA.exists():
        parts.append(hashlib.sha256(HOST_CA.read_bytes()).hexdigest())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def debian_rootfs(key: str) -> Path:
    """A minimal Debian root file system as a tar file, made once per key."""
    tar = _cache() / f"debian-{SUITE}-{key}.tar"
    if tar.exists():
        return tar
    partial = tar.with_suffix(".partial")
    run(
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        f"--include={','.join(PACKAGES)}",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in EXCLUDES),
        f"--customize-hook={CUSTOMIZE}",
        "--format=tar",
        SUITE,
        str(partial),
        timeout=1200,
    )
    partial.rename(tar)
    return tar


@pytest.fixture(scope="module")
def base(buildah: list[str]) -> str:
    """The locally made Debian base as an image in buildah's storage, imported once per key."""
    key = _key()
    name = f"localhost/peerpods-test-base:{key}"
    known = subprocess.run([*buildah, "inspect", "--type", "image", name], capture_output=True)
    if known.returncode == 0:
        return name
    tar = debian_rootfs(key)
    container = run(*buildah, "from", "scratch").strip()
    try:
        run(*buildah, "add", container, str(tar), "/")
        env = ["--env", f"PATH={PATH}"]
        if HOST_CA.exists():
            run(*buildah, "copy", container, str(HOST_CA), str(HOST_CA))
            env += ["--env", f"PIP_CERT={HOST_CA}"]
        run(*buildah, "config", *env, "--cmd", "/bin/sh", container)
        run(*buildah, "commit", "-q", container, name)
    finally:
        subprocess.run([*buildah, "rm", container], capture_output=True)
    return name


@pytest.fixture(scope="module", params=CLOUDS)
def image(request: pytest.FixtureRequest, buildah: list[str], base: str) -> Iterator[str]:
    """One cloud's image, built by scripts/build-image --cloud on the local base."""
    cloud = request.param
    tag = f"localhost/peerpods-test:{uuid.uuid4().hex[:12]}"
    env = {**os.environ, "ENGINE": "buildah", "ENGINE_OPTS": " ".join(buildah[1:])}
    printed = run(
        str(ROOT / "scripts" / "build-image"),
        "--base", base, "--cloud", cloud, "--tag", tag, "--", "--isolation", "chroot",
        env=env, timeout=1800,
    )  # fmt: skip
    assert printed.strip() == f"{tag}-{cloud}"
    try:
        yield printed.strip()
    finally:
        subprocess.run([*buildah, "rmi", printed.strip()], capture_output=True)
        subprocess.run([*buildah, "rmi", "--prune"], capture_output=True)  # the build stage


def image_mib(buildah: list[str], image: str, scratch: Path) -> float:
    """The image's size as a registry and `podman images` count it: its layers, uncompressed."""
    run(*buildah, "push", "--quiet", "--disable-compression", image, f"dir:{scratch}")
    manifest = json.loads((scratch / "manifest.json").read_text())
    return float(sum(layer["size"] for layer in manifest["layers"])) / 2**20


def test_image_config(buildah: list[str], image: str) -> None:
    config = json.loads(run(*buildah, "inspect", "--type", "image", image))["OCIv1"]["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["peerpods"]
    assert config["Labels"]["org.opencontainers.image.version"] == VERSION
    assert any(e.startswith("PATH=/opt/peerpods/bin:") for e in config["Env"])


# Each cloud's SDK clients as peerpods creates them, offline: what scripts/prune-venv.py removed
# (botocore's other models, Compute Engine's other clients) is nothing they load.
SDK_CHECK = {
    "aws": """
import boto3
for service in ("ec2", "service-quotas", "pricing", "sts", "sso", "sso-oidc"):
    boto3.client(service, region_name="us-east-1", aws_access_key_id="a", aws_secret_access_key="s")
""",
    "azure": """
from azure.identity import DefaultAzureCredential
from azure.mgmt.compute import ComputeManagementClient, models
from azure.mgmt.network import NetworkManagementClient
compute = ComputeManagementClient(DefaultAzureCredential(), "0")
compute.virtual_machines, compute.usage, compute.resource_skus, models.VirtualMachine
NetworkManagementClient(DefaultAzureCredential(), "0").network_interfaces
""",
    "gcp": """
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1
for name in ("InstancesClient", "RegionsClient", "MachineTypesClient", "AcceleratorTypesClient"):
    getattr(compute_v1, name)(credentials=AnonymousCredentials())
compute_v1.Instance, compute_v1.Scheduling, compute_v1.AcceleratorConfig
""",
}

# One `buildah run` (each sets up its own mounts): the commands' outputs, one section each.
INSIDE = """
id -u
echo ::
peerpods --version
echo ::
python3 -c 'import adaptor; print(adaptor.__file__)'
echo ::
python3 /tmp/sdk.py && python3 -c 'import adaptor.node.advertise, webhook._kube' && echo sdk ok
echo ::
peerpods select --provider "$CLOUD" --gpus 1 --output json
echo ::
peerpods plan /tmp/pod.yaml --output json
"""


def test_peerpods_runs_in_the_image(buildah: list[str], image: str, tmp_path: Path) -> None:
    cloud = image.rsplit("-", 1)[1]
    (tmp_path / "sdk.py").write_text(SDK_CHECK[cloud])
    container = run(*buildah, "from", image).strip()
    try:
        example = ROOT / "config" / "examples" / "gpu-pod.yaml"
        for path, where in ((example, "/tmp/pod.yaml"), (tmp_path / "sdk.py", "/tmp/sdk.py")):
            run(*buildah, "copy", "--chown", "65532:65532", container, str(path), where)
        out = run(
            *buildah, "run", "--isolation", "chroot", "--env", f"CLOUD={cloud}", container,
            "--", "/bin/sh", "-ec", INSIDE,
        )  # fmt: skip
        uid, version, where, sdk, selected, plan = out.split("::\n")
        assert uid.strip() == "65532"
        assert version == f"peerpods {VERSION}\n"
        # the installed package, nothing else: the venv's python comes first on PATH
        assert where.startswith("/opt/peerpods/lib/"), where
        assert sdk == "sdk ok\n"
        # the offline catalog of the image's own cloud answers as the source tree's does
        here = [sys.executable, "-m", "adaptor.cli.main"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        select = ["select", "--provider", cloud, "--gpus", "1", "--output", "json"]
        assert json.loads(selected) == json.loads(run(*here, *select, env=env))
        # the same decision as the source tree's, on the catalogs the wheel carries
        local_plan = run(*here, "plan", str(example), "--output", "json", env=env)
        assert json.loads(plan) == json.loads(local_plan)
    finally:
        subprocess.run([*buildah, "rm", container], capture_output=True)
    size = image_mib(buildah, image, tmp_path / "pushed")
    print(f"{image}: {size:.1f} MiB")
    assert size <= IMAGE_MIB, f"{image} is {size:.1f} MiB"
