/* Tensor-parallel checkpoints: a sharded checkpoint written by tp = 2 ranks
 * (two dp shards each) loads exactly into the whole model, into tp = 4
 * slices and into partial ranges; a single-file checkpoint loads into tp
 * slices; export gives the Hugging Face tensors; a missing tp slice or a
 * corrupt shard is refused with the view untouched. The reference slices
 * are cut from the whole buffers with loco_gpt_tp_locate. */
#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "tests/inner/ckpt/ckpt_test.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXT 4

static char *dir;
static char ck2[600]; /* sharded, tp = 2, two dp shards per tp rank */
static char ck1[600]; /* single file, tp = 1 */
static loco_config cfg;
static loco_ckpt_state st;
static loco_ttable tt[MAXT + 1];    /* the table of one slice, by tp (1, 2, 4) */
static float *W[3];                 /* whole params, exp_avg, exp_avg_sq (tp = 1 table) */
static float *S[MAXT + 1][MAXT][3]; /* S[t][k]: tp rank k's slice of W, padding 0 */

static loco_gpt_config model_tp(int t) {
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    mc.tp = t;
    return mc;
}

/* Cuts W into the t slices, element by element. */
static void make_slices(int t) {
    loco_gpt_config mc = model_tp(t);
    cr_assert_eq(loco_gpt_build_table(&tt[t], &mc), 0, "%s", loco_errmsg());
    for (int k = 0; k < t; k++)
        for (int a = 0; a < 3; a++)
            S[t][k][a] = ckpt_test_floats(tt[t].numel, 0.0f);
    for (int i = 0; i < tt[1].n; i++) {
        const loco_tensor *gt = &tt[1].t[i];
        for (size_t g = 0; g < gt->numel; g++) {
            int r;
            size_t j;
            loco_gpt_tp_locate(gt, t, g, &r, &j);
            cr_assert(j < tt[t].t[i].numel);
            for (int k = r < 0 ? 0 : r; k < (r < 0 ? t : r + 1); k++)
                for (int a = 0; a < 3; a++)
                    S[t][k][a][tt[t].t[i].offset + j] = W[a][gt->offset + g];
        }
    }
}

/* A view of whole buffers of tp rank k of t. */
static loco_ckpt_view view_of(int t, int k, float *p, float *m, float *v) {
    const size_t P = tt[t].numel;
    loco_ckpt_view view = {.tt = &tt[t],
                           .model = model_tp(t),
                           .tp_rank = k,
                           .params = p,
                           .p_lo = 0,
                           .p_hi = P,
                           .m = m,
                           .v = v,
                           .o_lo = 0,
                           .o_hi = m ? P : 0,
                           .adam_t = 17};
    return view;
}

/* A sharded checkpoint of the t slices, dps shards per tp rank, in the
 * order a dp x tp mesh numbers them (tp fastest). */
static void write_sharded(const char *path, int t, int dps) {
    char tmp[700];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    cr_assert_eq(loco_mkdirs(tmp), 0);
    const size_t P = tt[t].numel;
    size_t los[16], his[16];
    uint64_t hashes[16];
    int ranks[16];
    for (int d = 0; d < dps; d++)
        for (int k = 0; k < t; k++) {
            const int i = d * t + k;
            /* Cuts inside tensors, never on a boundary. */
            los[i] = d ? P * (size_t)d / (size_t)dps + 3 : 0;
            his[i] = d + 1 < dps ? P * (size_t)(d + 1) / (size_t)dps + 3 : P;
            ranks[i] = k;
            loco_ckpt_view v = view_of(t, k, S[t][k][0], S[t][k][1], S[t][k][2]);
            cr_assert_eq(loco_ckpt_write_shard(tmp, i, &v, los[i], his[i], &hashes[i]), 0, "%s",
                         loco_errmsg());
        }
    loco_ckpt_view v0 = view_of(t, 0, S[t][0][0], S[t][0][1], S[t][0][2]);
    cr_assert_eq(
        loco_ckpt_write_manifest(tmp, path, &cfg, &v0, t * dps, los, his, hashes, ranks, &st), 0,
        "%s", loco_errmsg());
}

static void setup(void) {
    dir = strdup("/tmp/loco-ckpt-tp-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(ck2, sizeof ck2, "%s/tp2", dir);
    snprintf(ck1, sizeof ck1, "%s/single", dir);
    loco_config_defaults(&cfg);
    /* V = 37: the vocabulary is padded to 38 rows for tp = 2, 40 for 4. */
    cfg.model.n_layer = 2, cfg.model.n_head = 4, cfg.model.n_embd = 16;
    cfg.model.seq_len = 8, cfg.model.vocab_size = 37;
    cfg.parallel.tp = 2; /* as the run that wrote them said; export ignores it */
    loco_gpt_config mc = model_tp(1);
    cr_assert_eq(loco_gpt_build_table(&tt[1], &mc), 0);
    loco_rng rng;
    loco_rng_seed(&rng, 11);
    for (int a = 0; a < 3; a++) {
        W[a] = ckpt_test_floats(tt[1].numel, 0.0f);
        for (size_t i = 0; i < tt[1].numel; i++)
            W[a][i] = a == 2 ? loco_rng_uniform(&rng) : loco_rng_normal(&rng);
    }
    make_slices(2);
    make_slices(4);
    static const char *const sec[] = {"model", NULL};
    st = (loco_ckpt_state){
        .step = 17, .data = {1, 512, 0}, .rng = rng, .model_hash = loco_config_hash(&cfg, sec)};
    write_sharded(ck2, 2, 2);
    loco_ckpt_view whole = view_of(1, 0, W[0], W[1], W[2]);
    cr_assert_eq(loco_ckpt_save_view(ck1, &cfg, &whole, &st), 0, "%s", loco_errmsg());
}

static void teardown(void) {
    for (int t = 1; t <= MAXT; t++) {
        for (int k = 0; k < MAXT; k++)
            for (int a = 0; a < 3; a++)
                free(S[t][k][a]);
        loco_ttable_fini(&tt[t]);
    }
    for (int a = 0; a < 3; a++)
        free(W[a]);
    loco_rmtree(dir);
    free(dir);
}

TestSuite(ckpt_tp, .init = setup, .fini = teardown);

#define GUARD 64 /* elements after a view's buffer that loading must not touch */

/* Loads ck into fresh buffers of tp rank k of t over [lo, hi) (parameters
 * and moments alike) and holds them to want (the whole slice buffers). */
static void expect_loads(const char *ck, int t, int k, size_t lo, size_t hi, float *const *want) {
    const size_t n = hi - lo;
    float *b[3] = {ckpt_test_floats(n + GUARD, CKPT_TEST_UNSET),
                   ckpt_test_floats(n + GUARD, CKPT_TEST_UNSET),
                   ckpt_test_floats(n + GUARD, CKPT_TEST_UNSET)};
    loco_ckpt_view v = view_of(t, k, b[0], b[1], b[2]);
    v.p_lo = v.o_lo = lo, v.p_hi = v.o_hi = hi, v.adam_t = 0;
    loco_ckpt_state s;
    cr_assert_eq(loco_ckpt_load_view(ck, &cfg, &v, &s), 0, "%s", loco_errmsg());
    for (int a = 0; a < 3; a++)
        cr_expect_eq(memcmp(b[a], want[a] + lo, n * sizeof(float)), 0,
                     "tp rank %d of %d, [%zu, %zu), array %d differs", k, t, lo, hi, a);
    for (int a = 0; a < 3; a++)
        for (size_t i = n; i < n + GUARD; i++)
            cr_expect_eq(b[a][i], CKPT_TEST_UNSET,
                         "tp rank %d of %d, [%zu, %zu): written past the range", k, t, lo, hi);
    cr_expect_eq(v.adam_t, 17);
    cr_expect_eq(s.step, 17);
    cr_expect(s.data.shard == 1 && s.data.pos == 512);
    for (int a = 0; a < 3; a++)
        free(b[a]);
}

/* A load that must fail with want_rc, a message holding needle, and the
 * view untouched. */
static void expect_refused(const char *ck, int t, int k, int want_rc, const char *needle) {
    const size_t P = tt[t].numel;
    float *b[3] = {ckpt_test_floats(P, CKPT_TEST_UNSET), ckpt_test_floats(P, CKPT_TEST_UNSET),
                   ckpt_test_floats(P, CKPT_TEST_UNSET)};
    loco_ckpt_view v = view_of(t, k, b[0], b[1], b[2]);
    ckpt_test_expect_refused(ck, &cfg, &v, b, P, want_rc, needle);
    for (int a = 0; a < 3; a++)
        free(b[a]);
}

static size_t offset_of(int t, const char *name) {
    int i = loco_ttable_find(&tt[t], name);
    cr_assert(i >= 0, "%s", name);
    return tt[t].t[i].offset;
}

Test(ckpt_tp, manifest_records_tp_and_ranks) {
    char path[700];
    snprintf(path, sizeof path, "%s/state.json", ck2);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    cJSON *j = cJSON_Parse(text);
    cr_assert(j);
    cr_expect_eq(cJSON_GetObjectItem(j, "tp")->valueint, 2);
    cr_expect_eq((size_t)cJSON_GetObjectItem(j, "n_params")->valuedouble, tt[2].numel);
    const cJSON *shards = cJSON_GetObjectItem(j, "shards");
    cr_assert_eq(cJSON_GetArraySize(shards), 4);
    for (int i = 0; i < 4; i++)
        cr_expect_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(shards, i), "tp_rank")->valueint,
                     i % 2);
    cJSON_Delete(j);
    loco_free(text);
    snprintf(path, sizeof path, "%s/shard_00003.safetensors", ck2);
    loco_st *f;
    cr_assert_eq(loco_st_open(&f, path), 0);
    cr_expect_str_eq(loco_st_meta(f, "tp_rank"), "1");
    cr_expect_str_eq(loco_st_meta(f, "tp"), "2");
    loco_st_close(f);
}

Test(ckpt_tp, same_tp_loads_each_rank_exactly) {
    for (int k = 0; k < 2; k++)
        expect_loads(ck2, 2, k, 0, tt[2].numel, S[2][k]);
}

Test(ckpt_tp, tp2_into_the_whole_model_is_exact) {
    expect_loads(ck2, 1, 0, 0, tt[1].numel, W);
}

Test(ckpt_tp, tp2_into_tp4_slices_is_exact_with_zero_padding) {
    for (int k = 0; k < 4; k++)
        expect_loads(ck2, 4, k, 0, tt[4].numel, S[4][k]);
    /* The last rank holds wte rows 30..39, of which 37..39 are padding. */
    const size_t C = 16, wte = offset_of(4, "transformer.wte.weight");
    for (size_t i = 7 * C; i < 10 * C; i++)
        cr_assert_eq(S[4][3][0][wte + i], 0.0f);
}

Test(ckpt_tp, partial_ranges_inside_tensors_are_exact) {
    /* ZeRO-3-like: from inside layer 0's c_attn to inside layer 1's c_fc. */
    for (int t = 2; t <= 4; t += 2) {
        const size_t lo = offset_of(t, "transformer.h.0.attn.c_attn.weight") + 5;
        const size_t hi = offset_of(t, "transformer.h.1.mlp.c_fc.weight") + 7;
        for (int k = 0; k < t; k++) {
            expect_loads(ck2, t, k, lo, hi, S[t][k]);
            expect_loads(ck1, t, k, lo, hi, S[t][k]);
        }
        /* Ranges inside the embedding, ending in a row or in the padding. */
        expect_loads(ck2, t, 0, 3, tt[t].t[0].numel - 2, S[t][0]);
        expect_loads(ck2, t, t - 1, 3, tt[t].t[0].numel - 2, S[t][t - 1]);
    }
    /* Parameters whole, moments a range (ZeRO-1/2). */
    float *p = ckpt_test_floats(tt[4].numel, CKPT_TEST_UNSET),
          *m = ckpt_test_floats(40, CKPT_TEST_UNSET), *v = ckpt_test_floats(40, CKPT_TEST_UNSET);
    loco_ckpt_view view = view_of(4, 2, p, m, v);
    view.o_lo = 1000, view.o_hi = 1040;
    cr_assert_eq(loco_ckpt_load_view(ck2, &cfg, &view, NULL), 0, "%s", loco_errmsg());
    cr_expect_eq(memcmp(p, S[4][2][0], tt[4].numel * sizeof(float)), 0);
    cr_expect_eq(memcmp(m, S[4][2][1] + 1000, 40 * sizeof(float)), 0);
    cr_expect_eq(memcmp(v, S[4][2][2] + 1000, 40 * sizeof(float)), 0);
    free(p), free(m), free(v);
}

Test(ckpt_tp, single_file_into_tp_slices_is_exact) {
    for (int t = 2; t <= 4; t += 2)
        for (int k = 0; k < t; k++)
            expect_loads(ck1, t, k, 0, tt[t].numel, S[t][k]);
}

Test(ckpt_tp, tp4_into_tp2_and_the_whole_model_is_exact) {
    char ck4[600];
    snprintf(ck4, sizeof ck4, "%s/tp4", dir);
    write_sharded(ck4, 4, 3);
    for (int k = 0; k < 2; k++)
        expect_loads(ck4, 2, k, 0, tt[2].numel, S[2][k]);
    expect_loads(ck4, 1, 0, 0, tt[1].numel, W);
}

Test(ckpt_tp, old_sharded_checkpoint_into_tp2_is_exact) {
    char ckd[600], path[800];
    snprintf(ckd, sizeof ckd, "%s/dp3", dir);
    S[1][0][0] = W[0], S[1][0][1] = W[1], S[1][0][2] = W[2];
    write_sharded(ckd, 1, 3);
    S[1][0][0] = S[1][0][1] = S[1][0][2] = NULL;
    /* Written as before tensor parallelism: no tp anywhere. */
    snprintf(path, sizeof path, "%s/state.json", ckd);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    cr_expect(strstr(text, "tp") == NULL, "%s", (char *)text);
    loco_free(text);
    for (int k = 0; k < 2; k++)
        expect_loads(ckd, 2, k, 0, tt[2].numel, S[2][k]);
}

Test(ckpt_tp, parameters_only_view) {
    float *p = ckpt_test_floats(tt[4].numel, CKPT_TEST_UNSET);
    loco_ckpt_view v = view_of(4, 1, p, NULL, NULL);
    cr_assert_eq(loco_ckpt_load_view(ck2, &cfg, &v, NULL), 0, "%s", loco_errmsg());
    cr_expect_eq(memcmp(p, S[4][1][0], tt[4].numel * sizeof(float)), 0);
    free(p);
}

Test(ckpt_tp, export_gives_the_whole_hugging_face_tensors) {
    char out[700], path[800];
    snprintf(out, sizeof out, "%s/hf", dir);
    cr_assert_eq(loco_ckpt_export(ck2, out), 0, "%s", loco_errmsg());
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    loco_st *f;
    cr_assert_eq(loco_st_open(&f, path), 0, "%s", loco_errmsg());
    for (int i = 0; i < tt[1].n; i++) {
        const loco_tensor *gt = &tt[1].t[i];
        const float *x;
        int ndim;
        int64_t shape[LOCO_TENSOR_MAX_DIM];
        cr_assert_eq(loco_st_get(f, gt->name, &x, &ndim, shape), 0, "%s", gt->name);
        cr_expect_eq(ndim, gt->ndim, "%s", gt->name);
        for (int d = 0; d < ndim; d++)
            cr_expect_eq(shape[d], gt->shape[d], "%s dim %d", gt->name, d);
        cr_expect_eq(memcmp(x, W[0] + gt->offset, gt->numel * sizeof(float)), 0, "%s", gt->name);
    }
    const float *x;
    int64_t shape[LOCO_TENSOR_MAX_DIM];
    cr_assert_eq(loco_st_get(f, "transformer.wte.weight", &x, NULL, shape), 0);
    cr_expect(shape[0] == 37 && shape[1] == 16, "wte has V rows, not the padded 38");
    loco_st_close(f);
    snprintf(path, sizeof path, "%s/config.json", out);
    cr_expect_eq(access(path, F_OK), 0);
}

static void remove_shard(const char *ck, int i) {
    char path[800];
    snprintf(path, sizeof path, "%s/shard_%05d.safetensors", ck, i);
    cr_assert_eq(unlink(path), 0, "%s", path);
}

Test(ckpt_tp, missing_slice_files_are_refused_naming_the_rank) {
    remove_shard(ck2, 1);
    remove_shard(ck2, 3);
    expect_refused(ck2, 1, 0, LOCO_EPROTO,
                   "shard_00001.safetensors (of tp rank 1 of 2) is missing");
    expect_refused(ck2, 4, 3, LOCO_EPROTO, "tp rank 1 of 2");
    expect_refused(ck2, 2, 1, LOCO_EPROTO, "tp rank 1 of 2");
    /* Rank 0's slice is all there. */
    expect_loads(ck2, 2, 0, 0, tt[2].numel, S[2][0]);
}

/* Rewrites ck2's state.json through edit. */
static void edit_state(void (*edit)(cJSON *j)) {
    char path[700];
    snprintf(path, sizeof path, "%s/state.json", ck2);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    cJSON *j = cJSON_Parse(text);
    cr_assert(j);
    loco_free(text);
    edit(j);
    char *s = cJSON_Print(j);
    cr_assert_eq(loco_file_write_sync(path, s, strlen(s)), 0);
    cJSON_free(s);
    cJSON_Delete(j);
}

static void drop_rank1(cJSON *j) {
    cJSON *shards = cJSON_GetObjectItem(j, "shards");
    cJSON_DeleteItemFromArray(shards, 3);
    cJSON_DeleteItemFromArray(shards, 1);
}

static void drop_last_shard(cJSON *j) {
    cJSON_DeleteItemFromArray(cJSON_GetObjectItem(j, "shards"), 3);
}

static void tp3(cJSON *j) {
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "tp"), 3);
}

Test(ckpt_tp, manifest_without_a_rank_is_refused) {
    edit_state(drop_rank1);
    expect_refused(ck2, 1, 0, LOCO_EPROTO, "tp rank 1 of 2 has no shards (its slice is missing)");
    expect_refused(ck2, 2, 0, LOCO_EPROTO, "tp rank 1 of 2 has no shards");
}

Test(ckpt_tp, manifest_with_an_untiled_slice_is_refused) {
    edit_state(drop_last_shard);
    expect_refused(ck2, 4, 0, LOCO_EPROTO, "the shards of tp rank 1 of 2 end at");
}

Test(ckpt_tp, tp_not_dividing_the_heads_is_refused) {
    edit_state(tp3);
    expect_refused(ck2, 1, 0, LOCO_EPROTO, "does not divide the model's n_head");
}

Test(ckpt_tp, corrupt_shard_is_refused) {
    char path[800];
    snprintf(path, sizeof path, "%s/shard_00002.safetensors", ck2);
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, -9, SEEK_END);
    int c = fgetc(f);
    fseek(f, -9, SEEK_END);
    fputc(c ^ 0x20, f);
    fclose(f);
    expect_refused(ck2, 1, 0, LOCO_EPROTO,
                   "shard_00002.safetensors (of tp rank 0 of 2) is corrupt");
    expect_refused(ck2, 4, 1, LOCO_EPROTO, "is corrupt or truncated");
    expect_refused(ck2, 2, 0, LOCO_EPROTO, "is corrupt or truncated");
}

Test(ckpt_tp, writing_refuses_a_missing_rank_and_a_tp_single_file) {
    char tmp[700], ck[600];
    snprintf(ck, sizeof ck, "%s/bad", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", ck);
    cr_assert_eq(loco_mkdirs(tmp), 0);
    loco_ckpt_view v = view_of(2, 0, S[2][0][0], S[2][0][1], S[2][0][2]);
    size_t lo = 0, hi = tt[2].numel;
    uint64_t h;
    int rank = 0;
    cr_assert_eq(loco_ckpt_write_shard(tmp, 0, &v, lo, hi, &h), 0);
    cr_expect_eq(loco_ckpt_write_manifest(tmp, ck, &cfg, &v, 1, &lo, &hi, &h, &rank, &st),
                 LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "tp rank 1 of 2 has no shards"), "%s", loco_errmsg());
    cr_expect_neq(access(ck, F_OK), 0, "nothing published");
    cr_expect_eq(loco_ckpt_save_view(ck, &cfg, &v, &st), LOCO_EINVAL);
    cr_expect_neq(access(ck, F_OK), 0, "nothing published");
}

Test(ckpt_tp, failed_allocation_leaves_the_view_untouched) {
    const size_t P = tt[4].numel;
    float *b[3] = {ckpt_test_floats(P, CKPT_TEST_UNSET), ckpt_test_floats(P, CKPT_TEST_UNSET),
                   ckpt_test_floats(P, CKPT_TEST_UNSET)};
    for (long n = 1; n <= 40; n++) {
        loco_ckpt_view v = view_of(4, 3, b[0], b[1], b[2]);
        loco_alloc_fail_after(n);
        int rc = loco_ckpt_load_view(ck2, &cfg, &v, NULL);
        loco_alloc_fail_after(0);
        cr_expect(rc == 0 || rc == LOCO_ENOMEM || rc == LOCO_EPROTO, "allocation %ld: rc %d", n,
                  rc);
        if (rc == 0) {
            cr_expect_eq(memcmp(b[0], S[4][3][0], P * sizeof(float)), 0);
            break;
        }
        bool untouched = true;
        for (int a = 0; a < 3; a++)
            for (size_t i = 0; i < P; i++)
                untouched &= b[a][i] == CKPT_TEST_UNSET;
        cr_expect(untouched, "allocation %ld failed after the view was touched", n);
    }
    for (int a = 0; a < 3; a++)
        free(b[a]);
}
