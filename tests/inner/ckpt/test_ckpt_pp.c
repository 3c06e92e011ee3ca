/* Pipeline-parallel checkpoints: a checkpoint sharded by stage (pp = 2, two
 * dp shards per stage, optionally tp = 2 too) loads exactly into the whole
 * model, into the same stages (by range overlap), into another split of the
 * blocks (a V-shape), into pp = 4 and into tp = 2 slices of stages; a
 * single-file checkpoint loads into stages; export gives the whole Hugging
 * Face tensors; the embedding stage's wte is the source of the tied head's
 * copy; a missing stage, stages that do not tile the blocks and a corrupt
 * shard are refused with the view untouched. Every reference buffer is cut
 * by tensor name from whole random buffers (loco_gpt_tp_global for tp). */
#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "tests/inner/ckpt/ckpt_test.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GUARD 64 /* elements after a view's buffer that loading must not touch */
#define WTE "transformer.wte.weight"

/* Blocks [0, 2) | [2, 4); a V-shape [0, 1) + [3, 4) | [1, 3); one block each. */
static const loco_gpt_stage A2[2] = {{.n = 1, .first = {0}, .end = {2}, .slots = 1},
                                     {.n = 1, .first = {2}, .end = {4}, .slots = 1}};
static const loco_gpt_stage V2[2] = {{.n = 2, .first = {0, 3}, .end = {1, 4}, .slots = 1},
                                     {.n = 1, .first = {1}, .end = {3}, .slots = 1}};
static const loco_gpt_stage P4[4] = {{.n = 1, .first = {0}, .end = {1}, .slots = 1},
                                     {.n = 1, .first = {1}, .end = {2}, .slots = 1},
                                     {.n = 1, .first = {2}, .end = {3}, .slots = 1},
                                     {.n = 1, .first = {3}, .end = {4}, .slots = 1}};

static char *dir;
static char ckA[600];  /* pp = 2 (A2), tp = 1, two dp shards per stage */
static char ckAT[600]; /* pp = 2 (A2), tp = 2, two dp shards per (stage, tp rank) */
static char ck1[600];  /* single file, the whole model */
static loco_config cfg;
static loco_ckpt_state st;
static loco_ttable whole; /* tp = 1, the whole model */
static float *W[3];       /* whole params, exp_avg, exp_avg_sq */

/* One rank's part of the model: stage (NULL: the whole model) of tp rank k
 * of t, its table and its buffers cut from W. */
typedef struct {
    loco_ttable tt;
    float *x[3];
} part;

static loco_gpt_config model_tp(int t) {
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    mc.tp = t;
    return mc;
}

static void make_part(part *p, int t, int k, const loco_gpt_stage *stage) {
    loco_gpt_config mc = model_tp(t);
    int rc =
        stage ? loco_gpt_build_stage_table(&p->tt, &mc, stage) : loco_gpt_build_table(&p->tt, &mc);
    cr_assert_eq(rc, 0, "%s", loco_errmsg());
    for (int a = 0; a < 3; a++)
        p->x[a] = ckpt_test_floats(p->tt.numel, 0.0f);
    for (int i = 0; i < p->tt.n; i++) {
        const loco_tensor *lt = &p->tt.t[i];
        const int gi = loco_ttable_find(&whole, lt->name);
        cr_assert(gi >= 0, "%s", lt->name);
        const loco_tensor *gt = &whole.t[gi];
        for (size_t j = 0; j < lt->numel; j++) {
            size_t g;
            if (!loco_gpt_tp_global(gt, t, k, j, &g))
                continue; /* vocabulary padding: zero */
            for (int a = 0; a < 3; a++)
                p->x[a][lt->offset + j] = W[a][gt->offset + g];
        }
    }
}

static void free_part(part *p) {
    for (int a = 0; a < 3; a++)
        free(p->x[a]);
    loco_ttable_fini(&p->tt);
}

static loco_ckpt_view view_of(const part *p, int t, int k, const loco_gpt_stage *stage, int q,
                              float *const *b) {
    loco_ckpt_view v = {.tt = &p->tt,
                        .model = model_tp(t),
                        .tp_rank = k,
                        .stage = stage,
                        .pp_rank = q,
                        .params = b[0],
                        .p_lo = 0,
                        .p_hi = p->tt.numel,
                        .m = b[1],
                        .v = b[2],
                        .o_lo = 0,
                        .o_hi = p->tt.numel,
                        .adam_t = 17};
    return v;
}

/* A sharded checkpoint of pp stages of t slices, dps shards per (stage, tp
 * rank), cut inside tensors. perturb: the tied head's wte copy (on the
 * stage with the head but not the embeddings) is written off by one. */
static int write_pp(const char *path, int t, const loco_gpt_stage *stages, int pp, int dps,
                    bool perturb) {
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_eq(loco_mkdirs(tmp), 0);
    size_t los[64], his[64];
    uint64_t hashes[64];
    int tps[64], pps[64], n = 0;
    for (int q = 0; q < pp; q++)
        for (int d = 0; d < dps; d++)
            for (int k = 0; k < t; k++) {
                part p;
                make_part(&p, t, k, &stages[q]);
                const size_t P = p.tt.numel;
                if (perturb && stages[q].first[0] != 0) {
                    const int w = loco_ttable_find(&p.tt, WTE);
                    for (size_t j = 0; w >= 0 && j < p.tt.t[w].numel; j++)
                        p.x[0][p.tt.t[w].offset + j] += 1.0f;
                }
                los[n] = d ? P * (size_t)d / (size_t)dps + 3 : 0;
                his[n] = d + 1 < dps ? P * (size_t)(d + 1) / (size_t)dps + 3 : P;
                tps[n] = k, pps[n] = q;
                loco_ckpt_view v = view_of(&p, t, k, &stages[q], q, p.x);
                cr_assert_eq(loco_ckpt_write_shard(tmp, n, &v, los[n], his[n], &hashes[n]), 0, "%s",
                             loco_errmsg());
                free_part(&p);
                n++;
            }
    part p0;
    make_part(&p0, t, 0, &stages[0]);
    loco_ckpt_view v0 = view_of(&p0, t, 0, &stages[0], 0, p0.x);
    int rc = loco_ckpt_write_manifest_pp(tmp, path, &cfg, &v0, n, los, his, hashes, tps, pps,
                                         stages, pp, &st);
    free_part(&p0);
    return rc;
}

static void setup(void) {
    dir = strdup("/tmp/loco-ckpt-pp-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(ckA, sizeof ckA, "%s/pp2", dir);
    snprintf(ckAT, sizeof ckAT, "%s/pp2tp2", dir);
    snprintf(ck1, sizeof ck1, "%s/single", dir);
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 4, cfg.model.n_head = 4, cfg.model.n_embd = 16;
    cfg.model.seq_len = 8, cfg.model.vocab_size = 37; /* padded to 38 rows at tp = 2 */
    cfg.parallel.pp = 2; /* as the run that wrote them said; export ignores it */
    loco_gpt_config mc = model_tp(1);
    cr_assert_eq(loco_gpt_build_table(&whole, &mc), 0);
    loco_rng rng;
    loco_rng_seed(&rng, 13);
    for (int a = 0; a < 3; a++) {
        W[a] = ckpt_test_floats(whole.numel, 0.0f);
        for (size_t i = 0; i < whole.numel; i++)
            W[a][i] = a == 2 ? loco_rng_uniform(&rng) : loco_rng_normal(&rng);
    }
    static const char *const sec[] = {"model", NULL};
    st = (loco_ckpt_state){
        .step = 17, .data = {1, 512, 0}, .rng = rng, .model_hash = loco_config_hash(&cfg, sec)};
    cr_assert_eq(write_pp(ckA, 1, A2, 2, 2, false), 0, "%s", loco_errmsg());
    cr_assert_eq(write_pp(ckAT, 2, A2, 2, 2, false), 0, "%s", loco_errmsg());
    part p;
    make_part(&p, 1, 0, NULL);
    loco_ckpt_view v = view_of(&p, 1, 0, NULL, 0, p.x);
    cr_assert_eq(loco_ckpt_save_view(ck1, &cfg, &v, &st), 0, "%s", loco_errmsg());
    free_part(&p);
}

static void teardown(void) {
    for (int a = 0; a < 3; a++)
        free(W[a]);
    loco_ttable_fini(&whole);
    loco_rmtree(dir);
    free(dir);
}

TestSuite(ckpt_pp, .init = setup, .fini = teardown);

/* Loads ck into fresh buffers of stage q (NULL: the whole model) of tp rank
 * k of t over [lo, hi) of its table (hi = 0: to the end) and holds them to
 * the part cut from W. */
static void expect_range(const char *ck, int t, int k, const loco_gpt_stage *stage, int q,
                         size_t lo, size_t hi) {
    part ref;
    make_part(&ref, t, k, stage);
    hi = hi ? hi : ref.tt.numel;
    const size_t n = hi - lo;
    float *b[3] = {ckpt_test_floats(n + GUARD, CKPT_TEST_UNSET),
                   ckpt_test_floats(n + GUARD, CKPT_TEST_UNSET),
                   ckpt_test_floats(n + GUARD, CKPT_TEST_UNSET)};
    loco_ckpt_view v = view_of(&ref, t, k, stage, q, b);
    v.p_lo = v.o_lo = lo, v.p_hi = v.o_hi = hi, v.adam_t = 0;
    loco_ckpt_state s;
    cr_assert_eq(loco_ckpt_load_view(ck, &cfg, &v, &s), 0, "%s", loco_errmsg());
    for (int a = 0; a < 3; a++)
        cr_expect_eq(memcmp(b[a], ref.x[a] + lo, n * sizeof(float)), 0,
                     "%s: pp rank %d, tp rank %d of %d, [%zu, %zu), array %d differs", ck, q, k, t,
                     lo, hi, a);
    for (int a = 0; a < 3; a++)
        for (size_t i = n; i < n + GUARD; i++)
            cr_expect_eq(b[a][i], CKPT_TEST_UNSET, "written past the range");
    cr_expect_eq(v.adam_t, 17);
    cr_expect(s.step == 17 && s.data.shard == 1 && s.data.pos == 512);
    for (int a = 0; a < 3; a++)
        free(b[a]);
    free_part(&ref);
}

static void expect_loads(const char *ck, int t, int k, const loco_gpt_stage *stage, int q) {
    expect_range(ck, t, k, stage, q, 0, 0);
}

/* Every rank of a layout (pp stages, NULL: the whole model; tp = t). */
static void expect_layout(const char *ck, int t, const loco_gpt_stage *stages, int pp) {
    for (int q = 0; q < pp; q++)
        for (int k = 0; k < t; k++)
            expect_loads(ck, t, k, stages ? &stages[q] : NULL, q);
}

/* A load that must fail with want_rc, a message holding needle and naming
 * ck, and the view untouched. */
static void expect_refused(const char *ck, int t, int k, const loco_gpt_stage *stage, int q,
                           int want_rc, const char *needle) {
    part ref;
    make_part(&ref, t, k, stage);
    const size_t P = ref.tt.numel;
    float *b[3] = {ckpt_test_floats(P, CKPT_TEST_UNSET), ckpt_test_floats(P, CKPT_TEST_UNSET),
                   ckpt_test_floats(P, CKPT_TEST_UNSET)};
    loco_ckpt_view v = view_of(&ref, t, k, stage, q, b);
    ckpt_test_expect_refused(ck, &cfg, &v, b, P, want_rc, needle);
    for (int a = 0; a < 3; a++)
        free(b[a]);
    free_part(&ref);
}

static cJSON *read_state(const char *ck) {
    char path[700];
    snprintf(path, sizeof path, "%s/state.json", ck);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    cJSON *j = cJSON_ParseWithLength(text, len);
    loco_free(text);
    cr_assert(j);
    return j;
}

/* Rewrites ck's state.json through edit. */
static void edit_state(const char *ck, void (*edit)(cJSON *j)) {
    char path[700];
    snprintf(path, sizeof path, "%s/state.json", ck);
    cJSON *j = read_state(ck);
    edit(j);
    char *s = cJSON_Print(j);
    cr_assert_eq(loco_file_write_sync(path, s, strlen(s)), 0);
    cJSON_free(s);
    cJSON_Delete(j);
}

Test(ckpt_pp, manifest_records_pp_stages_and_ranks) {
    cJSON *j = read_state(ckA);
    cr_expect_eq(cJSON_GetObjectItem(j, "pp")->valueint, 2);
    cr_expect_null(cJSON_GetObjectItem(j, "tp"));
    char *stages = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "stages"));
    cr_expect_str_eq(stages, "[[[0,2]],[[2,4]]]");
    cJSON_free(stages);
    const cJSON *np = cJSON_GetObjectItem(j, "n_params");
    cr_assert_eq(cJSON_GetArraySize(np), 2);
    for (int q = 0; q < 2; q++) {
        loco_ttable tt;
        loco_gpt_config mc = model_tp(1);
        cr_assert_eq(loco_gpt_build_stage_table(&tt, &mc, &A2[q]), 0);
        cr_expect_eq((size_t)cJSON_GetArrayItem(np, q)->valuedouble, tt.numel);
        loco_ttable_fini(&tt);
    }
    const cJSON *shards = cJSON_GetObjectItem(j, "shards");
    cr_assert_eq(cJSON_GetArraySize(shards), 4);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(shards, i), "pp_rank")->valueint,
                     i / 2);
    cJSON_Delete(j);
    char path[700];
    snprintf(path, sizeof path, "%s/shard_00003.safetensors", ckA);
    loco_st *f;
    cr_assert_eq(loco_st_open(&f, path), 0);
    cr_expect_str_eq(loco_st_meta(f, "pp_rank"), "1");
    cr_expect_null(loco_st_meta(f, "tp"));
    loco_st_close(f);
    /* The V-shape's chunks, two on rank 0. */
    char ckV[700];
    snprintf(ckV, sizeof ckV, "%s/v", dir);
    cr_assert_eq(write_pp(ckV, 1, V2, 2, 1, false), 0, "%s", loco_errmsg());
    j = read_state(ckV);
    stages = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "stages"));
    cr_expect_str_eq(stages, "[[[0,1],[3,4]],[[1,3]]]");
    cJSON_free(stages);
    cJSON_Delete(j);
}

Test(ckpt_pp, into_the_whole_model_is_exact) {
    expect_layout(ckA, 1, NULL, 1);
    expect_layout(ckAT, 1, NULL, 1);
}

Test(ckpt_pp, into_the_same_stages_is_exact) {
    expect_layout(ckA, 1, A2, 2);
    expect_layout(ckAT, 2, A2, 2);
    /* Ranges that start and end inside tensors (ZeRO-3-like). */
    for (int q = 0; q < 2; q++) {
        expect_range(ckA, 1, 0, &A2[q], q, 5, 301);
        expect_range(ckAT, 2, 1, &A2[q], q, 7, 411);
    }
}

Test(ckpt_pp, into_another_split_of_the_blocks_is_exact) {
    expect_layout(ckA, 1, V2, 2);
    expect_layout(ckAT, 1, V2, 2);
    expect_layout(ckAT, 2, V2, 2);
    for (int q = 0; q < 2; q++)
        expect_range(ckA, 1, 0, &V2[q], q, 9, 517);
}

Test(ckpt_pp, into_pp4_is_exact) {
    expect_layout(ckA, 1, P4, 4);
    expect_layout(ckAT, 2, P4, 4);
}

Test(ckpt_pp, into_tp2_stages_is_exact) {
    expect_layout(ckA, 2, A2, 2);
    expect_layout(ckA, 2, V2, 2);
    /* Stage 1's wte copy, its padding row zero. */
    part ref;
    make_part(&ref, 2, 1, &A2[1]);
    const loco_tensor *w = &ref.tt.t[loco_ttable_find(&ref.tt, WTE)];
    cr_assert_eq(w->shape[0], 19);
    for (size_t i = 18 * 16; i < 19 * 16; i++)
        cr_expect_eq(ref.x[0][w->offset + i], 0.0f);
    free_part(&ref);
}

Test(ckpt_pp, pp4_checkpoint_into_pp2_and_the_whole_model_is_exact) {
    char ck4[700];
    snprintf(ck4, sizeof ck4, "%s/pp4", dir);
    cr_assert_eq(write_pp(ck4, 1, P4, 4, 3, false), 0, "%s", loco_errmsg());
    expect_layout(ck4, 1, A2, 2);
    expect_layout(ck4, 1, NULL, 1);
    expect_layout(ck4, 1, P4, 4);
}

Test(ckpt_pp, single_file_into_stages_is_exact) {
    expect_layout(ck1, 1, A2, 2);
    expect_layout(ck1, 1, V2, 2);
    expect_layout(ck1, 1, P4, 4);
    expect_layout(ck1, 2, A2, 2);
}

Test(ckpt_pp, tied_head_copy_comes_from_the_embedding_stage) {
    char ckp[700];
    snprintf(ckp, sizeof ckp, "%s/perturbed", dir);
    cr_assert_eq(write_pp(ckp, 1, A2, 2, 2, true), 0, "%s", loco_errmsg());
    /* Only A2's own stage 1 reads its (off by one) copy back. */
    expect_layout(ckp, 1, NULL, 1);
    expect_layout(ckp, 1, P4, 4);
    expect_layout(ckp, 2, V2, 2);
}

Test(ckpt_pp, export_gives_the_whole_hugging_face_tensors) {
    char out[700], path[800];
    snprintf(out, sizeof out, "%s/hf", dir);
    cr_assert_eq(loco_ckpt_export(ckAT, out), 0, "%s", loco_errmsg());
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    loco_st *f;
    cr_assert_eq(loco_st_open(&f, path), 0, "%s", loco_errmsg());
    for (int i = 0; i < whole.n; i++) {
        const loco_tensor *gt = &whole.t[i];
        const float *x;
        int ndim;
        int64_t shape[LOCO_TENSOR_MAX_DIM];
        cr_assert_eq(loco_st_get(f, gt->name, &x, &ndim, shape), 0, "%s", gt->name);
        cr_expect_eq(ndim, gt->ndim, "%s", gt->name);
        for (int d = 0; d < ndim; d++)
            cr_expect_eq(shape[d], gt->shape[d], "%s dim %d", gt->name, d);
        cr_expect_eq(memcmp(x, W[0] + gt->offset, gt->numel * sizeof(float)), 0, "%s", gt->name);
    }
    loco_st_close(f);
}

static void drop_pp_rank1(cJSON *j) {
    cJSON *shards = cJSON_GetObjectItem(j, "shards");
    for (int i = cJSON_GetArraySize(shards) - 1; i >= 0; i--)
        if (cJSON_GetObjectItem(cJSON_GetArrayItem(shards, i), "pp_rank")->valueint == 1)
            cJSON_DeleteItemFromArray(shards, i);
}

Test(ckpt_pp, missing_stage_is_refused_naming_the_pp_rank) {
    edit_state(ckA, drop_pp_rank1);
    const char *why = "pp rank 1 of 2 has no shards";
    expect_refused(ckA, 1, 0, NULL, 0, LOCO_EPROTO, why);
    expect_refused(ckA, 1, 0, &A2[0], 0, LOCO_EPROTO, why);
    expect_refused(ckA, 1, 0, &V2[1], 1, LOCO_EPROTO, why);
    edit_state(ckAT, drop_pp_rank1);
    expect_refused(ckAT, 2, 1, &A2[1], 1, LOCO_EPROTO, why);
}

static void drop_pp1_tp1(cJSON *j) {
    cJSON *shards = cJSON_GetObjectItem(j, "shards");
    for (int i = cJSON_GetArraySize(shards) - 1; i >= 0; i--) {
        const cJSON *e = cJSON_GetArrayItem(shards, i);
        if (cJSON_GetObjectItem(e, "pp_rank")->valueint == 1 &&
            cJSON_GetObjectItem(e, "tp_rank")->valueint == 1)
            cJSON_DeleteItemFromArray(shards, i);
    }
}

Test(ckpt_pp, missing_slice_of_a_stage_is_refused) {
    edit_state(ckAT, drop_pp1_tp1);
    expect_refused(ckAT, 1, 0, NULL, 0, LOCO_EPROTO, "tp rank 1 of 2 of pp rank 1 of 2 has no");
}

static void overlapping_stages(cJSON *j) {
    cJSON *s = cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "stages"), 1), 0);
    cJSON_SetNumberValue(cJSON_GetArrayItem(s, 0), 1); /* [1, 4): block 1 twice */
}

static void short_stages(cJSON *j) {
    cJSON *s = cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "stages"), 1), 0);
    cJSON_SetNumberValue(cJSON_GetArrayItem(s, 0), 2); /* [2, 3): block 3 in no stage */
    cJSON_SetNumberValue(cJSON_GetArrayItem(s, 1), 3);
}

Test(ckpt_pp, stages_that_do_not_tile_the_blocks_are_refused) {
    edit_state(ckA, overlapping_stages);
    expect_refused(ckA, 1, 0, NULL, 0, LOCO_EPROTO, "do not tile the model's blocks");
    expect_refused(ckA, 1, 0, &A2[0], 0, LOCO_EPROTO, "block 1 of 4 is held by 2 stages");
    edit_state(ckA, short_stages);
    expect_refused(ckA, 1, 0, &A2[1], 1, LOCO_EPROTO, "block 3 of 4 is held by 0 stages");
}

static void corrupt(const char *ck, int i) {
    char path[800];
    snprintf(path, sizeof path, "%s/shard_%05d.safetensors", ck, i);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, -9, SEEK_END);
    int c = fgetc(f);
    fseek(f, -9, SEEK_END);
    fputc(c ^ 0x55, f);
    fclose(f);
}

Test(ckpt_pp, corrupt_shard_is_refused) {
    corrupt(ckA, 3); /* pp rank 1's second dp shard */
    expect_refused(ckA, 1, 0, NULL, 0, LOCO_EPROTO,
                   "shard_00003.safetensors (of pp rank 1 of 2) is corrupt");
    expect_refused(ckA, 1, 0, &A2[1], 1, LOCO_EPROTO, "corrupt");
    expect_refused(ckA, 2, 0, &P4[3], 3, LOCO_EPROTO, "corrupt");
    /* Stage 0 reads none of pp rank 1's shards. */
    expect_layout(ckA, 1, A2, 1);
}

Test(ckpt_pp, writing_refuses_untiled_stages_and_missing_ranks) {
    char bad[700], tmp[800];
    snprintf(bad, sizeof bad, "%s/bad", dir);
    static const loco_gpt_stage gap[2] = {{.n = 1, .first = {0}, .end = {2}, .slots = 1},
                                          {.n = 1, .first = {3}, .end = {4}, .slots = 1}};
    part p;
    make_part(&p, 1, 0, &A2[0]);
    loco_ckpt_view v = view_of(&p, 1, 0, &A2[0], 0, p.x);
    snprintf(tmp, sizeof tmp, "%s.tmp", bad);
    cr_assert_eq(loco_mkdirs(tmp), 0);
    uint64_t h;
    cr_assert_eq(loco_ckpt_write_shard(tmp, 0, &v, 0, p.tt.numel, &h), 0);
    size_t lo = 0, hi = p.tt.numel;
    int zero = 0;
    cr_expect_eq(
        loco_ckpt_write_manifest_pp(tmp, bad, &cfg, &v, 1, &lo, &hi, &h, NULL, &zero, gap, 2, &st),
        LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "block 2 of 4") != NULL, "%s", loco_errmsg());
    cr_expect_eq(
        loco_ckpt_write_manifest_pp(tmp, bad, &cfg, &v, 1, &lo, &hi, &h, NULL, &zero, A2, 2, &st),
        LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "pp rank 1 of 2, tp rank 0 of 1 has no shards") != NULL, "%s",
              loco_errmsg());
    /* A stage is not the whole model: pp = 1 with a stage view, single file. */
    cr_expect_eq(loco_ckpt_write_manifest(tmp, bad, &cfg, &v, 1, &lo, &hi, &h, NULL, &st),
                 LOCO_EINVAL);
    cr_expect_eq(loco_ckpt_save_view(bad, &cfg, &v, &st), LOCO_EINVAL);
    cr_expect_neq(access(bad, F_OK), 0, "nothing is published");
    free_part(&p);
}

Test(ckpt_pp, missing_shard_file_is_refused_naming_the_pp_rank) {
    char path[800];
    snprintf(path, sizeof path, "%s/shard_00002.safetensors", ckA);
    cr_assert_eq(unlink(path), 0);
    expect_refused(ckA, 1, 0, NULL, 0, LOCO_EPROTO,
                   "shard_00002.safetensors (of pp rank 1 of 2) is missing");
    expect_refused(ckA, 2, 1, &V2[1], 1, LOCO_EPROTO, "(of pp rank 1 of 2) is missing");
}

Test(ckpt_pp, failed_allocation_leaves_the_view_untouched) {
    part ref;
    make_part(&ref, 2, 1, &V2[0]);
    const size_t P = ref.tt.numel;
    float *b[3] = {ckpt_test_floats(P, CKPT_TEST_UNSET), ckpt_test_floats(P, CKPT_TEST_UNSET),
                   ckpt_test_floats(P, CKPT_TEST_UNSET)};
    for (long n = 1; n <= 1000; n++) {
        loco_ckpt_view v = view_of(&ref, 2, 1, &V2[0], 0, b);
        loco_alloc_fail_after(n);
        int rc = loco_ckpt_load_view(ckAT, &cfg, &v, NULL);
        loco_alloc_fail_after(0);
        cr_expect(rc == 0 || rc == LOCO_ENOMEM || rc == LOCO_EPROTO, "allocation %ld: rc %d", n,
                  rc);
        if (rc == 0) {
            for (int a = 0; a < 3; a++)
                cr_expect_eq(memcmp(b[a], ref.x[a], P * sizeof(float)), 0);
            break;
        }
        bool untouched = true;
        for (int a = 0; a < 3; a++)
            for (size_t i = 0; i < P; i++)
                untouched &= b[a][i] == CKPT_TEST_UNSET;
        cr_expect(untouched, "allocation %ld failed after the view was touched", n);
        cr_assert(n < 1000, "still failing after 1000 allocations");
    }
    for (int a = 0; a < 3; a++)
        free(b[a]);
    free_part(&ref);
}
