"""The settings of the commands other than `serve`, one section each (`providers.core.settings`
says how to add one); the commands' flags, env twins and help derive from these fields.

Sections two commands share are declared once and given to both: `plan` takes the webhook's
admission policy and the adaptor's CDI names, `select` and `plan` read the same catalog.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from adaptor.settings import WarmPoolList
from providers.core.catalog import ARCHES, CLOUDS
from providers.core.settings import Flag, Names, Section
from webhook import AdmissionPolicy, ServerSettings, WebhookPolicy


class LogSettings(Section):
    """Logging, before or after the subcommand."""

    log_level: Annotated[Literal["debug", "info", "warning", "error"], Flag("--log-level")] = Field(
        "info", description="log level"
    )
    log_format: Annotated[Literal["json", "text"], Flag("--log-format")] = Field(
        "json", description="log line format (stderr)"
    )


class CatalogChoice(Section):
    """Which cloud's catalog, in which region (`select`, `plan`, `catalog refresh`)."""

    provider: Annotated[str, Flag("--provider", choices=CLOUDS)] = Field(
        "aws", description="cloud whose catalog to read"
    )
    region: Annotated[str, Flag("--region")] = Field(
        "", description="region (default: us-east-1, eastus or us-central1 by provider)"
    )


class CatalogSource(Section):
    """Where catalog snapshots are read from."""

    catalog_dir: Annotated[str, Flag("--catalog-dir", metavar="DIR")] = Field(
        "", description="folder of catalog snapshots (default: the bundled snapshots)"
    )


class OutputSettings(Section):
    """How a report is printed."""

    output: Annotated[Literal["table", "json"], Flag("--output")] = Field(
        "table", description="output format"
    )


class SelectSettings(CatalogChoice, CatalogSource, OutputSettings):
    """`peerpods select`: the request, described by flags."""

    gpus: Annotated[int, Flag("--gpus", metavar="N")] = Field(0, description="whole GPUs")
    gpu_model: Annotated[str, Flag("--gpu-model", metavar="M[,M...]")] = Field(
        "",
        description="acceptable GPU models, alternatives (h100, a100-80gb, 'NVIDIA L4', ...)",
    )
    gpu_memory: Annotated[str, Flag("--gpu-memory", metavar="QTY")] = Field(
        "", description="minimum memory per GPU, Kubernetes quantity (e.g. 40Gi)"
    )
    mig: Annotated[str, Flag("--mig", metavar="PROFILE=COUNT[,...]")] = Field(
        "", description="MIG devices, e.g. 1g.10gb=2,3g.40gb=1"
    )
    vcpus: Annotated[str, Flag("--vcpus", metavar="N")] = Field("", description="minimum vCPUs")
    memory: Annotated[str, Flag("--memory", metavar="QTY")] = Field(
        "", description="minimum memory (e.g. 16Gi)"
    )
    allow: Annotated[str, Flag("--allow", metavar="TYPE[,...]")] = Field(
        "", description="only these instance types (globs like 'p5.*' allowed)"
    )
    deny: Annotated[str, Flag("--deny", metavar="TYPE[,...]")] = Field(
        "", description="never these instance types (globs allowed)"
    )
    instance_type: Annotated[str, Flag("--instance-type", metavar="TYPE")] = Field(
        "", description="an explicit instance type, checked against the catalog and --allow"
    )
    zone: Annotated[str, Flag("--zone")] = Field("", description="only types offered in this zone")
    spot: Annotated[bool, Flag("--spot")] = Field(
        False,
        description="a Spot VM: only types sold as Spot, ranked by Spot price (a type with no "
        "published Spot price by its on-demand price, what Spot costs at most)",
    )
    reservation: Annotated[str, Flag("--reservation", metavar="ID")] = Field(
        "",
        description="a capacity reservation or block you hold (AWS cr-..., a GCP reservation): "
        "types sold only that way become candidates",
    )
    confidential: Annotated[bool, Flag("--confidential")] = Field(
        False, description="confidential computing: only confidential VM sizes (Azure NCC H100 v5)"
    )
    rdma: Annotated[bool, Flag("--rdma")] = Field(
        False, description="RDMA (EFA / InfiniBand) required"
    )
    fractional: Annotated[bool, Flag("--fractional")] = Field(
        False, description="a fraction of a GPU (g6f, NV*ads_A10_v5) may serve one GPU"
    )
    arch: Annotated[str, Flag("--arch", choices=ARCHES)] = Field(
        "x86_64", description="architecture of the pod VM image"
    )
    live: Annotated[bool, Flag("--live")] = Field(
        False,
        description="read the cloud's API instead of the bundled snapshot (needs credentials)",
    )
    limit: Annotated[int, Flag("--limit", metavar="N")] = Field(
        10, description="candidates shown in the table (JSON lists all)"
    )


class PlanSettings(CatalogChoice, CatalogSource, OutputSettings, AdmissionPolicy):
    """`peerpods plan`: which pod of the manifest, and how much of the ranking to show."""

    pod: Annotated[str, Flag("--pod", metavar="NAME")] = Field(
        "", description="the pod to plan when the manifest holds several"
    )
    limit: Annotated[int, Flag("--limit", metavar="N")] = Field(
        5, description="candidates shown in the table (JSON lists all)"
    )
    warm_pools: Annotated[
        WarmPoolList, Flag("--warm-pool", metavar="TYPE=N[@ZONE]", repeated=True)
    ] = Field(
        (),
        description="the node's warm pools, as serve's --warm-pool: the plan says whether the "
        "pod would get a warm VM, and from which pool",
    )


class WebhookSettings(ServerSettings, WebhookPolicy, CatalogSource):
    """`peerpods webhook`: the server and its policy (declared in webhook._settings), and the
    catalog DRA selectors and impossible requests are checked against."""

    provider: Annotated[str, Flag("--provider", choices=("", *CLOUDS))] = Field(
        "",
        description="cloud whose catalog DRA selectors and impossible requests are checked "
        "against (empty: no catalog; pods with DRA claims are denied)",
    )
    region: Annotated[str, Flag("--region")] = Field(
        "",
        description="catalog region (default: the provider's region setting of serve, "
        "PEERPODS_AWS_REGION, PEERPODS_AZURE_REGION or the region of PEERPODS_GCP_ZONES, else "
        "the cloud's default)",
    )


class CatalogRefreshSettings(CatalogChoice):
    """`peerpods catalog refresh`: where types and prices come from, where the snapshot goes."""

    region: Annotated[str, Flag("--region")] = Field(
        "",
        description="region (default: the provider's region setting of serve, "
        "PEERPODS_AWS_REGION, PEERPODS_AZURE_REGION or the region of PEERPODS_GCP_ZONES, else "
        "us-east-1, eastus or us-central1)",
    )

    out: Annotated[str, Flag("--out", metavar="DIR")] = Field(
        ".",
        description="folder to write <provider>-<region>.json and prices/<provider>-<region>.csv "
        "into",
    )
    types: Annotated[Literal["live", "snapshot"], Flag("--types")] = Field(
        "live", description="instance types from the cloud's API (live) or the bundled snapshot"
    )
    gcp_api_key: Annotated[str, Flag("--gcp-api-key", metavar="KEY")] = Field(
        "", description="API key for the GCP Cloud Billing Catalog (gcp only)"
    )
    aws_spot: Annotated[bool, Flag("--aws-spot")] = Field(
        True,
        description="aws: also read current Spot prices (EC2 DescribeSpotPriceHistory, "
        "credentials needed; skipped with a warning when they are missing)",
    )
    no_progress: Annotated[bool, Flag("--no-progress")] = Field(
        False, description="no progress bar on stderr"
    )


class PodvmPrepareSettings(Section):
    """`peerpods podvm prepare`, inside the pod VM: where the layout, specs and state live."""

    apf_json: Annotated[str, Flag("--apf-json", metavar="PATH")] = Field(
        "/run/peerpod/apf.json",
        description="forwarder config carrying the device layout (key peerpods-devices)",
    )
    devices_json: Annotated[str, Flag("--devices-json", metavar="PATH")] = Field(
        "/run/peerpod/devices.json",
        description="legacy layout file, read when apf.json has no layout",
    )
    cdi_dir: Annotated[str, Flag("--cdi-dir", metavar="DIR")] = Field(
        "/var/run/cdi",
        description="where the CDI specs are written (peerpods-<vendor>_<class>.json)",
    )
    status_file: Annotated[str, Flag("--status-file", metavar="PATH")] = Field(
        "/run/peerpod/podvm-status.json", description="per-device record of what was done (JSON)"
    )
    state_dir: Annotated[str, Flag("--state-dir", metavar="DIR")] = Field(
        "/var/lib/peerpods/podvm",
        description="persistent state guarding the one reboot a pending MIG mode may need",
    )
    root: Annotated[str, Flag("--root", metavar="DIR")] = Field(
        "/", description="the filesystem root /dev and /proc are read under"
    )
    reboot_command: Annotated[str, Flag("--reboot-command", metavar="CMD")] = Field(
        "systemctl reboot",
        description="how the VM reboots when a MIG mode change is pending a GPU reset",
    )
    no_reboot: Annotated[bool, Flag("--no-reboot")] = Field(
        False, description="never reboot: a pending MIG mode change fails its devices instead"
    )
    nvml_module: Annotated[str, Flag("--nvml-module", metavar="MODULE")] = Field(
        "pynvml",
        description="the NVML bindings module (pynvml from nvidia-ml-py; a stand-in for tests)",
    )


class WarmPoolTarget(Section):
    """`peerpods warm-pool`: whose pool VMs, in which cloud account (the cloud's own settings
    are serve's flags and env twins)."""

    provider: Annotated[str, Flag("--provider", choices=("aws", "azure", "gcp"))] = Field(
        "", description="the cloud the adaptors run pod VMs in (serve's --provider)"
    )
    owner: Annotated[Names, Flag("--owner", metavar="OWNER[,...]", repeated=True)] = Field(
        (),
        description="the owner ids whose pool VMs to list or drain (serve's --owner-id: the "
        "DaemonSet gives each node its node name; default: what serve would use here, "
        "PEERPODS_OWNER_ID, else peerpods-<hostname>)",
    )
    print_json: Annotated[bool, Flag("--json")] = Field(False, description="print JSON")


class WarmPoolDrainSettings(WarmPoolTarget):
    """`peerpods warm-pool drain`: which pool VMs to delete."""

    instance_type: Annotated[str, Flag("--type", metavar="TYPE")] = Field(
        "", description="only the pool VMs of this instance type"
    )
    zone: Annotated[str, Flag("--zone", metavar="ZONE")] = Field(
        "", description="only the pool VMs in this zone"
    )
    dry_run: Annotated[bool, Flag("--dry-run")] = Field(
        False, description="say what would be deleted, delete nothing"
    )


class PodvmImageStoreSettings(Section):
    """Where the pod VM keeps pulled images (`podvm pull-images`, `podvm image-mirror`)."""

    store: Annotated[str, Flag("--store", metavar="DIR")] = Field(
        "/var/lib/peerpods/images",
        description="the image store: a directory of root's on the VM's persistent root volume",
    )


class PodvmPullImagesSettings(PodvmImageStoreSettings):
    """`peerpods podvm pull-images`: which images, from where, with which credentials."""

    images_file: Annotated[str, Flag("--images-file", metavar="FILE")] = Field(
        "", description="a file of images to pull, one a line (# starts a comment)"
    )
    auth: Annotated[str, Flag("--auth", metavar="FILE")] = Field(
        "",
        description="docker-style auth.json with registry credentials (as /run/peerpod/auth.json)",
    )
    platform: Annotated[str, Flag("--platform", metavar="OS/ARCH[/VARIANT]")] = Field(
        "linux/amd64", description="the platform an image index resolves to"
    )
    plain_http: Annotated[Names, Flag("--plain-http", metavar="REGISTRY[,...]")] = Field(
        (), description="comma-separated registries reached over HTTP instead of HTTPS"
    )
    max_blob_mib: Annotated[int, Flag("--max-blob-mib", metavar="MIB")] = Field(
        65536, ge=1, description="the largest blob (layer) the store takes, in MiB"
    )
    request_timeout_seconds: Annotated[float, Flag("--request-timeout", duration=True)] = Field(
        60.0, gt=0, description="deadline of each manifest or token request, start to end"
    )
    blob_timeout_seconds: Annotated[float, Flag("--blob-timeout", duration=True)] = Field(
        3600.0, gt=0, description="deadline of each blob download, start to end"
    )


class PodvmImageMirrorSettings(PodvmImageStoreSettings):
    """`peerpods podvm image-mirror`: the store served as a read-only registry mirror."""

    listen: Annotated[str, Flag("--listen", metavar="HOST:PORT")] = Field(
        "127.0.0.1:5170", description="address to listen on (loopback unless --allow-remote)"
    )
    allow_remote: Annotated[bool, Flag("--allow-remote")] = Field(
        False,
        description="allow a listen address that is not loopback (every stored image is served "
        "to whoever reaches it)",
    )


class PodvmWarmSettings(Section):
    """`peerpods podvm warm`, inside a warm pool's VM: where the request, the store and the
    status live, and how the VM pulls and powers off."""

    apf_json: Annotated[str, Flag("--apf-json", metavar="PATH")] = Field(
        "/run/peerpod/apf.json",
        description="forwarder config carrying the warm request (key peerpods-warm); without "
        "the key this is a pod's boot and nothing is done",
    )
    store: Annotated[str, Flag("--store", metavar="DIR")] = Field(
        "/var/lib/peerpods/images",
        description="the image store; must be on persistent storage (the image's "
        "peerpods-images partition), never tmpfs",
    )
    warm_status_file: Annotated[str, Flag("--warm-status-file", metavar="PATH")] = Field(
        "/var/lib/peerpods/podvm/warm-status.json",
        description="what the warm boot did (JSON), on the state partition so it outlives the stop",
    )
    auth: Annotated[str, Flag("--auth", metavar="FILE")] = Field(
        "/run/peerpod/auth.json",
        description="registry credentials for the pull, used when the file exists",
    )
    pull_command: Annotated[str, Flag("--pull-command", metavar="CMD")] = Field(
        "",
        description="the pull (default: this peerpods' `podvm pull-images`); --store, --auth "
        "and the images are added",
    )
    pull_timeout_seconds: Annotated[float, Flag("--pull-timeout", duration=True)] = Field(
        1500.0,
        gt=0,
        description="the pull is stopped after this long and the VM powers off with what it "
        "has (keep it under serve's --warm-pool-ready-timeout)",
    )
    pull_attempts: Annotated[int, Flag("--pull-attempts")] = Field(
        3,
        ge=1,
        le=10,
        description="how often a failed pull is tried, 15 s apart, within --pull-timeout (the "
        "network may come up late; what was stored is not fetched again)",
    )
    poweroff_command: Annotated[str, Flag("--poweroff-command", metavar="CMD")] = Field(
        "systemctl --no-block poweroff", description="how the VM powers off at the end"
    )
    cloud_init: Annotated[str, Flag("--cloud-init", metavar="PATH")] = Field(
        "cloud-init",
        description="cloud-init, whose state is cleaned before the power-off when it is "
        "installed (empty: never)",
    )
    mountinfo: Annotated[str, Flag("--mountinfo", metavar="PATH")] = Field(
        "/proc/self/mountinfo", description="the mount table the store's file system is read from"
    )


class PodvmCdhConfigSettings(Section):
    """`peerpods podvm cdh-config`, before CDH starts: where the store, the operator's CDH
    configuration and our two files live."""

    store: Annotated[str, Flag("--store", metavar="DIR")] = Field(
        "/var/lib/peerpods/images", description="the image store the warm boot pulled into"
    )
    operator_config: Annotated[str, Flag("--operator-config", metavar="PATH")] = Field(
        "/run/peerpod/cdh.toml",
        description="the operator's CDH configuration (CAA writes it from initdata), extended",
    )
    registries_conf: Annotated[str, Flag("--registries-conf", metavar="PATH")] = Field(
        "/run/peerpods/registries.conf", description="the registries.conf written for image-rs"
    )
    cdh_config: Annotated[str, Flag("--cdh-config", metavar="PATH")] = Field(
        "/run/peerpods/cdh.toml", description="the CDH configuration written (CDH starts with it)"
    )
    mirror: Annotated[str, Flag("--mirror", metavar="HOST:PORT")] = Field(
        "127.0.0.1:5170", description="where `podvm image-mirror` listens"
    )
    cmdline: Annotated[str, Flag("--cmdline", metavar="PATH")] = Field(
        "/proc/cmdline",
        description="the kernel command line, whose image settings (agent.image_registry_auth, "
        "agent.https_proxy, ...) an [image] table would hide: none is added then",
    )
