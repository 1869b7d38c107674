/*
 * zdp.h -- the public header of libzdp, a data-parallel training engine: it
 * includes every part of the API (listed below).
 *
 * zdp does what DeepSpeed's training engine does for ZeRO stages 0, 1 and 2,
 * reads DeepSpeed's ds_config.json, and follows DeepSpeed's training-loop
 * semantics (forward / backward / step, counters, batch-size rules), including
 * *unmanaged* gradient accumulation, where the caller owns the optimizer-step
 * boundary.  Ranks are MPI processes.  Anything not declared in these headers is
 * internal.
 *
 * Conventions
 *   - Every fallible function returns zdp_status (ZDP_OK == 0, errors < 0) and
 *     fills a caller-provided zdp_error with a message that names the thing
 *     (JSON path, file, field, rank), the value seen and the fix.  `err` may be
 *     NULL when the caller does not want the message.
 *   - The library never calls exit() or abort().
 *   - COLLECTIVE: every rank must make the call, in the same order.
 *
 * A minimal training loop (unmanaged accumulation, n chosen at run time):
 *
 *     zdp_config cfg;  zdp_engine *eng;  zdp_error err;  float loss;
 *     zdp_dist_init(&argc, &argv, &err);
 *     zdp_config_load_file("ds_config.json", zdp_dist_world_size(), &cfg, &err);
 *     zdp_engine_create(&cfg, &model, &eng, &err);
 *     for (step...) {
 *         for (int i = 0; i < n; i++) {
 *             zdp_engine_forward(eng, &batch[i], &loss, &err);
 *             zdp_engine_backward(eng, 0, 1.0f / n, &err);   // scale_wrt_gas off
 *         }
 *         zdp_engine_step(eng, &err);                        // always a boundary
 *     }
 *     zdp_engine_destroy(eng);
 *     zdp_dist_finalize();
 *
 * This header includes the whole API; its parts, by subject:
 *   zdp/core.h    status codes, zdp_error, ZDP_API, logging, splitmix64,
 *                 zdp_big_alloc (2 MB pages for weights)
 *   zdp/dist.h    the distributed runtime (MPI start-up, agreement)
 *   zdp/config.h  ds_config.json
 *   zdp/model.h   the model interface and the grad sink; the MLP
 *   zdp/engine.h  the engine, its reports and checkpoints
 *   zdp/gpt.h     the GPT-2 model and its weight files
 *   zdp/llama.h   the Llama family (Llama 3, Qwen3, SmolLM2)
 *   zdp/lora.h    LoRA adapters over GPT-2 and the Llama family; PEFT adapter folders
 *   zdp/data.h    token files, the arithmetic corpus, the dataset
 *   zdp/io.h      safetensors
 *   zdp/tokenizer.h  byte-level BPE tokenizers (tokenizer.json, GPT-2)
 *   zdp/hf.h      Hugging Face folders (config.json, sharded safetensors), the model factory
 *   zdp/sample.h  sampling: the KV cache, token choice, batched generation
 */
#ifndef ZDP_ZDP_H
#define ZDP_ZDP_H

#include "zdp/core.h"
#include "zdp/dist.h"
#include "zdp/config.h"
#include "zdp/model.h"
#include "zdp/engine.h"
#include "zdp/gpt.h"
#include "zdp/llama.h"
#include "zdp/lora.h"
#include "zdp/data.h"
#include "zdp/io.h"
#include "zdp/tokenizer.h"
#include "zdp/hf.h"
#include "zdp/sample.h"

#endif /* ZDP_ZDP_H */
