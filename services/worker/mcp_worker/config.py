"""The worker's configuration: one frozen dataclass, built once in ``__main__`` (flags > env > YAML).

Env vars are ``MCP_WORKER_<FIELD>`` (``MCP_WORKER_ETCD_ENDPOINTS=127.0.0.1:2379``); the YAML file has the
same field names. ``__post_init__`` checks what crosses fields, so a bad combination fails at start-up with
the field named, never later on the request path. The sections every service shares (gRPC and metrics
serving, advertise, etcd, TLS, the process's options and tuning) are ``mcpcore.settings``' and keep their
flat names: ``grpc_port``, ``etcd_endpoints``.

``device_environment`` reads the CUDA variables, which are CUDA's and the cuda backend's rather than
settings of a worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mcpcore.config import environment, flat, instance_id
from mcpcore.settings import Advertise, EtcdSettings, GrpcServing, MetricsServing, ProcessOptions
from mcpcore.tls import TLSConfig

__all__ = [
    "DEVICE_ENV",
    "FATBIN_ENV",
    "VISIBLE_ENV",
    "DeviceEnvironment",
    "WorkerConfig",
    "device_environment",
]

#: The CUDA variables: the kernels file and the device of a cuda backend made without one (tools, tests; a
#: worker passes its own ``gpu_index``), and the GPUs CUDA shows (``backends.cuda_device``, ``nvml``).
FATBIN_ENV = "MCP_CUDA_FATBIN"
DEVICE_ENV = "MCP_CUDA_DEVICE"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class WorkerConfig:
    #: Unique id of this worker in the mesh (etcd key ``/mcp/workers/<id>``).
    worker_id: str = ""
    #: Model repository: ``<repo>/<model>/<version>/model.yaml`` plus its weights. A folder (``models``,
    #: ``file:///srv/models``), or a URL every worker host reads the same models from: ``http://`` /
    #: ``https://host/models`` (a user and password in the URL go as Basic auth and are never logged) or
    #: ``s3://bucket/prefix`` (boto3; ``AWS_ENDPOINT_URL`` for MinIO/Ceph, ``AWS_ACCESS_KEY_ID``,
    #: ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``). A URL repository is listed by ``<repo>/index.json``
    #: and each version needs ``<model>/<version>/manifest.json`` (every file's sha256 and size; a folder's
    #: is checked when present): ``python -m mcp_worker.repository publish DIR`` writes both.
    repository: str = "models"
    #: URL repositories only: where downloaded files are kept, by sha256 (relative paths are from the
    #: worker's working directory), and how many bytes of them at most (least recently used go first; a
    #: file larger than the whole cache cannot load). Encrypted files stay encrypted there.
    repository_cache: str = ".run/model-cache"
    repository_cache_bytes: int = 10 << 30
    #: Keyring file for encrypted models (never stored in etcd, never logged).
    keyring: str = ""
    etcd: EtcdSettings = field(default_factory=EtcdSettings, metadata=flat("etcd_"))
    #: TLS / mutual TLS: this service's gRPC server and its calls (env MCP_WORKER_TLS__CA_FILE, ...).
    tls: TLSConfig = field(default_factory=TLSConfig)
    #: Where the control gRPC API listens (port 0: pick a free one and publish it).
    grpc: GrpcServing = field(default_factory=GrpcServing, metadata=flat("grpc_"))
    #: The ZeroMQ tensor endpoint (ROUTER): ``tcp://host:port`` (port 0 picks one) or ``ipc://path``.
    zmq_bind: str = "tcp://127.0.0.1:0"
    #: Also listen on a same-host endpoint (``mcpcore.wire.local_endpoint``: a Linux abstract Unix socket
    #: named from the record's id, incarnation, endpoint and CURVE key) that routers and SDK clients in this
    #: host's network namespace use instead of TCP when the published address is this host's
    #: (docs/design/same-host-transport.md). Turn it off when senders must go through the published
    #: endpoint (e.g. a proxy in front of it) even on this host.
    zmq_local: bool = True
    #: The host others reach this worker at, when it binds a wildcard (``0.0.0.0`` in a container):
    #: published in etcd in place of the bound host for the gRPC and ZeroMQ endpoints.
    advertise: Advertise = field(default_factory=Advertise, metadata=flat("advertise_"))
    #: Optional CURVE: this worker's secret key file (z85, as written by zmq.auth); empty = plain TCP.
    zmq_curve_secret_key_file: str = ""
    #: With CURVE: a folder of the public keys (zmq.auth ``.key`` files) of the routers and SDK clients
    #: allowed to connect; any other key fails the handshake. Empty = any client key (encryption only).
    zmq_curve_clients_dir: str = ""
    metrics: MetricsServing = field(default_factory=MetricsServing, metadata=flat("metrics_"))
    #: Liveness: lease TTL and load-report (heartbeat) interval (the interval is raised to >= 3x mean
    #: inference time).
    lease_ttl_s: float = 5.0
    heartbeat_interval_s: float = 1.0
    #: Memory budget for all loaded models, in bytes (DESIGN section 9: a load that does not fit fails).
    memory_capacity_bytes: int = 8 << 30
    #: Batches executing at once (threads running model code).
    exec_slots: int = 2
    #: A numpy or ONNX model whose batches take at most this long runs them on the event loop, not an
    #: ``exec_slots`` thread: no thread to wake and no result to hand back (``mcp_worker.batching.inline``
    #: has the rules). A batch holds the loop that long at most; its first slower or failed batch sends the
    #: model back to the threads. 0 runs every batch on the threads.
    inline_batch_ms: float = 1.0
    #: Threads one matrix product of a numpy model may use (the BLAS numpy links). 1, as ONNX models'
    #: ``intra_op_num_threads``: parallelism comes from ``exec_slots`` (docs/design/blas-threads.md).
    #: 0 leaves BLAS's default (one per core).
    blas_threads: int = 1
    #: This worker's share of traffic relative to others (routers weight its virtual nodes by it; at most 64,
    #: so one record cannot make every router build a huge ring).
    capacity: float = 1.0
    #: Admission: requests, and bytes of their tensors, held at once; past them a request is refused at
    #: once ("exceeds maximum queue size", not started), shared fairly between models.
    max_in_flight_requests: int = 1024
    max_in_flight_bytes: int = 512 << 20
    #: Graceful stop (SIGTERM): how long admitted work may take to finish before what is still queued is
    #: answered "not started".
    drain_timeout_s: float = 10.0
    #: ZeroMQ heartbeats: a peer silent this long is dropped (a dead or frozen router).
    zmq_heartbeat_s: float = 1.0
    zmq_heartbeat_timeout_s: float = 3.0
    #: Executions: recent request ids kept to catch a request run twice, and an optional journal file of
    #: every execution (tests and benchmarks count duplicates across workers from it).
    dedup_window: int = 65536
    execution_log: str = ""
    #: Size limits for one ZeroMQ message.
    max_tensor_bytes: int = 16 << 20
    max_message_bytes: int = 64 << 20
    #: Labels for placement, e.g. ``gpu=h200,zone=a``.
    labels: tuple[str, ...] = ()
    #: Direct traffic (the SDK's, ``FLAG_DIRECT``): its windowed counts for the breakers, written to
    #: ``/mcp/stats/direct.<worker>/<m>`` every ``direct_stats_interval_s`` (as a router writes its own).
    direct_stats_window_s: float = 30.0
    direct_stats_interval_s: float = 1.0
    #: Where EmergencyStop writes its checkpoint file.
    checkpoint_dir: str = ".run/checkpoints"
    #: Pin this process to the CPUs of its GPU's NUMA node (read from sysfs) at start-up.
    numa_pin: bool = False
    #: The GPU whose node to use: its PCI bus id, else nvidia-smi's for ``gpu_index``.
    gpu_pci_bus_id: str = ""
    #: This worker's GPU (an index among those CUDA_VISIBLE_DEVICES shows): where its cuda models and ONNX
    #: models with ``device: gpu`` run, whose memory it reports, and whose NUMA node ``numa_pin`` uses.
    gpu_index: int = 0
    #: Publish the room its GPU has for its models (the device's memory less what other processes hold,
    #: NVML) in its load reports, so the scheduler places no more there. For GPU workers; a CPU worker on a
    #: GPU host leaves it off (its models live in host memory).
    place_by_gpu_memory: bool = False

    #: The process's own options: logging, tracing, tuning (``mcpcore.settings``, ``mcpcore.tuning``).
    process: ProcessOptions = field(default_factory=ProcessOptions, metadata=flat(""))

    def __post_init__(self) -> None:
        object.__setattr__(self, "worker_id", instance_id(self.worker_id, "worker_id"))
        if self.zmq_curve_clients_dir and not self.zmq_curve_secret_key_file:
            raise ValueError(
                "zmq_curve_clients_dir needs zmq_curve_secret_key_file: without CURVE the allow-list "
                "would check nothing"
            )
        if self.lease_ttl_s < 1:
            raise ValueError(f"lease_ttl_s: must be >= 1 second, got {self.lease_ttl_s}")
        if not 0 < self.heartbeat_interval_s < self.lease_ttl_s:
            raise ValueError(
                f"heartbeat_interval_s: must be > 0 and below lease_ttl_s ({self.lease_ttl_s}), "
                f"got {self.heartbeat_interval_s}"
            )
        if self.exec_slots < 1:
            raise ValueError(f"exec_slots: must be >= 1, got {self.exec_slots}")
        if not 0 <= self.inline_batch_ms <= 10:
            raise ValueError(
                f"inline_batch_ms: must be 0 (off) to 10 ms (the time a batch may hold the event loop), "
                f"got {self.inline_batch_ms}"
            )
        if self.blas_threads < 0:
            raise ValueError(f"blas_threads: must be >= 0 (0: BLAS's own default), got {self.blas_threads}")
        if self.memory_capacity_bytes <= 0:
            raise ValueError(f"memory_capacity_bytes: must be > 0, got {self.memory_capacity_bytes}")
        if not 0 < self.capacity <= 64:
            raise ValueError(
                f"capacity: must be in (0, 64] (a weight against other workers), got {self.capacity}"
            )
        if self.max_in_flight_requests < 1 or self.max_in_flight_bytes < self.max_message_bytes:
            raise ValueError(
                "max_in_flight_requests: must be >= 1, and max_in_flight_bytes at least max_message_bytes "
                f"({self.max_message_bytes})"
            )
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s: must be >= 0, got {self.drain_timeout_s}")
        if not 0 < self.zmq_heartbeat_s < self.zmq_heartbeat_timeout_s:
            raise ValueError("zmq_heartbeat_timeout_s: must be above zmq_heartbeat_s (both > 0)")
        if self.repository_cache_bytes <= 0:
            raise ValueError(f"repository_cache_bytes: must be > 0, got {self.repository_cache_bytes}")
        if not self.repository_cache:
            raise ValueError("repository_cache: must name a directory")
        if self.dedup_window < 1:
            raise ValueError(f"dedup_window: must be >= 1, got {self.dedup_window}")
        for label in self.labels:
            if "=" not in label:
                raise ValueError(f"labels: {label!r} must look like key=value")

    @property
    def label_map(self) -> dict[str, str]:
        return dict(label.split("=", 1) for label in self.labels)

    @property
    def lease_ttl(self) -> int:
        """The lease TTL etcd gets: whole seconds, rounded up."""
        return max(1, int(-(-self.lease_ttl_s // 1)))


@dataclass(frozen=True)
class DeviceEnvironment:
    """The CUDA variables as set (None: unset). Not worker settings: CUDA itself reads
    ``CUDA_VISIBLE_DEVICES``, and tools run the cuda backend without a worker."""

    fatbin: str | None
    device: str | None
    visible_devices: str | None


def device_environment(env: Mapping[str, str] | None = None) -> DeviceEnvironment:
    """The CUDA variables of ``env`` (default: the process's), read when asked, never at import."""
    env = environment() if env is None else env
    return DeviceEnvironment(env.get(FATBIN_ENV), env.get(DEVICE_ENV), env.get(VISIBLE_ENV))
