"""Classified errors. Every error that crosses a boundary carries a stable ``code`` and whether a retry can help."""

from __future__ import annotations


class ButlerError(Exception):
    """Base class: ``code`` is stable and machine-readable; ``retryable`` tells a caller whether to try again."""

    code = "memory_error"
    retryable = False

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"error": self.code, "message": self.message, "retryable": self.retryable}
        if self.field:
            out["field"] = self.field
        return out


class InvalidInput(ButlerError):
    """A caller's argument broke a rule; names the field. Nothing was written."""

    code = "invalid_input"


class NotFound(ButlerError):
    code = "not_found"


class PermissionDenied(ButlerError):
    code = "permission_denied"


class IntegrityViolation(ButlerError):
    """A lifecycle or schema invariant would break: the mutation is refused (fail closed)."""

    code = "integrity_violation"


class InvalidTransition(IntegrityViolation):
    code = "invalid_transition"


class IdempotencyConflict(ButlerError):
    """The idempotency_key was already used for a different write or call: nothing was written. Use a new key."""

    code = "idempotency_conflict"


class RateLimited(ButlerError):
    """The token is over its request rate or concurrency limit: nothing was done. Retry after a short wait."""

    code = "rate_limited"
    retryable = True


class Pending(ButlerError):
    """The id was accepted but the worker has not applied it yet."""

    code = "pending"
    retryable = True


class Unavailable(ButlerError):
    """A dependency (database, broker) is down or too slow; the write was NOT accepted. Retry later."""

    code = "unavailable"
    retryable = True


class ExtractionError(ButlerError):
    """A consolidation extractor failed or returned output that does not match the schema."""

    code = "extraction_failed"
    retryable = True
