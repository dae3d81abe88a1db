"""The agent's answer to a selected config it cannot use: serve the last good one (at start) or
keep the running one (on reload), and say so where operators look (log, metric, one Event per
distinct problem; the node label follows `failure`). A good config is recorded on the node as
the last good one, so a restart into bad input never takes the node to 0 GPUs."""

from __future__ import annotations

import logging
from pathlib import Path

from gpukit.contracts.plugin_config import ConfigError

from . import last_good
from .config_source import ConfigSource, LoadedConfig
from .metrics import PluginMetrics
from .node_api import NodeClient

log = logging.getLogger(__name__)


class ConfigKeeper:
    def __init__(self, source: ConfigSource, metrics: PluginMetrics,
                 node_client: NodeClient | None, last_good_file: str | None) -> None:
        self.source = source
        self.metrics = metrics
        self.node_client = node_client
        self.last_good_file = last_good_file
        # Why the selected config is refused while an older one is served; None when fine.
        self.failure: str | None = None
        self._reported: str | None = None

    def last_good_or_raise(self, exc: ConfigError) -> LoadedConfig:
        """Starting into an invalid selected config: serve the last good one, or fail."""
        path = self.last_good_file
        record = last_good.load(path) if path else None
        if record is None:
            raise exc
        try:
            loaded = self.source.resolve(record.document, record.name,
                                         Path(record.path) if record.path else None)
        except ConfigError as again:  # e.g. written by an older agent with other rules
            log.error("the last good config record %s no longer validates: %s", path, again)
            raise exc from again
        self.refused(exc, f"serving the last good {record.describe()}")
        return loaded

    def refused(self, exc: ConfigError, instead: str) -> None:
        """Say it where operators look: log, metric, node label (at the next label update)
        and one Event per distinct problem on the node."""
        self.failure = str(exc)
        self.metrics.set_config_failed(True)
        self.metrics.errors.labels(kind="config").inc()
        log.error("selected config refused, %s: %s", instead, exc)
        node = self.source.node_name
        if self.node_client is None or not node or self._reported == str(exc):
            return
        try:
            self.node_client.event(node, "DevicePluginConfigRefused",
                                   f"gpukit node agent: {exc}; {instead}")
            self._reported = str(exc)
        except Exception as err:  # reporting must not take the node's GPUs down with it
            log.error("cannot record an Event on node %s: %s", node, err)

    def accepted(self, loaded: LoadedConfig) -> None:
        if self.failure is not None:
            log.info("selected config accepted again")
        self.failure = None
        self._reported = None
        self.metrics.set_config_failed(False)
        path = self.last_good_file
        if not path:
            return
        try:
            last_good.save(path, last_good.LastGood(
                loaded.name, str(loaded.path) if loaded.path else "", loaded.document))
        except OSError as exc:
            log.error("cannot record the last good config in %s: %s", path, exc)
            self.metrics.errors.labels(kind="state").inc()
