/* inner/ckpt/ — checkpoints of one island: the single and sharded
 * layouts, manifests, loading across tp and pp (resharding), checking a
 * whole checkpoint, checkpoints at a URL, and Hugging Face GPT-2 weights
 * (import into a model's ranges; export from a checkpoint). */
#ifndef LOCO_INNER_CKPT_H
#define LOCO_INNER_CKPT_H

#include "inner/data/data.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"

/* Everything a checkpoint holds besides the tensors. */
typedef struct {
    int64_t step;           /* optimizer steps completed */
    loco_data_pos data;     /* training loader position */
    loco_rng rng;
    uint64_t model_hash;    /* loco_config_hash of [model] */
} loco_ckpt_state;

/* Writes a checkpoint directory atomically (DIR.tmp, fsync, rename):
 * model.safetensors (HF GPT-2 names), config.json (HF keys), config.ini,
 * optimizer.safetensors and state.json with checksums of both files. */
int loco_ckpt_save(const char *dir, const loco_config *cfg, const loco_gpt *m,
                   const loco_adamw *opt, const loco_ckpt_state *st);
/* Loads a checkpoint into an initialised model (and optimizer if not NULL).
 * Every file is checked (presence, checksums, shapes, model hash against
 * cfg) before anything is overwritten: a corrupt or truncated checkpoint is
 * LOCO_EPROTO and leaves m and opt untouched. Reads both layouts below. */
int loco_ckpt_load(const char *dir, const loco_config *cfg, loco_gpt *m, loco_adamw *opt,
                   loco_ckpt_state *st);

/* Ranges of the flat buffers a rank holds, for checkpoints of sharded
 * state: parameters of [p_lo, p_hi) at params, AdamW moments of
 * [o_lo, o_hi) at m and v (both may be NULL to skip the optimizer). */
typedef struct {
    const loco_ttable *tt;  /* the table of this rank's slice (model.tp) and stage */
    loco_gpt_config model;  /* model.tp = t > 1: tt is tp rank tp_rank's slice */
    int tp_rank;
    /* A pipeline stage: tt is loco_gpt_build_stage_table(&model, stage),
     * the stage of pp rank pp_rank. NULL: the whole model (pp_rank
     * ignored). */
    const loco_gpt_stage *stage;
    int pp_rank;
    float *params;
    size_t p_lo, p_hi;
    float *m, *v;
    size_t o_lo, o_hi;
    int64_t adam_t;
    /* DeepSeek-V3's routing biases (loco_gpt_router_bias: every MoE
     * layer's, the same on every rank), state.json's "router_bias": saved
     * when n_router_bias > 0; a load fills them, and the checkpoint must
     * hold exactly n_router_bias (LOCO_EPROTO otherwise). */
    float *router_bias;
    size_t n_router_bias;
} loco_ckpt_view;

/* The single-file layout above, from a view holding every range of the
 * whole model (LOCO_EINVAL for a tp > 1 slice or a pipeline stage: use the
 * sharded layout). */
int loco_ckpt_save_view(const char *dir, const loco_config *cfg, const loco_ckpt_view *v,
                        const loco_ckpt_state *st);
/* Sharded layout, written by each rank into the same temporary directory:
 * shard_NNNNN.safetensors (NNNNN = index, the shard's position in the
 * manifest's arrays) holds flat ranges "params", "exp_avg", "exp_avg_sq"
 * of [lo, hi) of the view's buffers (of tp rank v->tp_rank's slice when
 * v->model.tp > 1, of pp rank v->pp_rank's stage when v->stage is set,
 * both also named in its metadata); *hash receives its XXH3. Moments are
 * written as zeros when v->m is NULL. */
int loco_ckpt_write_shard(const char *tmpdir, int index, const loco_ckpt_view *v, size_t lo,
                          size_t hi, uint64_t *hash);
/* Then one rank writes state.json (the manifest: every shard's range,
 * checksum and, when v->model.tp = t > 1, "tp": t and each shard's
 * "tp_rank" from tp_ranks (NULL: all 0); with pipeline stages, pp > 1,
 * "pp": pp, "stages" (each pp rank's chunks, from stages[0 .. pp)),
 * "n_params" per stage and each shard's "pp_rank" from pp_ranks (NULL:
 * all 0)), config.json and config.ini, and publishes tmpdir as dir. Shard
 * i is the file written with index i. The stages must tile the model's
 * blocks, and the shards of each (pp rank, tp rank) tile that stage's
 * slice [0, numel of its table) in order, every pair having shards, else
 * LOCO_EINVAL and nothing is published. v is any rank's view (its model,
 * adam_t). With pp = 1 (stages ignored, may be NULL) the manifest is the
 * one written before pipeline parallelism, and with t = 1 too the one
 * written before tensor parallelism. */
int loco_ckpt_write_manifest_pp(const char *tmpdir, const char *dir, const loco_config *cfg,
                                const loco_ckpt_view *v, int n_shards, const size_t *los,
                                const size_t *his, const uint64_t *hashes, const int *tp_ranks,
                                const int *pp_ranks, const loco_gpt_stage *stages, int pp,
                                const loco_ckpt_state *st);
/* loco_ckpt_write_manifest_pp without pipeline stages (pp = 1). */
int loco_ckpt_write_manifest(const char *tmpdir, const char *dir, const loco_config *cfg,
                             const loco_ckpt_view *v, int n_shards, const size_t *los,
                             const size_t *his, const uint64_t *hashes, const int *tp_ranks,
                             const loco_ckpt_state *st);
/* Fills the view's ranges (of tp rank v->tp_rank's slice when v->model.tp
 * > 1, of v->stage when set) from a checkpoint of either layout, whatever
 * the number of shards, the tp and the pipeline stages it was written
 * with, after checking every file it needs; on error the view is
 * untouched. When the checkpoint's tp and its stage of pp rank v->pp_rank
 * equal the view's, the view's (pp rank, tp rank) shards are read by range
 * overlap; otherwise each tensor is read by name from a stage that holds
 * it (wte from the stage with the embeddings, also into a stage's tied
 * head copy) and across tp element by element (the single layout counts
 * as tp = 1, pp = 1). A checkpoint whose tp does not divide the model's
 * n_head, whose stages do not tile the model's blocks, or with a pp rank
 * or tp rank whose shards are missing or do not tile its slice, is
 * LOCO_EPROTO naming the checkpoint (and the rank). */
int loco_ckpt_load_view(const char *dir, const loco_config *cfg, loco_ckpt_view *v,
                        loco_ckpt_state *st);
/* Writes OUT/model.safetensors + OUT/config.json (Hugging Face) from a
 * checkpoint of either layout and any tp and pp, using the checkpoint's
 * own config.ini (the whole model, whatever its [parallel] says). */
int loco_ckpt_export(const char *dir, const char *out);
/* Checks a checkpoint directory of either layout, any tp, pp and ep,
 * completely, without a model: state.json, config.ini (its [model] must
 * be the one state.json's hash names), and every file state.json lists
 * (all shards of every (pp rank, tp rank), tiling their slices), each
 * present with its recorded XXH3, a sound safetensors header and the
 * shapes the model of config.ini gives. Reads every byte. 0 when a load
 * would find nothing wrong with the files; else LOCO_EPROTO (LOCO_ENOMEM
 * when memory ran out) with the reason, one line naming dir and the
 * file, also into why[cap] (may be NULL). It does not compare the
 * checkpoint with a run's config: loading another [model] still fails. */
int loco_ckpt_verify(const char *dir, char *why, size_t cap);
/* The checkpoint to resume from, into out[cap]. `from` names a checkpoint
 * (RUN/ckpt_N, or any directory with a state.json), a run directory
 * holding ckpt_N checkpoints, or a URL (put in out as is: loading one
 * falls back along its pointer, loco_ckpt_fetch). The newest candidate
 * that loco_ckpt_verify accepts is chosen: `from` itself, then the ckpt_N
 * of its run directory older than it (a run directory: all of them,
 * newest first); each one skipped is logged (warn) with why, and a
 * fallback says which one it took. None: LOCO_EPROTO naming each one
 * tried and why (or that there was none), out empty; LOCO_ENOMEM and
 * LOCO_EINVAL (a path too long) are not about the checkpoints. */
int loco_ckpt_pick_resume(const char *from, char *out, size_t cap);

/* Checkpoints at a URL. A location that is a URL (loco_store_is_url:
 * file://, http://, https://) names a *series* of checkpoints rather than
 * one directory: each checkpoint's files are objects under
 * URL/ckpt_STEP_ID/ (a fresh ID per upload, so published objects are never
 * overwritten) and the pointer object URL/LATEST names the newest one (its
 * step, prefix, and every file's name, size and XXH3) and carries the
 * entry of the one before it. The pointer is put last: it is the commit.
 * loco_ckpt_save, _save_view and loco_trainer_save given a URL write the
 * checkpoint into a staging directory under run.dir (loco_ckpt_stage_dir),
 * upload it and remove the staging copy; loco_ckpt_load and _load_view
 * given a URL fetch the newest complete checkpoint into
 * run.dir/ckpt_cache/ (removed after loading). Transfers use net.ca,
 * net.cert, net.key and the run.ckpt_* timeouts. */
/* RUN_DIR/ckpt_stage/ckpt_STEP: where a checkpoint bound for a URL is
 * written first (every rank of a sharded save names the same one). */
int loco_ckpt_stage_dir(const loco_config *cfg, int64_t step, char *out, size_t cap);
/* Uploads every file of the complete checkpoint directory dir (of step
 * `step`) under a new prefix of url, then publishes url/LATEST naming it
 * with the previous pointer's entry inside. A failure before the pointer
 * is put leaves the previous checkpoint the newest. */
int loco_ckpt_upload(const char *dir, const char *url, const loco_config *cfg, int64_t step);
/* Downloads the newest complete checkpoint of url into dir (created or
 * replaced, through dir.tmp) after checking every file's size and XXH3
 * against the pointer. A torn newest checkpoint (an object missing,
 * truncated or corrupt) is refused with a warning naming the object, and
 * the previous one is fetched instead; when both fail, LOCO_EPROTO (or the
 * transfer's error) names both reasons. *step (may be NULL) receives the
 * step fetched. */
int loco_ckpt_fetch(const char *url, const loco_config *cfg, const char *dir, int64_t *step);



/* Creates *out for batches up to B x T and loads its weights (no
 * optimizer) from the checkpoint dir; the caller destroys it with
 * loco_gpt_destroy. On failure *out is NULL and loco_ckpt_load's error is
 * returned. */
int loco_ckpt_load_model(loco_gpt **out, const char *ckpt, const loco_config *cfg, int B, int T);

/* ------------------------------------------- Hugging Face GPT-2 weights */

/* Fills the view's parameter range [p_lo, p_hi) (of tp rank v->tp_rank's
 * slice when v->model.tp > 1, of v->stage's table when set; the optimizer
 * fields are ignored) from a Hugging Face GPT-2 directory as
 * GPT2LMHeadModel.save_pretrained writes it: DIR/config.json (n_layer,
 * n_head, n_embd, vocab_size, n_positions, n_inner, layer_norm_epsilon,
 * activation_function... checked against v->model, every mismatch named;
 * n_positions may exceed model.seq_len: the first rows are used) and
 * DIR/model.safetensors (F32, F16 or BF16, names with or without
 * "transformer."; the h.N.attn.bias / masked_bias buffers are ignored;
 * wte rows beyond config.json's vocab_size are padding, dropped;
 * lm_head.weight absent or equal to wte, since loco ties the head). A
 * missing, unknown, misshapen or wrongly typed tensor, a truncated file or
 * an untied head is LOCO_EPROTO naming the file and tensor, a config
 * mismatch LOCO_EINVAL; everything is checked before the view is written,
 * so on error it is untouched. */
int loco_hf_import_view(const char *dir, const loco_ckpt_view *v);
/* The same into a whole model's parameters (tp = 1, no stage). */
int loco_hf_import(const char *dir, loco_gpt *m);

#endif /* LOCO_INNER_CKPT_H */
