"""Configuration: one pydantic-settings root with a plain section per component.

Read from `configs/gpuyard.yaml` (or `--config FILE`), then overridden by environment
variables `GPUYARD__SECTION__KEY` (e.g. `GPUYARD__SERVER__PORT=9090`). A bad file or value
raises :class:`ConfigError` with the file and the field path, and the CLI exits with code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gpuyard.apis.gangs import DEFAULT_SCHEDULER_NAMES, GANG_SCHEDULERS, GangScheduler

__all__ = [
    "NODE_LEASE_NAMESPACE",
    "AgentConfig",
    "BackendConfig",
    "ConfigError",
    "KubernetesConfig",
    "LeaderElectionConfig",
    "OperatorConfig",
    "ReschedulerConfig",
    "SchedulerConfig",
    "ServerConfig",
    "Settings",
    "TokenConfig",
    "format_validation_error",
    "load_settings",
]

DEFAULT_CONFIG = Path("configs/gpuyard.yaml")
NODE_LEASE_NAMESPACE = "kube-node-lease"  # where kubelets renew their nodes' heartbeat Leases


class ConfigError(Exception):
    """A config or scenario file that cannot be used; the message names file and field."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenConfig(Section):
    """One API token, by the SHA-256 hex digest of the token (`gpuyard token hash`)."""

    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    user: str = Field(min_length=1)
    role: Literal["admin", "user", "viewer", "metrics"] = "user"
    namespaces: list[str] = Field(
        default_factory=list, description='Namespaces this user may use; ["*"] for all.'
    )


class RateLimitConfig(Section):
    """A token bucket per caller: `requests_per_second` refill, up to `burst` at once."""

    requests_per_second: float = Field(gt=0)
    burst: int = Field(default=20, ge=1)
    exempt_loopback: bool = Field(
        default=True, description="Requests without a token from a loopback address are not limited."
    )


class ServerConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="Body limit of the bulk writes (POST /api/v1/jobs, POST /api/v1/apply), aliases expanded.",
    )
    max_object_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="Body limit of every other write (PUT of one object, PATCH of a job), aliases expanded.",
    )
    decode_timeout_seconds: float = Field(
        default=10.0, gt=0, description="The longest one body may take to decode and validate (else 422)."
    )
    header_timeout_seconds: float = Field(
        default=15.0,
        gt=0,
        description="A connection whose request headers are not complete this long after it opened (or "
        "after its previous answer) is closed; also the idle keep-alive time.",
    )
    body_timeout_seconds: float = Field(
        default=30.0, gt=0, description="The longest a request body may take to arrive (else 408)."
    )
    max_connections_per_address: int | None = Field(
        default=64, ge=1, description="Open connections one client address may hold; null: no cap."
    )
    connection_cap_exempt_loopback: bool = Field(
        default=True, description="Connections from loopback addresses are not counted against the cap."
    )
    continue_key: str | None = Field(
        default=None,
        min_length=16,
        description="The HMAC key that signs list `continue` tokens (replicas behind one address share "
        "it); null: a random key per process.",
    )
    continue_ttl_seconds: float = Field(
        default=900.0, gt=0, description="How long a `continue` token stays valid (else 400)."
    )
    insecure: bool = False
    tokens: list[TokenConfig] = Field(default_factory=list)
    metrics_public: bool = Field(
        default=False,
        description="With tokens: false (default) = /metrics needs an admin or metrics token; true = "
        "anyone may scrape, and callers without one of those roles get no per-tenant series.",
    )
    rate_limit: RateLimitConfig | None = Field(
        default=None, description="Per-token request rate limit (token bucket); null: unlimited."
    )
    read_only: bool = Field(
        default=False,
        description="Refuse every write through the HTTP API (403); objects are created and changed with "
        "kubectl. `gpuyard install --read-only-api` sets it and leaves the API's RBAC out.",
    )


class LeaderElectionConfig(Section):
    """client-go leaderelection's defaults: a standby takes over within one lease duration."""

    enabled: bool = True
    lease_name: str = Field(default="gpuyard", min_length=1)
    lease_duration: float = Field(default=15.0, gt=0, description="Seconds a lease is valid unrenewed.")
    renew_deadline: float = Field(
        default=10.0, gt=0, description="Seconds the leader keeps trying to renew before it gives up."
    )
    retry_period: float = Field(default=2.0, gt=0, description="Seconds between tries to acquire or renew.")
    identity: str | None = Field(default=None, description="Holder identity; default POD_NAME or host_pid.")


JobGroup = Literal["training.kubedl.io", "kubeflow.org"]
JOB_GROUPS: tuple[JobGroup, ...] = ("training.kubedl.io", "kubeflow.org")


class KubernetesConfig(Section):
    """`backend.kubernetes.*`: how the Kubernetes backend reaches and watches the API server."""

    kubeconfig: str | None = Field(
        default=None,
        description="Kubeconfig file; default $KUBECONFIG, then in-cluster, then ~/.kube/config.",
    )
    context: str | None = Field(default=None, description="Kubeconfig context; default its current one.")
    namespace: str = Field(default="gpuyard-system", min_length=1, description="Namespace of the lease.")
    job_groups: list[JobGroup] = Field(
        default_factory=lambda: list(JOB_GROUPS),
        min_length=1,
        description="API groups whose job kinds gpuyard reconciles (watches).",
    )
    leader_election: LeaderElectionConfig = Field(default_factory=LeaderElectionConfig)
    node_lost_grace: float = Field(
        default=300.0,
        ge=0,
        description="Seconds a node may be gone or NotReady before its pods fail NodeLost.",
    )
    node_lease_namespace: str = Field(
        default=NODE_LEASE_NAMESPACE,
        min_length=1,
        description="Namespace of the nodes' heartbeat Leases (one per node, named after it).",
    )
    node_monitor_grace: float = Field(
        default=40.0,
        gt=0,
        description=(
            "Seconds a node's Lease may go unrenewed before gpuyard treats the node as NotReady "
            "(Kubernetes' --node-monitor-grace-period)."
        ),
    )
    watch_timeout: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Shortest time the server may hold one WATCH request (timeoutSeconds): each watch asks for a "
            "random time between this and twice this, as client-go does, so informers do not re-watch "
            "in step."
        ),
    )
    inactivity_timeout: float = Field(
        default=180.0,
        gt=0,
        description=(
            "Seconds without any event or bookmark before a watch is restarted. A real API server sends a "
            "bookmark on a quiet watch about once a minute: keep this well above that."
        ),
    )
    request_timeout: float = Field(default=30.0, gt=0, description="Seconds for one non-watch request.")
    backoff_max: float = Field(default=30.0, gt=0, description="Longest wait between retries of a watch.")
    list_page_size: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description=(
            "Objects per page of an informer's LIST (`limit` / `continue`, the first list and every re-list "
            "after a 410), as client-go's pager asks for them."
        ),
    )
    gpu_resource: Literal["auto", "dra", "gpuyard.io/gpu", "nvidia.com/gpu"] = Field(
        default="auto",
        description=(
            "How a bound GPU pod gets the GPUs gpuyard chose. auto: a ResourceClaim where the node publishes "
            "gpu.nvidia.com ResourceSlices, else gpuyard.io/gpu from `gpuyard agent --device-plugin`; dra: "
            "always a ResourceClaim; gpuyard.io/gpu: always the agent's device plugin; nvidia.com/gpu: "
            "count-only requests to NVIDIA's device plugin, which picks the GPUs itself (warned at start). "
            "GPU shares always ask the agent for gpuyard.io/gpu-share."
        ),
    )
    dra: Literal["auto", "on", "off"] = Field(
        default="auto",
        description=(
            "Dynamic Resource Allocation with gpu_resource auto: on gives every placed GPU pod a ResourceClaim "
            "(no GPU extended resource); auto does so on nodes with a gpu.nvidia.com ResourceSlice when the "
            "server serves resource.k8s.io/v1; off never. gpu_resource dra means on; an extended resource "
            "means off unless this is on."
        ),
    )

    @property
    def dra_mode(self) -> Literal["auto", "on", "off"]:
        """Whether placed GPU pods get ResourceClaims: on, auto (where slices are published) or off."""
        if self.gpu_resource == "dra":
            return "on"
        if self.gpu_resource == "auto":
            return self.dra
        return "on" if self.dra == "on" else "off"

    @property
    def device_resource(self) -> str:
        """The extended resource a GPU pod without a ResourceClaim asks the kubelet for."""
        return (
            self.gpu_resource
            if self.gpu_resource in ("gpuyard.io/gpu", "nvidia.com/gpu")
            else "gpuyard.io/gpu"
        )


class BackendConfig(Section):
    kind: Literal["fake", "kubernetes"] = "fake"
    cluster: str = Field(default="configs/clusters/demo.yaml", description="Fake cluster scenario file.")
    clock: Literal["real", "virtual"] = "real"
    data_dir: str | None = Field(
        default=".gpuyard", description="Journal directory; null keeps everything in memory."
    )
    journal_interval: float = Field(default=0.05, gt=0)
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)

    @property
    def gpus_picked_by(self) -> Literal["scheduler", "kubelet"]:
        """Who picks the GPUs a container gets: `kubelet` in count-only mode (the Kubernetes
        backend with `gpu_resource: nvidia.com/gpu`: NVIDIA's device plugin chooses, and the
        scheduler's GPU indices need not be the container's), else `scheduler`."""
        count_only = self.kind == "kubernetes" and self.kubernetes.gpu_resource == "nvidia.com/gpu"
        return "kubelet" if count_only else "scheduler"


class OperatorConfig(Section):
    cluster_domain: str = ""
    host_port_range: tuple[int, int] = (20000, 30000)
    concurrency: int = Field(default=4, ge=1)


class ReschedulerConfig(Section):
    """The defragmenting rescheduler (`scheduler/rescheduling.py`): off unless enabled."""

    enabled: bool = Field(
        default=False, description="Run the rescheduler periodically in the scheduler loop."
    )
    interval: float = Field(default=60.0, gt=0, description="Seconds between two periodic runs.")
    min_wait: float = Field(
        default=60.0, ge=0, description="Seconds a job waits on fragmentation before others move for it."
    )
    max_migrations_per_cycle: int = Field(default=4, ge=0, description="Jobs moved per run at most.")
    max_migrations_per_job_per_hour: int = Field(
        default=1, ge=0, description="Moves of one job per hour at most."
    )
    max_gpu_hours_lost_per_hour: float = Field(
        default=4.0, ge=0, description="GPU-hours of work thrown away by moves per hour at most."
    )
    hold_timeout: float = Field(
        default=600.0,
        gt=0,
        description="Seconds the freed room is held for the waiting job while moves finish.",
    )


class SchedulerConfig(Section):
    profile: str = "default"
    plugins: dict[str, float] = Field(default_factory=dict, description="Score plugin name -> weight.")
    plugin_args: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Plugin name -> keyword args, e.g. {gpu-node-reserve: {cpu_fraction: 0.25}}.",
    )
    seed: int = Field(default=0, description="Seed of the random profile.")
    cycle_interval: float = Field(default=0.05, gt=0)
    reclaim_delay: float = Field(
        default=0.0,
        ge=0,
        description="Seconds a quota owed its min waits before borrowed jobs are preempted (Koordinator: 120).",
    )
    nomination_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How long the room freed by preemption stays held for the preemptor (nomination).",
    )
    topology_wait_seconds: float = Field(
        default=300.0,
        ge=0,
        description="How long a gang of one-GPU workers that states no gpuyard.io/topology-policy waits "
        "for one node before it is split over several (0: never waits).",
    )
    backfill_hold_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="How long the queue's head holds the room of its planned placement after it was last "
        "planned (EASY backfill's time-bounded reservation).",
    )
    rescheduler: ReschedulerConfig = Field(default_factory=ReschedulerConfig)
    # --- pods' scheduler and delegate mode (docs/kubernetes.md) ---
    name: str = Field(
        default="gpuyard",
        min_length=1,
        description="schedulerName of the pods gpuyard places (kube-scheduler leaves them alone).",
    )
    mode: Literal["gpuyard", "delegate"] = Field(
        default="gpuyard",
        description="gpuyard: gpuyard places and binds pods; delegate: a gang scheduler places them.",
    )
    gang_scheduler: GangScheduler | None = Field(
        default=None, description="The gang scheduler pods are handed to in delegate mode."
    )
    delegate_scheduler_name: str | None = Field(
        default=None,
        description="schedulerName of delegated pods (default: volcano, scheduler-plugins-scheduler, "
        "koord-scheduler).",
    )

    @model_validator(mode="after")
    def _delegate_needs_gang_scheduler(self) -> SchedulerConfig:
        if self.mode == "delegate" and self.gang_scheduler is None:
            raise ValueError(
                "scheduler.gang_scheduler is required when scheduler.mode is delegate; "
                f"allowed: {', '.join(GANG_SCHEDULERS)}"
            )
        return self

    @property
    def pod_scheduler_name(self) -> str:
        """The schedulerName of the pods the operator creates: gpuyard's own (`name`), or in
        delegate mode the gang scheduler's (`delegate_scheduler_name`, else its usual name)."""
        if self.mode != "delegate" or self.gang_scheduler is None:
            return self.name
        return self.delegate_scheduler_name or DEFAULT_SCHEDULER_NAMES[self.gang_scheduler]


class LoggingConfig(Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "console", "json"] = "auto"


class AgentConfig(Section):
    """`gpuyard agent` on a node (docs/node-agent.md); its flags override these."""

    health_interval: float = Field(
        default=5.0, gt=0, description="Seconds; an unhealthy GPU is reported within one."
    )
    resync: float = Field(
        default=300.0, ge=1, description="Seconds between rewrites of an unchanged NodeTopology."
    )
    backoff_max: float = Field(default=60.0, ge=1, description="Longest wait between retries (NVML, server).")
    sysfs: str = "/sys"
    plugin_dir: str = "/var/lib/kubelet/device-plugins"
    cdi: bool = Field(
        default=False,
        description="Device-plugin answers name CDI devices (`<cdi_kind>=<uuid>`) instead of /dev nodes: "
        "for runtimes with CDI, and NVIDIA toolkits that ignore env from unprivileged pods.",
    )
    cdi_kind: str = Field(
        default="nvidia.com/gpu",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$",
        description="The CDI kind (vendor/class) of the GPU specs on the node, as NVIDIA's toolkit writes them.",
    )
    mps_pipe_directory: str | None = Field(
        default="/tmp/nvidia-mps",
        description="The node's MPS pipe directory, mounted into GPU-share pods; null: not mounted.",
    )

    @field_validator("mps_pipe_directory")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path on the node, not {value!r}")
        return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUYARD__", env_nested_delimiter="__", extra="forbid")

    server: ServerConfig = Field(default_factory=ServerConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    operator: OperatorConfig = Field(default_factory=OperatorConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # environment beats the file (passed as init kwargs)
        return (env_settings, init_settings)


def format_validation_error(exc: ValidationError, *, source: str) -> str:
    """One line per problem: `source: field.path: message`."""
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"{source}: {path}: {msg}")
    return "; ".join(lines)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (server, backend, ...), got {type(data).__name__}"
        )
    return data


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load the config file (default `configs/gpuyard.yaml` if present), env, then overrides.

    `overrides` are section -> {key: value} dicts from CLI flags and win over everything.
    """
    file_data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        file_data = _read_yaml(Path(path))
        source = str(path)
    elif DEFAULT_CONFIG.exists():
        file_data = _read_yaml(DEFAULT_CONFIG)
        source = str(DEFAULT_CONFIG)
    try:
        settings = Settings(**file_data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source=source)) from None
    for section, values in overrides.items():
        current = getattr(settings, section)
        given = {k: v for k, v in values.items() if v is not None}
        try:
            replaced = type(current).model_validate({**current.model_dump(), **given})
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc, source=f"--{section} options")) from None
        settings = settings.model_copy(update={section: replaced})
    return settings
