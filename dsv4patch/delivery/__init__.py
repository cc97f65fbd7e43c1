"""What ships: the patched vLLM wheel made from the stock one, its SBOM, the image's
build args, and checking what a node has installed against both.
"""

from __future__ import annotations
