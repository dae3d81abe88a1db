"""Who may scrape the agent's metrics (issue 30): each scrape's bearer token reviewed with a
TokenReview, then a SubjectAccessReview for get nodes/metrics on the node (as the kubelet's
/metrics); 401, 403, 503 otherwise; answers cached; unknown paths 404. A fake API answers."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpukit.plugin import cli
from gpukit.plugin.metrics import PluginMetrics
from gpukit.plugin.metrics_auth import (
    CacheSettings,
    KubernetesAuthorizer,
    ReviewApi,
    bearer_token,
    kubernetes_authorizer,
)

NODE = "gpu-t4"
PROMETHEUS = "system:serviceaccount:monitoring:prometheus"


class FakeApi:
    """token -> user; who may get nodes/metrics on which node; `fail` raises on every call."""

    def __init__(self) -> None:
        self.users: dict[str, dict[str, Any]] = {
            "prom-token": {"username": PROMETHEUS, "uid": "u-1",
                           "groups": ["system:serviceaccounts", "system:authenticated"],
                           "extra": {"authentication.kubernetes.io/node-name": ["other"]}},
            "nobody-token": {"username": "system:serviceaccount:default:nobody",
                             "groups": ["system:authenticated"]},
        }
        self.allowed = {(PROMETHEUS, NODE)}
        self.fail: Exception | None = None
        self.token_reviews: list[Mapping[str, Any]] = []
        self.access_reviews: list[Mapping[str, Any]] = []

    def token_review(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.token_reviews.append(body)
        if self.fail is not None:
            raise self.fail
        user = self.users.get(body["spec"]["token"])
        if user is None:
            return {"status": {"authenticated": False, "error": "invalid bearer token"}}
        return {"status": {"authenticated": True, "user": user}}

    def subject_access_review(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        self.access_reviews.append(body)
        if self.fail is not None:
            raise self.fail
        spec = body["spec"]
        attrs = spec["resourceAttributes"]
        ok = (attrs["verb"] == "get" and attrs["resource"] == "nodes"
              and attrs["subresource"] == "metrics"
              and (spec["user"], attrs["name"]) in self.allowed)
        return {"status": {"allowed": ok}}

    @property
    def calls(self) -> int:
        return len(self.token_reviews) + len(self.access_reviews)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def authorizer(api: FakeApi, clock: Clock | None = None, **cache: Any) -> KubernetesAuthorizer:
    return KubernetesAuthorizer(api, NODE, CacheSettings(**cache), clock=clock or Clock())


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc  ") == "abc"
    for bad in (None, "", "Bearer", "Bearer  ", "Basic dXNlcjpwYXNz", "abc"):
        assert bearer_token(bad) is None


def test_no_or_unaccepted_token_is_401_denied_403_allowed_200() -> None:
    api = FakeApi()
    a = authorizer(api)
    assert a.authorize(None).status == 401
    assert a.authorize("Basic dXNlcjpwYXNz").status == 401
    assert api.calls == 0  # nothing to review
    assert a.authorize("Bearer forged").status == 401
    assert api.access_reviews == []  # an unaccepted token is not authorised
    denied = a.authorize("Bearer nobody-token")
    assert denied.status == 403
    assert denied.why == ("Forbidden (user=system:serviceaccount:default:nobody, verb=get, "
                          "resource=nodes, subresource=metrics, name=gpu-t4)\n")
    assert a.authorize("Bearer prom-token").allowed


def test_the_reviews_ask_what_the_kubelet_asks_for_its_metrics() -> None:
    api = FakeApi()
    assert authorizer(api).authorize("Bearer prom-token").allowed
    assert api.token_reviews == [{"apiVersion": "authentication.k8s.io/v1",
                                  "kind": "TokenReview", "spec": {"token": "prom-token"}}]
    assert api.access_reviews == [{
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {
            "user": PROMETHEUS, "uid": "u-1",
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "extra": {"authentication.kubernetes.io/node-name": ["other"]},
            "resourceAttributes": {"verb": "get", "group": "", "resource": "nodes",
                                   "subresource": "metrics", "name": NODE},
        },
    }]
    # Allowed on another node only: refused here.
    api.allowed = {(PROMETHEUS, "gpu-a100")}
    assert authorizer(api).authorize("Bearer prom-token").status == 403


def test_answers_are_cached_60s_allowed_10s_refused() -> None:
    api, clock = FakeApi(), Clock()
    a = authorizer(api, clock)
    assert a.authorize("Bearer prom-token").allowed
    assert a.authorize("Bearer nobody-token").status == 403
    assert a.authorize("Bearer forged").status == 401
    calls = api.calls
    for _ in range(20):  # a scrape every few seconds
        clock.now += 0.4
        assert a.authorize("Bearer prom-token").allowed
        assert a.authorize("Bearer nobody-token").status == 403
        assert a.authorize("Bearer forged").status == 401
    assert api.calls == calls  # clock at +8 s: no API call
    clock.now += 2.5  # +10.5 s: the refusals are asked again, the allowed one is not
    a.authorize("Bearer prom-token")
    a.authorize("Bearer nobody-token")
    a.authorize("Bearer forged")
    assert len(api.token_reviews) == 5 and len(api.access_reviews) == 3
    # A revoked right shows once the allowed answer is 60 s old.
    api.allowed = set()
    clock.now += 49
    assert a.authorize("Bearer prom-token").allowed
    clock.now += 1
    assert a.authorize("Bearer prom-token").status == 403


def test_the_cache_is_bounded_and_keeps_no_token() -> None:
    api, clock = FakeApi(), Clock()
    api.users.update({f"t{i}": {"username": f"u{i}"} for i in range(5)})
    a = authorizer(api, clock, max_entries=3)
    for i in range(5):
        a.authorize(f"Bearer t{i}")
    assert a.cached_tokens() == 3
    assert all(len(k) == 64 for k in a._cache)  # SHA-256 hex digests, not the tokens
    calls = api.calls
    a.authorize("Bearer t4")  # recent: cached
    assert api.calls == calls
    a.authorize("Bearer t0")  # evicted: asked again
    assert api.calls > calls


def test_api_errors_are_503_not_cached_and_one_log_line(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    api, clock = FakeApi(), Clock()
    a = authorizer(api, clock)
    api.fail = ConnectionError("connection refused\nto 10.96.0.1:443")
    with caplog.at_level(logging.WARNING, logger="gpukit.plugin.metrics_auth"):
        got = a.authorize("Bearer prom-token")
        assert got.status == 503 and "Kubernetes API" in got.why
        for _ in range(5):
            clock.now += 5
            assert a.authorize("Bearer prom-token").status == 503
        clock.now += 60
        assert a.authorize("Bearer prom-token").status == 503
    lines = [r for r in caplog.records if r.name == "gpukit.plugin.metrics_auth"]
    assert len(lines) == 2  # the first, then one a minute later naming the 5 between
    assert all(r.exc_info is None for r in lines)  # no traceback
    assert lines[0].getMessage() == ("metrics scrape refused (503): reviewing its token "
                                     "failed: connection refused to 10.96.0.1:443")
    assert lines[1].getMessage().endswith("(5 more since the last line)")
    assert a.cached_tokens() == 0
    api.fail = None  # the API is back: served at once
    assert a.authorize("Bearer prom-token").allowed


def test_an_odd_review_answer_is_503_not_a_crash() -> None:
    class Odd(FakeApi):
        def token_review(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
            return {"status": {"authenticated": True, "user": {"username": "u", "extra": 7}}}

    assert authorizer(Odd()).authorize("Bearer x").status == 503


def test_without_node_name_or_api_every_scrape_is_503(caplog: pytest.LogCaptureFixture
                                                      ) -> None:
    def no_api() -> ReviewApi:
        raise RuntimeError("no Kubernetes API to connect to")

    with caplog.at_level(logging.ERROR):
        for got in (kubernetes_authorizer(None, FakeApi), kubernetes_authorizer(NODE, no_api)):
            d = got.authorize("Bearer prom-token")
            assert d.status == 503 and "--metrics-auth none" in d.why
    assert len(caplog.records) == 2
    assert isinstance(kubernetes_authorizer(NODE, FakeApi), KubernetesAuthorizer)


# -- over HTTP --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, token: str | None = None) -> tuple[int, str, Mapping[str, str]]:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


@pytest.fixture
def endpoint() -> Iterator[tuple[PluginMetrics, FakeApi, str]]:
    metrics, api = PluginMetrics(), FakeApi()
    metrics.readiness = lambda: (True, "serving")
    metrics.authorizer = KubernetesAuthorizer(api, NODE)
    port = free_port()
    metrics.serve(f"127.0.0.1:{port}")
    try:
        yield metrics, api, f"http://127.0.0.1:{port}"
    finally:
        metrics.close()


def test_the_endpoint_answers_401_403_200_and_404(endpoint: tuple[PluginMetrics, FakeApi, str]
                                                  ) -> None:
    _, api, url = endpoint
    status, body, headers = get(f"{url}/metrics")
    assert (status, body) == (401, "Unauthorized: a bearer token is required\n")
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert "gpukit_plugin" not in body
    assert get(f"{url}/metrics", "forged")[0] == 401
    status, body, _ = get(f"{url}/metrics", "nobody-token")
    assert status == 403 and body.startswith("Forbidden (user=system:serviceaccount:default")
    status, body, _ = get(f"{url}/metrics", "prom-token")
    assert status == 200 and "gpukit_plugin_config_failed" in body
    calls = api.calls
    assert get(f"{url}/metrics", "prom-token")[0] == 200
    assert api.calls == calls  # cached
    # /readyz needs no token (the kubelet's probe); other paths are 404, token or not.
    assert get(f"{url}/readyz")[:2] == (200, "ok: serving\n")
    for path in ("/", "/metrics/", "/metricsx", "/debug/pprof", "/readyz/x"):
        assert get(f"{url}{path}", "prom-token")[0] == 404, path
    assert get(f"{url}/favicon.ico")[0] == 404


def test_the_endpoint_answers_503_when_the_api_fails(endpoint: tuple[PluginMetrics, FakeApi, str]
                                                     ) -> None:
    _, api, url = endpoint
    api.fail = OSError("timed out")
    status, body, _ = get(f"{url}/metrics", "prom-token")
    assert status == 503 and "gpukit_plugin" not in body
    assert get(f"{url}/readyz")[0] == 200


def test_without_an_authorizer_anyone_scrapes(endpoint: tuple[PluginMetrics, FakeApi, str]
                                              ) -> None:
    metrics, _, url = endpoint
    metrics.authorizer = None  # --metrics-auth none
    assert get(f"{url}/metrics")[0] == 200
    assert get(f"{url}/nope")[0] == 404


# -- the flag ---------------------------------------------------------------------------------


def test_the_agent_defaults_to_kubernetes_and_env_or_flag_choose(monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    monkeypatch.delenv("GPUKIT_METRICS_AUTH", raising=False)
    assert cli.build_parser().parse_args([]).metrics_auth == "kubernetes"
    monkeypatch.setenv("GPUKIT_METRICS_AUTH", "none")
    assert cli.build_parser().parse_args([]).metrics_auth == "none"
    assert cli.build_parser().parse_args(["--metrics-auth", "kubernetes"]).metrics_auth == (
        "kubernetes")


def test_an_unknown_mode_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "gpukit.plugin", "--metrics-auth", "tls"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "GPUKIT_METRICS_AUTH": ""})
    assert proc.returncode == 2
    assert "--metrics-auth (GPUKIT_METRICS_AUTH): 'tls' is not one of kubernetes, none" in (
        proc.stderr)


def test_the_review_client_returns_the_api_s_json(monkeypatch: pytest.MonkeyPatch) -> None:
    """node_api.ReviewClient: the kubernetes client's models as the API's JSON (camelCase),
    each call with a timeout."""
    from kubernetes import client

    from gpukit.k8s import connect
    from gpukit.plugin.node_api import ReviewClient

    monkeypatch.setattr(connect, "api_client", lambda *a, **kw: client.ApiClient())
    seen: list[tuple[Any, Any]] = []

    def token_review(self: Any, body: Any, **kw: Any) -> Any:
        seen.append((body, kw))
        return client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t"),
                                    status=client.V1TokenReviewStatus(
                                        authenticated=True,
                                        user=client.V1UserInfo(username="u", uid="1")))

    def access_review(self: Any, body: Any, **kw: Any) -> Any:
        seen.append((body, kw))
        return client.V1SubjectAccessReview(
            spec=client.V1SubjectAccessReviewSpec(user="u"),
            status=client.V1SubjectAccessReviewStatus(allowed=True))

    monkeypatch.setattr(client.AuthenticationV1Api, "create_token_review", token_review)
    monkeypatch.setattr(client.AuthorizationV1Api, "create_subject_access_review",
                        access_review)
    api = ReviewClient(timeout=3)
    a = KubernetesAuthorizer(api, NODE)
    assert a.authorize("Bearer t").allowed
    assert [kw for _, kw in seen] == [{"_request_timeout": 3}] * 2
    assert seen[1][0]["spec"]["uid"] == "1"
