"""Field-level encryption (shared.crypto) and what shared.protection.protect makes of a write."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.config import ConfigError, EncryptionSettings, RedactionSettings, load_settings
from shared.crypto import Keyring, Sealed, SealError, context, decode_key, new_key
from shared.protection import keyring, protect, surrogate
from shared.schemas import EpisodeWrite, FactWrite, parse

K1, K2 = new_key(), new_key()
ENC = EncryptionSettings(predicates=["allergic_to", "medical condition"], keys={"k1": K1, "k2": K2}, active_key="k1")
RED = RedactionSettings()


def _ring(active: str = "k1") -> Keyring:
    return Keyring({"k1": decode_key(K1, key_id="k1"), "k2": decode_key(K2, key_id="k2")}, active)


@given(plaintext=st.text(max_size=2000))
def test_sealed_text_opens_to_itself_only_in_its_own_context(plaintext: str) -> None:
    ring = _ring()
    sealed = ring.seal(plaintext, aad=context("t1", "allergic_to"))
    assert sealed.key_id == "k1" and len(sealed.blob) == 12 + len(plaintext.encode()) + 16
    assert ring.open(sealed, aad=context("t1", "allergic_to")) == plaintext
    # another tenant or another predicate: refused, never a wrong plaintext
    for other in (context("t2", "allergic_to"), context("t1", "diagnosis")):
        with pytest.raises(SealError):
            ring.open(sealed, aad=other)


def test_tampered_or_unknown_key_does_not_open() -> None:
    ring = _ring()
    sealed = ring.seal("penicillin", aad=b"x")
    flipped = Sealed("k1", sealed.blob[:-1] + bytes([sealed.blob[-1] ^ 1]))
    with pytest.raises(SealError, match="does not open"):
        ring.open(flipped, aad=b"x")
    with pytest.raises(SealError, match="no encryption key"):
        ring.open(Sealed("k9", sealed.blob), aad=b"x")
    # two seals of one value differ (random nonce): equal ciphertexts tell nothing
    assert ring.seal("penicillin", aad=b"x").blob != sealed.blob


def test_a_listed_predicate_is_sealed_behind_a_surrogate() -> None:
    write = parse(
        FactWrite, {"subject": "user", "predicate": "medical condition", "content": "Type 1 diabetes, mail a@b.io"}
    )
    out = protect(write, tenant_id="t1", redaction=RED, encryption=ENC)
    # content: the surrogate; the plaintext (redacted first) is in the sealed blob under the active key
    assert out.content == surrogate("medical_condition") == "[ENCRYPTED medical_condition]"
    assert out.sealed is not None and out.sealed.key_id == "k1"
    opened = keyring(ENC).open(Sealed("k1", base64.b64decode(out.sealed.blob)), aad=context("t1", "medical_condition"))
    assert opened == "Type 1 diabetes, mail [EMAIL]" and out.metadata["redactions"] == {"email": 1}
    # and the write crosses the outbox as JSON intact (task payloads are JSON)
    assert parse(FactWrite, json.loads(json.dumps(out.model_dump(mode="json")))) == out


def test_a_set_predicates_value_is_blinded_stably() -> None:
    def stored(value: str, tenant: str = "t1", enc: EncryptionSettings = ENC) -> str:
        write = parse(FactWrite, {"subject": "user", "predicate": f"allergic_to_{value}", "content": f"x {value}"})
        return protect(write, tenant_id=tenant, redaction=RED, encryption=enc).predicate

    blinded = stored("penicillin")
    assert (
        blinded.startswith("allergic_to_") and "penicillin" not in blinded and len(blinded) == len("allergic_to_") + 16
    )
    # the same value blinds the same way (supersession by key still works), another value or tenant differently
    assert stored("penicillin") == blinded and stored("peanuts") != blinded and stored("penicillin", "t2") != blinded
    # and a rotation of the active key does not change it when index_key stays
    rotated = EncryptionSettings(predicates=ENC.predicates, keys={"k1": K1, "k2": K2}, active_key="k2", index_key="k1")
    assert stored("penicillin", enc=rotated) == blinded


def test_other_writes_are_not_sealed() -> None:
    fact = parse(FactWrite, {"subject": "user", "predicate": "lives_in", "content": "Berlin"})
    assert protect(fact, tenant_id="t1", redaction=RED, encryption=ENC) == fact
    episode = parse(EpisodeWrite, {"content": "I have diabetes", "butler": "health"})
    assert protect(episode, tenant_id="t1", redaction=RED, encryption=ENC) == episode


def test_key_settings_are_checked_at_start() -> None:
    with pytest.raises(ConfigError, match=r"encryption.*32 bytes"):
        load_settings(encryption={"keys": {"k1": base64.b64encode(b"short").decode()}})
    with pytest.raises(ConfigError, match="active_key"):
        load_settings(encryption={"predicates": ["diagnosis"], "keys": {"k1": K1}, "active_key": "k2"})
    assert load_settings(
        encryption={"predicates": ["Medical Condition"], "keys": {"k1": K1}, "active_key": "k1"}
    ).encryption.predicates == ["medical_condition"]
    assert K1 not in repr(load_settings(encryption={"keys": {"k1": K1}}))


def test_a_write_that_redaction_makes_too_long_is_refused_naming_the_field() -> None:
    from shared.errors import InvalidInput
    from shared.schemas import MAX_CONTENT

    # given content at the size limit made of SSNs (11 characters each, "[NATIONAL_ID]" is 13)
    content = ("123-45-6789 " * (MAX_CONTENT // 12))[:MAX_CONTENT].strip()
    write = parse(EpisodeWrite, {"content": content, "butler": "health"})
    # then protecting it is refused as invalid input on content, not stored to fail in the worker
    with pytest.raises(InvalidInput) as refused:
        protect(write, tenant_id="t1", redaction=RED, encryption=ENC)
    assert refused.value.field == "content"
