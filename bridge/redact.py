"""Secret redaction for everything worker-bridge stores or shows: output, summaries, events,
command text and errors. Only the recorded or displayed copy is redacted, never what is executed."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

MASK = "[REDACTED]"
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary text everywhere

# Each pattern's "secret" group is replaced by MASK; the rest of the match is kept.
_PEM = re.compile(
    r"(?P<secret>-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----"
    r"(?:[A-Za-z0-9+/=\s\\:,-]*?-----END[A-Z0-9 ]*PRIVATE KEY-----|[A-Za-z0-9+/=\s\\:,-]*))"
)
_SLACK_WEBHOOK = re.compile(r"hooks\.slack\.com/services/(?P<secret>[A-Za-z0-9/_-]+)")
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_-])(?P<secret>"
    r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"
    r"|AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"
    r"|gh[pousr]_[A-Za-z0-9]{36,}"
    r"|github_pat_[A-Za-z0-9_]{22,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|sk-[A-Za-z0-9_-]{20,}"
    r"|npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,})"
)
# scheme://user:password@host (password may hold "@"; the last one before the path wins), and
# scheme://TOKEN@host where the userinfo is a single token-like value of 20+ characters.
_URL_USERINFO = re.compile(
    r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://"
    r"(?:[^\s/?#@:'\"]*:(?P<secret>[^\s/?#'\"]+)|(?P<token>[A-Za-z0-9_.~%+-]{20,}))@"
)
# Command-line flags that take a secret as the next word, and curl/wget-style user:password.
_FLAG = re.compile(
    r"(?<![\w-])--?(?:password|passwd|pass|token|api[-_]?key|secret|auth-token|access-token)"
    r"[ \t]+(?P<secret>[^\s\"'`$-][^\s\"'`]*)"
    r"|(?<![\w-])(?:-u|--user)[ \t]+[^\s:\"']+:(?P<token>[^\s\"'`]+)"
)
# "key=value", "key: value", '"key": "value"', ...; _is_secret_key decides whether a key counts.
_PAIR_KEY = re.compile(
    r"(?<![A-Za-z0-9_.$])(?<!\$\{)(?P<kq>\\?[\"']|)(?P<key>[A-Za-z_][A-Za-z0-9_.-]*)(?P=kq)"
    r"(?P<before>[ \t]*)(?P<sep>:=|=>|=(?!=)|:(?!:))(?P<after>[ \t]*)"
)
_SCHEME = re.compile(r"(?i:bearer|basic|token|digest|bot|apikey)[ \t]+")
# A quoted value ends at its closing quote (with none on the line, it is prose, not a value); an
# unquoted one at whitespace, a quote, ",", "&", ";", a bracket or a backslash.
_PAIR_VALUE = re.compile(
    r"(?P<masked>\[REDACTED\])"
    r"|\"(?P<dq>(?:[^\"\\\n]|\\.)*)(?=\")"
    r"|'(?P<sq>[^'\n]*)(?=')"
    r"|\\\"(?P<eq>(?:[^\"\\\n]|\\(?!\"))*)"
    r"|(?P<bare>[^\s\"'`,&;()\[\]{}<>\\]+)"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORDS = re.compile(r"[a-z]+")
_VAR_REF = re.compile(r"\$\{?\w+\}?|%\w+%")
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
_IDENT = re.compile(r"[A-Za-z_]\w*")
# A key after one of these, before ":", is a condition or a signature, not a pair: `if not token:`
_CONDITION = re.compile(
    r"(?:^|[\s(])(?:if|elif|while|not|and|or|return|assert|lambda|with|for|in|is|else)\s+\Z"
)
_CODE_WORDS = frozenset(
    "none null nil true false undefined str string int bool bytes optional any self".split()
)
_STRONG_WORDS = ("password", "passwd", "passphrase", "secret")
_LAST_WORDS = ("token", "auth", "authorization", "pwd", "apikey", "accesskey", "privatekey")
_KEY_QUALIFIERS = frozenset(
    "api access private secret client auth signing encryption master".split()
)
_SHELL_VARS = frozenset({"PWD", "OLDPWD"})  # the working directory, not a password


@lru_cache(maxsize=4096)
def _is_secret_key(name: str) -> bool:
    """Whether a key/variable name looks like it holds a secret (``max_tokens`` does not)."""
    if name in _SHELL_VARS:
        return False
    parts = _WORDS.findall(_CAMEL.sub("_", name).lower())
    if not parts:
        return False
    if any(part.endswith(_STRONG_WORDS) for part in parts):
        return True
    last = parts[-1]
    if last.endswith(_LAST_WORDS) or last == "secretkey":
        return True
    if last == "key" and len(parts) > 1:
        return parts[-2] in _KEY_QUALIFIERS or name.isupper()
    return False


def _worth_learning(value: str) -> bool:
    """Whether a discovered value is distinctive enough to mask wherever it appears later."""
    if len(value) < 6 or MASK in value or any(c.isspace() for c in value):
        return False
    has_letter = any(c.isalpha() for c in value)
    return has_letter and (len(value) >= 16 or any(c.isdigit() for c in value))


def _looks_like_code(value: str, text: str, end: int, shell_style: bool) -> bool:
    """Whether an unquoted value is an expression rather than a literal (``token = get()``).
    In a shell-style ``KEY=value`` (no spaces) a word is a value, however word-like it is
    (``DB_PASSWORD=Secret2024``); only ``token = other_token`` is code."""
    return (
        text[end : end + 1] in ("(", "[", "{")
        or value.lower() in _CODE_WORDS
        or _VAR_REF.fullmatch(value) is not None
        or _DOTTED.fullmatch(value) is not None
        or (
            not shell_style
            and _IDENT.fullmatch(value) is not None
            and _is_secret_key(value)
            and not any(c.isdigit() for c in value)
        )
    )


class Redactor:
    """Redacts secrets from text and JSON-like data for one task.

    Once a value is recognised as a secret (by a pattern, or given via add_secret), every later
    occurrence of that value in anything this Redactor redacts is masked too, the way CI systems
    mask secret values."""

    def __init__(self, secrets: Iterable[str] = (), *, max_learned: int = 1000) -> None:
        self._secrets: set[str] = set()
        # Values learned from text are bounded (each is searched for in everything redacted
        # later); values given explicitly, such as credentials, are always kept.
        self.max_learned = max_learned
        self._learned = 0
        for value in secrets:
            self.add_secret(value)

    def add_secret(self, value: str) -> None:
        """Mask ``value`` (stripped of surrounding whitespace) wherever it appears from now on."""
        value = value.strip()
        if len(value) >= _MIN_SECRET_LEN and MASK not in value:
            self._secrets.add(value)

    @property
    def known_secrets(self) -> frozenset[str]:
        return frozenset(self._secrets)

    def redact(self, text: str) -> str:
        return self._mask_known(self._apply_patterns(text))

    def redact_data(self, data: Any) -> Any:
        """A redacted copy of ``data``: str values anywhere in dicts, lists and tuples are redacted,
        string values under secret-looking keys are masked wholesale. Keys are kept as they are."""
        # Discover everything first, so a secret found late in the data is masked earlier too.
        return self._walk(self._walk(data, self._apply_patterns, learn=True), self._mask_known)

    def _walk(self, data: Any, fn: Callable[[str], str], learn: bool = False) -> Any:
        if isinstance(data, str):
            return fn(data)
        if isinstance(data, dict):
            out = {}
            for key, value in data.items():
                if isinstance(value, str) and value and _is_secret_key(str(key)):
                    if learn:  # "Bearer <token>": remember the token
                        scheme = _SCHEME.match(value)
                        self._learn(value[scheme.end() :] if scheme else value.strip())
                    out[key] = MASK
                else:
                    out[key] = self._walk(value, fn, learn)
            return out
        if isinstance(data, list | tuple):
            items = [self._walk(item, fn, learn) for item in data]
            if isinstance(data, list):
                return items
            return type(data)(*items) if hasattr(data, "_fields") else tuple(items)
        return data

    def _learn(self, value: str) -> None:
        if _worth_learning(value) and value not in self._secrets:
            if self._learned < self.max_learned:
                self._learned += 1
                self._secrets.add(value)

    def _apply_patterns(self, text: str) -> str:
        for pattern in (_PEM, _SLACK_WEBHOOK, _TOKEN, _URL_USERINFO, _FLAG):
            text = pattern.sub(self._mask_group, text)
        return self._mask_pairs(text)

    def _mask_group(self, m: re.Match[str]) -> str:
        group = "secret" if m.group("secret") is not None else "token"
        value = m.group(group)
        if value == MASK:
            return m.group(0)
        self._learn(value)
        return _splice(m, group, MASK)

    def _mask_pairs(self, text: str) -> str:
        out: list[str] = []
        pos = scan = 0
        while m := _PAIR_KEY.search(text, scan):
            # Resume right after the key, so a pair inside a value is seen: note="password=x".
            scan = m.end("key")
            shell_empty = m["sep"] == "=" and m["after"] and not m["before"]  # "TOKEN= cmd"
            if shell_empty or not _is_secret_key(m["key"]):
                continue
            if m["sep"] == ":" and _CONDITION.search(
                text, text.rfind("\n", 0, m.start()) + 1, m.start()
            ):
                continue
            shell_style = m["sep"] == "=" and not m["before"] and not m["after"]
            span = self._pair_value(text, m.end(), shell_style)
            if span is not None:
                out += [text[pos : span[0]], MASK]
                pos = scan = span[1]
        return "".join(out) + text[pos:] if out else text

    def _pair_value(self, text: str, at: int, shell_style: bool) -> tuple[int, int] | None:
        """The span of the secret value starting at ``at`` (learned), or None to leave it."""
        scheme = _SCHEME.match(text, at)  # "Authorization: Bearer <value>"
        v = _PAIR_VALUE.match(text, scheme.end()) if scheme else None
        if v is None:
            scheme, v = None, _PAIR_VALUE.match(text, at)
        if v is None or v.lastgroup in (None, "masked"):
            return None
        group = v.lastgroup
        start, end = v.span(group)
        value = v.group(group)
        if group == "bare":
            value = value.rstrip(".")
            end = start + len(value)
            if scheme is None and _looks_like_code(value, text, end, shell_style):
                return None
        if not value:
            return None
        self._learn(value)
        return start, end

    def _mask_known(self, text: str) -> str:
        if not self._secrets:
            return text
        spans: list[tuple[int, int]] = []
        # Longest first; overlapping and nested occurrences are merged into one mask below.
        for secret in sorted(self._secrets | {MASK}, key=len, reverse=True):
            i = text.find(secret)
            while i != -1:
                spans.append((i, i + len(secret)))
                i = text.find(secret, i + 1)
        if not spans:
            return text
        spans.sort()
        out: list[str] = []
        pos = 0
        start, end = spans[0]
        for s, e in spans[1:]:
            if s < end:
                end = max(end, e)
                continue
            out += [text[pos:start], MASK]
            pos, start, end = end, s, e
        out += [text[pos:start], MASK, text[end:]]
        return "".join(out)


def _splice(m: re.Match[str], group: str, replacement: str) -> str:
    """The whole match with ``group`` replaced by ``replacement``."""
    whole, base = m.group(0), m.start()
    return whole[: m.start(group) - base] + replacement + whole[m.end(group) - base :]


def redact(text: str) -> str:
    """Redact ``text`` with a fresh Redactor (no secrets remembered across calls)."""
    return Redactor().redact(text)


def task_redactor(spec: dict[str, Any], config: dict[str, Any]) -> Redactor:
    """A redactor for one task that already knows the secrets visible in its own spec, learning
    at most as many as the limits recorded in its ``config`` allow (``spec`` and ``config`` as
    stored with the task)."""
    recorded = config.get("effective_limits") or {}
    redactor = Redactor(max_learned=int(recorded.get("secrets", 1000)))
    redactor.redact_data(spec)
    return redactor
