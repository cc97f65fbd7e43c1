"""pytest plugin loaded into a patched vLLM tree's test run on a CPU-only host.

vLLM's ``tests/conftest.py`` releases accelerator memory after every test with
``torch.accelerator.empty_cache()`` (and newer vLLM ``empty_host_cache()`` at
process-group teardown), which raise on a CPU-only torch build
("Cannot access accelerator device when none is available").  The regression
tests the patches carry exercise index/metadata logic that runs on CPU tensors
(Triton kernels under ``TRITON_INTERPRET=1``), so on such a host the cleanup is
made a no-op.  Nothing else in vLLM is touched.
"""

from __future__ import annotations


def pytest_configure(config: object) -> None:
    import torch

    if torch.accelerator.is_available():
        return
    # Newer vLLM also releases pinned host memory (empty_host_cache) on teardown.
    for name in ("empty_cache", "empty_host_cache"):
        if hasattr(torch.accelerator, name):
            setattr(torch.accelerator, name, lambda *a, **k: None)
