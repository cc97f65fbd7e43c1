#!/usr/bin/env python3
"""Write a tiny DeepSeek-V4 model directory that vLLM 0.26.0 loads with dummy weights.

Why this exists: the end-to-end run (issue 15) needs a DeepSeek-V4 model that
goes through every layer kind vLLM's DeepSeek-V4 code has (sliding-window-only
attention, C4 compressed sparse attention with the indexer and its top-k, C128
compressed attention, hash-routed and score-routed MoE, the MTP layer, the
DSpark draft layers) without 284 GB of weights.  ``load_format="dummy"`` gives
random weights, ``skip_tokenizer_init=True`` with prompt token ids needs no
tokenizer, so the directory holds only ``config.json`` (and a
``generation_config.json`` that pins nothing).

Every value below is tied to a constraint in vLLM 0.26.0's source (paths are
relative to the sdist, read from the pinned tree):

* ``head_dim`` 512 = 448 NoPE + ``qk_rope_head_dim`` 64: the only head size
  ``DeepseekV4FlashMLABackend.get_supported_head_sizes`` accepts
  (``vllm/models/deepseek_v4/sparse_mla.py``); FlashMLA's FP8 decode kernel pads
  the query heads to 64 or 128, so ``num_attention_heads`` <= 128
  (``nvidia/flashmla.py``: ``get_padded_num_q_heads``).
* ``quantization_config`` fp8 with 128x128 blocks: the O projection always runs
  ``deep_gemm_fp8_o_proj`` (``nvidia/ops/o_proj.py``), which reads
  ``wo_a.weight_scale_inv``, so the linear layers must be block-FP8;
  ``DeepseekV4ForCausalLMConfig`` rewrites ``fp8`` to ``deepseek_v4_fp8``.
  ``expert_dtype`` "fp8" keeps the routed experts block-FP8 (the FP4/MXFP4
  expert path is an SM100 specialty); ``quant_config.py`` accepts fp4|fp8.
* ``hidden_size``, ``o_lora_rank``, ``q_lora_rank``, ``moe_intermediate_size``
  multiples of 128 (FP8 blocks); ``hc_mult * hidden_size`` divisible by
  8 * 512 (``model_executor/kernels/mhc/tilelang.py`` splits it 8 ways in
  512-thread tiles for small batches).  The attention sizes are DeepSeek-V4-Flash's.
* ``compress_ratios`` has one entry per backbone layer plus the MTP layer:
  0 = sliding window only, 4 = compressed + indexer (the only ratio with an
  indexer, ``attention.py``), 128 = heavily compressed; layers at or past
  ``num_hidden_layers`` (MTP, DSpark) are sliding-window only.
* ``index_n_heads`` 64, ``index_head_dim`` 128, ``index_topk`` 512: Flash's
  indexer shape (DeepGEMM's FP8 MQA logits kernels and the persistent top-k
  are built for it).  ``sliding_window`` 128 as in Flash.
* ``num_hash_layers`` 1: layer 0 routes by token id (``tid2eid``); the others
  use ``sqrtsoftplus`` scores with ``noaux_tc`` bias.
* The KV cache must be FP8 in DeepSeek's ``fp8_ds_mla`` block format
  (``attention.py``: ``_resolve_dsv4_kv_cache_dtype`` asserts an fp8 dtype
  for the FlashMLA layout); the run passes ``kv_cache_dtype="fp8"`` and
  ``block_size=256`` (the backend's only kernel block size).
* DSpark (``nvidia/dspark.py``, ``config/speculative.py``):
  ``dspark_target_layer_ids`` (backbone layers whose hidden states feed the
  draft), ``n_mtp_layers`` draft layers, ``dspark_markov_rank``,
  ``dspark_noise_token_id`` (the parallel-drafting mask token,
  ``spec_decode/utils.py``) and ``dspark_block_size`` (num_speculative_tokens
  must be >= it).

Usage: python tests/gpu/e2e/make_tiny_dsv4.py OUTDIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

VOCAB_SIZE = 1024
NUM_LAYERS = 4
# One entry per backbone layer, then the MTP layer.
COMPRESS_RATIOS = [0, 4, 128, 4, 0]
SLIDING_WINDOW = 128
BLOCK_SIZE = 256
INDEX_TOPK = 512
MAX_POSITION = 65536
DSPARK_BLOCK_SIZE = 5


def tiny_config() -> dict[str, object]:
    """The config.json contents (a plain dict, JSON-serialisable)."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 4096,
        "num_hidden_layers": NUM_LAYERS,
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
        "rope_scaling": {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        "max_position_embeddings": MAX_POSITION,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": INDEX_TOPK,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "swiglu_limit": 10.0,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 512,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.5,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "num_hash_layers": 1,
        "expert_dtype": "fp8",
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": [128, 128],
        },
        "num_nextn_predict_layers": 1,
        # DSpark draft (DeepSeek-V4-Pro-DSpark style: the draft ships in the
        # target checkpoint and reuses this config).
        "n_mtp_layers": 1,
        "dspark_target_layer_ids": [1, 2, 3],
        "dspark_markov_rank": 64,
        "dspark_noise_token_id": VOCAB_SIZE - 1,
        "dspark_block_size": DSPARK_BLOCK_SIZE,
    }


def check_config(cfg: dict[str, object], need_indexer: bool = True) -> list[str]:
    """The constraints above, checked on the dict; returns the violations."""
    errs: list[str] = []

    def ival(key: str) -> int:
        value = cfg[key]
        assert isinstance(value, int), key
        return value

    if ival("head_dim") != 512 or ival("head_dim") - ival("qk_rope_head_dim") != 448:
        errs.append("head_dim must be 512 = 448 NoPE + 64 RoPE (FlashMLA DSV4)")
    if ival("num_attention_heads") > 128:
        errs.append("num_attention_heads must be <= 128 (FlashMLA FP8 decode)")
    for key in ("hidden_size", "q_lora_rank", "o_lora_rank", "moe_intermediate_size"):
        if ival(key) % 128:
            errs.append(f"{key} must be a multiple of 128 (FP8 128x128 blocks)")
    if (ival("hc_mult") * ival("hidden_size")) % (8 * 512):
        errs.append("hc_mult * hidden_size must be divisible by 4096 (mHC TileLang split)")
    ratios = cfg["compress_ratios"]
    assert isinstance(ratios, list)
    if len(ratios) != ival("num_hidden_layers") + ival("num_nextn_predict_layers"):
        errs.append("compress_ratios needs one entry per layer plus the MTP layers")
    if any(r not in (0, 1, 4, 128) for r in ratios):
        errs.append("compress_ratios entries must be 0, 1, 4 or 128")
    if need_indexer and 4 not in ratios[: ival("num_hidden_layers")]:
        errs.append("at least one C4 layer is needed (the indexer / top-k path)")
    if ival("num_attention_heads") % ival("o_groups"):
        errs.append("num_attention_heads must be divisible by o_groups")
    targets = cfg["dspark_target_layer_ids"]
    assert isinstance(targets, list)
    if any(not 0 <= t < ival("num_hidden_layers") for t in targets):
        errs.append("dspark_target_layer_ids must name backbone layers")
    if not 0 <= ival("dspark_noise_token_id") < ival("vocab_size"):
        errs.append("dspark_noise_token_id must be a token id")
    if ival("num_hash_layers") >= ival("num_hidden_layers"):
        errs.append("num_hash_layers must leave score-routed layers")
    if ival("num_experts_per_tok") > ival("n_routed_experts"):
        errs.append("num_experts_per_tok must be <= n_routed_experts")
    return errs


def write_model(outdir: Path, compress_ratios: list[int] | None = None) -> Path:
    """Write config.json and generation_config.json into OUTDIR; return OUTDIR.

    COMPRESS_RATIOS replaces the layers' ratios for diagnostic models: all 0
    is the same network with sliding-window attention only (no compressor, no
    indexer, no top-k), to tell a compressed-path bug from anything else.
    """
    cfg = tiny_config()
    if compress_ratios is not None:
        cfg["compress_ratios"] = list(compress_ratios)
    errs = check_config(cfg, need_indexer=compress_ratios is None)
    if errs:
        raise SystemExit("tiny DeepSeek-V4 config violates: " + "; ".join(errs))
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (outdir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=2) + "\n"
    )
    return outdir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument(
        "--validate",
        action="store_true",
        help="also load it through vLLM's own config classes (needs vllm importable)",
    )
    ap.add_argument(
        "--compress-ratios",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="comma-separated, one per layer plus the MTP layer (default: "
        + ",".join(str(r) for r in COMPRESS_RATIOS) + "); e.g. all 0 for a diagnostic model without compressed layers",
    )
    args = ap.parse_args(argv)
    out = write_model(args.outdir, args.compress_ratios)
    print(f"wrote {out / 'config.json'}")
    if args.validate:
        from vllm.transformers_utils.config import get_config

        hf = get_config(str(out), trust_remote_code=False)
        print(f"vLLM config class: {type(hf).__module__}.{type(hf).__name__}")
        print(f"rope_parameters: {getattr(hf, 'rope_parameters', None)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
