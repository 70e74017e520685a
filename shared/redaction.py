"""Policy-based redaction before persistence (seed 001 §10): detectors that find personal data and secrets in a
text and replace each match with a typed placeholder. Pure: strings and compiled patterns in, strings and counts out.

Detectors (names as configured in ``redaction.detectors``):

- ``secret``: API keys of well-known shapes (``sk-``, ``AKIA``/``ASIA``, ``ghp_``/``github_pat_``, ``xox?-``, ``AIza``,
  ``glpat-``, Stripe ``sk_live_``, this service's own ``mb_`` tokens), PEM private keys, JWTs, ``Bearer <token>`` and
  the value of ``password=`` / ``api_key:``-style assignments → ``[SECRET]``;
- ``email`` → ``[EMAIL]``;
- ``iban``: an IBAN whose mod-97 check holds → ``[IBAN]``;
- ``card``: 13-19 digits (spaces or dashes between) whose Luhn check holds → ``[CARD]``;
- ``national_id``: US social security numbers written ``123-45-6789`` (the SSA's never-issued areas excluded) and UK
  national insurance numbers → ``[NATIONAL_ID]``;
- ``phone``: an international number (``+`` and 8-15 digits), a North American ``(555) 123-4567`` / ``555-123-4567``,
  or a trunk-prefixed national number (``030 1234567``, ``06-12345678``), never a date, a time or a year range
  → ``[PHONE]``;
- user patterns (``redaction.custom_patterns``) → ``[CUSTOM]``.

They run in that order, each over the previous one's output, so a card number is not also counted as a phone and a
key inside an e-mail-looking string is counted once. Placeholders hold no digit or ``@``, so no later detector
matches one.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

DETECTORS = ("secret", "email", "iban", "card", "national_id", "phone")
PLACEHOLDERS = {
    "secret": "[SECRET]",
    "email": "[EMAIL]",
    "iban": "[IBAN]",
    "card": "[CARD]",
    "national_id": "[NATIONAL_ID]",
    "phone": "[PHONE]",
    "custom": "[CUSTOM]",
}


@dataclass(frozen=True)
class RedactionPolicy:
    """What to redact for one tenant: the built-in detectors to run and the user's own patterns."""

    enabled: bool = True
    detectors: frozenset[str] = frozenset(DETECTORS)
    custom: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class Redacted:
    text: str
    counts: dict[str, int]  # detector -> matches replaced (only detectors that matched)


OFF = RedactionPolicy(enabled=False)


def redact(text: str, policy: RedactionPolicy) -> Redacted:
    """``text`` with every match of the policy's detectors replaced by its placeholder, and the counts."""
    if not policy.enabled or not text:
        return Redacted(text, {})
    counts: Counter[str] = Counter()
    has_digit = _DIGIT.search(text) is not None  # most turns have none: skip the detectors that need one
    for name in DETECTORS:
        if name in policy.detectors and (has_digit or name not in _NEED_DIGIT) and (name != "email" or "@" in text):
            text, n = _DETECT[name](text)
            counts[name] += n
    for pattern in policy.custom:
        text, n = pattern.subn(PLACEHOLDERS["custom"], text)
        counts["custom"] += n
    return Redacted(text, {k: v for k, v in counts.items() if v})


def merge_counts(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    """The sum of several redactions' counts (e.g. a fact's subject and content)."""
    total: Counter[str] = Counter()
    for part in parts:
        total.update(part)
    return dict(total)


def compile_custom(patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """User patterns, compiled; raises ValueError naming the pattern that does not compile or matches ''."""
    out = []
    for pattern in patterns:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {pattern!r} ({exc})") from None
        if compiled.fullmatch(""):
            raise ValueError(f"pattern matches the empty string: {pattern!r}")
        out.append(compiled)
    return tuple(out)


# --- checks ----------------------------------------------------------------------------------------------


def luhn_valid(digits: str) -> bool:
    """The Luhn (mod 10) check every payment card number satisfies."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_valid(iban: str) -> bool:
    """ISO 13616: move the first four characters to the end, letters to 10..35, the number mod 97 is 1."""
    s = iban.replace(" ", "").upper()
    if not 15 <= len(s) <= 34 or not s[:2].isalpha() or not s[2:4].isdigit() or not s.isalnum():
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(ch, 36)) for ch in moved)) % 97 == 1


# --- detectors -------------------------------------------------------------------------------------------

Detector = Callable[[str], tuple[str, int]]


def _sub(pattern: re.Pattern[str], placeholder: str, keep: Callable[[re.Match[str]], bool] | None = None) -> Detector:
    """A detector replacing the matches of ``pattern`` (its ``v`` group if it has one) that ``keep`` accepts."""

    def detect(text: str) -> tuple[str, int]:
        n = 0

        def repl(m: re.Match[str]) -> str:
            nonlocal n
            if keep is not None and not keep(m):
                return m.group(0)
            n += 1
            if "v" in pattern.groupindex:
                start, end = m.span("v")
                whole = m.group(0)
                return whole[: start - m.start()] + placeholder + whole[end - m.start() :]
            return placeholder

        return pattern.sub(repl, text), n

    return detect


_SECRET = re.compile(
    "|".join(
        (
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----",
            r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT (header.payload.signature)
            r"\bsk-(?:proj-|ant-|live-)?[A-Za-z0-9_-]{20,}",  # OpenAI / Anthropic style
            r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key id
            r"\bgh[pousr]_[A-Za-z0-9]{36,}\b|\bgithub_pat_[A-Za-z0-9_]{22,}",  # GitHub
            r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
            r"\bAIza[0-9A-Za-z_-]{35}",  # Google API key
            r"\bglpat-[A-Za-z0-9_-]{20,}",  # GitLab
            r"\b[sr]k_(?:live|test)_[0-9A-Za-z]{16,}",  # Stripe
            r"\bmb_[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])",  # this service's bearer tokens
            r"(?i:\bbearer\s+)(?P<v>[A-Za-z0-9._~+/-]{16,}=*)",  # an Authorization header's value
            # key = value / key: value for names that only ever hold secrets; the name stays, the value goes.
            r"(?i:\b(?:api[_-]?key|secret[_-]?key|client[_-]?secret|access[_-]?token|auth[_-]?token|password|passwd|pwd)"
            # The value must mix letters and digits: `api_key = api_key` (code) or `password: YOUR_PASSWORD` is no secret.
            r"\s*[:=]\s*)(?P<v2>[\"']?(?=[^\s\"',;]*\d)(?=[^\s\"',;]*[A-Za-z])[^\s\"',;]{6,}[\"']?)",
        )
    )
)


def _secret(text: str) -> tuple[str, int]:
    n = 0

    def repl(m: re.Match[str]) -> str:
        nonlocal n
        n += 1
        for group in ("v", "v2"):
            if m.group(group) is not None:
                start, end = m.span(group)
                return text[m.start() : start] + PLACEHOLDERS["secret"] + text[end : m.end()]
        return PLACEHOLDERS["secret"]

    return _SECRET.sub(repl, text), n


_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*\.[A-Za-z]{2,24}\b"
)
_IBAN = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
_CARD = re.compile(r"(?<![\d.,-])\d(?:[ -]?\d){12,18}(?![\d.,]\d|-\d)")
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])")
_NINO = re.compile(r"\b(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
# Never a piece of a longer run of digit groups (a tracking code, a card that failed its check): no digit group
# just before or after the match.
_PHONE = re.compile(
    r"(?<!\d[ ./-])(?:"
    + "|".join(
        (
            r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?![\w-])",  # +49 30 1234567, +1 (555) 123-4567
            r"(?<![\w(-])\(\d{3}\) ?\d{3}[ .-]\d{4}(?![\w-])",  # (555) 123-4567
            r"(?<![\w.-])\d{3}[.-]\d{3}[.-]\d{4}(?![\w.-])",  # 555-123-4567, 555.123.4567
            r"(?<![\w.-])0\d{1,4}[ /-]\d{3,4}[ -]?\d{2,5}(?![\w.:/-])",  # 030 1234567, 06-12345678
        )
    )
    + r")(?![ ./-]\d)"
)


_DIGIT = re.compile(r"\d")
_NEED_DIGIT = frozenset({"iban", "card", "national_id", "phone"})


def _phone_keep(m: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", m.group(0))
    if m.group(0).startswith("+"):
        return 8 <= len(digits) <= 15
    return 9 <= len(digits) <= 12


def _card_keep(m: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", m.group(0))
    separators = set(re.sub(r"\d", "", m.group(0)))
    # One kind of separator at most (4-4-4-4 or 4 4 4 4), a known issuer prefix (2-6), and the Luhn check.
    return len(separators) <= 1 and digits[0] in "23456" and 13 <= len(digits) <= 19 and luhn_valid(digits)


_DETECT: dict[str, Detector] = {
    "secret": _secret,
    "email": _sub(_EMAIL, PLACEHOLDERS["email"]),
    "iban": _sub(_IBAN, PLACEHOLDERS["iban"], lambda m: iban_valid(m.group(0))),
    "card": _sub(_CARD, PLACEHOLDERS["card"], _card_keep),
    "national_id": lambda text: _chain(
        text, _sub(_SSN, PLACEHOLDERS["national_id"]), _sub(_NINO, PLACEHOLDERS["national_id"])
    ),
    "phone": _sub(_PHONE, PLACEHOLDERS["phone"], _phone_keep),
}


def _chain(text: str, *detectors: Detector) -> tuple[str, int]:
    total = 0
    for detect in detectors:
        text, n = detect(text)
        total += n
    return text, total
