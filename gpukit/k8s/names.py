"""Names for the objects gpukit creates."""

from __future__ import annotations

import hashlib
import re


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label from parts: lower-case, '-' for anything else, hashed when too long."""
    text = "-".join(re.sub(r"[^a-z0-9]+", "-", p.lower()).strip("-") for p in parts if p)
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{text[: limit - 9].rstrip('-')}-{digest}"
