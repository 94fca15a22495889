"""AWS EC2 pod VMs: create with capacity fallback, delete, list the ones this adaptor owns.

Every instance is tagged at launch (TagSpecifications, so no untagged moment exists) with the
sandbox, pod and owner. A create first looks for an instance already tagged with the sandbox, and
each RunInstances carries a ClientToken derived from the sandbox and placement, so a retried
create finds the VM instead of launching a second. botocore's own retries are off: one bounded,
jittered retry policy (providers.clouds.retry) owns them and reports what it tried.

The lookups of many sandboxes at once (is a sandbox's VM already there, is a VM running yet, is
it still alive) share DescribeInstances calls, and their deletes TerminateInstances calls
(providers.clouds.coalesce): an SDK call costs the adaptor milliseconds of CPU whatever it
carries, and the account's API rate is bounded.

Spot VMs (VMSpec.capacity_type) are one-time Spot requests whose interruption behaviour is
terminate, so a preempted VM bills nothing more; `inspect` tells the adaptor a VM is gone and
`purge` removes what a lost VM may leave (volumes tagged with its sandbox).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.clouds import registry
from providers.clouds.coalesce import Coalescer
from providers.clouds.retry import RetryPolicy, Site, create_with_fallback, retry_transient, sites
from providers.clouds.sdk import CloudCalls
from providers.clouds.settings import AwsSettings
from providers.core.base import (
    TAG_OWNER,
    TAG_POD_NAME,
    TAG_POD_NAMESPACE,
    TAG_SANDBOX,
    Instance,
    Resolver,
    VMCandidate,
    VMSpec,
    identity,
)
from providers.core.capacity import ON_DEMAND, SPOT, TAG_CAPACITY_TYPE
from providers.core.errors import (
    CapacityError,
    InstanceNotFound,
    InvalidRequest,
    ProviderError,
    TransientError,
)
from providers.core.markets import VMCondition, create_in_markets
from providers.core.offers import offer_for
from providers.core.warm import (
    GONE,
    PENDING,
    RUNNING,
    STOPPED,
    STOPPING,
    TAG_WARM_POOL,
    TAG_WARM_SLOT,
    WarmSpec,
    disk_cost_per_hour,
    slot_token,
)

log = logging.getLogger(__name__)

USER_DATA_LIMIT = registry.limit_of("aws")

CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "Unsupported",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "UnfulfillableCapacity",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "RequestThrottled",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
        "IdempotentParameterMismatch",
    }
)
NOT_FOUND_CODES = frozenset(
    {"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed", "InvalidVolume.NotFound"}
)
LIVE_STATES = ("pending", "running", "stopping", "stopped")
# EC2's instance states as a warm VM's power state (providers.core.warm)
_POWER = {
    "pending": PENDING,
    "running": RUNNING,
    "stopping": STOPPING,
    "stopped": STOPPED,
    "shutting-down": GONE,
    "terminated": GONE,
}
# What a stopped instance bills: its EBS volumes. gp3 in us-east-1 is $0.08 per GB-month
# (https://aws.amazon.com/ebs/pricing/, 2025); other regions are within about 30% of it.
GP3_USD_PER_GB_MONTH = 0.08
# The root volume assumed when --aws-root-volume-gib leaves it to the AMI (a GPU pod VM image
# with its driver and a CUDA container image or two).
ASSUMED_ROOT_GIB = 100
# Sandboxes or instances one shared DescribeInstances asks for (the values of one filter).
LOOKUP_BATCH = 100
# One-time Spot, terminated (never stopped or hibernated) when EC2 takes the capacity back.
SPOT_MARKET_OPTIONS = {
    "MarketType": "spot",
    "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
}


@dataclass(frozen=True)
class AwsConfig:
    """Where and how pod VMs are launched (CAA-compatible settings)."""

    region: str
    image_id: str = ""
    instance_type: str = "t3.small"
    allowed_instance_types: tuple[str, ...] = ()
    subnet_ids: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    key_name: str = ""
    endpoint_url: str = ""
    use_public_ip: bool = False
    # the root volume's size (gp3), 0: the AMI's own; CUDA container images need room
    root_volume_gib: int = 0
    ready_timeout_seconds: float = 300.0
    poll_interval_seconds: float = 2.0
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    max_candidate_types: int = 8
    capacity_reservation: str = ""


def map_error(exc: BaseException, what: str) -> ProviderError:
    """Translate a botocore error into the peerpods tree (most specific first)."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectionError,
        HTTPClientError,
        NoCredentialsError,
        NoRegionError,
    )
    from botocore.parsers import ResponseParserError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = f"{what}: {code}: {error.get('Message', '')}".rstrip(": ")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in CAPACITY_CODES:
            return CapacityError(message)
        if code in NOT_FOUND_CODES:
            return InstanceNotFound(message)
        if code in TRANSIENT_CODES or status >= 500 or status == 429:
            return TransientError(message)
        return ProviderError(message)
    if isinstance(exc, NoCredentialsError | NoRegionError):
        return ProviderError(f"{what}: {exc} (set credentials by the AWS SDK's default chain)")
    if isinstance(exc, ConnectionError | HTTPClientError | ResponseParserError):
        # an answer that is not EC2's (an overloaded endpoint's or a proxy's error page)
        return TransientError(f"{what}: {exc}")
    if isinstance(exc, BotoCoreError):
        return ProviderError(f"{what}: {exc}")
    return ProviderError(f"{what}: {type(exc).__name__}: {exc}")


def make_client(config: AwsConfig) -> Any:
    """An EC2 client with botocore retries off (our policy retries) and explicit timeouts.

    Its answers' timestamps stay text: nothing here reads one, and parsing each (LaunchTime, the
    attach times of every volume and interface) costs more CPU than the rest of a VM's fields.
    """
    import boto3
    import botocore.session
    from botocore.config import Config

    botocfg = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
        max_pool_connections=64,
    )
    kwargs: dict[str, Any] = {"region_name": config.region, "config": botocfg}
    if config.endpoint_url:
        kwargs["endpoint_url"] = config.endpoint_url
    core = botocore.session.get_session()
    core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    return boto3.session.Session(botocore_session=core).client("ec2", **kwargs)


def client_token(sandbox_id: str, placement: Site, spot: bool = False) -> str:
    """Idempotency token: one per sandbox, placement and market (RunInstances allows 64 ASCII
    chars); a Spot and an on-demand launch of one placement are different requests."""
    key = f"{sandbox_id}|{placement.instance_type}|{placement.zone}" + ("|spot" if spot else "")
    digest = hashlib.sha256(key.encode())
    return "pp-" + digest.hexdigest()[:60]


def tags_for(spec: VMSpec, owner_id: str, spot: bool = False) -> dict[str, str]:
    """Every tag a pod VM carries; the ownership tags win over caller-supplied ones."""
    tags = {str(k)[:128]: str(v)[:256] for k, v in spec.tags.items()}
    tags.update(
        {
            "Name": f"podvm-{spec.pod_name}-{spec.sandbox_id[:8]}"[:256],
            TAG_OWNER: owner_id,
            TAG_SANDBOX: spec.sandbox_id,
            TAG_POD_NAMESPACE: spec.pod_namespace,
            TAG_POD_NAME: spec.pod_name,
            TAG_CAPACITY_TYPE: SPOT if spot else ON_DEMAND,
        }
    )
    return tags


class AwsProvider:
    """The `aws` provider."""

    name = "aws"

    def __init__(
        self,
        config: AwsConfig,
        owner_id: str,
        *,
        client: Any = None,
        resolve: Resolver = identity,
        calls: CloudCalls | None = None,
    ) -> None:
        if not owner_id:
            raise InvalidRequest("aws provider: an owner id is required")
        self.config = config
        self.owner_id = owner_id
        self.client = client if client is not None else make_client(config)
        self.resolve = resolve
        self.calls = calls or CloudCalls()  # the daemon lends its own
        self._subnet_zones: dict[str, str] | None = None
        self._root_devices: dict[str, str] = {}
        self._root_kinds: dict[str, str] = {}  # image -> its root device type
        # sandbox id -> its live instance; instance id -> the instance (any state)
        self._by_sandbox = Coalescer(self._find_many, LOOKUP_BATCH)
        self._by_id = Coalescer(self._describe_many, LOOKUP_BATCH)
        self._terminations = Coalescer(self._terminate_many, LOOKUP_BATCH)

    # --- what selection needs ----------------------------------------------------------------

    @property
    def region(self) -> str:
        return self.config.region

    @property
    def zones(self) -> tuple[str, ...]:
        return self.config.zones

    @property
    def allowed_types(self) -> tuple[str, ...]:
        return self.config.allowed_instance_types

    @property
    def capacity_reservation(self) -> str:
        """The reservation or block reserved-only types launch into (--capacity-reservation)."""
        return self.config.capacity_reservation

    @property
    def max_candidate_types(self) -> int:
        """How many of selection's ranked types a create may try (--max-candidate-types)."""
        return self.config.max_candidate_types

    @property
    def default_type(self) -> str:
        return self.config.instance_type

    async def _call(self, what: str, method: str, **kwargs: Any) -> Any:
        return await self.calls.call(what, map_error, getattr(self.client, method), **kwargs)

    async def _root_device(self, image: str) -> str:
        """The AMI's root device name (resizing the root volume names it), asked once."""
        known = self._root_devices.get(image)
        if known is None:
            out = await self._call(f"describe image {image}", "describe_images", ImageIds=[image])
            images = out.get("Images") or []
            known = str(images[0].get("RootDeviceName") or "") if images else ""
            if not known:
                raise ProviderError(f"image {image} names no root device to resize")
            self._root_devices[image] = known
        return known

    async def _zones(self) -> list[tuple[str, str]]:
        """(zone, subnet) pairs to try: one per configured subnet, else the configured zones."""
        if self.config.subnet_ids:
            if self._subnet_zones is None:
                out = await self._call(
                    "describe subnets", "describe_subnets", SubnetIds=list(self.config.subnet_ids)
                )
                found = {s["SubnetId"]: s.get("AvailabilityZone", "") for s in out["Subnets"]}
                self._subnet_zones = {s: found.get(s, "") for s in self.config.subnet_ids}
            return [(zone, subnet) for subnet, zone in self._subnet_zones.items()]
        return [(zone, "") for zone in self.config.zones] or [("", "")]

    # --- Provider ----------------------------------------------------------------------------

    async def create(self, spec: VMSpec) -> Instance:
        what = f"sandbox {spec.sandbox_id[:12]} (pod {spec.pod_namespace}/{spec.pod_name})"
        image = spec.image or self.config.image_id
        if not image:
            raise InvalidRequest(f"{what}: no pod VM image (set --aws-image-id or --pod-vm-image)")
        USER_DATA_LIMIT.check(spec.user_data, what)
        existing = await self._find(spec.sandbox_id)
        if existing is not None:
            log.info("%s: adopting existing instance %s", what, existing["InstanceId"])
            return await self._finish(what, existing["InstanceId"])
        zones = await self._zones()
        subnet_of = dict(zones)
        order = sites(spec.candidates, [z for z, _ in zones])

        async def attempt(placement: Site, spot: bool) -> Instance:
            request = await self._run_request(
                spec, image, placement, spot, subnet_of.get(placement.zone, "")
            )
            market = "Spot" if spot else "on-demand"
            out = await self._call(
                f"{what}: launch {market} {placement}", "run_instances", **request
            )
            instance_id = out["Instances"][0]["InstanceId"]
            return await self._finish(what, instance_id)

        async def in_market(spot: bool) -> Instance:
            async def one(placement: Site) -> Instance:
                return await attempt(placement, spot)

            return await create_with_fallback(
                what, order, one, self.config.policy, self.name, self.calls.on_fallback
            )

        return await create_in_markets(what, spec.capacity_type, in_market)

    async def _run_request(
        self, spec: VMSpec, image: str, placement: Site, spot: bool, subnet: str
    ) -> dict[str, Any]:
        """RunInstances' arguments for one launch of `spec` at `placement`."""
        request = await self._launch_request(
            image,
            placement,
            subnet,
            tags_for(spec, self.owner_id, spot),
            client_token(spec.sandbox_id, placement, spot),
            spec.user_data,
        )
        request.update(_market_arguments(placement, spot))
        return request

    async def _launch_request(
        self,
        image: str,
        placement: Site,
        subnet: str,
        tags: Mapping[str, str],
        token: str,
        user_data: str,
    ) -> dict[str, Any]:
        """RunInstances' arguments every launch shares: one instance of the placement's type,
        tagged with its volumes, IMDSv2 only, the root volume and key the settings ask for."""
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        request: dict[str, Any] = {
            "ImageId": image,
            "InstanceType": placement.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": token,
            "TagSpecifications": [
                {"ResourceType": kind, "Tags": tag_list} for kind in ("instance", "volume")
            ],
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        }
        if user_data:
            request["UserData"] = user_data
        if self.config.root_volume_gib:
            root = await self._root_device(image)
            # deleted with the VM, a warm one's too: a pool VM drained or found orphaned
            # leaves no volume billing behind it
            ebs: dict[str, Any] = {
                "VolumeSize": self.config.root_volume_gib,
                "VolumeType": "gp3",
                "DeleteOnTermination": True,
            }
            request["BlockDeviceMappings"] = [{"DeviceName": root, "Ebs": ebs}]
        if self.config.key_name:
            request["KeyName"] = self.config.key_name
        request.update(self._network_arguments(placement, subnet))
        return request

    def _network_arguments(self, placement: Site, subnet: str) -> dict[str, Any]:
        """Where the VM's interface goes: the zone's subnet with the security groups, or the
        zone alone (the default VPC)."""
        groups = list(self.config.security_group_ids)
        if subnet:
            interface: dict[str, Any] = {"DeviceIndex": 0, "SubnetId": subnet}
            if groups:
                interface["Groups"] = groups
            if self.config.use_public_ip:
                interface["AssociatePublicIpAddress"] = True
            return {"NetworkInterfaces": [interface]}
        arguments: dict[str, Any] = {}
        if placement.zone:
            arguments["Placement"] = {"AvailabilityZone": placement.zone}
        if groups:
            arguments["SecurityGroupIds"] = groups
        return arguments

    async def _finish(self, what: str, instance_id: str) -> Instance:
        """Wait until the VM is running with an address; on any failure, delete it."""
        try:
            return await self._wait_running(what, instance_id)
        except BaseException:
            policy = self.config.policy
            await self.calls.discard(
                f"{what}: {instance_id}", lambda: self.delete(instance_id), policy
            )
            raise

    async def _wait_running(self, what: str, instance_id: str) -> Instance:
        deadline = time.monotonic() + self.config.ready_timeout_seconds
        while True:
            try:
                raw = await self._by_id.get(instance_id)
            except (InstanceNotFound, TransientError) as exc:
                log.debug("%s: %s not visible: %s", what, instance_id, exc)
            else:
                # None: eventual consistency, a fresh instance may not be visible yet
                if raw is not None:
                    state = raw["State"]["Name"]
                    if state == "running" and self._addresses(raw):
                        return self.resolve(self._instance(raw))
                    if state in ("shutting-down", "terminated", "stopping", "stopped"):
                        reason = raw.get("StateReason", {})
                        message = f"{what}: {instance_id} went {state}: {reason.get('Message', '')}"
                        if "InsufficientInstanceCapacity" in str(reason.get("Code", "")):
                            raise CapacityError(message)
                        raise ProviderError(message)
            if time.monotonic() >= deadline:
                waited = self.config.ready_timeout_seconds
                raise ProviderError(f"{what}: {instance_id} not running after {waited:g}s")
            await asyncio.sleep(self.config.poll_interval_seconds)

    def _addresses(self, raw: Mapping[str, Any]) -> tuple[str, ...]:
        private = raw.get("PrivateIpAddress", "")
        public = raw.get("PublicIpAddress", "")
        ordered = (public, private) if self.config.use_public_ip else (private, public)
        return tuple(a for a in ordered if a)

    def _instance(self, raw: Mapping[str, Any]) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        return Instance(
            id=raw["InstanceId"],
            name=tags.get("Name", raw["InstanceId"]),
            addresses=self._addresses(raw),
            instance_type=raw.get("InstanceType", ""),
            zone=raw.get("Placement", {}).get("AvailabilityZone", ""),
            tags=tags,
            extra={"state": raw.get("State", {}).get("Name", "")},
            capacity_type=SPOT
            if raw.get("InstanceLifecycle") == "spot" or tags.get(TAG_CAPACITY_TYPE) == SPOT
            else ON_DEMAND,
        )

    async def _describe_owned(self, extra_filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        filters = [
            {"Name": f"tag:{TAG_OWNER}", "Values": [self.owner_id]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            *extra_filters,
        ]
        return await self._describe_pages("list owned instances", filters)

    async def _describe_pages(
        self, what: str, filters: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Every instance DescribeInstances finds for `filters`, page after page."""
        found: list[dict[str, Any]] = []
        token = ""
        while True:
            kwargs: dict[str, Any] = {"Filters": filters, "MaxResults": 1000}
            if token:
                kwargs["NextToken"] = token
            out = await self._call(what, "describe_instances", **kwargs)
            found.extend(i for r in out["Reservations"] for i in r["Instances"])
            token = out.get("NextToken", "")
            if not token:
                return found

    async def _find(self, sandbox_id: str) -> dict[str, Any] | None:
        """The live instance already launched for `sandbox_id`, if any."""
        return await self._by_sandbox.get(sandbox_id)

    async def _find_many(self, sandbox_ids: list[str]) -> dict[str, dict[str, Any]]:
        found: list[dict[str, Any]] = []

        async def once() -> None:
            tagged = [{"Name": f"tag:{TAG_SANDBOX}", "Values": sandbox_ids}]
            found[:] = await self._describe_owned(tagged)

        # retried here: this one call's transient failure would fail every create it carries
        what = f"look for the VMs of {len(sandbox_ids)} sandbox(es)"
        await retry_transient(what, once, self.config.policy)
        owned: dict[str, dict[str, Any]] = {}
        for raw in found:
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            owned.setdefault(tags.get(TAG_SANDBOX, ""), raw)
        return owned

    async def _describe_many(self, instance_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Instances by id, in any state; an id EC2 does not know (yet) is absent, not an error
        (by a filter, not InstanceIds, so one unknown id does not fail the others' lookup)."""
        filters = [{"Name": "instance-id", "Values": instance_ids}]
        found = await self._describe_pages("describe instances", filters)
        return {raw["InstanceId"]: raw for raw in found}

    async def delete(self, instance_id: str) -> None:
        async def once() -> None:
            state = await self._terminations.get(instance_id)
            if isinstance(state, ProviderError):
                raise state
            # None: EC2 knows no such instance (any more)
            if state is not None and state not in ("shutting-down", "terminated"):
                raise TransientError(f"terminate {instance_id}: still {state}")

        await retry_transient(f"delete {instance_id}", once, self.config.policy)

    async def _terminate_many(self, instance_ids: list[str]) -> dict[str, str | ProviderError]:
        """Each instance's state after one TerminateInstances for all of them, absent where EC2
        knows no such instance. Where that one call is refused (it fails whole, for a single
        unknown or forbidden id), each instance is asked for alone, so the refusal is only its
        own; a transient error is every instance's, and each delete retries."""
        what = f"terminate {', '.join(instance_ids)}"
        try:
            out = await self._call(what, "terminate_instances", InstanceIds=instance_ids)
        except TransientError:
            raise
        except InstanceNotFound:
            if len(instance_ids) == 1:
                return {}
        except ProviderError:
            if len(instance_ids) == 1:
                raise
        else:
            return {
                change["InstanceId"]: str(change["CurrentState"]["Name"])
                for change in out.get("TerminatingInstances", [])
            }
        return await self._terminate_alone(instance_ids)

    async def _terminate_alone(self, instance_ids: list[str]) -> dict[str, str | ProviderError]:
        """One TerminateInstances per instance, each one's refusal kept as its own outcome."""
        alone = [self._terminate_many([i]) for i in instance_ids]
        outcomes = await asyncio.gather(*alone, return_exceptions=True)
        states: dict[str, str | ProviderError] = {}
        for instance_id, outcome in zip(instance_ids, outcomes, strict=True):
            if isinstance(outcome, ProviderError):
                states[instance_id] = outcome
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                states.update(outcome)
        return states

    async def list_owned(self) -> list[Instance]:
        return [self._instance(raw) for raw in await self._describe_owned([])]

    # --- preemption ----------------------------------------------------------------------------

    async def _state(self, instance_id: str) -> tuple[str, str]:
        """(state, EC2's reason for it); ("gone", ...) when EC2 no longer knows the instance."""
        raw = await self._by_id.get(instance_id)
        if raw is None:
            return "gone", f"EC2 instance {instance_id} no longer exists"
        state = str(raw.get("State", {}).get("Name", ""))
        reason = raw.get("StateReason", {})
        said = str(reason.get("Message") or reason.get("Code") or "no reason given")
        return state, f"EC2 instance {instance_id} is {state}: {said}"

    async def inspect(self, instance_id: str) -> VMCondition:
        """Alive while pending or running; gone, terminated or stopped by EC2 otherwise."""
        state, reason = await self._state(instance_id)
        if state in ("pending", "running"):
            return VMCondition(True)
        return VMCondition(False, reason)

    async def purge(self, instance: Instance) -> None:
        """Terminate the instance and delete the volumes its sandbox's tag still marks."""
        await self.delete(instance.id)
        sandbox_id = instance.tags.get(TAG_SANDBOX, "")
        if not sandbox_id:
            return
        # A volume detaches only once the instance is terminated: wait for that (bounded).
        deadline = time.monotonic() + self.config.ready_timeout_seconds
        while (await self._state(instance.id))[0] == "shutting-down":
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(self.config.poll_interval_seconds)
        filters = [
            {"Name": f"tag:{TAG_OWNER}", "Values": [self.owner_id]},
            {"Name": f"tag:{TAG_SANDBOX}", "Values": [sandbox_id]},
            {"Name": "status", "Values": ["available", "error"]},
        ]
        out = await self._call(
            f"volumes of {instance.id}", "describe_volumes", Filters=filters, MaxResults=500
        )
        for volume in out.get("Volumes", []):
            volume_id = volume["VolumeId"]

            async def remove(volume_id: str = volume_id) -> None:
                with contextlib.suppress(InstanceNotFound):
                    await self._call(f"delete {volume_id}", "delete_volume", VolumeId=volume_id)

            await retry_transient(f"delete volume {volume_id}", remove, self.config.policy)
            log.info("deleted volume %s left by %s", volume_id, instance.id)

    # --- warm pool (providers.core.warm) -------------------------------------------------------

    def cannot_stop(self, instance_type: str) -> str:
        """EC2 stops any EBS-backed instance (the image is checked at launch); Mac types run only
        on dedicated hosts, which this provider does not launch on."""
        if instance_type.startswith("mac"):
            return f"{instance_type} runs only on a dedicated host"
        return ""

    def stopped_cost_per_hour(self, instance_type: str) -> float:
        """The root volume a stopped instance keeps (gp3), per hour; the compute bills nothing."""
        gib = self.config.root_volume_gib or ASSUMED_ROOT_GIB
        return disk_cost_per_hour(gib, GP3_USD_PER_GB_MONTH)

    async def launch_warm(self, spec: WarmSpec) -> Instance:
        image = spec.image or self.config.image_id
        if not image:
            raise InvalidRequest(f"warm slot {spec.slot}: no pod VM image")
        found = await self._describe_owned(
            [{"Name": f"tag:{TAG_WARM_SLOT}", "Values": [spec.slot]}]
        )
        if found:
            return self._warm_instance(found[0])
        await self._check_ebs_root(image)
        zones = await self._zones()
        subnet = dict(zones).get(spec.zone, "") if spec.zone else zones[0][1]
        placement = Site(VMCandidate(spec.instance_type), spec.zone or zones[0][0])
        tags = {
            "Name": f"podvm-warm-{spec.slot}"[:256],
            TAG_OWNER: self.owner_id,
            TAG_WARM_POOL: self.owner_id,
            TAG_WARM_SLOT: spec.slot,
            TAG_CAPACITY_TYPE: ON_DEMAND,
        }
        request = await self._launch_request(
            image,
            placement,
            subnet,
            tags,
            slot_token(spec.slot),
            spec.user_data,
        )
        # the guest's own power-off (its report of readiness) stops it, never terminates it
        request["InstanceInitiatedShutdownBehavior"] = "stop"
        out = await self._call(
            f"warm slot {spec.slot}: launch {placement}", "run_instances", **request
        )
        return self._warm_instance(out["Instances"][0])

    async def _check_ebs_root(self, image: str) -> None:
        """EC2 cannot stop an instance whose root is instance store: refused before launch (an
        image that cannot be described is left to RunInstances to refuse)."""
        kind = self._root_kinds.get(image)
        if kind is None:
            try:
                out = await self._call(
                    f"describe image {image}", "describe_images", ImageIds=[image]
                )
            except ProviderError as exc:
                log.debug("image %s not described, its root not checked: %s", image, exc)
                return
            images = out.get("Images") or []
            kind = str(images[0].get("RootDeviceType") or "ebs") if images else "ebs"
            self._root_kinds[image] = kind
        if kind != "ebs":
            raise InvalidRequest(
                f"image {image} has an {kind} root: EC2 cannot stop its instances, so they "
                "cannot wait in a warm pool"
            )

    def _warm_instance(self, raw: Mapping[str, Any]) -> Instance:
        instance = self._instance(raw)
        state = str(raw.get("State", {}).get("Name", ""))
        # LaunchTime stays text (make_client): the launch's, or the last start's
        created = str(raw.get("LaunchTime", ""))
        extra = {**instance.extra, "power": _POWER.get(state, GONE), "created": created}
        return dataclasses.replace(instance, extra=extra)

    async def warm_vms(self) -> list[Instance]:
        pooled = [{"Name": f"tag:{TAG_WARM_POOL}", "Values": [self.owner_id]}]
        return [self._warm_instance(raw) for raw in await self._describe_owned(pooled)]

    async def power_state(self, instance_id: str) -> str:
        raw = await self._by_id.get(instance_id)
        if raw is None:
            return GONE
        return _POWER.get(str(raw.get("State", {}).get("Name", "")), GONE)

    async def stop_warm(self, instance_id: str) -> None:
        what = f"stop warm VM {instance_id}"
        await self._call(what, "stop_instances", InstanceIds=[instance_id])
        await self._wait_power(what, instance_id, STOPPED)

    async def _wait_power(self, what: str, instance_id: str, wanted: str) -> None:
        deadline = time.monotonic() + self.config.ready_timeout_seconds
        while (power := await self.power_state(instance_id)) != wanted:
            if power == GONE:
                raise ProviderError(f"{what}: the VM is gone")
            if time.monotonic() >= deadline:
                raise ProviderError(f"{what}: still {power}")
            await asyncio.sleep(self.config.poll_interval_seconds)

    async def adopt_warm(
        self, instance_id: str, spec: VMSpec, tags: Mapping[str, str] | None = None
    ) -> Instance:
        what = f"sandbox {spec.sandbox_id[:12]}: adopt warm VM {instance_id}"
        USER_DATA_LIMIT.check(spec.user_data, what)
        sandbox_tags = {**tags_for(spec, self.owner_id), **(tags or {})}
        # While stopped EC2 takes new user data (it refuses it from a VM that is not stopped);
        # the pod VM reads it at the next boot. It goes as the `userData` attribute's string
        # value, which EC2 takes as base64 text and the SDK sends as given (the user guide's
        # `--attribute userData --value` form). The `UserData` member is a blob the SDK encodes
        # once more: raw bytes there are what EC2 wants, but moto decodes them twice, so one of
        # the two would be wrong; this form is right for both. The sandbox's tags go on before
        # the start, so from then on every sweep sees the sandbox's VM; the pool's come off as
        # it starts (a VM left with both by a crash is deleted by the pool's next pass).
        await asyncio.gather(
            self._call(
                f"{what}: user data",
                "modify_instance_attribute",
                InstanceId=instance_id,
                Attribute="userData",
                Value=base64.b64encode(spec.user_data.encode()).decode("ascii"),
            ),
            self._call(
                f"{what}: tags",
                "create_tags",
                Resources=[instance_id],
                Tags=[{"Key": k, "Value": v} for k, v in sandbox_tags.items()],
            ),
        )
        await asyncio.gather(
            self._call(f"{what}: start", "start_instances", InstanceIds=[instance_id]),
            self._call(
                f"{what}: pool tags",
                "delete_tags",
                Resources=[instance_id],
                Tags=[{"Key": TAG_WARM_POOL}, {"Key": TAG_WARM_SLOT}],
            ),
        )
        return await self._wait_running(what, instance_id)


def config_from_settings(settings: AwsSettings) -> AwsConfig:
    region = settings.aws_region
    if not region:
        import boto3

        region = boto3.session.Session().region_name or ""
    if not region:
        raise InvalidRequest(
            "aws provider: no region (set --aws-region or AWS_DEFAULT_REGION, "
            "or let the instance metadata name the node's)"
        )
    return AwsConfig(
        region=region,
        image_id=settings.aws_image_id or settings.pod_vm_image,
        instance_type=settings.instance_type or "t3.small",
        allowed_instance_types=settings.allowed_instance_types,
        subnet_ids=settings.aws_subnet_id,
        zones=settings.aws_zones,
        security_group_ids=settings.aws_security_group_ids,
        key_name=settings.aws_key_name,
        endpoint_url=settings.aws_endpoint_url,
        use_public_ip=settings.aws_use_public_ip,
        root_volume_gib=settings.aws_root_volume_gib,
        policy=RetryPolicy(max_attempts=settings.max_launches_per_pass),
        max_candidate_types=settings.max_candidate_types,
        capacity_reservation=settings.capacity_reservation,
    )


def from_settings(
    settings: AwsSettings,
    owner_id: str,
    resolve: Resolver = identity,
    calls: CloudCalls | None = None,
) -> AwsProvider:
    """The provider `peerpods serve --provider aws` runs."""
    from providers.clouds.metadata import complete_aws

    if settings.aws_image_id or settings.pod_vm_image:
        # what the node's metadata knows, where unset (a missing image is refused first)
        settings = complete_aws(settings)
    config = config_from_settings(settings)
    if not config.image_id:
        # Refused at start: otherwise the daemon would run and fail every pod's StartVM.
        raise InvalidRequest(
            "aws provider: no pod VM image (set --aws-image-id or --pod-vm-image, "
            "env PEERPODS_POD_VM_IMAGE)"
        )
    return AwsProvider(config, owner_id, resolve=resolve, calls=calls)


def _market_arguments(placement: Site, spot: bool) -> dict[str, Any]:
    """How the launch is bought: into the operator's reservation (a Capacity Block's instances
    need the capacity-block market, a plain capacity reservation none), as Spot, or on demand."""
    reservation = placement.candidate.reservation
    if reservation:
        target = {"CapacityReservationId": reservation}
        arguments: dict[str, Any] = {
            "CapacityReservationSpecification": {"CapacityReservationTarget": target}
        }
        if "capacity-block" in offer_for("aws", placement.instance_type).provisioning:
            arguments["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
        return arguments
    if spot:
        return {"InstanceMarketOptions": SPOT_MARKET_OPTIONS}
    return {}
