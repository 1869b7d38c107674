/*
 * zdp/tokenizer.h -- byte-level BPE tokenizers (Qwen3, Llama 3, GPT-2) read
 * from a Hugging Face folder: tokenizer.json (+ tokenizer_config.json), or
 * GPT-2's original encoder.json + vocab.bpe.  docs/models.md, "Tokenizers",
 * says what loads and what is refused.
 * Part of the public API; include zdp/zdp.h for all of it.
 */
#ifndef ZDP_PUBLIC_TOKENIZER_H
#define ZDP_PUBLIC_TOKENIZER_H

#include "zdp/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zdp_tokenizer zdp_tokenizer;

/* zdp_tokenizer_encode flags. */
#define ZDP_TOKENIZE_SPECIAL 1u /* text such as "<|endoftext|>" becomes the special token;
                                 * without it a special token's text is encoded as plain
                                 * text (added tokens that are not special always match) */

/* Loads the tokenizer of folder dir: dir/tokenizer.json when present (its
 * model, normalizer, pre_tokenizer, decoder and added_tokens), with the BOS
 * and EOS of dir/tokenizer_config.json when that exists; otherwise GPT-2's
 * dir/encoder.json + dir/vocab.bpe (or vocab.json + merges.txt), whose BOS
 * and EOS are <|endoftext|>.  Anything that is not byte-level BPE, or that
 * would change the result in a way zdp does not implement, is refused.
 * Errors name the file and the JSON key (ZDP_ERR_IO, ZDP_ERR_FORMAT,
 * ZDP_ERR_UNSUPPORTED).  *out is the caller's, freed with
 * zdp_tokenizer_destroy; NULL on error. */
ZDP_API zdp_status zdp_tokenizer_load(const char *dir, zdp_tokenizer **out, zdp_error *err);
/* The same from the text of a tokenizer.json held in memory (json[0..len),
 * no tokenizer_config.json: no BOS/EOS); origin names it in messages. */
ZDP_API zdp_status zdp_tokenizer_load_json(const char *json, size_t len, const char *origin,
                                           zdp_tokenizer **out, zdp_error *err);
ZDP_API void zdp_tokenizer_destroy(zdp_tokenizer *tok);

/* Encodes text[0..len) (any bytes: invalid UTF-8 is allowed) into *ids
 * (*n_ids of them; malloc'ed, the caller frees; NULL when 0).  Adds no
 * BOS/EOS.  Bytes that are not part of a well-formed UTF-8 character each
 * become the token of that byte, and the valid text on either side is
 * encoded as if they were a boundary (docs/models.md, "Tokenizers"), so
 * zdp_tokenizer_decode gives text back byte for byte (for tokenizers with an
 * NFC normalizer, text that is already NFC).  Reentrant: threads may encode
 * with one tokenizer at once.  ZDP_ERR_NOMEM. */
ZDP_API zdp_status zdp_tokenizer_encode(const zdp_tokenizer *tok, const char *text, size_t len,
                                        unsigned flags, int32_t **ids, size_t *n_ids,
                                        zdp_error *err);
/* Reads the whole file at path and encodes it as zdp_tokenizer_encode does
 * (for `zdp train --data FILE.txt`).  ZDP_ERR_IO names the file. */
ZDP_API zdp_status zdp_tokenizer_encode_file(const zdp_tokenizer *tok, const char *path,
                                             unsigned flags, int32_t **ids, size_t *n_ids,
                                             zdp_error *err);
/* Decodes ids[0..n) to bytes: *text (malloc'ed, NUL-terminated for
 * convenience, *len bytes not counting the NUL; the caller frees).  Special
 * tokens decode to their text.  ZDP_ERR_INVALID_ARG names the position of
 * an id that is not a token. */
ZDP_API zdp_status zdp_tokenizer_decode(const zdp_tokenizer *tok, const int32_t *ids, size_t n,
                                        char **text, size_t *len, zdp_error *err);

/* Largest token id + 1 (model.vocab and added_tokens together). */
ZDP_API int32_t zdp_tokenizer_vocab_size(const zdp_tokenizer *tok);
/* The id of a token written as tokenizer.json writes it ("<|im_end|>",
 * "Ġthe"), or -1. */
ZDP_API int32_t zdp_tokenizer_token_id(const zdp_tokenizer *tok, const char *token);
/* bos_token / eos_token of tokenizer_config.json (GPT-2: <|endoftext|>);
 * -1 when the folder names none. */
ZDP_API int32_t zdp_tokenizer_bos_id(const zdp_tokenizer *tok);
ZDP_API int32_t zdp_tokenizer_eos_id(const zdp_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif /* ZDP_PUBLIC_TOKENIZER_H */
