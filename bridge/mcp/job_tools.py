"""The MCP tools on jobs (compete, review, status, accept, cancel): one method each on `JobTools`,
served beside the tools on tasks (tools.py, which also holds every tool's hints in TOOLS). Each
blocking bridge call goes through calls.py: in a thread, a BridgeError a tool error."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from bridge.mcp.calls import BridgeCalls, refused_accept
from bridge.mcp.results import AcceptAnswer, JobAnswer, accept_answer, job_answer
from bridge.mcp.waiting import next_step, wait_settled
from bridge.models import JOB_TERMINAL, TERMINAL
from bridge.records import JobResult


def _typed(metadata: dict[str, Any] | None, kind: str | None) -> dict[str, Any]:
    """The tasks' metadata, with the type the call names (an argument wins over the same key
    in the metadata it was given)."""
    given = dict(metadata or {})
    if kind:
        given["type"] = kind
    return given


class JobTools:
    """worker_compete, worker_review, worker_job_status, worker_job_accept, worker_job_cancel,
    bound to one WorkerBridge through ``call``."""

    def __init__(self, call: BridgeCalls) -> None:
        self.call = call
        self.bridge = call.bridge

    async def _wait_job(self, job_id: str, ctx: Context | None) -> CallToolResult:
        """The job's result once it ended, or as it is after WAIT_RETURN_S (waiting.py), with
        progress on the way."""

        async def where(job: JobResult) -> str:
            ended = sum(1 for t in job.tasks if t.status in TERMINAL)
            return f"job {job_id} {job.status}, {ended} of {len(job.tasks)} tasks ended"

        job, settled = await wait_settled(
            lambda: self.call(self.bridge.job_status, job_id),
            lambda j: j.status in JOB_TERMINAL,
            where,
            ctx,
        )
        if settled:
            return job_answer(job)
        return job_answer(job, next_step("job", job.status, "worker_job_status"))

    async def worker_compete(
        self,
        objective: Annotated[
            str,
            Field(
                description="What every candidate should do, as a self-contained instruction "
                "(each sees only this and the repository)."
            ),
        ],
        repository: Annotated[
            str, Field(description="Absolute path to the git repository on this machine.")
        ],
        workers: Annotated[
            list[str],
            Field(
                description="The workers to run it on, one candidate each (list_workers shows "
                "them); one worker with attempts >= 2 also works."
            ),
        ],
        verify: Annotated[
            list[str],
            Field(
                description="Shell commands worker-bridge runs itself on each candidate, in a "
                "clean container without network (e.g. ['pytest -q']). Only candidates whose "
                "commands all pass are eligible to win."
            ),
        ],
        attempts: Annotated[
            int, Field(ge=1, le=8, description="Candidates per worker (default 1).")
        ] = 1,
        judge: Annotated[
            str | None,
            Field(
                description="Optional read-only worker that ranks the eligible candidates' "
                "diffs (shown under neutral labels, never worker names); if it fails or "
                "contradicts itself the job ends 'unresolved' for you to choose."
            ),
        ] = None,
        base_ref: Annotated[str, Field(description="Commit-ish every candidate starts from.")] = (
            "HEAD"
        ),
        permission: Annotated[
            Literal["workspace_write", "full_access"],
            Field(description="What each candidate's worker may do in its own worktree."),
        ] = "workspace_write",
        protected_paths: Annotated[
            list[str] | None,
            Field(description="Glob patterns a candidate must not change (e.g. ['tests/**'])."),
        ] = None,
        wait: Annotated[
            bool,
            Field(
                description="false (default): return at once; poll worker_job_status. true: "
                "return when the job has ended (several task runs: often minutes), or after 50 s "
                "with `next` saying how to go on."
            ),
        ] = False,
        type: Annotated[
            str | None,
            Field(
                description="Kind of change (metadata.type): chore, feature, hotfix, refactor "
                "or one the server's config adds; its profile fills what you leave unset in "
                "every task of the job."
            ),
        ] = None,
        metadata: Annotated[
            dict[str, Any] | None,
            Field(
                description="Task metadata; metadata.candidates[i] is merged over candidate i's "
                "and metadata.judge is the judge's (the mock worker's scripts, say)."
            ),
        ] = None,
        ctx: Context | None = None,
    ) -> JobAnswer:
        """Run the same task on several workers (or several attempts of one) and rank the
        results, when you want the best of several tries rather than one. Each candidate is an
        ordinary task on its own worktree from the same base; they run in parallel within the
        host's limits. Ranking: only candidates whose verification (run by worker-bridge, not
        by the candidate) passed without touching protected paths are eligible; then fewer
        changed lines, fewer files, a shorter run, fewer tokens; then the judge, if named.
        Returns the job (job_id, status, tasks with roles); once ended, `candidates` ranked
        with reasons and figures, `winner`, and `ordering`. Nothing is written to your
        repository until worker_job_accept."""
        spec = {
            "objective": objective,
            "worker": workers[0] if workers else "mock",
            "workspace": {"repository": repository, "base_ref": base_ref},
            "verification": {"commands": list(verify), "protected_paths": protected_paths or []},
            "permission": permission,
            "metadata": _typed(metadata, type),
        }
        job = await self.call(self.bridge.compete, spec, workers, attempts=attempts, judge=judge)
        if wait:
            return await self._wait_job(job.job_id, ctx)
        return job_answer(job)

    async def worker_review(
        self,
        objective: Annotated[
            str, Field(description="What the implementer should do, self-contained.")
        ],
        repository: Annotated[
            str, Field(description="Absolute path to the git repository on this machine.")
        ],
        worker: Annotated[str, Field(description="The worker that implements the change.")],
        reviewer: Annotated[
            str,
            Field(
                description="The worker that reviews it read-only; preferably another vendor's "
                "CLI than the implementer (the same one only when you name it)."
            ),
        ],
        verify: Annotated[
            list[str],
            Field(description="Checks worker-bridge runs itself after every implementer turn."),
        ],
        rounds: Annotated[int, Field(ge=1, le=10, description="Most reviews (default 3).")] = 3,
        base_ref: Annotated[str, Field(description="Commit-ish to start from.")] = "HEAD",
        wait: Annotated[
            bool,
            Field(
                description="false (default): return at once; poll worker_job_status. true: "
                "return when the job has ended (several worker turns: often minutes), or after "
                "50 s with `next` saying how to go on."
            ),
        ] = False,
        type: Annotated[
            str | None,
            Field(
                description="Kind of change (metadata.type): chore, feature, hotfix, refactor "
                "or one the server's config adds; its profile fills what you leave unset in "
                "every task of the job."
            ),
        ] = None,
        metadata: Annotated[
            dict[str, Any] | None,
            Field(
                description="Task metadata; metadata.reviewer is the reviewer's (an object, or "
                "a list with one per round)."
            ),
        ] = None,
        ctx: Context | None = None,
    ) -> JobAnswer:
        """Have one worker implement a change and another review it, when you want a second
        opinion before accepting. The reviewer sees the implementer's verified snapshot
        read-only and answers approve or changes_requested with findings; requested changes
        go back to the implementer as a follow-up in its own session, verified again, then
        reviewed again. Stops on approve, on a round with no new findings, or after `rounds`.
        Returns the job; once ended, `rounds` (verdict, findings with path, line, severity,
        text) and `stopped`. Accept the change with worker_job_accept."""
        spec = {
            "objective": objective,
            "worker": worker,
            "workspace": {"repository": repository, "base_ref": base_ref},
            "verification": {"commands": list(verify)},
            "metadata": _typed(metadata, type),
        }
        job = await self.call(self.bridge.review, spec, worker, reviewer, rounds=rounds)
        if wait:
            return await self._wait_job(job.job_id, ctx)
        return job_answer(job)

    async def worker_job_status(
        self, job_id: Annotated[str, Field(description="The job to show.")]
    ) -> JobAnswer:
        """Show a job: status (created, running, then succeeded, unresolved, failed, cancelled
        or accepted), its tasks with their roles (candidate, judge) and statuses, and once
        ranked the candidates best first, each with `eligible`, `reasons` and the figures
        (changed_lines, files, duration_s, tokens, checks), the `winner` and the orderings.
        Cheap: poll it."""
        return job_answer(await self.call(self.bridge.job_status, job_id))

    async def worker_job_accept(
        self,
        job_id: Annotated[str, Field(description="An ended compete job.")],
        task_id: Annotated[
            str | None,
            Field(
                description="The candidate to accept instead of the winner; required when the "
                "job is 'unresolved'. Must be an eligible candidate of the job."
            ),
        ] = None,
    ) -> AcceptAnswer:
        """Write the job's winning candidate (or the eligible one you name) into the
        repository's working tree as uncommitted changes, through the same accept as
        worker_accept (checks run again if HEAD moved); the other candidates become
        'rejected'. Returns {accepted: true, applied, ...}; an error when the job has no
        eligible candidate, is unresolved without task_id, task_id is not its candidate, or
        the candidate's accept is refused (its reason and kind)."""
        return accept_answer(
            refused_accept(await self.call(self.bridge.accept_job, job_id, task_id))
        )

    async def worker_job_cancel(
        self, job_id: Annotated[str, Field(description="The job to cancel.")]
    ) -> JobAnswer:
        """Cancel a job and every task of it (their containers are killed). A job that already
        ended is left as it is. Returns the job with its tasks' final statuses."""
        return job_answer(await self.call(self.bridge.cancel_job, job_id))
