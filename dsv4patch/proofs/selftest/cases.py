"""Which engines run, and with which prompt sets: the self-test's cases.

Why these: each prompt set is there for a path the fixes touch (the
batch-shape notes are the old harness's, measured on the H200 in issue 15):

* ``trio_b3``: three prompts of 9-12 tokens (longer than 1 + k, so each is a
  prefill), ``max_tokens`` 40, 32, 24: the first decode steps have exactly
  three requests running, which vLLM 0.26.0 pads to a CUDA-graph batch of
  four with a ``seq_len == 0`` slot; under MTP 1 that is fix 6's -1 context
  length, and on SM120's top-k route it is the one shape where
  ``persistent_topk`` splits a row over two CTAs (8 rows of 16,384), so
  stock hangs at its first decode step (fix 7; docs/selftest.md);
* ``short_b5``: five short prompts with staggered ``max_tokens``: the batch
  drains 5 -> 1, so decode steps are padded to a CUDA-graph size with
  ``seq_len == 0`` slots; under MTP that is fix 6's -1 context length;
* ``mid_b24``: 24 prompts of 9-14 tokens (longer than 1 + k, so none is
  scheduled as a decode), draining from 24: more than 32 indexer rows, then
  fewer (``persistent_topk``'s paths, and SM120's route with the diagnostic);
* ``long_b3``: 2300, 1500 and 700 tokens: mixed lengths, several 256-token KV
  blocks and C4 rows beyond the indexer's top-k of 512, draining;
* ``short_b1`` and ``long_b1``: one request each.

Every set generates up to 300 tokens: past the 128-token sliding window and
a 256-token KV block for the short prompts.  One engine per method (plain,
MTP 1-3, DSpark 5), CUDA graphs on; a case is (engine, prompt set), named
``ENGINE/SET``.  ``--force-sm120-topk`` adds the ``mtp1-sm120topk`` engine:
MTP 1 with the indexer's decode top-k routed as vLLM 0.26.0 routes it on
SM120 GPUs (what the old harness called ``-tk120``), so padded MTP steps
reach ``persistent_topk`` with <= 32 rows on any GPU: stock hangs there.
"""

from __future__ import annotations

from dsv4patch.errors import ParameterError, param
from dsv4patch.records import frozen


@frozen
class Engine:
    """One vLLM engine configuration (one child process)."""

    name: str
    method: str  # "plain", "mtp" or "dspark"
    k: int = 0  # speculative tokens
    sm120_topk: bool = False  # diagnostic: SM120's decode top-k route

    def speculative_config(self) -> dict[str, object] | None:
        if self.method == "plain":
            return None
        return {"method": self.method, "num_speculative_tokens": self.k}

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "method": self.method, "k": self.k, "sm120_topk": self.sm120_topk}


@frozen
class PromptSet:
    """One generate() call: prompts (token ids) and max_tokens per request."""

    name: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: tuple[int, ...]

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "prompts": [list(p) for p in self.prompts], "max_tokens": list(self.max_tokens)}


@frozen
class Case:
    engine: Engine
    prompts: PromptSet

    @property
    def name(self) -> str:
        return f"{self.engine.name}/{self.prompts.name}"


def _prompt(length: int, seed: int, vocab: int = 1000) -> tuple[int, ...]:
    """Deterministic token ids in [2, vocab) (0 = bos, 1 = eos avoided; below the noise token)."""
    x = seed * 2654435761 % 2**32
    out = []
    for _ in range(length):
        x = (1103515245 * x + 12345) % 2**31
        out.append(2 + x % (vocab - 2))
    return tuple(out)


def prompt_sets(long_len: int = 2300) -> list[PromptSet]:
    """The prompt sets, most telling first (a hang or crash ends the engine's later sets)."""
    short = [_prompt(n, s) for n, s in [(4, 1), (3, 2), (7, 3), (5, 4), (6, 5)]]
    longs = [_prompt(n, s) for n, s in [(long_len, 11), (1500, 12), (700, 13)]]
    mid = [_prompt(9 + i % 6, 100 + i) for i in range(24)]
    trio = [_prompt(n, s) for n, s in [(9, 21), (11, 22), (12, 23)]]
    return [
        PromptSet("trio_b3", tuple(trio), (40, 32, 24)),
        PromptSet("short_b5", tuple(short), (300, 260, 200, 150, 90)),
        PromptSet("mid_b24", tuple(mid), tuple(300 - 10 * i for i in range(24))),
        PromptSet("long_b3", tuple(longs), (200, 150, 100)),
        PromptSet("short_b1", tuple(short[:1]), (300,)),
        PromptSet("long_b1", tuple(longs[:1]), (200,)),
    ]


ENGINES = (
    Engine("plain", "plain"),
    Engine("mtp1", "mtp", 1),
    Engine("mtp2", "mtp", 2),
    Engine("mtp3", "mtp", 3),
    Engine("dspark5", "dspark", 5),
)
SM120_ENGINE = Engine("mtp1-sm120topk", "mtp", 1, sm120_topk=True)
# the sets that reach fix 6/7 on SM120's route: three requests decoding (trio_b3 at its first decode step;
# issue 15's runs 5-10 hung stock on mid_b24 and long_b3, which drain through three)
SM120_SETS = ("trio_b3", "short_b5", "mid_b24", "long_b3")


def all_cases(force_sm120_topk: bool = False) -> list[Case]:
    sets = prompt_sets()
    cases = [Case(e, s) for e in ENGINES for s in sets]
    if force_sm120_topk:
        # first among the speculative engines: it is the one expected to hang on stock
        cases = [Case(SM120_ENGINE, s) for s in sets if s.name in SM120_SETS] + cases
    return cases


def select(cases: list[Case], patterns: list[str] | None) -> list[Case]:
    """The cases PATTERNS name: ``ENGINE/SET``, ``ENGINE`` (all its sets) or ``*/SET``; all when None.

    The order stays the run order of :func:`all_cases`; an unknown pattern is a usage error
    that lists what is known.
    """
    if not patterns:
        return cases
    chosen: set[str] = set()
    for pat in patterns:
        engine, _, pset = pat.partition("/")
        hit = [c.name for c in cases
               if (engine in ("*", "") or c.engine.name == engine) and (not pset or pset in ("*", c.prompts.name))]
        if not hit:
            engines = sorted({c.engine.name for c in cases})
            sets = sorted({c.prompts.name for c in cases})
            raise ParameterError(f"{param('cases')} {pat!r}: no such case; engines: {', '.join(engines)}; "
                                 f"prompt sets: {', '.join(sets)} (ENGINE, ENGINE/SET or */SET; the sm120 engine "
                                 f"needs {param('force_sm120_topk')})")
        chosen.update(hit)
    return [c for c in cases if c.name in chosen]
