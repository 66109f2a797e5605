"""Write a tiny Qwen3-MoE model with random weights, for the server check (check 6).

``--dense`` writes a dense Qwen3 instead (``Qwen3ForCausalLM``: the same attention, one MLP
of ``intermediate_size`` per layer, no router or experts), for GPU runs that serve a dense
model beside the MoE ones.

Run by path with the tested environment's interpreter (``python tiny_model.py OUT``), like
``smoke_probe.py`` beside it: it needs only torch and safetensors, no network and no
tokenizer (the server then runs with ``--skip-tokenizer-init`` and is asked with token
ids). The builder never imports it; the tests load :func:`tiny_moe_config` and
:func:`tensor_shapes` by path.

The checkpoint uses the Hugging Face Qwen3-MoE layout that SGLang's
``sglang/srt/models/qwen3_moe.py`` loads (checked against 0.5.16's by the tests):
per-expert ``gate_proj``, ``up_proj`` and ``down_proj`` under ``mlp.experts.<e>``, the
router as ``mlp.gate``, and ``q_norm``/``k_norm`` per attention layer. The sizes are
multiples of 128 so that the CUTLASS grouped GEMMs of FlashInfer's fused MoE accept them
(TMA needs 16-byte aligned rows).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The model's dimensions: small enough to build in seconds and load in one, big enough
#: that every MoE GEMM has several 128-wide tiles.
DIMENSIONS: dict[str, int] = {
    "vocab_size": 2048, "hidden_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 512,
    "intermediate_size": 1024, "max_position_embeddings": 4096,
}


def tiny_moe_config(**overrides: int) -> dict[str, Any]:
    """The ``config.json`` of the tiny model (Transformers' ``Qwen3MoeConfig`` fields).

    Args:
        overrides: dimensions to change (keys of :data:`DIMENSIONS`).

    Raises:
        KeyError: an override names no dimension.
    """
    unknown = set(overrides) - set(DIMENSIONS)
    if unknown:
        raise KeyError(f"no dimension {', '.join(sorted(unknown))}")
    dims = {**DIMENSIONS, **overrides}
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            **dims, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "norm_topk_prob": True, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "attention_bias": False, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "use_sliding_window": False,
            "output_router_logits": False, "router_aux_loss_coef": 0.001,
            "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "bfloat16", "use_cache": True}


#: The MoE-only fields a dense Qwen3 config does not have.
MOE_ONLY = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
            "mlp_only_layers", "norm_topk_prob", "output_router_logits", "router_aux_loss_coef")


def tiny_dense_config(**overrides: int) -> dict[str, Any]:
    """The ``config.json`` of the dense variant (Transformers' ``Qwen3Config`` fields): the
    MoE config's attention and sizes without :data:`MOE_ONLY`; its MLP is ``intermediate_size``
    wide.

    Args:
        overrides: dimensions to change (keys of :data:`DIMENSIONS`).

    Raises:
        KeyError: an override names no dimension.
    """
    config = {k: v for k, v in tiny_moe_config(**overrides).items() if k not in MOE_ONLY}
    return {**config, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}


def tensor_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor of the checkpoint with its shape (rows, columns), in the HF layout: per
    expert projections and a router for the MoE config, one MLP per layer for the dense one
    (a config without ``num_experts``)."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    vocab, dense = config["vocab_size"], "num_experts" not in config
    inter = config["intermediate_size" if dense else "moe_intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden),
                                          "model.norm.weight": (hidden,),
                                          "lm_head.weight": (vocab, hidden)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
        })
        if not dense:
            shapes[p + "mlp.gate.weight"] = (config["num_experts"], hidden)
        for e in [f"{p}mlp."] if dense else [f"{p}mlp.experts.{expert}."
                                              for expert in range(config["num_experts"])]:
            shapes.update({e + "gate_proj.weight": (inter, hidden),
                           e + "up_proj.weight": (inter, hidden),
                           e + "down_proj.weight": (hidden, inter)})
    return shapes


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """Write a word-level tokenizer of ``vocab_size`` tokens (``t3`` ... ) into ``folder``.

    For servers that need a tokenizer (``sglang.bench_serving`` reads one to make its random
    prompts): ids 0-2 are ``<unk>``, ``<s>`` and ``</s>`` (the config's BOS and EOS), id
    ``i`` above them is the word ``t<i>``; text is split on whitespace. Needs the
    ``tokenizers`` and ``transformers`` packages (SGLang's own dependencies).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call,unused-ignore]
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(folder))


def write_model(out: Path, seed: int = 0, overrides: dict[str, int] | None = None, *,
                tokenizer: bool = False, dense: bool = False) -> dict[str, Any]:
    """Write ``config.json`` and ``model.safetensors`` (bf16, normal(0, 0.02); norms 1).

    Args:
        out: an empty or new folder.
        seed: the weights' random seed.
        overrides: dimensions to change (:func:`tiny_moe_config`), e.g. a real model's
            widths with fewer layers.
        tokenizer: also write :func:`write_tokenizer`'s tokenizer.
        dense: write the dense Qwen3 (:func:`tiny_dense_config`) instead of the MoE one.

    Returns:
        ``{"path", "parameters", "bytes", "config"}``.

    Raises:
        FileExistsError: ``out`` exists and is not an empty folder.
        KeyError: an override names no dimension.
    """
    import torch
    from safetensors.torch import save_file

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty folder")
    # Written beside it and renamed: an interrupted run leaves no half model at ``out``.
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    config = (tiny_dense_config if dense else tiny_moe_config)(**(overrides or {}))
    tensors = {}
    try:
        partial.chmod(0o755)
        generator = torch.Generator().manual_seed(seed)
        for name, shape in tensor_shapes(config).items():
            if len(shape) == 1:  # RMSNorm weights
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(shape, generator=generator) * 0.02).to(
                    torch.bfloat16)
        save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
        # safetensors writes 0600: a server running as another user must read it too.
        (partial / "model.safetensors").chmod(0o644)
        (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if tokenizer:
            write_tokenizer(partial, config["vocab_size"])
        if out.exists():
            out.rmdir()
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return {"path": str(out), "parameters": sum(t.numel() for t in tensors.values()),
            "bytes": (out / "model.safetensors").stat().st_size,
            "config": {k: config[k] for k in DIMENSIONS if k in config}}


def _dimension(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or name not in DIMENSIONS or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write NAME=N, N a positive integer, NAME one of "
            + ", ".join(DIMENSIONS))
    return name, int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="an empty or new folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", type=_dimension, action="append", default=[],
                        metavar="NAME=N", help="change one dimension, e.g. hidden_size=2048")
    parser.add_argument("--tokenizer", action="store_true",
                        help="also write a word-level tokenizer of the vocabulary")
    parser.add_argument("--dense", action="store_true",
                        help="a dense Qwen3 (Qwen3ForCausalLM, one MLP of intermediate_size "
                             "per layer) instead of the MoE model")
    args = parser.parse_args(argv)
    try:
        print(json.dumps(write_model(args.out, args.seed, dict(args.set),
                                     tokenizer=args.tokenizer, dense=args.dense)))
    except FileExistsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
