"""The node's labels as the agent owns them (GFD's names): written when the agent's view changes,
re-asserted every `reassert_seconds` (as GFD rewrites its labels), and restored within a tick
when a watch on the own Node sees an owned label drift. Only owned labels that differ are
patched; others are never touched. Best effort: a failure is logged and counted, the agent keeps
serving."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from .labels import label_changes, write_labels_file
from .metrics import PluginMetrics
from .node_api import NodeClient

log = logging.getLogger(__name__)


class Settings(Protocol):
    """The agent's options this reads (at each use: they may change while it runs)."""

    labels_file: str | None
    node_labels: bool
    label_reassert_seconds: float


class LabelPublisher:
    def __init__(self, metrics: PluginMetrics, node_client: NodeClient | None, node_name: str,
                 settings: Settings, on_drift: Callable[[], None] = lambda: None) -> None:
        self.metrics = metrics
        self.on_drift = on_drift  # wakes the manager loop, which restores the labels
        self.node_client = node_client
        self.node_name = node_name
        self.settings = settings
        self._last: dict[str, str] | None = None
        self._next_reassert = 0.0
        self._drifted = threading.Event()

    @property
    def enabled(self) -> bool:
        s = self.settings
        return bool(s.labels_file or (s.node_labels and self.node_client))

    def due(self, now: float) -> bool:
        """A drift was seen, or the periodic re-assertion is due (clears the drift flag)."""
        if self._drifted.is_set() or now >= self._next_reassert:
            self._drifted.clear()
            return True
        return False

    def publish(self, wanted: Callable[[], dict[str, str]], reassert: bool = False) -> None:
        """Write the labels when this agent's view changed, or (reassert) whatever the node
        now says."""
        if not self.enabled:
            return
        labels = wanted()
        if labels == self._last and not reassert:
            return
        s = self.settings
        self._next_reassert = time.monotonic() + s.label_reassert_seconds
        try:
            if s.labels_file:
                write_labels_file(labels, s.labels_file)
            if s.node_labels and self.node_client and self.node_name:
                current = self.node_client.labels(self.node_name)
                patch = label_changes(current, labels)
                if patch and reassert and labels == self._last:
                    log.warning("node %s: restoring drifted label(s) %s", self.node_name,
                                ", ".join(sorted(patch)))
                    self.metrics.labels_restored.inc(len(patch))
                self.node_client.patch_labels(self.node_name, patch)
        except Exception as exc:  # labels are best effort; the plugin keeps serving
            log.error("cannot update node labels: %s", exc)
            self.metrics.errors.labels(kind="labels").inc()
            return
        self._last = labels

    def start_watch(self, stop: threading.Event) -> None:
        watch = getattr(self.node_client, "watch_labels", None)
        if not (self.settings.node_labels and self.node_name and watch is not None):
            return
        threading.Thread(target=watch, args=(self.node_name, self._seen, stop),
                         name="gpukit-node-watch", daemon=True).start()

    def _seen(self, current: dict[str, str]) -> None:
        """From the node watch: flag drift of owned labels; the loop restores them."""
        if self._last is not None and label_changes(current, self._last):
            self._drifted.set()
            self.on_drift()
