"""Who may see and write what: the scope contract (seed 001 §6.3) applied to a token's Principal.

Reads default to global + the token's butlers; an explicit scope is "global" or a butler the token covers;
"*" (every scope of the tenant) needs an admin token or one that covers every butler. Never another tenant:
the tenant always comes from the token.
"""

from __future__ import annotations

from shared.errors import PermissionDenied
from shared.tenancy import ALL_BUTLERS, Principal
from shared.writes import ALL, Visibility

GLOBAL = "global"
EVERY_SCOPE = "*"


def covers_all(principal: Principal) -> bool:
    return ALL_BUTLERS in principal.butlers


def default_visibility(principal: Principal) -> Visibility:
    """Global + the token's own butlers (a token for every butler sees the whole tenant)."""
    if covers_all(principal):
        return ALL
    return Visibility(scopes=(GLOBAL, *principal.butlers), butlers=tuple(principal.butlers))


def butler_visibility(butler: str) -> Visibility:
    """What one butler sees: global and its own facts/rules, its own episodes."""
    return Visibility(scopes=(GLOBAL, butler), butlers=(butler,))


def read_visibility(principal: Principal, scope: str | None) -> Visibility:
    """The visibility of a read with an optional ``scope`` argument; PermissionDenied names the field."""
    if scope is None:
        return default_visibility(principal)
    if scope == EVERY_SCOPE:
        require_admin(principal, "scope='*' (every scope of the tenant)", field="scope", also=covers_all(principal))
        return ALL
    if scope == GLOBAL:
        return Visibility(scopes=(GLOBAL,), butlers=())
    if not principal.covers(scope):
        raise PermissionDenied(f"scope: the token does not cover butler {scope!r}", field="scope")
    return butler_visibility(scope)


def require_butler(principal: Principal, butler: str, *, field: str = "butler") -> None:
    if not principal.covers(butler):
        raise PermissionDenied(f"{field}: the token does not cover butler {butler!r}", field=field)


def require_admin(principal: Principal, what: str, *, field: str | None = None, also: bool = False) -> None:
    """Fail closed unless the token has the admin role (or ``also`` grants it)."""
    if not (principal.is_admin or also):
        raise PermissionDenied(f"{what} needs an admin token", field=field)


def shard_butler(principal: Principal, scope: str) -> str:
    """The butler whose ordered shard applies a fact or rule written with ``scope``.

    A butler scope must be one the token covers and is its own shard; a global write goes to the token's
    default butler (so ``source_butler`` is the writer, and one butler's writes apply in the order accepted).
    """
    if scope == GLOBAL:
        return principal.default_butler
    require_butler(principal, scope, field="scope")
    return scope


def stats_scope(principal: Principal, scope: str | None) -> str | None:
    """memory_stats narrows to one butler; the whole tenant (None) needs admin or a token for every butler."""
    if scope is None or scope == EVERY_SCOPE:
        if principal.is_admin or covers_all(principal):
            return None
        if scope == EVERY_SCOPE:
            require_admin(principal, "scope='*' (the whole tenant)", field="scope")
        return principal.default_butler
    if scope != GLOBAL:
        require_butler(principal, scope, field="scope")
    return scope
