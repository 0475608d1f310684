"""Failed logins limited per user name and per client address, on the team server (MLflow's ``authorization_function``).

MLflow's basic auth checks every password it is sent (about 0.1 s of the server's CPU: its scrypt hash), so a guesser
costs the server, and every logged-in user, as much as it sends. :func:`authenticate` (configured by
:func:`rlhf_lab.server.auth.write_auth_config`) delegates to MLflow's check and counts the refused logins of each
user name and client address: past :data:`MAX_USER_FAILURES` of a name, or :data:`MAX_ADDRESS_FAILURES` from an
address, within :data:`WINDOW_S` seconds, it answers 429 with ``Retry-After`` without checking the password.

A login this process verified before (kept as an HMAC under a per-process key) is never held back, so a logged-in
user goes on working while someone guesses her password. The counts live in each server worker process: with 2
workers a guesser gets at most twice the limits. The client address is the TCP peer's (no proxy in front).
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import hmac
import math
import secrets
import threading
import time

MAX_USER_FAILURES = 5  # refused logins of one user name ...
MAX_ADDRESS_FAILURES = 20  # ... or from one client address ...
WINDOW_S = 300.0  # ... within this many seconds: that name / address waits (HTTP 429)
KNOWN_TTL_S = 86400.0  # a login verified once passes the limits for this long (the password is still checked)
MAX_KEYS = 100_000  # names and addresses tracked at most (the oldest forgotten first)

# the client address of the request being served, set by the ASGI wrapper (rlhf_lab.server.guard) where MLflow's
# bridge to FastAPI's routes builds a Flask request without one
CLIENT_ADDRESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("rlhf_lab_client_address", default=None)


class LoginLimiter:
    """Refused logins per key (``user:NAME``, ``addr:ADDRESS``) in a sliding window, and the logins verified before."""

    def __init__(self, clock=time.monotonic, limits: dict[str, int] | None = None, window_s: float = WINDOW_S):
        self.clock = clock
        self.limits = limits or {"user": MAX_USER_FAILURES, "addr": MAX_ADDRESS_FAILURES}
        self.window_s = window_s
        self.failures: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self.known: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self.key = secrets.token_bytes(32)
        self.lock = threading.Lock()

    def digest(self, user: str, password: str) -> bytes:
        return hmac.new(self.key, f"{user}\0{password}".encode(), hashlib.sha256).digest()

    def is_known(self, user: str, password: str) -> bool:
        """Whether this name and password were verified within :data:`KNOWN_TTL_S`."""
        with self.lock:
            seen = self.known.get(self.digest(user, password))
        return seen is not None and self.clock() - seen < KNOWN_TTL_S

    def remember(self, user: str, password: str) -> None:
        digest = self.digest(user, password)
        with self.lock:
            self.known[digest] = self.clock()
            self.known.move_to_end(digest)
            while len(self.known) > MAX_KEYS:
                self.known.popitem(last=False)

    def retry_after(self, *keys: str) -> int:
        """Seconds until each of `keys` is under its limit again (0: none is at it)."""
        now, wait = self.clock(), 0.0
        with self.lock:
            for key in keys:
                times = self.failures.get(key)
                if not times:
                    continue
                while times and now - times[0] >= self.window_s:
                    times.popleft()
                if len(times) >= self.limits[key.split(":", 1)[0]]:
                    wait = max(wait, self.window_s - (now - times[-self.limits[key.split(":", 1)[0]]]))
        return math.ceil(wait) if wait > 0 else 0

    def failed(self, *keys: str) -> None:
        now = self.clock()
        with self.lock:
            for key in keys:
                times = self.failures.setdefault(key, collections.deque())
                times.append(now)
                while len(times) > self.limits[key.split(":", 1)[0]]:
                    times.popleft()
                self.failures.move_to_end(key)
            while len(self.failures) > MAX_KEYS:
                self.failures.popitem(last=False)


LIMITER = LoginLimiter()


def too_many(seconds: int):
    """MLflow's answer to a held-back login: 429, ``Retry-After``, one line saying why."""
    from flask import Response

    return Response(f"Too many failed logins for this user or from this address: retry in {seconds} s\n", 429,
                    {"Retry-After": str(seconds), "Content-Type": "text/plain"})


def authenticate():
    """MLflow's basic-auth check of the current Flask request, with the limits above: MLflow's ``Authorization``
    on success, its 401 response for a wrong login, or a 429 response while the name or address waits."""
    from flask import Response, request
    from mlflow.server.auth import authenticate_request_basic_auth

    auth = request.authorization
    if auth is None or not auth.username:
        return authenticate_request_basic_auth()  # no login sent: MLflow's 401 asking for one, counted as nothing
    user, password = auth.username, auth.password or ""
    keys = f"user:{user}", f"addr:{CLIENT_ADDRESS.get() or request.remote_addr or '?'}"
    known = LIMITER.is_known(user, password)
    if not known:
        wait = LIMITER.retry_after(*keys)
        if wait:
            return too_many(wait)
    result = authenticate_request_basic_auth()
    if not isinstance(result, Response):
        if not known:
            LIMITER.remember(user, password)
    elif result.status_code == 401:
        LIMITER.failed(*keys)
    return result
