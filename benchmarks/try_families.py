"""Plan 29 transformers families the zoo does not hold, as a new user would, and check them.

Each family is a tiny random configuration (width 32, two layers, three for RecurrentGemma,
two heads, 16 tokens, batch 2, dropout on where the family has it), trained through its
own loss (``labels``): decoders, encoders, encoder-decoders, mixtures of experts and state
space or recurrent models (RWKV, Mamba2, Jamba, RecurrentGemma). For each budget
(0.5, 0.25): ``plan_checkpointing`` on a copy, ``plan.apply``, one training step
compared with the plain model's (the loss and every gradient bit-equal, the same seed),
``plan.measure`` (activations measured against the estimate and the budget), a second
step (bit-equal again), then a step of a second instance never planned (planning must
leave nothing behind that breaks it). A family that raises is reported with the error;
the planner's warnings are reported, the model's own are not.

Reformer reseeds torch's generator with ``torch.seed()`` in every forward where no CUDA
generator exists (``_init_attention_seed``), so its plain step differs from itself; for
that family alone ``torch.seed`` returns a fixed number while it is checked.

With ``--compile``, each plan is also compiled (``aot_eager``) and judged against the
compiled plain model: graph breaks added, saved bytes against the plan's compiled
estimate + 2% (copies of parameters not counted), bit-equality, and whether the plan's
note said the compiled step would break (a module keeping a state in forward).

Usage: python benchmarks/try_families.py [--family opt,bart,...] [--compile]
Writes ``benchmarks/results/try-families-cpu-DATE.json`` (``try-families-compiled-...``).
"""

from __future__ import annotations

import argparse
import copy
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from _compiled_plan import MARGIN, counted_graph_breaks
from _report import print_table, write_results
from torch import nn

BATCH, TOKENS, VOCAB = 2, 16, 100
BUDGETS = (0.5, 0.25)
Built = tuple[nn.Module, dict[str, torch.Tensor]]


def _ids() -> torch.Tensor:
    return torch.randint(3, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))


def _family(config: str, model: str, seq2seq: bool = False, **sizes: Any) -> Callable[[], Built]:
    def build() -> Built:
        import transformers

        settings = getattr(transformers, config)(vocab_size=VOCAB, **sizes)
        ids = _ids()
        labels = ids.flip(1) if seq2seq else ids
        return getattr(transformers, model)(settings), {"input_ids": ids, "labels": labels}

    return build


_BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
_BERT_FF = {**_BERT, "intermediate_size": 64}
_SEQ2SEQ = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}
FAMILIES: dict[str, Callable[[], Built]] = {
    "opt": _family(
        "OPTConfig", "OPTForCausalLM", ffn_dim=64, word_embed_proj_dim=32, dropout=0.1, **_BERT
    ),
    "gpt_neo": _family(
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        hidden_size=32,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        window_size=8,
        embed_dropout=0.1,
        resid_dropout=0.1,
        attention_dropout=0.1,
    ),
    "bloom": _family(
        "BloomConfig",
        "BloomForCausalLM",
        hidden_size=32,
        n_layer=2,
        n_head=2,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    ),
    "falcon": _family(
        "FalconConfig", "FalconForCausalLM", hidden_dropout=0.1, attention_dropout=0.1, **_BERT
    ),
    "mistral": _family(
        "MistralConfig",
        "MistralForCausalLM",
        num_key_value_heads=1,
        attention_dropout=0.1,
        **_BERT_FF,
    ),
    "gemma": _family(
        "GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1, head_dim=16, **_BERT_FF
    ),
    "distilbert": _family(
        "DistilBertConfig", "DistilBertForMaskedLM", dim=32, n_layers=2, n_heads=2, hidden_dim=64
    ),
    "roberta": _family("RobertaConfig", "RobertaForMaskedLM", **_BERT_FF),
    "electra": _family("ElectraConfig", "ElectraForMaskedLM", embedding_size=32, **_BERT_FF),
    "deberta_v2": _family("DebertaV2Config", "DebertaV2ForMaskedLM", **_BERT_FF),
    "mpnet": _family("MPNetConfig", "MPNetForMaskedLM", **_BERT_FF),
    "xlnet": _family(
        "XLNetConfig", "XLNetLMHeadModel", d_model=32, n_layer=2, n_head=2, d_inner=64
    ),
    "funnel": _family(
        "FunnelConfig",
        "FunnelForMaskedLM",
        d_model=32,
        block_sizes=[1, 1],
        num_decoder_layers=1,
        n_head=2,
        d_head=16,
        d_inner=64,
    ),
    "convbert": _family("ConvBertConfig", "ConvBertForMaskedLM", embedding_size=32, **_BERT_FF),
    "mobilebert": _family(
        "MobileBertConfig",
        "MobileBertForMaskedLM",
        hidden_size=32,
        embedding_size=16,
        intra_bottleneck_size=16,
        true_hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_feedforward_networks=2,
    ),
    "bart": _family("BartConfig", "BartForConditionalGeneration", seq2seq=True, **_SEQ2SEQ),
    "pegasus": _family(
        "PegasusConfig", "PegasusForConditionalGeneration", seq2seq=True, **_SEQ2SEQ
    ),
    "reformer": _family(
        "ReformerConfig",
        "ReformerModelWithLMHead",
        hidden_size=32,
        attention_head_size=16,
        num_attention_heads=2,
        feed_forward_size=64,
        attn_layers=["local", "lsh", "local", "lsh"],
        axial_pos_shape=[4, 4],
        axial_pos_embds_dim=[16, 16],
        is_decoder=True,
        local_attn_chunk_length=8,
        lsh_attn_chunk_length=8,
        num_buckets=2,
        max_position_embeddings=TOKENS,
    ),
    "rwkv": _family(
        "RwkvConfig",
        "RwkvForCausalLM",
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
        context_length=TOKENS,
    ),
    "mamba2": _family(
        "Mamba2Config",
        "Mamba2ForCausalLM",
        hidden_size=32,
        num_hidden_layers=2,
        num_heads=4,
        head_dim=16,
        state_size=8,
        n_groups=1,
        expand=2,
        chunk_size=8,
    ),
    "jamba": _family(
        "JambaConfig",
        "JambaForCausalLM",
        num_experts=2,
        num_experts_per_tok=1,
        num_key_value_heads=1,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        use_mamba_kernels=False,
        **_BERT_FF,
    ),
    "recurrent_gemma": _family(
        "RecurrentGemmaConfig",
        "RecurrentGemmaForCausalLM",
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        lru_width=32,
        attention_window_size=8,
        conv1d_width=4,
        head_dim=16,
    ),
    "olmoe": _family(
        "OlmoeConfig",
        "OlmoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "qwen2_moe": _family(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "phimoe": _family(
        "PhimoeConfig",
        "PhimoeForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "granitemoe": _family(
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "gpt_bigcode": _family(
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        n_embd=32,
        n_layer=2,
        n_head=2,
        multi_query=True,
    ),
    "stablelm": _family("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2, **_BERT_FF),
    "xglm": _family(
        "XGLMConfig", "XGLMForCausalLM", d_model=32, num_layers=2, attention_heads=2, ffn_dim=64
    ),
}
#: Families whose forward reseeds torch's generator from the OS (``torch.seed()``).
RESEEDING = ("reformer",)


@contextmanager
def _fixed_torch_seed() -> Iterator[None]:
    """``torch.seed()`` returns a fixed number (Reformer's reseeding, made repeatable)."""
    original = torch.seed
    torch.seed = lambda: 12345  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.seed = original  # type: ignore[assignment]


def _gradients(model: nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    """``loss`` and every gradient after its backward; the gradients then cleared."""
    loss.backward()
    grads = [loss.detach()]
    grads += [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def _step(model: nn.Module, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The loss and every gradient of one training step, from seed 7."""
    torch.manual_seed(7)
    return _gradients(model, model(**inputs).loss)


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _compiled(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[int, int, list[Any]]:
    """Graph breaks, saved bytes and the step's loss and gradients, compiled (aot_eager)."""
    from checkpointing._measure import graph_saved_bytes

    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    torch.manual_seed(7)
    out, breaks = counted_graph_breaks(lambda: compiled(**inputs))
    exclude = [*model.parameters(), *model.buffers()]
    saved = graph_saved_bytes(out.loss, exclude, copies_of=exclude)
    return breaks, saved, _gradients(model, out.loss)


def _judge_compiled(model: nn.Module, planned: nn.Module, plan: Any, inputs: Any) -> dict[str, Any]:
    """The compiled plan against the compiled plain model: breaks, memory, exactness."""
    breaks, _, expected = _compiled(model, inputs)
    planned_breaks, saved, got = _compiled(planned, inputs)
    limit = (plan.compiled_estimated_bytes + MARGIN * plan.plain_bytes) / plan.plain_bytes
    return {
        "graph_breaks_added": planned_breaks - breaks,
        "saved_ratio": saved / plan.plain_bytes,
        "limit": limit,
        "within": saved / plan.plain_bytes <= limit,
        "exact": _equal(got, expected),
        # Where the note names calls that keep a state in forward, dynamo's breaks there
        # are what the plan said would happen.
        "said_so": "rebind attributes" in plan.note,
    }


def try_family(name: str, budget: float, compiled: bool = False) -> dict[str, Any]:
    """Plan, apply, train and measure one family at one budget; the findings.

    With ``compiled``, the planned model is also compiled (``aot_eager``) and judged
    against the compiled plain model.
    """
    from checkpointing import plan_checkpointing

    fixed = _fixed_torch_seed() if name in RESEEDING else nullcontext()
    started = time.perf_counter()
    try:
        with fixed, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.manual_seed(0)
            model, inputs = FAMILIES[name]()
            model.train()
            # Copied before any step: a model may keep its step's tensors (RecurrentGemma
            # its recurrent state), which deepcopy refuses.
            planned = copy.deepcopy(model)
            reference = _step(model, inputs)
            plan = plan_checkpointing(planned, inputs, budget)
            plan.apply(planned)
            exact = _equal(_step(planned, inputs), reference)
            report = plan.measure(planned, inputs)
            again = _equal(_step(planned, inputs), reference)
            torch.manual_seed(0)
            other, _ = FAMILIES[name]()
            _step(other.train(), inputs)  # a second instance, never planned
            judged = _judge_compiled(model, planned, plan, inputs) if compiled else None
    except Exception as error:  # the finding is the error, reported per family
        return {"family": name, "budget": budget, "error": f"{type(error).__name__}: {error}"}
    return {
        "family": name,
        "budget": budget,
        "error": None,
        "exact": exact,
        "exact_again": again,
        "measured_ratio": report.activation_bytes / report.plain_bytes,
        "estimated_ratio": plan.estimated_bytes / plan.plain_bytes,
        "over_budget": report.over_budget,
        "decisions": sorted(set(plan.decisions.values())),
        "seeded_by_torch_seed_fixed": name in RESEEDING,
        # The planner's own (a decoder's KV cache switched off), once each.
        "warnings": sorted({str(w.message) for w in caught if "checkpointing" in str(w.message)}),
        "compiled": judged,
        "seconds": time.perf_counter() - started,
    }


def _compiled_cell(judged: dict[str, Any]) -> str:
    return (
        f"{judged['graph_breaks_added']}, {judged['saved_ratio']:.3f}x, {judged['limit']:.3f}x, "
        f"{judged['exact']}, {judged['said_so']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="all", help="comma-separated, or all")
    parser.add_argument("--compile", action="store_true", help="also judge them compiled")
    args = parser.parse_args()
    torch.set_num_threads(1)
    import transformers

    names = list(FAMILIES) if args.family == "all" else args.family.split(",")
    torch._dynamo.config.recompile_limit = 64  # every family's forward compiled afresh
    found = [try_family(name, budget, args.compile) for name in names for budget in BUDGETS]
    rows = [
        (
            r["family"],
            r["budget"],
            r["error"][:60]
            if r["error"]
            else f"{r['exact'] and r['exact_again']}, {r['measured_ratio']:.3f}x "
            f"(est. {r['estimated_ratio']:.3f}x), over budget: {r['over_budget']}",
        )
        for r in found
    ]
    print_table(("family", "budget", "exact, measured (estimate)"), rows)
    if args.compile:
        print_table(
            ("family", "budget", "compiled: breaks added, saved, limit, exact, note said so"),
            [
                (r["family"], r["budget"], _compiled_cell(r["compiled"]))
                for r in found
                if not r["error"]
            ],
        )
    failed = [r for r in found if r["error"] or not (r["exact"] and r["exact_again"])]
    print(f"{len(found) - len(failed)} of {len(found)} plans exact, without an error")
    path = write_results(
        "try-families-compiled" if args.compile else "try-families",
        "cpu",
        {
            "transformers": transformers.__version__,
            "torch_version": torch.__version__,
            "threads": 1,
            "plans": found,
            "failed": len(failed),
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
