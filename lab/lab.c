/* The quality lab's runs: M islands in one process on the outer loop of a
 * launched run, data parallelism on the same tokens, and the interval of
 * a mean. The schedule is docs/STREAMING.md's, as outer/island.c runs it:
 * outer step j syncs fragment (j - 1) mod F after inner step j·H/F; its
 * exchange completes τ = outer.overlap steps later (or at the last step),
 * then the fragment's θ_global is merged into θ_local with outer.merge_alpha
 * (0 at the last step); the last step syncs every fragment, the one due
 * then first. Each island encodes its pseudo-gradient from θ_local as it
 * was when the step began; every island averages every island's bytes in
 * ascending island order, as the all-gather exchange does. */
#include "lab/lab.h"

#include "compress/compress.h"
#include "faulttol/faulttol.h"
#include "inner/train/train.h"
#include "outer/outer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LAB_MAX_ISLANDS 64

typedef struct {
    loco_trainer *t;
    loco_fragments fr;
    loco_outer *o[LOCO_MAX_FRAGMENTS];
    float *snap;        /* θ_local of the fragment in flight, packed */
    unsigned char *msg; /* its encoded pseudo-gradient */
    size_t len, cap;
    double sent, raw;   /* over the run */
} lab_island;

typedef struct {
    const loco_config *cfg;
    lab_island *is;
    int K, F;
    loco_lab_trace_fn trace;
    void *trace_ctx;
    int64_t outer_steps;
} lab_run;

static int n_sites(const loco_config *cfg, int *K) {
    char first[LOCO_NET_NAME_MAX] = {0};
    size_t i = 0;
    while (cfg->outer.sites[i] && cfg->outer.sites[i] != ',' && i + 1 < sizeof first) {
        first[i] = cfg->outer.sites[i];
        i++;
    }
    int id;
    LOCO_CHECK(loco_site_id(cfg, first, &id, K));
    return 0;
}

int loco_lab_check(const loco_config *cfg, char *why, size_t cap) {
    const loco_config *c = cfg;
    const char *no = NULL;
    int K = 0;
    if (c->parallel.dp != 1 || c->parallel.tp != 1 || c->parallel.pp != 1 || c->parallel.cp != 1 ||
        c->parallel.ep != 1)
        no = "the lab's islands have one rank each: parallel.dp, tp, pp, cp and ep must be 1";
    else if (strcmp(c->train.device, "cpu") != 0)
        no = "the lab trains on the host: train.device must be cpu";
    else if (!strcmp(c->outer.algorithm, "rsag"))
        no = "outer.algorithm = rsag re-encodes the averages (other bits than the lab's "
             "all-gather): use allgather or auto";
    else if (!strcmp(c->outer.sync, "time"))
        no = "outer.sync = time depends on each island's wall clock: the lab runs its islands "
             "in lockstep (outer.sync = steps)";
    else if (c->outer.quorum > 0)
        no = "outer.quorum depends on which island is ready first: the lab runs its islands in "
             "lockstep (outer.quorum = 0)";
    else if (c->n_site_sets > 0)
        no = "[site.NAME] keys: the lab's islands are alike (one config for all)";
    else if (n_sites(c, &K) < 0 || K < 2)
        no = "outer.sites must list at least two islands";
    else if (K > LAB_MAX_ISLANDS)
        no = "outer.sites lists more islands than the lab runs (64)";
    if (why && cap)
        snprintf(why, cap, "%s", no ? no : "");
    return no ? LOCO_ERR(LOCO_EINVAL, "lab: %s", no) : 0;
}

static float *own_of(lab_island *r) {
    size_t lo, hi;
    return loco_trainer_owned_params(r->t, &lo, &hi);
}

/* Outer step j of fragment f begins: every island encodes its Δ from its
 * θ_local as it is now. */
static int start(lab_run *L, int64_t j, int f) {
    for (int k = 0; k < L->K; k++) {
        lab_island *r = &L->is[k];
        if (r->fr.n_f[f] == 0)
            continue;
        loco_outer_save(r->o[f]);
        loco_fragments_gather(&r->fr, f, own_of(r), r->snap);
        const void *b;
        size_t len, raw;
        LOCO_CHECK(loco_outer_encode(r->o[f], r->snap, j, &b, &len, &raw));
        if (len > r->cap) {
            unsigned char *m = realloc(r->msg, len);
            if (!m)
                return LOCO_ERR(LOCO_ENOMEM, "lab: %zu bytes of island %d's message", len, k);
            r->msg = m, r->cap = len;
        }
        memcpy(r->msg, b, len);
        r->len = len;
        r->sent += (double)len * (L->K - 1); /* the all-gather: to every other island */
        r->raw += (double)raw * (L->K - 1);
    }
    return 0;
}

/* The exchange of fragment f completes: averaged in island order, the outer
 * optimizer applied; island 0's hash is the step's record. */
static int finish(lab_run *L, int64_t j, int64_t inner, int f) {
    for (int k = 0; k < L->K; k++) {
        lab_island *r = &L->is[k];
        if (r->fr.n_f[f] == 0)
            continue;
        loco_outer_begin_average(r->o[f], L->K);
        for (int i = 0; i < L->K; i++) {
            const int rc = loco_outer_add(r->o[f], L->is[i].msg, L->is[i].len);
            if (rc < 0)
                return LOCO_ERR(rc, "lab: outer step %lld: island %d refused island %d's "
                                    "contribution: %s",
                                (long long)j, k, i, loco_errmsg());
        }
        LOCO_CHECK(loco_outer_apply(r->o[f], r->snap));
    }
    L->outer_steps = j;
    if (L->trace) {
        const loco_outer_set set = {.o = L->is[0].o, .n = L->F};
        const uint64_t mine = loco_outer_set_hash(&set);
        L->trace(L->trace_ctx, j, inner, f, loco_hash64(&mine, sizeof mine));
    }
    return 0;
}

static int merge(lab_run *L, int f, float alpha) {
    for (int k = 0; k < L->K; k++) {
        lab_island *r = &L->is[k];
        loco_fragments_merge(&r->fr, f, loco_outer_theta(r->o[f]), own_of(r), alpha);
        LOCO_CHECK(loco_trainer_sync_params(r->t));
    }
    return 0;
}

static int setup(lab_run *L) {
    const loco_config *c = L->cfg;
    loco_outer_params p;
    loco_codec_params cp;
    LOCO_CHECK(loco_outer_params_from_config(&p, c));
    LOCO_CHECK(loco_codec_params_from_config(&cp, c));
    if (cp.link_gbps <= 0)
        cp.link_gbps = c->net.link_gbps;
    for (int k = 0; k < L->K; k++) {
        lab_island *r = &L->is[k];
        size_t lo, hi;
        LOCO_CHECK(loco_trainer_create_island(&r->t, c, NULL, k, L->K));
        float *own = loco_trainer_owned_params(r->t, &lo, &hi);
        if (!own)
            return LOCO_ERR(LOCO_EIO, "lab: island %d's parameters: %s", k, loco_errmsg());
        LOCO_CHECK(loco_fragments_plan(&r->fr, L->F, (int)c->model.n_layer,
                                       loco_trainer_param_table(r->t), lo, hi));
        if (!(r->snap = loco_alloc((hi - lo ? hi - lo : 1) * sizeof(float))))
            return LOCO_ERR(LOCO_ENOMEM, "lab: θ_local copy of %zu elements", hi - lo);
        for (int f = 0; f < L->F; f++) {
            loco_fragments_gather(&r->fr, f, own, r->snap);
            LOCO_CHECK(loco_outer_create(&r->o[f], &p, &cp, r->fr.n_f[f], r->snap));
        }
    }
    return 0;
}

static void teardown(lab_run *L) {
    for (int k = 0; k < L->K; k++) {
        lab_island *r = &L->is[k];
        for (int f = 0; f < LOCO_MAX_FRAGMENTS; f++)
            loco_outer_destroy(r->o[f]);
        loco_fragments_fini(&r->fr);
        loco_free(r->snap);
        free(r->msg);
        loco_trainer_destroy(r->t);
    }
}

/* The inner steps with the outer steps due after each. */
static int train(lab_run *L) {
    const loco_config *c = L->cfg;
    const int64_t steps = c->train.steps, P = c->outer.H / L->F, tau = c->outer.overlap;
    const float alpha = (float)c->outer.merge_alpha;
    int fly = -1, merging = -1;
    int64_t fly_j = 0, fly_start = 0, merge_step = 0;
    for (int64_t s = 1; s <= steps; s++) {
        for (int k = 0; k < L->K; k++)
            LOCO_CHECK(loco_trainer_step(L->is[k].t, NULL));
        const bool last = s == steps;
        if (fly >= 0 && (s >= fly_start + tau || last)) {
            LOCO_CHECK(finish(L, fly_j, fly_start, fly));
            merging = fly, merge_step = fly_start + tau;
            fly = -1;
        }
        if (merging >= 0 && (s >= merge_step || last)) {
            LOCO_CHECK(merge(L, merging, last ? 0.0f : alpha));
            merging = -1;
        }
        if (last) {
            const int64_t first = s % P == 0 ? s / P : s / P + 1;
            for (int64_t j = first; j < first + L->F; j++) {
                const int f = (int)((j - 1) % L->F);
                LOCO_CHECK(start(L, j, f));
                LOCO_CHECK(finish(L, j, s, f));
                LOCO_CHECK(merge(L, f, 0.0f));
            }
        } else if (s % P == 0) {
            fly_j = s / P;
            fly = (int)((fly_j - 1) % L->F);
            fly_start = s;
            LOCO_CHECK(start(L, fly_j, fly));
            if (tau == 0) {
                LOCO_CHECK(finish(L, fly_j, s, fly));
                LOCO_CHECK(merge(L, fly, alpha));
                fly = -1;
            }
        }
    }
    return 0;
}

int loco_lab_diloco(const loco_config *cfg, loco_lab_trace_fn trace, void *trace_ctx,
                    loco_lab_diloco_result *out) {
    memset(out, 0, sizeof *out);
    LOCO_CHECK(loco_lab_check(cfg, NULL, 0));
    const double t0 = loco_now();
    lab_run L = {.cfg = cfg, .F = (int)cfg->outer.fragments, .trace = trace,
                 .trace_ctx = trace_ctx};
    LOCO_CHECK(n_sites(cfg, &L.K));
    if (L.F < 1 || cfg->outer.H % L.F != 0)
        return LOCO_ERR(LOCO_EINVAL, "lab: outer.H = %lld is not a multiple of outer.fragments "
                                     "= %d",
                        (long long)cfg->outer.H, L.F);
    if (cfg->outer.overlap >= cfg->outer.H / L.F)
        return LOCO_ERR(LOCO_EINVAL, "lab: outer.overlap = %lld must be below outer.H / "
                                     "outer.fragments = %lld",
                        (long long)cfg->outer.overlap, (long long)(cfg->outer.H / L.F));
    if (!(L.is = calloc((size_t)L.K, sizeof *L.is)))
        return LOCO_ERR(LOCO_ENOMEM, "lab: %d islands", L.K);
    int rc = setup(&L);
    if (rc == 0)
        rc = train(&L);
    if (rc == 0) {
        int64_t tokens;
        rc = loco_trainer_eval(L.is[0].t, (int)cfg->run.eval_batches, &out->val_loss, &tokens);
    }
    if (rc == 0) {
        const loco_outer_set set = {.o = L.is[0].o, .n = L.F};
        const uint64_t mine = loco_outer_set_hash(&set);
        out->theta_hash = loco_hash64(&mine, sizeof mine);
        for (int k = 0; k < L.K; k++) {
            out->bytes_sent += L.is[k].sent / L.K;
            out->raw_bytes += L.is[k].raw / L.K;
        }
        out->outer_steps = L.outer_steps;
        out->seconds = loco_now() - t0;
    }
    teardown(&L);
    free(L.is);
    return rc;
}

int loco_lab_dp(const loco_config *cfg, loco_lab_dp_result *out) {
    memset(out, 0, sizeof *out);
    LOCO_CHECK(loco_lab_check(cfg, NULL, 0));
    int K;
    LOCO_CHECK(n_sites(cfg, &K));
    const double t0 = loco_now();
    /* The islands' batches as micro-batches of one step: the same global
     * batch as dp = K, and the same evaluation batches as an island's. */
    loco_config c = *cfg;
    c.train.grad_accum = cfg->train.grad_accum * K;
    loco_trainer *t = NULL;
    LOCO_CHECK(loco_trainer_create(&t, &c, NULL));
    int rc = 0;
    for (int64_t s = 1; s <= c.train.steps && rc == 0; s++)
        rc = loco_trainer_step(t, NULL);
    int64_t tokens;
    if (rc == 0)
        rc = loco_trainer_eval(t, (int)c.run.eval_batches, &out->val_loss, &tokens);
    if (rc == 0) {
        size_t lo, hi;
        loco_trainer_owned_params(t, &lo, &hi);
        out->bytes_sent = (double)c.train.steps * 2.0 * (K - 1) / K * (double)(hi - lo) *
                          sizeof(float);
        out->seconds = loco_now() - t0;
    }
    loco_trainer_destroy(t);
    return rc;
}

/* t_{0.975, df} for df = 1..30 (any table of Student's t); beyond, the
 * quantile falls towards the normal's 1.96 as 1.96 + 2.4 / df does. */
double loco_lab_t975(int df) {
    static const double t[30] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                 2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                 2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                 2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
    if (df < 1)
        return NAN;
    return df <= 30 ? t[df - 1] : 1.96 + 2.4 / df;
}

int loco_lab_interval_of(const double *x, int n, loco_lab_interval *out) {
    memset(out, 0, sizeof *out);
    if (n < 1)
        return LOCO_ERR(LOCO_EINVAL, "lab: an interval of %d values", n);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return LOCO_ERR(LOCO_EINVAL, "lab: value %d of %d is not finite", i, n);
        sum += x[i];
    }
    out->n = n;
    out->mean = sum / n;
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (x[i] - out->mean) * (x[i] - out->mean);
    out->sd = n > 1 ? sqrt(ss / (n - 1)) : 0;
    const double half = n > 1 ? loco_lab_t975(n - 1) * out->sd / sqrt((double)n) : 0;
    out->lo = out->mean - half;
    out->hi = out->mean + half;
    return 0;
}
