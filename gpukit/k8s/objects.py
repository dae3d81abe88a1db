"""Apply and delete manifests, as `kubectl apply --server-side` and `kubectl delete` do."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

FIELD_MANAGER = "gpukit"


def _resource(dyn: DynamicClient, doc: Mapping[str, Any]) -> Any:
    return dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])


def _where(doc: Mapping[str, Any]) -> tuple[str, str | None]:
    meta = doc.get("metadata") or {}
    return str(meta["name"]), meta.get("namespace")


def apply(api_client: Any, docs: Iterable[Mapping[str, Any]], *,
          field_manager: str = FIELD_MANAGER) -> list[Any]:
    """Server-side apply each object in order, taking over fields others set (as
    `--force-conflicts`); returns the objects as the API now has them."""
    dyn = DynamicClient(api_client)
    out = []
    for doc in docs:
        name, namespace = _where(doc)
        out.append(dyn.server_side_apply(
            _resource(dyn, doc), body=dict(doc), name=name, namespace=namespace,
            field_manager=field_manager, force_conflicts=True))
    return out


def delete(api_client: Any, docs: Iterable[Mapping[str, Any]], *,
           wait: float | None = None) -> list[str]:
    """Delete each object that exists (in reverse order: namespaced objects before their
    namespace); returns the `Kind/name` of those deleted. With `wait`, also waits up to that
    many seconds until they are gone (as `kubectl delete --wait`), finalizers run: a
    namespace still terminating would refuse the next apply into it."""
    dyn = DynamicClient(api_client)
    deleted = []
    for doc in reversed(list(docs)):
        name, namespace = _where(doc)
        try:
            dyn.delete(_resource(dyn, doc), name=name, namespace=namespace,
                       body={"propagationPolicy": "Foreground"})
        except ApiException as e:
            if e.status != 404:
                raise
            continue
        deleted.append(doc)
    if wait is not None:
        deadline = time.monotonic() + wait
        for doc in deleted:
            while _exists(dyn, doc):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{doc['kind']}/{_where(doc)[0]} still there after "
                                       f"{wait:.0f}s")
                time.sleep(0.5)
    return [f"{d['kind']}/{_where(d)[0]}" for d in deleted]


def _exists(dyn: DynamicClient, doc: Mapping[str, Any]) -> bool:
    name, namespace = _where(doc)
    try:
        dyn.get(_resource(dyn, doc), name=name, namespace=namespace)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def delete_if_there(delete: Callable[..., Any], name: str, namespace: str, **kwargs: Any) -> bool:
    """`delete(name, namespace, **kwargs)` (a client's delete_namespaced_*); False when the
    object was not there (404), any other API error raised."""
    try:
        delete(name, namespace, **kwargs)
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    return True
