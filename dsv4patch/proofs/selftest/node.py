"""What the environment under test has: vLLM, torch, pytest, and each CUDA device with its free memory.

Why a probe of its own: every other decision of the self-test depends on it
and must be made before anything slow starts.  Which cases can run at all (no
GPU: the engines cannot, and the regression tests run on CPU under the Triton
interpreter), how many engines fit on the GPU at once and how much memory
each may take (:mod:`.plan`), and which message a user gets when the
environment is not one that can serve (no torch, no vLLM, no pytest).  The
probe is ``child.py --probe`` run under the environment's own interpreter: it
imports torch and reads ``torch.cuda.mem_get_info`` but never imports vLLM
(its version comes from the installed metadata), so it takes seconds.
"""

from __future__ import annotations

from typing import Any

from dsv4patch.errors import EXIT_USAGE, Dsv4Error
from dsv4patch.records import frozen
from dsv4patch.safeio import loads_json


class ProbeError(Dsv4Error):
    """The environment's interpreter could not be probed (missing, not runnable, hung, or answered nonsense).

    Exit 2, as for a bad command line: the interpreter named is not one the self-test can check.
    """

    exit_code = EXIT_USAGE
    kind = "environment"


@frozen
class Device:
    """One CUDA device as the environment's torch sees it."""

    index: int
    name: str
    capability: str
    free_bytes: int
    total_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "capability": self.capability,
                "free_bytes": self.free_bytes, "total_bytes": self.total_bytes}


@frozen
class Node:
    """The probe's answer: package versions (None: not installed) and the CUDA devices."""

    python: str
    vllm: str | None
    torch: str | None
    torch_cuda: str | None
    pytest: str | None
    devices: tuple[Device, ...]
    errors: tuple[str, ...] = ()

    @property
    def gpu(self) -> Device | None:
        """The device the engines run on (vLLM's default: the first visible one)."""
        return self.devices[0] if self.devices else None

    def describe(self) -> str:
        gpu = self.gpu
        where = (f"{gpu.name} (sm_{gpu.capability.replace('.', '')}, {gpu.free_bytes / 2**30:.1f} of "
                 f"{gpu.total_bytes / 2**30:.1f} GiB free)") if gpu is not None else "no CUDA device"
        return (f"vLLM {self.vllm or 'not installed'}, torch {self.torch or 'not installed'}"
                f"{'+cu' + self.torch_cuda if self.torch_cuda and self.torch else ''}, {where}")

    def to_json(self) -> dict[str, Any]:
        return {"python": self.python, "vllm": self.vllm, "torch": self.torch, "torch_cuda": self.torch_cuda,
                "pytest": self.pytest, "devices": [d.to_json() for d in self.devices], "errors": list(self.errors)}

    @classmethod
    def from_json(cls, data: Any) -> Node:
        """Validated: the probe runs in an environment we do not control, so its answer is untrusted."""
        if not isinstance(data, dict):
            raise ProbeError("the environment's probe did not answer a JSON object")

        def text(key: str, limit: int = 200) -> str | None:
            value = data.get(key)
            if value is None:
                return None
            if not isinstance(value, str) or len(value) > limit:
                raise ProbeError(f"the environment's probe answered a bad {key!r}")
            return value

        devices = []
        raw = data.get("devices", [])
        if not isinstance(raw, list) or len(raw) > 64:
            raise ProbeError("the environment's probe answered a bad device list")
        for d in raw:
            if not isinstance(d, dict):
                raise ProbeError("the environment's probe answered a bad device")
            try:
                dev = Device(int(d["index"]), str(d["name"])[:200], str(d["capability"])[:16],
                             int(d["free_bytes"]), int(d["total_bytes"]))
            except (KeyError, TypeError, ValueError) as exc:
                raise ProbeError(f"the environment's probe answered a bad device: {exc}") from None
            if not 0 <= dev.free_bytes <= dev.total_bytes:
                raise ProbeError("the environment's probe answered impossible memory figures")
            devices.append(dev)
        errors = data.get("errors", [])
        if not isinstance(errors, list):
            raise ProbeError("the environment's probe answered a bad error list")
        return cls(text("python", 4096) or "", text("vllm"), text("torch"), text("torch_cuda"), text("pytest"),
                   tuple(devices), tuple(str(e)[:500] for e in errors[:20]))


def parse_probe(output: str) -> Node:
    """The last JSON line of ``child.py --probe``'s output (libraries may print before it)."""
    for line in reversed(output.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return Node.from_json(loads_json(line, label="the environment probe's answer", limit=1 << 20,
                                              error=ProbeError))
    raise ProbeError("the environment's probe printed no answer")
