"""Accepting a task: the verified snapshot lands in the user's working tree as uncommitted
changes, or the accept is refused with one line on stderr and the repository left untouched."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.repos import git

from bridge.workspace import overlay

pytestmark = pytest.mark.usefixtures("docker_images")

ORIGINAL_CALC = "def add(a, b):\n    return a + b\n"
NEW_CALC = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
UNICODE_PATH = "docs/notes with spaces ü 日本.txt"


def run_task(cli, repo: Path, mock: dict, *, verify: tuple[str, ...] = ("true",)) -> dict:
    """Run a mock task through the CLI; returns its result document."""
    args = ["tasks", "run", "--repo", str(repo), "--objective", "test task", "--worker", "mock"]
    args += ["--metadata-json", json.dumps({"mock": mock}), "--json"]
    for command in verify:
        args += ["--verify", command]
    result = cli(*args)
    assert result.stdout, result.stderr
    return result.json()


def run_succeeded(cli, repo: Path, mock: dict, **kwargs) -> dict:
    task = run_task(cli, repo, mock, **kwargs)
    assert task["status"] == "succeeded", task
    return task


def status_of(cli, task_id: str) -> str:
    shown = cli("tasks", "show", task_id, "--json")
    assert shown.code == 0, shown.stderr
    return shown.json()["status"]


def porcelain(repo: Path) -> dict[str, str]:
    """{path: two-letter status} of the working tree, untracked files listed one by one."""
    raw = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    return {entry[3:]: entry[:2] for entry in raw.split("\0") if entry}


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def assert_refused(result, *mentions: str) -> None:
    assert result.code == 1, (result.code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("worker-bridge:"), lines[0]
    for text in mentions:
        assert text in lines[0], lines[0]


def test_accepting_a_verified_task_writes_exactly_its_snapshot_as_uncommitted_changes(
    cli, repo, home
):
    before = head(repo)
    task = run_succeeded(
        cli,
        repo,
        {
            "write": {"calc.py": NEW_CALC, "src/added.py": "VALUE = 1\n", UNICODE_PATH: "ü\n"},
            "delete": ["README.md"],
        },
    )
    assert task["verification"]["ok"] is True
    worktree = home / "worktrees" / task["task_id"]
    assert worktree.is_dir()
    assert porcelain(repo) == {}

    accepted = cli("tasks", "accept", task["task_id"])

    assert accepted.code == 0, accepted.stderr
    assert (repo / "calc.py").read_text() == NEW_CALC
    assert (repo / "src" / "added.py").read_text() == "VALUE = 1\n"
    assert (repo / UNICODE_PATH).read_text(encoding="utf-8") == "ü\n"
    assert not (repo / "README.md").exists()
    assert (repo / "tests" / "test_calc.py").is_file()
    assert porcelain(repo) == {
        "calc.py": " M",
        "README.md": " D",
        "src/added.py": "??",
        UNICODE_PATH: "??",
    }
    assert head(repo) == before
    assert status_of(cli, task["task_id"]) == "accepted"
    assert not worktree.exists()
    listed = git(repo, "worktree", "list", "--porcelain")
    assert str(worktree) not in listed
    assert task["task_id"] not in listed

    again = cli("tasks", "accept", task["task_id"])

    assert_refused(again)
    assert status_of(cli, task["task_id"]) == "accepted"
    assert (repo / "calc.py").read_text() == NEW_CALC


def test_an_unverified_task_is_accepted_only_with_allow_unverified(cli, repo):
    task = run_succeeded(cli, repo, {"write": {"calc.py": NEW_CALC}}, verify=())
    assert task["verification"]["ok"] is None

    refused = cli("tasks", "accept", task["task_id"])

    assert_refused(refused, "--allow-unverified")
    assert porcelain(repo) == {}
    assert (repo / "calc.py").read_text() == ORIGINAL_CALC
    assert status_of(cli, task["task_id"]) == "succeeded"

    accepted = cli("tasks", "accept", task["task_id"], "--allow-unverified")

    assert accepted.code == 0, accepted.stderr
    assert (repo / "calc.py").read_text() == NEW_CALC
    assert porcelain(repo) == {"calc.py": " M"}
    assert status_of(cli, task["task_id"]) == "accepted"


@pytest.mark.parametrize(
    ("dirty_path", "user_content", "user_status"),
    [
        ("calc.py", "# the user's own edit\n", " M"),
        ("added.py", "# the user's own new file\n", "??"),
    ],
    ids=["modified-tracked-file", "untracked-file-at-an-added-path"],
)
def test_accept_is_refused_when_a_path_it_touches_has_uncommitted_user_changes(
    cli, repo, dirty_path, user_content, user_status
):
    task = run_succeeded(cli, repo, {"write": {"calc.py": NEW_CALC, "added.py": "NEW = 1\n"}})
    (repo / dirty_path).write_text(user_content)
    other = {"calc.py": "added.py", "added.py": "calc.py"}[dirty_path]
    other_before = (repo / other).read_text() if (repo / other).exists() else None

    refused = cli("tasks", "accept", task["task_id"])

    assert_refused(refused, dirty_path)
    assert (repo / dirty_path).read_text() == user_content
    if other_before is None:
        assert not (repo / other).exists()
    else:
        assert (repo / other).read_text() == other_before
    assert porcelain(repo) == {dirty_path: user_status}
    assert status_of(cli, task["task_id"]) == "succeeded"


@pytest.mark.parametrize(
    ("script", "link"),
    [
        ("ln -s /etc/passwd escape-abs", "escape-abs"),
        ("ln -s ../../outside escape-rel", "escape-rel"),
        ("ln -s . here && ln -s here/../outside escape-via-link", "escape-via-link"),
    ],
    ids=["absolute-target", "relative-target-climbing-out", "climbing-out-through-another-link"],
)
def test_accept_is_refused_when_an_added_symlink_points_outside_the_repository(
    cli, repo, script, link
):
    task = run_succeeded(cli, repo, {"script": script})
    assert {"path": link, "change": "added"} in task["changed_files"]

    refused = cli("tasks", "accept", task["task_id"])

    assert_refused(refused, link)
    assert not (repo / link).is_symlink()
    assert porcelain(repo) == {}
    assert status_of(cli, task["task_id"]) == "succeeded"


def test_accept_creates_a_symlink_that_stays_inside_the_repository(cli, repo):
    task = run_succeeded(cli, repo, {"script": "ln -s calc.py alias.py"})

    accepted = cli("tasks", "accept", task["task_id"])

    assert accepted.code == 0, accepted.stderr
    assert (repo / "alias.py").is_symlink()
    assert (repo / "alias.py").readlink() == Path("calc.py")
    assert porcelain(repo) == {"alias.py": "??"}


def test_accept_is_refused_for_a_task_whose_verification_failed(cli, repo):
    task = run_task(cli, repo, {"write": {"calc.py": NEW_CALC}}, verify=("false",))
    assert task["status"] == "failed"

    refused = cli("tasks", "accept", task["task_id"])

    assert_refused(refused)
    assert porcelain(repo) == {}
    assert (repo / "calc.py").read_text() == ORIGINAL_CALC
    assert status_of(cli, task["task_id"]) == "failed"


def test_accept_is_refused_when_the_repository_moved_on_and_the_diff_no_longer_applies(cli, repo):
    task = run_succeeded(cli, repo, {"write": {"calc.py": NEW_CALC}})
    user_calc = "def add(a, b):\n    return b + a  # committed by the user\n"
    (repo / "calc.py").write_text(user_calc)
    git(repo, "commit", "-qam", "user change")
    user_head = head(repo)

    refused = cli("tasks", "accept", task["task_id"])

    assert_refused(refused)
    assert (repo / "calc.py").read_text() == user_calc
    assert porcelain(repo) == {}
    assert head(repo) == user_head
    assert status_of(cli, task["task_id"]) == "succeeded"


def test_the_library_accept_returns_the_applied_paths(bridge, repo):
    spec = {
        "objective": "library accept",
        "worker": "mock",
        "workspace": {"repository": str(repo)},
        "verification": {"commands": ["true"]},
        "metadata": {"mock": {"write": {"calc.py": NEW_CALC, "lib.py": "X = 1\n"}}},
    }
    task_id = bridge.create_task(spec).task_id
    assert bridge.run_task(task_id).status == "succeeded"

    outcome = bridge.accept_task(task_id)

    assert outcome.accepted is True
    assert outcome.task_id == task_id
    assert outcome.reason is None
    assert sorted(outcome.applied) == ["calc.py", "lib.py"]
    assert (repo / "lib.py").read_text() == "X = 1\n"
    assert bridge.get_task(task_id).status == "accepted"
    # The worktree goes off the answer's path; closing the bridge waits for that to be done.
    worktree = bridge.config.home / "worktrees" / task_id
    bridge.close()
    assert not overlay.mounted(worktree) and not worktree.exists()
    assert str(worktree) not in git(repo, "worktree", "list", "--porcelain")


# What a hostile worker leaves for accept: names that are not UTF-8 or hold a newline or regex
# characters, attributes that ask for a filter and line-ending conversion, a FIFO, and nested
# git metadata under a name in another case.
HOSTILE_NAMES = r"""python3 -c "
import os
os.makedirs('names/sub/.GIT')
open(b'names/caf\xe9.txt', 'wb').write(b'latin-1 name\n')
open('names/new\nline.txt', 'w').write('newline\n')
open('names/a|b(.*).txt', 'w').write('regex\n')
open('names/crlf.txt', 'wb').write(b'a\nb\n')
open('.gitattributes', 'w').write('*.txt filter=evil text eol=crlf\n')
open('names/sub/.GIT/config', 'w').write('[core]\n\tfsmonitor = touch /tmp/pwned\n')
os.mkfifo('names/pipe')
"
"""


def test_a_hostile_workers_names_attributes_and_specials_are_accepted_as_bytes_and_no_more(
    cli, repo, workdir, tmp_path
):
    from support.tasks import mock_task, run_spec

    smudged = tmp_path / "smudged"  # the user's own filter: what the worker's attributes name
    git(repo, "config", "filter.evil.smudge", f"touch {smudged}; cat")
    git(repo, "config", "filter.evil.clean", f"touch {smudged}; cat")
    spec = mock_task(repo, {"script": HOSTILE_NAMES}, verify=["true"])
    # Patterns with regex characters are globs: neither matches the worker's names.
    spec["verification"]["protected_paths"] = ["secret|names/**", "(.*)"]
    task = run_spec(cli, workdir, spec)
    assert task["status"] == "succeeded", task["error"]
    dropped = {d["path"] for d in task["dropped"]}
    assert "names/pipe" in dropped and any(".GIT" in p for p in dropped), task["dropped"]

    accepted = cli("tasks", "accept", task["task_id"], "--json")

    assert accepted.code == 0, accepted.stderr
    applied = accepted.json()["applied"]
    assert "names/caf\\xe9.txt" in applied and "names/new\nline.txt" in applied
    names = set(os.listdir(os.fsencode(repo / "names")))
    assert names == {b"caf\xe9.txt", b"new\nline.txt", b"a|b(.*).txt", b"crlf.txt"}
    assert (repo / "names" / os.fsdecode(b"caf\xe9.txt")).read_bytes() == b"latin-1 name\n"
    assert (repo / "names" / "crlf.txt").read_bytes() == b"a\nb\n"  # no eol conversion
    assert not smudged.exists()  # no filter of the user's ran on the worker's attributes
    assert not (repo / "names" / "sub").exists()
    assert status_of(cli, task["task_id"]) == "accepted"
