/* Checkpoint internals shared by inner/ckpt/ckpt.c (writing), ckpt_load.c
 * (loading at the same layout), ckpt_manifest.c (the sharded layout's
 * shard list and pipeline stages), ckpt_reshard.c (loading across tp and
 * pp) and ckpt_verify.c (checking a whole checkpoint, choosing the one to
 * resume from). Not for use outside them. */
#ifndef LOCO_CKPT_INTERNAL_H
#define LOCO_CKPT_INTERNAL_H

#include <cjson/cJSON.h>

#include "inner/ckpt/ckpt.h"

#define CKPT_FORMAT "loco-checkpoint"
#define CKPT_VERSION 1
#define MODEL_FILE "model.safetensors"
#define OPTIM_FILE "optimizer.safetensors"
#define STATE_FILE "state.json"

/* The config sections a checkpoint's model hash covers. */
extern const char *const loco__ckpt_model_sections[];

/* Shared by writing (ckpt.c) and loading (ckpt_load.c): a file's XXH3; the
 * AdamW moments' table (exp_avg.NAME then exp_avg_sq.NAME); a view of a
 * whole model and optimizer; Hugging Face's config.json. */
int loco__ckpt_file_hash(const char *path, uint64_t *h);
int loco__ckpt_moments_table(loco_ttable *both, const loco_ttable *tt);
loco_ckpt_view loco__ckpt_model_view(const loco_gpt *m, const loco_adamw *opt);
int loco__ckpt_write_hf_config(const char *path, const loco_gpt_config *c);

/* A Hugging Face model.safetensors read whole (hf_import.c), shared with
 * the Llama layout (hf_llama.c): its entries, validated on open. */
/* One tensor of the file's header. */
typedef struct {
    const char *name; /* as in the file (points into the cJSON tree) */
    int dtype;        /* HF_F32, HF_F16, HF_BF16, or HF_OTHER */
    const char *dtype_name;
    int ndim;
    int64_t shape[LOCO_TENSOR_MAX_DIM];
    const unsigned char *data;
    size_t numel;
} hf_entry;

enum { HF_F32, HF_F16, HF_BF16, HF_OTHER };

typedef struct {
    char path[LOCO_PATH_MAX + 32];
    unsigned char *file;
    size_t len;
    cJSON *header;
    hf_entry *e;
    int n;
} hf_file;

int loco__hf_file_open(hf_file *f, const char *dir);
void loco__hf_file_close(hf_file *f);
/* Element i of a tensor as fp32 (the file's data may be unaligned). */
float loco__hf_elem(const hf_entry *e, size_t i);
void loco__hf_shape_str(char *out, size_t cap, int ndim, const int64_t *shape);
/* Appends one complaint to why[cap], "; "-separated (config.json checks). */
__attribute__((format(printf, 3, 4))) void loco__hf_complain(char *why, size_t cap,
                                                             const char *fmt, ...);
/* The Llama family (hf_llama.c): import into a view, export of a whole
 * model's parameters (the tp = 1 table tt) to OUT/model.safetensors and
 * OUT/config.json. */
int loco__hf_llama_import_view(const char *dir, const loco_ckpt_view *v);
int loco__hf_llama_export(const char *out, const loco_ttable *tt, const float *params,
                          const loco_gpt_config *mc);

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
    int pp;            /* its group: pp rank x ep + ep rank (0 without either) */
    bool need;         /* the view needs some of it */
    loco_st *st;       /* once verified */
    const float *x[3]; /* params, exp_avg, exp_avg_sq from lo */
} loco__ckpt_shard_ref;

/* state.json's shard list, checked: the shards of every (pp rank, tp
 * rank) tile that stage's slice [0, P[pp rank]) in order. A group g =
 * pp_rank * tp + tp_rank. */
typedef struct {
    const char *dir;
    int tp, pp, n;           /* pp: groups (pp x ep) */
    int ep;
    size_t *P;               /* (pp) parameters of each group's tp slice */
    loco__ckpt_shard_ref *s; /* (n) in state.json's order */
    int *order;              /* (n) indices into s grouped by group, each group in order */
    int *first;              /* (pp * tp + 1) group g is order[first[g] .. first[g + 1]) */
} loco__ckpt_manifest;

/* ------------------------------------------------- ckpt.c, ckpt_load.c */

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
/* Reads dir's state.json and checks what every layout shares (format,
 * version, step, adam_t, data position, rng, model hash, a checksum table
 * or shard list) into *st and *adam_t; *j (cJSON_Delete) is the parsed
 * file for the rest. LOCO_EPROTO naming dir when it is missing or
 * malformed, *j NULL. */
int loco__ckpt_read_state(const char *dir, cJSON **j, loco_ckpt_state *st, int64_t *adam_t);
/* j's layout against the model mc: *tp and *ep (absent: 1), *pp and
 * *stages as loco__ckpt_parse_stages. LOCO_EPROTO naming dir when one is
 * malformed, tp does not divide mc's heads, ep its experts, or a
 * single-file checkpoint claims tp, ep or pp > 1; *stages NULL then. */
int loco__ckpt_parse_layout(const char *dir, const cJSON *j, const loco_gpt_config *mc, int *tp,
                            int *ep, int *pp, loco_gpt_stage **stages);
/* Verifies, then opens the single layout (moments too if asked) for the
 * whole-model table tt; on error s holds nothing, else close it. */
int loco__ckpt_open_single(loco__ckpt_single_src *s, const char *dir, const cJSON *sums,
                           const loco_ttable *tt, bool moments);
/* Releases what open_single opened and zeroes s (a zeroed s is fine). */
void loco__ckpt_close_single(loco__ckpt_single_src *s);

/* ---------------------------------------------------- ckpt_manifest.c */

/* Whether the pp stages tile blocks [0, L) (every block in exactly one
 * chunk, each stage's chunks valid for loco_gpt_build_stage_table); when
 * not, why (into why[cap]). */
bool loco__ckpt_stages_tile(const loco_gpt_stage *stages, int pp, int L, char *why, size_t cap);
/* Whether two stages hold the same chunks. */
bool loco__ckpt_same_stage(const loco_gpt_stage *a, const loco_gpt_stage *b);
/* j's pipeline layout: *pp (1 without "pp") and *stages (pp entries,
 * loco_free; NULL when pp = 1). LOCO_EPROTO naming dir when "pp" or
 * "stages" is malformed or the stages do not tile the L blocks. */
int loco__ckpt_parse_stages(const char *dir, const cJSON *j, int L, int *pp,
                            loco_gpt_stage **stages);
/* Expert parallelism splits a stage's table once more, by ep rank: a
 * checkpoint's groups are (pp rank, ep rank) pairs, g = pp_rank * ep +
 * ep_rank (ep = mc->ep, 1 when 0), and "pp" below counts groups where
 * marked. P[g] = parameters of group g's table for mc (mc->tp's slice,
 * stage g / ep, ep rank g % ep): pp x ep entries; stages NULL (pp = 1):
 * the whole model's. */
int loco__ckpt_stage_params(const loco_gpt_config *mc, const loco_gpt_stage *stages, int pp,
                            size_t *P);
/* Parses and checks j's shard list for a checkpoint of pp stages of tp
 * slices, stage p's of P[p] parameters (LOCO_EPROTO when a stage or a
 * slice is missing or its shards do not tile it); on error mf holds
 * nothing. mf's strings point into j, which must outlive it. */
int loco__ckpt_parse_manifest(loco__ckpt_manifest *mf, const char *dir, const cJSON *j, int tp,
                              int pp, int ep, const size_t *P);
/* Closes the opened shards, frees the table, zeroes mf (zeroed is fine). */
void loco__ckpt_manifest_fini(loco__ckpt_manifest *mf);
/* The shard of group g (pp_rank * tp + tp_rank) that holds element x of
 * its slice (x < P[pp_rank]). */
loco__ckpt_shard_ref *loco__ckpt_shard_at(const loco__ckpt_manifest *mf, int g, size_t x);
/* Verifies and opens the shards marked `need`; on error, manifest_fini
 * still closes those already opened. */
int loco__ckpt_open_shards(loco__ckpt_manifest *mf);

/* ----------------------------------------------------- ckpt_reshard.c */

/* Loads a checkpoint of tp = t_src and pp stages (stages NULL: pp = 1;
 * either layout; j is its state.json, whose other fields the caller has
 * checked) into a view of another layout, tensor by name: LOCO_EINVAL
 * when v->tt is not the table of v->stage (NULL: the whole model) of tp
 * rank v->tp_rank's slice of v->model; every source the view needs is
 * verified before v is written. */
int loco__ckpt_load_resharded(const char *dir, const cJSON *j, int t_src, int pp, int ep_src,
                              const loco_gpt_stage *stages, loco_ckpt_view *v);

#endif /* LOCO_CKPT_INTERNAL_H */
