/* An island's outer loop on one rank: set-up, the schedule of outer steps
 * (DiLoCo: every outer.H inner steps; Streaming DiLoCo: fragment
 * (s - 1) mod F after inner step s · H / F, its exchange overlapping
 * outer.overlap inner steps), the merge of a fragment's new θ_global into
 * θ_local and outer-state checkpoints (outer.jsonl's records:
 * island_record.c). docs/STREAMING.md states the rules. */
#include "outer/island_internal.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------ θ_local updates */

int loco__island_merge(island *is, int f, float alpha) {
    size_t lo, hi;
    float *own = is->in.owned(is->in.ctx, &lo, &hi);
    if (!own)
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    loco_fragments_merge(&is->fr, f, loco_outer_theta(is->outer[f]), own, alpha);
    if (f == is->merge_frag)
        is->merge_frag = -1;
    return is->in.sync(is->in.ctx);
}

int loco__island_keep_late(island *is) {
    size_t lo, hi;
    const float *own = is->in.owned(is->in.ctx, &lo, &hi);
    if (!own)
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    if (!is->late && !(is->late = loco_alloc((hi - lo + 1) * sizeof(float))))
        return LOCO_ERR(LOCO_ENOMEM, "late pseudo-gradient of %zu elements", hi - lo);
    const float *theta = loco_outer_theta(is->outer[0]);
    for (size_t i = 0; i < hi - lo; i++)
        is->late[i] = theta[i] - own[i];
    is->late_base = is->committed;
    is->late_held = true;
    return 0;
}

/* FedAsync's polynomial staleness (Xie et al. 2019, a = 1): a
 * pseudo-gradient made against θ_global of step b, applied on top of step
 * c, counts 1 / (1 + c − b): late work is used and damped, not lost (drop)
 * nor taken at full weight against a model that moved on. */
int loco__island_fold_late(island *is) {
    if (!is->late_held)
        return 0;
    is->late_held = false;
    size_t lo, hi;
    float *own = is->in.owned(is->in.ctx, &lo, &hi);
    if (!own)
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    const int64_t s = is->committed - is->late_base;
    const float w = 1.0f / (float)(1 + s);
    for (size_t i = 0; i < hi - lo; i++)
        own[i] -= w * is->late[i];
    if (is->rank == 0)
        loco_info("island %s: its work against outer step %lld folded into θ_local at outer "
                  "step %lld, weight 1/%lld", is->site, (long long)is->late_base,
                  (long long)is->committed, (long long)(1 + s));
    return is->in.sync(is->in.ctx);
}

int loco__island_adopt_global(island *is) {
    size_t lo, hi;
    float *own = is->in.owned(is->in.ctx, &lo, &hi);
    if (!own)
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    for (int f = 0; f < is->fr.F; f++)
        loco_fragments_merge(&is->fr, f, loco_outer_theta(is->outer[f]), own, 0.0f);
    is->merge_frag = -1;
    return is->in.sync(is->in.ctx);
}

/* ------------------------------------------------------- outer-state files */

/* The outer state next to the inner checkpoint of the same step
 * (run.dir/outer_STEP/rank_R.safetensors, published atomically): what an
 * island needs besides its weights and AdamW state to resume. An exchange
 * in flight is carried to its commit first; its merge stays due at its
 * step, and the file says so. */
int loco_island_save(loco_island *is, int64_t step) {
    if (is->whole)
        return loco__whole_save(is, step);
    if (is->sync.active)
        LOCO_CHECK(loco__island_sync_finish(is));
    char fin[PATH_MAX], tmp[PATH_MAX + 8], file[PATH_MAX + 64];
    snprintf(fin, sizeof fin, "%s/outer_%08lld", is->cfg.run.dir, (long long)step);
    snprintf(tmp, sizeof tmp, "%s.tmp", fin);
    int rc = 0;
    if (is->rank == 0) {
        loco_rmtree(tmp);
        rc = loco_mkdirs(tmp);
    }
    int bad = rc < 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (!bad) {
        snprintf(file, sizeof file, "%s/rank_%05d.safetensors", tmp, is->rank);
        loco_outer_meta m = {.committed = is->committed, .epoch = is->q.epoch,
                             .inner_step = step, .merge_fragment = is->merge_frag,
                             .merge_step = is->merge_step};
        rc = loco_outer_save_file(&is->set, file, &m);
        bad = rc < 0;
        LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    }
    if (!bad && is->rank == 0)
        rc = loco_dir_commit(tmp, fin);
    LOCO_CHECK(rc);
    return bad ? LOCO_ERR(LOCO_EIO, "outer state of step %lld not written", (long long)step) : 0;
}

/* After --resume: the outer state saved with that checkpoint, when it is
 * there and whole; else the island fetches it from the others. */
static int load_outer(island *is) {
    const int64_t step = is->in.steps_done(is->in.ctx);
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "%s/outer_%08lld/rank_%05d.safetensors", is->cfg.run.dir,
             (long long)step, is->rank);
    loco_outer_meta m = {0};
    int rc = loco_outer_load_file(&is->set, file, &m);
    int bad = rc < 0 || m.inner_step != step;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad) {
        if (is->rank == 0)
            loco_warn("resume: no usable outer state for step %lld (%s); this island fetches "
                      "θ_global from the others",
                      (long long)step, rc < 0 ? loco_errmsg() : "another step");
        is->committed = 0;
        return 0;
    }
    is->committed = m.committed;
    if (m.merge_fragment >= 0 && m.merge_fragment < is->fr.F && m.merge_step > step) {
        is->merge_frag = m.merge_fragment;
        is->merge_step = m.merge_step;
    }
    LOCO_CHECK(loco__island_hash(is, &is->committed_hash));
    if (is->rank == 0)
        loco_info("resume: outer state of outer step %lld (inner step %lld) loaded",
                  (long long)m.committed, (long long)step);
    return 0;
}

/* The coordinator moved the end on (a fault's cycle is open): never back,
 * never past what the config allows. */
static void adopt_end(island *is) {
    const int64_t limit = is->cfg.train.steps + is->cfg.faults.max_extra_steps;
    const int64_t e = is->q.end_step;
    if (e > is->end_step && e <= limit) {
        if (is->rank == 0)
            loco_info("island %s: the coordinator holds the end of the run: it now ends at inner "
                      "step %lld", is->site, (long long)e);
        is->end_step = e;
    }
}

/* ---------------------------------------------------------------- set-up */

/* outer.fragments, outer.overlap and outer.merge_alpha against outer.H. */
static int check_streaming(const loco_config *c) {
    const int64_t F = c->outer.fragments, H = c->outer.H;
    if (F > c->model.n_layer)
        return LOCO_ERR(LOCO_EINVAL, "outer.fragments = %lld: at most model.n_layer = %lld (a "
                                     "fragment is a group of blocks)",
                        (long long)F, (long long)c->model.n_layer);
    if (H % F)
        return LOCO_ERR(LOCO_EINVAL, "outer.fragments = %lld: outer.H = %lld must be a multiple "
                                     "of it (fragment f syncs every H steps, offset by H/fragments)",
                        (long long)F, (long long)H);
    if (c->outer.overlap >= H / F)
        return LOCO_ERR(LOCO_EINVAL, "outer.overlap = %lld: expected fewer than outer.H / "
                                     "outer.fragments = %lld inner steps (one exchange in flight)",
                        (long long)c->outer.overlap, (long long)(H / F));
    if (!strcmp(c->outer.sync, "time") && (F != 1 || c->outer.overlap || c->outer.merge_alpha))
        return LOCO_ERR(LOCO_EINVAL, "outer.sync = time: one fragment without overlap only "
                                     "(outer.fragments = %lld, outer.overlap = %lld, "
                                     "outer.merge_alpha = %g)",
                        (long long)F, (long long)c->outer.overlap, c->outer.merge_alpha);
    if (c->outer.quorum > 0 && (F != 1 || c->outer.overlap || c->outer.merge_alpha ||
                                !strcmp(c->faulttol.straggler_policy, "drop")))
        return LOCO_ERR(LOCO_EINVAL, "outer.quorum = %g: one fragment without overlap, and "
                                     "faulttol.straggler_policy = wait (the quorum decides who "
                                     "is left out)", c->outer.quorum);
    return 0;
}

bool loco_island_outer_on_device(const loco_config *c, int ranks, char *why, size_t cap) {
    const char *no = NULL;
    if (strcmp(c->train.device, "cuda"))
        no = "train.device = cpu";
    else if (ranks != 1)
        no = "more than one rank per island";
    else if (c->outer.fragments != 1 || c->outer.overlap != 0 || c->outer.merge_alpha != 0)
        no = "streaming (outer.fragments, outer.overlap or outer.merge_alpha set)";
    else if (strcmp(c->outer.algorithm, "allgather"))
        no = "outer.algorithm is not allgather";
    else if (c->outer.quorum > 0)
        no = "outer.quorum (a late island's work is kept and folded on the host)";
#ifndef LOCO_HAVE_CUDA
    else
        no = "a build without the CUDA toolkit";
#endif
    if (no)
        snprintf(why, cap, "on the host: %s", no);
    else
        snprintf(why, cap, "on the device: train.device = cuda, one rank, one fragment, "
                           "all-gather");
    return no == NULL;
}

static int setup(island *is, const loco_config *cfg, const char *site, struct loco_comm *world,
                 const loco_inner_view *inner, bool resumed) {
    is->cfg = *cfg;
    const loco_config *c = &is->cfg;
    snprintf(is->site, sizeof is->site, "%s", site);
    is->in = *inner;
    is->world = world;
    is->merge_frag = -1;
    is->end_step = cfg->train.steps;
    is->rank = loco_comm_rank(world);
    is->ranks = loco_comm_size(world);
    LOCO_CHECK(check_streaming(c));
    is->period = c->outer.H / c->outer.fragments;
    is->timed = !strcmp(c->outer.sync, "time");
    is->overlap = (int)c->outer.overlap;
    is->alpha = (float)c->outer.merge_alpha;
    LOCO_CHECK(loco_site_id(c, site, &is->id, &is->K));
    LOCO_CHECK(loco_faults_parse(&is->f, c, site, is->id, is->rank == 0));
    LOCO_CHECK(loco_net_params_from_config(&is->np, c));
    snprintf(is->np.name, sizeof is->np.name, "%s", site);
    if (is->ranks > LOCO_MAX_ISLAND_RANKS)
        return LOCO_ERR(LOCO_EINVAL, "%d ranks, at most %d", is->ranks, LOCO_MAX_ISLAND_RANKS);
    loco_outer_params op;
    loco_codec_params cp;
    LOCO_CHECK(loco_outer_params_from_config(&op, c));
    LOCO_CHECK(loco_codec_params_from_config(&cp, c));
    if (cp.link_gbps <= 0)
        cp.link_gbps = c->net.link_gbps; /* the link as the config describes it, if at all */
    size_t lo, hi;
    float *own = is->in.owned(is->in.ctx, &lo, &hi);
    if (!own)
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    LOCO_CHECK(loco_fragments_plan(&is->fr, (int)c->outer.fragments, (int)c->model.n_layer,
                                   is->in.table(is->in.ctx), lo, hi));
    size_t biggest = 0;
    for (int f = 0; f < is->fr.F; f++)
        biggest = is->fr.n_f[f] > biggest ? is->fr.n_f[f] : biggest;
    /* Plain DiLoCo updates θ_local in place: no copy of the range. */
    if (is->fr.F > 1 || is->overlap > 0 || is->alpha > 0) {
        is->packed = loco_alloc((biggest ? biggest : 1) * sizeof(float));
        if (!is->packed)
            return LOCO_ERR(LOCO_ENOMEM, "fragment buffer of %zu elements", biggest);
    }
    /* The outer state on the device (docs/DECISIONS.md "Outer loop on
     * the device"): only when the trainer trains there. */
    char why[160];
    float *dev = NULL;
    size_t dlo = 0, dhi = 0;
    if (loco_island_outer_on_device(c, is->ranks, why, sizeof why)) {
        if (is->in.device_owned && is->in.device_written) {
            dev = is->in.device_owned(is->in.ctx, &dlo, &dhi);
            if (!dev || dlo != lo || dhi != hi)
                return LOCO_ERR(LOCO_EIO, "island: the device parameters [%zu, %zu) are not the "
                                          "owned range [%zu, %zu)", dlo, dhi, lo, hi);
        } else {
            snprintf(why, sizeof why, "on the host: the trainer gives no device range");
        }
    }
    if (!strcmp(c->train.device, "cuda") && is->rank == 0)
        loco_info("island %s: outer state %s", site, why);
    is->on_dev = dev != NULL;
    for (int f = 0; f < is->fr.F; f++) {
        const float *theta0 = own; /* F = 1: the range itself */
        if (is->fr.F > 1) {
            loco_fragments_gather(&is->fr, f, own, is->packed);
            theta0 = is->packed;
        }
        if (is->on_dev)
            LOCO_CHECK(loco_outer_create_device(&is->outer[f], &op, &cp, is->fr.n_f[f], dev));
        else
            LOCO_CHECK(loco_outer_create(&is->outer[f], &op, &cp, is->fr.n_f[f], theta0));
    }
    is->set = (loco_outer_set){.o = is->outer, .n = is->fr.F};
    LOCO_CHECK(loco__island_hash(is, &is->committed_hash));
    if (resumed)
        LOCO_CHECK(load_outer(is));
    LOCO_CHECK(loco_peers_create(&is->svc, &is->np, c->faulttol.listen_host, &is->set,
                                 (int)c->faulttol.timeout_ms));
    loco_peers_publish(is->svc, is->committed, is->in.steps_done(is->in.ctx));
    /* A rejoining island records its first outer step before training
     * (loco__island_record): its wait and wall time count from here. */
    is->call_t0 = is->last_record_t = loco_now();
    LOCO_CHECK(loco__island_join(is));
    const bool member = loco_quorum_has(is->q.members, is->id) && !is->q.join;
    /* A joiner chooses like the members from its first step on, without
     * probing: they are training, not probing. */
    LOCO_CHECK(loco__island_choose_algorithm(is, member));
    if (!member) {
        loco_info("island %d (%s): the run is under way; rejoining", is->id, site);
        LOCO_CHECK(loco__island_rejoin(is));
    }
    adopt_end(is); /* a run held past train.steps goes on for a joiner too */
    if (is->fr.F > 1 || is->overlap > 0)
        loco_info("island %d (%s) of %d: streaming, %d fragments, one synced every %lld steps, "
                  "exchange overlapping %d steps, merge alpha %g (%s)",
                  is->id, site, is->K, is->fr.F, (long long)is->period, is->overlap,
                  (double)is->alpha, c->outer.optimizer);
    else if (is->timed)
        loco_info("island %d (%s) of %d: outer step every %g s of training, %lld in all (%s)",
                  is->id, site, is->K, c->outer.period_s, (long long)(is->end_step / is->period),
                  c->outer.optimizer);
    else
        loco_info("island %d (%s) of %d: outer step every %lld steps (%s)", is->id, site, is->K,
                  (long long)c->outer.H, c->outer.optimizer);
    if (!getenv("LOCO_RESTARTED")) {
        char d[160];
        const loco_faults *f = &is->f;
        const char *kinds[4] = {"corrupt", "drop", "duplicate", "reorder"};
        const double probs[4] = {f->frames.corrupt, f->frames.drop, f->frames.duplicate,
                                 f->frames.delay};
        for (int k = 0; k < 4; k++)
            if (probs[k] > 0 && is->id == 0) {
                snprintf(d, sizeof d, "probability %g per island-to-island frame", probs[k]);
                loco_faults_event(&is->f, kinds[k], NULL, d);
            }
        if (f->slow > 1) {
            snprintf(d, sizeof d, "every inner step takes %.2fx as long", f->slow);
            loco_faults_event(&is->f, "slow", NULL, d);
        }
    }
    if (is->rank == 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/outer.jsonl", c->run.dir);
        LOCO_CHECK(loco_mkdirs(c->run.dir));
        LOCO_CHECK(loco_metrics_open(&is->metrics, path, true));
    }
    /* pcie_bytes counts the outer loop's copies from here on (not the
     * trainer's first upload, nor the set-up's). */
    if (is->in.take_pcie_bytes)
        is->in.take_pcie_bytes(is->in.ctx);
    for (int f = 0; f < is->fr.F; f++)
        loco_outer_take_pcie_bytes(is->outer[f]);
    is->last_record_t = is->sync_t0 = loco_now();
    is->last_sync_inner = is->in.steps_done(is->in.ctx);
    return 0;
}

int loco_island_create(loco_island **out, const loco_config *cfg, const char *site,
                       struct loco_comm *world, const loco_inner_view *inner, bool resumed) {
    if (!strcmp(cfg->outer.layout, "whole"))
        return loco__whole_create(out, cfg, site, world, inner, resumed);
    return loco__island_create_on(out, cfg, site, world, inner, resumed);
}

int loco__island_create_on(loco_island **out, const loco_config *cfg, const char *site,
                           struct loco_comm *world, const loco_inner_view *inner, bool resumed) {
    *out = NULL;
    island *is = loco_alloc(sizeof *is);
    if (!is)
        return LOCO_ERR(LOCO_ENOMEM, "island");
    memset(is, 0, sizeof *is);
    int rc = setup(is, cfg, site, world, inner, resumed);
    if (rc < 0) {
        loco_island_destroy(is);
        return rc;
    }
    *out = is;
    return 0;
}

void loco_island_destroy(loco_island *is) {
    if (!is)
        return;
    if (is->whole) {
        loco__whole_destroy(is);
        return;
    }
    if (is->sync.threaded)
        pthread_join(is->sync.thread, NULL); /* nothing may run on freed state */
    loco__island_drop_links(is);
    loco_peers_destroy(is->svc);
    for (int f = 0; f < LOCO_MAX_FRAGMENTS; f++)
        loco_outer_destroy(is->outer[f]);
    loco_fragments_fini(&is->fr);
    loco_free(is->packed);
    loco_free(is->late);
    loco_session_destroy(is->session);
    loco_quorum_fini(&is->q);
    loco_metrics_close(is->metrics);
    loco_free(is);
}

bool loco_island_finished(const loco_island *is) {
    return is->whole ? loco__whole_finished(is) : is->finished;
}

int64_t loco_island_end_step(const loco_island *is) {
    if (is->whole)
        return loco__whole_end_step(is);
    if (!is->timed)
        return is->end_step;
    if (is->final_committed)
        return is->stop_step;
    /* time: the end is the step the last outer step commits at; until then
     * the next one, and at least the configured end */
    const int64_t next = is->in.steps_done(is->in.ctx) + 1;
    return next > is->end_step ? next : is->end_step;
}

/* -------------------------------------------------------------- the schedule */

/* The last inner step: the exchange in flight completes, and every
 * fragment not synchronised at this step is, one after the other; θ_local
 * becomes θ_global everywhere, so every island ends with one model. */
static int finish_run(island *is, int64_t s) {
    const int F = is->fr.F;
    int64_t j = s / is->period;
    int left = F;
    if (s % is->period == 0) {
        LOCO_CHECK(loco__island_sync(is, j, s, (int)((j - 1) % F), false));
        left = F - 1;
    }
    for (int k = 0; k < left && !is->finished; k++) {
        if (is->merge_frag >= 0)
            LOCO_CHECK(loco__island_merge(is, is->merge_frag, 0.0f));
        j++;
        LOCO_CHECK(loco__island_sync(is, j, s, (int)((j - 1) % F), false));
    }
    if (is->merge_frag >= 0 && !is->finished)
        LOCO_CHECK(loco__island_merge(is, is->merge_frag, 0.0f));
    return 0;
}

/* outer.sync = time: an outer step once outer.period_s of training
 * passed since the last (rank 0's clock decides for the island); after
 * the run's last one the island stops. */
static int after_step_timed(island *is, int64_t s) {
    if (is->finished || is->final_committed || is->in.steps_done(is->in.ctx) != s)
        return 0;
    /* rank 0's clock for the island: the period's share gone by */
    double gone = is->rank == 0 ? (loco_now() - is->sync_t0) / is->cfg.outer.period_s : 0;
    if (is->ranks > 1)
        LOCO_CHECK(loco_comm_allreduce(is->world, &gone, 1, LOCO_DT_F64, LOCO_OP_MAX));
    const bool due = gone >= 1;
    /* The learning-rate schedule follows the run, not this island's step
     * count (a fast island would reach train.steps early and then train
     * at the floor): outer steps done and the period's share, in
     * train.steps' units. */
    if (is->in.set_schedule)
        is->in.set_schedule(is->in.ctx,
                            (int64_t)(((double)is->committed + (due ? 1.0 : gone)) *
                                      (double)is->period));
    if (!due) {
        if (is->rank == 0)
            loco_session_heartbeat(is->session, s);
        return 0;
    }
    LOCO_CHECK(loco__island_sync(is, is->committed + 1, s, 0, false));
    adopt_end(is);
    /* a rejoin may have moved the inner step (and set last_sync_inner) */
    const int64_t now_at = is->in.steps_done(is->in.ctx);
    if (is->final_committed)
        is->stop_step = now_at;
    if (now_at == s)
        is->last_sync_inner = s;
    is->sync_t0 = loco_now();
    return 0;
}

static int after_step(island *is, int64_t s) {
    const int64_t P = is->period;
    adopt_end(is);
    if (is->timed) {
        LOCO_CHECK(loco__island_check_coordinator(is));
        adopt_end(is);
        return after_step_timed(is, s);
    }
    LOCO_CHECK(loco__island_check_coordinator(is));
    adopt_end(is);
    const bool last = s == is->end_step;
    bool busy = false;
    /* The exchange in flight, τ steps after it began. */
    if (is->sync.active && (s >= is->sync.inner + is->overlap || last)) {
        LOCO_CHECK(loco__island_sync_finish(is));
        busy = true;
    }
    if (is->finished || is->in.steps_done(is->in.ctx) != s)
        return 0; /* the run ended, or this island rejoined at another step */
    /* Its merge; the last step takes θ_global whole. */
    if (is->merge_frag >= 0 && (s >= is->merge_step || last))
        LOCO_CHECK(loco__island_merge(is, is->merge_frag, last ? 0.0f : is->alpha));
    if (last)
        return finish_run(is, s);
    if (s % P == 0) {
        const int64_t j = s / P;
        LOCO_CHECK(loco__island_sync(is, j, s, (int)((j - 1) % is->fr.F), is->overlap > 0));
        adopt_end(is);
        busy = true;
        /* Blocking: the merge is due now. */
        if (!is->finished && !is->sync.active && is->merge_frag >= 0 && is->merge_step <= s &&
            is->in.steps_done(is->in.ctx) == s)
            LOCO_CHECK(loco__island_merge(is, is->merge_frag, is->alpha));
    }
    /* The coordinator's round trips overlap training too: the outcome of
     * an exchange that is through goes out at once, and READY for the
     * step due next one step ahead. */
    if (is->sync.active)
        LOCO_CHECK(loco__island_sync_poll(is));
    else if (is->overlap > 0 && (s + 1) % P == 0 && !is->finished)
        loco__island_ready_ahead(is, (s + 1) / P);
    if (!busy && is->rank == 0)
        loco_session_heartbeat(is->session, s);
    return 0;
}

int loco_island_after_step(loco_island *is, int64_t step, double step_s) {
    if (is->whole)
        return loco__whole_after_step(is, step, step_s);
    loco_faults_inject(&is->f, step, step_s, is->links, &is->q);
    is->call_t0 = loco_now();
    int rc = after_step(is, step);
    adopt_end(is); /* what a rejoin or a go said of the end */
    is->wait_acc += loco_now() - is->call_t0;
    return rc;
}

int loco_island_leave(loco_island *is) {
    if (is->whole)
        return loco__whole_leave(is);
    const loco_config *c = &is->cfg;
    /* The coordinator's final word: every member's last θ_global agreed. */
    int rc = is->rank == 0 ? loco_session_leave(is->session, (int)c->faulttol.timeout_ms) : 0;
    /* A coordinator gone before its final word (the run ended while this
     * island was late, or suspected at its last eval) loses nothing when
     * this island holds the commit of the run's last outer step: every
     * member agreed on that θ_global. */
    if (rc == LOCO_ETIMEDOUT && is->final_committed) {
        loco_warn("island %s: %s; it holds the commit of the run's last outer step (%lld), so "
                  "it ends cleanly", is->site, loco_errmsg(), (long long)is->committed);
        rc = 0;
    }
    int bad = rc < 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad)
        return rc < 0 ? rc : LOCO_ERR(LOCO_EPEER, "the coordinator did not confirm the run");
    if (is->rank == 0)
        loco_info("island %s: done; the coordinator confirmed that every island agrees", is->site);
    return 0;
}
