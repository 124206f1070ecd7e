"""One typed definition per etcd document under ``/mcp/`` (DESIGN.md section 4), read and written only here.

Each document class has one parse, ``X.parse(key, raw) -> X`` (an ``InvalidArgument`` naming the key and
the field), and one writer, ``x.to_json() -> bytes``, byte-compatible with what clusters already hold.
Operator documents (spec, traffic, breaker, breaker policy) are strict; process documents tolerate and
count fields they do not know (``UNKNOWN_FIELDS``). ``OperatorDocs`` is the one rule every service applies
to a malformed operator document. The leader keys carry no JSON (they are the election's).

    /mcp/workers/<id>                  WorkerRecord           worker
    /mcp/workers/<id>/load             LoadReport             worker
    /mcp/models/<m>/spec               ModelSpecDoc           operator (strict)
    /mcp/models/<m>/traffic            TrafficDoc             operator (strict)
    /mcp/models/<m>/routing            TrafficDoc             scheduler
    /mcp/models/<m>/status             ModelStatusDoc         scheduler
    /mcp/replicas/<m>/<v>/<worker>     ReplicaRecord          scheduler, worker
    /mcp/drain/<worker>                DrainDoc               scheduler
    /mcp/demand/<m>/<router>           Demand                 router
    /mcp/breakers/<m>                  BreakerDoc             operator, health (strict)
    /mcp/config/breaker                BreakerPolicy          operator (strict)
    /mcp/stats/<source>/<m>            StatsDoc               router, worker
    /mcp/routers/<id>                  RouterRecord           router
    /mcp/rejected/<service>/<id>       RejectionsDoc          every service
"""

from __future__ import annotations

from typing import Any

from mcpcore.errors import InvalidArgument
from mcpcore.records.base import UNKNOWN_FIELDS, decode
from mcpcore.records.breaker import BreakerDoc, BreakerPolicy
from mcpcore.records.demand import Demand, DrainDoc, RouterRecord, StatsDoc
from mcpcore.records.model import ModelSpecDoc, ModelStatusDoc, TrafficDoc
from mcpcore.records.rejections import (
    OperatorDocs,
    Rejection,
    RejectionPublisher,
    RejectionsDoc,
    published_operator_docs,
)
from mcpcore.records.replica import ReplicaDetails, ReplicaRecord, ReplicaState, Transition
from mcpcore.records.worker import LoadReport, WorkerRecord

__all__ = [
    "UNKNOWN_FIELDS",
    "BreakerDoc",
    "BreakerPolicy",
    "Demand",
    "DrainDoc",
    "LoadReport",
    "ModelSpecDoc",
    "ModelStatusDoc",
    "OperatorDocs",
    "Rejection",
    "RejectionPublisher",
    "RejectionsDoc",
    "ReplicaDetails",
    "ReplicaRecord",
    "ReplicaState",
    "RouterRecord",
    "StatsDoc",
    "TrafficDoc",
    "Transition",
    "WorkerRecord",
    "display",
    "published_operator_docs",
]


def display(key: str, raw: bytes) -> Any:
    """A value as a person reads it (``mcpctl dump``): its JSON, or its text where it is not JSON."""
    try:
        return decode(key, raw)
    except InvalidArgument:  # not JSON: shown as text
        return raw.decode("utf-8", "backslashreplace")
