# ruff: noqa: E402  (Ansible's layout: documentation strings before imports)
"""gpukit.gpu.play_record: the run's results as JSON in a file, next to the normal output
(for `python -m gpukit.summary --play FILE`)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: play_record
author: gpukit
version_added: "0.1.0"
type: aggregate
short_description: Record every host's task results and the recap in a JSON file
description:
  - Keeps the normal output on the terminal and writes, at the end of the run, each task's
    result per host (changed, failed, skipped, unreachable, ignored, the message) and the
    recap counts to a file, in the layout of the C(ansible.posix.json) stdout callback.
  - C(python -m gpukit.summary --play FILE) reads it (C(make lab) prints that summary).
  - Does nothing unless O(path) is set. Nothing is written when the run is interrupted.
requirements:
  - enable it in the configuration (C(callbacks_enabled) or C(ANSIBLE_CALLBACKS_ENABLED))
options:
  path:
    description: The JSON file to write (its directory is created).
    type: path
    env:
      - name: GPUKIT_PLAY_RECORD
    ini:
      - section: callback_play_record
        key: path
"""

import datetime
import json
import os
import tempfile

from ansible.plugins.callback import CallbackBase

_MESSAGE_CHARS = 2000


def _now():
    return datetime.datetime.now(datetime.UTC).isoformat()


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpukit.gpu.play_record"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, display=None):
        super().__init__(display)
        self._plays = []
        self._tasks = {}  # task uuid -> its entry in the current play

    def _task(self, task):
        entry = self._tasks.get(task._uuid)
        if entry is None:
            if not self._plays:
                self._plays.append({"play": {"name": ""}, "tasks": []})
            entry = {"task": {"name": task.get_name(), "duration": {"start": _now()}},
                     "hosts": {}}
            self._plays[-1]["tasks"].append(entry)
            self._tasks[task._uuid] = entry
        return entry

    def v2_playbook_on_play_start(self, play):
        self._plays.append({"play": {"name": play.get_name(), "duration": {"start": _now()}},
                            "tasks": []})
        self._tasks = {}

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._tasks.pop(task._uuid, None)  # a task run again (a loop of includes) is new
        self._task(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._tasks.pop(task._uuid, None)
        self._task(task)

    def _record(self, result, **status):
        res = result._result
        message = res.get("msg") or res.get("stderr") or res.get("module_stderr") or ""
        entry = self._task(result._task)
        entry["hosts"][result._host.get_name()] = {
            "action": result._task.action,
            "changed": bool(res.get("changed")),
            "failed": bool(status.get("failed")),
            "ignored": bool(status.get("ignored")),
            "skipped": bool(status.get("skipped")),
            "unreachable": bool(status.get("unreachable")),
            "msg": str(message)[:_MESSAGE_CHARS],
        }
        entry["task"]["duration"]["end"] = _now()

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, failed=True, ignored=ignore_errors)

    def v2_runner_on_skipped(self, result):
        self._record(result, skipped=True)

    def v2_runner_on_unreachable(self, result):
        self._record(result, unreachable=True)

    def v2_playbook_on_stats(self, stats):
        path = self.get_option("path")
        if not path:
            return
        doc = {
            "plays": self._plays,
            "stats": {h: stats.summarize(h) for h in sorted(stats.processed)},
        }
        target = os.path.abspath(os.path.expanduser(path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".play_record-")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
