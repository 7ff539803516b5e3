"""Task spec validation and the declared transition table."""

from __future__ import annotations

import pytest

from bridge.errors import InvalidSpec
from bridge.models import TERMINAL, TRANSITIONS, Status, parse_spec
from bridge.workspace.diff import Change, protected_violations

SPEC = {"objective": "o", "workspace": {"repository": "/r"}}


def test_a_minimal_spec_gets_the_contract_defaults():
    spec = parse_spec(SPEC)
    assert spec.worker == "mock"
    assert spec.permission == "workspace_write"
    assert spec.network.mode == "none"
    assert spec.workspace.base_ref == "HEAD"
    assert spec.verification.commands == []


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ({**SPEC, "objectiv": "x"}, "objectiv"),
        ({**SPEC, "verification": {"comands": []}}, "verification.comands"),
        ({**SPEC, "limits": {"timeout": 3}}, "limits.timeout"),
        ({**SPEC, "workspace": {"repository": "/r", "ref": "x"}}, "workspace.ref"),
    ],
)
def test_an_unknown_key_is_rejected_by_name(doc, named):
    with pytest.raises(InvalidSpec, match=f"'{named}'"):
        parse_spec(doc)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"workspace": {"repository": "/r"}}, "objective"),
        ({**SPEC, "objective": "   "}, "objective"),
        ({**SPEC, "permission": "root"}, "permission"),
        ({**SPEC, "limits": {"timeout_seconds": 0}}, "limits.timeout_seconds"),
        # which types exist is config's (tests/config/test_profiles.py); a type is a name all
        # the same
        ({**SPEC, "metadata": {"type": 7}}, "metadata"),
        ({**SPEC, "metadata": {"auto_repair": -1}}, "metadata"),
        ({**SPEC, "metadata": {"auto_repair": "2"}}, "metadata"),
    ],
)
def test_a_bad_value_is_rejected_naming_the_field(doc, field):
    with pytest.raises(InvalidSpec, match=field):
        parse_spec(doc)


def test_invalid_spec_is_also_a_value_error():
    with pytest.raises(ValueError):
        parse_spec({})


def test_every_status_has_a_row_in_the_transition_table():
    assert set(TRANSITIONS) == set(Status)
    for status in (Status.CANCELLED, Status.TIMED_OUT, Status.ACCEPTED, Status.REJECTED):
        assert status in TERMINAL and not TRANSITIONS[status]


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("tests/**", "tests/test_a.py", True),
        ("tests/**", "tests/deep/x.py", True),
        ("tests/**", "src/tests.py", False),
        ("*.lock", "poetry.lock", True),
        ("*.lock", "sub/poetry.lock", False),
        ("**/*.lock", "sub/poetry.lock", True),
        (".github", ".github/workflows/ci.yml", True),
        ("src/?.py", "src/a.py", True),
        ("src/?.py", "src/ab.py", False),
    ],
)
def test_protected_patterns_match_like_gitignore_globs(pattern, path, hit):
    assert bool(protected_violations([Change(path=path, change="modified")], [pattern])) is hit


def test_a_rename_out_of_a_protected_path_is_a_violation():
    change = Change(path="moved.py", change="renamed", old_path="tests/test_a.py")
    assert protected_violations([change], ["tests/**"]) == ["tests/test_a.py"]


def test_several_patterns_match_what_each_matches_alone_and_allowed_ones_are_let_through():
    patterns = ["tests/**", "*.lock", ".github", "src/?.py", "  "]
    paths = [
        "tests/a.py",
        "poetry.lock",
        "sub/poetry.lock",
        ".github/ci.yml",
        "src/a.py",
        "src/ab.py",
        "README.md",
        "tests",
        ".githubx/a",
    ]
    for path in paths:
        alone = any(protected_violations([Change(path, "added")], [p]) for p in patterns)
        assert bool(protected_violations([Change(path, "added")], patterns)) is alone, path
    changes = [Change(p, "added") for p in paths]
    assert protected_violations(changes, patterns, ["tests/a.py", "*.lock"]) == [
        ".github/ci.yml",
        "src/a.py",
    ]
    assert protected_violations(changes, ["", " "]) == []  # no pattern: nothing protected
