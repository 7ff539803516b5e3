"""The whole task of a large change, on a given disk, beside git's own floor for the same steps.

One task through `WorkerBridge` (in process): create, the mock worker writes N small files
with one script, collect, verification with one trivial command (`true`), accept. Its phases
come from the task's own `timings` (prepare, worker, collect, verify) and accept is timed
around `accept_task`.

The floor is the same work done by hand with git and `docker run`, on the same disk, with the
task's container settings (`--cpus 1 --memory 2g`, the sandbox uid on a worktree handed to it,
as a root bridge does):

- create: `git worktree add --detach` of the base, `chown -R` to the sandbox uid;
- worker: `docker run` of the mock image on that worktree, the same script;
- collect: `git add -A`, `write-tree`, `commit-tree`, `diff --raw -M`, `diff --binary` to a file;
- verify: `git worktree add --detach` of the snapshot, `chown -R`, `docker run` of the verify
  image running `true`; the checkout then removed in the background;
- accept: `git apply --binary` of the diff in the user's clean working tree; the task's
  worktree then removed in the background.

Each phase is charged with its own writes reaching the disk: a `sync` ends every phase on both
sides (for the bridge, from a `PipelineHooks` at each phase's start, added to the phase before
it). Without it, the page cache hands one phase's writeback to whichever phase runs 5-30 s
later, and on the root disk here the same `git apply` of 30,000 files took 1 s or 22 s.

Both sides remove a checkout nobody needs in the background, as the bridge does (renamed out
of the way, then `rm -rf` at idle I/O priority for the floor; the bridge's remover for the
bridge), so what runs next meets the same disk. `cleanup` is the wait for those removals to
finish. Floor and bridge alternate (the order swapped every other pair), and each sample
starts after `sync` and a pause to let the disk settle: on a disk that discards freed blocks
(this machine's root disk) creating files soon after removing many is twice as slow.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bench.common import git as _git
from bench.common import median
from bridge.phase.handle import PipelineHooks

# The floor's git works in worktrees the sandbox uid owns, as the bridge's own git does.
GIT = ("git", "-c", "safe.directory=*")


def git(repo: Path, *args: str) -> str:
    return _git(repo, "-c", "safe.directory=*", *args)


WORKER_SCRIPT = (
    'python3 -c "import os\n'
    "n = {count}\n"
    "for d in range((n + 999) // 1000):\n"
    "    os.makedirs(f'many/{{d:03d}}')\n"
    "    for f in range(min(1000, n - d * 1000)):\n"
    "        open(f'many/{{d:03d}}/{{f}}.txt', 'w').write(f'file {{d}}/{{f}}\\\\n')\""
)
PHASES = ("create", "worker", "collect", "verify", "accept")
TIMING_OF = {"create": "prepare_s", "worker": "worker_s", "collect": "collect_s"}


def worker_script(count: int) -> str:
    return WORKER_SCRIPT.format(count=count)


def make_small_repo(path: Path, files: int = 1000) -> Path:
    """The user's repository: ``files`` files of about 1 KB in one commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    body = "x" * 1000 + "\n"
    for i in range(files):
        sub = path / f"pkg{i // 100:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"mod{i:05d}.py").write_text(f"# {i}\n{body}")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "generated")
    return path


def _settle(wait: float = 0.0) -> None:
    """Let the disk catch up with what was written and removed: `sync`, then ``wait`` seconds
    (on a disk that discards freed blocks, creating files soon after removing many was twice
    as slow as a minute later)."""
    os.sync()
    time.sleep(wait)


SANDBOX = (10001, 10001)  # the sandbox uid of a root bridge (config `sandbox_uid`)


def _docker(image: str, folder: Path, script: str) -> None:
    """A container as the task's are: no network, one CPU, 2 GB (the limits' defaults), the
    sandbox uid when run as root."""
    user = ["--user", f"{SANDBOX[0]}:{SANDBOX[1]}"] if os.geteuid() == 0 else []
    subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            "none",
            "--cpus",
            "1",
            "--memory",
            "2g",
            "--memory-swap",
            "2g",
            *user,
            "--label",
            "io.worker-bridge.bench=1",
            "-v",
            f"{folder}:/workspace",
            "-w",
            "/workspace",
            image,
            "sh",
            "-c",
            script,
        ],
        check=True,
        capture_output=True,
    )


def _hand_over(folder: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "-h", f"{SANDBOX[0]}:{SANDBOX[1]}", str(folder)], check=True)


def _remove_later(repo: Path, folder: Path, trash: Path, removers: list) -> None:
    """What `git worktree remove` does, in the background: the folder renamed out of the way
    at once, git told, and `rm -rf` at idle I/O priority."""
    trash.mkdir(exist_ok=True)
    moved = trash / folder.name
    folder.rename(moved)
    git(repo, "worktree", "prune")
    removers.append(subprocess.Popen(["ionice", "-c3", "nice", "-n10", "rm", "-rf", str(moved)]))


def _clean_user_tree(repo: Path) -> None:
    """Back to the clean base: the accepted (untracked) files removed, task branches deleted."""
    git(repo, "clean", "-fdq")
    for branch in git(repo, "branch", "--format=%(refname:short)").split():
        if branch != "main":
            git(repo, "branch", "-q", "-D", branch)
    git(repo, "worktree", "prune")


def run_floor(
    repo: Path, scratch: Path, count: int, images: dict[str, str], settle: float = 0.0
) -> dict[str, float]:
    """One task by hand; seconds per phase, plus `cleanup` (the background removals' end)."""
    name = os.urandom(4).hex()
    work, check = scratch / f"floor-work-{name}", scratch / f"floor-check-{name}"
    base = git(repo, "rev-parse", "HEAD").strip()
    diff = scratch / f"floor-{name}.diff"
    times: dict[str, float] = {}
    removers: list[subprocess.Popen] = []

    def step(phase: str, fn) -> None:  # noqa: ANN001
        t0 = time.perf_counter()
        fn()
        os.sync()
        times[phase] = time.perf_counter() - t0

    def create() -> None:
        git(repo, "worktree", "add", "-q", "--detach", str(work), base)
        _hand_over(work)

    step("create", create)
    step("worker", lambda: _docker(images["mock"], work, worker_script(count)))
    snapshot: list[str] = []

    def collect() -> None:
        git(work, "add", "-A")
        tree = git(work, "write-tree").strip()
        snapshot.append(git(work, "commit-tree", tree, "-p", base, "-m", "floor").strip())
        git(work, "diff", "--raw", "-z", "-M", base, snapshot[0])
        with open(diff, "wb") as out:
            subprocess.run(
                [
                    *GIT,
                    "-C",
                    str(work),
                    "diff",
                    "--binary",
                    "--full-index",
                    "-M",
                    base,
                    snapshot[0],
                ],
                check=True,
                stdout=out,
            )

    step("collect", collect)

    def verify() -> None:
        git(repo, "worktree", "add", "-q", "--detach", str(check), snapshot[0])
        _hand_over(check)
        _docker(images["verify"], check, "true")
        _remove_later(repo, check, scratch / "trash", removers)

    step("verify", verify)

    def accept() -> None:
        git(repo, "apply", "--binary", str(diff))
        _remove_later(repo, work, scratch / "trash", removers)

    step("accept", accept)
    times["total"] = sum(times[p] for p in PHASES)
    step("cleanup", lambda: [r.wait() for r in removers])
    diff.unlink()
    _clean_user_tree(repo)
    _settle(settle)
    return times


def task_spec(repo: Path, count: int) -> dict:
    """The bench's task: the mock worker writes ``count`` files, one trivial check."""
    return {
        "objective": f"write {count} files",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["true"]},
        "limits": {"timeout_seconds": 1800},
        "metadata": {"mock": {"script": worker_script(count)}},
    }


def run_bridge(bridge, repo: Path, count: int, settle: float = 0.0) -> dict[str, float]:  # noqa: ANN001
    """One task through the library; seconds per phase (the task's own timings; accept timed
    around `accept_task`), plus `cleanup` (the wait for the background remover)."""
    spec = task_spec(repo, count)
    hooks: SyncAtPhases = bridge.hooks
    hooks.synced.clear()
    t0 = time.perf_counter()
    task = bridge.create_task(spec)
    result = bridge.run_task(task.task_id).document()
    hooks.synced["verify"] = _timed_sync()
    ran = time.perf_counter() - t0
    if result["status"] != "succeeded":
        raise RuntimeError(f"bench task {task.task_id} failed: {result['error']}")
    if len(result["changed_files"]) != count:
        raise RuntimeError(f"collected {len(result['changed_files'])} changes of {count}")
    t1 = time.perf_counter()
    accepted = bridge.accept_task(task.task_id)
    os.sync()
    accept = time.perf_counter() - t1
    if not accepted.accepted:
        raise RuntimeError(f"bench accept of {task.task_id} refused: {accepted.reason}")
    timings = result["timings"]
    times = {phase: timings.get(key, 0.0) for phase, key in TIMING_OF.items()}
    times["verify"] = timings.get("verify_s", 0.0)
    for phase, seconds in hooks.synced.items():
        times[phase] += seconds
    times["accept"] = accept
    times["total"] = ran + accept
    times["other"] = times["total"] - sum(times[p] for p in PHASES)
    t2 = time.perf_counter()
    _drain(bridge.config.home)
    _settle()
    times["cleanup"] = time.perf_counter() - t2
    _clean_user_tree(repo)
    _settle(settle)
    return times


def _timed_sync() -> float:
    t0 = time.perf_counter()
    os.sync()
    return time.perf_counter() - t0


class SyncAtPhases(PipelineHooks):
    """Ends each phase of the bridge's task with a `sync`, charged to that phase."""

    ENDS = {"worker": "create", "collecting": "worker", "verifying": "collect"}

    def __init__(self) -> None:
        self.synced: dict[str, float] = {}

    def phase_entered(self, handle, phase: str) -> None:  # noqa: ANN001
        if phase in self.ENDS:
            self.synced[self.ENDS[phase]] = _timed_sync()


def _drain(home: Path) -> None:
    """Wait until the bridge's background remover has emptied its trash (when it has one)."""
    try:
        from bridge.workspace.trash import reap
    except ImportError:  # a bridge without one (measuring an older version)
        return
    failed = reap(home)
    if failed:
        raise RuntimeError(f"the trash could not be emptied: {failed[:3]}")


def bench_large_task(
    disks: dict[str, tuple[Path, float]],
    sizes: list[int],
    pairs: dict[int, int],
    images: dict[str, str],
) -> dict:
    """For each disk (its folder and the seconds to let it settle after each sample) and size:
    ``pairs[size]`` floor/bridge pairs, the order swapped every other pair; medians per phase
    and the ratio bridge/floor per phase (of the medians)."""
    from bridge import WorkerBridge

    rows = []
    for disk, (folder, settle) in disks.items():
        root = Path(folder) / f"wb-large-task-{os.urandom(3).hex()}"
        root.mkdir(parents=True)
        try:
            repos = (make_small_repo(root / "repo-floor"), make_small_repo(root / "repo-bridge"))
            scratch = root / "scratch"
            scratch.mkdir()
            bridge = WorkerBridge(home=root / "home", hooks=SyncAtPhases())
            try:
                run_bridge(bridge, repos[1], 100)  # the base's object packs, made once
                for count in sizes:
                    rows.append(
                        _measure(
                            disk,
                            count,
                            pairs.get(count, 1),
                            bridge,
                            repos,
                            scratch,
                            images,
                            settle,
                        )
                    )
                    same = accept_same_state(bridge, repos[1], count, pairs.get(count, 1), settle)
                    rows[-1]["accept_same_state"] = same
            finally:
                _drain(root / "home")
                bridge.close()
        finally:
            subprocess.run(["rm", "-rf", str(root)], check=False)
            _settle()
    largest = max(sizes)
    # Accept is judged beside `git apply` in the same disk state (see accept_same_state).
    worst = max(
        max(row["ratio"]["collect"], row["ratio"]["verify"], row["accept_same_state"]["ratio"])
        for row in rows
        if row["files"] == largest
    )
    return {"rows": rows, "largest": largest, "phase_ratio_largest": worst}


def print_large_task(results: dict) -> None:
    """The table: per disk and size, each phase bridge / git's floor, and the cost per file."""
    print("\nlarge task (bridge s / git floor s, ratio):")
    header = "".join(f"{p:>20}" for p in (*PHASES, "total"))
    print(f"{'disk':<10}{'files':>8}{header}{'us/file':>16}{'cleanup':>16}")
    for row in results["rows"]:
        cells = "".join(
            f"{row['bridge_s'][p]:>7.2f}/{row['floor_s'][p]:<6.2f}{row['ratio'][p]:>5.2f}x"
            for p in (*PHASES, "total")
        )
        per_file = f"{row['bridge_us_per_file']:.0f}/{row['floor_us_per_file']:.0f}"
        cleanup = f"{row['bridge_s']['cleanup']:.1f}/{row['floor_s']['cleanup']:.1f}"
        print(f"{row['disk']:<10}{row['files']:>8}{cells}{per_file:>16}{cleanup:>16}")
    print("accept beside `git apply` of the same diff, each right after its task:")
    for row in results["rows"]:
        same = row["accept_same_state"]
        print(
            f"{row['disk']:<10}{row['files']:>8}  {median(same['accept_s']):.2f}/"
            f"{median(same['git_apply_s']):.2f} {same['ratio']:.2f}x"
        )


def _measure(  # noqa: PLR0913
    disk: str,
    count: int,
    pairs: int,
    bridge,  # noqa: ANN001
    repos: tuple[Path, Path],
    scratch: Path,
    images: dict[str, str],
    settle: float,
) -> dict:
    floors, bridges = [], []
    _settle(settle)
    for n in range(pairs):
        floor = lambda: floors.append(run_floor(repos[0], scratch, count, images, settle))  # noqa: E731
        ours = lambda: bridges.append(run_bridge(bridge, repos[1], count, settle))  # noqa: E731
        for sample in (floor, ours) if n % 2 == 0 else (ours, floor):
            sample()
    keys = (*PHASES, "total", "cleanup")
    floor_s = {k: median([s[k] for s in floors]) for k in keys}
    bridge_s = {k: median([s[k] for s in bridges]) for k in (*keys, "other")}
    row = {
        "disk": disk,
        "files": count,
        "pairs": pairs,
        "settle_s": settle,
        "floor_s": {k: round(v, 3) for k, v in floor_s.items()},
        "bridge_s": {k: round(v, 3) for k, v in bridge_s.items()},
        "ratio": {k: round(bridge_s[k] / floor_s[k], 2) if floor_s[k] > 0 else None for k in keys},
        "bridge_us_per_file": round(bridge_s["total"] / count * 1e6, 1),
        "floor_us_per_file": round(floor_s["total"] / count * 1e6, 1),
        "samples": {"floor": floors, "bridge": bridges},
    }
    print_row(row)
    return row


def print_row(row: dict) -> None:
    cells = "  ".join(
        f"{k} {row['bridge_s'][k]:.2f}/{row['floor_s'][k]:.2f}={row['ratio'][k]}x"
        for k in (*PHASES, "total")
    )
    print(
        f"  task of {row['files']:>7} files on {row['disk']}: {cells}; cleanup "
        f"{row['bridge_s']['cleanup']:.2f}/{row['floor_s']['cleanup']:.2f}; "
        f"bridge outside phases {row['bridge_s']['other']:.2f}; "
        f"{row['bridge_us_per_file']:.0f} us/file (git {row['floor_us_per_file']:.0f})",
        flush=True,
    )


def accept_same_state(bridge, repo: Path, count: int, pairs: int, settle: float = 0.0) -> dict:  # noqa: ANN001
    """Accept against `git apply` of the same task's own diff, each right after a task of
    ``count`` files, so both meet the disk in the same state (the whole-task rows' floor applies
    its diff at a different moment: on the root disk, right after a large task, the same
    `git apply` took 7.3 s where it took 1.6 s after the disk sat idle). Alternated, ``settle``
    seconds after each sample's removals (as the whole-task rows); the ratio of the medians."""
    floors, ours = [], []
    for n in range(pairs):
        for side in ("git", "bridge") if n % 2 == 0 else ("bridge", "git"):
            task = bridge.create_task(task_spec(repo, count))
            result = bridge.run_task(task.task_id).document()
            if result["status"] != "succeeded":
                raise RuntimeError(f"bench task {task.task_id} failed: {result['error']}")
            os.sync()
            t0 = time.perf_counter()
            if side == "git":
                git(repo, "apply", "--binary", result["artifacts"]["diff"])
            elif not bridge.accept_task(task.task_id).accepted:
                raise RuntimeError(f"bench accept of {task.task_id} refused")
            os.sync()
            (floors if side == "git" else ours).append(time.perf_counter() - t0)
            if side == "git":  # the task's worktree and branch go as an accepted task's do
                bridge.reject_task(task.task_id, "applied by git for the benchmark")
                bridge.prune_workspaces(apply=True)
            _drain(bridge.config.home)
            _clean_user_tree(repo)
            _settle(settle)
    row = {"files": count, "pairs": pairs, "git_apply_s": floors, "accept_s": ours}
    row["ratio"] = round(median(ours) / median(floors), 2)
    print(
        f"  accept of {count:>7} files right after its task: {median(ours):.2f} s, "
        f"git apply of the same diff {median(floors):.2f} s = {row['ratio']}x"
    )
    return row
