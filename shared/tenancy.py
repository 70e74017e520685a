"""Tenants and bearer tokens: who is calling, for which tenant, and which butlers they may act as.

A token is ``mb_`` + 43 url-safe characters, shown once at creation; the database keeps only its
sha256 hex digest, so a leaked table cannot be replayed. Functions here take a Connection and never commit.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from sqlalchemy import Connection, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert

from shared.errors import InvalidInput, PermissionDenied
from shared.models import api_tokens, tenants

TOKEN_PREFIX = "mb_"
ALL_BUTLERS = "*"
DEFAULT_BUTLER = "memory"
# butler: acts as its butlers; admin: its whole tenant (and its tenant's /metrics); operator: the fleet's /metrics
# (every tenant's gauges and the maintenance runs) and nothing else - no memory of any tenant.
ROLES = ("butler", "admin", "operator")
# The same pattern the schema's CHECK constraints use for tenant and butler names.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")

Role = Literal["butler", "admin", "operator"]


@dataclass(frozen=True)
class TokenInfo:
    """A token as an operator may see it: everything but the secret and its hash."""

    id: uuid.UUID
    tenant_id: str
    name: str
    butlers: tuple[str, ...]
    role: str
    created_at: datetime
    revoked_at: datetime | None
    expires_at: datetime | None = None


@dataclass(frozen=True)
class Principal:
    """The caller behind a token: one tenant, the butlers it may act as (``*`` = all), and its role."""

    tenant_id: str
    butlers: tuple[str, ...]
    role: str
    token_id: uuid.UUID | None
    expires_at: datetime | None = None  # the token stops working then (None: until revoked)

    def expired(self, now: datetime) -> bool:
        """True once the token's expiry has passed (a cached principal must not outlive its token)."""
        return self.expires_at is not None and self.expires_at <= now

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"

    def covers(self, butler: str) -> bool:
        """True when this principal may read and write as ``butler``."""
        return ALL_BUTLERS in self.butlers or butler in self.butlers

    @property
    def default_butler(self) -> str:
        """The butler a call acts as when it names none: the first listed, or ``memory`` for ``*``."""
        first = self.butlers[0] if self.butlers else ALL_BUTLERS
        return DEFAULT_BUTLER if first == ALL_BUTLERS else first

    def require_butler(self, butler: str) -> None:
        """Raise PermissionDenied unless this principal covers ``butler`` (fail closed)."""
        if not self.covers(butler):
            raise PermissionDenied(f"token does not cover butler {butler!r}", field="butler")


# What new_token() makes: the prefix and 43 url-safe base64 characters (32 random bytes).
TOKEN_RE = re.compile(r"mb_[A-Za-z0-9_-]{43}")


def well_formed(token: str) -> bool:
    """Whether ``token`` could be one of ours; anything else is refused before any database work."""
    return TOKEN_RE.fullmatch(token) is not None


def hash_token(token: str) -> str:
    """The stored form of a token: sha256 hex (64 characters)."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _check_name(value: str, *, field: str) -> None:
    if not NAME_RE.match(value):
        raise InvalidInput(f"{field} {value!r} must match {NAME_RE.pattern}", field=field)


def _checked_butlers(butlers: Sequence[str]) -> list[str]:
    """Deduplicated butler names in the given order; ``*`` must stand alone."""
    if isinstance(butlers, str) or not butlers:
        raise InvalidInput("butlers must be a non-empty list of butler names or ['*']", field="butlers")
    unique = list(dict.fromkeys(butlers))
    if ALL_BUTLERS in unique:
        if len(unique) > 1:
            raise InvalidInput("'*' already covers every butler; list it alone", field="butlers")
        return unique
    for butler in unique:
        _check_name(butler, field="butlers")
    return unique


def ensure_tenant(conn: Connection, *, tenant_id: str) -> None:
    """Create the tenant if it does not exist (idempotent)."""
    _check_name(tenant_id, field="tenant_id")
    conn.execute(insert(tenants).values(id=tenant_id).on_conflict_do_nothing(index_elements=["id"]))


def create_token(
    conn: Connection,
    *,
    tenant_id: str,
    name: str,
    butlers: Sequence[str],
    role: Role,
    expires_at: datetime | None = None,
) -> tuple[uuid.UUID, str]:
    """Store a new token's hash; return (token_id, plaintext). The plaintext is not recoverable later.
    With ``expires_at`` the token stops resolving at that time (checked against the database's clock)."""
    checked = _checked_butlers(butlers)
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {ROLES}, got {role!r}", field="role")
    if not 1 <= len(name) <= 200:
        raise InvalidInput("name must be 1 to 200 characters", field="name")
    _check_name(tenant_id, field="tenant_id")
    if expires_at is not None and expires_at.tzinfo is None:
        raise InvalidInput("expires_at must carry a time zone", field="expires_at")
    token_id, token = uuid.uuid4(), new_token()
    conn.execute(
        api_tokens.insert().values(
            id=token_id,
            tenant_id=tenant_id,
            name=name,
            token_hash=hash_token(token),
            butlers=checked,
            role=role,
            expires_at=expires_at,
        )
    )
    return token_id, token


def list_tokens(conn: Connection, *, tenant_id: str | None = None) -> list[TokenInfo]:
    """Every token (revoked ones included), oldest first; never the hashes."""
    query = select(
        api_tokens.c.id,
        api_tokens.c.tenant_id,
        api_tokens.c.name,
        api_tokens.c.butlers,
        api_tokens.c.role,
        api_tokens.c.created_at,
        api_tokens.c.revoked_at,
        api_tokens.c.expires_at,
    ).order_by(api_tokens.c.created_at, api_tokens.c.id)
    if tenant_id is not None:
        query = query.where(api_tokens.c.tenant_id == tenant_id)
    return [
        TokenInfo(
            id=row.id,
            tenant_id=row.tenant_id,
            name=row.name,
            butlers=tuple(row.butlers),
            role=row.role,
            created_at=row.created_at,
            revoked_at=row.revoked_at,
            expires_at=row.expires_at,
        )
        for row in conn.execute(query)
    ]


def revoke_token(conn: Connection, *, token_id: uuid.UUID) -> bool:
    """Mark the token revoked; False when it does not exist or was already revoked."""
    result = conn.execute(
        update(api_tokens)
        .where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=func.now())
        .returning(api_tokens.c.id)
    )
    return result.first() is not None


def resolve_token(conn: Connection, *, token: str) -> Principal | None:
    """The principal of a live token; None for an unknown, revoked or expired one (expiry by the database's clock)."""
    if not well_formed(token):
        return None
    row = conn.execute(
        select(
            api_tokens.c.id, api_tokens.c.tenant_id, api_tokens.c.butlers, api_tokens.c.role, api_tokens.c.expires_at
        ).where(
            api_tokens.c.token_hash == hash_token(token),
            api_tokens.c.revoked_at.is_(None),
            or_(api_tokens.c.expires_at.is_(None), api_tokens.c.expires_at > func.now()),
        )
    ).first()
    if row is None:
        return None
    return Principal(
        tenant_id=row.tenant_id, butlers=tuple(row.butlers), role=row.role, token_id=row.id, expires_at=row.expires_at
    )


def ensure_dev_token(conn: Connection, *, tenant_id: str, token_file: Path) -> str:
    """The local stack's admin token for every butler: reuse the one in ``token_file`` if it still resolves."""
    if token_file.is_file():
        existing = token_file.read_text().strip()
        principal = resolve_token(conn, token=existing)
        if principal is not None and principal.tenant_id == tenant_id:
            return existing
    _, token = create_token(conn, tenant_id=tenant_id, name="dev", butlers=[ALL_BUTLERS], role="admin")
    _write_secret(token_file, token)
    return token


def _write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` readable by the owner only, replacing any previous file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    os.replace(tmp, path)
