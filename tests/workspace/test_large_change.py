"""Large changes through the real engine: thousands of files collected, verified and accepted
byte for byte, the worktree and verification checkouts handed to the background remover, and
what a hostile verification command leaves in its checkout removed without following it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.repos import git
from support.tasks import mock_task, run_spec

from bridge.workspace.trash import reap, trash_dir

pytestmark = pytest.mark.usefixtures("docker_images")

# Folders of files of every kind: text, binary, empty, one of 300 KB, executables, links
# inside the repository, names with spaces and non-ASCII characters; plus a modified, a
# deleted and a renamed file of the base.
MANY_FILES = r"""python3 -c "
import os
for d in range(6):
    os.makedirs(f'many/{d}/deeper', exist_ok=True)
    for f in range(500):
        path = f'many/{d}/{f}.txt' if f % 5 else f'many/{d}/deeper/{f} ü.bin'
        binary = bytes((f * 7 + i) % 256 for i in range(f % 97))
        data = binary if f % 5 == 0 else b'%d/%d\n' % (d, f)
        open(path, 'wb').write(data)
        if f % 50 == 1:
            os.chmod(path, 0o755)
        if f % 100 == 3:
            os.symlink(f'{f}.txt', f'many/{d}/link-{f}')
open('many/big.bin', 'wb').write(os.urandom(300_000))
open('many/empty', 'wb').close()
open('calc.py', 'a').write('# changed\n')
os.remove('README.md')
os.rename('tests/test_calc.py', 'tests/test_calc_moved.py')
"
"""
EXPECTED = 6 * 500 + 6 * 5 + 2 + 3  # files, links, big and empty, the base's three changes

# Passes only on a checkout of plain files whose inodes nothing else shares (a hard link from
# the verification checkout into the worktree or the repository would show as a second link),
# whose new folders and files the command may write as a checkout of its own.
NO_SHARED_INODES = (
    'test -z "$(find . -type f -links +1)" && test -f many/5/499.txt'
    " && touch many/5/deeper/made-by-the-check && echo more >> many/5/498.txt"
)


def tree_of_working_files(repo: Path) -> str:
    """The tree id of the user's working files as they are (bytes, modes and links)."""
    git(repo, "add", "-A")
    tree = git(repo, "write-tree").strip()
    git(repo, "reset", "-q")
    return tree


def test_thousands_of_files_are_collected_verified_and_accepted_byte_for_byte(
    cli, repo, workdir, home
):
    result = run_spec(
        cli, workdir, mock_task(repo, {"script": MANY_FILES}, verify=[NO_SHARED_INODES])
    )
    assert result["status"] == "succeeded", result["error"]
    assert len(result["changed_files"]) == EXPECTED
    assert {
        "path": "tests/test_calc_moved.py",
        "change": "renamed",
        "from": "tests/test_calc.py",
    } in (result["changed_files"])
    task_id = result["task_id"]
    snapshot_tree = git(repo, "rev-parse", f"worker-bridge/{task_id}^{{tree}}").strip()
    # The verification checkout went to the trash the moment its command ended.
    assert not any((home / "tasks" / task_id).glob("verify-*"))

    accepted = cli("tasks", "accept", task_id, "--json")

    assert accepted.code == 0, accepted.stderr
    assert len(accepted.json()["applied"]) == EXPECTED + 1  # a rename is two paths
    assert tree_of_working_files(repo) == snapshot_tree
    assert (repo / "many" / "0" / "1.txt").stat().st_mode & 0o111
    assert os.readlink(repo / "many" / "2" / "link-3") == "3.txt"
    assert not (repo / "README.md").exists()
    assert not (home / "worktrees" / task_id).exists()
    assert task_id not in git(repo, "worktree", "list", "--porcelain")
    assert reap(home) == []
    assert os.listdir(trash_dir(home)) == []


def test_what_a_verify_command_leaves_in_its_checkout_is_removed_without_following_it(
    cli, repo, workdir, home
):
    keep = workdir / "host-folder"  # a folder of the host's, named in the container by path
    keep.mkdir()
    (keep / "precious.txt").write_text("the host's\n")
    hostile = (
        f"ln -s {keep} host-link; ln -s {keep}/precious.txt host-file;"
        " mkfifo fifo; mkdir -p locked/inner; touch locked/inner/x; chmod 000 locked/inner locked;"
        " python3 -c \"import os\nfor i in range(300): os.mkdir('d'); os.chdir('d')\n"
        "open(b'\\xff', 'w')\";"
        " mkdir -p many && for i in $(seq 1 2000); do echo $i > many/$i; done; exit 0"
    )
    result = run_spec(
        cli,
        workdir,
        mock_task(repo, {"write": {"a.txt": "a\n"}}, verify=[hostile, hostile]),
    )
    assert result["status"] == "succeeded", result["error"]

    assert reap(home) == []

    assert os.listdir(trash_dir(home)) == []
    assert (keep / "precious.txt").read_text() == "the host's\n"
    assert sorted(os.listdir(keep)) == ["precious.txt"]
    assert not any((home / "tasks" / result["task_id"]).glob("verify-*"))


def test_a_change_that_deletes_hundreds_of_files_leaves_no_empty_folder_behind(cli, repo, workdir):
    for d in range(3):
        (repo / "bulk" / str(d) / "inner").mkdir(parents=True)
        for f in range(200):
            (repo / "bulk" / str(d) / ("inner" if f % 2 else "") / f"{f}.txt").write_text(str(f))
    (repo / "bulk" / "kept.txt").write_text("kept\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bulk")
    script = "rm -r bulk/0 bulk/1 && rm bulk/2/inner/*"
    check = (
        "test ! -e bulk/0 && test ! -e bulk/1 && test ! -e bulk/2/inner && test -f bulk/kept.txt"
    )
    result = run_spec(cli, workdir, mock_task(repo, {"script": script}, verify=[check]))
    assert result["status"] == "succeeded", result["error"]
    assert len(result["changed_files"]) == 500

    accepted = cli("tasks", "accept", result["task_id"])

    assert accepted.code == 0, accepted.stderr
    assert sorted(os.listdir(repo / "bulk")) == ["2", "kept.txt"]
    assert sorted(os.listdir(repo / "bulk" / "2")) == sorted(f"{f}.txt" for f in range(0, 200, 2))
