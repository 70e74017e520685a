"""Key rotation for sealed facts: every row sealed under another key than ``encryption.active_key`` is opened
with its own key and sealed again under the active one, in batches (one transaction each, keyed by id, so an
interrupted run resumes and a second run finds only what it skipped). The surrogate content, embedding and full-text vector do
not change: they never held the plaintext.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from shared.config import EncryptionSettings
from shared.crypto import Sealed, SealError, context
from shared.protection import keyring
from shared.vocabulary import base_predicate


class RotationError(Exception):
    """Rotation cannot start: no keys are configured."""


@dataclass
class Progress:
    """One committed batch: rows re-sealed, and rows left as they are because they do not open with the key of
    their id as configured (a key no longer listed, another key under the same id, or tampered bytes)."""

    rotated: int = 0
    skipped: list[uuid.UUID] = field(default_factory=list)


def stale_count(engine: Engine, *, active: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM facts WHERE content_key_id IS NOT NULL AND content_key_id <> :k"), {"k": active}
        ).scalar_one()


def rotate(engine: Engine, *, settings: EncryptionSettings, batch: int = 500) -> Iterator[Progress]:
    """Yield each committed batch's progress; a row that does not open is skipped (reported), never lost."""
    ring = keyring(settings)
    if ring is None:
        raise RotationError("no encryption keys are configured (encryption.keys)")
    after = uuid.UUID(int=0)
    while True:
        with engine.begin() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, tenant_id, predicate, content_sealed, content_key_id FROM facts WHERE id > :after "
                    "AND content_key_id IS NOT NULL AND content_key_id <> :k ORDER BY id LIMIT :n FOR UPDATE"
                ),
                {"after": after, "k": ring.active, "n": batch},
            ).all()
            if not rows:
                return
            progress, ids, blobs = Progress(), [], []
            for r in rows:
                aad = context(r.tenant_id, base_predicate(r.predicate))
                try:
                    plaintext = ring.open(Sealed(r.content_key_id, bytes(r.content_sealed)), aad=aad)
                except SealError:
                    progress.skipped.append(r.id)
                    continue
                ids.append(str(r.id))
                blobs.append(ring.seal(plaintext, aad=aad).blob)
            if ids:
                conn.execute(
                    text(
                        "UPDATE facts f SET content_sealed = b.blob, content_key_id = :k "
                        "FROM unnest(CAST(:ids AS uuid[]), CAST(:blobs AS bytea[])) AS b(id, blob) WHERE f.id = b.id"
                    ),
                    {"k": ring.active, "ids": ids, "blobs": blobs},
                )
            progress.rotated = len(ids)
            after = rows[-1].id
        yield progress
