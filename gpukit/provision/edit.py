"""What every config edit returns: the new text, what changed in words, and a diff."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Edit:
    """The result of planning a file: `before` (None: no file) and `after` (None: remove)."""

    path: str
    before: str | None
    after: str | None
    changes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def unified_diff(self) -> str:
        a = (self.before or "").splitlines(keepends=True)
        b = (self.after or "").splitlines(keepends=True)
        before = self.path if self.before is not None else "/dev/null"
        after = self.path if self.after is not None else "/dev/null"
        return "".join(difflib.unified_diff(a, b, before, after))

    def ansible_diff(self) -> dict[str, str]:
        """The `diff` return value Ansible prints with --diff."""
        return {
            "before_header": self.path,
            "after_header": self.path,
            "before": self.before or "",
            "after": self.after or "",
        }
