/* train.init_from: Hugging Face GPT-2 directories (tests/fixtures/
 * hf-gpt2-tiny, written by make_hf_gpt2.py from a plain PyTorch GPT-2)
 * import into loco's flat parameters. loco's forward on them reproduces
 * PyTorch's logits; every variant (attention buffers, lm_head present or
 * not, names with or without "transformer.", F16, BF16) loads; bad input
 * is a clear error and leaves the model untouched; tp slices and ZeRO
 * ranges get the right elements; training starts from the weights with
 * fresh AdamW state; `loco train --init DIR` works end to end. */
#include "inner/ckpt/ckpt.h"
#include "inner/data/data.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"
#include "inner/train/train.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#define HF "tests/fixtures/hf-gpt2-tiny"
#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define T_REF 16

static const loco_gpt_config tiny = {
    .n_layer = 2, .n_head = 4, .n_embd = 32, .seq_len = 32, .vocab_size = 256};

static void setup(void) {
    loco_set_threads(1);
    loco_log_set_level(LOCO_LOG_WARN);
}

TestSuite(hf_import, .init = setup, .timeout = 60);

/* The reference tokens (inputs [T], targets [T]) and a named F32 tensor. */
static loco_st *open_ref(int32_t *inputs, int32_t *targets) {
    loco_st *ref;
    cr_assert_eq(loco_st_open(&ref, HF "/reference.safetensors"), 0, "%s", loco_errmsg());
    const float *tok;
    int64_t shape[4];
    int ndim;
    cr_assert_eq(loco_st_get(ref, "tokens", &tok, &ndim, shape), 0);
    cr_assert(ndim == 1 && shape[0] == T_REF + 1);
    for (int t = 0; t < T_REF; t++) {
        inputs[t] = (int32_t)tok[t];
        targets[t] = (int32_t)tok[t + 1];
    }
    return ref;
}

static const float *ref_get(loco_st *ref, const char *name) {
    const float *x;
    cr_assert_eq(loco_st_get(ref, name, &x, NULL, NULL), 0, "%s", name);
    return x;
}

/* loco's logits on the reference tokens of a model imported from dir
 * against PyTorch's (float64 from the same stored weights). */
static void check_logits(const char *dir, const loco_gpt_config *mc, const char *kind) {
    int32_t in[T_REF], tg[T_REF];
    loco_st *ref = open_ref(in, tg);
    loco_gpt *m = NULL;
    cr_assert_eq(loco_gpt_create(&m, mc, 1, T_REF), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_hf_import(dir, m), 0, "%s: %s", dir, loco_errmsg());
    float loss;
    cr_assert_eq(loco_gpt_forward(m, in, tg, 1, T_REF, &loss), 0, "%s", loco_errmsg());
    char name[64];
    snprintf(name, sizeof name, "logits.%s", kind);
    const float *want = ref_get(ref, name);
    double maxd = 0, maxr = 0;
    for (size_t i = 0; i < (size_t)T_REF * 256; i++) {
        maxd = fmax(maxd, fabs((double)loco_gpt_logits(m)[i] - want[i]));
        maxr = fmax(maxr, fabs((double)want[i]));
    }
    cr_expect(maxr > 1, "%s: logits too small to test (%g)", dir, maxr);
    cr_expect(maxd <= 1e-4 * maxr, "%s: logits max diff %g (max |logit| %g)", dir, maxd, maxr);
    snprintf(name, sizeof name, "loss.%s", kind);
    const float *pos = ref_get(ref, name);
    double mean = 0;
    for (int t = 0; t < T_REF; t++)
        mean += pos[t] / T_REF;
    cr_expect(fabs(loss - mean) <= 1e-5 * mean, "%s: loss %.9g, PyTorch %.9g", dir, loss, mean);
    loco_gpt_destroy(m);
    loco_st_close(ref);
}

Test(hf_import, every_variant_reproduces_pytorch_logits) {
    check_logits(HF "/f32-buffers", &tiny, "f32"); /* attn buffers, prefix, no lm_head */
    check_logits(HF "/f32-head", &tiny, "f32");    /* no prefix, lm_head tied */
    check_logits(HF "/f16", &tiny, "f16");
    check_logits(HF "/bf16", &tiny, "bf16"); /* prefix, lm_head */
    /* A shorter model.seq_len takes the first position rows. */
    loco_gpt_config short_ctx = tiny;
    short_ctx.seq_len = T_REF;
    check_logits(HF "/f32-head", &short_ctx, "f32");
}

/* ------------------------------------------------------ writing bad input */

/* A directory holding config.json (the fixture's, with `from` replaced by
 * `to` when given) and model.safetensors from tt over base (F32). */
static char *write_dir(const loco_ttable *tt, const float *base, const char *from, const char *to) {
    char *dir = test_tmpdir("loco-hf");
    char path[512];
    char *text;
    size_t len;
    cr_assert_eq(loco_file_read(HF "/f32-head/config.json", (void **)&text, &len), 0);
    char out[4096];
    const char *at = from ? strstr(text, from) : NULL;
    if (from)
        cr_assert(at, "config.json lacks %s", from);
    if (at)
        snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    else
        snprintf(out, sizeof out, "%s", text);
    loco_free(text);
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(loco_file_write_sync(path, out, strlen(out)), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(loco_st_write(path, tt, base, NULL, NULL), 0, "%s", loco_errmsg());
    return dir;
}

/* The fixture's weights in a whole tiny model. */
static void load_tiny(loco_gpt **m) {
    cr_assert_eq(loco_gpt_create(m, &tiny, 1, T_REF), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_hf_import(HF "/f32-head", *m), 0, "%s", loco_errmsg());
}

/* A copy of m's table, tensor `skip` left out (NULL: none), and `extra`
 * (NULL: none) appended with shape [n0, n1] (n1 = 0: 1-D). */
static void edit_table(loco_ttable *out, const loco_ttable *tt, const char *skip, const char *extra,
                       int64_t n0, int64_t n1) {
    loco_ttable_init(out);
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        if (skip && !strcmp(t->name, skip))
            continue;
        cr_assert_eq(loco_ttable_add(out, t->name, t->ndim, t->shape, -1, false), 0);
        out->t[out->n - 1].offset = t->offset; /* same data */
    }
    if (extra)
        cr_assert_eq(loco_ttable_add(out, extra, n1 ? 2 : 1, (int64_t[]){n0, n1}, -1, false), 0);
}

/* Importing dir into a fresh model of config mc fails with an error whose
 * message holds every one of the NULL-terminated strings; the model's
 * parameters are left as they were. */
static void expect_refused(const char *dir, const loco_gpt_config *mc, const char *what, ...) {
    loco_gpt *m = NULL;
    cr_assert_eq(loco_gpt_create(&m, mc, 1, T_REF), 0);
    for (size_t i = 0; i < loco_gpt_num_params(m); i++)
        loco_gpt_params(m)[i] = 0.5f;
    const uint64_t before = loco_hash64(loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float));
    const int rc = loco_hf_import(dir, m);
    cr_expect(rc < 0, "%s: accepted", what);
    va_list ap;
    va_start(ap, what);
    for (const char *s; (s = va_arg(ap, const char *));)
        cr_expect(strstr(loco_errmsg(), s), "%s: error lacks '%s': %s", what, s, loco_errmsg());
    va_end(ap);
    cr_expect_eq(loco_hash64(loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float)), before,
                 "%s: the model was written before the error", what);
    loco_gpt_destroy(m);
}

Test(hf_import, bad_input_is_named_and_leaves_the_model) {
    loco_gpt *m = NULL;
    load_tiny(&m);
    loco_ttable tt;
    /* A tensor missing. */
    edit_table(&tt, loco_gpt_table(m), "transformer.h.1.mlp.c_fc.bias", NULL, 0, 0);
    char *dir = write_dir(&tt, loco_gpt_params(m), NULL, NULL);
    expect_refused(dir, &tiny, "missing", "model.safetensors", "h.1.mlp.c_fc.bias", "missing",
                   NULL);
    loco_rmtree(dir);
    free(dir);
    loco_ttable_fini(&tt);
    /* An unknown tensor. */
    edit_table(&tt, loco_gpt_table(m), NULL, "transformer.h.2.ln_1.weight", 32, 0);
    float *big = calloc(loco_gpt_num_params(m) + 4096, sizeof(float));
    memcpy(big, loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float));
    dir = write_dir(&tt, big, NULL, NULL);
    expect_refused(dir, &tiny, "unknown", "unknown tensor 'transformer.h.2.ln_1.weight'", NULL);
    loco_rmtree(dir);
    free(dir);
    loco_ttable_fini(&tt);
    /* A wrong shape: c_attn as [32, 64] instead of [32, 96]. */
    edit_table(&tt, loco_gpt_table(m), "transformer.h.0.attn.c_attn.weight",
               "transformer.h.0.attn.c_attn.weight", 32, 64);
    dir = write_dir(&tt, big, NULL, NULL);
    expect_refused(dir, &tiny, "shape", "h.0.attn.c_attn.weight", "[32, 64]", "expected [32, 96]",
                   NULL);
    loco_rmtree(dir);
    free(dir);
    loco_ttable_fini(&tt);
    /* An untied head: lm_head differs from wte in one element. */
    edit_table(&tt, loco_gpt_table(m), NULL, "lm_head.weight", 256, 32);
    float *head = calloc(loco_gpt_num_params(m) + 256 * 32, sizeof(float));
    memcpy(head, loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float));
    memcpy(head + loco_gpt_num_params(m), loco_gpt_param_views(m)->wte, 256 * 32 * sizeof(float));
    const float keep = head[loco_gpt_num_params(m) + 5 * 32 + 7];
    head[loco_gpt_num_params(m) + 5 * 32 + 7] += 0.25f;
    dir = write_dir(&tt, head, NULL, NULL);
    expect_refused(dir, &tiny, "untied", "lm_head.weight differs", "row 5, column 7", "ties", NULL);
    loco_rmtree(dir);
    free(dir);
    /* ... while an equal one loads. */
    head[loco_gpt_num_params(m) + 5 * 32 + 7] = keep;
    dir = write_dir(&tt, head, NULL, NULL);
    check_logits(dir, &tiny, "f32");
    loco_rmtree(dir);
    free(dir);
    loco_ttable_fini(&tt);
    free(head);
    free(big);
    /* tie_word_embeddings = false and no head. */
    dir = write_dir(loco_gpt_table(m), loco_gpt_params(m), "\"scale_attn_weights\"",
                    "\"tie_word_embeddings\": false,\n  \"scale_attn_weights\"");
    expect_refused(dir, &tiny, "no head", "tie_word_embeddings = false", "lm_head.weight", NULL);
    loco_rmtree(dir);
    free(dir);
    /* config.json against [model]: every mismatch named. */
    loco_gpt_config other = tiny;
    other.n_head = 2;
    other.n_layer = 3;
    other.seq_len = 64;
    expect_refused(HF "/f32-buffers", &other, "config", "config.json",
                   "n_head = 4 but model.n_head = 2", "n_layer = 2 but model.n_layer = 3",
                   "n_positions = 32", NULL);
    dir = write_dir(loco_gpt_table(m), loco_gpt_params(m), "\"gelu_new\"", "\"relu\"");
    expect_refused(dir, &tiny, "activation", "activation_function = relu", NULL);
    loco_rmtree(dir);
    free(dir);
    loco_gpt_destroy(m);
}

/* Copies a fixture file with `cut` bytes removed from the end or, with
 * from/to, a same-length patch of its header. */
static char *copy_variant(const char *variant, size_t cut, const char *from, const char *to) {
    char *dir = test_tmpdir("loco-hf");
    char src[512], dst[512];
    void *data;
    size_t len;
    snprintf(src, sizeof src, HF "/%s/config.json", variant);
    cr_assert_eq(loco_file_read(src, &data, &len), 0);
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    cr_assert_eq(loco_file_write_sync(dst, data, len), 0);
    loco_free(data);
    snprintf(src, sizeof src, HF "/%s/model.safetensors", variant);
    cr_assert_eq(loco_file_read(src, &data, &len), 0);
    if (from) {
        char *at = memmem(data, len, from, strlen(from));
        cr_assert(at && strlen(from) == strlen(to));
        memcpy(at, to, strlen(to));
    }
    snprintf(dst, sizeof dst, "%s/model.safetensors", dir);
    cr_assert_eq(loco_file_write_sync(dst, data, len - cut), 0);
    loco_free(data);
    return dir;
}

Test(hf_import, truncated_file_and_foreign_dtype_are_refused) {
    char *dir = copy_variant("f32-buffers", 100, NULL, NULL);
    expect_refused(dir, &tiny, "truncated", "model.safetensors", "truncated", NULL);
    loco_rmtree(dir);
    free(dir);
    dir = copy_variant("f32-buffers", 143000, NULL, NULL); /* into the header */
    expect_refused(dir, &tiny, "header cut", "model.safetensors", NULL);
    loco_rmtree(dir);
    free(dir);
    dir = copy_variant("f16", 0, "\"F16\"", "\"I16\"");
    expect_refused(dir, &tiny, "dtype", "is I16, expected F32, F16 or BF16", NULL);
    loco_rmtree(dir);
    free(dir);
    expect_refused("/nonexistent/hf", &tiny, "absent", "/nonexistent/hf/config.json", NULL);
}

Test(hf_import, padded_vocabulary_rows_are_dropped) {
    loco_gpt *m = NULL;
    load_tiny(&m);
    /* wte with 260 rows (4 of padding, garbage) under config.json's 256. */
    loco_ttable tt;
    loco_ttable_init(&tt);
    float *buf = calloc(loco_gpt_num_params(m) + 4 * 32, sizeof(float));
    memcpy(buf, loco_gpt_param_views(m)->wte, 256 * 32 * sizeof(float));
    for (int i = 0; i < 4 * 32; i++)
        buf[256 * 32 + i] = 9.0f;
    memcpy(buf + 260 * 32, loco_gpt_param_views(m)->wpe,
           (loco_gpt_num_params(m) - 256 * 32) * sizeof(float));
    cr_assert_eq(loco_ttable_add(&tt, "transformer.wte.weight", 2, (int64_t[]){260, 32}, -1, 0), 0);
    for (int i = 1; i < loco_gpt_table(m)->n; i++)
        cr_assert_eq(loco_ttable_add(&tt, loco_gpt_table(m)->t[i].name,
                                     loco_gpt_table(m)->t[i].ndim, loco_gpt_table(m)->t[i].shape,
                                     -1, 0),
                     0);
    char *dir = write_dir(&tt, buf, NULL, NULL);
    check_logits(dir, &tiny, "f32");
    loco_rmtree(dir);
    free(dir);
    /* config.json's vocab_size is the model's: 260 there is a mismatch. */
    dir = write_dir(&tt, buf, "\"vocab_size\": 256", "\"vocab_size\": 260");
    expect_refused(dir, &tiny, "vocab", "vocab_size = 260 but model.vocab_size = 256", NULL);
    loco_rmtree(dir);
    free(dir);
    loco_ttable_fini(&tt);
    free(buf);
    loco_gpt_destroy(m);
}

/* Tensor-parallel slices and ZeRO-3 ranges: every element of rank k's
 * slice is the whole tensor's element there (loco_gpt_tp_locate, the map
 * checkpoints reshard by); c_attn's slice holds the rank's heads of q, k
 * and v; only [p_lo, p_hi) of a ZeRO-3 range is written. */
Test(hf_import, tp_slices_and_ranges_get_their_elements) {
    loco_gpt *whole = NULL;
    load_tiny(&whole);
    loco_gpt_config mc = tiny;
    mc.vocab_size = 255; /* config.json says 256 */
    for (int t = 2; t <= 4; t += 2) {
        mc.tp = t;
        loco_ttable tt;
        cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0);
        float *slice = malloc(tt.numel * sizeof(float));
        for (int k = 0; k < t; k++) {
            for (size_t i = 0; i < tt.numel; i++)
                slice[i] = NAN;
            loco_ckpt_view v = {
                .tt = &tt, .model = mc, .tp_rank = k, .params = slice, .p_lo = 0, .p_hi = tt.numel};
            cr_expect_lt(loco_hf_import_view(HF "/f32-buffers", &v), 0);
            cr_expect(strstr(loco_errmsg(), "vocab_size = 256 but model.vocab_size = 255"), "%s",
                      loco_errmsg());
        }
        free(slice);
        loco_ttable_fini(&tt);
    }
    mc.vocab_size = 256;
    for (int t = 2; t <= 4; t += 2) {
        mc.tp = t;
        loco_ttable tt;
        cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0);
        float *slice = malloc(tt.numel * sizeof(float));
        for (int k = 0; k < t; k++) {
            for (size_t i = 0; i < tt.numel; i++)
                slice[i] = NAN;
            loco_ckpt_view v = {
                .tt = &tt, .model = mc, .tp_rank = k, .params = slice, .p_lo = 0, .p_hi = tt.numel};
            cr_assert_eq(loco_hf_import_view(HF "/f32-head", &v), 0, "%s", loco_errmsg());
            for (int i = 0; i < loco_gpt_table(whole)->n; i++) {
                const loco_tensor *g = &loco_gpt_table(whole)->t[i];
                const loco_tensor *s = &tt.t[loco_ttable_find(&tt, g->name)];
                size_t bad = 0;
                for (size_t x = 0; x < g->numel; x++) {
                    int r;
                    size_t j;
                    loco_gpt_tp_locate(g, t, x, &r, &j);
                    if ((r == k || r == -1) &&
                        slice[s->offset + j] != loco_gpt_params(whole)[g->offset + x])
                        bad++;
                }
                cr_expect_eq(bad, 0, "tp %d rank %d: %s: %zu elements wrong", t, k, g->name, bad);
            }
            /* By hand: c_attn's columns of rank k are q, k, v of its heads. */
            const loco_tensor *s =
                &tt.t[loco_ttable_find(&tt, "transformer.h.1.attn.c_attn.weight")];
            const int Cl = 32 / t;
            for (int row = 0; row < 32; row += 7)
                for (int part = 0; part < 3; part++)
                    for (int c = 0; c < Cl; c++)
                        cr_expect_eq(slice[s->offset + (size_t)row * 3 * Cl + part * Cl + c],
                                     loco_gpt_param_views(whole)->h[1].qkvw[row * 96 + part * 32 +
                                                                            k * Cl + c]);
        }
        free(slice);
        loco_ttable_fini(&tt);
    }
    /* A ZeRO-3 range of the whole model: only [lo, hi) written, at params. */
    const size_t lo = 1000, hi = loco_gpt_num_params(whole) - 777;
    float *part = malloc((hi - lo + 8) * sizeof(float));
    for (size_t i = 0; i < hi - lo + 8; i++)
        part[i] = -3.0f;
    loco_ckpt_view v = {
        .tt = loco_gpt_table(whole), .model = tiny, .params = part, .p_lo = lo, .p_hi = hi};
    cr_assert_eq(loco_hf_import_view(HF "/bf16", &v), 0, "%s", loco_errmsg());
    loco_gpt *b = NULL;
    cr_assert_eq(loco_gpt_create(&b, &tiny, 1, 1), 0);
    cr_assert_eq(loco_hf_import(HF "/bf16", b), 0);
    cr_expect_eq(memcmp(part, loco_gpt_params(b) + lo, (hi - lo) * sizeof(float)), 0);
    for (int i = 0; i < 8; i++)
        cr_expect_eq(part[hi - lo + i], -3.0f);
    loco_gpt_destroy(b);
    free(part);
    loco_gpt_destroy(whole);
}

/* --------------------------------------------------------------- training */

static void tiny_train_config(loco_config *cfg, const char *dir) {
    loco_config_defaults(cfg);
    cfg->model.n_layer = 2;
    cfg->model.n_head = 4;
    cfg->model.n_embd = 32;
    cfg->model.seq_len = 32;
    cfg->model.vocab_size = 256;
    cfg->train.batch_size = 4;
    cfg->train.steps = 3;
    cfg->train.warmup_steps = 0;
    cfg->train.lr = 1e-3;
    cfg->train.grad_clip = 0;
    cfg->run.threads = 1;
    cfg->run.log_every = 1000;
    cfg->run.eval_every = 0;
    snprintf(cfg->run.dir, sizeof cfg->run.dir, "%s", dir);
    snprintf(cfg->train.init_from, sizeof cfg->train.init_from, "%s", HF "/f32-buffers");
}

/* The imported model's mean loss on the first training batch of cfg. */
static float first_batch_loss(const loco_config *cfg) {
    loco_gpt *m = NULL;
    const int B = (int)cfg->train.batch_size, T = (int)cfg->model.seq_len;
    cr_assert_eq(loco_gpt_create(&m, &tiny, B, T), 0);
    cr_assert_eq(loco_hf_import(cfg->train.init_from, m), 0, "%s", loco_errmsg());
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, cfg->data.train, B, T, 0, 1, 256), 0, "%s", loco_errmsg());
    int32_t *in = malloc((size_t)B * T * sizeof(int32_t)), *tg = malloc((size_t)B * T * 4);
    cr_assert_eq(loco_data_next(d, in, tg), 0);
    float loss;
    cr_assert_eq(loco_gpt_forward(m, in, tg, B, T, &loss), 0);
    free(in);
    free(tg);
    loco_data_close(d);
    loco_gpt_destroy(m);
    return loss;
}

Test(hf_import, training_starts_from_the_weights_with_fresh_adamw, .timeout = 60) {
    char *dir = test_tmpdir("loco-hf-train");
    loco_config cfg;
    tiny_train_config(&cfg, dir);
    const float want = first_batch_loss(&cfg);
    loco_gpt *ref = NULL;
    load_tiny(&ref);
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), 0, "%s", loco_errmsg());
    loco_gpt *m = loco_trainer_model(t);
    cr_assert_eq(loco_gpt_num_params(m), loco_gpt_num_params(ref));
    cr_expect_eq(
        memcmp(loco_gpt_params(m), loco_gpt_params(ref), loco_gpt_num_params(m) * sizeof(float)), 0,
        "the trainer's weights are not the imported ones");
    cr_expect_eq(loco_trainer_steps_done(t), 0);
    loco_step_stats s;
    cr_assert_eq(loco_trainer_step(t, &s), 0, "%s", loco_errmsg());
    cr_expect(fabsf(s.loss - want) <= 1e-5f * want, "step 1 loss %.9g, imported model %.9g", s.loss,
              want);
    /* Fresh moments: AdamW's first update moves every parameter with a
     * clear gradient by lr (m/sqrt(v) = +-1); ln_f.bias has no decay. */
    const int lf = loco_ttable_find(loco_gpt_table(m), "transformer.ln_f.bias");
    const float lr = loco_lr_at(&cfg, 0);
    for (int i = 0; i < 32; i++) {
        const float d = fabsf(loco_gpt_params(m)[loco_gpt_table(m)->t[lf].offset + i] -
                              loco_gpt_params(ref)[loco_gpt_table(ref)->t[lf].offset + i]);
        cr_expect(fabsf(d - lr) <= 1e-3f * lr, "ln_f.bias[%d] moved %g, lr %g", i, d, lr);
    }
    cr_assert_eq(loco_trainer_step(t, &s), 0);
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    cr_assert_eq(loco_trainer_save(t, ck), 0, "%s", loco_errmsg());
    const uint64_t h2 = loco_hash64(loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float));
    loco_trainer_destroy(t);
    /* Resume wins over init_from. */
    cr_assert_eq(loco_trainer_create(&t, &cfg, ck), 0, "%s", loco_errmsg());
    m = loco_trainer_model(t);
    cr_expect_eq(loco_trainer_steps_done(t), 2);
    cr_expect_eq(loco_hash64(loco_gpt_params(m), loco_gpt_num_params(m) * sizeof(float)), h2);
    loco_trainer_destroy(t);
    /* A mismatch fails the trainer with the importer's message. */
    cfg.model.n_embd = 64;
    cr_expect_lt(loco_trainer_create(&t, &cfg, NULL), 0);
    cr_expect(strstr(loco_errmsg(), "n_embd = 32 but model.n_embd = 64"), "%s", loco_errmsg());
    loco_gpt_destroy(ref);
    loco_rmtree(dir);
    free(dir);
}

Test(hf_import, cli_train_init_end_to_end, .timeout = 60) {
    char *dir = test_tmpdir("loco-hf-cli");
    loco_config cfg;
    tiny_train_config(&cfg, dir);
    const float want = first_batch_loss(&cfg);
    char out[16384];
    const char *sets = "--set model.n_layer=2 --set model.n_head=4 --set model.n_embd=32 "
                       "--set model.seq_len=32 --set train.batch_size=4 --set train.steps=2 "
                       "--set train.warmup_steps=0 --set run.log_every=1 --set run.eval_every=0 "
                       "--set run.threads=1";
    int rc = test_run(out, sizeof out, LOCO " train configs/tiny.ini %s --set run.dir=%s --init %s",
                      sets, dir, HF "/f32-head");
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "init_from " HF "/f32-head"), "%s", out);
    double loss[3];
    test_read_losses(dir, loss, 2);
    cr_expect(fabs(loss[1] - want) <= 1e-5 * want, "step 1 loss %.9g, imported model %.9g", loss[1],
              want);
    cr_expect(loss[2] > 0);
    /* Refused shapes: the command fails naming config.json and the key. */
    rc = test_run(out, sizeof out,
                  LOCO " train configs/tiny.ini %s --set run.dir=%s/b "
                       "--set model.n_head=2 --init %s",
                  sets, dir, HF "/f32-head");
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect(strstr(out, "config.json: n_head = 4 but model.n_head = 2"), "%s", out);
    loco_rmtree(dir);
    free(dir);
}
