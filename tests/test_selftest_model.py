"""dsv4patch.proofs.selftest.model: the successor design, its margin, and the weights it sets.

The margin is checked twice: in pure Python on the designed matrices
(``reference_logits``), and in torch (CPU) by applying ``apply_oracle_weights`` to
modules laid out as vLLM 0.26.0's DeepSeek-V4 classes name them and running
the mHC residual, hc head, norm and heads through a reference forward written
here from the formulas (vLLM's own kernels need a GPU; that part is the
device run's).

The torch checks run in this process when torch imports here, else in the CPU
test venv's python (``cpu_testenv``, conftest.py; the CLI's venv, CI's
included, has no torch): they never skip.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from dsv4patch.proofs.selftest import model as m
from dsv4patch.proofs.selftest.model import DESIGN


def test_the_successor_map_is_one_cycle_that_every_token_enters():
    cycle = DESIGN.cycle
    assert len(cycle) == m.CYCLE_LEN == len(set(cycle))
    t, seen = cycle[0], []
    for _ in range(m.CYCLE_LEN):
        seen.append(t)
        t = DESIGN.successor[t]
    assert t == cycle[0] and sorted(seen) == sorted(cycle)  # a single cycle, no shorter loop
    for tok in range(m.VOCAB_SIZE):
        nxt = DESIGN.successor[tok]
        assert nxt not in (m.BOS, m.EOS, m.NOISE_TOKEN)
        if tok != m.NOISE_TOKEN:
            assert nxt in cycle
    # DSpark drafts made from the noise token alone are never right inside the cycle
    assert DESIGN.successor[m.NOISE_TOKEN] not in cycle


def test_the_drafts_agree_on_accept_only():
    assert len(DESIGN.accept) == m.MARKOV_RANK and DESIGN.accept <= set(DESIGN.cycle)
    for t in DESIGN.cycle:
        assert (DESIGN.mtp_draft(t) == DESIGN.successor[t]) == (t in DESIGN.accept)
    a = next(t for t in DESIGN.cycle if DESIGN.successor[t] in DESIGN.accept)
    drafts = DESIGN.dspark_drafts(a, 5)
    assert drafts[0] == DESIGN.successor[a] and drafts[1] == DESIGN.successor[drafts[0]]
    outside = next(t for t in DESIGN.cycle if t not in DESIGN.accept)
    assert DESIGN.dspark_drafts(DESIGN.cycle[DESIGN.cycle.index(outside) - 1], 2)[1] == \
        DESIGN.successor[m.NOISE_TOKEN]


def test_the_design_is_the_same_in_every_process():
    assert m.Design.make() == DESIGN and m.Design.make(31) != DESIGN


def test_reference_logits_lead_by_the_gain_for_every_token():
    for t in range(m.VOCAB_SIZE):
        logits = m.reference_logits(t)
        assert max(range(m.VOCAB_SIZE), key=logits.__getitem__) == DESIGN.successor[t]
        assert m.top2_gap(logits) == pytest.approx(m.GAIN, abs=0.05)


def test_the_margin_survives_what_the_layers_may_write():
    # eight residual writes (4 layers x attention, MoE), each an output of rms 100 scaled by the post mix
    post = 2.0 / (1.0 + math.exp(-m.POST_LOGIT))
    rnd = random.Random(0)
    worst = math.inf
    for t in DESIGN.cycle[:24]:
        delta = [sum(rnd.gauss(0.0, 100.0) for _ in range(8)) * post for _ in range(m.HIDDEN_SIZE)]
        logits = m.reference_logits(t, delta)
        assert max(range(m.VOCAB_SIZE), key=logits.__getitem__) == DESIGN.successor[t]
        worst = min(worst, m.top2_gap(logits))
    assert worst > 0.9 * m.GAIN, worst


def test_a_nan_the_layers_write_reaches_the_logits():
    delta = [0.0] * m.HIDDEN_SIZE
    delta[5] = math.nan
    assert any(math.isnan(x) for x in m.reference_logits(DESIGN.cycle[0], delta))


def test_matrices_are_exact_maps():
    head = m.lm_head_entries()
    assert sorted(c for _, c, _ in head) == list(range(m.VOCAB_SIZE))  # one entry per column
    assert {v for _, _, v in head} == {m.GAIN / 64}
    e = m.e_proj_entries()
    assert sorted(c for _, c, _ in e) == list(range(m.VOCAB_SIZE))  # one 1.0 per column: e_t -> e_shift(t)
    assert {v for _, _, v in e} == {1.0} and all(r == DESIGN.mtp_shift(c) for r, c, _ in e)
    w1, w2 = m.markov_entries()
    assert len(w1) == len(w2) == m.MARKOV_RANK and {s for _, s, _ in w1} == set(range(m.MARKOV_RANK))
    base = m.hc_base()
    assert len(base) == (2 + 4) * 4 and base[4:8] == [m.POST_LOGIT] * 4 and not any(base[:4] + base[8:])


def test_the_config_meets_vllm_0_26_0s_constraints(tmp_path):
    cfg = json.loads((m.write_model(tmp_path) / "config.json").read_text())
    assert cfg["vocab_size"] <= cfg["hidden_size"]  # one-hot embeddings
    assert cfg["head_dim"] == 512 and cfg["head_dim"] - cfg["qk_rope_head_dim"] == 448
    for key in ("hidden_size", "q_lora_rank", "o_lora_rank", "moe_intermediate_size"):
        assert cfg[key] % 128 == 0
    assert cfg["hc_mult"] * cfg["hidden_size"] % 4096 == 0
    assert len(cfg["compress_ratios"]) == cfg["num_hidden_layers"] + cfg["num_nextn_predict_layers"]
    assert 4 in cfg["compress_ratios"][: cfg["num_hidden_layers"]]
    assert cfg["dspark_markov_rank"] == len(DESIGN.accept)
    assert cfg["dspark_noise_token_id"] == m.NOISE_TOKEN
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == m.EOS


def test_the_tiny_model_shards_for_tp_up_to_8_and_pp_up_to_4():
    for tp in m.TENSOR_PARALLEL_SIZES:
        for pp in range(1, m.MAX_PIPELINE_PARALLEL_SIZE + 1):
            assert m.shard_problems(tp, pp) == [], (tp, pp)
    # the rules can fail: what the model had before (an expert intermediate of 512: 64 columns a rank at TP 8,
    # half an FP8 block, which vLLM 0.26.0's Fp8MoEMethod refuses) and shapes past the limits
    old = {**m.tiny_config(), "moe_intermediate_size": 512}
    assert m.shard_problems(4, 1, old) == []
    assert m.shard_problems(8, 1, old) == [
        "the experts' intermediate size (512) does not split over 8 rank(s) in whole 128-wide FP8 blocks"]
    assert "o-projection groups (8) does not split over 16 rank(s)" in m.shard_problems(16, 1)
    assert m.shard_problems(1, 5) == ["4 layer(s) cannot give each of 5 pipeline rank(s) one"]
    assert "routed experts (8) does not split over 16 rank(s)" in m.shard_problems(16, 1)


def test_the_vocab_parallel_shards_put_together_are_the_whole_design():
    whole = {"embed": [(t, t, m.EMBED_VALUE) for t in range(m.VOCAB_SIZE)], "lm_head": m.lm_head_entries(),
             "markov_w1": m.markov_entries()[0], "markov_w2": m.markov_entries()[1]}
    for tp in m.TENSOR_PARALLEL_SIZES:
        rows = m.VOCAB_SIZE // tp
        for name, entries in whole.items():
            parts = [m.shard_entries(entries, (r * rows, (r + 1) * rows)) for r in range(tp)]
            assert all(0 <= e[0] < rows for part in parts for e in part)
            back = sorted((e[0] + r * rows, e[1], e[2]) for r, part in enumerate(parts) for e in part)
            assert back == sorted(entries), (name, tp)
    assert m.shard_entries(whole["lm_head"], None) is whole["lm_head"]


def test_a_pipeline_rank_is_not_missing_what_another_rank_holds():
    body = {"decoder_layer_hc": 1, "hc_head": 1}
    assert m.missing_parts("DeepseekV4ForCausalLM", body) == ["embed_tokens", "lm_head"]
    assert m.missing_parts("DeepseekV4ForCausalLM", body, first_pp_rank=False, last_pp_rank=False) == []
    assert m.missing_parts("DeepseekV4ForCausalLM", {**body, "embed_tokens": 1}, last_pp_rank=False) == []
    assert m.missing_parts("DeepseekV4ForCausalLM", {"embed_tokens": 1}, last_pp_rank=False) == [
        "decoder_layer_hc", "hc_head"]
    # the drafts live whole on the last rank
    assert m.missing_parts("DeepSeekV4MTP", {}, first_pp_rank=False) == list(m.REQUIRED["DeepSeekV4MTP"])


# ---------------------------------------------------------------------------
# torch: the weights on vLLM-shaped modules, through a reference forward


def _outcome(check: Callable[[], None]) -> str:
    try:
        check()
    except BaseException:  # noqa: BLE001 (the failure is the result, reported by the test that owns it)
        import traceback

        return traceback.format_exc()
    return "ok"


@pytest.fixture(scope="module")
def torch_checks(request: pytest.FixtureRequest) -> dict[str, str]:
    """Every torch check of this module (TORCH_CHECKS), run once: here when torch imports, else in
    one process of the CPU test venv's python (one torch import for all of them instead of one
    each); check name -> "ok" or its traceback, which fails the test that owns the check."""
    names = [c.__name__ for c in TORCH_CHECKS]
    if importlib.util.find_spec("torch") is not None:
        return {c.__name__: _outcome(c) for c in TORCH_CHECKS}
    env = request.getfixturevalue("cpu_testenv")
    here = Path(__file__).resolve()
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    e.update(PYTHONPATH=os.pathsep.join([str(here.parent.parent), str(here.parent)]),
             CUDA_VISIBLE_DEVICES="", PYTHONDONTWRITEBYTECODE="1")
    code = (f"import json, {here.stem} as t\n"
            f"print(json.dumps({{n: t._outcome(getattr(t, n)) for n in {names!r}}}))")
    res = subprocess.run([str(env.python), "-c", code], env=e, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"torch checks in {env.python}:\n{res.stdout[-2000:]}{res.stderr[-6000:]}"
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert sorted(out) == sorted(names), res.stdout[-2000:]
    return dict(out)


def _modules():
    import torch

    nn = torch.nn
    H, V, hc = m.HIDDEN_SIZE, m.VOCAB_SIZE, 4

    def param(*shape, dtype=torch.float32):
        return nn.Parameter(torch.full(shape, 1e-3, dtype=dtype), requires_grad=False)

    class Linear(nn.Module):  # vLLM's block-FP8 ReplicatedLinear: weight [out, in], weight_scale_inv per block
        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = param(n_out, n_in, dtype=torch.float8_e4m3fn)
            self.weight_scale_inv = param(n_out // 128, n_in // 128)

        def forward(self, x):
            w = self.weight.float() * self.weight_scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
            return x @ w.t()

    class Table(nn.Module):  # VocabParallelEmbedding / ParallelLMHead
        def __init__(self, rows, cols):
            super().__init__()
            self.weight = param(rows, cols, dtype=torch.bfloat16)

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = param(H, dtype=torch.bfloat16)

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.hc_mult = hc
            for part in ("attn", "ffn"):
                setattr(self, f"hc_{part}_fn", param((2 + hc) * hc, hc * H))
                setattr(self, f"hc_{part}_base", param((2 + hc) * hc))
                setattr(self, f"hc_{part}_scale", param(3))
            self.attn_norm, self.ffn_norm = Norm(), Norm()
            self.wo = Linear(H, H)  # stands for attention and the MoE: random, full-size outputs

    class HcHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.hc_head_fn, self.hc_head_base, self.hc_head_scale = param(hc, hc * H), param(hc), param(1)

    class Inner(HcHead):
        def __init__(self):
            super().__init__()
            self.embed_tokens = Table(V, H)
            self.layers = nn.ModuleList([DecoderLayer() for _ in range(2)])
            self.norm = Norm()

    class Target(nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.lm_head = Inner(), Table(V, H)

    class SharedHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.head = Norm(), Table(V, H)

    class MtpLayer(HcHead):
        def __init__(self):
            super().__init__()
            self.enorm, self.hnorm = Norm(), Norm()
            self.e_proj, self.h_proj = Linear(H, H), Linear(H, H)
            self.shared_head, self.mtp_block = SharedHead(), DecoderLayer()

    class MtpInner(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleDict({"4": MtpLayer()})
            self.embed_tokens = Table(V, H)

    class MTP(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = MtpInner()

    class Markov(nn.Module):
        def __init__(self):
            super().__init__()
            self.markov_w1, self.markov_w2 = Table(V, m.MARKOV_RANK), Table(V, m.MARKOV_RANK)

    class DSparkInner(HcHead):
        def __init__(self):
            super().__init__()
            self.embed_tokens = Table(V, H)
            self.layers = nn.ModuleList([DecoderLayer()])
            self.norm = Norm()
            self.markov_head = Markov()

    class DSpark(nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.lm_head = DSparkInner(), Table(V, H)

    Target.__name__, MTP.__name__, DSpark.__name__ = (
        "DeepseekV4ForCausalLM", "DeepSeekV4MTP", "DSparkDeepseekV4ForCausalLM")
    return torch, Target, MTP, DSpark


def _rms(torch, x, w=None):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    return y if w is None else y * w.float()


def _mhc(torch, layer, part, residual, out_fn):
    """One mHC block as the formulas say: pre/post/comb mixes from fn . rmsnorm(residual) * scale + base."""
    hc = layer.hc_mult
    fn, base, scale = (getattr(layer, f"hc_{part}_{k}").float() for k in ("fn", "base", "scale"))
    flat = residual.reshape(residual.shape[0], -1)
    mixes = (flat @ fn.t()) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + 1e-6
    post = 2.0 * torch.sigmoid(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = torch.softmax((mixes[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(-1, hc, hc), -1)
    for _ in range(20):
        comb = comb / comb.sum(-2, keepdim=True)
        comb = comb / comb.sum(-1, keepdim=True)
    x = (pre.unsqueeze(-1) * residual).sum(1)
    out = out_fn(_rms(torch, x, getattr(layer, f"{part}_norm").weight))
    return torch.einsum("tij,tih->tjh", comb, residual) + post.unsqueeze(-1) * out.unsqueeze(1)


def _layer(torch, layer, residual):
    def fake(x):  # attention / MoE stand-in: a full-size random projection, then a NaN-free GELU
        return torch.nn.functional.gelu(layer.wo(x)) * 4.0

    residual = _mhc(torch, layer, "attn", residual, fake)
    return _mhc(torch, layer, "ffn", residual, fake)


def _hc_head(torch, owner, residual):
    flat = residual.reshape(residual.shape[0], -1)
    mixes = (flat @ owner.hc_head_fn.float().t()) * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mixes * owner.hc_head_scale.float() + owner.hc_head_base.float()) + 1e-6
    return (pre.unsqueeze(-1) * residual).sum(1)


def _gaps_and_argmax(torch, logits):
    top = logits.topk(2, dim=-1)
    return (top.values[:, 0] - top.values[:, 1]), top.indices[:, 0]


def _head_logits(torch, owner, residual, norm, head):
    """The hc head of ``owner``, the final norm, then the vocabulary projection ``head``."""
    return _rms(torch, _hc_head(torch, owner, residual), norm.weight) @ head.weight.float().t()


def _oracle_model(which):
    """torch, the module of class ``which`` (vLLM's name) with the oracle weights applied, and what they set."""
    torch, *classes = _modules()
    model = next(c for c in classes if c.__name__ == which)()
    done = m.apply_oracle_weights(model)
    assert m.missing_parts(which, done) == []
    return torch, model, done


def _check_the_target_follows_the_successor_map():
    torch, model, done = _oracle_model("DeepseekV4ForCausalLM")
    assert done["decoder_layer_hc"] == 2 and done["rescaled"] > 0
    tokens = torch.tensor(list(DESIGN.cycle) + [2, 3, m.NOISE_TOKEN])
    residual = model.model.embed_tokens.weight[tokens].float().unsqueeze(1).repeat(1, 4, 1)
    for layer in model.model.layers:
        residual = _layer(torch, layer, residual)
    gaps, best = _gaps_and_argmax(torch, _head_logits(torch, model.model, residual, model.model.norm, model.lm_head))
    assert best.tolist() == [DESIGN.successor[t] for t in tokens.tolist()]
    assert gaps.min().item() > 0.9 * m.GAIN, gaps.min().item()
    # and the inner weights are random values, not the dummy loader's 1e-3 (every kernel sees real data)
    assert model.model.layers[0].wo.weight.float().std().item() > 0.5


def _check_the_mtp_draft_agrees_on_accept_only():
    torch, mtp, _ = _oracle_model("DeepSeekV4MTP")
    layer = mtp.model.layers["4"]
    tokens = torch.tensor(DESIGN.cycle)
    e = _rms(torch, mtp.model.embed_tokens.weight[tokens].float(), layer.enorm.weight)
    prev = torch.randn(len(tokens), 4, m.HIDDEN_SIZE)  # the target's hidden: h_proj must drop it
    hidden = layer.h_proj(_rms(torch, prev, layer.hnorm.weight)) + layer.e_proj(e).unsqueeze(1)
    hidden = _layer(torch, layer.mtp_block, hidden)
    gaps, best = _gaps_and_argmax(torch, _head_logits(torch, layer, hidden, layer.shared_head.norm,
                                                      layer.shared_head.head))
    assert best.tolist() == [DESIGN.mtp_draft(t) for t in DESIGN.cycle]
    assert gaps.min().item() > 0.9 * m.GAIN
    agree = sum(DESIGN.mtp_draft(t) == DESIGN.successor[t] for t in DESIGN.cycle)
    assert agree == len(DESIGN.accept)


def _check_dspark_has_its_markov_bias():
    torch, ds, _ = _oracle_model("DSparkDeepseekV4ForCausalLM")
    inner = ds.model
    tokens = torch.tensor(DESIGN.cycle)
    noise = torch.full_like(tokens, m.NOISE_TOKEN)
    residual = inner.embed_tokens.weight[noise].float().unsqueeze(1).repeat(1, 4, 1)
    residual = _layer(torch, inner.layers[0], residual)
    base = _head_logits(torch, inner, residual, inner.norm, ds.lm_head)
    bias = inner.markov_head.markov_w1.weight[tokens].float() @ inner.markov_head.markov_w2.weight.float().t()
    best = (base + bias).argmax(-1).tolist()
    want = [DESIGN.dspark_drafts(t, 2)[1] for t in [DESIGN.cycle[i - 1] for i in range(len(DESIGN.cycle))]]
    # position 1 of a block drafted after anchor a: prev = successor(a) = the cycle token itself
    assert best == [DESIGN.successor[t] if t in DESIGN.accept else DESIGN.successor[m.NOISE_TOKEN]
                    for t in DESIGN.cycle] == want


def _check_missing_parts_names_what_a_changed_layout_lacks():
    _, _, MTP, _ = _modules()
    mtp = MTP()
    del mtp.model.layers["4"].e_proj
    assert m.missing_parts("DeepSeekV4MTP", m.apply_oracle_weights(mtp)) == ["e_proj"]


TORCH_CHECKS: list[Callable[[], None]] = [
    _check_the_target_follows_the_successor_map,  # apply_oracle_weights makes the target follow the map
    _check_the_mtp_draft_agrees_on_accept_only,  # ... the MTP draft agree on the accept set only
    _check_dspark_has_its_markov_bias,  # ... gives DSpark its Markov bias
    _check_missing_parts_names_what_a_changed_layout_lacks,
]


@pytest.mark.slow  # the CPU test venv, where torch does not import here (shared cache)
@pytest.mark.parametrize("check", TORCH_CHECKS, ids=lambda check: check.__name__.removeprefix("_check_"))
def test_oracle_weights_on_vllm_shaped_modules(torch_checks, check):
    outcome = torch_checks[check.__name__]
    assert outcome == "ok", f"{check.__name__}:\n{outcome[-6000:]}"


# ---------------------------------------------------------------------------
# vLLM 0.26.0's own classes (CPU test venv, the stock wheel's Python files): the oracle finds every part


# Each rank of these topologies, built as one worker of vLLM 0.26.0 builds it (the probe's RANKS mode): TP 2 and
# TP 2 x PP 2 whole (the shards put together), PP 4 whole (one layer a rank), TP 8's first and last rank; the
# drafts (MTP, DSpark) with TP only: vLLM 0.26.0's config refuses them with PP (tests/test_selftest_child.py).
RANKS = ([[2, 1, r, 0] for r in range(2)] + [[1, 4, 0, r] for r in range(4)]
         + [[2, 2, t, p] for p in range(2) for t in range(2)] + [[8, 1, 0, 0], [8, 1, 7, 0]])


@pytest.fixture(scope="module")
def vllm026_probe(vllm026, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One run of the probe for both tests below (one import of torch and vLLM, ~7 CPU s, instead of one
    each; issue 39): its first line the TP 1 models, its second every rank of RANKS."""
    root = Path(__file__).resolve().parent.parent
    return subprocess.run([str(vllm026.python), str(root / "tests" / "selftest_vllm026_probe.py"),
                           str(root / "dsv4patch" / "proofs" / "selftest" / "model.py"),
                           str(m.write_model(tmp_path_factory.mktemp("probe") / "tiny")), json.dumps(RANKS)],
                          env=vllm026.env(), capture_output=True, text=True, timeout=1500)


@pytest.mark.slow  # the pin's tree and CPU test venv (shared cache), the stock wheel (303 MB, cached)
def test_apply_oracle_weights_on_vllm_026s_own_deepseek_v4_classes(vllm026_probe):
    res = vllm026_probe
    # its line (vLLM logs to stdout too) is printed before the ranks are built: a fault there is the other test's
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith('{"target": ')]
    assert len(lines) == 1, res.stderr[-3000:]
    out = json.loads(lines[0])
    assert {k: v["class"] for k, v in out.items()} == {
        "target": "DeepseekV4ForCausalLM", "mtp": "DeepSeekV4MTP", "dspark": "DSparkDeepseekV4ForCausalLM"}
    assert all(v["missing"] == [] for v in out.values()), out
    assert out["target"]["set"]["decoder_layer_hc"] == m.NUM_LAYERS
    assert out["mtp"]["weight"] == ["torch.float8_e4m3fn", [m.HIDDEN_SIZE, m.HIDDEN_SIZE]]
    assert out["mtp"]["weight_scale_inv"] == ["torch.float32", [32, 32]] and out["mtp"]["e_proj_columns_one_hot"]


@pytest.mark.slow  # the pin's tree and CPU test venv (shared cache), the stock wheel; one build per rank
def test_every_rank_of_tp_and_pp_topologies_gets_its_share_of_the_oracle_on_vllm_026s_classes(vllm026_probe):
    res = vllm026_probe
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert isinstance(out, list), res.stdout[-2000:]
    by: dict[tuple[int, int], list[dict]] = {}
    for entry in out:
        tp, pp, tp_rank, pp_rank = entry["topology"]
        assert entry["missing"] == [], entry  # every part this stage holds was set
        if entry["which"] == "target":
            by.setdefault((tp, pp), []).append(entry)
            # a stage holds the layers get_pp_indices gives it (4 layers: PP 4 one each, PP 2 two each)
            per = m.NUM_LAYERS // pp
            assert entry["layers"] == list(range(pp_rank * per, (pp_rank + 1) * per)), entry["layers"]
            assert entry["set"]["decoder_layer_hc"] == per and entry["set"]["hc_head"] == 1
            assert ("embed_tokens" in entry["set"]) == (pp_rank == 0)
            assert ("lm_head" in entry["set"]) == (pp_rank == pp - 1)
            if pp > 1 and 0 < pp_rank < pp - 1:
                assert entry["missing_as_tp1"] == ["embed_tokens", "lm_head"]  # what a middle stage lacks
        for name, shard in entry["shards"].items():  # a rank holds vocab rows [start, end) of the TP split
            start, end = shard["rows"]
            assert end - start == m.VOCAB_SIZE // tp and start == tp_rank * (m.VOCAB_SIZE // tp), (name, shard["rows"])
    assert {e["which"] for e in out} == {"target", "mtp", "dspark"}
    assert not [e for e in out if e["which"] != "target" and e["topology"][1] != 1]  # no draft with PP in 0.26.0
    # the ranks of a topology put together hold exactly the design's matrices, as TP 1 does
    design = {"model.embed_tokens": [[t, t, m.EMBED_VALUE] for t in range(m.VOCAB_SIZE)],
              "lm_head": [list(e) for e in m.lm_head_entries()]}
    for key in ((2, 1), (2, 2)):
        for name, want in design.items():
            got = sorted(e for entry in by[key] for e in entry["shards"].get(name, {"entries": []})["entries"])
            assert got == sorted(want), (key, name, len(got))
    drafts = {(e["which"], tuple(e["topology"])): e for e in out if e["which"] != "target"}
    mtp_head = sorted(e for (w, t), d in drafts.items() if w == "mtp" and t[:2] == (2, 1)
                      for n, s in d["shards"].items() if n.endswith("shared_head.head") for e in s["entries"])
    assert mtp_head == sorted(list(e) for e in m.lm_head_entries())
    w2 = sorted(e for (w, t), d in drafts.items() if w == "dspark" and t[:2] == (2, 1)
                for n, s in d["shards"].items() if n.endswith("markov_w2") for e in s["entries"])
    assert w2 == sorted(list(e) for e in m.markov_entries()[1])
