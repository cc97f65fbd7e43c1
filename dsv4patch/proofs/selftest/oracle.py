"""The exact oracle: what every generated token and every draft must be.

Why this exists: the model of :mod:`.model` makes greedy decoding a known
function of the prompt's last token (the successor chain), with a top-1 lead
of about ``GAIN`` nats at every position.  So there is nothing statistical
left to judge: a case passes when every request's tokens equal the chain
(plain decoding and each speculative method alike, hence speculative equals
plain token for token), the smallest measured top-1/top-2 gap is reported,
and a speculative case must show both accepted and rejected drafts.  The
expected acceptance is computed too (:func:`expected_acceptance`), from the
drafts the design makes; it is reported beside the measured one, not judged,
because how vLLM counts drafts near ``max_tokens`` is its own business.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4patch.proofs.selftest.model import DESIGN
from dsv4patch.records import frozen

if TYPE_CHECKING:
    from dsv4patch.proofs.selftest.model import Design


@frozen
class Difference:
    """The first token that is not the chain's: which request, which generated position, both tokens."""

    request: int
    position: int
    expected: int | None  # None: the engine gave more tokens than asked
    got: int | None  # None: the engine stopped early

    def to_json(self) -> dict[str, int | None]:
        return {"request": self.request, "position": self.position, "expected": self.expected, "got": self.got}

    def describe(self) -> str:
        return f"request {self.request}, token {self.position}: expected {self.expected}, got {self.got}"


def expected_tokens(prompts: list[list[int]], max_tokens: list[int], design: Design = DESIGN) -> list[list[int]]:
    """Plain greedy decoding's output for each request: the successor chain of its last prompt token."""
    return [design.chain(p[-1], n) for p, n in zip(prompts, max_tokens, strict=True)]


def first_difference(expected: list[list[int]], got: list[list[int]]) -> Difference | None:
    """The first (request, position) where GOT parts from EXPECTED, or None when equal."""
    if len(got) != len(expected):
        i = min(len(got), len(expected))
        return Difference(i, 0, expected[i][0] if i < len(expected) and expected[i] else None,
                          got[i][0] if i < len(got) and got[i] else None)
    for i, (want, have) in enumerate(zip(expected, got, strict=True)):
        for j in range(max(len(want), len(have))):
            a = want[j] if j < len(want) else None
            b = have[j] if j < len(have) else None
            if a != b:
                return Difference(i, j, a, b)
    return None


def min_gap(gaps: list[list[float]]) -> float | None:
    """The smallest top-1/top-2 logprob gap over all requests and positions (None: none measured)."""
    flat = [g for row in gaps for g in row]
    return min(flat) if flat else None


@frozen
class Acceptance:
    """Drafted and accepted draft tokens of one case (measured or expected)."""

    drafted: int
    accepted: int

    @property
    def rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def partial(self) -> bool:
        """Both accepted and rejected drafts occurred: the acceptance and the rejection paths both ran."""
        return 0 < self.accepted < self.drafted

    def to_json(self) -> dict[str, float | int | None]:
        rate = self.rate
        return {"drafted": self.drafted, "accepted": self.accepted,
                "rate": None if rate is None else round(rate, 4)}


def _drafts(method: str, k: int, last: int, design: Design) -> list[int]:
    if method == "mtp":
        out: list[int] = []
        t = last
        for _ in range(k):
            t = design.mtp_draft(t)
            out.append(t)
        return out
    if method == "dspark":
        return design.dspark_drafts(last, k)
    raise ValueError(f"no drafts for method {method!r}")


def expected_acceptance(method: str, k: int, tokens: list[list[int]], design: Design = DESIGN) -> Acceptance:
    """Drafts the design makes along each request's TOKENS, verified greedily, K per step.

    After the prompt's step has produced token 0, each step drafts K tokens
    from the last token, accepts the longest correct prefix and adds one
    target token; steps go on while tokens remain to be produced.
    """
    drafted = accepted = 0
    for seq in tokens:
        p = 0
        while p < len(seq) - 1:
            drafts = _drafts(method, k, seq[p], design)
            a = 0
            while a < k and p + 1 + a < len(seq) and drafts[a] == seq[p + 1 + a]:
                a += 1
            drafted += k
            accepted += a
            p += a + 1
    return Acceptance(drafted, accepted)
