"""Redaction detectors (shared.redaction): each finds what it names, checks its checksum, and leaves ordinary text
alone; the tenant policy (shared.protection.redaction_policy) and its settings."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import ConfigError, RedactionSettings, load_settings
from shared.protection import redaction_policy
from shared.redaction import (
    DETECTORS,
    OFF,
    PLACEHOLDERS,
    RedactionPolicy,
    compile_custom,
    iban_valid,
    luhn_valid,
    redact,
)

ALL = RedactionPolicy()


@pytest.mark.parametrize(
    ("text", "expected", "detector"),
    [
        ("write to jane.doe+memo@example.co.uk today", "write to [EMAIL] today", "email"),
        ("my card is 4111 1111 1111 1111.", "my card is [CARD].", "card"),
        ("amex 3782-822463-10005", "amex [CARD]", "card"),
        ("pay to DE89 3704 0044 0532 0130 00 please", "pay to [IBAN] please", "iban"),
        ("GB82WEST12345698765432", "[IBAN]", "iban"),
        ("ssn 123-45-6789 on file", "ssn [NATIONAL_ID] on file", "national_id"),
        ("NI number AB 12 34 56 C", "NI number [NATIONAL_ID]", "national_id"),
        ("call +49 30 1234567", "call [PHONE]", "phone"),
        ("call (555) 123-4567 or 555-123-4567", "call [PHONE] or [PHONE]", "phone"),
        ("ring 030 1234567", "ring [PHONE]", "phone"),
        ("key sk-proj-abcdefghijklmnopqrstuvwxyz0123", "key [SECRET]", "secret"),
        ("AKIAIOSFODNN7EXAMPLE", "[SECRET]", "secret"),
        ("token ghp_" + "a1B2" * 9, "token [SECRET]", "secret"),
        ("Authorization: Bearer abcdef0123456789ABCDEF", "Authorization: Bearer [SECRET]", "secret"),
        (
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "[SECRET]",
            "secret",
        ),
        ("the password = hunter2hunter2 works", "the password = [SECRET] works", "secret"),
        ("mb_" + "x" * 43, "[SECRET]", "secret"),
    ],
)
def test_each_detector_replaces_what_it_names(text: str, expected: str, detector: str) -> None:
    # given a text holding one kind of sensitive value, when redacted with every detector on
    out = redact(text, ALL)
    # then only that detector matched, and its placeholder took the value's place
    assert out.text == expected
    assert set(out.counts) == {detector}


@pytest.mark.parametrize(
    "text",
    [
        "We met on 2023-01-15 at 12:30 and again on 15.01.2023.",
        "Prices went from $1,299.99 to 1 499 euros between 1990-2000.",
        "Version 3.14.159 was released; call me at noon.",
        "My order number is 1234567890123 and the tracking code 9400 1000 0000 0000 0000 00.",
        "I ran 10 km in 52:10, then 21.1 km; the score was 3-2.",
        "Skip to the section 4.2.1 on page 12-15 of ISBN 978-3-16-148410-0.",
        "user@ mentions and @handles are not addresses; nor is a.b@c",
        "The password was changed yesterday, and the API key field is empty.",
        "Bearer bonds are an old kind of security.",
        "Read RFC 9110, 2nd ed., and the ticket SUP-123456.",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    # given ordinary text with numbers, dates, prices and the words around secrets; then nothing is redacted
    assert redact(text, ALL) == redact(text, OFF)
    assert redact(text, ALL).counts == {}


def _with_luhn(body: str) -> str:
    for check in "0123456789":
        if luhn_valid(body + check):
            return body + check
    raise AssertionError("unreachable")


@given(body=st.text(alphabet=string.digits, min_size=15, max_size=15), sep=st.sampled_from(["", " ", "-"]))
def test_any_luhn_valid_card_is_redacted_and_an_invalid_one_is_not(body: str, sep: str) -> None:
    # given a 16-digit number starting with 4 whose check digit is right, written in groups of 4
    number = _with_luhn("4" + body[1:])
    wrong = number[:-1] + str((int(number[-1]) + 1) % 10)
    grouped = lambda n: sep.join(n[i : i + 4] for i in range(0, 16, 4))  # noqa: E731
    # then it is a [CARD]; with its check digit changed it is not a card
    assert redact(f"card {grouped(number)} ok", ALL).text == "card [CARD] ok"
    assert "card" not in redact(f"card {grouped(wrong)} ok", RedactionPolicy(detectors=frozenset({"card"}))).counts


@given(bban=st.text(alphabet=string.digits, min_size=18, max_size=18))
def test_any_iban_with_right_check_digits_is_redacted(bban: str) -> None:
    # given a German IBAN whose check digits are computed from its BBAN (ISO 7064 mod 97-10)
    check = 98 - int(bban + "131400") % 97  # D=13, E=14, then "00"
    iban = f"DE{check:02d}{bban}"
    assert iban_valid(iban)
    # then it is an [IBAN]; with one digit changed the check fails and it is not
    assert redact(f"to {iban}.", ALL).text == "to [IBAN]."
    changed = iban[:-1] + str((int(iban[-1]) + 1) % 10)
    assert not iban_valid(changed)
    assert "iban" not in redact(changed, RedactionPolicy(detectors=frozenset({"iban"}))).counts


@settings(max_examples=300)
@given(text=st.text(max_size=300))
def test_redaction_is_idempotent_and_never_matches_a_placeholder(text: str) -> None:
    # given any text, redacted once
    once = redact(text, ALL)
    # then redacting the result again changes nothing (no placeholder is ever a match)
    again = redact(once.text, ALL)
    assert again.text == once.text and again.counts == {}


@given(text=st.text(alphabet=string.ascii_letters + " ,.!?'()\n", max_size=400))
def test_text_without_digits_or_at_signs_or_assignments_is_unchanged(text: str) -> None:
    # given words and punctuation only (no digit, '@', ':' or '='): nothing a detector looks for can be there
    assert redact(text, ALL).text == text


def test_counts_are_per_detector_and_placeholders_typed() -> None:
    text = "a@b.io, c@d.io, +44 20 7946 0958, 4111111111111111, sk-" + "A" * 30
    out = redact(text, ALL)
    assert out.counts == {"email": 2, "phone": 1, "card": 1, "secret": 1}
    assert out.text == "[EMAIL], [EMAIL], [PHONE], [CARD], [SECRET]"
    assert set(PLACEHOLDERS) == set(DETECTORS) | {"custom"}


def test_custom_patterns_and_disabled_policy() -> None:
    policy = RedactionPolicy(detectors=frozenset(), custom=compile_custom([r"\bPRJ-\d{4}\b"]))
    assert redact("see PRJ-1234 and PRJ-12", policy).text == "see [CUSTOM] and PRJ-12"
    assert redact("see PRJ-1234 and a@b.io", OFF).text == "see PRJ-1234 and a@b.io"
    with pytest.raises(ValueError, match="empty string"):
        compile_custom([r"x*"])


def test_tenant_override_replaces_only_the_keys_it_sets() -> None:
    # given defaults with a custom pattern, and one tenant that keeps only secrets, another that turns it off
    settings = RedactionSettings(
        custom_patterns=[r"\bPRJ-\d{4}\b"], tenants={"acme": {"detectors": ["secret"]}, "lab": {"enabled": False}}
    )
    text = "a@b.io PRJ-1234 sk-" + "A" * 30
    # then each tenant gets its own policy; unset keys inherit the defaults
    assert redact(text, redaction_policy(settings, "other")).text == "[EMAIL] [CUSTOM] [SECRET]"
    assert redact(text, redaction_policy(settings, "acme")).text == "a@b.io [CUSTOM] [SECRET]"
    assert redact(text, redaction_policy(settings, "lab")).text == text


def test_a_bad_pattern_stops_the_start_naming_its_key() -> None:
    with pytest.raises(ConfigError, match=r"redaction\.custom_patterns.*not a valid regular expression"):
        load_settings(redaction={"custom_patterns": ["(unclosed"]})
    with pytest.raises(ConfigError, match=r"redaction\.tenants\.acme\.detectors"):
        load_settings(redaction={"tenants": {"acme": {"detectors": ["dna"]}}})


def test_checksums() -> None:
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")
    assert iban_valid("GB82 WEST 1234 5698 7654 32") and not iban_valid("GB82 WEST 1234 5698 7654 33")
    assert not iban_valid("DE89") and not re.search(r"\d", "".join(PLACEHOLDERS.values()))
