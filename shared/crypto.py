"""Field-level encryption: AES-256-GCM with a random 96-bit nonce per value (the ``cryptography`` package).

A sealed value is ``nonce (12 bytes) || ciphertext || tag (16 bytes)``; its key id is stored beside it. The
associated data binds it to its tenant and predicate, so a sealed value copied into another tenant's row, or under
another predicate, does not open (InvalidTag) instead of leaking there.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12
KEY_BYTES = 32


class SealError(Exception):
    """A sealed value cannot be opened: unknown key id, wrong key or context, or tampered bytes."""


@dataclass(frozen=True)
class Sealed:
    key_id: str
    blob: bytes  # nonce || ciphertext || tag


def decode_key(text: str, *, key_id: str) -> bytes:
    """A base64 (standard or urlsafe) 32-byte key; ValueError naming ``key_id`` otherwise."""
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    try:
        raw = base64.urlsafe_b64decode(padded.replace("+", "-").replace("/", "_"))
    except (binascii.Error, ValueError):
        raise ValueError(f"encryption key {key_id!r} is not base64") from None
    if len(raw) != KEY_BYTES:
        raise ValueError(f"encryption key {key_id!r} must be {KEY_BYTES} bytes (got {len(raw)})")
    return raw


def new_key() -> str:
    """A fresh random key, urlsafe base64 (what `memory-butler encryption new-key` prints)."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode()


def context(tenant_id: str, predicate: str) -> bytes:
    """The associated data a fact's content is sealed under."""
    return f"memory-butler/fact/v1|{tenant_id}|{predicate}".encode()


class Keyring:
    """The configured keys by id, and the one new values are sealed with."""

    def __init__(self, keys: Mapping[str, bytes], active: str, index: str = "") -> None:
        self._aead = {key_id: AESGCM(key) for key_id, key in keys.items()}
        self.active = active
        # Blinding is keyed by a fixed key (not the active one), so the same value blinds the same way after a
        # rotation; a distinct derivation keeps its MAC apart from the key's AES use.
        self._index = hashlib.sha256(b"memory-butler/blind-index/v1|" + keys[index or active]).digest()

    def blind(self, value: str, *, aad: bytes) -> str:
        """A keyed, stable stand-in for a short value (HMAC-SHA256, 16 hex digits): equal values stay equal and
        distinct ones distinct, but the value cannot be read or guessed from it without the key."""
        return hmac.new(self._index, aad + b"|" + value.encode(), hashlib.sha256).hexdigest()[:16]

    def seal(self, plaintext: str, *, aad: bytes) -> Sealed:
        nonce = os.urandom(NONCE_BYTES)
        return Sealed(self.active, nonce + self._aead[self.active].encrypt(nonce, plaintext.encode(), aad))

    def open(self, sealed: Sealed, *, aad: bytes) -> str:
        aead = self._aead.get(sealed.key_id)
        if aead is None:
            raise SealError(f"no encryption key with id {sealed.key_id!r} is configured")
        try:
            return aead.decrypt(sealed.blob[:NONCE_BYTES], sealed.blob[NONCE_BYTES:], aad).decode()
        except InvalidTag:
            raise SealError(f"sealed value does not open with key {sealed.key_id!r} in this context") from None

    def knows(self, key_id: str) -> bool:
        return key_id in self._aead
