/* The coordinator's protocol around an island's outer steps: joining,
 * one outer step from ready to commit (its exchange in the background
 * under outer.overlap), redos in new quorum epochs, rejoin by state
 * transfer, and the exchange algorithm's choice.
 *
 * Why one file: these steps are one protocol with the coordinator; each
 * reads and moves the same attempt state, and splitting it hides the order. */
#include "outer/island_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tries of the start-up link probe, all within faulttol.timeout_ms. */
#define LOCO_PROBE_TRIES 2

void loco__island_drop_links(island *is) {
    for (int k = 0; k < LOCO_MAX_ISLANDS; k++) {
        loco_link_destroy(is->links[k]);
        is->links[k] = NULL;
    }
}

/* -------------------------------------------------------- joining the run */

/* Every rank learns the peer-listener address of every rank. */
static int gather_addrs(island *is, char (*addrs)[LOCO_ADDR_MAX]) {
    char mine[LOCO_ADDR_MAX] = {0};
    snprintf(mine, sizeof mine, "%.80s:%d", is->cfg.faulttol.listen_host,
             loco_peers_port(is->svc));
    size_t counts[LOCO_MAX_ISLAND_RANKS];
    for (int r = 0; r < is->ranks; r++)
        counts[r] = LOCO_ADDR_MAX;
    return loco_comm_allgather(is->world, mine, addrs, counts, LOCO_DT_U8);
}

/* Rank 0's session call outcome reaches every rank: rc, verdict and the
 * quorum as JSON. */
static int share(island *is, int rc, loco_verdict *v) {
    char *json = NULL;
    int64_t head[3] = {rc, v ? *v : 0, 0};
    if (is->rank == 0 && rc == 0) {
        json = loco_quorum_to_json(&is->q);
        head[2] = json ? (int64_t)strlen(json) + 1 : 0;
    }
    int rc2 = loco_comm_broadcast(is->world, head, 3, LOCO_DT_I64, 0);
    if (rc2 < 0 || head[0] < 0) {
        free(json);
        if (rc2 < 0)
            return rc2;
        return is->rank == 0 ? (int)head[0]
                             : LOCO_ERR(LOCO_EPEER, "island rank 0 lost the coordinator");
    }
    if (v)
        *v = (loco_verdict)head[1];
    if (head[2] > 0) {
        if (is->rank != 0 && !(json = malloc((size_t)head[2])))
            return LOCO_ERR(LOCO_ENOMEM, "quorum");
        rc = loco_comm_broadcast(is->world, json, (size_t)head[2], LOCO_DT_U8, 0);
        if (rc == 0 && is->rank != 0) {
            loco_quorum_fini(&is->q);
            rc = loco_quorum_from_json(&is->q, json, (size_t)head[2] - 1);
        }
        free(json);
        LOCO_CHECK(rc);
    }
    return 0;
}

static loco_island_progress progress(const island *is, int64_t pending, uint64_t pending_hash) {
    return (loco_island_progress){.committed = is->committed, .hash = is->committed_hash,
                                  .pending = pending, .pending_hash = pending_hash,
                                  .end_step = is->end_step};
}

/* Rank 0 registers; the first quorum reaches every rank. */
int loco__island_join(island *is) {
    char (*addrs)[LOCO_ADDR_MAX] = loco_alloc((size_t)is->ranks * LOCO_ADDR_MAX);
    if (!addrs)
        return LOCO_ERR(LOCO_ENOMEM, "addresses");
    int rc = gather_addrs(is, addrs);
    if (rc == 0 && is->rank == 0) {
        /* What lays out each rank's owned range, which the exchange pairs
         * rank by rank: islands may differ in the rest (ZeRO stage,
         * sequence parallelism, schedules). */
        char mesh[160];
        snprintf(mesh, sizeof mesh, "dp=%lld tp=%lld pp=%lld %s/%lld cp=%lld ep=%lld",
                 (long long)is->cfg.parallel.dp, (long long)is->cfg.parallel.tp,
                 (long long)is->cfg.parallel.pp, is->cfg.parallel.pp_schedule,
                 (long long)is->cfg.parallel.virtual_stages, (long long)is->cfg.parallel.cp,
                 (long long)is->cfg.parallel.ep);
        /* outer.layout = whole: no island's mesh lays out the exchange */
        if (!strcmp(is->cfg.outer.layout, "whole"))
            snprintf(mesh, sizeof mesh, "whole model on rank 0");
        static const char *const agree[] = {"model", "outer", "compress", NULL};
        loco_island_info me = {.site = is->site, .n_ranks = is->ranks,
                               .addrs = (const char (*)[LOCO_ADDR_MAX])addrs, .mesh = mesh,
                               .model_hash = loco_config_hash(&is->cfg, agree)};
        loco_island_progress pr = progress(is, 0, 0);
        int id;
        rc = loco_session_join(&is->session, &is->cfg, &is->np, &me, &pr, &id, &is->q,
                               (int)is->cfg.faulttol.timeout_ms);
        if (rc == 0 && id != is->id)
            rc = LOCO_ERR(LOCO_EPROTO, "coordinator calls %s island %d, outer.sites says %d",
                          is->site, id, is->id);
    }
    loco_free(addrs);
    LOCO_CHECK(share(is, rc, NULL));
    if (is->q.n != is->K)
        return LOCO_ERR(LOCO_EPROTO, "quorum of %d islands, outer.sites lists %d", is->q.n, is->K);
    return 0;
}

/* The links to every island of `mask` for the quorum's epoch: all links are
 * dropped and built anew when the epoch changed. */
static int ensure_links(island *is, uint64_t mask) {
    if (is->links_epoch != is->q.epoch) {
        loco__island_drop_links(is);
        is->links_epoch = is->q.epoch;
    }
    for (int k = 0; k < is->K; k++) {
        if (k == is->id || !loco_quorum_has(mask, k) || is->links[k])
            continue;
        const loco_member *m = &is->q.m[k];
        if (m->n_ranks != is->ranks)
            return LOCO_ERR(LOCO_EPROTO, "island %s has %d ranks, this one %d", m->site,
                            m->n_ranks, is->ranks);
        int rc = loco_peers_link(is->svc, is->id, k, m->site, m->addrs[is->rank], is->q.epoch,
                                 &is->links[k], (int)is->cfg.faulttol.timeout_ms);
        if (rc < 0)
            return rc;
        loco_faults_arm_link(&is->f, k, is->links[k]);
    }
    return 0;
}

/* θ_global of the whole island: the hash of every rank's state hash. */
int loco__island_hash(island *is, uint64_t *h) {
    uint64_t mine = loco_outer_set_hash(&is->set), all[LOCO_MAX_ISLAND_RANKS];
    size_t counts[LOCO_MAX_ISLAND_RANKS];
    for (int r = 0; r < is->ranks; r++)
        counts[r] = 1;
    LOCO_CHECK(loco_comm_allgather(is->world, &mine, all, counts, LOCO_DT_I64));
    *h = loco_hash64(all, (size_t)is->ranks * sizeof(uint64_t));
    return 0;
}

/* ------------------------------------------------- the algorithm choice */

/* The auto choice from link figures every rank of every island shares. */
static int decide(island *is, double rtt, double bw, bool announce) {
    double v[2] = {rtt, -bw};
    /* Peers agreed per rank index; the island agrees across its ranks. */
    LOCO_CHECK(loco_comm_allreduce(is->world, v, 2, LOCO_DT_F64, LOCO_OP_MAX));
    rtt = v[0];
    bw = isfinite(v[1]) && v[1] < 0 ? -v[1] : 1e12;
    const loco_codec_params *cp = loco_codec_get_params(loco_outer_codec(is->outer[0]));
    double bytes = (double)loco_codec_payload_bytes(cp, (size_t)is->elems_max);
    size_t chunks = loco_compress_chunk_count((size_t)is->elems_max, cp);
    char why[320];
    loco_exchange_algo a = loco_exchange_choose(is->K, chunks, bytes, rtt, bw, why, sizeof why);
    if (is->rank == 0 && (announce || a != is->algo))
        loco_info("outer: %s (auto: %s)",
                  a == LOCO_EXCHANGE_RSAG ? "reduce-scatter + all-gather" : "all-gather", why);
    is->algo = a;
    return 0;
}

/* The start-up probe of the links to the members (loco_exchange_probe),
 * tried twice within faulttol.timeout_ms in all. Only a fresh run probes:
 * when the run is under way (a restart, a coordinator's resume) the peers
 * are training, not probing, and would never answer. A silent peer or a
 * link that is gone is not this island's end: false (every rank of the
 * island alike) with a warning, and the caller falls back to all-gather. */
static bool probe_links(island *is, bool may_probe, double *rtt, double *bw) {
    const loco_config *c = &is->cfg;
    if (!may_probe || is->q.committed > 0) {
        if (is->rank == 0)
            loco_info("outer: all-gather until an outer step measures the links (the run is at "
                      "outer step %lld: its islands are not probing)",
                      (long long)is->q.committed);
        return false;
    }
    const double deadline = loco_now() + (double)c->faulttol.timeout_ms / 1e3;
    char why[256] = "";
    for (int attempt = 0; attempt < LOCO_PROBE_TRIES; attempt++) {
        /* Every rank gives the attempt what the slowest rank has left. */
        double used = loco_now() - deadline; /* max of -left = -(min left) */
        if (loco_comm_allreduce(is->world, &used, 1, LOCO_DT_F64, LOCO_OP_MAX) < 0 || used >= 0)
            break;
        const int ms = (int)(-used * 1e3);
        loco_link *peers[LOCO_MAX_ISLANDS] = {0};
        int rc = ensure_links(is, is->q.members);
        for (int k = 0; k < is->K && rc == 0; k++)
            if (k != is->id && loco_quorum_has(is->q.members, k))
                peers[k] = is->links[k];
        loco_exchange x = {.n_islands = is->K,
                           .me = is->id,
                           .peers = peers,
                           .epoch = is->q.epoch,
                           .shard = (uint32_t)is->rank,
                           .timeout_ms = ms};
        if (rc == 0)
            rc = loco_exchange_probe(&x, 1u << 20, rtt, bw);
        if (rc < 0)
            snprintf(why, sizeof why, "%s", loco_errmsg());
        int bad = rc < 0;
        if (loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX) < 0)
            bad = 1;
        if (!bad)
            return true; /* the island's ranks agree in decide() */
        /* What the probe left on the links is not an exchange's. */
        loco__island_drop_links(is);
        if (is->rank == 0)
            loco_warn("outer: link probe, attempt %d of %d: %s", attempt + 1, LOCO_PROBE_TRIES,
                      why[0] ? why : "another rank of this island failed");
    }
    if (is->rank == 0)
        loco_warn("outer: link probe failed within %lld ms; all-gather until an outer step "
                  "measures the links",
                  (long long)c->faulttol.timeout_ms);
    return false;
}

/* outer.algorithm, or for auto the faster one for this run's islands,
 * fragment size and links (net.rtt_ms / net.link_gbps where given, else
 * measured now and after every outer step); every rank of every island
 * reaches the same choice. */
int loco__island_choose_algorithm(island *is, bool may_probe) {
    const loco_config *c = &is->cfg;
    is->algo = LOCO_EXCHANGE_ALLGATHER;
    if (!strcmp(c->outer.algorithm, "allgather") || is->K <= 2) {
        if (is->rank == 0 && is->K <= 2 && !strcmp(c->outer.algorithm, "rsag"))
            loco_info("outer: all-gather (reduce-scatter + all-gather saves nothing with 2 islands)");
        return 0;
    }
    if (!strcmp(c->outer.algorithm, "rsag")) {
        is->algo = LOCO_EXCHANGE_RSAG;
        return 0;
    }
    is->auto_algo = true;
    is->elems_max = 0;
    for (int f = 0; f < is->fr.F; f++)
        is->elems_max = fmax(is->elems_max, (double)is->fr.n_f[f]);
    LOCO_CHECK(loco_comm_allreduce(is->world, &is->elems_max, 1, LOCO_DT_F64, LOCO_OP_MAX));
    is->rtt_s = c->net.rtt_ms / 1e3;
    is->bytes_per_s = c->net.link_gbps * 1e9 / 8;
    is->measure = is->rtt_s <= 0 || is->bytes_per_s <= 0;
    if (is->measure) {
        double mrtt, mbw;
        if (!probe_links(is, may_probe, &mrtt, &mbw)) {
            /* Nothing measured: all-gather, and the first outer step's
             * figures (agreed by its members) decide from then on. */
            is->rtt_s = fmax(is->rtt_s, 0);
            is->bytes_per_s = is->bytes_per_s > 0 ? is->bytes_per_s : 1e12;
            return 0;
        }
        if (is->rtt_s <= 0)
            is->rtt_s = mrtt;
        if (is->bytes_per_s <= 0)
            is->bytes_per_s = isfinite(mbw) ? mbw : 1e12;
    }
    is->algo_epoch = is->q.epoch; /* its members decide alike from the same figures */
    return decide(is, is->rtt_s, is->bytes_per_s, true);
}

/* After an outer step: a new estimate of the links from what this step
 * took, and the choice for the next steps from the estimates every peer
 * sent with this step (so all islands decide alike). */
static int rechoose(island *is, const loco_exchange_stats *st) {
    if (!is->auto_algo || !is->measure)
        return 0;
    double rounds = is->algo == LOCO_EXCHANGE_RSAG ? 2.0 : 1.0;
    double wire = st->exchange_s - rounds * is->rtt_s / 2;
    if (st->bytes_received > 0 && wire > 0)
        is->bytes_per_s = (double)st->bytes_received / wire;
    return decide(is, st->agreed_rtt_s, st->agreed_bytes_per_s, false);
}

/* The tokens this island trained on since a fragment's last outer step
 * (every fragment is synchronised every outer.H inner steps): the weight of
 * its contribution under outer.weighting = tokens, 0 under uniform. */
static double tokens_since_sync(const island *is, int64_t inner) {
    if (strcmp(is->cfg.outer.weighting, "tokens"))
        return 0;
    const loco_config *c = &is->cfg;
    /* outer.sync = time: the steps it managed (at least one: it syncs
     * after a step) */
    const int64_t steps = !is->timed                       ? c->outer.H
                          : inner > is->last_sync_inner ? inner - is->last_sync_inner
                                                        : 1;
    return (double)steps * (double)c->train.batch_size * (double)c->model.seq_len *
           (double)c->train.grad_accum * (double)c->parallel.dp;
}

/* Rank 0 reads the coordinator; its verdict reaches every rank. */
int loco__island_check_coordinator(island *is) {
    int ok = is->rank == 0 ? loco_session_poll(is->session) : 0;
    int bad = ok < 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad)
        return is->rank == 0 ? ok : LOCO_ERR(LOCO_EPEER, "the coordinator stopped the run");
    return 0;
}

/* ------------------------------------------------------ one outer step */

/* The exchange of the step in flight: network and arithmetic only (no
 * island collective), so it may run on a thread beside training. */
static void exchange(island *is) {
    loco_sync *y = &is->sync;
    loco_outer *o = is->outer[y->frag];
    if (is->fr.n_f[y->frag] == 0) {
        y->rc = 0; /* this rank holds none of the fragment, nor do its peers */
        return;
    }
    /* Under auto, only the members that chose the algorithm together run
     * it: those of the epoch they chose it in (an epoch has one
     * membership, and a step commits only when every member concluded
     * it). A step in a new epoch (an island restarted, rejoined or left,
     * a coordinator restarted, a redo) all-gathers, and every member
     * rechooses from the figures it agrees. */
    const bool chosen_together = !is->auto_algo || y->x.epoch == is->algo_epoch;
    if (is->algo == LOCO_EXCHANGE_RSAG && y->x.n_observers == 0 && !y->observer && chosen_together)
        y->rc = loco_outer_step_rsag(o, &y->x, y->theta, y->outer, &y->st);
    else
        y->rc = loco_outer_step_allgather(o, &y->x, y->theta, y->outer, &y->st);
    if (y->rc < 0)
        snprintf(y->msg, sizeof y->msg, "%s", loco_errmsg());
}

static void *exchange_thread(void *arg) {
    island *is = arg;
    exchange(is);
    atomic_store(&is->sync.exchanged, 1);
    return NULL;
}

/* The coordinator whose GO started the attempt is gone (rank 0 holds the
 * session): peers that never got the GO will not send, so the exchange
 * ends now instead of after faulttol.timeout_ms (the step is redone under
 * the coordinator the island registers with next). Other ranks wait for
 * their peers' links to fail or time out. */
static bool coordinator_gone(void *ctx) {
    island *is = ctx;
    return is->session && loco_session_broken(is->session);
}

/* Sets up an attempt at the step in is->sync in the quorum is->q (a go):
 * as a member, or as an observer when it rejoins at this step; the
 * fragment's θ_local is taken now (packed, unless the step may work in
 * place: one interval, no overlap, nothing to merge). */
static int prepare(island *is, bool overlap) {
    loco_sync *y = &is->sync;
    y->observer = loco_quorum_has(is->q.observers, is->id);
    int nc = 0, no = 0, me = -1;
    y->rc = ensure_links(is, is->q.members | is->q.observers);
    for (int k = 0; k < is->K && y->rc == 0; k++) {
        if (loco_quorum_has(is->q.members, k)) {
            if (k == is->id)
                me = nc;
            y->ids[nc] = k;
            y->contrib[nc++] = is->links[k];
        } else if (loco_quorum_has(is->q.observers, k) && !y->observer) {
            y->obs[no++] = is->links[k];
        }
    }
    size_t lo, hi, at = 0;
    /* On the device: θ_local is the trainer's device range, updated in
     * place (one fragment, no overlap, alpha = 0); no host copy moves. */
    float *own = is->on_dev ? is->in.device_owned(is->in.ctx, &lo, &hi)
                            : is->in.owned(is->in.ctx, &lo, &hi);
    if (!own && y->rc == 0)
        y->rc = LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    if (y->rc < 0) {
        snprintf(y->msg, sizeof y->msg, "%s", loco_errmsg());
        return 0;
    }
    if (!y->planned) {
        if (!y->observer) {
            const float poison = loco_faults_poison(&is->f, y->inner);
            if (poison != 1)
                loco_outer_poison_next(is->outer[y->frag], poison);
        }
        if (is->on_dev || (!overlap && is->alpha == 0 &&
                           loco_fragments_contiguous(&is->fr, y->frag, &at))) {
            y->theta = own + (is->on_dev ? 0 : at);
        } else {
            loco_fragments_gather(&is->fr, y->frag, own, is->packed);
            y->theta = is->packed;
        }
    }
    y->x = (loco_exchange){.n_islands = nc, .me = y->observer ? -1 : me, .peers = y->contrib,
                           .epoch = is->q.epoch, .shard = (uint32_t)is->rank,
                           .max_frame = (size_t)is->cfg.net.max_frame_mb << 20,
                           .timeout_ms = (int)is->cfg.faulttol.timeout_ms,
                           .est_rtt_s = is->rtt_s, .est_bytes_per_s = is->bytes_per_s,
                           .tokens = tokens_since_sync(is, y->inner), .redo = y->planned, .observers = y->obs, .n_observers = no,
                           .cancelled = is->rank == 0 ? coordinator_gone : NULL, .cancel_ctx = is};
    y->st = (loco_exchange_stats){.failed_peer = -1};
    y->planned = true; /* the pseudo-gradient is encoded from here on */
    return 0;
}

/* After the exchange: its outcome agreed across the island (*ok), the
 * islands suspected, the new hash and the record. */
static int conclude(island *is, bool *ok, uint64_t *suspects, uint64_t *hash) {
    loco_sync *y = &is->sync;
    const int nc = y->x.n_islands;
    if (y->rc < 0) {
        char why[sizeof y->msg + 96];
        const int fp = y->st.failed_peer;
        if (y->rc == LOCO_EREFUSED && fp >= 0 && fp < nc)
            snprintf(why, sizeof why, "contribution of %s refused: %s", is->q.m[y->ids[fp]].site,
                     y->msg);
        else
            snprintf(why, sizeof why, "%s", y->msg);
        loco_warn("outer step %lld (epoch %llu): %s", (long long)y->outer,
                  (unsigned long long)is->q.epoch, why);
        if (y->rc == LOCO_EPROTO || y->rc == LOCO_EREFUSED)
            loco_faults_refused_event(&is->f, why);
    }
    int bad = y->rc < 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    *ok = !bad;
    uint64_t sus = 0;
    if (y->st.failed_peer >= 0 && y->st.failed_peer < nc)
        sus = 1ull << y->ids[y->st.failed_peer];
    else if (bad)
        sus = is->q.members & ~(1ull << is->id);
    /* A refused contribution is said as such: the coordinator drops its
     * island when most of the others refused it too (faulttol/coord.c). */
    uint64_t refused = y->rc == LOCO_EREFUSED && y->st.failed_peer >= 0 ? sus : 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &sus, 1, LOCO_DT_I64, LOCO_OP_MAX));
    LOCO_CHECK(loco_comm_allreduce(is->world, &refused, 1, LOCO_DT_I64, LOCO_OP_MAX));
    *suspects = sus;
    if (!*ok) {
        *hash = refused; /* a failed outcome carries the refused islands in place of a hash */
        loco__island_drop_links(is); /* a failed attempt leaves nothing on the wire */
        return 0;
    }
    if (!y->observer) {
        LOCO_CHECK(rechoose(is, &y->st));
        is->algo_epoch = is->q.epoch;
    }
    /* zstd=auto weighs the wire against its own cost: the link speed the
     * islands agreed on, unless the config gives one. */
    if (is->cfg.compress.link_gbps <= 0 && y->st.agreed_bytes_per_s > 0 &&
        isfinite(y->st.agreed_bytes_per_s))
        for (int f = 0; f < is->fr.F; f++)
            loco_codec_set_link_gbps(loco_outer_codec(is->outer[f]),
                                     y->st.agreed_bytes_per_s * 8 / 1e9);
    LOCO_CHECK(loco__island_hash(is, hash));
    double *sums = y->sums;
    sums[0] = (double)y->st.raw_bytes * (nc - 1);
    sums[1] = (double)y->st.bytes_sent;
    sums[2] = (double)y->st.bytes_received;
    sums[3] = y->st.exchange_s;
    sums[4] = y->st.delta_ratio;
    LOCO_CHECK(loco_comm_allreduce(is->world, sums, 3, LOCO_DT_F64, LOCO_OP_SUM));
    LOCO_CHECK(loco_comm_allreduce(is->world, sums + 3, 2, LOCO_DT_F64, LOCO_OP_MAX));
    /* PCIe since the last record: the trainer's host_sync / device_load
     * (the host path with train.device = cuda) and the device outer
     * state's copies, the per-step θ_global hash and the peers'
     * snapshot included (docs/DECISIONS.md "Outer loop on the device"). */
    uint64_t pcie = is->in.take_pcie_bytes ? is->in.take_pcie_bytes(is->in.ctx) : 0;
    for (int f = 0; f < is->fr.F; f++)
        pcie += loco_outer_take_pcie_bytes(is->outer[f]);
    y->pcie = (double)pcie;
    LOCO_CHECK(loco_comm_allreduce(is->world, &y->pcie, 1, LOCO_DT_F64, LOCO_OP_SUM));
    return 0;
}

/* Says ready and waits for the go; v receives the verdict. */
static int ready(island *is, int64_t outer, loco_verdict *v, double *waited) {
    int rc = 0;
    *v = 0;
    const double t0 = loco_now();
    if (is->rank == 0)
        rc = loco_session_ready(is->session, outer, is->committed, &is->q, v,
                                (int)is->cfg.faulttol.timeout_ms);
    rc = share(is, rc, v);
    *waited += loco_now() - t0;
    return rc;
}

/* The coordinator's verdict on the attempt whose exchange ended (*v):
 * on COMMIT the step is final, on AGAIN it is to be redone in the new
 * epoch from the kept pseudo-gradient; otherwise θ_global went back. */
static int finish_attempt(island *is, loco_verdict *v) {
    loco_sync *y = &is->sync;
    bool ok = y->ok;
    uint64_t sus = y->suspects, h = y->hash;
    *v = 0;
    int rc = y->concluded ? 0 : conclude(is, &ok, &sus, &h);
    y->concluded = false; /* a redo concludes again */
    LOCO_CHECK(rc);
    /* On the device the exchange may have written θ_local there (any
     * outcome): the trainer's host copy is stale, its bf16 copy renewed. */
    if (is->on_dev)
        LOCO_CHECK(is->in.device_written(is->in.ctx));
    const double t0 = loco_now();
    if (is->rank == 0) {
        loco_island_progress pr = progress(is, ok ? y->outer : 0, ok ? h : 0);
        loco_session_progress(is->session, &pr);
        rc = loco_session_done(is->session, y->outer, is->q.epoch, ok, h, sus, &is->q, v,
                               (int)is->cfg.faulttol.timeout_ms);
    }
    rc = share(is, rc, v);
    y->done_s += loco_now() - t0;
    if (rc == 0 && *v == LOCO_VERDICT_COMMIT) {
        is->committed = y->outer;
        is->committed_hash = h;
        is->final_committed = is->timed ? y->outer >= is->end_step / is->period
                                        : y->inner >= is->end_step;
        loco_peers_publish(is->svc, y->outer, y->inner);
        if (is->rank == 0)
            loco__island_record(is, y->outer, y->inner, y->frag, &y->st, y->sums, h,
                                y->x.n_islands);
    } else if (rc == 0 && *v != LOCO_VERDICT_AGAIN) {
        loco_outer_restore(is->outer[y->frag]);
    }
    LOCO_CHECK(rc);
    if (is->rank == 0) {
        loco_island_progress pr = progress(is, 0, 0);
        loco_session_progress(is->session, &pr);
    }
    if (*v == LOCO_VERDICT_AGAIN) {
        loco__island_drop_links(is);
        loco_info("outer step %lld: redone in epoch %llu", (long long)y->outer,
                  (unsigned long long)is->q.epoch);
        return 0;
    }
    y->active = false;
    if (*v == LOCO_VERDICT_FINISHED)
        is->finished = true;
    if (*v != LOCO_VERDICT_COMMIT)
        return 0;
    /* The fragment's new θ_global reaches θ_local now (it was updated in
     * place) or at the merge, τ inner steps after the exchange began. */
    if (y->theta == is->packed) {
        is->merge_frag = y->frag;
        is->merge_step = y->inner + (y->overlapped ? is->overlap : 0);
        return 0;
    }
    if (is->on_dev) /* θ_local was written on the device: marked above */
        return 0;
    return is->in.sync(is->in.ctx);
}

int loco__island_sync_poll(island *is) {
    loco_sync *y = &is->sync;
    if (!y->active || y->concluded || !y->threaded)
        return 0;
    int pending = !atomic_load(&y->exchanged);
    LOCO_CHECK(loco_comm_allreduce(is->world, &pending, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (pending)
        return 0;
    pthread_join(y->thread, NULL);
    y->threaded = false;
    LOCO_CHECK(conclude(is, &y->ok, &y->suspects, &y->hash));
    y->concluded = true;
    if (is->rank == 0) {
        loco_island_progress pr = progress(is, y->ok ? y->outer : 0, y->ok ? y->hash : 0);
        loco_session_progress(is->session, &pr);
        loco_session_done_ahead(is->session, y->outer, is->q.epoch, y->ok, y->hash,
                                y->suspects);
    }
    return 0;
}

void loco__island_ready_ahead(island *is, int64_t outer) {
    if (is->rank == 0)
        loco_session_ready_ahead(is->session, outer, is->committed);
}

int loco__island_sync_finish(island *is) {
    loco_sync *y = &is->sync;
    const double t0 = loco_now();
    if (y->threaded) {
        pthread_join(y->thread, NULL);
        y->threaded = false;
    }
    y->join_s += loco_now() - t0;
    for (;;) {
        loco_verdict v;
        LOCO_CHECK(finish_attempt(is, &v));
        if (v == LOCO_VERDICT_JOIN)
            return loco__island_rejoin(is);
        if (v != LOCO_VERDICT_AGAIN)
            return 0;
        /* A redo runs here, blocking: it is the rare path. */
        LOCO_CHECK(ready(is, y->outer, &v, &y->ready_s));
        if (v == LOCO_VERDICT_FINISHED) {
            y->active = false;
            is->finished = true;
            return 0;
        }
        if (v == LOCO_VERDICT_JOIN || !loco_quorum_has(is->q.members, is->id)) {
            loco_outer_restore(is->outer[y->frag]);
            y->active = false;
            return loco__island_rejoin(is);
        }
        LOCO_CHECK(prepare(is, false));
        if (y->rc == 0)
            exchange(is);
    }
}

int loco__island_sync(island *is, int64_t outer, int64_t inner, int frag, bool overlap) {
    loco_sync *y = &is->sync;
    loco_verdict v;
    double ready_s = 0;
    LOCO_CHECK(ready(is, outer, &v, &ready_s));
    if (v == LOCO_VERDICT_FINISHED) {
        is->finished = true;
        return 0;
    }
    if (v == LOCO_VERDICT_JOIN || !loco_quorum_has(is->q.members, is->id)) {
        /* quorum mode: left out as late, its period's work is kept */
        if (is->cfg.outer.quorum > 0 && !is->late_held)
            LOCO_CHECK(loco__island_keep_late(is));
        return loco__island_rejoin(is);
    }
    *y = (loco_sync){.active = true, .outer = outer, .inner = inner, .frag = frag,
                     .ready_s = ready_s};
    loco_outer_save(is->outer[frag]);
    LOCO_CHECK(prepare(is, overlap));
    if (overlap) {
        /* Every rank of the island finishes τ steps later, whatever its
         * share of the fragment, so the island's collectives line up. */
        y->overlapped = true;
        if (y->rc == 0 && pthread_create(&y->thread, NULL, exchange_thread, is) == 0) {
            y->threaded = true;
            return 0; /* training goes on; loco__island_sync_finish later */
        }
        if (y->rc == 0)
            exchange(is);
        return 0;
    }
    if (y->rc == 0)
        exchange(is);
    return loco__island_sync_finish(is);
}

/* ------------------------------------------------------------- rejoin */

/* Outside the quorum (restarted, dropped as a straggler or cut off): fetch
 * θ_global and the outer momentum of the committed step from a member,
 * check its hash, observe the next outer step and come back as a member.
 * The committed step is also the fragment schedule's position: outer step
 * s syncs fragment (s - 1) mod F after inner step s · H / F. */
int loco__island_rejoin(island *is) {
    const int64_t P = is->period;
    is->merge_frag = -1;
    for (int tries = 0;; tries++) {
        if (tries > 1000)
            return LOCO_ERR(LOCO_EPEER, "could not rejoin the run");
        loco_verdict v = LOCO_VERDICT_JOIN;
        /* is->q is a join (or a membership without us): it names the
         * committed step and the members to fetch it from. */
        if (is->q.committed != is->committed || is->q.committed_hash != is->committed_hash) {
            char (*sites)[LOCO_NET_NAME_MAX] = loco_alloc(LOCO_MAX_ISLANDS * LOCO_NET_NAME_MAX);
            char (*addrs)[LOCO_ADDR_MAX] = loco_alloc(LOCO_MAX_ISLANDS * LOCO_ADDR_MAX);
            if (!sites || !addrs) {
                loco_free(sites);
                loco_free(addrs);
                return LOCO_ERR(LOCO_ENOMEM, "donor list");
            }
            int nd = 0;
            /* Start with a different donor per attempt, so a dead one is skipped. */
            for (int j = 0; j < is->K; j++) {
                int k = (j + tries) % is->K;
                if (k != is->id && loco_quorum_has(is->q.members, k) &&
                    is->q.m[k].n_ranks == is->ranks) {
                    snprintf(sites[nd], LOCO_NET_NAME_MAX, "%s", is->q.m[k].site);
                    snprintf(addrs[nd], LOCO_ADDR_MAX, "%s", is->q.m[k].addrs[is->rank]);
                    nd++;
                }
            }
            int64_t donor_inner = 0, got = -1;
            loco_state_stats st = {0};
            int rc = loco_state_fetch(&is->np, nd, (const char (*)[LOCO_NET_NAME_MAX])sites,
                                      (const char (*)[LOCO_ADDR_MAX])addrs, &got, &is->set,
                                      &donor_inner, &st, (int)is->cfg.faulttol.timeout_ms);
            loco_free(sites);
            loco_free(addrs);
            /* Every rank must hold the state of one step. */
            int64_t w[3] = {rc < 0, got, -got};
            LOCO_CHECK(loco_comm_allreduce(is->world, w, 3, LOCO_DT_I64, LOCO_OP_MAX));
            bool bad = w[0] || w[1] != -w[2];
            uint64_t h = 0;
            if (!bad)
                LOCO_CHECK(loco__island_hash(is, &h));
            /* The step the coordinator named must match its hash; a newer
             * one is checked when this island's first step commits. */
            if (!bad && (got != is->q.committed || h == is->q.committed_hash)) {
                is->q.committed = is->committed = got;
                is->q.committed_hash = is->committed_hash = h;
                LOCO_CHECK(loco__island_adopt_global(is));
                /* outer.sync = time: inner steps differ between islands;
                 * the donor's is where this one goes on from */
                const int64_t at = is->timed ? donor_inner : is->committed * P;
                is->in.set_step(is->in.ctx, at);
                loco_peers_publish(is->svc, is->committed, at);
                is->last_sync_inner = at;
                is->sync_t0 = loco_now();
                double b = (double)st.bytes, secs = st.seconds;
                LOCO_CHECK(loco_comm_allreduce(is->world, &b, 1, LOCO_DT_F64, LOCO_OP_SUM));
                if (is->rank == 0)
                    loco_info("rejoin: fetched θ_global and momentum of outer step %lld "
                              "(%.2f MB in %.3f s, %.1f MB/s, %d donor(s) tried); hash checked",
                              (long long)is->committed, b / 1e6, secs,
                              secs > 0 ? b / 1e6 / secs : 0.0, st.donors_tried);
            } else if (is->rank == 0) {
                loco_warn("rejoin: state of outer step %lld not fetched (%s); asking again",
                          (long long)is->q.committed,
                          w[0] ? loco_errmsg() : bad ? "ranks fetched different steps"
                                               : "hash differs from the committed one");
            }
        }
        int rc = 0;
        if (is->rank == 0)
            rc = loco_session_ready(is->session, is->committed + 1, is->committed, &is->q, &v,
                                    (int)is->cfg.faulttol.timeout_ms);
        LOCO_CHECK(share(is, rc, &v));
        if (v == LOCO_VERDICT_FINISHED) {
            is->finished = true;
            return 0;
        }
        if (v == LOCO_VERDICT_JOIN || !loco_quorum_has(is->q.observers | is->q.members, is->id))
            continue;
        /* Go: observe this step (or, after a coordinator restart, take part). */
        const int64_t s = is->committed + 1;
        /* outer.sync = time: the inner step the fetch set stays */
        const int64_t at = is->timed ? is->in.steps_done(is->in.ctx) : s * P;
        if (loco_quorum_has(is->q.members, is->id)) {
            if (!is->timed)
                is->in.set_step(is->in.ctx, is->committed * P);
            /* a member again: the training loop goes on from here */
            return loco__island_fold_late(is);
        }
        loco_sync *y = &is->sync;
        *y = (loco_sync){.active = true, .outer = s, .inner = at,
                         .frag = (int)((s - 1) % is->fr.F)};
        loco_outer_save(is->outer[y->frag]);
        LOCO_CHECK(prepare(is, false));
        if (y->rc == 0)
            exchange(is);
        LOCO_CHECK(finish_attempt(is, &v));
        if (is->finished)
            return 0;
        if (v == LOCO_VERDICT_AGAIN) {
            loco_outer_restore(is->outer[y->frag]);
            y->active = false;
        }
        if (v != LOCO_VERDICT_COMMIT)
            continue;
        /* Every fragment of θ_local is θ_global: nothing left to merge. */
        if (is->merge_frag >= 0)
            LOCO_CHECK(loco__island_merge(is, is->merge_frag, 0.0f));
        is->merge_frag = -1;
        is->in.set_step(is->in.ctx, at);
        if (is->rank == 0)
            loco_info("rejoin: %s is a member again from outer step %lld (inner step %lld)",
                      is->site, (long long)s, (long long)at);
        return loco__island_fold_late(is);
    }
}
