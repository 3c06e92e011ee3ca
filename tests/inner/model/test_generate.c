/* Using a trained model (inner/model/generate.c): a checkpoint loaded for
 * inference, validation loss and text bytes against batches computed here,
 * the sampler's draws against softmax/top-k computed here in double, and
 * greedy generation against argmax over the sliding window. */
#include "inner/ckpt/ckpt.h"
#include "inner/data/data.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static char *dir;
static loco_config cfg;
static loco_gpt *model = NULL; /* 1 x 4 activations, vocab 50 */

static void setup(void) {
    dir = strdup("/tmp/loco-generate-XXXXXX");
    cr_assert(mkdtemp(dir));
    loco_log_set_level(LOCO_LOG_ERROR);
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 16;
    cfg.model.seq_len = 8, cfg.model.vocab_size = 50;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&model, &mc, 1, 4), 0);
    loco_rng rng;
    loco_rng_seed(&rng, 11);
    loco_gpt_init_weights(model, &rng);
}

static void teardown(void) {
    loco_gpt_destroy(model);
    cr_assert_eq(loco_rmtree(dir), 0, "%s", loco_errmsg());
    free(dir);
}

TestSuite(generate, .init = setup, .fini = teardown);

/* The sampler's rule in double: softmax(logits / temp) over the top k. */
static int ref_sample(const float *logits, int V, double temp, int top_k, double u) {
    float *sorted = malloc((size_t)V * sizeof *sorted);
    memcpy(sorted, logits, (size_t)V * sizeof *sorted);
    /* k-th largest: sort descending */
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (sorted[j] > sorted[i]) {
                float x = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = x;
            }
    double cutoff = top_k > 0 && top_k < V ? sorted[top_k - 1] : -INFINITY;
    double mx = sorted[0], sum = 0;
    free(sorted);
    double p[64];
    for (int v = 0; v < V; v++) {
        p[v] = logits[v] >= cutoff ? exp((logits[v] - mx) / temp) : 0;
        sum += p[v];
    }
    double acc = 0;
    for (int v = 0; v < V; v++) {
        acc += p[v];
        if (u * sum < acc)
            return v;
    }
    return V - 1;
}

Test(generate, sample_token_matches_softmax_top_k) {
    const int V = 12;
    float logits[12], probs[12];
    loco_rng gen;
    loco_rng_seed(&gen, 5);
    for (int v = 0; v < V; v++)
        logits[v] = 3.0f * loco_rng_normal(&gen);
    const struct {
        float temp;
        int k;
    } cases[] = {{1.0f, 0}, {0.7f, 3}, {2.5f, 5}, {1.0f, 12}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        loco_rng a, b;
        loco_rng_seed(&a, 99);
        loco_rng_seed(&b, 99);
        int hist[12] = {0};
        for (int i = 0; i < 2000; i++) {
            int got = loco_sample_token(logits, V, cases[c].temp, cases[c].k, &a, probs);
            int want = ref_sample(logits, V, cases[c].temp, cases[c].k, loco_rng_uniform_d(&b));
            cr_assert_eq(got, want, "case %zu draw %d: %d, want %d", c, i, got, want);
            hist[got]++;
        }
        /* Outside the top k: never drawn. */
        int outside = 0;
        for (int v = 0; v < V; v++) {
            int above = 0;
            for (int w = 0; w < V; w++)
                above += logits[w] > logits[v];
            if (cases[c].k > 0 && above >= cases[c].k)
                outside += hist[v];
        }
        cr_expect_eq(outside, 0, "case %zu: %d draws outside the top %d", c, outside, cases[c].k);
    }
}

Test(generate, sample_token_top_1_is_argmax) {
    const float logits[5] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f};
    float probs[5];
    loco_rng r;
    loco_rng_seed(&r, 1);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(loco_sample_token(logits, 5, 3.0f, 1, &r, probs), 1);
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

typedef struct {
    int ids[32], n, stop_after;
} seen;

static int record(int id, void *arg) {
    seen *s = arg;
    s->ids[s->n++] = id;
    return s->stop_after && s->n >= s->stop_after ? LOCO_ERR(LOCO_EINVAL, "stop") : 0;
}

Test(generate, greedy_follows_argmax_over_the_window) {
    int B, T;
    loco_gpt_capacity(model, &B, &T);
    const int V = 50;
    int32_t ctx[16] = {1, 2, 3};
    size_t n = 3;
    loco_rng r;
    loco_rng_seed(&r, 1);
    const loco_sample_opts o = {.temperature = 1.0f, .top_k = 1};
    seen s = {0};
    cr_assert_eq(loco_gpt_generate(model, ctx, &n, 16, 7, &o, &r, record, &s), 0, "%s",
                 loco_errmsg());
    cr_assert_eq(n, 10);
    cr_assert_eq(s.n, 7);
    int32_t want[16] = {1, 2, 3};
    for (int k = 3; k < 10; k++) {
        int start = k > T ? k - T : 0, len = k - start;
        cr_assert_eq(loco_gpt_forward(model, want + start, NULL, 1, len, NULL), 0);
        want[k] = argmax(loco_gpt_logits(model) + (size_t)(len - 1) * V, V);
        cr_expect_eq(ctx[k], want[k], "id %d: %d, want %d", k, ctx[k], want[k]);
        cr_expect_eq(s.ids[k - 3], want[k]);
    }
}

Test(generate, same_seed_same_ids_and_callback_stops) {
    const loco_sample_opts o = {.temperature = 1.3f, .top_k = 0};
    int32_t a[16] = {7}, b[16] = {7};
    size_t na = 1, nb = 1;
    loco_rng ra, rb;
    loco_rng_seed(&ra, 42);
    loco_rng_seed(&rb, 42);
    cr_assert_eq(loco_gpt_generate(model, a, &na, 16, 9, &o, &ra, NULL, NULL), 0);
    cr_assert_eq(loco_gpt_generate(model, b, &nb, 16, 9, &o, &rb, NULL, NULL), 0);
    cr_assert_eq(na, 10);
    cr_expect_arr_eq(a, b, sizeof a);
    seen s = {.stop_after = 3};
    int32_t c[16] = {7};
    size_t nc = 1;
    cr_expect_eq(loco_gpt_generate(model, c, &nc, 16, 9, &o, &ra, record, &s), LOCO_EINVAL);
    cr_expect_eq(s.n, 3);
    cr_expect_eq(nc, 4);
}

Test(generate, bad_arguments_are_refused) {
    int32_t ctx[4] = {1, 2};
    size_t n = 2, zero = 0;
    loco_rng r;
    loco_rng_seed(&r, 1);
    loco_sample_opts o = {.temperature = 1.0f};
    cr_expect_eq(loco_gpt_generate(model, ctx, &zero, 4, 1, &o, &r, NULL, NULL), LOCO_EINVAL);
    cr_expect_eq(loco_gpt_generate(model, ctx, &n, 4, 3, &o, &r, NULL, NULL), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "room for every new one") != NULL, "%s", loco_errmsg());
    ctx[1] = 50;
    cr_expect_eq(loco_gpt_generate(model, ctx, &n, 4, 1, &o, &r, NULL, NULL), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "context id 50") != NULL, "%s", loco_errmsg());
    ctx[1] = 2;
    o.temperature = 0;
    cr_expect_eq(loco_gpt_generate(model, ctx, &n, 4, 1, &o, &r, NULL, NULL), LOCO_EINVAL);
    cr_expect_eq(n, 2, "a refused call appended ids");
}

Test(generate, eval_matches_batches_computed_here) {
    /* Shard: token i = (3 i + 1) % 50; batches of 2 x 4 read B*T+1 at a time. */
    enum { N = 400, B = 2, T = 4, NB = 5 };
    int32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (3 * i + 1) % 50;
    char shard[600];
    snprintf(shard, sizeof shard, "%s/val_000000.bin", dir);
    cr_assert_eq(loco_data_write_shard(shard, tok, N, 1), 0, "%s", loco_errmsg());
    loco_gpt *m = NULL;
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&m, &mc, B, T), 0);
    memcpy(loco_gpt_params(m), loco_gpt_params(model), loco_gpt_num_params(m) * sizeof(float));
    uint32_t lens[50];
    for (int v = 0; v < 50; v++)
        lens[v] = (uint32_t)(v % 3);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, shard, B, T, 0, 1, 50), 0, "%s", loco_errmsg());
    loco_eval_result r;
    cr_assert_eq(loco_gpt_eval(m, d, NB, lens, &r), 0, "%s", loco_errmsg());
    loco_data_close(d);
    double sum = 0;
    long long bytes = 0;
    for (int b = 0; b < NB; b++) {
        int32_t in[B * T], tg[B * T];
        for (int j = 0; j < B * T; j++) {
            in[j] = tok[b * B * T + j];
            tg[j] = tok[b * B * T + j + 1];
            bytes += tg[j] % 3;
        }
        float loss;
        cr_assert_eq(loco_gpt_forward(m, in, tg, B, T, &loss), 0);
        sum += loss;
    }
    cr_expect_eq(r.batches, NB);
    cr_expect_eq(r.tokens, NB * B * T);
    cr_expect_eq(r.bytes, bytes);
    cr_expect(fabs(r.loss - sum / NB) < 1e-9, "loss %g, want %g", r.loss, sum / NB);
    cr_expect(fabs(r.nats_per_byte - sum / NB * NB * B * T / bytes) < 1e-9);
    /* Byte-level: one byte per id. */
    cr_assert_eq(loco_data_open(&d, shard, B, T, 0, 1, 50), 0);
    cr_assert_eq(loco_gpt_eval(m, d, 2, NULL, &r), 0);
    cr_expect_eq(r.bytes, 2 * B * T);
    cr_expect_eq(loco_gpt_eval(m, d, 0, NULL, &r), LOCO_EINVAL);
    loco_data_close(d);
    loco_gpt_destroy(m);
}

Test(generate, load_ckpt_round_trip_and_missing_dir) {
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    static const char *const sec[] = {"model", NULL};
    loco_ckpt_state st = {.step = 3, .model_hash = loco_config_hash(&cfg, sec)};
    loco_rng_seed(&st.rng, 1);
    loco_adamw opt;
    cr_assert_eq(loco_adamw_init(&opt, loco_gpt_num_params(model), &cfg), 0);
    int rc = loco_ckpt_save(ck, &cfg, model, &opt, &st);
    loco_adamw_fini(&opt);
    cr_assert_eq(rc, 0, "%s", loco_errmsg());
    loco_gpt *m = NULL;
    cr_assert_eq(loco_ckpt_load_model(&m, ck, &cfg, 1, 8), 0, "%s", loco_errmsg());
    int B, T;
    loco_gpt_capacity(m, &B, &T);
    cr_expect_eq(B, 1);
    cr_expect_eq(T, 8);
    cr_expect_arr_eq(loco_gpt_params(m), loco_gpt_params(model),
                     loco_gpt_num_params(model) * sizeof(float));
    loco_gpt_destroy(m);
    char missing[720];
    snprintf(missing, sizeof missing, "%s/nothing", dir);
    cr_expect_lt(loco_ckpt_load_model(&m, missing, &cfg, 1, 8), 0);
    cr_expect(strstr(loco_errmsg(), missing) != NULL, "%s", loco_errmsg());
}
