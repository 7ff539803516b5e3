"""Sections of the configuration: the gateway (`gateway`, its model routes and bounds), the MCP
server's HTTP listener (`http`), the bounds of jobs (`jobs`), the workers' circuit breaker
(`circuit`), the container pool (`pool`), the task types' profiles (`profiles`), the default limits
(`limits`) and the workers' own settings (`workers`, `linked_workers`). bridge/config/settings.py
loads them as part of `Config`; they live apart so that module stays the loader."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class RouteConfig(BaseModel):
    """A model route of the gateway: `/<name>/...` inside the sandbox is proxied to
    ``upstream``, with the real key (from the host variable ``key_env``) added on the way out."""

    model_config = ConfigDict(extra="forbid")
    upstream: str | None = Field(
        None,
        description="Base URL, e.g. https://api.anthropic.com (required for a new route; a "
        "built-in route keeps its own unless given).",
    )
    auth: str | None = Field(
        None,
        description="How the key is sent: `bearer` (Authorization: Bearer, the default for a "
        "new route), `x-api-key`, or `header:<Name>` for another header.",
    )
    key_env: str | None = Field(
        None, description="Name of the host environment variable that holds the key."
    )
    paths: list[str] | None = Field(
        None,
        description="The requests the route lets through, as 'METHOD /path' (METHOD may be *; "
        "a path ending in /* allows what is below it); any other is refused. Default: a "
        "built-in route's own list (the model calls its CLIs make, see docs/network.md), "
        "every path for a new route.",
    )


class GatewayConfig(BaseModel):
    """The per-task gateway: model routes, the allowlist proxy and its bounds."""

    model_config = ConfigDict(extra="forbid")
    routes: dict[str, RouteConfig] = Field(
        default_factory=dict, description="Routes added to (or replacing) the built-in ones."
    )
    trusted_ranges: list[str] = Field(
        default_factory=list,
        description="Address ranges (CIDR) an allowlisted name may resolve to although they "
        "are loopback, private or link-local (private mirrors; tests).",
    )
    connect_ports: list[int] = Field(
        default_factory=lambda: [443],
        description="Ports a CONNECT tunnel (HTTPS) may reach: raw TCP, so only TLS ports.",
    )
    http_ports: list[int] = Field(
        default_factory=lambda: [80], description="Ports plain-HTTP proxy requests may reach."
    )
    max_request_mb: int = Field(32, ge=1, description="Largest request body through a route.")
    max_response_mb: int = Field(512, ge=1, description="Largest response through a route.")
    idle_timeout_s: float = Field(120, gt=0, description="Silence that ends a request.")
    total_timeout_s: float = Field(1800, gt=0, description="Longest one request may take.")
    connect_timeout_s: float = Field(15, gt=0, description="Connecting to an upstream.")
    max_events: int = Field(2000, ge=10, description="network.* events stored per task.")
    on_refused: Literal["refuse", "ask"] = Field(
        "refuse",
        description="Default of a task's network.on_refused: `ask` turns a refused name (never "
        "a private, loopback or metadata address) into a request the caller may approve.",
    )
    max_requests: int = Field(
        16,
        ge=1,
        le=1000,
        description="Network requests one task may raise (pending or answered); past it, a "
        "refused name is just refused.",
    )
    max_connections: int = Field(64, ge=1, description="Connections open at once per gateway.")
    setup_max_connections: int = Field(
        1024,
        ge=1,
        description="Connections open at once on an environment setup's gateway (package "
        "managers open one per download, all at once).",
    )
    read_deadline_s: float = Field(
        60,
        gt=0,
        description="Longest the gateway may wait, in all, for one request's head and body to "
        "arrive (time it spends not reading, its upstream being slow, does not count).",
    )
    memory_budget_mb: int = Field(
        48,
        ge=1,
        description="Bytes one gateway holds in flight, across all its connections (worker "
        "and setup gateways alike): no body is held whole, and each exchange through an "
        "upstream takes 768 KiB of it (48 MiB: max_connections of them at once), each tunnel "
        "read 64 KiB; past it, connections wait.",
    )


class HttpConfig(BaseModel):
    """Bounds of the MCP server's HTTP listener (`worker-bridge-mcp --http`), sized for a service
    shared by a team's agents. The deadlines and connection caps act before the token is checked,
    so they hold for clients without it too; see docs/security.md."""

    model_config = ConfigDict(extra="forbid")
    head_timeout_s: float = Field(
        10,
        gt=0,
        description="Longest a client may take to send a request's line and headers, from "
        "connecting or from the previous response; then 408 and the connection is closed.",
    )
    body_timeout_s: float = Field(
        30,
        gt=0,
        description="Longest a client may take to send a request's body once its head has "
        "arrived; then 408 (or, once answered, just closed).",
    )
    keep_alive_s: int = Field(
        5, ge=1, description="An idle connection between requests is closed after this long."
    )
    max_head_kb: int = Field(
        16,
        ge=1,
        le=1024,
        description="Largest request line and headers together (a bigger head is refused "
        "with 400 and the connection closed).",
    )
    max_body_kb: int = Field(
        4096,
        ge=1,
        description="Largest request body, read whole before the SDK sees the request "
        "(a bigger one is refused with 413).",
    )
    max_connections: int = Field(
        256,
        ge=1,
        description="Connections open at once, all clients together; one more is answered "
        "503 and closed before anything of it is read.",
    )
    max_connections_per_client: int = Field(
        32,
        ge=1,
        description="Connections open at once from one client address (an IPv6 client: its "
        "/64); behind a proxy or Docker's port publishing every client shares one address.",
    )
    max_sessions: int = Field(
        256,
        ge=1,
        description="MCP sessions open at once; past it a new `initialize` is refused with "
        "503 and one sentence, while open sessions keep working.",
    )
    session_idle_timeout_s: float = Field(
        1800,
        gt=0,
        description="An MCP session with no request in flight (and no open GET stream) for "
        "this long is closed; its id then answers 404 'Session not found'.",
    )
    ui: bool = Field(
        False,
        description="Also serve the web view under /ui on this listener (signed in with the "
        "same token). Off by default: a listener shared by agents need not take browser "
        "sessions; `worker-bridge ui` serves the view on its own port.",
    )


class JobsConfig(BaseModel):
    """Bounds of jobs (see docs/jobs.md): how big a job may be, and how much text written by a
    worker is quoted to a judge or reviewer, or kept of a reviewer's answer."""

    model_config = ConfigDict(extra="forbid")
    max_candidates: int = Field(
        8, ge=2, le=64, description="Candidates of one compete (objectives of one fanout)."
    )
    max_rounds: int = Field(10, ge=1, le=100, description="Review rounds one review may ask.")
    quoted_diff_chars: int = Field(
        24_000, ge=1000, description="Characters of each diff shown to a judge or reviewer."
    )
    quoted_objective_chars: int = Field(
        8000, ge=100, description="Characters of the objective shown to a judge or reviewer."
    )
    review_findings: int = Field(50, ge=1, description="Findings kept of one review.")
    finding_chars: int = Field(2000, ge=100, description="Characters kept of one finding.")
    integration_kb: int = Field(
        4096,
        ge=16,
        description="File contents one integration step may carry (they ride in its task's "
        "spec, stored in the store, and step k carries the first k tasks' files).",
    )


class CircuitConfig(BaseModel):
    """The circuit breaker kept per worker (docs/workers.md): after ``failures`` failures of a
    worker within ``window_s`` that no repair fixed, new tasks for it are refused for
    ``cooldown_s``; then one task is let through, and its outcome closes or reopens it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    failures: int = Field(
        3,
        ge=0,
        le=1000,
        description="Worker failures (its CLI exiting with an error, a refused key, a turn "
        "timeout) within window_s that open the worker's circuit; 0 disables the breaker.",
    )
    window_s: float = Field(
        600, gt=0, le=30 * 86400, description="How far back failures are counted (at most 30 days)."
    )
    cooldown_s: float = Field(
        300,
        ge=0,
        le=30 * 86400,
        description="How long an open circuit refuses new tasks before one is tried (at most "
        "30 days).",
    )
    min_timeout_s: float = Field(
        300,
        ge=0,
        le=30 * 86400,
        description="A timed-out turn counts as a failure only when the task's deadline was at "
        "least this long: a caller's own short budget is not a hanging worker.",
    )


class PoolConfig(BaseModel):
    """Fresh containers made ahead of time (docs/architecture.md, "The container pool"): per
    shape (image, runtime, limits, user, the places mounts go), up to ``size`` started, idle
    containers wait for the next task's worker or verification command; each serves one
    task and is removed after it. Idle ones count against no task limit and are bounded here."""

    model_config = ConfigDict(extra="forbid")
    size: int = Field(
        0,
        ge=0,
        le=8,
        description="Idle started containers kept per shape for the next tasks; 0 disables the "
        "pool (the default: on this engine it does not pay, see docs/benchmarks.md).",
    )
    max_containers: int = Field(
        8, ge=1, le=64, description="Idle pooled containers of this state root, all shapes."
    )
    max_memory_mb: int = Field(
        16384, ge=64, description="The memory limits of the idle pooled containers, added up."
    )
    idle_s: float = Field(
        600, gt=0, description="An idle pooled container unused this long is removed."
    )


class ClusterConfig(BaseModel):
    """Tasks on a Ray cluster (docs/cluster.md): with ``address`` set, a task's worker turns and
    checks run on the cluster's nodes, while the store, the keys and the gateways stay here."""

    model_config = ConfigDict(extra="forbid")
    address: str | None = Field(
        None,
        description="HOST:PORT of the Ray cluster's head (its token's file in RAY_AUTH_TOKEN_PATH);"
        " unset: every task runs on this host.",
    )
    registry: str | None = Field(
        None,
        description="HOST:PORT of a registry this host's engine pushes the task images to, for "
        "the nodes to pull them by digest; unset: a node lacking one gets it streamed from this "
        "host's engine.",
    )
    node_registry: str | None = Field(
        None, description="The same registry as the nodes' engines reach it, when that differs."
    )
    relay_host: str | None = Field(
        None,
        description="The address the nodes reach this host on for the gateway's relay; default:"
        " the one Ray uses for this host.",
    )
    relay_ports: tuple[int, int] | None = Field(
        None,
        description="[LOW, HIGH]: the TCP ports this host's relays listen on (the nodes' way to "
        "the gateways; one per process running tasks), to open that range in a firewall; unset: "
        "any free port.",
    )
    node_timeout_s: float = Field(
        30,
        gt=0,
        description="A node that says nothing for this long during a turn is lost: the turn "
        "ends naming it.",
    )
    namespace: str = Field("worker-bridge", description="The Ray namespace of the node agents.")

    @field_validator("relay_ports")
    @classmethod
    def _a_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 1 <= value[0] <= value[1] <= 65535:
            raise ValueError("relay_ports is [LOW, HIGH] with 1 <= LOW <= HIGH <= 65535")
        return value


class TaskProfile(BaseModel):
    """What a task type (`metadata.type`, `--type`) fills in when the caller left it unset;
    a field left out here fills nothing (the spec's and config's defaults apply)."""

    model_config = ConfigDict(extra="forbid")
    priority: int | None = Field(None, ge=0, le=100, description="The task's `priority`.")
    timeout_seconds: int | None = Field(
        None, ge=1, description="The task's deadline, `limits.timeout_seconds`."
    )
    auto_repair: int | None = Field(
        None, ge=0, description="Repair turns after failed verification, `metadata.auto_repair`."
    )


class LimitDefaults(BaseModel):
    """Limits applied when a task's spec leaves them out."""

    model_config = ConfigDict(extra="forbid")
    timeout_seconds: int = Field(1800, ge=1, description="Deadline for the whole task.")
    memory_mb: int = Field(2048, ge=16, description="Memory limit of each task container.")
    cpus: float = Field(1.0, gt=0, description="CPU quota of each task container.")
    pids: int = Field(512, ge=16, description="Process limit of each task container.")
    disk_mb: int = Field(
        8192,
        ge=1,
        description="Disk the worktree and verification checkout may use, enforced "
        "while containers run (error kind `disk`).",
    )
    file_mb: int = Field(
        100,
        ge=1,
        description="Largest file a change may hold (`disk`, before anything is "
        "written into the repository's object store).",
    )
    change_mb: int = Field(
        1024, ge=1, description="Largest whole change, all its files together (`disk`)."
    )
    files: int = Field(
        500_000, ge=100, description="Files (and links) a worktree may hold when collected."
    )
    log_mb: int = Field(16, ge=1, description="What the engine keeps of one container's output.")
    line_kb: int = Field(64, ge=1, description="Longest output line read; the rest is cut.")
    secrets: int = Field(
        1000, ge=10, description="Secret values learned from output and remembered per task."
    )
    input_timeout_seconds: int = Field(
        3600,
        ge=1,
        description="How long a worker's request or question waits for an answer; unanswered "
        "past it, it counts as denied.",
    )


class LinkedWorker(BaseModel):
    """A command-line agent registered with `worker-bridge workers link`."""

    model_config = ConfigDict(extra="forbid")
    command: list[str] = Field(min_length=1, description="argv; '{prompt}' is replaced.")
    image: str | None = Field(None, description="Image to run it in; default the base image.")
    routes: list[str] = Field(default_factory=list, description="Gateway model routes it uses.")


class WorkerSettings(BaseModel):
    """Settings of a built-in worker (codex, claude-code, opencode, zcode-glm)."""

    model_config = ConfigDict(extra="forbid")
    route: str | None = Field(
        None, description="Gateway model route it uses; default the worker's own (see workers.md)."
    )
    model: str | None = Field(None, description="Model the CLI asks for; default the CLI's own.")
