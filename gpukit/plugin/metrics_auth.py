"""Who may scrape the agent's metrics: each scrape's bearer token checked against the Kubernetes
API, as kube-rbac-proxy and the kubelet check theirs.

`--metrics-auth kubernetes` (the agent's default): a request for /metrics must carry
`Authorization: Bearer <token>`. The token is reviewed with a TokenReview
(authentication.k8s.io/v1, the API server's own audiences), then the user it names with a
SubjectAccessReview (authorization.k8s.io/v1) for the attributes the kubelet asks for its own
/metrics: verb `get`, resource `nodes`, subresource `metrics`, name = this node. So the
ClusterRole a Prometheus already holds to scrape kubelets (`nodes/metrics: get`) lets it scrape
the agents too, and a role may be narrowed to some nodes by name. No token, or one the API does
not accept: 401; not allowed: 403; the API unreachable or erring: 503 (one log line, repeats
summarised). Answers are cached per token (its SHA-256, never the token itself): 60 s when
allowed, 10 s when refused, 1024 tokens at most, so a scrape every few seconds costs no API call.

`--metrics-auth none`: every scrape is answered, as before. /readyz is never authenticated: the
kubelet's readinessProbe carries no token, and it says nothing but ready or not and why.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpukit.contracts.metrics_auth import AUTH_KUBERNETES as AUTH_KUBERNETES
from gpukit.contracts.metrics_auth import AUTH_NONE as AUTH_NONE
from gpukit.contracts.metrics_auth import ENV, MODES, RESOURCE, SUBRESOURCE, VERB

log = logging.getLogger(__name__)


class ReviewApi(Protocol):
    """The two reviews, as the API's JSON (gpukit.plugin.node_api.ReviewClient; a fake in
    tests). Either raises on an API error."""

    def token_review(self, body: Mapping[str, Any]) -> Mapping[str, Any]: ...

    def subject_access_review(self, body: Mapping[str, Any]) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Decision:
    """status: the HTTP status to answer with (200: serve the scrape); why: the body when not."""

    status: int
    why: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


ALLOWED = Decision(200)


class Authorizer(Protocol):
    def authorize(self, authorization: str | None) -> Decision: ...


@dataclass(frozen=True)
class CacheSettings:
    allowed_seconds: float = 60.0
    denied_seconds: float = 10.0
    max_entries: int = 1024


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for anything else."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class Unavailable:
    """Kubernetes authentication asked for but impossible here (no node name, no API client):
    every scrape is refused with 503, never served open."""

    def __init__(self, why: str) -> None:
        self.why = why

    def authorize(self, authorization: str | None) -> Decision:
        return Decision(503, f"metrics authentication unavailable: {self.why}\n")


class KubernetesAuthorizer:
    """TokenReview, then SubjectAccessReview on nodes/metrics of `node_name`; cached."""

    def __init__(self, api: ReviewApi, node_name: str, cache: CacheSettings | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 error_log_seconds: float = 60.0) -> None:
        self.api = api
        self.node_name = node_name
        self.settings = cache or CacheSettings()
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, Decision]] = OrderedDict()
        self._lock = threading.Lock()
        self._error_log_seconds = error_log_seconds
        self._last_error_log: float | None = None
        self._errors_unlogged = 0

    def authorize(self, authorization: str | None) -> Decision:
        token = bearer_token(authorization)
        if token is None:
            return Decision(401, "Unauthorized: a bearer token is required\n")
        key = hashlib.sha256(token.encode()).hexdigest()
        cached = self._cached(key)
        if cached is not None:
            return cached
        try:
            decision = self._review(token)
        except Exception as exc:  # any API or transport error: refuse, do not serve open
            self._log_error(exc)
            return Decision(503, "Service Unavailable: cannot review the token with the "
                                 "Kubernetes API\n")
        ttl = self.settings.allowed_seconds if decision.allowed else self.settings.denied_seconds
        self._store(key, decision, ttl)
        return decision

    def cached_tokens(self) -> int:
        with self._lock:
            return len(self._cache)

    def _cached(self, key: str) -> Decision | None:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is None:
                return None
            expires, decision = hit
            if expires <= now:
                del self._cache[key]
                return None
            self._cache.move_to_end(key)
            return decision

    def _store(self, key: str, decision: Decision, ttl: float) -> None:
        if ttl <= 0 or self.settings.max_entries <= 0:
            return
        now = self.clock()
        with self._lock:
            self._cache[key] = (now + ttl, decision)
            self._cache.move_to_end(key)
            # Expired entries first, then the least recently used.
            for k in [k for k, (exp, _) in self._cache.items() if exp <= now]:
                del self._cache[k]
            while len(self._cache) > self.settings.max_entries:
                self._cache.popitem(last=False)

    def _review(self, token: str) -> Decision:
        review = self.api.token_review({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token},
        })
        status = review.get("status") or {}
        user = status.get("user") or {}
        if not status.get("authenticated") or not user.get("username"):
            return Decision(401, "Unauthorized: the token was not accepted\n")
        spec: dict[str, Any] = {
            "user": user["username"],
            "groups": list(user.get("groups") or []),
            "resourceAttributes": {"verb": VERB, "group": "", "resource": RESOURCE,
                                   "subresource": SUBRESOURCE, "name": self.node_name},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = {k: list(v) for k, v in user["extra"].items()}
        access = self.api.subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec,
        })
        if (access.get("status") or {}).get("allowed"):
            return ALLOWED
        return Decision(403, f"Forbidden (user={user['username']}, verb={VERB}, "
                             f"resource={RESOURCE}, subresource={SUBRESOURCE}, "
                             f"name={self.node_name})\n")

    def _log_error(self, exc: Exception) -> None:
        """One line per failure, at most one per error_log_seconds while they go on (the next
        names how many were not logged)."""
        now = self.clock()
        with self._lock:
            if (self._last_error_log is not None
                    and now - self._last_error_log < self._error_log_seconds):
                self._errors_unlogged += 1
                return
            self._last_error_log = now
            unlogged, self._errors_unlogged = self._errors_unlogged, 0
        more = f" ({unlogged} more since the last line)" if unlogged else ""
        log.warning("metrics scrape refused (503): reviewing its token failed: %s%s",
                    _one_line(exc), more)


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def add_flag(parser: Any, env: Callable[[str], str | None]) -> None:
    """`--metrics-auth`, as the agent and the DRA plugin take it (`env`: reads GPUKIT_*)."""
    parser.add_argument(
        "--metrics-auth", default=env(ENV) or AUTH_KUBERNETES,
        help="who may scrape /metrics: kubernetes (each scrape's bearer token reviewed by the "
             "API: TokenReview, then SubjectAccessReview for get nodes/metrics on this node, as "
             "the kubelet's /metrics) or none (anyone; /readyz is always open) "
             f"[{ENV}]")


def flag_error(mode: str) -> str | None:
    """The one line refusing a `--metrics-auth` value, None when it is valid."""
    if mode in MODES:
        return None
    return (f"error: --metrics-auth ({ENV}): {mode!r} is not one of "
            f"{', '.join(MODES)}")


def for_mode(mode: str, node_name: str | None, kubeconfig: str | None) -> Authorizer | None:
    """The authorizer `--metrics-auth mode` asks for (None: every scrape is answered), the
    API reached through `kubeconfig` (None: in-cluster first)."""
    if mode != AUTH_KUBERNETES:
        return None

    def connect() -> ReviewApi:
        from .node_api import ReviewClient

        return ReviewClient(kubeconfig)

    return kubernetes_authorizer(node_name, connect)


def kubernetes_authorizer(node_name: str | None, connect: Callable[[], ReviewApi],
                          cache: CacheSettings | None = None) -> Authorizer:
    """The authorizer for `--metrics-auth kubernetes`: Unavailable (503 for every scrape, one
    error line now) without a node name or an API client."""
    if not node_name:
        why = ("no node name (--node-name / NODE_NAME) to authorise scrapes for; "
               "--metrics-auth none serves them unauthenticated")
        log.error("metrics: %s", why)
        return Unavailable(why)
    try:
        api = connect()
    except Exception as exc:
        why = (f"no Kubernetes API client: {_one_line(exc)}; "
               "--metrics-auth none serves them unauthenticated")
        log.error("metrics: %s", why)
        return Unavailable(why)
    return KubernetesAuthorizer(api, node_name, cache)
