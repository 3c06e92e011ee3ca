/* The outer step against plain computations, its defences, and DiLoCo run
 * in one process over K trainers: islands stay bit-identical and learn. */
#include "inner/train/train.h"
#include "outer/outer.h"
#include "tests/net/net_test.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static loco_codec_params codec(const char *kind) {
    loco_codec_params p;
    loco_codec_params_default(&p);
    cr_assert_eq(loco_codec_parse(kind, &p.codec), 0);
    p.threads = 1;
    return p;
}

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    loco_rng r;
    loco_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        x[i] = scale * loco_rng_normal(&r);
}

/* K islands' outer states step together over the same contributions. */
Test(outer, nesterov_matches_plain_computation_and_islands_agree) {
    enum { K = 3, N = 1000 };
    static float theta0[N], local[K][N], out[K][N];
    fill(theta0, N, 1, 1.0f);
    loco_outer_params p = {.H = 10, .nesterov = true, .lr = 0.7f, .momentum = 0.9f};
    loco_codec_params cp = codec("none");
    loco_outer *o[K];
    for (int k = 0; k < K; k++)
        cr_assert_eq(loco_outer_create(&o[k], &p, &cp, N, theta0), 0, "%s", loco_errmsg());
    /* Plain reference in float, same order of operations. */
    static float theta[N], mom[N];
    memcpy(theta, theta0, sizeof theta);
    for (int step = 1; step <= 3; step++) {
        const void *bytes[K];
        size_t len[K];
        static unsigned char copy[K][64 * N];
        for (int k = 0; k < K; k++) {
            for (int i = 0; i < N; i++)
                local[k][i] = theta[i] + 0.01f * (float)((i * (k + 3) + step) % 17 - 8);
            cr_assert_eq(loco_outer_encode(o[k], local[k], step, &bytes[k], &len[k], NULL), 0);
            memcpy(copy[k], bytes[k], len[k]);
        }
        for (int k = 0; k < K; k++) {
            loco_outer_begin_average(o[k], K);
            for (int j = 0; j < K; j++)
                cr_assert_eq(loco_outer_add(o[k], copy[j], len[j]), 0, "%s", loco_errmsg());
            cr_assert_eq(loco_outer_apply(o[k], out[k]), 0);
        }
        for (int i = 0; i < N; i++) {
            float avg = 0;
            for (int j = 0; j < K; j++)
                avg = fmaf(theta[i] - local[j][i], 1.0f / K, avg);
            mom[i] = 0.9f * mom[i] + avg;
            theta[i] -= 0.7f * (avg + 0.9f * mom[i]);
        }
        for (int k = 0; k < K; k++) {
            cr_expect_eq(loco_outer_hash(o[k]), loco_outer_hash(o[0]), "island %d differs", k);
            double maxd = 0;
            for (int i = 0; i < N; i++)
                maxd = fmax(maxd, fabs((double)out[k][i] - theta[i]));
            cr_expect(maxd <= 1e-6, "step %d island %d: max diff %g", step, k, maxd);
        }
    }
    for (int k = 0; k < K; k++)
        loco_outer_destroy(o[k]);
}

Test(outer, plain_averaging_is_the_mean_of_the_islands) {
    enum { K = 4, N = 257 };
    static float theta0[N], local[K][N], out[N];
    fill(theta0, N, 2, 1.0f);
    loco_outer_params p = {.H = 1, .nesterov = false, .lr = 1, .momentum = 0};
    loco_codec_params cp = codec("none");
    loco_outer *o;
    cr_assert_eq(loco_outer_create(&o, &p, &cp, N, theta0), 0);
    static unsigned char msgs[K][64 * N];
    size_t lens[K];
    for (int k = 0; k < K; k++) {
        fill(local[k], N, 10 + k, 1.0f);
        const void *b;
        cr_assert_eq(loco_outer_encode(o, local[k], 1, &b, &lens[k], NULL), 0);
        memcpy(msgs[k], b, lens[k]);
    }
    loco_outer_begin_average(o, K);
    for (int k = 0; k < K; k++)
        cr_assert_eq(loco_outer_add(o, msgs[k], lens[k]), 0);
    cr_assert_eq(loco_outer_apply(o, out), 0);
    for (int i = 0; i < N; i++) {
        double mean = 0;
        for (int k = 0; k < K; k++)
            mean += local[k][i];
        mean /= K;
        cr_expect(fabs(out[i] - mean) <= 1e-5, "element %d: %g vs mean %g", i, out[i], mean);
    }
    loco_outer_destroy(o);
}

Test(outer, damaged_contributions_are_refused) {
    enum { N = 5000 };
    static float theta0[N], local[N], out[N];
    fill(theta0, N, 3, 1.0f);
    fill(local, N, 4, 1.0f);
    loco_outer_params p = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f};
    loco_codec_params cp = codec("int8");
    cp.chunk_bytes = 4096; /* several chunks */
    loco_outer *o;
    cr_assert_eq(loco_outer_create(&o, &p, &cp, N, theta0), 0);
    const void *b;
    size_t len;
    cr_assert_eq(loco_outer_encode(o, local, 1, &b, &len, NULL), 0);
    static unsigned char msg[1 << 16], bad[1 << 16];
    cr_assert(len < sizeof msg);
    memcpy(msg, b, len);
    loco_outer_begin_average(o, 1);
    /* truncated, a flipped payload byte, a missing chunk */
    cr_expect_eq(loco_outer_add(o, msg, len - 1), LOCO_EPROTO);
    memcpy(bad, msg, len);
    bad[len - 3] ^= 0x10;
    cr_expect_eq(loco_outer_add(o, bad, len), LOCO_EPROTO);
    loco_chunk_info info;
    cr_assert_eq(loco_chunk_parse(msg, len, &info), 0);
    cr_expect_eq(loco_outer_add(o, msg + info.total_len, len - info.total_len), LOCO_EPROTO);
    cr_expect_eq(loco_outer_apply(o, out), LOCO_EINVAL, "apply before every contribution");
    cr_expect_eq(loco_outer_add(o, msg, len), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_outer_apply(o, out), 0);
    loco_outer_destroy(o);
}

/* A hostile peer's chunk: well-formed (both checksums right) but element
 * 3 of its fp32 payload replaced by v. */
static void forge_value(unsigned char *chunk, size_t len, float v) {
    loco_chunk_info info;
    cr_assert_eq(loco_chunk_parse(chunk, len, &info), 0, "%s", loco_errmsg());
    cr_assert(!info.zstd && info.enc_len >= 16);
    unsigned char *payload = chunk + LOCO_CHUNK_HEADER_BYTES;
    memcpy(payload + 12, &v, sizeof v);
    loco_put_le64(chunk + 48, loco_hash64(payload, info.enc_len));
    loco_put_le64(chunk + 56, loco_hash64(chunk, 56));
}

/* K islands' pipelined exchange in one process, island `poisoned` sending
 * its pseudo-gradient times `factor` (NaN, Inf: its chunk 0 forged to hold
 * one): returns what island 0's
 * loco_outer_add_chunk said (the first error, else 0), *refused the island
 * it named, and whether θ_global of every island stayed as it was. */
static int exchange_with_poison(const char *kind, int K, int poisoned, float factor, float ratio,
                                int *refused, bool *untouched) {
    enum { N = 6000, KMAX = 4 };
    static float theta0[N], local[KMAX][N], out[N];
    fill(theta0, N, 5, 1.0f);
    loco_outer_params p = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f,
                           .max_delta_ratio = ratio};
    loco_codec_params cp = codec(kind);
    cp.chunk_bytes = 4096; /* several chunks */
    cp.zstd = LOCO_ZSTD_OFF;
    loco_outer *o[KMAX];
    static unsigned char bytes[KMAX][64][8192];
    size_t lens[KMAX][64], n_chunks = 0;
    for (int k = 0; k < K; k++) {
        cr_assert_eq(loco_outer_create(&o[k], &p, &cp, N, theta0), 0, "%s", loco_errmsg());
        for (int i = 0; i < N; i++) /* similar pseudo-gradients, of similar size */
            local[k][i] = theta0[i] - 0.01f * (float)((i * (k + 3)) % 17 - 8);
        if (k == poisoned && isfinite(factor))
            loco_outer_poison_next(o[k], factor);
        cr_assert_eq(loco_outer_plan(o[k], local[k], 1, &n_chunks), 0, "%s", loco_errmsg());
        cr_assert(n_chunks > 1 && n_chunks <= 64);
        for (size_t c = 0; c < n_chunks; c++) {
            const void *b;
            cr_assert_eq(loco_outer_encode_chunk(o[k], 0, c, &b, &lens[k][c]), 0, "%s",
                         loco_errmsg());
            cr_assert(lens[k][c] <= sizeof bytes[k][c]);
            memcpy(bytes[k][c], b, lens[k][c]);
        }
        if (k == poisoned && !isfinite(factor))
            forge_value(bytes[k][0], lens[k][0], factor);
    }
    uint64_t before = loco_outer_hash(o[0]);
    int first = 0;
    *refused = -1;
    *untouched = true;
    for (int r = 0; r < K; r++) {
        loco_outer_begin_average(o[r], K);
        int rc = 0;
        for (size_t c = 0; c < n_chunks && rc == 0; c++) {
            for (int k = 0; k < K && rc == 0; k++)
                rc = loco_outer_add_chunk(o[r], 0, k, bytes[k][c], lens[k][c]);
            if (rc == 0)
                rc = loco_outer_apply_chunk(o[r], c, out);
        }
        if (rc == 0)
            rc = loco_outer_apply(o[r], out);
        if (r == 0) {
            first = rc;
            *refused = loco_outer_refused(o[0]);
        } else {
            cr_expect_eq(rc, first, "island %d concluded otherwise than island 0", r);
            cr_expect_eq(loco_outer_refused(o[r]), *refused, "island %d refused another", r);
        }
        if (rc != 0) {
            loco_outer_restore(o[r]);
            *untouched = *untouched && loco_outer_hash(o[r]) == before;
        }
    }
    for (int k = 0; k < K; k++)
        loco_outer_destroy(o[k]);
    return first;
}

Test(outer, contributions_with_nan_inf_or_outlier_norms_are_refused_before_any_apply) {
    int refused;
    bool untouched;
    /* honest islands pass, with the check at its default */
    cr_expect_eq(exchange_with_poison("int8", 3, -1, 1, 10, &refused, &untouched), 0, "%s",
                 loco_errmsg());
    cr_expect_eq(refused, -1);
    /* NaN and Inf (a lossless codec carries them through) */
    cr_expect_eq(exchange_with_poison("none", 3, 1, NAN, 10, &refused, &untouched),
                 LOCO_EREFUSED);
    cr_expect_eq(refused, 1);
    cr_expect(untouched, "θ_global must be as before the refused step");
    cr_expect_eq(exchange_with_poison("none", 3, 2, INFINITY, 0, &refused, &untouched),
                 LOCO_EREFUSED, "NaN/Inf are refused even with the norm check off");
    cr_expect_eq(refused, 2);
    /* an outlier: 1000 times the others, under int8 */
    cr_expect_eq(exchange_with_poison("int8", 3, 0, 1000, 10, &refused, &untouched),
                 LOCO_EREFUSED);
    cr_expect_eq(refused, 0, "the outlier is island 0, not the honest ones");
    cr_expect(untouched);
    cr_expect(strstr(loco_errmsg(), "median") != NULL, "%s", loco_errmsg());
    /* two islands: the honest one's norm is the yardstick */
    cr_expect_eq(exchange_with_poison("int8", 2, 1, -50, 10, &refused, &untouched),
                 LOCO_EREFUSED);
    cr_expect_eq(refused, 1);
    /* a contribution 3 times the others is within a ratio of 10, and the
     * outlier rule is off at 0 */
    cr_expect_eq(exchange_with_poison("int8", 4, 3, 3, 10, &refused, &untouched), 0, "%s",
                 loco_errmsg());
    cr_expect_eq(exchange_with_poison("int8", 3, 0, 1000, 0, &refused, &untouched), 0, "%s",
                 loco_errmsg());
}

/* One averaging step (lr 1, no momentum: θ_global becomes the weighted
 * mean of the islands' θ_local) of K islands through the chunked path with
 * the norm check at 10; tokens NULL keeps 1/K. Returns island 0's rc, its
 * result in out and its hash in *hash. */
static int weighted_step(const double *tokens, float (*local)[3000], int K, float *out,
                         uint64_t *hash) {
    enum { N = 3000 };
    static float theta0[N];
    fill(theta0, N, 7, 1.0f);
    loco_outer_params p = {.H = 1, .nesterov = false, .lr = 1, .momentum = 0,
                           .max_delta_ratio = 10};
    loco_codec_params cp = codec("none");
    cp.chunk_bytes = 4096;
    cp.zstd = LOCO_ZSTD_OFF;
    loco_outer *o;
    cr_assert_eq(loco_outer_create(&o, &p, &cp, N, theta0), 0, "%s", loco_errmsg());
    static unsigned char bytes[4][8][8192];
    size_t lens[4][8], n_chunks = 0;
    for (int k = 0; k < K; k++) {
        cr_assert_eq(loco_outer_plan(o, local[k], 1, &n_chunks), 0, "%s", loco_errmsg());
        cr_assert(n_chunks > 1 && n_chunks <= 8);
        for (size_t c = 0; c < n_chunks; c++) {
            const void *b;
            cr_assert_eq(loco_outer_encode_chunk(o, 0, c, &b, &lens[k][c]), 0);
            memcpy(bytes[k][c], b, lens[k][c]);
        }
    }
    loco_outer_begin_average(o, K);
    int rc = loco_outer_set_weights(o, tokens);
    for (size_t c = 0; c < n_chunks && rc == 0; c++)
        for (int k = 0; k < K && rc == 0; k++)
            rc = loco_outer_add_chunk(o, 0, k, bytes[k][c], lens[k][c]);
    if (rc == 0)
        rc = loco_outer_apply(o, out);
    *hash = loco_outer_hash(o);
    loco_outer_destroy(o);
    return rc;
}

/* outer.weighting = tokens: each island counts in proportion to the tokens
 * it trained on; equal counts are 1/K bit for bit; an island with few
 * tokens is not an outlier for the norm check; a count no island could
 * have trained on is refused. */
Test(outer, the_average_weights_each_island_by_its_tokens) {
    enum { K = 3, N = 3000 };
    static float local[K][N], out[N], out_uniform[N];
    for (int k = 0; k < K; k++)
        fill(local[k], N, 20 + k, 1.0f);
    uint64_t h, h_uniform;
    const double tokens[K] = {1024, 3072, 4096};
    cr_assert_eq(weighted_step(tokens, local, K, out, &h), 0, "%s", loco_errmsg());
    double worst = 0;
    for (int i = 0; i < N; i++) {
        const double want = (1024.0 * local[0][i] + 3072.0 * local[1][i] + 4096.0 * local[2][i]) /
                            8192.0;
        worst = fmax(worst, fabs(out[i] - want));
    }
    cr_expect(worst <= 1e-5, "weighted mean off by %g", worst);
    cr_assert_eq(weighted_step(NULL, local, K, out_uniform, &h_uniform), 0);
    cr_expect_neq(h, h_uniform, "the weights changed nothing");
    const double equal[K] = {4096, 4096, 4096};
    cr_assert_eq(weighted_step(equal, local, K, out, &h), 0);
    cr_expect_eq(h, h_uniform, "equal token counts must give the bits of 1/K");
    cr_expect(!memcmp(out, out_uniform, sizeof out));
    /* similar pseudo-gradients, one island with 1/1000 of the tokens: its
     * share is small, its pseudo-gradient is not an outlier */
    for (int k = 0; k < K; k++)
        for (int i = 0; i < N; i++)
            local[k][i] = 0.01f * (float)((i * (k + 3)) % 17 - 8);
    const double few[K] = {4, 4000, 4000};
    cr_expect_eq(weighted_step(few, local, K, out, &h), 0, "%s", loco_errmsg());
    const double bad[][K] = {{0, 1, 1}, {1, NAN, 1}, {1, 1, 2e15}, {1, -5, 1}};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        cr_expect_eq(weighted_step(bad[b], local, K, out, &h), LOCO_EPROTO, "counts %zu", b);
        cr_expect(strstr(loco_errmsg(), "tokens") != NULL, "%s", loco_errmsg());
    }
}

static double cancel_at;
static bool cancel_after(void *ctx) {
    (void)ctx;
    return loco_now() >= cancel_at;
}

/* An exchange whose peer never sends (it never got the go of a
 * coordinator that died) ends as soon as the attempt is cancelled, not
 * after faulttol.timeout_ms. */
Test(outer, a_cancelled_exchange_ends_without_waiting_out_a_silent_peer, .timeout = 60) {
    loco_net_params sp, cp;
    t_params_plain(&sp, "siteA");
    t_params_plain(&cp, "siteB");
    t_pair pr;
    t_pair_open(&pr, &sp, &cp);
    enum { N = 3000 };
    static float theta0[N], local[N];
    fill(theta0, N, 7, 1.0f);
    fill(local, N, 8, 1.0f);
    loco_outer_params p = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f,
                           .max_delta_ratio = 10};
    loco_codec_params c = codec("int8");
    loco_outer *o;
    cr_assert_eq(loco_outer_create(&o, &p, &c, N, theta0), 0, "%s", loco_errmsg());
    loco_link *peers[2] = {NULL, pr.client};
    loco_exchange x = {.n_islands = 2, .me = 0, .peers = peers, .epoch = 1, .timeout_ms = 30000,
                       .max_frame = 64 << 20, .cancelled = cancel_after};
    cancel_at = loco_now() + 0.5;
    double t0 = loco_now();
    loco_exchange_stats st;
    int rc = loco_outer_step_allgather(o, &x, local, 1, &st);
    double took = loco_now() - t0;
    cr_expect_lt(rc, 0, "the silent peer cannot complete the step");
    cr_expect(strstr(loco_errmsg(), "coordinator that started this attempt is gone") != NULL, "%s",
              loco_errmsg());
    cr_expect(took < 5, "ended %.2f s after the start; cancelled at 0.5 s, timeout 30 s", took);
    loco_outer_destroy(o);
    t_pair_close(&pr);
}

/* DiLoCo in one process: K trainers on disjoint data, an outer step every
 * H inner steps with int8 pseudo-gradients. */
Test(outer, diloco_in_one_process_agrees_and_learns, .timeout = 120) {
    enum { K = 2, H = 10, OUTER = 6 };
    char dir[] = "/tmp/loco-outer-XXXXXX";
    cr_assert(mkdtemp(dir));
    loco_config cfg;
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 32, cfg.model.seq_len = 32;
    cfg.train.batch_size = 4, cfg.train.steps = H * OUTER, cfg.train.warmup_steps = 5;
    cfg.train.lr = 3e-3;
    cfg.run.threads = 1;
    snprintf(cfg.run.dir, sizeof cfg.run.dir, "%s", dir);
    loco_log_set_level(LOCO_LOG_WARN);
    loco_outer_params p;
    cr_assert_eq(loco_outer_params_from_config(&p, &cfg), 0);
    loco_codec_params cp = codec("int8");
    loco_trainer *t[K];
    loco_outer *o[K];
    for (int k = 0; k < K; k++) {
        cr_assert_eq(loco_trainer_create_island(&t[k], &cfg, NULL, k, K), 0, "%s", loco_errmsg());
        size_t lo, hi;
        float *own = loco_trainer_owned_params(t[k], &lo, &hi);
        cr_assert_eq(loco_outer_create(&o[k], &p, &cp, hi - lo, own), 0);
    }
    double first = 0, last = 0;
    for (int outer = 1; outer <= OUTER; outer++) {
        static unsigned char msg[K][1 << 20];
        size_t len[K];
        double loss = 0;
        for (int k = 0; k < K; k++) {
            for (int s = 0; s < H; s++) {
                loco_step_stats st;
                cr_assert_eq(loco_trainer_step(t[k], &st), 0, "%s", loco_errmsg());
                loss += st.loss / (K * H);
            }
            size_t lo, hi;
            float *own = loco_trainer_owned_params(t[k], &lo, &hi);
            const void *b;
            cr_assert_eq(loco_outer_encode(o[k], own, outer, &b, &len[k], NULL), 0);
            cr_assert(len[k] <= sizeof msg[k]);
            memcpy(msg[k], b, len[k]);
        }
        for (int k = 0; k < K; k++) {
            loco_outer_begin_average(o[k], K);
            for (int j = 0; j < K; j++)
                cr_assert_eq(loco_outer_add(o[k], msg[j], len[j]), 0, "%s", loco_errmsg());
            size_t lo, hi;
            cr_assert_eq(loco_outer_apply(o[k], loco_trainer_owned_params(t[k], &lo, &hi)), 0);
            cr_assert_eq(loco_trainer_sync_params(t[k]), 0);
        }
        cr_expect_eq(loco_outer_hash(o[0]), loco_outer_hash(o[1]), "outer step %d", outer);
        if (outer == 1)
            first = loss;
        last = loss;
    }
    cr_expect(last < first - 0.5, "mean inner loss %g after the first outer round, %g at the end",
              first, last);
    for (int k = 0; k < K; k++) {
        loco_outer_destroy(o[k]);
        loco_trainer_destroy(t[k]);
    }
    loco_rmtree(dir);
}

Test(outer, automatic_choice_follows_the_cost_of_each_algorithm) {
    char why[320];
    const double mb = 1e6, gbit = 1e9 / 8;
    /* Two islands: all-gather always (one round, same bytes). */
    cr_expect_eq(loco_exchange_choose(2, 100, 100 * mb, 0.1, gbit, why, sizeof why),
                 LOCO_EXCHANGE_ALLGATHER, "%s", why);
    /* Eight islands, a big shard on a slow link: the bandwidth-optimal one. */
    cr_expect_eq(loco_exchange_choose(8, 100, 100 * mb, 0.1, gbit, why, sizeof why),
                 LOCO_EXCHANGE_RSAG, "%s", why);
    cr_expect(strstr(why, "8 islands") && strstr(why, "reduce-scatter"), "%s", why);
    /* A tiny shard on a long link: one round beats two. */
    cr_expect_eq(loco_exchange_choose(8, 100, 0.01 * mb, 0.2, gbit, why, sizeof why),
                 LOCO_EXCHANGE_ALLGATHER, "%s", why);
    /* One chunk cannot be spread over reducers. */
    cr_expect_eq(loco_exchange_choose(8, 1, 100 * mb, 0.1, gbit, why, sizeof why),
                 LOCO_EXCHANGE_ALLGATHER, "%s", why);
}
