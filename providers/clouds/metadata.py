"""Where the node runs, from its cloud's instance metadata service, for settings left unset.

A pod VM belongs next to its node: same region, and on AWS the node's subnet and security
groups (so the node reaches the VM's forwarder on TCP 15150 and the VXLAN tunnel on UDP 4789,
docs/networking.md). When `serve` is not told, each cloud's provider asks the node's metadata
service (`--instance-metadata`, on by default; `AWS_EC2_METADATA_DISABLED=true` turns it off for
AWS as for its SDKs), as CAA does:

- AWS, IMDSv2 (a session token first, then every read with it): region, the primary
  interface's subnet, security groups and VPC.
- Azure IMDS (`Metadata: true`): subscription, resource group and location. It names no
  subnet, so `--azure-subnet-id` stays required.
- GCP's metadata server (`Metadata-Flavor: Google`): project, zone and network.

The node's region wins over a default (the AWS SDK's AWS_REGION); a region the operator set
that is not the node's is an error naming both, since what is taken from the node (subnet,
security groups, identity) belongs to the node's region. (GCP's networks are global: zones set
elsewhere are the operator's choice.)

A provider whose settings still lack what it needs refuses to start, with the reason the
metadata service gave (pod VMs in a default VPC the node cannot reach would fail every pod
later). Each request is bounded whole (a service that drips is cut off at the timeout), never
redirected (the IMDSv2 token goes nowhere else), never proxied, and each value it names must
look like one, or the service is taken as not answering. Calls block: the daemon builds its
provider in a thread.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from providers.clouds.deadline import Deadline
from providers.clouds.settings import AwsSettings, AzureSettings, CloudSettings, GcpSettings
from providers.core.errors import InvalidRequest, PeerpodsError

log = logging.getLogger(__name__)

AWS_ENDPOINT = "http://169.254.169.254"
AZURE_ENDPOINT = "http://169.254.169.254"
GCP_ENDPOINT = "http://metadata.google.internal"
TIMEOUT_SECONDS = 2.0  # each request's whole exchange, however the service drips
_MAX_BYTES = 1 << 20
# What each service names looks like this, or the answer is not the service's. (The service is
# link-local and asked over http.client: never through an HTTP(S)_PROXY of the environment.)
_TOKEN = re.compile(r"[A-Za-z0-9+/=_.-]{1,1024}")
_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_AWS_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")
_AWS_ID = {kind: re.compile(rf"{kind}-[0-9A-Za-z]{{1,32}}") for kind in ("subnet", "sg", "vpc")}
_AZURE_NAME = re.compile(r"[A-Za-z0-9._()-]{1,90}")
_AZURE_LOCATION = re.compile(r"[a-z0-9]{1,40}")
_GCP_PROJECT = re.compile(r"([a-z][a-z0-9.-]{0,62}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")
_GCP_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]+-[a-z]")
_GCP_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


class MetadataUnavailable(PeerpodsError):
    """The instance metadata service did not answer, or not as expected."""


class AwsNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    region: str
    subnet_id: str
    security_group_ids: tuple[str, ...]
    vpc_id: str


class AzureNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    subscription_id: str
    resource_group: str
    location: str


class GcpNode(BaseModel):
    model_config = ConfigDict(frozen=True)

    project: str
    zone: str
    network: str


def _fetch(
    url: str,
    headers: dict[str, str],
    method: str = "GET",
    timeout: float = TIMEOUT_SECONDS,
) -> str:
    """One answer's text, within `timeout` in all (a server that drips is cut off then);
    a redirect is an error, never followed (the IMDSv2 token goes nowhere else)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MetadataUnavailable(f"{url}: not an http(s) URL")
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    with Deadline(timeout) as limit:
        try:
            connection = kind(parts.hostname, parts.port, timeout=timeout)
            try:
                connection.connect()
                limit.watch_socket(connection.sock)
                connection.request(method, target or "/", headers=headers)
                response = connection.getresponse()
                status = response.status
                body = response.read(_MAX_BYTES + 1) if status == 200 else b""
            finally:
                connection.close()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if limit.expired:
                raise MetadataUnavailable(f"{url}: no answer within {timeout:g}s") from None
            raise MetadataUnavailable(f"{url}: {_reason(exc)}") from None
        if limit.expired:  # what came before the socket was shut down may be cut short
            raise MetadataUnavailable(f"{url}: no answer within {timeout:g}s")
    if 300 <= status < 400:
        raise MetadataUnavailable(f"{url}: HTTP {status}, a redirect (never followed)")
    if status != 200:
        raise MetadataUnavailable(f"{url}: HTTP {status}")
    if len(body) > _MAX_BYTES:
        raise MetadataUnavailable(f"{url}: answer larger than {_MAX_BYTES} bytes")
    try:
        return body.decode().strip()
    except UnicodeDecodeError:
        raise MetadataUnavailable(f"{url}: answer is not text") from None


def _reason(exc: BaseException) -> str:
    """What went wrong, on one line: an exception may quote what the server sent."""
    text = str(getattr(exc, "strerror", None) or exc) or type(exc).__name__
    shown = "".join(c if c.isprintable() else "?" for c in text[:120])
    return f"{type(exc).__name__}: {shown}" if isinstance(exc, http.client.HTTPException) else shown


def _checked(url: str, what: str, value: str, pattern: re.Pattern[str]) -> str:
    """`value` when it looks like what the service names, else MetadataUnavailable."""
    if not pattern.fullmatch(value):
        raise MetadataUnavailable(f"{url}: the {what} {value[:40]!r} is not one")
    return value


def _last(path: str) -> str:
    """`projects/123/zones/us-central1-a` -> `us-central1-a`."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def aws_node(endpoint: str = AWS_ENDPOINT, timeout: float = TIMEOUT_SECONDS) -> AwsNode:
    """The node's region, subnet, security groups and VPC from IMDSv2."""
    base = endpoint.rstrip("/")
    url = f"{base}/latest/api/token"
    token = _fetch(url, {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "PUT", timeout)
    headers = {"X-aws-ec2-metadata-token": _checked(url, "session token", token, _TOKEN)}

    def read(path: str, what: str, pattern: re.Pattern[str]) -> str:
        url = f"{base}/latest/meta-data/{path}"
        return _checked(url, what, _fetch(url, headers, timeout=timeout), pattern)

    mac = read("mac", "MAC address", _MAC)
    interface = f"network/interfaces/macs/{mac}"
    groups = read(f"{interface}/security-group-ids", "security groups", re.compile(r"[-\w\s]*"))
    return AwsNode(
        region=read("placement/region", "region", _AWS_REGION),
        subnet_id=read(f"{interface}/subnet-id", "subnet", _AWS_ID["subnet"]),
        security_group_ids=tuple(
            _checked(base, "security group", group, _AWS_ID["sg"]) for group in groups.split()
        )
        or _none(base, "security group"),
        vpc_id=read(f"{interface}/vpc-id", "VPC", _AWS_ID["vpc"]),
    )


def _none(url: str, what: str) -> tuple[str, ...]:
    raise MetadataUnavailable(f"{url}: the metadata service named no {what}")


def azure_node(endpoint: str = AZURE_ENDPOINT, timeout: float = TIMEOUT_SECONDS) -> AzureNode:
    """The node's subscription, resource group and location from Azure IMDS."""
    url = f"{endpoint.rstrip('/')}/metadata/instance/compute?api-version=2021-02-01"
    text = _fetch(url, {"Metadata": "true"}, timeout=timeout)
    try:
        compute: Any = json.loads(text)
        found = [str(compute[k]) for k in ("subscriptionId", "resourceGroupName", "location")]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise MetadataUnavailable(f"{url}: not an instance's compute metadata") from None
    subscription, group, location = found
    return AzureNode(
        subscription_id=_checked(url, "subscription", subscription, _AZURE_NAME),
        resource_group=_checked(url, "resource group", group, _AZURE_NAME),
        location=_checked(url, "location", location, _AZURE_LOCATION),
    )


def gcp_node(endpoint: str = GCP_ENDPOINT, timeout: float = TIMEOUT_SECONDS) -> GcpNode:
    """The node's project, zone and network from GCP's metadata server."""
    base = f"{endpoint.rstrip('/')}/computeMetadata/v1"
    headers = {"Metadata-Flavor": "Google"}

    def read(path: str, what: str, pattern: re.Pattern[str], last: bool = False) -> str:
        url = f"{base}/{path}"
        text = _fetch(url, headers, timeout=timeout)
        return _checked(url, what, _last(text) if last else text, pattern)

    return GcpNode(
        project=read("project/project-id", "project", _GCP_PROJECT),
        zone=read("instance/zone", "zone", _GCP_ZONE, last=True),
        network=read("instance/network-interfaces/0/network", "network", _GCP_NAME, last=True),
    )


def _use(settings: CloudSettings) -> bool:
    aws_off = os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true"
    return settings.instance_metadata and not (aws_off and isinstance(settings, AwsSettings))


def _unset(settings: BaseModel, found: Mapping[str, Any]) -> dict[str, Any]:
    """What the node's metadata gives for the settings the operator left unset."""
    return {name: value for name, value in found.items() if not getattr(settings, name)}


def complete_aws(settings: AwsSettings) -> AwsSettings:
    """Region, subnet and security groups from IMDSv2 where unset; InvalidRequest when the
    subnet or the security groups are still unknown."""
    import boto3  # noqa: F401 - the provider needs its SDK first (a missing one is the hint)

    if settings.aws_subnet_id and settings.aws_security_group_ids and settings.aws_region:
        return settings
    why = "the instance metadata service is off (--instance-metadata)"
    if _use(settings):
        try:
            node = aws_node(settings.instance_metadata_url or AWS_ENDPOINT)
        except MetadataUnavailable as exc:
            why = f"the instance metadata service (IMDSv2) did not answer: {exc}"
        else:
            if settings.aws_region and settings.aws_region != node.region:
                raise InvalidRequest(
                    f"aws provider: the region is set to {settings.aws_region} (--aws-region, "
                    f"env PEERPODS_AWS_REGION) but this node is in {node.region} (instance "
                    f"metadata), where the subnet and security groups it would take are; leave "
                    f"the region unset or set it to {node.region}, or set --aws-subnet-id and "
                    f"--aws-security-group-ids of {settings.aws_region} too"
                )
            update = _unset(
                settings,
                {
                    "aws_region": node.region,
                    "aws_subnet_id": (node.subnet_id,),
                    "aws_security_group_ids": node.security_group_ids,
                },
            )
            log.info(
                "aws provider: %s from the node's metadata (VPC %s)",
                ", ".join(f"{k}={v}" for k, v in update.items()),
                node.vpc_id,
            )
            return settings.model_copy(update=update)
    missing = [
        flag
        for flag, value in (
            ("--aws-region", settings.aws_region or _sdk_region()),
            ("--aws-subnet-id", settings.aws_subnet_id),
            ("--aws-security-group-ids", settings.aws_security_group_ids),
        )
        if not value
    ]
    if missing:
        raise InvalidRequest(
            f"aws provider: no {', '.join(missing)} and {why}; set them (pod VMs must share "
            "the node's VPC: docs/networking.md)"
        )
    return settings


def _sdk_region() -> str:
    """The AWS SDK's own region (AWS_REGION, its config files)."""
    import boto3

    return str(boto3.session.Session().region_name or "")


def complete_azure(settings: AzureSettings) -> AzureSettings:
    """Subscription, resource group and location from Azure IMDS where unset; InvalidRequest
    when one of them or the subnet is still unknown."""
    fields = (
        ("--azure-subscription-id", "azure_subscription_id", "subscription_id"),
        ("--azure-resource-group", "azure_resource_group", "resource_group"),
        ("--azure-region", "azure_region", "location"),
    )
    why = "the instance metadata service is off (--instance-metadata)"
    if any(not getattr(settings, name) for _, name, _ in fields) and _use(settings):
        try:
            node = azure_node(settings.instance_metadata_url or AZURE_ENDPOINT)
        except MetadataUnavailable as exc:
            why = f"Azure's instance metadata service did not answer: {exc}"
        else:
            _same_location(settings.azure_region, node.location)
            update = _unset(settings, {name: getattr(node, attr) for _, name, attr in fields})
            log.info("azure provider: %s from the node's metadata", update)
            settings = settings.model_copy(update=update)
    missing = [flag for flag, name, _ in fields if not getattr(settings, name)]
    if missing:
        subnet = (
            "" if settings.azure_subnet_id else "; and no --azure-subnet-id, which it never gives"
        )
        raise InvalidRequest(f"azure provider: no {', '.join(missing)} and {why}{subnet}")
    if not settings.azure_subnet_id:
        raise InvalidRequest(
            "azure provider: no --azure-subnet-id (Azure's metadata service does not name the "
            "node's subnet; give the node's, docs/networking.md)"
        )
    return settings


def _same_location(explicit: str, node: str) -> None:
    """An Azure location set by the operator must be the node's ("West Europe" is
    "westeurope"): the subnet and identity taken from the node belong there."""
    if explicit and re.sub(r"\s", "", explicit).lower() != node:
        raise InvalidRequest(
            f"azure provider: the region is set to {explicit} (--azure-region, env "
            f"PEERPODS_AZURE_REGION) but this node is in {node} (instance metadata); leave the "
            f"region unset or set it to {node}, or set --azure-subscription-id and "
            "--azure-resource-group too"
        )


def complete_gcp(settings: GcpSettings) -> GcpSettings:
    """Project, zone and network from GCP's metadata server where unset."""
    if settings.gcp_project and settings.gcp_zones and settings.gcp_network:
        return settings
    why = "the instance metadata service is off (--instance-metadata)"
    if _use(settings):
        try:
            node = gcp_node(settings.instance_metadata_url or GCP_ENDPOINT)
        except MetadataUnavailable as exc:
            why = f"GCP's metadata server did not answer: {exc}"
        else:
            update = _unset(
                settings,
                {
                    "gcp_project": node.project,
                    "gcp_zones": (node.zone,),
                    "gcp_network": node.network,
                },
            )
            log.info("gcp provider: %s from the node's metadata", update)
            return settings.model_copy(update=update)
    if not settings.gcp_project or not settings.gcp_zones:
        raise InvalidRequest(f"gcp provider: --gcp-project and --gcp-zones are required ({why})")
    return settings
