"""The user's checkout (``--tree``): moving it between states atomically
(:mod:`.transaction`), applying a series to it, its status, its conflict workspaces
(``apply --3way``, ``port --workspace``) and a fork's own checkout.

Every git call in it goes through :mod:`dsv4patch.guard`.
"""

from __future__ import annotations
