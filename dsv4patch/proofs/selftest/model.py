"""The tiny DeepSeek-V4 of the self-test, and weights that make greedy decoding exact.

Why this exists: with random weights a tiny model's logits are nearly flat,
so greedy tokens change with batch shape and kernel choice and no exact
oracle is possible (issue 30; the old harness needed tie/noise categories).
Here the network is a fixed function of the current token, by construction:

* embeddings are one-hot (token ``t`` is ``EMBED_VALUE`` times the unit
  vector of hidden dimension ``t``; vocab 1024 <= hidden 4096), so after any
  RMSNorm the residual is ``64 * e_t`` plus whatever the layers add, and what
  they add is small against ``EMBED_VALUE`` (256) in every dimension together;
* every decoder layer's mHC (hyper-connection) parameters are constant: the
  dynamic part ``hc_*_fn`` is zero, the pre and residual mixes are uniform
  (the residual mix stays doubly stochastic, so equal streams stay equal),
  and the post mix, which scales what attention and the MoE write into the
  residual, is ``2 * sigmoid(POST_LOGIT)`` (about 1e-4).  Attention, the
  compressor, the indexer and its top-k, the MoE all run on real, non-tying
  data (the inner weights are rescaled random values, as the old harness
  did), but their output perturbs the residual far below the logit margin,
  and a NaN still propagates (NaN times 1e-4 is NaN);
* ``lm_head`` maps ``e_t`` to ``GAIN`` nats on ``successor(t)`` and 0
  elsewhere, so plain greedy decoding follows the successor map with a
  top-1/top-2 gap of about ``GAIN``.  The map sends every token into one cycle
  of ``CYCLE_LEN`` tokens, so generated tokens stay in that cycle;
* the drafts agree with the map on a chosen subset ``ACCEPT`` of the cycle
  only: the MTP layer's ``e_proj`` is a permutation that is the identity on
  ``ACCEPT`` and moves every other token on (``h_proj`` is zero), so its
  draft after ``t`` is ``successor(t)`` exactly when ``t`` is in ``ACCEPT``;
  DSpark's first draft is its anchor's successor through the shared head,
  and its Markov head (rank 64: hence ``len(ACCEPT) == 64``) adds
  ``MARKOV_GAIN`` on ``successor(prev)`` for ``prev`` in ``ACCEPT``, so later
  draft positions are right exactly after an ``ACCEPT`` token; elsewhere
  they fall on the noise token's successor, which is off the cycle.

So plain greedy output is known in advance (:func:`DESIGN.chain`), speculative
greedy output must equal it token for token, and both accepted and rejected
drafts occur (about two thirds of first drafts are accepted).

This module is loaded by file path inside the engine child (``child.py``) in
the environment under test: standard library only at import time; torch
only inside :func:`apply_oracle_weights`.
"""

from __future__ import annotations

import importlib
import json
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VOCAB_SIZE = 1024
HIDDEN_SIZE = 4096
NUM_LAYERS = 4
# One entry per backbone layer, then the MTP layer: 0 sliding window only, 4 compressed + indexer, 128.
COMPRESS_RATIOS = (0, 4, 128, 4, 0)
SLIDING_WINDOW = 128
BLOCK_SIZE = 256
INDEX_TOPK = 512
MAX_POSITION = 65536
DSPARK_BLOCK_SIZE = 5
MARKOV_RANK = 64
# Topologies the tiny model shards for (``tensor_parallel_size`` x ``pipeline_parallel_size``, vLLM 0.26.0's rules:
# :func:`shard_problems`): 64 attention and indexer heads, 8 o-groups, 8 experts and a MoE intermediate of
# 1024 (one 128-wide FP8 block per rank at TP 8), a vocabulary of 1024 (128 rows a rank), 4 layers (1 a rank at
# PP 4).
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
MAX_PIPELINE_PARALLEL_SIZE = 4
FP8_BLOCK = 128
BOS, EOS = 0, 1
NOISE_TOKEN = VOCAB_SIZE - 1

CYCLE_LEN = 96
GAIN = 20.0  # nats on the successor: lm_head entries GAIN / 64 (= 0.3125, exact in bf16)
MARKOV_GAIN = 40.0  # DSpark's Markov bias on successor(prev), prev in ACCEPT: beats the base logit GAIN
# One-hot embedding entry (exact in bf16): large against the sum of every layer's writes over
# 4096 dimensions (at the post mix, layer outputs of rms 100 add a vector of norm ~1.6).
EMBED_VALUE = 256.0
POST_LOGIT = -10.0  # mHC post mix 2 * sigmoid(-10) = 9.1e-5: what layers write into the residual
# 64 = sqrt(hidden): RMSNorm of a one-hot vector puts 64 in its dimension.
NORM_ONE_HOT = math.sqrt(HIDDEN_SIZE)


def _lcg(seed: int) -> Iterator[int]:
    x = seed % 2**31
    while True:
        x = (1103515245 * x + 12345) % 2**31
        yield x


@dataclass(frozen=True)  # not records.frozen: this module imports nothing of dsv4patch (above)
class Design:
    """The successor map and the draft agreement set (token ids), fixed by a seed."""

    cycle: tuple[int, ...]
    successor: tuple[int, ...]  # successor[t] for every token id
    accept: frozenset[int]  # the cycle tokens on which the drafts agree with the map
    accept_index: tuple[tuple[int, int], ...]  # (token, Markov rank slot), for the DSpark head

    @classmethod
    def make(cls, seed: int = 30) -> Design:
        """Deterministic: the same design in the parent, the child and the tests."""
        rnd = _lcg(seed)
        pool = list(range(2, NOISE_TOKEN))  # never BOS, EOS or the DSpark noise token
        for i in range(len(pool) - 1, 0, -1):  # Fisher-Yates with the LCG
            j = next(rnd) % (i + 1)
            pool[i], pool[j] = pool[j], pool[i]
        cycle = tuple(pool[:CYCLE_LEN])
        off = pool[CYCLE_LEN:]
        succ = [0] * VOCAB_SIZE
        for i, t in enumerate(cycle):
            succ[t] = cycle[(i + 1) % CYCLE_LEN]
        for t in [BOS, EOS, *off]:
            succ[t] = cycle[next(rnd) % CYCLE_LEN]
        # the noise token's successor is off the cycle: a DSpark draft made from noise alone is wrong
        succ[NOISE_TOKEN] = off[0]
        order = list(cycle)
        for i in range(len(order) - 1, 0, -1):
            j = next(rnd) % (i + 1)
            order[i], order[j] = order[j], order[i]
        accept = sorted(order[:MARKOV_RANK])
        return cls(cycle=cycle, successor=tuple(succ), accept=frozenset(accept),
                   accept_index=tuple((t, i) for i, t in enumerate(accept)))

    def chain(self, last: int, n: int) -> list[int]:
        """Plain greedy decoding's N tokens after a prompt that ends with LAST."""
        out: list[int] = []
        t = last
        for _ in range(n):
            t = self.successor[t]
            out.append(t)
        return out

    def mtp_shift(self, t: int) -> int:
        """The token the MTP layer's ``e_proj`` maps ``t`` to: ``t`` on ACCEPT, else its successor."""
        return t if t in self.accept else self.successor[t]

    def mtp_draft(self, t: int) -> int:
        """The MTP draft after input token ``t``."""
        return self.successor[self.mtp_shift(t)]

    def dspark_drafts(self, anchor: int, k: int) -> list[int]:
        """DSpark's K drafts after ANCHOR: its successor, then successor(prev) only after ACCEPT tokens."""
        out = [self.successor[anchor]]
        noise = self.successor[NOISE_TOKEN]
        for _ in range(k - 1):
            prev = out[-1]
            out.append(self.successor[prev] if prev in self.accept else noise)
        return out


DESIGN = Design.make()


def tiny_config() -> dict[str, Any]:
    """config.json: DeepSeek-V4-Flash's attention shapes with 4 layers and 8 experts.

    Its shapes shard for every topology of ``TENSOR_PARALLEL_SIZES`` x
    ``1..MAX_PIPELINE_PARALLEL_SIZE`` (:func:`shard_problems`).

    The values and the vLLM 0.26.0 constraints behind them are the old
    harness's (its ``make_tiny_dsv4.py``, at commit 270cbd89fb01, documents
    each one):
    head_dim 512 = 448 + 64 (FlashMLA), block-FP8 128x128 linears, hc_mult *
    hidden divisible by 4096 (mHC TileLang), one compress ratio per layer plus
    the MTP layer, Flash's indexer (64 heads x 128, top-k 512), window 128.
    The sections keep config.json's key order.
    """
    return {**_config_model(), **_config_attention(), **_config_layers(), **_config_drafts()}


def _config_model() -> dict[str, Any]:
    """The model's kind, tokens and size."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "torch_dtype": "bfloat16",
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "tie_word_embeddings": False,
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": NUM_LAYERS,
    }


def _config_attention() -> dict[str, Any]:
    """Flash's sparse MLA: heads, LoRA ranks, window, compress ratios, rope, the indexer."""
    return {
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "q_lora_rank": 1024,
        "o_lora_rank": 1024,
        "o_groups": 8,
        "sliding_window": SLIDING_WINDOW,
        "compress_ratios": list(COMPRESS_RATIOS),
        "compress_rope_theta": 160000.0,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 16.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": MAX_POSITION,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": INDEX_TOPK,
    }


def _config_layers() -> dict[str, Any]:
    """The hyper-connections, norms, the experts and their FP8 quantization."""
    return {
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "swiglu_limit": 10.0,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 1024,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "num_hash_layers": 1,
        "expert_dtype": "fp8",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                "weight_block_size": [128, 128]},
    }


def _config_drafts() -> dict[str, Any]:
    """The drafts: the MTP layer and DSpark's target layers, Markov rank, noise token and block."""
    return {
        "num_nextn_predict_layers": 1,
        "n_mtp_layers": 1,
        "dspark_target_layer_ids": [1, 2, 3],
        "dspark_markov_rank": MARKOV_RANK,
        "dspark_noise_token_id": NOISE_TOKEN,
        "dspark_block_size": DSPARK_BLOCK_SIZE,
    }


def shard_problems(tensor_parallel_size: int, pipeline_parallel_size: int,
                   config: dict[str, Any] | None = None) -> list[str]:
    """Why CONFIG (the tiny model's by default) does not shard for this topology under vLLM 0.26.0 (empty: it does).

    The rules are the ones vLLM 0.26.0's DeepSeek-V4 applies when it builds a
    rank's modules (paths under ``vllm/``): attention heads split evenly
    (``models/deepseek_v4/attention.py:174``) and so do the o-projection groups
    (``:181-182``, a floor division); the column/row-parallel FP8 linears
    ``wq_b``, ``wo_a`` and ``wo_b`` split in whole 128-wide blocks; the routed
    experts split evenly over the TP ranks (``models/deepseek_v4/nvidia/model.py:662``)
    and each expert's intermediate in whole FP8 blocks
    (``model_executor/layers/quantization/fp8.py:562``; the shared experts are
    padded by vLLM itself, ``nvidia/model.py:104-108``); the vocabulary rows
    of the embeddings, heads and the Markov head split evenly; the layers
    split over the PP ranks by ``distributed/utils.py:get_pp_indices``, each
    rank at least one.
    """
    cfg = tiny_config() if config is None else config
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    out: list[str] = []
    if tp < 1 or pp < 1:
        return [f"tensor x pipeline parallel {tp} x {pp}: both must be at least 1"]

    def split(what: str, n: int, by: int, block: int = 1) -> None:
        if n % by or (n // by) % block:
            unit = f" in whole {block}-wide FP8 blocks" if block > 1 else ""
            out.append(f"{what} ({n}) does not split over {by} rank(s){unit}")

    heads, groups = int(cfg["num_attention_heads"]), int(cfg["o_groups"])
    split("attention heads", heads, tp)
    split("o-projection groups", groups, tp)
    split("wq_b's output (heads x head_dim)", heads * int(cfg["head_dim"]), tp, FP8_BLOCK)
    split("wo_a's output / wo_b's input (groups x o_lora_rank)", groups * int(cfg["o_lora_rank"]), tp, FP8_BLOCK)
    split("routed experts", int(cfg["n_routed_experts"]), tp)
    split("the experts' intermediate size", int(cfg["moe_intermediate_size"]), tp, FP8_BLOCK)
    split("vocabulary rows", int(cfg["vocab_size"]), tp)
    layers = int(cfg["num_hidden_layers"])
    if layers < pp:
        out.append(f"{layers} layer(s) cannot give each of {pp} pipeline rank(s) one")
    return out


def write_model(outdir: Path) -> Path:
    """Write config.json and generation_config.json (no weights: the child's loader makes them)."""
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "config.json").write_text(json.dumps(tiny_config(), indent=2, sort_keys=True) + "\n")
    (outdir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS}, indent=2) + "\n")
    return outdir


# ---------------------------------------------------------------------------
# The matrices (plain lists of (row, column, value) entries: the tests check them without torch)


def lm_head_entries(design: Design = DESIGN) -> list[tuple[int, int, float]]:
    """lm_head / the MTP head: row successor(t), column t, GAIN / 64, for every token t."""
    return [(design.successor[t], t, GAIN / NORM_ONE_HOT) for t in range(VOCAB_SIZE)]


def e_proj_entries(design: Design = DESIGN) -> list[tuple[int, int, float]]:
    """The MTP layer's e_proj ([out, in]): 1.0 at (mtp_shift(t), t); a permutation on the vocab's dims."""
    return [(design.mtp_shift(t), t, 1.0) for t in range(VOCAB_SIZE)]


def markov_entries(design: Design = DESIGN) -> tuple[list[tuple[int, int, float]], list[tuple[int, int, float]]]:
    """DSpark's Markov head: w1 [vocab, rank] one-hot rows for ACCEPT, w2 [vocab, rank] the bias."""
    w1 = [(t, slot, 1.0) for t, slot in design.accept_index]
    w2 = [(design.successor[t], slot, MARKOV_GAIN) for t, slot in design.accept_index]
    return w1, w2


def hc_base(hc_mult: int = 4) -> list[float]:
    """A decoder layer's ``hc_*_base`` ((2 + hc) * hc): pre 0, post POST_LOGIT, residual mix 0 (uniform)."""
    return [0.0] * hc_mult + [POST_LOGIT] * hc_mult + [0.0] * (hc_mult * hc_mult)


def reference_logits(token: int, perturbation: list[float] | None = None,
                     design: Design = DESIGN) -> list[float]:
    """The target's logits after TOKEN, computed as the engine does on the designed weights.

    Pure Python, for the CPU tests: the one-hot embedding plus PERTURBATION
    (what the layers add to the residual after the post mix: HIDDEN_SIZE
    values), the final RMSNorm (weight 1, eps 1e-6), then lm_head.  The hc
    head's positive weights scale all streams alike and RMSNorm removes it.
    """
    x = [0.0] * HIDDEN_SIZE
    x[token] = EMBED_VALUE
    if perturbation is not None:
        x = [a + b for a, b in zip(x, perturbation, strict=True)]
    rms = math.sqrt(sum(v * v for v in x) / HIDDEN_SIZE + 1e-6)
    h = [v / rms for v in x]
    logits = [0.0] * VOCAB_SIZE
    for row, col, val in lm_head_entries(design):
        logits[row] += val * h[col]
    return logits


def top2_gap(logits: list[float]) -> float:
    a, b = sorted(logits, reverse=True)[:2]
    return a - b


# ---------------------------------------------------------------------------
# Inside the engine (torch): set the weights on vLLM's modules, before process_weights_after_loading


def _rescale_inner(model: Any, skip: set[int]) -> int:
    """Non-tying random values for the weights the oracle does not fix (the old harness's rescale).

    FP8 weights N(0,1) clamped to +-4 with block scales 2^round(log2(1/sqrt(fan_in))), norms 1,
    other 2-D floating weights N(0, 1/fan_in): the indexer's scores do not tie, every kernel sees
    real data.  Their effect on the tokens is bounded by the post mix (POST_LOGIT).
    """
    torch = importlib.import_module("torch")  # the environment under test has it; this one need not

    count = 0
    for name, p in model.named_parameters(remove_duplicate=True):
        t = p.data
        if t.device.type == "meta" or t.numel() == 0 or t.data_ptr() in skip:
            continue
        skip.add(t.data_ptr())
        gen = torch.Generator(device=t.device).manual_seed(zlib.crc32(name.encode()))
        leaf = name.rsplit(".", 1)[-1]
        owner = name.rsplit(".", 2)[-2] if "." in name else ""
        # copy_ casts to the parameter's dtype as .to() would (.to() is a copy_ into a new tensor): the same
        # bits, without a second FP8 tensor of the parameter's size and a pass over it
        if t.dtype == torch.float8_e4m3fn:
            t.copy_(torch.randn(t.shape, generator=gen, device=t.device).clamp_(-4, 4))
        elif leaf in ("weight_scale_inv", "weight_scale") or leaf.endswith("_weight_scale_inv"):
            if t.dtype != torch.float32 or t.dim() < 1:
                continue
            t.fill_(2.0 ** round(math.log2(1.0 / math.sqrt(max(1, t.shape[-1] * 128)))))
        elif leaf == "weight" and "norm" in owner and t.is_floating_point():
            t.fill_(1.0)
        elif leaf == "weight" and t.dim() == 2 and t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=gen, device=t.device).div_(math.sqrt(t.shape[-1])))
        else:
            continue
        count += 1
    return count


def _fill_sparse(weight: Any, entries: list[tuple[int, int, float]]) -> None:
    torch = importlib.import_module("torch")  # the environment under test has it; this one need not

    dense = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    rows = torch.tensor([r for r, _, _ in entries], dtype=torch.long, device=weight.device)
    cols = torch.tensor([c for _, c, _ in entries], dtype=torch.long, device=weight.device)
    vals = torch.tensor([v for _, _, v in entries], dtype=torch.float32, device=weight.device)
    dense.index_put_((rows, cols), vals, accumulate=True)
    weight.copy_(dense.to(weight.dtype))


def _set_fp8_linear(module: Any, entries: list[tuple[int, int, float]]) -> None:
    """An FP8 block-quantized linear as exactly ENTRIES (1.0 and 0.0 are exact in e4m3; scales 1)."""
    _fill_sparse(module.weight.data, entries)
    scale = getattr(module, "weight_scale_inv", None)
    if scale is None:
        scale = getattr(module, "weight_scale", None)
    if scale is not None:
        scale.data.fill_(1.0)


def vocab_shard(module: Any) -> tuple[int, int] | None:
    """The vocabulary rows [start, end) this rank holds of a vocab-parallel MODULE, None for any other module.

    vLLM's ``VocabParallelEmbedding`` and ``ParallelLMHead`` (the embeddings,
    ``lm_head``, the MTP head, DSpark's ``markov_w1``/``markov_w2``) keep the
    rank's slice in ``shard_indices`` (its rows start at 0 in the local weight).
    """
    idx = getattr(module, "shard_indices", None)
    if idx is None:
        return None
    return int(idx.org_vocab_start_index), int(idx.org_vocab_end_index)


def shard_entries(entries: list[tuple[int, int, float]], rows: tuple[int, int] | None) -> list[tuple[int, int, float]]:
    """ENTRIES of a whole matrix as the rank holding ROWS [start, end) sees them (all of them when None)."""
    if rows is None:
        return entries
    start, end = rows
    return [(r - start, c, v) for r, c, v in entries if start <= r < end]


def apply_oracle_weights(model: Any, design: Design = DESIGN) -> dict[str, int]:
    """Set MODEL's weights to the design (see the module docstring); returns what was set, by kind.

    MODEL is any of vLLM 0.26.0's DeepSeek-V4 classes on NVIDIA: the target
    (``DeepseekV4ForCausalLM``), the MTP draft (``DeepSeekV4MTP``) or the
    DSpark draft (``DSparkDeepseekV4ForCausalLM``).  Runs in the loader,
    after vLLM's dummy initialisation and before ``process_weights_after_loading``
    and the classes' finalize steps, so every kernel layout is vLLM's own.

    Under tensor parallelism MODEL is one rank's shard: a vocab-parallel
    module gets the rows of the design it holds (:func:`vocab_shard`), the
    replicated ones (``e_proj``, ``h_proj``, the hc parameters) the whole
    design, so the ranks together hold exactly the TP 1 matrices.  Under
    pipeline parallelism a rank lacks what another rank holds (``PPMissingLayer``
    has no weight): :func:`missing_parts` takes the rank's place.
    """
    torch = importlib.import_module("torch")  # the environment under test has it; this one need not

    done: dict[str, int] = {}
    fixed: set[int] = set()
    setters = _design_setters(design)
    with torch.no_grad():
        for name, mod in model.named_modules():
            setter = setters.get(name.rsplit(".", 1)[-1])
            if setter is None or getattr(mod, "weight", None) is None:
                for kind in _set_hyper_connections(mod):
                    done[kind] = done.get(kind, 0) + 1
                continue
            kind, set_weights = setter
            set_weights(mod)
            done[kind] = done.get(kind, 0) + 1
            for p in mod.parameters(recurse=False):
                fixed.add(p.data.data_ptr())
        for mod in model.modules():  # the hc parameters are fixed too
            for pname in ("hc_attn_fn", "hc_ffn_fn", "hc_attn_base", "hc_ffn_base", "hc_attn_scale",
                          "hc_ffn_scale", "hc_head_fn", "hc_head_base", "hc_head_scale"):
                p = getattr(mod, pname, None)
                if p is not None:
                    fixed.add(p.data.data_ptr())
        done["rescaled"] = _rescale_inner(model, fixed)
    return done


def _design_setters(design: Design) -> dict[str, tuple[str, Callable[[Any], None]]]:
    """Module name (its last part) -> (the kind it counts as, what sets its weight to the design)."""
    one_hot = [(t, t, EMBED_VALUE) for t in range(VOCAB_SIZE)]
    w1, w2 = markov_entries(design)

    def vocab(entries: Callable[[], list[tuple[int, int, float]]]) -> Callable[[Any], None]:
        """A vocab-parallel module: the rows of the design this rank holds."""
        return lambda mod: _fill_sparse(mod.weight.data, shard_entries(entries(), vocab_shard(mod)))

    lm_head = ("lm_head", vocab(lambda: lm_head_entries(design)))
    return {
        "embed_tokens": ("embed_tokens", vocab(lambda: one_hot)),
        "lm_head": lm_head,
        "head": lm_head,
        "markov_w1": ("markov_w1", vocab(lambda: w1)),
        "markov_w2": ("markov_w2", vocab(lambda: w2)),
        "e_proj": ("e_proj", lambda mod: _set_fp8_linear(mod, e_proj_entries(design))),
        "h_proj": ("h_proj", lambda mod: _set_fp8_linear(mod, [])),
    }


def _set_hyper_connections(mod: Any) -> list[str]:
    """A decoder layer's and the head's hyper-connection parameters (mixing off, base the design's);
    the kinds set (``decoder_layer_hc``, ``hc_head``), none for any other module."""
    torch = importlib.import_module("torch")  # the environment under test has it; this one need not

    kinds = []
    if hasattr(mod, "hc_attn_fn"):
        hc = int(getattr(mod, "hc_mult", 4))
        for part in ("attn", "ffn"):
            getattr(mod, f"hc_{part}_fn").data.zero_()
            getattr(mod, f"hc_{part}_base").data.copy_(torch.tensor(hc_base(hc)))
            getattr(mod, f"hc_{part}_scale").data.fill_(1.0)
        kinds.append("decoder_layer_hc")
    if hasattr(mod, "hc_head_fn"):
        mod.hc_head_fn.data.zero_()
        mod.hc_head_base.data.zero_()
        mod.hc_head_scale.data.fill_(1.0)
        kinds.append("hc_head")
    return kinds


# What each kind of model must have had set, or the design does not hold (a vLLM whose layout differs).
REQUIRED: dict[str, tuple[str, ...]] = {
    "DeepseekV4ForCausalLM": ("embed_tokens", "lm_head", "decoder_layer_hc", "hc_head"),
    "DeepSeekV4MTP": ("embed_tokens", "lm_head", "e_proj", "h_proj", "decoder_layer_hc", "hc_head"),
    "DSparkDeepseekV4ForCausalLM": ("markov_w1", "markov_w2", "decoder_layer_hc", "hc_head"),
}


# What a pipeline rank other than the first (the embeddings) or the last (the LM head) does not hold of the target.
FIRST_RANK_ONLY = frozenset({"embed_tokens"})
LAST_RANK_ONLY = frozenset({"lm_head"})


def missing_parts(model_class: str, done: dict[str, int], *, first_pp_rank: bool = True,
                  last_pp_rank: bool = True) -> list[str]:
    """The parts REQUIRED for MODEL_CLASS that :func:`apply_oracle_weights` did not find on this pipeline rank.

    The drafts (MTP, DSpark) live whole on the last rank; the target's
    embeddings on the first and its LM head on the last, its decoder layers
    and hc head on every rank.
    """
    skip: set[str] = set()
    if model_class == "DeepseekV4ForCausalLM":
        skip |= set() if first_pp_rank else FIRST_RANK_ONLY
        skip |= set() if last_pp_rank else LAST_RANK_ONLY
    return [k for k in REQUIRED.get(model_class, ()) if k not in skip and not done.get(k)]
