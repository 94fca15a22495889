"""The device plan of a sandbox: which CDI devices the VM has and which container gets which.

Computed once at StartVM from the GPU intent (CreateVM's annotations) and the chosen instance,
stored with the sandbox (JSON). The inventory is fixed then: whole GPUs take the first indices,
GPUs carrying MIG devices follow, and the MIG layout (profile, GPU, start slot) is recorded so the
pod VM creates exactly those devices; a MIG device's index on its GPU is its rank by start slot.

Assignment to containers comes from the per-container plan the webhook writes
(`providers.core.contract.ContainerPlan`), which reaches CreateContainer in the container's OCI
annotations: units are filled in order of their first step on the pod's timeline, each from the
devices no unit alive at the same time holds (so an init container's GPU is reused by a later
container, while sidecars and DRA claims keep theirs), and a unit listed under two containers is
shared by them. Without a per-container plan (a CAA-style
webhook writing only `default_gpus`) every application container gets the pod's whole inventory;
the sandbox (pause) container never gets devices.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from adaptor.devices.naming import CdiNaming
from providers.core.catalog import InstanceType
from providers.core.contract import ContainerPlan, GpuIntent
from providers.core.errors import InvalidRequest
from providers.core.mig import pack
from providers.core.selection import rdma_devices


class MigDevice(BaseModel):
    """One MIG device the pod VM must create, and its CDI name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str
    gpu: int = Field(ge=0, description="GPU index in the VM")
    start: int = Field(ge=0, description="first memory slot of the placement")
    index: int = Field(ge=0, description="MIG device index on its GPU (rank by start slot)")
    name: str = Field(description="qualified CDI name")


class DevicePlan(BaseModel):
    """A sandbox's devices and their assignment; JSON-serialisable, stored with the sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: int = 1
    model: str = ""
    gpus: tuple[str, ...] = Field((), description="whole GPUs, CDI names, index order")
    mig: tuple[MigDevice, ...] = ()
    rdma: tuple[str, ...] = ()
    naming: CdiNaming = CdiNaming()
    # None: no per-container plan; every application container gets `default`.
    containers: dict[str, tuple[str, ...]] | None = None

    @property
    def default(self) -> tuple[str, ...]:
        """The whole inventory: what each app container gets without a per-container plan."""
        return (*self.gpus, *(m.name for m in self.mig), *self.rdma)

    @property
    def empty(self) -> bool:
        return not self.default

    def for_container(self, name: str) -> list[str]:
        """Qualified CDI names for this (application) container."""
        if self.containers is None:
            return list(self.default)
        return list(self.containers.get(name, ()))

    def with_container_plan(self, plan: ContainerPlan) -> DevicePlan:
        """Assign this inventory to containers as `plan` says (pure; raises InvalidRequest)."""
        return self.model_copy(update={"containers": _assign(self, plan)})

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> DevicePlan:
        return cls.model_validate_json(text)


def _take(pool: list[str], count: int, what: str, unit: str) -> list[str]:
    if count > len(pool):
        raise InvalidRequest(
            f"device plan unit {unit} needs {count} {what} but only {len(pool)} are left on the VM"
        )
    taken = pool[:count]
    del pool[:count]
    return taken


def _assign(inventory: DevicePlan, plan: ContainerPlan) -> dict[str, tuple[str, ...]]:
    # Interval colouring: units in order of their first step, devices freed once every unit
    # holding them has ended. Devices of one pool are interchangeable, so this never needs more
    # than the busiest step does (ContainerPlan.peaks, what the VM was sized for).
    order = {name: i for i, name in enumerate(inventory.default)}
    pools: dict[str, list[str]] = {"gpu": list(inventory.gpus), "rdma": list(inventory.rdma)}
    for device in inventory.mig:
        pools.setdefault("mig:" + device.profile, []).append(device.name)
    spans = plan.intervals()
    live: list[tuple[int, str, list[str]]] = []  # (last step, pool, devices)
    by_unit: dict[str, list[str]] = {}
    for unit in sorted(plan.units, key=lambda u: spans[u.id][0]):  # stable: ties in plan order
        start = spans[unit.id][0]
        for ended in [entry for entry in live if entry[0] < start]:
            live.remove(ended)
            pool = pools[ended[1]]
            pool.extend(ended[2])
            pool.sort(key=order.__getitem__)
        key = "mig:" + unit.profile if unit.kind == "mig" else unit.kind
        what = {"gpu": "whole GPUs", "rdma": "RDMA devices"}.get(key, f"MIG {unit.profile} devices")
        taken = _take(pools.setdefault(key, []), unit.count, what, unit.id)
        by_unit[unit.id] = taken
        live.append((spans[unit.id][1], key, taken))
    out: dict[str, tuple[str, ...]] = {}
    for container, refs in plan.containers.items():
        names: list[str] = []
        for ref in refs:
            names += [n for n in by_unit[ref] if n not in names]
        out[container] = tuple(names)
    return out


def _instance_gpus(instance: InstanceType | tuple[int, str], wanted: int) -> tuple[int, str]:
    if isinstance(instance, tuple):
        return instance
    if instance.gpu is not None:
        return instance.gpu.count, instance.gpu.model
    if instance.attachable_gpus and wanted:
        return wanted, instance.attachable_gpus[0].model
    return 0, ""


def _rdma_count(instance: InstanceType | tuple[int, str], wanted: bool) -> int:
    if isinstance(instance, tuple):
        return 1 if wanted else 0
    return rdma_devices(instance)


def plan_devices(
    plan: ContainerPlan | None,
    gpu: GpuIntent,
    instance: InstanceType | tuple[int, str],
    naming: CdiNaming | None = None,
) -> DevicePlan:
    """The sandbox's device plan; `instance` is the chosen type or (GPU count, GPU model id).

    The inventory follows the GPU intent (what the VM was sized for); when there is none, the
    per-container plan's own totals. Raises InvalidRequest when the VM cannot hold it.
    """
    naming = naming or CdiNaming()
    if gpu.empty and plan is not None:
        gpu = plan.gpu_intent()
    count, model = _instance_gpus(instance, gpu.gpus)
    if gpu.gpus > count:
        raise InvalidRequest(f"the pod needs {gpu.gpus} whole GPUs but the VM has {count}")
    mig: list[MigDevice] = []
    if gpu.mig:
        spare = count - gpu.gpus
        layout = pack(model, gpu.mig, spare) if spare > 0 else None
        if layout is None:
            wanted = ",".join(f"{p}:{n}" for p, n in sorted(gpu.mig.items()))
            raise InvalidRequest(
                f"MIG devices {wanted} do not fit {spare} spare {model or 'unknown'} GPU(s)"
            )
        for offset, group in enumerate(layout.per_gpu()):
            index = gpu.gpus + offset
            for rank, placement in enumerate(group):
                mig.append(
                    MigDevice(
                        profile=placement.profile,
                        gpu=index,
                        start=placement.start,
                        index=rank,
                        name=naming.mig_name(index, rank),
                    )
                )
    rdma_wanted = gpu.rdma or (plan is not None and any(u.kind == "rdma" for u in plan.units))
    rdma = _rdma_count(instance, rdma_wanted) if rdma_wanted else 0
    inventory = DevicePlan(
        model=model,
        gpus=tuple(naming.gpu_name(i) for i in range(gpu.gpus)),
        mig=tuple(mig),
        rdma=tuple(naming.rdma_name(i) for i in range(rdma)),
        naming=naming,
    )
    return inventory.with_container_plan(plan) if plan is not None else inventory
