/*
 * zdp/llama.h -- the Llama family (Llama 3, Qwen3, SmolLM2): the model.
 * Part of the public API; include zdp/zdp.h for all of it.  Hugging Face
 * checkpoint folders (config.json + safetensors) are zdp/hf.h's.
 */
#ifndef ZDP_PUBLIC_LLAMA_H
#define ZDP_PUBLIC_LLAMA_H

#include "zdp/core.h"
#include "zdp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* transformers' LlamaForCausalLM and Qwen3ForCausalLM, in fp32:
 *
 *   x = embed_tokens[inputs]
 *   per layer:  h = input_layernorm(x)                       (RMSNorm)
 *               q = q_proj(h), k = k_proj(h), v = v_proj(h)  (n_head, n_kv_head heads of head_dim)
 *               Qwen3: q = q_norm(q), k = k_norm(k) per head (RMSNorm over head_dim)
 *               q, k rotated (RoPE, rope_theta, rope scaling)
 *               x = x + o_proj(causal GQA attention(q, k, v))
 *               x = x + down_proj(silu(gate_proj(h2)) * up_proj(h2)),  h2 = post_attention_layernorm(x)
 *   logits = lm_head(norm(x))  (lm_head = embed_tokens when tied)
 *   loss = mean cross-entropy over all B*T positions (zdp_lm_batch)
 *
 * RMSNorm(x) = x / sqrt(mean(x^2) + rms_norm_eps) * weight.  Linear layers are
 * torch.nn.Linear: weight [out, in], y = x W^T (+ b).
 *
 * Parameters, in registration order, with transformers' names and layouts,
 * so a safetensors file of the model copies in tensor by tensor
 * (H = hidden, NH = n_head, KV = n_kv_head, hd = head_dim, F = ffn, V = vocab):
 *   model.embed_tokens.weight [V, H]
 *   per layer i, prefix model.layers.{i}.:
 *     input_layernorm.weight [H]
 *     self_attn.q_proj.weight [NH*hd, H]   self_attn.q_proj.bias [NH*hd]  (attention_bias)
 *     self_attn.k_proj.weight [KV*hd, H]   self_attn.k_proj.bias [KV*hd]  (attention_bias)
 *     self_attn.v_proj.weight [KV*hd, H]   self_attn.v_proj.bias [KV*hd]  (attention_bias)
 *     self_attn.o_proj.weight [H, NH*hd]   self_attn.o_proj.bias [H]      (attention_bias)
 *     self_attn.q_norm.weight [hd]         self_attn.k_norm.weight [hd]   (qk_norm: Qwen3)
 *     post_attention_layernorm.weight [H]
 *     mlp.gate_proj.weight [F, H]  mlp.up_proj.weight [F, H]  mlp.down_proj.weight [H, F]
 *   model.norm.weight [H]
 *   lm_head.weight [V, H]   (only when not tied)
 */
typedef enum zdp_llama_arch {
    ZDP_ARCH_LLAMA = 0, /* model_type "llama" (Llama 3, SmolLM2) */
    ZDP_ARCH_QWEN3 = 1  /* model_type "qwen3": per-head q/k RMSNorm */
} zdp_llama_arch;

typedef enum zdp_rope_type {
    ZDP_ROPE_DEFAULT = 0, /* rope_scaling absent or null */
    ZDP_ROPE_LINEAR = 1,  /* positions divided by factor */
    ZDP_ROPE_LLAMA3 = 2   /* Llama 3.1's frequency-dependent scaling */
} zdp_rope_type;

typedef struct zdp_llama_config {
    zdp_llama_arch arch;
    int n_layer;      /* num_hidden_layers */
    int hidden;       /* hidden_size, H */
    int n_head;       /* num_attention_heads, NH */
    int n_kv_head;    /* num_key_value_heads, KV: divides NH (grouped-query attention) */
    int head_dim;     /* head_dim, hd (may differ from H / NH, as in Qwen3) */
    int ffn;          /* intermediate_size, F */
    int vocab_size;   /* V */
    int block_size;   /* the longest sequence zdp runs, <= max_position_embeddings */
    int max_position_embeddings;
    float rms_norm_eps;
    double rope_theta;
    zdp_rope_type rope_type;
    double rope_factor;            /* linear and llama3 */
    double rope_low_freq_factor;   /* llama3 */
    double rope_high_freq_factor;  /* llama3 */
    int rope_original_max_position; /* llama3: original_max_position_embeddings */
    int qk_norm;             /* 1: Qwen3's q_norm/k_norm (set by arch QWEN3) */
    int attention_bias;      /* 1: q, k, v and o projections have biases */
    int tie_word_embeddings; /* 1: lm_head is embed_tokens (no lm_head.weight) */
    double initializer_range; /* init std (config.json's initializer_range, 0.02) */
} zdp_llama_config;

/* Creates the model (its zdp_model interface, a causal LM, in *out) with
 * activation memory for micro-batches of up to max_batch sequences of
 * block_size tokens.  Errors name the bad field (n_kv_head must divide
 * n_head, ...).  The batch of forward is a zdp_lm_batch. */
ZDP_API zdp_status zdp_llama_create(const zdp_llama_config *cfg, int max_batch, zdp_model *out,
                                    zdp_error *err);
ZDP_API void zdp_llama_destroy(zdp_model *model);
/* NULL when the model is not from zdp_llama_create. */
ZDP_API const zdp_llama_config *zdp_llama_config_of(const zdp_model *model);
/* transformers' initialisation, seeded: Linear and embedding weights
 * N(0, initializer_range), biases 0, RMSNorm weights 1. */
ZDP_API void zdp_llama_init_params(const zdp_model *model, float *const *params, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_LLAMA_H */
