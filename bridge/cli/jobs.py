"""The CLI's `jobs` commands and `tasks retry`: each one WorkerBridge call, printed for a person
(a table of the ranked candidates with their reasons) or as the job result (--json). With
--wait, a line on standard error whenever a task of the job changes status or phase."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from typing_extensions import TypeIs

from bridge.cli.commands import _spec_from_args
from bridge.cli.render import one_line, out_json
from bridge.documents import IntegrationStep, ReviewRound
from bridge.errors import InvalidSpec
from bridge.records import JobResult
from bridge.service import WorkerBridge

JOB_ENDED = {"succeeded", "unresolved", "failed", "cancelled", "accepted"}
POLL_S = 0.5
WIDTH = 160  # characters of one progress line


def _workers(args: argparse.Namespace) -> list[str]:
    names = [w.strip() for w in (args.workers or "").split(",") if w.strip()]
    if not names and args.worker:
        names = [args.worker]
    if not names:
        raise InvalidSpec("--workers is required (e.g. --workers codex,claude-code).")
    return names


def print_job(job: JobResult) -> None:
    """The job for a person: status, each candidate best first with its figures and reasons."""
    print(f"job {job.job_id} ({job.kind}): {job.status}")
    print(f"  objective: {one_line(job.objective)[:100]}")
    if job.error:
        print(f"  {one_line(job.error.message)}")
    for skip in job.skipped:
        print(f"  skipped {skip['role']} {skip['worker']}: {one_line(skip['reason'])}")
    for c in job.candidates:
        place = f"#{c['rank']}" if c["eligible"] else "--"
        win = "  <- winner" if c["task_id"] == job.winner else ""
        checks = " ".join(("ok" if k["passed"] else "FAIL") for k in c.get("checks", []))
        print(
            f"  {place:<3} {c['label']:<4} {c['task_id']}  {c['worker']:<12} {c['status']:<10}"
            f" +{c['lines_added']}/-{c['lines_removed']} in {c['files']} file(s)"
            f"  {c['duration_s']:.1f}s  {c['tokens']} tokens  checks: {checks or 'none'}{win}"
        )
        for reason in c["reasons"]:
            print(f"        {one_line(reason)}")
    if not job.candidates:
        for t in job.tasks:
            print(f"  {t.label or '':<8} {t.task_id}  {t.worker:<12} {t.status}")
    for r in job.rounds:
        if _is_step(r):
            _print_step(r)
        else:
            _print_round(r)
    if job.stopped:
        print(f"  stopped: {job.stopped}")
    judge = job.summary.get("judge")
    if judge:
        print(f"  judge: {one_line(judge)}")


def _is_step(entry: ReviewRound | IntegrationStep) -> TypeIs[IntegrationStep]:
    """An integrate job's rounds are its steps; a review's, its rounds."""
    return "step" in entry


def _print_step(step: IntegrationStep) -> None:
    print(f"  step {step['step']}: task {step['task_id']}: {step.get('status') or 'not run'}")
    if step.get("problem"):
        print(f"        {one_line(step['problem'])}")


def _print_round(r: ReviewRound) -> None:
    print(
        f"  round {r['round']}: turn {r['implementer_turn']}, verification "
        f"{'passed' if r['verification_ok'] else 'failed'}, review {r['verdict']} "
        f"({len(r['findings'])} finding(s), {r['new_findings']} new)"
    )
    for f in r["findings"]:
        where = f"{f['path'] or '-'}:{f['line'] or '-'}"
        print(f"        {where} [{f['severity']}] {one_line(f['text'])}")
    if r.get("problem"):
        print(f"        {one_line(r['problem'])}")


def _wait(bridge: WorkerBridge, job_id: str, quiet: bool) -> JobResult:
    """Poll the job until it ends, printing on stderr each change of its tasks' status or phase
    and their progress (as `tasks run` shows one task's), each line under the task's label;
    Ctrl-C cancels the job rather than leaving it running unseen."""
    seen: dict[str, tuple] = {}
    cursors: dict[str, int] = {}
    try:
        while True:
            job = bridge.job_status(job_id)
            for t in job.tasks:
                if not quiet:
                    _progress(bridge, t, seen, cursors)
            if job.status in JOB_ENDED:
                return job
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        return bridge.cancel_job(job_id)


def _progress(
    bridge: WorkerBridge, t: Any, seen: dict[str, tuple], cursors: dict[str, int]
) -> None:
    """One task's new lines: its status or phase when changed, then its new events."""
    from bridge.cli.live import WHOLE, describe

    state = (t.status, t.phase)
    if seen.get(t.task_id) != state:
        phase = f" ({t.phase})" if t.phase else ""
        print(f"{t.role} {t.label} {t.task_id} [{t.worker}]: {t.status}{phase}", file=sys.stderr)
        seen[t.task_id] = state
    page = bridge.task_logs(t.task_id, after=cursors.get(t.task_id, 0), limit=200)
    cursors[t.task_id] = page.next_after
    for event in page.events:
        line = describe(event)
        if line:
            shown = one_line(line.strip())
            shown = shown if event.kind in WHOLE else shown[:WIDTH]
            print(f"  {t.label}: {shown}", file=sys.stderr)


def _show(job: JobResult, args: argparse.Namespace) -> None:
    if args.json:
        out_json(job.document())
    else:
        print_job(job)


def cmd_jobs_compete(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    job = bridge.compete(
        _spec_from_args(args), _workers(args), attempts=args.attempts, judge=args.judge
    )
    return _started(bridge, job, args)


def cmd_jobs_review(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    if not args.worker:
        raise InvalidSpec("--worker is required: the worker that implements the change.")
    spec = _spec_from_args(args)
    job = bridge.review(spec, args.worker, args.reviewer, rounds=args.rounds)
    return _started(bridge, job, args)


def cmd_jobs_fanout(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    objectives = list(args.objective or [])
    args.objective = objectives[0] if objectives else None
    job = bridge.fanout(_spec_from_args(args), objectives)
    return _started(bridge, job, args)


def cmd_jobs_integrate(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    job = bridge.integrate(args.job_id, tasks)
    return _started(bridge, job, args)


def _started(bridge: WorkerBridge, job: JobResult, args: argparse.Namespace) -> int:
    """A new job: its id (--json: the job), or with --wait the job run to its end."""
    if not args.wait:
        if args.json:
            out_json(job.document())
        else:
            print(job.job_id)
        return 0
    ended = _wait(bridge, job.job_id, quiet=args.json)
    _show(ended, args)
    if ended.status != "succeeded":
        said = ended.error.message if ended.error else None
        why = said or ended.summary.get("judge") or ""
        print(
            f"worker-bridge: job {job.job_id} {ended.status}: {why}".rstrip(),
            file=sys.stderr,
        )
        return 1
    return 0


def cmd_jobs_show(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    _show(bridge.job_status(args.job_id), args)
    return 0


def cmd_jobs_list(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    jobs = [j.document() for j in bridge.list_jobs(limit=args.limit)]
    if args.json:
        out_json({"jobs": jobs})
        return 0
    for j in jobs:
        print(
            f"{j['job_id']}  {j['kind']:<9} {j['status']:<10} {len(j['tasks'])} task(s)  "
            f"{j['created_at']}  {one_line(j['objective'])[:50]}"
        )
    return 0


def cmd_jobs_cancel(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    job = bridge.cancel_job(args.job_id).document()
    if args.json:
        out_json(job)
    if job["status"] != "cancelled":
        print(f"worker-bridge: job {args.job_id} already ended {job['status']}.", file=sys.stderr)
        return 1
    if not args.json:
        print(f"job {args.job_id}: cancelled, with its {len(job['tasks'])} task(s)")
    return 0


def cmd_jobs_accept(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    outcome = bridge.accept_job(args.job_id, args.task).document()
    if args.json:
        out_json(outcome)
    if not outcome["accepted"]:
        print(f"worker-bridge: {outcome['reason']}", file=sys.stderr)
        return 1
    if not args.json:
        print(
            f"job {args.job_id}: accepted task {outcome['task_id']}; "
            f"{len(outcome['applied'])} file(s) written as uncommitted changes"
        )
    return 0


def cmd_tasks_retry(bridge: WorkerBridge, args: argparse.Namespace) -> int:
    retried = bridge.retry_task(args.task_id)
    started = bridge.start_detached(retried.task_id)
    if args.json:
        out_json(started.document())
    else:
        print(started.task_id)
    return 0
