"""Durable sandbox state: records of every sandbox this node serves, and pool leases."""

from adaptor.state.records import SandboxRecord, SandboxState
from adaptor.state.store import QuarantinedRecord, StateError, StateStore

__all__ = ["QuarantinedRecord", "SandboxRecord", "SandboxState", "StateError", "StateStore"]
