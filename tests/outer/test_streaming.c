/* Streaming DiLoCo (outer.fragments, outer.overlap, outer.merge_alpha)
 * across islands over loopback TLS (`loco launch`): every island ends
 * bit-identical to a plain single-process reference of the same schedule
 * (fragment (j - 1) mod F synced after inner step j·H/F, its update merged
 * τ steps later, every fragment synced at the last step); with one
 * fragment and no overlap that reference is DiLoCo's. An island killed
 * during an overlapped exchange is redone without and rejoins; a run
 * resumed between fragment syncs, with a merge still due, ends as the run
 * that never stopped. */
#include "inner/model/model.h"
#include "inner/train/train.h"
#include "outer/outer.h"
#include "tests/outer/diloco_reference.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define MAXK 4

typedef struct {
    int K, F, tau, steps, H;
    float alpha;
    const char *codec;
} schedule;

static void small(loco_config *cfg, const schedule *sc) {
    loco_config_defaults(cfg);
    cfg->model.n_layer = 4, cfg->model.n_head = 2, cfg->model.n_embd = 32;
    cfg->model.seq_len = 32;
    cfg->train.batch_size = 4, cfg->train.steps = sc->steps, cfg->train.warmup_steps = 5;
    cfg->run.threads = 1;
    cfg->outer.H = sc->H;
    cfg->outer.momentum = 0.5; /* configs/multisite-*.ini's, which the islands launch */
    snprintf(cfg->compress.codec, sizeof cfg->compress.codec, "%s", sc->codec);
    snprintf(cfg->compress.zstd, sizeof cfg->compress.zstd, "on");
}

#define ARGS                                                                                       \
    " --set model.n_layer=4 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32"    \
    " --set train.batch_size=4 --set train.warmup_steps=5"                                        \
    " --set run.threads=1 --set run.eval_every=0 --set run.log_every=100"                          \
    " --set compress.zstd=on --set net.wan_delay_ms=0 --set net.wan_gbps=0"                      \
    " --set outer.algorithm=allgather --set faulttol.phi_pause_ms=5000"

typedef struct {
    loco_trainer *t;
    loco_fragments fr;
    loco_outer *o[LOCO_MAX_FRAGMENTS];
    float *snap; /* θ_local of the fragment in flight */
    unsigned char *msg;
    size_t len;
} ref_island;

static float *own_of(ref_island *r) {
    size_t lo, hi;
    return loco_trainer_owned_params(r->t, &lo, &hi);
}

/* Outer step j of fragment f on every island: encode from the snapshot. */
static void ref_start(ref_island *r, int K, int64_t j, int f) {
    for (int k = 0; k < K; k++) {
        loco_fragments_gather(&r[k].fr, f, own_of(&r[k]), r[k].snap);
        const void *b;
        cr_assert_eq(loco_outer_encode(r[k].o[f], r[k].snap, j, &b, &r[k].len, NULL), 0);
        r[k].msg = realloc(r[k].msg, r[k].len ? r[k].len : 1);
        memcpy(r[k].msg, b, r[k].len);
    }
}

/* Averages in island order and applies the outer optimizer. */
static void ref_finish(ref_island *r, int K, int f) {
    for (int k = 0; k < K; k++) {
        loco_outer_begin_average(r[k].o[f], K);
        for (int i = 0; i < K; i++)
            cr_assert_eq(loco_outer_add(r[k].o[f], r[i].msg, r[i].len), 0, "%s", loco_errmsg());
        cr_assert_eq(loco_outer_apply(r[k].o[f], r[k].snap), 0);
    }
}

static void ref_merge(ref_island *r, int K, int f, float alpha) {
    for (int k = 0; k < K; k++) {
        loco_fragments_merge(&r[k].fr, f, loco_outer_theta(r[k].o[f]), own_of(&r[k]), alpha);
        cr_assert_eq(loco_trainer_sync_params(r[k].t), 0);
    }
}

/* The schedule in one process; returns island 0's final parameters (all
 * islands' are checked equal). */
static float *reference(const schedule *sc, size_t *n_params) {
    char dir[] = "/tmp/loco-sref-XXXXXX";
    cr_assert(mkdtemp(dir));
    loco_config cfg;
    small(&cfg, sc);
    snprintf(cfg.run.dir, sizeof cfg.run.dir, "%s", dir);
    loco_log_set_level(LOCO_LOG_WARN);
    loco_outer_params p;
    loco_codec_params cp;
    cr_assert_eq(loco_outer_params_from_config(&p, &cfg), 0);
    cr_assert_eq(loco_codec_params_from_config(&cp, &cfg), 0);
    ref_island r[MAXK] = {0};
    size_t lo, hi;
    for (int k = 0; k < sc->K; k++) {
        cr_assert_eq(loco_trainer_create_island(&r[k].t, &cfg, NULL, k, sc->K), 0, "%s",
                     loco_errmsg());
        float *own = loco_trainer_owned_params(r[k].t, &lo, &hi);
        cr_assert_eq(loco_fragments_plan(&r[k].fr, sc->F, 4, loco_trainer_param_table(r[k].t),
                                         lo, hi),
                     0, "%s", loco_errmsg());
        r[k].snap = malloc((hi - lo) * sizeof(float));
        for (int f = 0; f < sc->F; f++) {
            loco_fragments_gather(&r[k].fr, f, own, r[k].snap);
            cr_assert_eq(loco_outer_create(&r[k].o[f], &p, &cp, r[k].fr.n_f[f], r[k].snap), 0);
        }
    }
    const int P = sc->H / sc->F;
    int fly = -1, merge = -1;
    int64_t fly_start = 0, merge_step = 0;
    for (int64_t s = 1; s <= sc->steps; s++) {
        for (int k = 0; k < sc->K; k++)
            cr_assert_eq(loco_trainer_step(r[k].t, NULL), 0, "%s", loco_errmsg());
        const bool last = s == sc->steps;
        if (fly >= 0 && (s >= fly_start + sc->tau || last)) {
            ref_finish(r, sc->K, fly);
            merge = fly, merge_step = fly_start + sc->tau;
            fly = -1;
        }
        if (merge >= 0 && (s >= merge_step || last)) {
            ref_merge(r, sc->K, merge, last ? 0.0f : sc->alpha);
            merge = -1;
        }
        if (last) {
            /* Every fragment synced at the end, the one due now first;
             * θ_local ← θ_global. */
            const int64_t first = s % P == 0 ? s / P : s / P + 1;
            for (int64_t j = first; j < first + sc->F; j++) {
                const int f = (int)((j - 1) % sc->F);
                ref_start(r, sc->K, j, f);
                ref_finish(r, sc->K, f);
                ref_merge(r, sc->K, f, 0.0f);
            }
        } else if (s % P == 0) {
            const int64_t j = s / P;
            fly = (int)((j - 1) % sc->F);
            fly_start = s;
            ref_start(r, sc->K, j, fly);
            if (sc->tau == 0) {
                ref_finish(r, sc->K, fly);
                ref_merge(r, sc->K, fly, sc->alpha);
                fly = -1;
            }
        }
    }
    *n_params = hi - lo;
    float *theta = malloc(*n_params * sizeof(float));
    memcpy(theta, own_of(&r[0]), *n_params * sizeof(float));
    for (int k = 0; k < sc->K; k++) {
        cr_expect_eq(memcmp(own_of(&r[k]), theta, *n_params * sizeof(float)), 0,
                     "reference island %d differs from island 0", k);
        for (int f = 0; f < sc->F; f++)
            loco_outer_destroy(r[k].o[f]);
        loco_fragments_fini(&r[k].fr);
        free(r[k].snap);
        free(r[k].msg);
        loco_trainer_destroy(r[k].t);
    }
    loco_rmtree(dir);
    return theta;
}

/* Plain DiLoCo in one process (tests/outer/diloco_reference.h). */
static float *diloco(const schedule *sc, size_t *n_params) {
    loco_config cfg;
    small(&cfg, sc);
    return diloco_reference(&cfg, sc->K, n_params, NULL);
}

/* Runs the islands and compares each one's last checkpoint with the
 * reference, tensor by tensor. */
static void check_islands(const schedule *sc) {
    static const char *const names[] = {"siteA", "siteB", "siteC", "siteD"};
    size_t n;
    float *theta = reference(sc, &n);
    char dir[] = "/tmp/loco-streaming-XXXXXX";
    cr_assert(mkdtemp(dir));
    static char out[1 << 18];
    int rc = test_run(out, sizeof out,
                      LOCO " launch configs/multisite-%d.ini" ARGS
                           " --set compress.codec=%s --set run.dir=%s --set train.steps=%d"
                           " --set outer.H=%d --set outer.fragments=%d --set outer.overlap=%d"
                           " --set outer.merge_alpha=%g",
                      sc->K, sc->codec, dir, sc->steps, sc->H, sc->F, sc->tau,
                      (double)sc->alpha);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "run finished; θ_global agreed") != NULL, "%s", out);
    const loco_gpt_config mc = {
        .n_layer = 4, .n_head = 2, .n_embd = 32, .seq_len = 32, .vocab_size = 256};
    loco_ttable tt;
    cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0);
    cr_assert_eq(tt.numel, n);
    for (int k = 0; k < sc->K; k++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s/ckpt_%08d/model.safetensors", dir, names[k],
                 sc->steps);
        loco_st *st;
        cr_assert_eq(loco_st_open(&st, path), 0, "%s", loco_errmsg());
        size_t diff = 0;
        for (int i = 0; i < tt.n; i++) {
            const float *x;
            cr_assert_eq(loco_st_get(st, tt.t[i].name, &x, NULL, NULL), 0);
            diff += memcmp(x, theta + tt.t[i].offset, tt.t[i].numel * sizeof(float)) != 0;
        }
        cr_expect_eq(diff, 0, "%s: %zu tensors differ from the reference", names[k], diff);
        loco_st_close(st);
    }
    loco_ttable_fini(&tt);
    free(theta);
    loco_rmtree(dir);
}

TestSuite(streaming, .timeout = 240);

Test(streaming, one_fragment_without_overlap_is_diloco) {
    const schedule sc = {.K = 2, .F = 1, .tau = 0, .steps = 20, .H = 10, .codec = "int8"};
    size_t n, m;
    float *a = reference(&sc, &n), *b = diloco(&sc, &m);
    cr_assert_eq(n, m);
    cr_expect_eq(memcmp(a, b, n * sizeof(float)), 0, "the schedule with F = 1, τ = 0 is DiLoCo");
    free(a);
    free(b);
    /* And the islands running it are today's DiLoCo, bit for bit. */
    check_islands(&sc);
}

Test(streaming, two_islands_two_fragments_overlapped_agree_with_the_reference) {
    const schedule sc = {.K = 2, .F = 2, .tau = 2, .steps = 30, .H = 10, .alpha = 0.5f,
                         .codec = "int8"};
    check_islands(&sc);
}

Test(streaming, four_islands_four_fragments_int4_agree_with_the_reference) {
    const schedule sc = {.K = 4, .F = 4, .tau = 1, .steps = 26, .H = 8, .alpha = 0.25f,
                         .codec = "int4"};
    check_islands(&sc);
}

/* Settings the schedule cannot follow are refused with the keys named. */
Test(streaming, impossible_schedules_are_refused_clearly) {
    static const struct {
        const char *set, *says;
    } bad[] = {
        {"--set outer.H=10 --set outer.fragments=3", "outer.H = 10 must be a multiple"},
        {"--set outer.H=10 --set outer.fragments=2 --set outer.overlap=5",
         "outer.overlap = 5: expected fewer than outer.H / outer.fragments = 5"},
        {"--set outer.H=10 --set outer.fragments=5", "outer.fragments = 5: at most model.n_layer = 4"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char dir[] = "/tmp/loco-streaming-bad-XXXXXX";
        cr_assert(mkdtemp(dir));
        static char out[1 << 16];
        int rc = test_run(out, sizeof out,
                          LOCO " launch configs/multisite-2.ini" ARGS
                               " --set train.steps=10 --set run.dir=%s %s",
                          dir, bad[i].set);
        cr_expect_neq(rc, 0, "%s was accepted", bad[i].set);
        cr_expect(strstr(out, bad[i].says) != NULL, "%s: %s", bad[i].set, out);
        loco_rmtree(dir);
    }
}
