/*
 * zdp/lora.h -- LoRA (low-rank adapters, PEFT's conventions) on GPT-2 and
 * the Llama family; the PEFT adapter folder.  docs/lora.md.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_LORA_H
#define ZDP_PUBLIC_LORA_H

#include "zdp/core.h"
#include "zdp/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each targeted linear y = W x (+ b) of the base becomes
 *   y = W x (+ b) + (alpha / rank) * B (A x),   A [rank, in], B [out, rank]
 * (PEFT's LoRA; A from nn.Linear's default init, Kaiming-uniform with
 * a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)), B zero, so a fresh adapter
 * leaves the base's output unchanged).  Targets, as Tinker's LoraConfig:
 *   ZDP_LORA_ATTN     Llama q_proj, k_proj, v_proj, o_proj; GPT-2 attn.c_attn, attn.c_proj
 *   ZDP_LORA_MLP      Llama gate_proj, up_proj, down_proj; GPT-2 mlp.c_fc, mlp.c_proj
 *   ZDP_LORA_UNEMBED  lm_head (for a tied model, the output projection only)
 */
enum {
    ZDP_LORA_ATTN = 1,
    ZDP_LORA_MLP = 2,
    ZDP_LORA_UNEMBED = 4,
    ZDP_LORA_ALL = 7
};

/* Single modules, for PEFT's target_modules in part (["q_proj", "v_proj"]):
 * zdp_lora_config.modules.  Tinker's LoraConfig speaks in the three groups
 * above; these narrow a group to some of its modules. */
enum {
    ZDP_LORA_Q_PROJ = 1 << 0,      /* Llama family: self_attn.q_proj */
    ZDP_LORA_K_PROJ = 1 << 1,
    ZDP_LORA_V_PROJ = 1 << 2,
    ZDP_LORA_O_PROJ = 1 << 3,
    ZDP_LORA_GATE_PROJ = 1 << 4,   /* mlp.gate_proj */
    ZDP_LORA_UP_PROJ = 1 << 5,
    ZDP_LORA_DOWN_PROJ = 1 << 6,
    ZDP_LORA_C_ATTN = 1 << 7,      /* GPT-2: attn.c_attn (q, k, v fused) */
    ZDP_LORA_ATTN_C_PROJ = 1 << 8, /* attn.c_proj */
    ZDP_LORA_C_FC = 1 << 9,        /* mlp.c_fc */
    ZDP_LORA_MLP_C_PROJ = 1 << 10, /* mlp.c_proj */
    ZDP_LORA_LM_HEAD = 1 << 11,    /* both families */
    ZDP_LORA_MODULES_ALL = (1 << 12) - 1
};

#define ZDP_LORA_DEFAULT_ALPHA 32.0f

typedef struct zdp_lora_config {
    int rank;       /* r >= 1, at most min(in, out) of every targeted linear */
    float alpha;    /* lora_alpha > 0; 0 means ZDP_LORA_DEFAULT_ALPHA (32); scaling alpha / rank */
    int targets;    /* ZDP_LORA_* bits, at least one */
    uint64_t seed;  /* A's initialisation */
    /* 0: every module of the target groups.  Else ZDP_LORA_Q_PROJ..LM_HEAD
     * bits, each of the model's family and of a group in targets: a group
     * with any of its modules here adapts only those, the other targeted
     * groups whole (PEFT's target_modules ["q_proj", "v_proj"] is targets
     * ZDP_LORA_ATTN, modules ZDP_LORA_Q_PROJ | ZDP_LORA_V_PROJ). */
    int modules;
} zdp_lora_config;

/* Creates a LoRA model over base (from zdp_gpt_create or zdp_llama_create)
 * and its weights base_params (base->n_params tensors, read-only, never seen
 * by the engine).  The LoRA model's parameters are only the adapters, in
 * site order (per block, then lm_head), A then B for each targeted linear,
 * named as PEFT names them:
 *   base_model.model.<module>.lora_A.weight [rank, in]
 *   base_model.model.<module>.lora_B.weight [out, rank]
 * so the engine partitions and optimizes the adapters alone.  base and
 * base_params are borrowed: they must outlive the LoRA model.  Several LoRA
 * models may share one base and one base_params; they run one at a time
 * (a backward whose forward ran through another model is refused).
 * Errors name the field: rank < 1 or larger than a target's dimensions
 * (naming the module and its shape), alpha, unknown target bits, a module
 * of the other family or outside targets, a targeted group left with no
 * module, a base that is not GPT-2 or the Llama family. */
ZDP_API zdp_status zdp_lora_create(const zdp_model *base, const float *const *base_params,
                                   const zdp_lora_config *cfg, zdp_model *out, zdp_error *err);
/* The same LoRA model over a base no process holds whole: its weights are
 * read through read(read_ctx, ...) (zdp_tensor_read_fn, e.g.
 * zdp_hf_reader_read), only by a ZeRO stage-3 engine at
 * zdp_engine_create, each rank its partition's slice of each tensor
 * (zdp_frozen); read_ctx need live only until then.  Run it through that
 * engine alone: a forward or next_logits outside a stage-3 engine is
 * ZDP_ERR_STATE, and zdp_lora_merge cannot merge it.  Errors as
 * zdp_lora_create's. */
ZDP_API zdp_status zdp_lora_create_partitioned(const zdp_model *base, zdp_tensor_read_fn read,
                                               void *read_ctx, const zdp_lora_config *cfg,
                                               zdp_model *out, zdp_error *err);
ZDP_API void zdp_lora_destroy(zdp_model *model);
/* NULL when the model is not from zdp_lora_create. */
ZDP_API const zdp_lora_config *zdp_lora_config_of(const zdp_model *model);
ZDP_API const zdp_model *zdp_lora_base_of(const zdp_model *model);
/* PEFT's initialisation from cfg->seed: A Kaiming-uniform, B zero. */
ZDP_API void zdp_lora_init_params(const zdp_model *model, float *const *params);

/* "attn,mlp,unembed" (any subset, comma-separated; "all") -> ZDP_LORA_*
 * group bits in *targets.  With modules not NULL, single modules too
 * ("q_proj,v_proj,mlp": attention in part, the MLP whole): their groups
 * join *targets and their bits go to *modules (0 when none is named).  An
 * unknown name is refused naming it and the accepted ones. */
ZDP_API zdp_status zdp_lora_targets_parse(const char *list, int *targets, int *modules,
                                          zdp_error *err);
/* targets and modules as that list ("attn,mlp"; "q_proj,v_proj,mlp"); buf
 * of ZDP_LORA_TARGETS_NAME_MAX bytes holds any. */
#define ZDP_LORA_TARGETS_NAME_MAX 128
ZDP_API void zdp_lora_targets_name(int targets, int modules, char *buf, size_t size);
/* Whether the module `bit` (ZDP_LORA_Q_PROJ..) is adapted under c. */
ZDP_API int zdp_lora_adapts(const zdp_lora_config *c, int bit);
/* A module's name as PEFT's target_modules and transformers' module paths
 * end ("q_proj", "attn.c_attn", "lm_head") -> its ZDP_LORA_* module bit and
 * (in *group, when not NULL) its group; 0 when zdp adapts no such module. */
ZDP_API int zdp_lora_module_bit(const char *name, int *group);
/* The bit's name as above ("q_proj"); NULL for anything but one module bit. */
ZDP_API const char *zdp_lora_module_name(int bit);

/* The merged weights: merged[i] (base->n_params tensors, the base's
 * layouts) = base tensor i, plus (alpha / rank) B A on each targeted weight
 * (transposed into a Conv1D [in, out] weight, as PEFT merges with
 * fan_in_fan_out).  A tied lm_head cannot take the product without changing
 * the embedding: ZDP_ERR_INVALID_ARG unless merged_head is not NULL, which
 * then receives the untied lm_head [V, hidden] (embedding + product) and
 * the embedding stays as it was. */
ZDP_API zdp_status zdp_lora_merge(const zdp_model *model, const float *const *adapter,
                                  float *const *merged, float *merged_head, zdp_error *err);

/* ---- the PEFT adapter folder ----------------------------------------------
 * dir/adapter_model.safetensors (F32, the parameter names above) and
 * dir/adapter_config.json (peft_type "LORA", r, lora_alpha, target_modules,
 * base_model_name_or_path, fan_in_fan_out (true for GPT-2), bias "none",
 * task_type "CAUSAL_LM"), written through temporary files renamed in place. */
ZDP_API zdp_status zdp_lora_save_adapter(const char *dir, const zdp_model *model,
                                         const float *const *adapter,
                                         const char *base_model_name, zdp_error *err);
/* Reads dir/adapter_config.json into *cfg (rank, alpha, targets from
 * target_modules, and modules when a group is listed in part; seed 0):
 * refused when peft_type is not LORA, a target module is not one zdp
 * adapts, or bias is not "none". */
ZDP_API zdp_status zdp_lora_read_adapter_config(const char *dir, zdp_lora_config *cfg,
                                                zdp_error *err);
/* Loads dir/adapter_model.safetensors into adapter (the model's tensors):
 * every tensor must be present with its shape; a tensor of another shape (an
 * adapter for another base or rank) is refused naming the tensor and both
 * shapes, a missing or extra tensor naming it. */
ZDP_API zdp_status zdp_lora_load_adapter(const char *dir, const zdp_model *model,
                                         float *const *adapter, zdp_error *err);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_LORA_H */
