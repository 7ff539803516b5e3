"""End-to-end tests of the task pipeline: a mock worker in its sandbox, the host-side snapshot,
diff and manifest, verification in a fresh container, results, events and redaction.

Most tests drive the `worker-bridge` CLI as a subprocess; a few use the library facade."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
from pathlib import Path

from support.cli import CliResult
from support.engine import task_containers
from support.repos import commit_all, git
from support.tasks import mock_task, show_task, task_flags

CALC_ORIGINAL = "def add(a, b):\n    return a + b\n"
CALC_WITH_SUB = CALC_ORIGINAL + "\n\ndef sub(a, b):\n    return a - b\n"
TEST_SUB = "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"


# -- helpers --------------------------------------------------------------------------------


def run_task(
    cli,
    repo: Path,
    mock: dict | None = None,
    *,
    verify: tuple[str, ...] = (),
    protect: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[CliResult, dict]:
    """`worker-bridge tasks run ... --json`; returns the CLI result and the parsed task result."""
    argv = ["tasks", "run", "--repo", str(repo), "--objective", "pipeline test"]
    argv += ["--worker", "mock", "--json"]
    for command in verify:
        argv += ["--verify", command]
    for pattern in protect:
        argv += ["--protect", pattern]
    if mock is not None:
        argv += ["--metadata-json", json.dumps({"mock": mock})]
    argv += list(extra)
    res = cli(*argv, env=env)
    assert res.stdout.strip(), f"no JSON on stdout (exit {res.code}): {res.stderr}"
    return res, res.json()


def logs(cli, task_id: str, after: int | None = None) -> dict:
    argv = ["tasks", "logs", task_id, "--json"]
    if after is not None:
        argv += ["--after", str(after)]
    res = cli(*argv)
    assert res.code == 0, res.stderr
    return res.json()


def by_path(changed_files: list[dict]) -> dict[str, dict]:
    return {entry["path"]: entry for entry in changed_files}


def rev(repo: Path, ref: str) -> str:
    return git(repo, "rev-parse", "--verify", ref).strip()


def assert_diff_reproduces_snapshot(repo: Path, result: dict, scratch: Path) -> None:
    """The diff artifact applies to a clean clone of the base and yields the snapshot's tree."""
    clone = scratch / "clone"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(repo), str(clone)], check=True)
    git(clone, "checkout", "-q", "--detach", result["base_commit"])
    diff = result["artifacts"]["diff"]
    checked = subprocess.run(
        ["git", "-C", str(clone), "apply", "--check", diff], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
    git(clone, "apply", "--index", diff)
    assert git(clone, "write-tree").strip() == rev(repo, f"{result['branch']}^{{tree}}")


def events_text(cli, task_id: str) -> str:
    return json.dumps(logs(cli, task_id), ensure_ascii=False)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hooks_state(repo: Path) -> dict[str, str]:
    hooks = repo / ".git" / "hooks"
    return {
        str(p.relative_to(hooks)): file_digest(p) for p in sorted(hooks.rglob("*")) if p.is_file()
    }


# -- the happy path -------------------------------------------------------------------------


def test_a_task_that_edits_and_adds_files_succeeds_with_verified_snapshot_on_its_own_branch(
    docker_images, cli, repo: Path, workdir: Path
) -> None:
    base = rev(repo, "HEAD")
    res, result = run_task(
        cli,
        repo,
        {"write": {"calc.py": CALC_WITH_SUB, "tests/test_sub.py": TEST_SUB}},
        verify=("python3 -m pytest -q",),
    )
    assert res.code == 0, res.stderr
    task_id = result["task_id"]
    assert result["status"] == "succeeded"
    assert result["error"] is None
    assert result["base_commit"] == base
    assert result["branch"] == f"worker-bridge/{task_id}"

    verification = result["verification"]
    assert verification["ok"] is True
    [record] = verification["commands"]
    assert record["command"] == "python3 -m pytest -q"
    assert record["exit_code"] == 0
    assert isinstance(record["duration_s"], int | float) and record["duration_s"] >= 0
    assert "2 passed" in record["stdout_tail"]  # the new test ran beside the old one
    assert isinstance(record["stderr_tail"], str)

    assert sorted(result["changed_files"], key=lambda e: e["path"]) == [
        {"path": "calc.py", "change": "modified"},
        {"path": "tests/test_sub.py", "change": "added"},
    ]

    # The task branch holds one commit on top of the base with the worker's files.
    branch = result["branch"]
    snapshot = rev(repo, f"refs/heads/{branch}")
    assert git(repo, "rev-list", "--parents", "-n", "1", snapshot).split() == [snapshot, base]
    assert git(repo, "show", f"{branch}:calc.py") == CALC_WITH_SUB
    assert git(repo, "show", f"{branch}:tests/test_sub.py") == TEST_SUB

    manifest = json.loads(Path(result["artifacts"]["manifest"]).read_text(encoding="utf-8"))
    assert manifest["base_commit"] == base
    assert manifest["snapshot_commit"] == snapshot
    files = by_path(manifest["files"])
    assert set(files) == {"calc.py", "tests/test_sub.py"}
    assert files["calc.py"]["change"] == "modified"
    assert files["tests/test_sub.py"]["change"] == "added"
    assert files["tests/test_sub.py"]["size"] == len(TEST_SUB.encode())
    assert files["calc.py"]["mode"] == "100644"
    assert files["calc.py"]["symlink"] is False

    assert_diff_reproduces_snapshot(repo, result, workdir)

    # The user's checkout is untouched.
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert rev(repo, "refs/heads/main") == base
    assert (repo / "calc.py").read_text() == CALC_ORIGINAL
    assert not (repo / "tests" / "test_sub.py").exists()

    # No container of this task is left behind (worker or verify).
    assert task_containers(task_id) == []


# -- git isolation --------------------------------------------------------------------------


def test_a_commit_made_inside_the_sandbox_is_reported_but_never_reaches_the_users_refs(
    docker_images, cli, repo: Path
) -> None:
    base = rev(repo, "HEAD")
    script = (
        "git add -A && git -c user.name=x -c user.email=y@example.com commit -qm m "
        '&& echo "worker-commit $(git rev-parse HEAD)"'
    )
    res, result = run_task(cli, repo, {"write": {"feature.txt": "from worker\n"}, "script": script})
    assert res.code == 0, res.stderr
    task_id = result["task_id"]
    assert result["status"] == "succeeded"
    assert result["changed_files"] == [{"path": "feature.txt", "change": "added"}]
    diff = Path(result["artifacts"]["diff"]).read_text()
    assert "feature.txt" in diff and "+from worker" in diff

    lines = [
        e["data"].get("text", "")
        for e in logs(cli, task_id)["events"]
        if e["kind"] == "worker.progress"
    ]
    worker_commits = [line.split()[1] for line in lines if line.startswith("worker-commit ")]
    assert len(worker_commits) == 1, lines
    worker_commit = worker_commits[0]
    assert len(worker_commit) == 40 and worker_commit != base

    # The user's refs are where they were; the snapshot hangs directly off the base commit.
    assert git(repo, "symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert rev(repo, "refs/heads/main") == base
    assert rev(repo, "HEAD") == base
    snapshot = rev(repo, f"refs/heads/{result['branch']}")
    assert snapshot != worker_commit
    assert git(repo, "rev-list", "--parents", "-n", "1", snapshot).split() == [snapshot, base]
    # The worker's commit object (authored by "x") lives only in the sandbox's private git dir.
    probe = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "-e", worker_commit], capture_output=True
    )
    assert probe.returncode != 0


def test_a_worker_cannot_modify_the_users_git_directory_or_object_store(
    docker_images, cli, repo: Path
) -> None:
    dot_git = repo / ".git"
    (dot_git / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    watched = ["config", "HEAD", "refs/heads/main"]
    before = {name: file_digest(dot_git / name) for name in watched}
    hooks_before = hooks_state(repo)
    base = rev(repo, "HEAD")

    def attempt(label: str, command: str) -> str:
        return (
            f"if ( {command} ) 2>/dev/null; then echo '{label} done' >> attempts.txt; "
            f"else echo '{label} refused' >> attempts.txt; fi || true\n"
        )

    script = (
        'alt=$(cat "$(git rev-parse --git-dir)/objects/info/alternates")\n'
        'echo "$alt" > alternates.txt\n'
        + attempt("hookspath", "git config core.hooksPath /tmp/evil")
        + attempt("gitfile-write", "echo x > .git")
        + attempt("gitfile-remove", "rm -rf .git")
        + attempt("objects-write", 'echo evil > "$alt/evil-object"')
        + attempt("objects-mkdir", 'mkdir "$alt/ee" && echo evil > "$alt/ee/evil"')
        + attempt("ref-update", "git update-ref refs/heads/main HEAD")
        + "true\n"
    )
    res, result = run_task(cli, repo, {"script": script})
    assert res.code == 0, res.stderr
    assert result["status"] == "succeeded"

    branch = result["branch"]
    assert git(repo, "show", f"{branch}:alternates.txt").strip(), "the alternates path was empty"
    attempts = git(repo, "show", f"{branch}:attempts.txt").splitlines()
    outcomes = dict(line.rsplit(" ", 1) for line in attempts)
    # What touches the sandbox's mounts of the user's repository is refused...
    assert outcomes["gitfile-write"] == "refused"
    assert outcomes["gitfile-remove"] == "refused"
    assert outcomes["objects-write"] == "refused"
    assert outcomes["objects-mkdir"] == "refused"
    # ...and whatever the private git dir accepted changed nothing on the host.
    assert {name: file_digest(dot_git / name) for name in watched} == before
    assert hooks_state(repo) == hooks_before
    assert rev(repo, "refs/heads/main") == base
    assert git(repo, "config", "--get", "core.hooksPath", check=False) == ""
    assert not (dot_git / "objects" / "evil-object").exists()
    assert not (dot_git / "objects" / "ee").exists()
    assert git(repo, "status", "--porcelain") == ""


# -- the sandbox ----------------------------------------------------------------------------


def test_the_worker_runs_unprivileged_without_network_on_a_read_only_root_and_a_clean_env(
    docker_images, cli, repo: Path
) -> None:
    marker = "marker-b7e1d2c4"
    script = (
        "mkdir -p probe\n"
        "id -u > probe/uid\n"
        "ls /sys/class/net > probe/net\n"
        "if touch /usr/probe 2>/dev/null; then echo writable; else echo refused; fi"
        " > probe/rootfs\n"
        "env > probe/env\n"
    )
    res, result = run_task(
        cli,
        repo,
        {"script": script},
        env={"WB_CALLER_MARKER": marker, "SOME_OTHER_VAR": marker},
    )
    assert res.code == 0, res.stderr
    assert result["status"] == "succeeded"
    branch = result["branch"]

    def probe(name: str) -> str:
        return git(repo, "show", f"{branch}:probe/{name}")

    uid = probe("uid").strip()
    assert uid.isdigit() and uid != "0"
    if os.geteuid() == 0:
        assert uid == "10001"  # config sandbox_uid default
    else:
        assert uid == str(os.getuid())
    assert probe("net").split() == ["lo"]
    assert probe("rootfs").strip() == "refused"
    env_text = probe("env")
    assert "PATH=" in env_text  # the probe really captured the environment
    assert marker not in env_text
    assert "WB_CALLER_MARKER" not in env_text
    assert "WORKER_BRIDGE_HOME" not in env_text


def test_ignored_files_the_worker_leaves_are_not_reported_nor_present_during_verification(
    docker_images, cli, repo: Path, home: Path
) -> None:
    res, result = run_task(
        cli,
        repo,
        {"write": {"build.log": "noise\n", "notes.txt": "tracked note\n"}},
        verify=("test ! -e build.log", "test -f notes.txt && cat notes.txt"),
    )
    assert res.code == 0, res.stderr
    assert result["status"] == "succeeded"
    # The worker did leave the ignored file in its worktree...
    assert (home / "worktrees" / result["task_id"] / "build.log").read_text() == "noise\n"
    # ...but it is neither a change nor part of what was verified.
    assert result["changed_files"] == [{"path": "notes.txt", "change": "added"}]
    commands = result["verification"]["commands"]
    assert [c["exit_code"] for c in commands] == [0, 0]
    assert "tracked note" in commands[1]["stdout_tail"]
    assert result["verification"]["ok"] is True
    assert "build.log" not in git(repo, "ls-tree", "-r", "--name-only", result["branch"])


# -- outcomes -------------------------------------------------------------------------------


def test_changing_a_protected_path_fails_the_task_naming_the_path(
    docker_images, cli, repo: Path
) -> None:
    res, result = run_task(
        cli,
        repo,
        {"write": {"tests/test_calc.py": "def test_nothing():\n    pass\n"}},
        verify=("true",),
        protect=("tests/**",),
    )
    assert res.code == 1
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "protected_path"
    assert "tests/test_calc.py" in result["error"]["message"]
    kinds = [e["kind"] for e in logs(cli, result["task_id"])["events"]]
    assert "verification.started" not in kinds  # a forbidden change is not verified


def test_a_change_outside_the_protected_patterns_succeeds(docker_images, cli, repo: Path) -> None:
    res, result = run_task(
        cli,
        repo,
        {"write": {"calc.py": CALC_WITH_SUB}},
        verify=("python3 -m pytest -q",),
        protect=("tests/**",),
    )
    assert res.code == 0, res.stderr
    assert result["status"] == "succeeded"
    assert result["changed_files"] == [{"path": "calc.py", "change": "modified"}]


def test_a_failing_verify_command_fails_the_task_and_later_commands_still_run(
    docker_images, cli, repo: Path
) -> None:
    res, result = run_task(cli, repo, {"write": {"a.txt": "a\n"}}, verify=("false", "echo after"))
    assert res.code == 1
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "verification_failed"
    assert "`false`" in result["error"]["message"]
    verification = result["verification"]
    assert verification["ok"] is False
    first, second = verification["commands"]
    assert (first["command"], first["exit_code"]) == ("false", 1)
    assert (second["command"], second["exit_code"]) == ("echo after", 0)
    assert second["stdout_tail"].strip() == "after"


def test_a_task_without_verify_commands_succeeds_unverified(
    docker_images, bridge, repo: Path
) -> None:
    created = bridge.create_task(mock_task(repo, {"write": {"a.txt": "a\n"}}))
    result = bridge.run_task(created.task_id).document()
    assert result["status"] == "succeeded"
    assert result["verification"] is not None
    assert result["verification"]["ok"] is None
    assert result["verification"]["commands"] == []
    assert result["changed_files"] == [{"path": "a.txt", "change": "added"}]
    assert git(repo, "show", f"{result['branch']}:a.txt") == "a\n"


def test_the_summary_is_the_workers_result_line_after_more_output_than_the_engine_keeps(
    docker_images, bridge, repo: Path
) -> None:
    # 27 MB of progress: past max_progress_events, and past the engine's kept log, whose
    # rotation ends the live stream early; the result line still comes through.
    script = "yes 'a moderately long line of progress from the worker' | head -n 400000"
    spec = mock_task(repo, {"script": script, "summary": "the result line"})
    result = bridge.run_task(bridge.create_task(spec).task_id)
    assert result.status == "succeeded", result.error
    assert result.summary == "the result line"


def test_a_read_only_task_cannot_write_and_fails_with_worker_exit(
    docker_images, cli, repo: Path, home: Path
) -> None:
    res, result = run_task(
        cli, repo, {"write": {"new.txt": "x\n"}}, extra=("--permission", "read_only")
    )
    assert res.code == 1
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "worker_exit"
    worktree = home / "worktrees" / result["task_id"]
    assert (worktree / "calc.py").exists()
    assert not (worktree / "new.txt").exists()
    assert result["changed_files"] == []
    lines = [
        e["data"].get("text", "")
        for e in logs(cli, result["task_id"])["events"]
        if e["kind"] == "worker.progress"
    ]
    assert any(line.startswith("could not write new.txt") for line in lines), lines


def test_a_worker_exiting_non_zero_fails_the_task_with_its_status(
    docker_images, cli, repo: Path
) -> None:
    res = cli("tasks", "run", *task_flags(repo, "exit", metadata={"mock": {"exit_code": 3}}))
    assert res.code == 1
    assert "status 3" in res.stderr
    task_id = res.stdout.split()[1].rstrip(":")  # "task <id>: failed"
    result = show_task(cli, task_id)
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "worker_exit"
    assert "status 3" in result["error"]["message"]


def test_a_task_past_its_deadline_times_out_and_leaves_no_container(
    docker_images, cli, repo: Path
) -> None:
    res, result = run_task(cli, repo, {"sleep": 60}, extra=("--timeout", "2"))
    assert res.code == 1
    assert result["status"] == "timed_out"
    assert result["error"]["kind"] == "timeout"
    assert "2 s" in result["error"]["message"]
    assert task_containers(result["task_id"]) == []


# -- redaction ------------------------------------------------------------------------------


def test_secrets_are_redacted_in_what_is_stored_and_shown_but_not_in_what_runs(
    docker_images, cli, repo: Path, home: Path
) -> None:
    token = "s3cr3t-value-1234567"
    password = "hunter2-secret-99"
    bearer = "abcdef1234567890abcdef"
    command = (
        f'API_TOKEN={token} sh -c \'test "$API_TOKEN" = {token} && echo "token is $API_TOKEN"\''
    )
    res, result = run_task(
        cli,
        repo,
        {
            # Built at run time: only the worker's output reveals the whole value, once as a
            # `password=` pair and once bare (masked because the pair taught the redactor).
            "script": 'p=hunter2; echo "password=$p-secret-99"; echo "again $p-secret-99"',
            "summary": f"Authorization: Bearer {bearer}",
        },
        verify=(command,),
    )
    assert res.code == 0, res.stderr
    assert result["status"] == "succeeded"
    # The command ran as written: the token it compared against was intact.
    [record] = result["verification"]["commands"]
    assert record["exit_code"] == 0
    assert "token is [REDACTED]" in record["stdout_tail"]
    assert "[REDACTED]" in record["command"]
    assert "[REDACTED]" in result["summary"]

    task_id = result["task_id"]
    progress = [
        e["data"]["text"] for e in logs(cli, task_id)["events"] if e["kind"] == "worker.progress"
    ]
    assert "password=[REDACTED]" in progress
    assert "again [REDACTED]" in progress
    shown = json.dumps(show_task(cli, task_id), ensure_ascii=False)
    events = events_text(cli, task_id)
    for text in (res.stdout, shown, events):
        assert "[REDACTED]" in text
        for secret in (token, password, bearer):
            assert secret not in text

    # The stored copies (read straight from the store) are redacted as well.
    from bridge import WorkerBridge

    direct = WorkerBridge(home=home)
    try:
        stored = direct.store.load_task(task_id).model_dump(mode="json")
        stored_text = json.dumps(
            [stored["verification"], stored["summary"], stored["error"], stored["objective"]],
            ensure_ascii=False,
        )
        stored_events = json.dumps(
            [e.document() for e in direct.store.events(task_id, after=0, limit=10_000)],
            ensure_ascii=False,
        )
    finally:
        direct.close()
    for text in (stored_text, stored_events):
        for secret in (token, password, bearer):
            assert secret not in text


# -- paths and change kinds -----------------------------------------------------------------


def test_file_names_with_spaces_unicode_and_newlines_are_reported_exactly(
    docker_images, cli, repo: Path, workdir: Path
) -> None:
    names = ["dir with space/file name.txt", "ünïcødé/名前.txt", "new\nline.txt"]
    res, result = run_task(cli, repo, {"write": {name: f"{i}\n" for i, name in enumerate(names)}})
    assert res.code == 0, res.stderr
    assert result["status"] == "succeeded"
    assert sorted(result["changed_files"], key=lambda e: e["path"]) == sorted(
        ({"path": name, "change": "added"} for name in names), key=lambda e: e["path"]
    )
    manifest = json.loads(Path(result["artifacts"]["manifest"]).read_text(encoding="utf-8"))
    assert sorted(f["path"] for f in manifest["files"]) == sorted(names)
    assert_diff_reproduces_snapshot(repo, result, workdir)


def test_modify_delete_rename_chmod_binary_and_symlink_are_each_reported_with_their_kind(
    docker_images, cli, repo: Path, workdir: Path
) -> None:
    (repo / "run.sh").write_text("#!/bin/sh\necho run\n")
    (repo / "data.txt").write_text("a data file that the worker is going to delete\n" * 3)
    commit_all(repo, "more files")
    readme = (repo / "README.md").read_text()
    mock = {
        "write": {"calc.py": CALC_WITH_SUB, "docs/README.md": readme},
        "delete": ["README.md", "data.txt"],
        "script": "chmod +x run.sh && printf '\\000\\001\\002' > bin.dat && ln -s calc.py link.py",
    }
    res, result = run_task(cli, repo, mock)
    assert res.code == 0, res.stderr
    assert result["status"] == "succeeded"

    changed = by_path(result["changed_files"])
    assert changed == {
        "calc.py": {"path": "calc.py", "change": "modified"},
        "data.txt": {"path": "data.txt", "change": "deleted"},
        "docs/README.md": {"path": "docs/README.md", "change": "renamed", "from": "README.md"},
        "run.sh": {"path": "run.sh", "change": "modified"},
        "bin.dat": {
            "path": "bin.dat",
            "change": "added",
            # new, and git shows it as binary: flagged, its text in the readable diff
            "binary": {"flagged": True, "holds_nul": True, "lines_added": 1, "lines_removed": 0},
        },
        "link.py": {"path": "link.py", "change": "added"},
    }

    manifest = by_path(
        json.loads(Path(result["artifacts"]["manifest"]).read_text(encoding="utf-8"))["files"]
    )
    assert (manifest["run.sh"]["old_mode"], manifest["run.sh"]["mode"]) == ("100644", "100755")
    assert manifest["link.py"]["symlink"] is True
    assert manifest["link.py"]["mode"] == "120000"
    assert manifest["bin.dat"]["size"] == 3
    assert manifest["bin.dat"]["symlink"] is False
    assert manifest["docs/README.md"]["from"] == "README.md"
    assert manifest["data.txt"]["mode"] is None

    branch = result["branch"]
    blob = subprocess.run(
        ["git", "-C", str(repo), "show", f"{branch}:bin.dat"], capture_output=True, check=True
    ).stdout
    assert blob == b"\x00\x01\x02"
    assert git(repo, "show", f"{branch}:link.py") == "calc.py"
    assert_diff_reproduces_snapshot(repo, result, workdir)


# -- events ---------------------------------------------------------------------------------


def test_task_events_are_recorded_in_pipeline_order_and_can_be_paged_after_an_id(
    docker_images, cli, repo: Path
) -> None:
    res, result = run_task(cli, repo, {"write": {"a.txt": "a\n"}}, verify=("true",))
    assert res.code == 0, res.stderr
    task_id = result["task_id"]
    page = logs(cli, task_id)
    events = page["events"]
    ids = [e["event_id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert page["next_after"] == ids[-1]
    assert all(e["task_id"] == task_id for e in events)

    expected = [
        ("task.created", None),
        ("task.status", None),
        ("workspace.ready", None),
        ("worker.started", None),
        ("worker.progress", "wrote a.txt"),
        ("worker.completed", None),
        ("verification.started", None),
        ("verification.command", None),
        ("verification.completed", None),
    ]
    remaining = list(expected)
    for event in events:
        if not remaining:
            break
        kind, line = remaining[0]
        if event["kind"] == kind and (line is None or event["data"].get("text") == line):
            remaining.pop(0)
    assert remaining == [], [e["kind"] for e in events]
    assert events[-1]["kind"] == "task.status"
    assert events[-1]["data"]["to"] == "succeeded"

    cut = next(e["event_id"] for e in events if e["kind"] == "worker.completed")
    later = logs(cli, task_id, after=cut)
    assert later["events"] == [e for e in events if e["event_id"] > cut]
    assert later["next_after"] == ids[-1]
    assert logs(cli, task_id, after=ids[-1]) == {"events": [], "next_after": ids[-1]}


# -- the library ----------------------------------------------------------------------------


def test_the_library_creates_and_runs_a_task_and_agrees_with_the_cli(
    docker_images, bridge, cli, repo: Path
) -> None:
    spec = mock_task(repo, {"write": {"calc.py": CALC_WITH_SUB}}, verify=["python3 -m pytest -q"])
    created = bridge.create_task(spec)
    task_id = created.task_id
    assert created.status == "created"
    assert task_id

    result = asyncio.run(bridge.start_task(task_id))
    assert result.task_id == task_id
    assert result.status == "succeeded"
    assert result.verification.ok is True
    assert result.document()["changed_files"] == [{"path": "calc.py", "change": "modified"}]

    from_cli = show_task(cli, task_id)
    from_library = json.loads(json.dumps(bridge.get_task(task_id).document()))
    assert from_cli["status"] == from_library["status"] == "succeeded"
    assert from_cli["changed_files"] == from_library["changed_files"]
    assert from_cli == from_library


def test_creating_a_task_twice_with_the_same_idempotency_key_returns_the_same_task(
    bridge, repo: Path
) -> None:
    spec = mock_task(repo, {"write": {"a.txt": "a\n"}}, idempotency_key="deploy-42")
    first = bridge.create_task(spec)
    second = bridge.create_task(spec)
    assert first.status == "created"
    assert second.task_id == first.task_id
    assert [t.task_id for t in bridge.list_tasks()] == [first.task_id]
    other = bridge.create_task(mock_task(repo, {}, idempotency_key="deploy-43"))
    assert other.task_id != first.task_id


def test_workspace_write_permission_lets_the_worker_write(docker_images, cli, repo: Path) -> None:
    res, result = run_task(
        cli, repo, {"write": {"new.txt": "x\n"}}, extra=("--permission", "workspace_write")
    )
    assert res.code == 0, res.stderr
    assert result["changed_files"] == [{"path": "new.txt", "change": "added"}]
