"""What is done to a write before anything of it is stored (redaction, then sealing), and to a read before a caller
sees it (opening sealed facts for callers allowed to). The policies come from settings; the work is in
shared.redaction (pure detectors) and shared.crypto (AES-GCM).

- Redaction: per tenant, ``redaction`` in settings with ``redaction.tenants.<tenant>`` overriding any key. Applied to
  an episode's content, a fact's subject and content, a rule's content and a harmful mark's reason, at the front
  before the write_intents row is written (so the outbox never holds what was redacted) and again in consolidation
  for what an extractor writes. The counts per detector go to the memory's ``metadata.redactions`` and its
  ``*.stored`` audit event.
- Sealing: a fact whose base predicate is in ``encryption.predicates`` keeps a surrogate as its content
  (``[ENCRYPTED <predicate>]``: what the full-text index, the embedding and every reader without the right see) and
  its content in ``content_sealed`` (AES-GCM under ``encryption.active_key``, the key id in ``content_key_id``).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

from sqlalchemy import Connection

from shared import repository as repo
from shared.config import EncryptionSettings, RedactionSettings
from shared.consolidation_plan import Plan
from shared.crypto import Keyring, Sealed, SealError, context, decode_key
from shared.redaction import OFF, RedactionPolicy, compile_custom, merge_counts, redact
from shared.schemas import EpisodeWrite, FactWrite, Hit, RuleWrite, SealedContent, parse
from shared.tenancy import Principal
from shared.vocabulary import base_predicate

W = TypeVar("W", EpisodeWrite, FactWrite, RuleWrite)
SURROGATE_PREFIX = "[ENCRYPTED "


# Built once per (settings object, tenant): the settings live for the process (they hold lists: not hashable).
_POLICIES: dict[tuple[int, str], tuple[RedactionSettings, RedactionPolicy]] = {}
_KEYRINGS: dict[int, tuple[EncryptionSettings, Keyring | None]] = {}


def redaction_policy(settings: RedactionSettings, tenant_id: str) -> RedactionPolicy:
    """The tenant's policy: the defaults with its override's keys replacing theirs."""
    cached = _POLICIES.get((id(settings), tenant_id))
    if cached is None or cached[0] is not settings:
        if len(_POLICIES) > 4096:
            _POLICIES.clear()
        cached = _POLICIES[(id(settings), tenant_id)] = (settings, _policy(settings, tenant_id))
    return cached[1]


def _policy(settings: RedactionSettings, tenant_id: str) -> RedactionPolicy:
    override = settings.tenants.get(tenant_id)
    enabled = settings.enabled if override is None or override.enabled is None else override.enabled
    if not enabled:
        return OFF
    detectors = settings.detectors if override is None or override.detectors is None else override.detectors
    patterns = (
        settings.custom_patterns if override is None or override.custom_patterns is None else override.custom_patterns
    )
    return RedactionPolicy(enabled=True, detectors=frozenset(detectors), custom=compile_custom(patterns))


def keyring(settings: EncryptionSettings) -> Keyring | None:
    """The configured keys (None when none is configured)."""
    cached = _KEYRINGS.get(id(settings))
    if cached is None or cached[0] is not settings:
        cached = _KEYRINGS[id(settings)] = (settings, _keyring(settings))
    return cached[1]


def _keyring(settings: EncryptionSettings) -> Keyring | None:
    if not settings.keys:
        return None
    keys = {key_id: decode_key(secret.get_secret_value(), key_id=key_id) for key_id, secret in settings.keys.items()}
    return Keyring(keys, settings.active_key, settings.index_key)


def is_sealed_predicate(settings: EncryptionSettings, predicate: str) -> bool:
    return bool(settings.predicates) and base_predicate(predicate) in settings.predicates


def surrogate(predicate: str) -> str:
    """What a sealed fact's content column holds (and what is indexed and embedded)."""
    return f"{SURROGATE_PREFIX}{predicate}]"


def redact_text(text: str | None, policy: RedactionPolicy) -> str | None:
    """A free text (e.g. a harmful mark's reason) with the policy applied."""
    return None if text is None else redact(text, policy).text


def protect(write: W, *, tenant_id: str, redaction: RedactionSettings, encryption: EncryptionSettings) -> W:
    """The write as it may be stored: redacted (counts in metadata.redactions) and, for a listed predicate, sealed."""
    policy = redaction_policy(redaction, tenant_id)
    changes: dict[str, Any] = {}
    counts: list[dict[str, int]] = []
    content = redact(write.content, policy)
    changes["content"], counts = content.text, [content.counts]
    if isinstance(write, FactWrite):
        subject = redact(write.subject, policy)
        changes["subject"] = subject.text
        counts.append(subject.counts)
    total = merge_counts(counts)
    if total:
        changes["metadata"] = {
            **write.metadata,
            "redactions": merge_counts([write.metadata.get("redactions", {}), total]),
        }
    if isinstance(write, FactWrite) and write.sealed is None and is_sealed_predicate(encryption, write.predicate):
        ring = keyring(encryption)
        assert ring is not None, "settings validation requires the active key when predicates are listed"
        base = base_predicate(write.predicate)
        sealed = ring.seal(changes["content"], aad=context(tenant_id, base))
        changes["sealed"] = SealedContent(key_id=sealed.key_id, blob=base64.b64encode(sealed.blob).decode())
        changes["content"] = surrogate(base)
        if write.predicate != base:  # a set predicate carries its value's head (allergic_to_penicillin): blind it
            changes["predicate"] = (
                f"{base}_{ring.blind(write.predicate[len(base) + 1 :], aad=context(tenant_id, base))}"
            )
    # Validated again (placeholders can be longer than what they replace): the worker re-parses the payload, and a
    # write that would fail there is refused here, with the field named, before anything is written.
    return parse(type(write), {**write.model_dump(), **changes})


def redaction_counts(write: Any) -> dict[str, int]:
    """The counts protect() recorded on a write (for its audit event)."""
    return dict((getattr(write, "metadata", None) or {}).get("redactions", {}))


# --- reads ------------------------------------------------------------------------------------------------


def may_open(principal: Principal, settings: EncryptionSettings) -> bool:
    """True when this caller reads sealed facts' plaintext (readers "*", or a butler it covers)."""
    return "*" in settings.readers or any(principal.covers(b) for b in settings.readers)


def butler_may_open(butler: str, settings: EncryptionSettings) -> bool:
    """True when a block built for ``butler`` (memory_context) shows sealed facts' plaintext."""
    return "*" in settings.readers or butler in settings.readers


def open_hits(conn: Connection, *, tenant_id: str, hits: Sequence[Hit], settings: EncryptionSettings) -> list[Hit]:
    """Hits with every sealed fact's content opened (a value that does not open keeps its surrogate)."""
    ids = [h.id for h in hits if h.type == "fact" and h.content.startswith(SURROGATE_PREFIX)]
    if not ids:
        return list(hits)
    opened = open_facts(conn, tenant_id=tenant_id, ids=ids, settings=settings)
    return [
        h.model_copy(update={"content": opened[h.id], "content_tokens": None}) if h.id in opened else h for h in hits
    ]


def open_facts(
    conn: Connection, *, tenant_id: str, ids: Sequence[uuid.UUID], settings: EncryptionSettings
) -> dict[uuid.UUID, str]:
    """Plaintext of the sealed facts among ``ids`` (of this tenant only) that open with a configured key."""
    ring = keyring(settings)
    if ring is None:
        return {}
    out = {}
    for row in repo.sealed_contents(conn, tenant_id=tenant_id, ids=ids):
        try:
            out[row["id"]] = ring.open(
                Sealed(row["content_key_id"], bytes(row["content_sealed"])),
                aad=context(tenant_id, base_predicate(row["predicate"])),
            )
        except SealError:
            continue  # a retired key or a tampered value: the caller keeps the surrogate
    return out


def sealed_columns(write: FactWrite) -> dict[str, Any]:
    """The row's content_sealed / content_key_id for a (possibly) sealed write."""
    if write.sealed is None:
        return {"content_sealed": None, "content_key_id": None}
    return {"content_sealed": base64.b64decode(write.sealed.blob), "content_key_id": write.sealed.key_id}


def protect_plan(plan: Plan, *, tenant_id: str, redaction: RedactionSettings, encryption: EncryptionSettings) -> Plan:
    """A consolidation plan whose facts, rules and contradiction notes are protected like the front's writes."""

    def guard(write: W) -> W:
        return protect(write, tenant_id=tenant_id, redaction=redaction, encryption=encryption)

    policy = redaction_policy(redaction, tenant_id)
    return replace(
        plan,
        facts=tuple(replace(f, write=guard(f.write)) for f in plan.facts),
        rules=tuple(replace(r, write=guard(r.write)) for r in plan.rules),
        contradictions=tuple(
            (fact_id, sources, redact(note, policy).text) for fact_id, sources, note in plan.contradictions
        ),
    )
