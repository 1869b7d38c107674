/*
 * checkpoint_format.h -- internal: the checkpoint format on disk, shared by
 * checkpoint_format.c (files, checksums, reading meta.json, inspect and
 * export) and checkpoint.c (save and load).  Nothing outside src/engine
 * includes it.
 */
#ifndef ZDP_CHECKPOINT_FORMAT_H
#define ZDP_CHECKPOINT_FORMAT_H

#include <jansson.h>

#include "../core/core.h"
#include "zdp/io.h"

#define ZDP_CKPT_FORMAT_NAME "zdp-checkpoint"
#define ZDP_CKPT_FORMAT_VERSION 2
#define ZDP_CKPT_META_SUM_KEY "meta_fnv1a64"
#define ZDP_CKPT_PATH_MAX 4096

/* ---- files ---- */

/* FNV-1a 64 of a whole file, and its size.  -1 on I/O error. */
int zdp_ckpt_file_digest_(const char *path, uint64_t *hash, int64_t *size);
/* The 16 hex digits of the last "meta_fnv1a64": "..." in text[0, n), or
 * NULL. */
char *zdp_ckpt_meta_sum_digits_(char *text, size_t n);
/* FNV-1a 64 of text[0, n) with the 16 bytes at digits read as '0's. */
uint64_t zdp_ckpt_meta_sum_(const char *text, size_t n, const char *digits);
void zdp_ckpt_fsync_dir_(const char *dir);
/* Writes text to path through a temporary file, fsync and rename; -1 with
 * errno set. */
int zdp_ckpt_write_atomic_(const char *path, const char *text);
/* Removes a directory of plain files (one level; checkpoints have no more). */
void zdp_ckpt_rmdir_files_(const char *dir);
/* A tag is a plain file name: not empty, no '/', not "." or "..". */
bool zdp_ckpt_tag_ok_(const char *tag);

/* ---- reading a checkpoint ---- */

/* An opened checkpoint: meta.json parsed, its checksum and every listed
 * file's size and checksum verified. */
typedef struct ckpt_view {
    char dir[ZDP_CKPT_PATH_MAX];    /* dir/tag */
    char tag[256];
    json_t *meta;
    int world, stage;
    int version;            /* format_version: 1 has no meta checksum */
    int64_t numel, pending;
} ckpt_view;

/* Opens dir/tag (tag NULL: dir/latest's) and checks it; free with
 * zdp_ckpt_view_free_. */
zdp_status zdp_ckpt_view_open_(const char *dir, const char *tag, ckpt_view *v, zdp_error *err);
void zdp_ckpt_view_free_(ckpt_view *v);
/* obj[a] (or obj[a][b]) as an integer; 0 and *ok = false when it is not one. */
int64_t zdp_ckpt_get_int_(json_t *obj, const char *a, const char *b, bool *ok);
/* Tensor `name` of a safetensors file, checked to be F32 [n]; NULL with err
 * set otherwise (file names the file in the message). */
const zdp_tensor *zdp_ckpt_find_f32_(const zdp_safetensors *st, const char *name, int64_t n,
                                     const char *file, zdp_error *err);

#endif /* ZDP_CHECKPOINT_FORMAT_H */
