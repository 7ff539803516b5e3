"""The names the diff view puts over diff2html's drawing (bridge/ui/diff_names.py) are read from
a real `git diff` exactly as the task result lists them: names git quotes, names with ` b/`,
` -> `, a tab, a newline, a backslash, a timestamp's shape or bytes that are not UTF-8, files
with no `---`/`+++` lines (empty, binary, a mode change) and renames."""

from __future__ import annotations

import os

from support.repos import commit_all, git

from bridge.ui.diff_names import diff_files
from bridge.workspace.diff import list_changes, write_diff

NAMES = [
    "with space.txt",
    'quote".txt',
    "back\\slash.txt",
    "tab\there.txt",
    "new\nline.txt",
    "café ü.txt",
    "x b/y.txt",
    "a -> b.txt",
    "{curly}.txt",
    "x 2016-10-25 11:37:14.000000000 +0200",
    '"quoted".txt',
    "\\001 not octal.txt",
]


def test_each_files_name_is_read_from_a_real_diff_as_the_result_lists_it(workdir):
    repo = workdir / "names"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "old name.txt").write_text("renamed whole\n")
    (repo / "mode b/x b").parent.mkdir()
    (repo / "mode b/x b").write_text("chmod only\n")
    commit_all(repo, "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    for name in NAMES:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("1\n")
    (repo / "e b").mkdir()
    (repo / "e b" / "e b").write_text("")  # empty: its header alone names it
    (repo / "bin b.bin").write_bytes(b"\0\1\2")
    os.rename(repo / "old name.txt", repo / "new → name.txt")
    os.chmod(repo / "mode b/x b", 0o755)
    with open(os.path.join(os.fsencode(repo), b"bad\xff.txt"), "w") as handle:
        handle.write("x\n")
    commit_all(repo, "names")
    snapshot = git(repo, "rev-parse", "HEAD").strip()

    size, _ = write_diff(repo, base, snapshot, workdir / "changes.diff")
    shown = diff_files((workdir / "changes.diff").read_bytes())
    listed = [
        {k: v for k, v in c.result_entry().items() if k != "change"}
        for c in list_changes(repo, base, snapshot)
    ]
    assert size > 0 and len(listed) == len(NAMES) + 5
    assert sorted(shown, key=lambda f: f["path"]) == sorted(listed, key=lambda f: f["path"])
    assert {"path": "new → name.txt", "from": "old name.txt"} in shown
    assert {"path": "bad\\xff.txt"} in shown and {"path": "e b/e b"} in shown


def test_a_header_that_is_not_gits_names_nothing():
    diff = b'diff --git a/x b/y\nindex 0..1\ndiff --git "a/broken\\q" "b/broken\\q"\n'
    assert diff_files(diff) == [None, None]
    assert diff_files(b"") == [] and diff_files(b"not a diff\n") == []
