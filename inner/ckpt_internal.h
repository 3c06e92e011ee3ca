/* Checkpoint internals shared by inner/ckpt.c (writing, loading at the
 * same tp), inner/ckpt_manifest.c (the sharded layout's shard list) and
 * inner/ckpt_reshard.c (loading across tp). Not for use outside them. */
#ifndef LOCO_CKPT_INTERNAL_H
#define LOCO_CKPT_INTERNAL_H

#include <cjson/cJSON.h>

#include "inner/inner.h"

/* The single layout's files, verified and opened, and its tensors in the
 * order of a whole-model table: x[3 i + a] for a = 0 (parameters), 1
 * (exp_avg), 2 (exp_avg_sq; the moments only when asked for). */
typedef struct {
    loco_st *model, *optim;
    const float **x;
} loco__ckpt_single_src;

/* One shard as state.json lists it. */
typedef struct {
    const char *file;  /* inside the parsed state.json */
    size_t lo, hi;     /* flat range of its tp rank's slice */
    uint64_t xxh3;
    int rank;          /* tp rank of the slice */
    bool need;         /* the view needs some of it */
    loco_st *st;       /* once verified */
    const float *x[3]; /* params, exp_avg, exp_avg_sq from lo */
} loco__ckpt_shard_ref;

/* state.json's shard list, checked: the shards of every tp rank tile its
 * slice [0, P) in order. */
typedef struct {
    const char *dir;
    int tp, n;
    size_t P;
    loco__ckpt_shard_ref *s; /* (n) in state.json's order */
    int *order;              /* (n) indices into s grouped by tp rank, each group in order */
    int *first;              /* (tp + 1) rank k's group is order[first[k] .. first[k + 1]) */
} loco__ckpt_manifest;

/* ------------------------------------------------------------- ckpt.c */

/* The view's tensor-parallel degree: 1 for the whole model. */
int loco__ckpt_view_tp(const loco_ckpt_view *v);
/* True when the ranges [a, b) and [lo, hi) share an element. */
bool loco__ckpt_overlaps(size_t a, size_t b, size_t lo, size_t hi);
/* item as 16 hex digits into *out; -1 (no message recorded) otherwise. */
int loco__ckpt_parse_hex(const cJSON *item, uint64_t *out);
/* obj[key] as a number in [0, 9e15] into *out; -1 (no message) otherwise. */
int loco__ckpt_get_int(const cJSON *obj, const char *key, int64_t *out);
/* dir/name's XXH3 against want: LOCO_EPROTO when missing, unreadable or
 * different; `what` names the file in messages (NULL: name). */
int loco__ckpt_verify_hash(const char *dir, const char *name, const char *what, uint64_t want);
/* Verifies, then opens the single layout (moments too if asked) for the
 * whole-model table tt; on error s holds nothing, else close it. */
int loco__ckpt_open_single(loco__ckpt_single_src *s, const char *dir, const cJSON *sums,
                           const loco_ttable *tt, bool moments);
/* Releases what open_single opened and zeroes s (a zeroed s is fine). */
void loco__ckpt_close_single(loco__ckpt_single_src *s);

/* ---------------------------------------------------- ckpt_manifest.c */

/* Parses and checks j's shard list for a checkpoint of tp slices of P
 * parameters each (LOCO_EPROTO when it does not tile them); on error mf
 * holds nothing. mf's strings point into j, which must outlive it. */
int loco__ckpt_parse_manifest(loco__ckpt_manifest *mf, const char *dir, const cJSON *j, int tp,
                              size_t P);
/* Closes the opened shards, frees the table, zeroes mf (zeroed is fine). */
void loco__ckpt_manifest_fini(loco__ckpt_manifest *mf);
/* The shard of tp rank k that holds element x of its slice (x < P). */
loco__ckpt_shard_ref *loco__ckpt_shard_at(const loco__ckpt_manifest *mf, int k, size_t x);
/* Verifies and opens the shards marked `need`; on error, manifest_fini
 * still closes those already opened. */
int loco__ckpt_open_shards(loco__ckpt_manifest *mf);

/* ----------------------------------------------------- ckpt_reshard.c */

/* Loads a checkpoint of tp = t_src (either layout; j is its state.json,
 * whose other fields the caller has checked) into a view of another tp:
 * LOCO_EINVAL when v->tt is not tp rank v->tp_rank's slice of v->model;
 * every source the view needs is verified before v is written. */
int loco__ckpt_load_resharded(const char *dir, const cJSON *j, int t_src, loco_ckpt_view *v);

#endif /* LOCO_CKPT_INTERNAL_H */
