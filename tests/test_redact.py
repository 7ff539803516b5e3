"""Tests for bridge.redact: what is masked, what is left alone, and what a Redactor remembers."""

from __future__ import annotations

import copy
from collections import namedtuple

import pytest

from bridge.redact import MASK, Redactor, redact

# Fake but format-valid secrets, built by concatenation so this file holds no real-looking keys.
GITHUB_CLASSIC = "ghp_" + "a1B2" * 9
GITHUB_FINE_GRAINED = "github_pat_" + "11AB_cd" * 4
AWS_KEY_ID = "AKIA" + "ABCDEFGH12345678"
AWS_STS_KEY_ID = "ASIA" + "ZYXWVUTS98765432"
GCP_API_KEY = "AIza" + "Sy" + "x" * 30 + "_-9"
SLACK_BOT = "xoxb-" + "123456789012-" + "abcDEF123"
SLACK_USER = "xoxp-" + "1234-5678-" + "abcdef"
OPENAI_KEY = "sk-" + "Ab1_" * 6
OPENAI_PROJECT_KEY = "sk-" + "proj-" + "Zz9-" * 8
ANTHROPIC_KEY = "sk-" + "ant-" + "api03-" + "Q7_w" * 6
JWT = "eyJ" + "hbGciOiJIUzI1NiJ9" + "." + "eyJ" + "zdWIiOiIxMjM0In0" + "." + "c2lnbmF0dXJlX2hlcmU"
PEM_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n"


def pem(kind: str) -> str:
    label = f"{kind} PRIVATE KEY" if kind else "PRIVATE KEY"
    return f"-----BEGIN {label}-----\n{PEM_BODY}-----END {label}-----"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Bearer abc123xyz", f"Authorization: Bearer {MASK}"),
        ("Authorization: Basic dXNlcjpwYXNz==", f"Authorization: Basic {MASK}"),
        ("authorization: token abc123xyz", f"authorization: token {MASK}"),
        ("Proxy-Authorization: Basic dXNlcjpwYXNz", f"Proxy-Authorization: Basic {MASK}"),
        ("X-Api-Key: k3y-value-42", f"X-Api-Key: {MASK}"),
        (
            'curl -H "Authorization: Bearer abc.def.ghi" https://x',
            f'curl -H "Authorization: Bearer {MASK}" https://x',
        ),
    ],
)
def test_the_credential_in_an_authorization_header_is_masked_but_the_scheme_is_kept(
    text: str, expected: str
) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=hunter2", f"password={MASK}"),
        ("db_passwd: hunter2", f"db_passwd: {MASK}"),
        ('{"password": "hunter 2"}', f'{{"password": "{MASK}"}}'),
        ("{'api_key': 'abc123'}", f"{{'api_key': '{MASK}'}}"),
        ('CLIENT_SECRET="abc123"', f'CLIENT_SECRET="{MASK}"'),
        ("apiKey=abc123", f"apiKey={MASK}"),
        ("x-api-key=abc123", f"x-api-key={MASK}"),
        ("access_key: abc123", f"access_key: {MASK}"),
        ("private_key = abc123", f"private_key = {MASK}"),
        ("aws_secret_access_key = wJalr/K7MDENG+bPxRfiCY", f"aws_secret_access_key = {MASK}"),
        ("GITHUB_TOKEN=abc123", f"GITHUB_TOKEN={MASK}"),
        ("MY_SERVICE_KEY=abc", f"MY_SERVICE_KEY={MASK}"),
        ("WEBHOOK_SECRET=abc", f"WEBHOOK_SECRET={MASK}"),
        ("export PGPASSWORD=abc", f"export PGPASSWORD={MASK}"),
        ("basic_auth: user:pw", f"basic_auth: {MASK}"),
        ("--password=abc123", f"--password={MASK}"),
        ('{\\"token\\": \\"abc123\\"}', f'{{\\"token\\": \\"{MASK}\\"}}'),
        ('note="password=hunter2"', f'note="password={MASK}"'),
    ],
)
def test_the_value_of_a_secret_looking_key_is_masked_and_the_key_is_kept(
    text: str, expected: str
) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("password=abc123 user=bob", f"password={MASK} user=bob"),
        ("a=1&api_key=abc123&b=2", f"a=1&api_key={MASK}&b=2"),
        ("token=abc123;next", f"token={MASK};next"),
        ("token=abc123,next", f"token={MASK},next"),
        ("token='abc 123' rest", f"token='{MASK}' rest"),
        ('PASSWORD="abc" && make', f'PASSWORD="{MASK}" && make'),
        ("token=abc123.", f"token={MASK}."),
        ("password: abc\nuser: bob", f"password: {MASK}\nuser: bob"),
    ],
)
def test_a_masked_value_ends_where_the_value_ends(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text", ["password=", 'password=""', "token: ''", "PASSWORD= ./run.sh", "password:\n"]
)
def test_an_empty_value_is_not_masked(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://user:pass@host/path", f"https://user:{MASK}@host/path"),
        ("postgres://app:s3cr3t@db:5432/app", f"postgres://app:{MASK}@db:5432/app"),
        ("redis://:s3cr3t@localhost:6379", f"redis://:{MASK}@localhost:6379"),
        (
            "git clone https://x-access-token:abc123@github.com/o/r.git",
            f"git clone https://x-access-token:{MASK}@github.com/o/r.git",
        ),
        ("https://" + "T0ken" * 5 + "@github.com/o/r", f"https://{MASK}@github.com/o/r"),
    ],
)
def test_the_password_or_token_in_a_url_is_masked(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text", ["ssh://git@github.com/o/r.git", "http://localhost:8080/?to=a@b.c", "me@example.com"]
)
def test_a_url_without_a_credential_is_left_alone(text: str) -> None:
    assert redact(text) == text


@pytest.mark.parametrize("kind", ["RSA", "EC", "OPENSSH", "ENCRYPTED", ""])
def test_a_whole_pem_private_key_block_is_masked(kind: str) -> None:
    out = redact(f"key:\n{pem(kind)}\ndone")
    assert out == f"key:\n{MASK}\ndone"


def test_a_private_key_inside_service_account_json_is_masked() -> None:
    escaped = pem("").replace("\n", "\\n")
    text = '{"type": "service_account", "private_key": "' + escaped + '", "project_id": "p"}'
    assert (
        redact(text) == f'{{"type": "service_account", "private_key": "{MASK}", "project_id": "p"}}'
    )


def test_a_private_key_cut_off_before_its_end_line_is_still_masked() -> None:
    assert PEM_BODY.split()[0] not in redact("-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY)


@pytest.mark.parametrize(
    "secret",
    [
        GITHUB_CLASSIC,
        "gho_" + "b" * 36,
        "ghu_" + "c" * 40,
        "ghs_" + "d" * 36,
        "ghr_" + "e" * 36,
        GITHUB_FINE_GRAINED,
        AWS_KEY_ID,
        AWS_STS_KEY_ID,
        GCP_API_KEY,
        SLACK_BOT,
        SLACK_USER,
        "xoxa-" + "2-abcdef1234",
        "xoxr-" + "abcdef-12345",
        "xoxs-" + "1-2-3-abcdef",
        OPENAI_KEY,
        OPENAI_PROJECT_KEY,
        ANTHROPIC_KEY,
        JWT,
    ],
)
def test_a_known_token_format_is_masked_wherever_it_appears(secret: str) -> None:
    assert redact(f"using {secret} now") == f"using {MASK} now"
    assert redact(f"x={secret}") == f"x={MASK}"


def test_a_slack_webhook_url_keeps_its_host_but_not_its_secret_path() -> None:
    url = "https://hooks.slack.com/services/" + "T0001/B0002/" + "Xy" * 12
    assert redact(f"POST {url}") == f"POST https://hooks.slack.com/services/{MASK}"


def test_a_value_recognised_once_is_masked_in_later_calls_too() -> None:
    redactor = Redactor()
    assert redactor.redact("API_TOKEN=s3cr3tvalue99") == f"API_TOKEN={MASK}"
    assert redactor.redact("echo s3cr3tvalue99") == f"echo {MASK}"
    assert "s3cr3tvalue99" in redactor.known_secrets


def test_a_token_found_by_its_format_is_masked_later_even_when_mangled_around() -> None:
    redactor = Redactor()
    redactor.redact(f"GITHUB_TOKEN={GITHUB_CLASSIC}")
    assert redactor.redact(f"x{GITHUB_CLASSIC}x") == f"x{MASK}x"


def test_a_secret_found_later_in_the_same_text_is_masked_earlier_too() -> None:
    text = "echo s3cr3tvalue99\nAPI_TOKEN=s3cr3tvalue99"
    assert redact(text) == f"echo {MASK}\nAPI_TOKEN={MASK}"


def test_secrets_given_up_front_or_added_later_are_masked() -> None:
    redactor = Redactor(["first-secret", "  padded-secret\n"])
    redactor.add_secret("later-secret")
    out = redactor.redact("first-secret padded-secret later-secret plain")
    assert out == f"{MASK} {MASK} {MASK} plain"


def test_values_shorter_than_four_characters_are_not_remembered() -> None:
    redactor = Redactor(["abc", ""])
    redactor.add_secret("a")
    redactor.add_secret("abcd")
    assert redactor.known_secrets == frozenset({"abcd"})
    assert redactor.redact("abc a abcd") == f"abc a {MASK}"


def test_overlapping_and_nested_secrets_are_masked_fully() -> None:
    redactor = Redactor(["abcd1234", "abcd1234efgh", "efgh5678"])
    assert redactor.redact("<abcd1234efgh5678>") == f"<{MASK}>"
    assert redactor.redact("<abcd1234efgh>") == f"<{MASK}>"


def test_the_module_level_redact_remembers_nothing_between_calls() -> None:
    assert redact("API_TOKEN=s3cr3tvalue99") == f"API_TOKEN={MASK}"
    assert redact("echo s3cr3tvalue99") == "echo s3cr3tvalue99"


def test_redacting_already_redacted_text_changes_nothing() -> None:
    text = f"Authorization: Bearer abc123 password=hunter2 {GITHUB_CLASSIC} {pem('RSA')}"
    once = Redactor().redact(text)
    assert MASK in once
    assert Redactor(["hunter2x"]).redact(once) == once


@pytest.mark.parametrize(
    "text",
    [
        "def tokenize(text): return text.split()",
        "the password field is required",
        "max_tokens = 100",
        'git commit -m "fix"',
        "/usr/lib/python3/site-packages",
        "0123456789abcdef0123456789abcdef01234567",
        "token = get_token()",
        "api_key = os.environ['API_KEY']",
        "def login(password: str) -> None:",
        "token: Optional[str] = None",
        "self.token = token",
        "if token == other:",
        "password=$DB_PASSWORD",
        "export PWD=/work/main",
        "author: Jane Doe",
        "secretary=Jane",
        "token_type=bearer",
        "sort_key=name",
        "risk-assessment-of-the-whole-system",
    ],
)
def test_ordinary_text_and_code_are_left_alone(text: str) -> None:
    assert redact(text) == text


def test_redact_data_masks_nested_strings_and_secret_keys_and_keeps_keys() -> None:
    data = {
        "summary": "ran with password=hunter2",
        "env": {"GITHUB_TOKEN": "abc123", "MY_SERVICE_KEY": "k", "HOME": "/root"},
        "headers": [{"Authorization": "Bearer tok123456789"}],
        "events": ("start", f"pushed with {GITHUB_CLASSIC}"),
        "count": 3,
        "ok": True,
        "none": None,
        "password": "",
    }
    out = Redactor().redact_data(data)
    assert out == {
        "summary": f"ran with password={MASK}",
        "env": {"GITHUB_TOKEN": MASK, "MY_SERVICE_KEY": MASK, "HOME": "/root"},
        "headers": [{"Authorization": MASK}],
        "events": ("start", f"pushed with {MASK}"),
        "count": 3,
        "ok": True,
        "none": None,
        "password": "",
    }


def test_redact_data_never_mutates_its_input() -> None:
    data = {"token": "abc123", "items": ["password=hunter2", {"secret": "x"}]}
    before = copy.deepcopy(data)
    out = Redactor().redact_data(data)
    assert data == before
    assert out == {"token": MASK, "items": [f"password={MASK}", {"secret": MASK}]}
    assert out is not data and out["items"] is not data["items"]


def test_redact_data_masks_a_secret_everywhere_even_before_the_key_that_reveals_it() -> None:
    redactor = Redactor()
    out = redactor.redact_data({"cmd": "echo s3cr3tvalue99", "env": {"API_TOKEN": "s3cr3tvalue99"}})
    assert out == {"cmd": f"echo {MASK}", "env": {"API_TOKEN": MASK}}
    assert redactor.redact("later: s3cr3tvalue99") == f"later: {MASK}"


def test_redact_data_keeps_tuple_and_namedtuple_types() -> None:
    Pair = namedtuple("Pair", "name value")
    out = Redactor().redact_data([Pair("a", "token=abc123"), ("password=hunter2",)])
    assert out == [Pair("a", f"token={MASK}"), (f"password={MASK}",)]
    assert type(out[0]) is Pair


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DB_PASSWORD=Secret2024", f"DB_PASSWORD={MASK}"),
        ("export API_TOKEN=Passphrase", f"export API_TOKEN={MASK}"),
        ("AUTH_TOKEN=hunter", f"AUTH_TOKEN={MASK}"),
    ],
)
def test_a_shell_style_value_is_masked_even_when_it_looks_like_a_word(text, expected) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "${API_TOKEN:-}",
        'curl -H "x: ${API_TOKEN:-default}" https://x',
        "echo ${TOKEN:?msg}",
        ": ${PASSWORD:=}",
        "if not token:",
        "if not token: raise SystemExit(1)",
        "while password: retry()",
        'the password: "is never printed, see the docs',
        "Set the token: 'unterminated and then prose",
    ],
)
def test_shell_expansions_conditions_and_prose_after_an_open_quote_are_left_as_written(
    text,
) -> None:
    assert redact(text) == text


def test_learned_secret_values_are_bounded_but_given_ones_are_always_kept() -> None:
    redactor = Redactor(["given-credential-1"], max_learned=10)
    for i in range(50):
        redactor.redact(f"password=learned{i:04d}x")
    assert len(redactor.known_secrets) == 11
    assert "given-credential-1" in redactor.known_secrets
    redactor.add_secret("given-credential-2")
    assert redactor.redact("given-credential-2") == MASK
    assert redactor.redact("password=learned0049x") == f"password={MASK}"  # the pattern still
