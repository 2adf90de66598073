"""The text families ``try_families.py`` plans: 29 transformers models the zoo does not hold.

Width 32, two layers (three for RecurrentGemma), two heads, 16 tokens, batch 2, dropout
on where the family has it: decoders, encoders, encoder-decoders, mixtures of experts
and state space or recurrent models (RWKV, Mamba2, Jamba, RecurrentGemma).
"""

from __future__ import annotations

from _family_builders import TOKENS, Builder, text_family

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
TEXT: dict[str, Builder] = {
    "opt": text_family(
        "OPTConfig", "OPTForCausalLM", ffn_dim=64, word_embed_proj_dim=32, dropout=0.1, **_BERT
    ),
    "gpt_neo": text_family(
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
    "bloom": text_family(
        "BloomConfig",
        "BloomForCausalLM",
        hidden_size=32,
        n_layer=2,
        n_head=2,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    ),
    "falcon": text_family(
        "FalconConfig", "FalconForCausalLM", hidden_dropout=0.1, attention_dropout=0.1, **_BERT
    ),
    "mistral": text_family(
        "MistralConfig",
        "MistralForCausalLM",
        num_key_value_heads=1,
        attention_dropout=0.1,
        **_BERT_FF,
    ),
    "gemma": text_family(
        "GemmaConfig", "GemmaForCausalLM", num_key_value_heads=1, head_dim=16, **_BERT_FF
    ),
    "distilbert": text_family(
        "DistilBertConfig", "DistilBertForMaskedLM", dim=32, n_layers=2, n_heads=2, hidden_dim=64
    ),
    "roberta": text_family("RobertaConfig", "RobertaForMaskedLM", **_BERT_FF),
    "electra": text_family("ElectraConfig", "ElectraForMaskedLM", embedding_size=32, **_BERT_FF),
    "deberta_v2": text_family("DebertaV2Config", "DebertaV2ForMaskedLM", **_BERT_FF),
    "mpnet": text_family("MPNetConfig", "MPNetForMaskedLM", **_BERT_FF),
    "xlnet": text_family(
        "XLNetConfig", "XLNetLMHeadModel", d_model=32, n_layer=2, n_head=2, d_inner=64
    ),
    "funnel": text_family(
        "FunnelConfig",
        "FunnelForMaskedLM",
        d_model=32,
        block_sizes=[1, 1],
        num_decoder_layers=1,
        n_head=2,
        d_head=16,
        d_inner=64,
    ),
    "convbert": text_family("ConvBertConfig", "ConvBertForMaskedLM", embedding_size=32, **_BERT_FF),
    "mobilebert": text_family(
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
    "bart": text_family("BartConfig", "BartForConditionalGeneration", seq2seq=True, **_SEQ2SEQ),
    "pegasus": text_family(
        "PegasusConfig", "PegasusForConditionalGeneration", seq2seq=True, **_SEQ2SEQ
    ),
    "reformer": text_family(
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
    "rwkv": text_family(
        "RwkvConfig",
        "RwkvForCausalLM",
        hidden_size=32,
        num_hidden_layers=2,
        attention_hidden_size=32,
        intermediate_size=64,
        context_length=TOKENS,
    ),
    "mamba2": text_family(
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
    "jamba": text_family(
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
    "recurrent_gemma": text_family(
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
    "olmoe": text_family(
        "OlmoeConfig",
        "OlmoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "qwen2_moe": text_family(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "phimoe": text_family(
        "PhimoeConfig",
        "PhimoeForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "granitemoe": text_family(
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        num_key_value_heads=2,
        **_BERT_FF,
    ),
    "gpt_bigcode": text_family(
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        n_embd=32,
        n_layer=2,
        n_head=2,
        multi_query=True,
    ),
    "stablelm": text_family(
        "StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2, **_BERT_FF
    ),
    "xglm": text_family(
        "XGLMConfig", "XGLMForCausalLM", d_model=32, num_layers=2, attention_heads=2, ffn_dim=64
    ),
}
