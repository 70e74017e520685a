"""Tenants and bearer tokens against the real database: hashed at rest, scoped to butlers, revocable."""

from __future__ import annotations

import stat
import uuid

import pytest
from sqlalchemy import select

from shared import tenancy
from shared.errors import InvalidInput, PermissionDenied
from shared.models import api_tokens, tenants


def test_ensure_tenant_is_idempotent(conn):
    # given a new tenant id
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    # when it is ensured twice
    tenancy.ensure_tenant(conn, tenant_id=tenant_id)
    tenancy.ensure_tenant(conn, tenant_id=tenant_id)
    # then exactly one row exists
    count = conn.execute(select(tenants.c.id).where(tenants.c.id == tenant_id)).all()
    assert len(count) == 1


def test_ensure_tenant_rejects_a_bad_name(conn):
    with pytest.raises(InvalidInput) as err:
        tenancy.ensure_tenant(conn, tenant_id="Not Valid")
    assert err.value.field == "tenant_id"


def test_created_token_is_stored_hashed_and_resolves(conn, tenant):
    # given a butler token for two butlers
    token_id, token = tenancy.create_token(
        conn, tenant_id=tenant, name="health bot", butlers=["health", "finance"], role="butler"
    )
    # then the plaintext has the documented shape and is not stored
    assert token.startswith("mb_") and len(token) == 3 + 43
    stored = conn.execute(select(api_tokens.c.token_hash).where(api_tokens.c.id == token_id)).scalar_one()
    assert stored == tenancy.hash_token(token) and len(stored) == 64 and token not in stored
    # and resolving it yields the principal
    principal = tenancy.resolve_token(conn, token=token)
    assert principal == tenancy.Principal(
        tenant_id=tenant, butlers=("health", "finance"), role="butler", token_id=token_id
    )
    assert not principal.is_admin
    assert principal.default_butler == "health"


def test_principal_covers_only_its_butlers(conn, tenant):
    # given a token for the health butler
    _, token = tenancy.create_token(conn, tenant_id=tenant, name="h", butlers=["health"], role="butler")
    principal = tenancy.resolve_token(conn, token=token)
    # then it covers health and nothing else
    assert principal.covers("health")
    assert not principal.covers("finance")
    principal.require_butler("health")
    with pytest.raises(PermissionDenied) as err:
        principal.require_butler("finance")
    assert err.value.field == "butler" and "finance" in err.value.message


def test_star_token_covers_every_butler_and_defaults_to_memory(conn, tenant):
    _, token = tenancy.create_token(conn, tenant_id=tenant, name="ops", butlers=["*"], role="admin")
    principal = tenancy.resolve_token(conn, token=token)
    assert principal.is_admin
    assert principal.covers("anything") and principal.covers("health")
    assert principal.default_butler == "memory"


@pytest.mark.parametrize(
    "butlers,role,field",
    [
        (["Health"], "butler", "butlers"),
        (["ok", "bad name"], "butler", "butlers"),
        ([], "butler", "butlers"),
        (["*", "health"], "butler", "butlers"),
        (["health"], "root", "role"),
    ],
)
def test_create_token_validates_its_input(conn, tenant, butlers, role, field):
    with pytest.raises(InvalidInput) as err:
        tenancy.create_token(conn, tenant_id=tenant, name="x", butlers=butlers, role=role)
    assert err.value.field == field


def test_unknown_and_revoked_tokens_do_not_resolve(conn, tenant):
    # given a live token
    token_id, token = tenancy.create_token(conn, tenant_id=tenant, name="h", butlers=["health"], role="butler")
    # then an unknown token does not resolve
    assert tenancy.resolve_token(conn, token="mb_" + "x" * 43) is None
    assert tenancy.resolve_token(conn, token="not-a-token") is None
    # when it is revoked (the second revoke is a no-op)
    assert tenancy.revoke_token(conn, token_id=token_id) is True
    assert tenancy.revoke_token(conn, token_id=token_id) is False
    assert tenancy.revoke_token(conn, token_id=uuid.uuid4()) is False
    # then it no longer resolves
    assert tenancy.resolve_token(conn, token=token) is None


def test_list_tokens_filters_by_tenant_and_hides_hashes(conn, tenant):
    # given tokens in two tenants, one revoked
    other = f"t-{uuid.uuid4().hex[:12]}"
    tenancy.ensure_tenant(conn, tenant_id=other)
    first, _ = tenancy.create_token(conn, tenant_id=tenant, name="a", butlers=["health"], role="butler")
    second, _ = tenancy.create_token(conn, tenant_id=tenant, name="b", butlers=["*"], role="admin")
    tenancy.create_token(conn, tenant_id=other, name="c", butlers=["health"], role="butler")
    tenancy.revoke_token(conn, token_id=first)
    # when listing one tenant
    listed = tenancy.list_tokens(conn, tenant_id=tenant)
    # then only its tokens appear, with revocation visible and no secret material
    assert {t.id for t in listed} == {first, second}
    by_id = {t.id: t for t in listed}
    assert by_id[first].revoked_at is not None and by_id[second].revoked_at is None
    assert by_id[second].butlers == ("*",) and by_id[second].role == "admin"
    assert not hasattr(by_id[first], "token_hash")
    # and the unfiltered list includes the other tenant's
    assert {t.tenant_id for t in tenancy.list_tokens(conn)} >= {tenant, other}


def test_dev_token_is_created_once_and_reused(conn, tenant, tmp_path):
    # given no token file
    token_file = tmp_path / "dev-token"
    # when the dev token is ensured twice
    token = tenancy.ensure_dev_token(conn, tenant_id=tenant, token_file=token_file)
    again = tenancy.ensure_dev_token(conn, tenant_id=tenant, token_file=token_file)
    # then the same admin token for every butler is returned, stored owner-only
    assert again == token
    assert token_file.read_text().strip() == token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    principal = tenancy.resolve_token(conn, token=token)
    assert principal.is_admin and principal.butlers == ("*",) and principal.tenant_id == tenant


def test_dev_token_is_replaced_when_revoked(conn, tenant, tmp_path):
    # given a dev token that was revoked
    token_file = tmp_path / "dev-token"
    token = tenancy.ensure_dev_token(conn, tenant_id=tenant, token_file=token_file)
    tenancy.revoke_token(conn, token_id=tenancy.resolve_token(conn, token=token).token_id)
    # when it is ensured again
    fresh = tenancy.ensure_dev_token(conn, tenant_id=tenant, token_file=token_file)
    # then a new, live token replaces it in the file
    assert fresh != token
    assert token_file.read_text().strip() == fresh
    assert tenancy.resolve_token(conn, token=fresh) is not None
