"""WorkerBridge: the library facade. The CLI and the MCP server are thin layers over it and call
nothing else; it returns typed results (`TaskResult`, `AcceptResult`, `WorkerInfo`,
`EventPage`), which those layers turn into JSON. Every verb on a task is bounded by the bridge's
scope (bridge/scope.py): a task outside it is absent."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.config.profiles import without_filled
from bridge.config.settings import Config, load_config
from bridge.errors import BridgeError, ConfigError, InvalidSpec, TaskNotFound, TaskStateError
from bridge.host.state_root import make_private
from bridge.models import Status, TaskSpec
from bridge.pipeline.results import redactor_for, task_result
from bridge.records import (
    AcceptResult,
    EventPage,
    JobResult,
    TaskRecord,
    TaskResult,
    WorkerInfo,
)
from bridge.scope import RepositoryScope
from bridge.service.jobs import JobVerbs
from bridge.store import Store
from bridge.store.db import now_iso
from bridge.store.rows import readable

# What only acting verbs need (the pipeline, the jobs' coordinator, the sandbox, the workers) is
# imported inside them: a read (`tasks show`, `tasks list`) loads config, store and records.
if TYPE_CHECKING:
    from bridge.cluster.link import Nodes
    from bridge.cluster.node_process import NodeStarted, NodeStopped
    from bridge.cluster.status import NodeStatus
    from bridge.documents import PruneReport
    from bridge.environments.manage import Listed
    from bridge.phase.context import Context
    from bridge.phase.handle import PipelineHooks
    from bridge.sandbox import Sandbox
    from bridge.service.doctor import Check
    from bridge.workers.circuit import Reset


class WorkerBridge:
    """Create, run, inspect and accept delegated tasks.

    >>> bridge = WorkerBridge()                      # config from env + config.yaml
    >>> task = bridge.create_task({...spec...})      # validated, nothing allocated yet
    >>> result = await bridge.start_task(task.task_id)

    ``sandbox`` chooses the engine (default: the local Docker engine; `FakeSandbox` for tests);
    ``overrides`` are configuration keys, recorded with every task this bridge creates and used
    by its runners, detached ones included."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        sandbox: Sandbox | None = None,
        hooks: PipelineHooks | None = None,
        nodes: Nodes | None = None,
        **overrides: Any,
    ) -> None:
        self._overrides = overrides
        self.nodes = nodes  # a cluster's nodes given (tests); else config `cluster` names them
        self.config = config or load_config(**overrides)
        self._sandbox = sandbox
        self._store: Store | None = None
        self._opening = threading.Lock()
        self.hooks = hooks
        self._jobs = JobVerbs(self)

    def private_home(self) -> Path:
        """The state root, made private first (bridge/host/state_root.py): for a front end that
        writes there itself before any verb runs (the MCP server's log)."""
        make_private(self.config.home)
        return self.config.home

    @property
    def store(self) -> Store:
        """The store, opened once; the state root is made private first (this user's alone,
        bridge/host/state_root.py): every verb of every front end comes through here before
        it touches the state root."""
        with self._opening:  # tools calling from several threads open it once
            if self._store is None:
                make_private(self.config.home)
                self._store = Store(self.config.store_path)
        return self._store

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            from bridge.sandbox.docker import DockerSandbox

            self._sandbox = DockerSandbox()
        return self._sandbox

    def context(self) -> Context:
        from bridge.phase.context import Context

        return Context(self.config, self.store, self.sandbox, self.nodes)

    @property
    def scope(self) -> RepositoryScope:
        """The repositories this bridge may touch (config `repositories`): a task outside them
        is absent for every verb below, as if it did not exist."""
        return RepositoryScope.of(self.config.repositories)

    def _task(self, task_id: str) -> TaskRecord:
        """The task's record, or TaskNotFound for an unknown id and for a task outside the
        scope alike (the same words for both)."""
        record = self.store.load_task(task_id)
        if not self.scope.allows(record.repository):
            raise TaskNotFound.of(task_id)
        return record

    def _still_allowed(self, record: TaskRecord, *, worker_turn: bool) -> None:
        """What the owner's configuration allows now still covers the task (its mock routes,
        the images it names): InvalidSpec naming the setting otherwise."""
        from bridge.pipeline.creation import recheck_permissions

        recheck_permissions(self.config, self.sandbox, record, worker_turn=worker_turn)

    def close(self) -> None:
        from bridge.workspace.trash import wait_for_later  # (not needed by a read's start)

        wait_for_later()  # an accepted task's worktree, unmounted off accept's answer
        if self._store is not None:
            self._store.close()
            self._store = None

    # -- tasks ------------------------------------------------------------------------------

    def create_task(self, spec: dict[str, Any] | TaskSpec) -> TaskResult:
        """Validate a spec (its type's profile filling what it left unset) and record the task
        (status `created`). Raises InvalidSpec naming what is wrong, or CircuitOpen when the
        worker's circuit breaker refuses new tasks; nothing is allocated for a rejected spec
        (see bridge/pipeline/creation.py)."""
        from bridge.pipeline.creation import new_task_row, record_task

        row, event = new_task_row(self.config, self.sandbox, self.scope, spec)
        # a key is its repository's alone; the worker's circuit breaker may refuse it
        task_id, _ = record_task(self.store, self.config, row, event)
        return self.get_task(task_id)

    def run_task(
        self,
        task_id: str,
        *,
        runner_id: str | None = None,
        on_claimed: Callable[[], None] | None = None,
    ) -> TaskResult:
        """Run a task in this thread to a terminal status (or resume one whose runner died).
        ``on_claimed`` is called once this thread holds the task's claim (never when another
        runner has it: then the task's result is returned as it stands)."""
        from bridge.pipeline.runner import TaskRunner
        from bridge.sandbox.docker import resolved_once
        from bridge.store.owners import Owner

        record = self._task(task_id)
        if runner_id is None and record.status not in (Status.CREATED, Status.QUEUED):
            raise TaskStateError(
                f"Task {task_id} is already {record.status}; only a created or queued task starts."
            )
        with resolved_once():  # the run's images, each looked up once
            if runner_id is None:
                self._still_allowed(record, worker_turn=True)
            owner = Owner(id=runner_id) if runner_id else Owner()
            TaskRunner(self.context(), task_id, owner, hooks=self.hooks).run(on_claimed)
        return self.get_task(task_id)

    async def start_task(self, task_id: str) -> TaskResult:
        """Run a task to completion without blocking the event loop; returns the task result."""
        import asyncio  # only the async API needs it; keeps CLI start-up short

        return await asyncio.to_thread(self.run_task, task_id)

    def start_detached(self, task_id: str) -> TaskResult:
        """Queue the task and run it in a detached runner process; returns at once."""
        task = self._task(task_id)
        if task.status != Status.CREATED:
            raise TaskStateError(
                f"Task {task_id} is already {task.status}; only a created task starts."
            )
        self._still_allowed(task, worker_turn=True)
        from bridge.pipeline.detached import spawn_runner

        if not spawn_runner(self.config, self.store, task_id, replacing=task.runner_id):
            raise TaskStateError(f"Task {task_id} was started by another process meanwhile.")
        self.store.transition(task_id, Status.QUEUED, expect={Status.CREATED})
        return self.get_task(task_id)

    def follow_up(
        self,
        task_id: str,
        message: str,
        *,
        wait: bool = False,
        on_claimed: Callable[[], None] | None = None,
    ) -> TaskResult:
        """Queue another worker turn on the task's worktree (earlier changes kept), then collect
        and verify again, in a detached runner; returns the task result (status `queued`).
        ``wait``: run that turn here instead, until the task ends (no second process, as for
        `run_task`, whose ``on_claimed`` it takes), and return the final result."""
        from bridge.pipeline.follow_up import queue_follow_up

        if not message.strip():
            raise InvalidSpec("The follow-up message is empty; say what the worker should do.")
        task = self._task(task_id)
        if task.status in (Status.SUCCEEDED, Status.FAILED):
            self._still_allowed(task, worker_turn=True)
        runner_id = queue_follow_up(self.context(), task_id, message, launch=not wait)
        if wait:  # the reservation is ours: a crash here leaves it for recovery, as a runner's
            return self.run_task(task_id, runner_id=runner_id, on_claimed=on_claimed)
        return self.get_task(task_id)

    def cancel_task(self, task_id: str) -> TaskResult:
        """Cancel from any process: the status becomes `cancelled` (final), then the task's
        containers are killed with everything in them. A finished task is left as it is."""
        from bridge.pipeline.cancel import cancel_task

        self._task(task_id)
        cancel_task(self.context(), task_id)
        return self.get_task(task_id)

    def reject_task(self, task_id: str, reason: str = "") -> TaskResult:
        """Mark a succeeded task's change as not wanted (`rejected`, final); its workspace is
        left for prune. Any other status is left as it is."""
        redacted = redactor_for(self._task(task_id)).redact(reason)
        if self.store.transition(
            task_id,
            Status.REJECTED,
            expect={Status.SUCCEEDED},
            event={"reason": redacted},
            finished_at=now_iso(),
        ):
            self.store.add_event(task_id, "task.rejected", {"reason": redacted})
        return self.get_task(task_id)

    def retry_task(self, task_id: str) -> TaskResult:
        """A new task from the same spec (a fresh worktree from the same base), linked to the
        first (`metadata.retry_of`); returns it `created`, for `start_detached` or `run_task`."""
        record = self._task(task_id)
        if record.status not in (
            Status.SUCCEEDED,
            Status.FAILED,
            Status.CANCELLED,
            Status.TIMED_OUT,
            Status.REJECTED,
        ):
            raise InvalidSpec(f"Task {task_id} is {record.status}; retry a task once it has ended.")
        spec = without_filled(record.spec_doc, record.profile)  # filled again, as it is now
        spec["idempotency_key"] = None
        spec["metadata"] = {**(spec.get("metadata") or {}), "retry_of": task_id}
        retried = self.create_task(spec)
        self.store.add_event(task_id, "task.retried", {"task_id": retried.task_id})
        return retried

    def recover(self) -> list[str]:
        """Hand tasks whose runner died to new runners, and jobs whose coordinator died to new
        coordinators (of every repository: they were made within their own scope); remove
        orphan containers if any. Returns the ids in this bridge's scope (tasks, then jobs)."""
        if self._store is None and not self.config.store_path.exists():
            return []  # no store yet: nothing to recover, and nothing to create
        from bridge.jobs import recover_jobs
        from bridge.pipeline.recovery import (
            reclaim_mounts,
            recover_stranded,
            remove_orphan_containers,
        )

        recovered = recover_stranded(self.context())
        reclaim_mounts(self.context())
        jobs = recover_jobs(self.context())
        if recovered:
            try:
                remove_orphan_containers(self.context())
            except BridgeError:
                pass
        scope = self.scope
        tasks = [t for t in recovered if scope.allows(self.store.load_task(t).repository)]
        return tasks + [j for j in jobs if scope.allows(self.store.jobs.record(j).repository)]

    def get_task(self, task_id: str) -> TaskResult:
        record = self._task(task_id)
        requests = self.store.requests.for_task(task_id)
        return task_result(record, self.store.artifacts(task_id), requests=requests)

    def snapshot_file(self, task_id: str, path: str, most: int) -> bytes:
        """A file of the task's snapshot by its path in the repository (service/reading.py)."""
        from bridge.service.reading import snapshot_file

        return snapshot_file(self._task(task_id), path, most)

    def answer(
        self,
        task_id: str,
        request_id: str,
        *,
        decision: str | None = None,
        text: str | None = None,
    ) -> TaskResult:
        """Answer a pending request of the task: ``decision`` `approve` or `deny` (a network
        name, protected paths; `deny` also declines a question), or ``text`` (a question's
        answer, one of its choices or free text). Once nothing is pending, the task resumes
        the worker's session with the answers, or finishes as it would have without them
        (only denials). Returns the task result."""
        record = self._task(task_id)
        if text is not None or decision == "approve":
            self._still_allowed(record, worker_turn=True)
        from bridge.pipeline.answer import answer_request

        answer_request(self.context(), task_id, request_id, decision=decision, text=text)
        return self.get_task(task_id)

    def task_status(self, task_id: str) -> str:
        """Just the status, for polling loops (TaskNotFound as for every verb)."""
        return self._task(task_id).status

    def list_tasks(self, status: str | None = None, limit: int | None = None) -> list[TaskResult]:
        if status and status not in {s.value for s in Status}:
            raise InvalidSpec(
                f"Unknown status '{status}'; use one of {', '.join(s.value for s in Status)}."
            )
        scope = self.scope
        under = scope.prefixes() if scope.bounded else None
        records = [
            r
            for r in self.store.list_tasks(status=status, limit=limit, under=under)
            if scope.allows(r.repository)
        ]
        ids = [r.task_id for r in records]
        artifacts = self.store.artifacts_of(ids) if records else {}
        requests = self.store.requests.of(ids)

        def result(r: TaskRecord) -> TaskResult:
            return task_result(r, artifacts.get(r.task_id, {}), requests=requests.get(r.task_id))

        return readable(records, result)

    def task_logs(self, task_id: str, after: int = 0, limit: int = 200) -> EventPage:
        self._task(task_id)  # TaskNotFound for an unknown id, or one outside the scope
        events = self.store.events(task_id, after=after, limit=limit)
        return EventPage(events=events, next_after=events[-1].event_id if events else after)

    def events_since(self, after: int = 0, limit: int = 200) -> EventPage:
        """The events of every task and job in scope after the cursor (``after=-1``: none, the
        cursor at the newest event), for a view of them all. The cursor moves past events
        outside the scope too, which are left out."""
        if after < 0:
            return EventPage(events=[], next_after=self.store.last_event())
        events = self.store.events(None, after, limit)
        allowed: dict[str, bool] = {}
        for event in events:
            if event.task_id not in allowed:
                allowed[event.task_id] = self._in_scope(event.task_id)
        shown = [e for e in events if allowed[e.task_id]]
        return EventPage(events=shown, next_after=events[-1].event_id if events else after)

    def _in_scope(self, owner_id: str) -> bool:
        """Whether the task or job of that id lies inside the scope (an unknown id: no)."""
        if not self.scope.bounded:
            return True
        try:
            self._task(owner_id)
        except TaskNotFound:
            try:
                self._jobs.job_record(owner_id)
            except BridgeError:
                return False
        return True

    def task_state(self, task_id: str) -> tuple[str, str | None]:
        """The task's status and phase, cheaply (a live view's status line)."""
        self._task(task_id)
        return self.store.status_and_phase(task_id)

    def prune_workspaces(
        self, apply: bool = False, include_unaccepted: bool = False
    ) -> PruneReport:
        """Reclaim disk from finished tasks in scope (dry run unless ``apply``); see
        bridge/pipeline/prune.py for what is and is never removed."""
        from bridge.pipeline.prune import prune

        return prune(self.context(), apply, include_unaccepted, self.scope)

    def list_environments(self) -> list[Listed]:
        """The setup caches of this state root for repositories in scope."""
        from bridge.environments.manage import list_environments

        return list_environments(self.context(), self.scope)

    def prune_environments(self, apply: bool = False, everything: bool = False) -> PruneReport:
        """Reclaim setup caches (dry run unless ``apply``); see environments/manage.py."""
        from bridge.environments.manage import prune_environments

        return prune_environments(self.context(), self.scope, apply=apply, everything=everything)

    # -- accept -----------------------------------------------------------------------------

    def accept_task(
        self, task_id: str, *, allow_unverified: bool = False, reverify: bool = True
    ) -> AcceptResult:
        """Write the verified snapshot into the user's working tree (uncommitted), or say why
        not (nothing is written then). When HEAD moved past the task's base, the checks run
        again on HEAD plus the change first (``reverify=False`` skips that)."""
        from bridge.pipeline.accepting import accept_task

        record = self._task(task_id)
        self._still_allowed(record, worker_turn=False)
        diff = Path(self.store.artifacts(task_id).get("diff", ""))
        return accept_task(
            self.context(), record, diff, allow_unverified=allow_unverified, reverify=reverify
        )

    # -- workers and images -------------------------------------------------------------------

    def list_workers(self) -> list[WorkerInfo]:
        from bridge.workers.info import worker_infos

        return worker_infos(self.config, self.sandbox)

    def reset_worker(self, name: str) -> Reset:
        """Close the worker's circuit breaker (bridge/workers/circuit.py), so new tasks for it are
        taken again; UnknownWorker for a name that is no worker here."""
        from bridge.workers import get_worker
        from bridge.workers.circuit import reset as reset_circuit

        get_worker(self.config, name)
        return reset_circuit(self.store, self.config, name)

    def build_images(
        self,
        names: list[str] | None = None,
        *,
        everything: bool = False,
        base_image: str | None = None,
        on_line: Callable[[str], None] = print,
    ) -> list[str]:
        """Build images by name (a worker's name means its image: zcode-glm runs in the
        claude-code image; none: base, verify and mock; ``everything``: every image). Returns
        the tags built."""
        from bridge.sandbox.images import available_targets, build_images
        from bridge.workers import all_workers

        if everything and names:
            raise InvalidSpec("Give image names or --all, not both.")
        workers = all_workers(self.config)
        targets: list[str] = []
        for name in available_targets() if everything else names or []:
            target = workers[name].build_target if name in workers else name
            if target and target not in targets:
                targets.append(target)
        return build_images(self.config, self.sandbox, targets or None, base_image, on_line)

    def doctor(self) -> list[Check]:
        """Whether tasks can run here: one check each (bridge/service/doctor.py), as
        `{check, ok, detail, severity}`. Writes nothing."""
        from bridge.service.doctor import health_checks

        return health_checks(self.config, self.sandbox)

    # -- the cluster (docs/cluster.md) -------------------------------------------------------

    def cluster_status(self) -> list[NodeStatus]:
        """Each node of the configured cluster: address, alive, slots in use and total, the
        images its engine holds. ConfigError when no cluster is configured."""
        from bridge.cluster.status import NOT_CONFIGURED, cluster_status

        if self.nodes is None and not self.config.cluster.address:
            raise ConfigError(NOT_CONFIGURED)  # said before the state root is made
        if self.nodes is None:
            from bridge.pipeline.nodes import cluster_nodes

            self.nodes = cluster_nodes(self.config.cluster)
        return cluster_status(self.nodes, self.store)

    def start_node(
        self,
        address: str,
        *,
        name: str | None = None,
        slots: int | None = None,
        docker_host: str | None = None,
        root: Path | None = None,
        insecure_no_token: bool = False,
    ) -> NodeStarted:
        """Join this machine to the cluster at ``address`` as a node: `ray start`, detached and
        recorded (bridge/cluster/node_process.py); each argument checked before it starts."""
        from bridge.cluster.node_process import NodeRequest, plan_node, start_node

        request = NodeRequest(address, name, slots, docker_host, root, insecure_no_token)
        return start_node(plan_node(request))

    def stop_node(self, name: str | None = None, root: Path | None = None) -> NodeStopped:
        """Stop the node `start_node` started here (by its recorded pid alone)."""
        from bridge.cluster.node_process import chosen_root, stop_node

        return stop_node(chosen_root(name, root))

    def check_state_root(self) -> None:
        """In a container: the state root is shared with the host at the same path (ConfigError
        naming the mount to use otherwise); nothing outside one."""
        from bridge.sandbox.host_paths import require_state_root

        require_state_root(self.config.home)

    def link_worker(
        self, name: str, command: list[str], image: str | None = None, routes: tuple = ()
    ) -> None:
        from bridge.config.settings import LinkedWorker, save_linked_worker
        from bridge.gateway.policy import all_routes
        from bridge.workers import BUILTIN

        if name in BUILTIN:
            raise InvalidSpec(f"'{name}' is a built-in worker; choose another name.")
        if not command or not all(isinstance(part, str) for part in command):
            raise InvalidSpec("--command-json must be a JSON list of strings.")
        known = all_routes(self.config)
        for route in routes:
            if route not in known:
                raise InvalidSpec(
                    f"Unknown gateway route '{route}'; known routes: {', '.join(sorted(known))}."
                )
        worker = LinkedWorker(command=command, image=image, routes=list(routes))
        save_linked_worker(self.config, name, worker)
        self.config = load_config(**{**self._overrides, "home": self.config.home})

    # -- jobs: several tasks together (bridge/service/jobs.py) -----------------------------

    def compete(
        self,
        task: dict[str, Any] | TaskSpec,
        workers: list[str],
        *,
        attempts: int = 1,
        judge: str | None = None,
    ) -> JobResult:
        """One objective on several candidates (each worker ``attempts`` times), each its own
        task from the same base, run by a detached coordinator; returns the job at once. Its
        result ranks the candidates by our verification, then the tie-breaks, then the judge."""
        return self._jobs.compete(task, workers, attempts=attempts, judge=judge)

    def review(
        self,
        task: dict[str, Any] | TaskSpec,
        worker: str,
        reviewer: str,
        *,
        rounds: int = 3,
    ) -> JobResult:
        """An implementer task by ``worker``, then ``reviewer`` reviewing its verified snapshot
        read-only; requested changes become follow-up turns in the implementer's own session,
        up to ``rounds`` reviews. Returns the job at once (a detached coordinator runs it)."""
        return self._jobs.review(task, worker, reviewer, rounds=rounds)

    def fanout(self, task: dict[str, Any] | TaskSpec, objectives: list[str]) -> JobResult:
        """Several objectives on one base, one task each, run in parallel within the limits;
        returns the job at once. Integrate the ones you want with `integrate`."""
        return self._jobs.fanout(task, objectives)

    def integrate(self, job_id: str, task_ids: list[str]) -> JobResult:
        """Apply the chosen verified tasks of a job one after another onto the common base,
        verifying after each; stops at the first conflict or failure, naming it. The last
        verified step is a task the caller accepts (`accept_job` on the new job)."""
        return self._jobs.integrate(job_id, task_ids)

    def job_status(self, job_id: str) -> JobResult:
        """The job's result: its status, its tasks with their roles, and once ranked the
        candidates (JobNotFound for an unknown id and one outside the scope alike)."""
        return self._jobs.job_status(job_id)

    def list_jobs(self, limit: int | None = None) -> list[JobResult]:
        """The jobs in scope, newest first."""
        return self._jobs.list_jobs(limit)

    def cancel_job(self, job_id: str) -> JobResult:
        """Cancel the job and every task of it (its coordinator cancels any it makes after)."""
        return self._jobs.cancel_job(job_id)

    def accept_job(
        self, job_id: str, task_id: str | None = None, *, reverify: bool = True
    ) -> AcceptResult:
        """Accept the job's best candidate (or the one named) through the usual accept, then
        mark the other candidates `rejected`. One sentence when there is nothing to accept."""
        return self._jobs.accept_job(job_id, task_id, reverify=reverify)
