"""dsv4patch: apply the DeepSeek-V4 sparse-MLA fixes to pinned vLLM trees."""

from __future__ import annotations

__version__ = "0.1.0"
