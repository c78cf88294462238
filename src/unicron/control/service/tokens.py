"""The bearer tokens signed with the cluster secret (``control/store/secret.py``).

A token is a JWT (HS256) naming a role and a subject and, when asked, an expiry; the coordinator
checks its signature on every call and keeps no table of tokens. Rotating the secret (delete the
file, restart) revokes every token at once; `unicron token revoke` takes back one
(``control/service/revocation.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass

import jwt

from unicron.core.access import Principal, Role
from unicron.core.errors import UsageError
from unicron.core.names import check_name

ALGORITHM = "HS256"


def issue(secret: bytes, role: Role, subject: str, ttl_s: float | None = None) -> str:
    """A token for ``role`` naming ``subject`` (for an agent: its node), valid for ``ttl_s``
    seconds or until the secret is rotated."""
    check_name(subject, "subject")
    now = int(time.time())
    claims: dict[str, str | int] = {"role": role.value, "sub": subject, "iat": now, "jti": uuid.uuid4().hex}
    if ttl_s is not None:
        if ttl_s <= 0:
            raise UsageError(f"--ttl must be positive, got {ttl_s:g}")
        claims["exp"] = now + int(ttl_s)
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


@dataclass(frozen=True)
class Verified:
    """What a token this secret signed says: who, its id (for revocation) and its expiry."""

    principal: Principal
    jti: str | None
    expires: float | None  # Unix time; None: until the secret is rotated


def verified(secret: bytes, token: str) -> Verified | None:
    """The claims of a token this secret signed, or None (forged, altered, expired, or of an
    unknown role). Revocation is the caller's check: it changes while the claims do not."""
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options={"require": ["role", "sub"]})
        expires = claims.get("exp")
        jti = claims.get("jti")
        return Verified(
            Principal(Role(claims["role"]), str(claims["sub"])),
            str(jti) if jti is not None else None,
            float(expires) if expires is not None else None,
        )
    except (jwt.PyJWTError, ValueError, TypeError):
        return None


def verify(secret: bytes, token: str, revoked: Collection[str] = frozenset()) -> Principal | None:
    """The principal a token names, or None if it is not one this secret signed (forged,
    altered, expired, or of an unknown role) or its id is among the ``revoked``."""
    found = verified(secret, token)
    if found is None or found.jti in revoked:
        return None
    return found.principal


def token_id(secret: bytes, token: str) -> dict[str, str]:
    """A token's id, role and subject, if this secret signed it (expired or not)."""
    try:
        claims = jwt.decode(
            token, secret, algorithms=[ALGORITHM], options={"require": ["jti"], "verify_exp": False}
        )
        return {"jti": str(claims["jti"]), "role": str(claims.get("role")), "sub": str(claims.get("sub"))}
    except jwt.PyJWTError:
        raise UsageError(
            "that token was not issued with this cluster secret (or is not a token): check --state-dir "
            "and --token-file, or pass --id"
        ) from None


def unverified_id(token: str) -> dict[str, str]:
    """A token's id, role and subject, read without its signature checked (the coordinator's
    secret is not at hand; revoking an id that is no token does no harm)."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False, "require": ["jti"]})
    except jwt.PyJWTError:
        raise UsageError("that is not a token with an id: pass --id, as `token create` printed it") from None
    return {"jti": str(claims["jti"]), "role": str(claims.get("role")), "sub": str(claims.get("sub"))}
