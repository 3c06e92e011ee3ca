/* `loco island CONFIG --site NAME`: one island of a multi-site run. Its
 * ranks train as `loco train` would; every outer.H steps each rank runs
 * DiLoCo's outer step on the range it owns with the same rank of every other
 * island, over TLS links, and rank 0 keeps the coordinator informed. */
#include "cli/cli.h"

#include "faulttol/faulttol.h"
#include "inner/comm/comm.h"
#include "inner/inner.h"
#include "outer/outer.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SETS 256


typedef struct {
    loco_config cfg;
    const char *site;
    int id, K;
    loco_trainer *t;
    loco_comm *world;
    int rank, ranks;
    loco_net_params np;
    loco_peers *svc;            /* peer listener, link stash, state server */
    loco_session *session;      /* rank 0 only */
    loco_quorum q;              /* the latest quorum */
    loco_link *links[LOCO_MAX_ISLANDS]; /* by island id, for links_epoch */
    uint64_t links_epoch;
    loco_outer *outer;
    int64_t committed;          /* outer step of θ_global */
    uint64_t committed_hash;
    loco_exchange_algo algo;
    bool auto_algo, measure;    /* outer.algorithm = auto; links measured, not configured */
    double rtt_s, bytes_per_s;  /* this rank's estimate of its links */
    double elems_max;           /* largest owned range of the island */
    loco_metrics *metrics;      /* rank 0: outer-step records */
    loco_faults f;              /* [faults] of this island (faulttol/) */
    double step_s;              /* duration of the last inner step */
} island;

static void drop_links(island *is) {
    for (int k = 0; k < LOCO_MAX_ISLANDS; k++) {
        loco_link_destroy(is->links[k]);
        is->links[k] = NULL;
    }
}

static void island_fini(island *is) {
    drop_links(is);
    loco_peers_destroy(is->svc);
    loco_outer_destroy(is->outer);
    loco_session_destroy(is->session);
    loco_quorum_fini(&is->q);
    loco_metrics_close(is->metrics);
    loco_trainer_destroy(is->t);
}

static int rechoose(island *is, const loco_exchange_stats *st);

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
                                  .pending = pending, .pending_hash = pending_hash};
}

/* Rank 0 registers; the first quorum reaches every rank. */
static int join(island *is) {
    char (*addrs)[LOCO_ADDR_MAX] = loco_alloc((size_t)is->ranks * LOCO_ADDR_MAX);
    if (!addrs)
        return LOCO_ERR(LOCO_ENOMEM, "addresses");
    int rc = gather_addrs(is, addrs);
    if (rc == 0 && is->rank == 0) {
        char mesh[160];
        snprintf(mesh, sizeof mesh, "dp=%lld tp=%lld sp=%d pp=%lld cp=%lld ep=%lld zero=%lld",
                 (long long)is->cfg.parallel.dp, (long long)is->cfg.parallel.tp,
                 (int)is->cfg.parallel.sp,
                 (long long)is->cfg.parallel.pp, (long long)is->cfg.parallel.cp,
                 (long long)is->cfg.parallel.ep, (long long)is->cfg.parallel.zero_stage);
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
        drop_links(is);
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

/* θ_global of the whole island: the hash of every rank's shard hash. */
static int island_hash(island *is, uint64_t *h) {
    uint64_t mine = loco_outer_hash(is->outer), all[LOCO_MAX_ISLAND_RANKS];
    size_t counts[LOCO_MAX_ISLAND_RANKS];
    for (int r = 0; r < is->ranks; r++)
        counts[r] = 1;
    LOCO_CHECK(loco_comm_allgather(is->world, &mine, all, counts, LOCO_DT_I64));
    *h = loco_hash64(all, (size_t)is->ranks * sizeof(uint64_t));
    return 0;
}

/* θ_local ← θ_global on every rank. */
static int adopt_global(island *is) {
    size_t lo, hi;
    float *own = loco_trainer_owned_params(is->t, &lo, &hi);
    if (!own)
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    memcpy(own, loco_outer_theta(is->outer), (hi - lo) * sizeof(float));
    return loco_trainer_sync_params(is->t);
}

static void record(island *is, int64_t outer, int64_t inner, const loco_exchange_stats *st,
                   const double *sums, uint64_t h, int n_members) {
    char hh[17];
    loco_hash_hex(h, hh);
    loco_info("outer step %lld (inner %lld, epoch %llu, %d islands) | sent %.2f MB for %.2f MB "
              "raw (x%.1f) | exchange %.3f s | θ %s",
              (long long)outer, (long long)inner, (unsigned long long)is->q.epoch, n_members,
              sums[1] / 1e6, sums[0] / 1e6, sums[1] > 0 ? sums[0] / sums[1] : 0.0, sums[3], hh);
    loco_metrics_begin(is->metrics);
    loco_metrics_int(is->metrics, "outer_step", outer);
    loco_metrics_int(is->metrics, "step", inner);
    loco_metrics_int(is->metrics, "epoch", (int64_t)is->q.epoch);
    loco_metrics_int(is->metrics, "members", n_members);
    loco_metrics_num(is->metrics, "bytes_raw", sums[0]);
    loco_metrics_num(is->metrics, "bytes_sent", sums[1]);
    loco_metrics_num(is->metrics, "bytes_received", sums[2]);
    loco_metrics_num(is->metrics, "compression_ratio", sums[1] > 0 ? sums[0] / sums[1] : 0);
    loco_metrics_num(is->metrics, "exchange_s", sums[3]);
    loco_metrics_num(is->metrics, "inner_wait_s", sums[3] + st->encode_s + st->apply_s);
    loco_metrics_str(is->metrics, "theta_hash", hh);
    loco_metrics_str(is->metrics, "algorithm",
                     is->algo == LOCO_EXCHANGE_RSAG ? "rsag" : "allgather");
    loco_metrics_int(is->metrics, "zstd", st->zstd);
    loco_metrics_num(is->metrics, "sender_encode_s", st->sender_encode_s);
    loco_metrics_end(is->metrics);
}

/* One attempt at outer step `outer` in the quorum is->q (a go): as a
 * member, or as an observer when it rejoins at this step. Returns the
 * exchange outcome (0 or < 0) with *ok agreed across the island. */
static int attempt(island *is, int64_t outer, int64_t inner, bool *planned, bool *ok,
                   uint64_t *suspects, uint64_t *hash) {
    const bool redo = *planned;
    const bool observer = loco_quorum_has(is->q.observers, is->id);
    loco_link *contrib[LOCO_MAX_PEERS] = {0}, *obs[LOCO_MAX_PEERS] = {0};
    int ids[LOCO_MAX_PEERS];
    int nc = 0, no = 0, me = -1;
    int rc = ensure_links(is, is->q.members | is->q.observers);
    for (int k = 0; k < is->K && rc == 0; k++) {
        if (loco_quorum_has(is->q.members, k)) {
            if (k == is->id)
                me = nc;
            ids[nc] = k;
            contrib[nc++] = is->links[k];
        } else if (loco_quorum_has(is->q.observers, k) && !observer) {
            obs[no++] = is->links[k];
        }
    }
    size_t lo, hi;
    float *own = loco_trainer_owned_params(is->t, &lo, &hi);
    if (!own && rc == 0)
        rc = LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    loco_exchange x = {.n_islands = nc, .me = observer ? -1 : me, .peers = contrib,
                       .epoch = is->q.epoch, .shard = (uint32_t)is->rank,
                       .max_frame = (size_t)is->cfg.net.max_frame_mb << 20,
                       .timeout_ms = (int)is->cfg.faulttol.timeout_ms,
                       .est_rtt_s = is->rtt_s, .est_bytes_per_s = is->bytes_per_s,
                       .redo = redo, .observers = obs, .n_observers = no};
    loco_exchange_stats st = {.failed_peer = -1};
    if (rc == 0) {
        *planned = true; /* the pseudo-gradient is encoded from here on */
        if (is->algo == LOCO_EXCHANGE_RSAG && no == 0 && !observer)
            rc = loco_outer_step_rsag(is->outer, &x, own, outer, &st);
        else
            rc = loco_outer_step_allgather(is->outer, &x, own, outer, &st);
    }
    if (rc < 0) {
        loco_warn("outer step %lld (epoch %llu): %s", (long long)outer,
                  (unsigned long long)is->q.epoch, loco_errmsg());
        if (rc == LOCO_EPROTO)
            loco_faults_refused_event(&is->f, loco_errmsg());
    }
    int bad = rc < 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    *ok = !bad;
    uint64_t sus = 0;
    if (st.failed_peer >= 0 && st.failed_peer < nc)
        sus = 1ull << ids[st.failed_peer];
    else if (bad)
        sus = is->q.members & ~(1ull << is->id);
    LOCO_CHECK(loco_comm_allreduce(is->world, &sus, 1, LOCO_DT_I64, LOCO_OP_MAX));
    *suspects = sus;
    if (!*ok) {
        drop_links(is); /* a failed attempt leaves nothing on the wire for the next */
        return 0;
    }
    LOCO_CHECK(loco_trainer_sync_params(is->t));
    if (!observer)
        LOCO_CHECK(rechoose(is, &st));
    /* zstd=auto weighs the wire against its own cost: the link speed the
     * islands agreed on, unless the config gives one. */
    if (is->cfg.compress.link_gbps <= 0 && st.agreed_bytes_per_s > 0 &&
        isfinite(st.agreed_bytes_per_s))
        loco_codec_set_link_gbps(loco_outer_codec(is->outer), st.agreed_bytes_per_s * 8 / 1e9);
    LOCO_CHECK(island_hash(is, hash));
    double sums[4] = {(double)st.raw_bytes * (nc - 1), (double)st.bytes_sent,
                      (double)st.bytes_received, st.exchange_s};
    LOCO_CHECK(loco_comm_allreduce(is->world, sums, 3, LOCO_DT_F64, LOCO_OP_SUM));
    LOCO_CHECK(loco_comm_allreduce(is->world, sums + 3, 1, LOCO_DT_F64, LOCO_OP_MAX));
    if (is->rank == 0)
        record(is, outer, inner, &st, sums, *hash, nc);
    return 0;
}

static int rejoin(island *is, bool *finished);

/* Outer step `outer` after inner step `inner`: ready, go, exchange, done,
 * until committed (redoing it in each new epoch) or this island is out
 * (then it rejoins). *finished when the run ended meanwhile. */
static int outer_step(island *is, int64_t outer, int64_t inner, bool *finished) {
    bool planned = false;
    for (;;) {
        loco_verdict v = 0;
        int rc = 0;
        if (is->rank == 0)
            rc = loco_session_ready(is->session, outer, is->committed, &is->q, &v,
                                    (int)is->cfg.faulttol.timeout_ms);
        LOCO_CHECK(share(is, rc, &v));
        if (v == LOCO_VERDICT_FINISHED) {
            *finished = true;
            return 0;
        }
        if (v == LOCO_VERDICT_JOIN || !loco_quorum_has(is->q.members, is->id))
            return rejoin(is, finished);
        loco_peers_lock_state(is->svc);
        bool ok;
        uint64_t sus = 0, h = 0;
        rc = attempt(is, outer, inner, &planned, &ok, &sus, &h);
        if (rc < 0) {
            loco_peers_unlock_state(is->svc);
            return rc;
        }
        if (is->rank == 0) {
            loco_island_progress pr = progress(is, ok ? outer : 0, ok ? h : 0);
            loco_session_progress(is->session, &pr);
            rc = loco_session_done(is->session, outer, is->q.epoch, ok, h, sus, &is->q, &v,
                                   (int)is->cfg.faulttol.timeout_ms);
        }
        rc = share(is, rc, &v);
        if (rc == 0 && v == LOCO_VERDICT_COMMIT) {
            is->committed = outer;
            is->committed_hash = h;
            loco_peers_publish(is->svc, outer, inner);
        }
        loco_peers_unlock_state(is->svc);
        LOCO_CHECK(rc);
        if (is->rank == 0) {
            loco_island_progress pr = progress(is, 0, 0);
            loco_session_progress(is->session, &pr);
        }
        if (v == LOCO_VERDICT_COMMIT)
            return 0;
        if (v == LOCO_VERDICT_FINISHED) {
            *finished = true;
            return 0;
        }
        if (v == LOCO_VERDICT_JOIN) {
            loco_outer_restore(is->outer);
            return rejoin(is, finished);
        }
        /* AGAIN: a new epoch; redo from the kept pseudo-gradient. */
        drop_links(is);
        loco_info("outer step %lld: redone in epoch %llu", (long long)outer,
                  (unsigned long long)is->q.epoch);
    }
}

/* Outside the quorum (restarted, dropped as a straggler or cut off): fetch
 * θ_global and the outer momentum of the committed step from a member,
 * check its hash, observe the next outer step and come back as a member. */
static int rejoin(island *is, bool *finished) {
    const int64_t H = is->cfg.outer.H;
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
                                      (const char (*)[LOCO_ADDR_MAX])addrs, &got, is->outer,
                                      &donor_inner, &st, (int)is->cfg.faulttol.timeout_ms);
            loco_free(sites);
            loco_free(addrs);
            /* Every rank must hold the state of one step. */
            int64_t v[3] = {rc < 0, got, -got};
            LOCO_CHECK(loco_comm_allreduce(is->world, v, 3, LOCO_DT_I64, LOCO_OP_MAX));
            bool bad = v[0] || v[1] != -v[2];
            uint64_t h = 0;
            if (!bad)
                LOCO_CHECK(island_hash(is, &h));
            /* The step the coordinator named must match its hash; a newer
             * one is checked when this island's first step commits. */
            if (!bad && (got != is->q.committed || h == is->q.committed_hash)) {
                is->q.committed = is->committed = got;
                is->q.committed_hash = is->committed_hash = h;
                LOCO_CHECK(adopt_global(is));
                loco_trainer_set_step(is->t, is->committed * H);
                loco_peers_publish(is->svc, is->committed, is->committed * H);
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
                          v[0] ? loco_errmsg() : bad ? "ranks fetched different steps"
                                               : "hash differs from the committed one");
            }
        }
        int rc = 0;
        if (is->rank == 0)
            rc = loco_session_ready(is->session, is->committed + 1, is->committed, &is->q, &v,
                                    (int)is->cfg.faulttol.timeout_ms);
        LOCO_CHECK(share(is, rc, &v));
        if (v == LOCO_VERDICT_FINISHED) {
            *finished = true;
            return 0;
        }
        if (v == LOCO_VERDICT_JOIN || !loco_quorum_has(is->q.observers | is->q.members, is->id))
            continue;
        /* Go: observe this step (or, after a coordinator restart, take part). */
        const int64_t s = is->committed + 1;
        if (loco_quorum_has(is->q.members, is->id)) {
            loco_trainer_set_step(is->t, is->committed * H);
            return 0; /* a member again: the training loop goes on from here */
        }
        loco_peers_lock_state(is->svc);
        bool ok;
        uint64_t sus = 0, h = 0;
        bool planned = false;
        rc = attempt(is, s, s * H, &planned, &ok, &sus, &h);
        if (rc == 0 && is->rank == 0)
            rc = loco_session_done(is->session, s, is->q.epoch, ok, h, sus, &is->q, &v,
                                   (int)is->cfg.faulttol.timeout_ms);
        rc = share(is, rc, &v);
        if (rc == 0 && v == LOCO_VERDICT_COMMIT) {
            is->committed = s;
            is->committed_hash = h;
            loco_peers_publish(is->svc, s, s * H);
        } else if (rc == 0) {
            loco_outer_restore(is->outer);
        }
        loco_peers_unlock_state(is->svc);
        LOCO_CHECK(rc);
        if (is->rank == 0) {
            loco_island_progress pr = progress(is, 0, 0);
            loco_session_progress(is->session, &pr);
        }
        if (v == LOCO_VERDICT_COMMIT) {
            loco_trainer_set_step(is->t, s * H);
            if (is->rank == 0)
                loco_info("rejoin: %s is a member again from outer step %lld (inner step %lld)",
                          is->site, (long long)s, (long long)(s * H));
            return 0;
        }
        if (v == LOCO_VERDICT_FINISHED) {
            *finished = true;
            return 0;
        }
    }
}

/* The outer state next to the inner checkpoint of the same step
 * (run.dir/outer_STEP/rank_R.safetensors, published atomically): what an
 * island needs besides its weights and AdamW state to resume. */
static int save_outer(island *is, int64_t step) {
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
        rc = loco_outer_save_file(is->outer, file, is->committed, is->q.epoch, step);
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
    const int64_t step = loco_trainer_steps_done(is->t);
    char file[PATH_MAX + 64];
    snprintf(file, sizeof file, "%s/outer_%08lld/rank_%05d.safetensors", is->cfg.run.dir,
             (long long)step, is->rank);
    int64_t committed = 0, inner = 0;
    uint64_t epoch = 0;
    int rc = loco_outer_load_file(is->outer, file, &committed, &epoch, &inner);
    int bad = rc < 0 || inner != step;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad) {
        if (is->rank == 0)
            loco_warn("resume: no usable outer state for step %lld (%s); this island fetches "
                      "θ_global from the others",
                      (long long)step, rc < 0 ? loco_errmsg() : "another step");
        is->committed = 0;
        return 0;
    }
    is->committed = committed;
    LOCO_CHECK(island_hash(is, &is->committed_hash));
    if (is->rank == 0)
        loco_info("resume: outer state of outer step %lld (inner step %lld) loaded",
                  (long long)committed, (long long)step);
    return 0;
}

/* Rank 0 reads the coordinator; its verdict reaches every rank. */
static int check_coordinator(island *is) {
    int ok = is->rank == 0 ? loco_session_poll(is->session) : 0;
    int bad = ok < 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad)
        return is->rank == 0 ? ok : LOCO_ERR(LOCO_EPEER, "the coordinator stopped the run");
    return 0;
}

/* The auto choice from link figures every rank of every island shares. */
static int decide(island *is, double rtt, double bw, bool announce) {
    double v[2] = {rtt, -bw};
    /* Peers agreed per rank index; the island agrees across its ranks. */
    LOCO_CHECK(loco_comm_allreduce(is->world, v, 2, LOCO_DT_F64, LOCO_OP_MAX));
    rtt = v[0];
    bw = isfinite(v[1]) && v[1] < 0 ? -v[1] : 1e12;
    const loco_codec_params *cp = loco_codec_get_params(loco_outer_codec(is->outer));
    double bytes = (double)loco_quant_payload_bytes(cp->codec, (size_t)is->elems_max, cp->block);
    size_t chunks = loco_compress_chunk_count((size_t)is->elems_max, cp);
    char why[320];
    loco_exchange_algo a = loco_exchange_choose(is->K, chunks, bytes, rtt, bw, why, sizeof why);
    if (is->rank == 0 && (announce || a != is->algo))
        loco_info("outer: %s (auto: %s)",
                  a == LOCO_EXCHANGE_RSAG ? "reduce-scatter + all-gather" : "all-gather", why);
    is->algo = a;
    return 0;
}

/* outer.algorithm, or for auto the faster one for this run's islands,
 * shard size and links (net.rtt_ms / net.link_gbps where given, else
 * measured now and after every outer step); every rank of every island
 * reaches the same choice. */
static int choose_algorithm(island *is, size_t n) {
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
    is->elems_max = (double)n;
    LOCO_CHECK(loco_comm_allreduce(is->world, &is->elems_max, 1, LOCO_DT_F64, LOCO_OP_MAX));
    is->rtt_s = c->net.rtt_ms / 1e3;
    is->bytes_per_s = c->net.link_gbps * 1e9 / 8;
    is->measure = is->rtt_s <= 0 || is->bytes_per_s <= 0;
    if (is->measure) {
        LOCO_CHECK(ensure_links(is, is->q.members));
        loco_exchange x = {.n_islands = is->K, .me = is->id, .peers = is->links,
                           .epoch = is->q.epoch, .shard = (uint32_t)is->rank,
                           .timeout_ms = (int)c->faulttol.timeout_ms};
        double mrtt, mbw;
        LOCO_CHECK(loco_exchange_probe(&x, 1u << 20, &mrtt, &mbw));
        if (is->rtt_s <= 0)
            is->rtt_s = mrtt;
        if (is->bytes_per_s <= 0)
            is->bytes_per_s = isfinite(mbw) ? mbw : 1e12;
    }
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

static int run_island(island *is, const char *resume) {
    const loco_config *c = &is->cfg;
    LOCO_CHECK(loco_site_id(c, is->site, &is->id, &is->K));
    LOCO_CHECK(loco_faults_parse(&is->f, c, is->site, is->id, is->rank == 0));
    LOCO_CHECK(loco_net_params_from_config(&is->np, c));
    snprintf(is->np.name, sizeof is->np.name, "%s", is->site);
    LOCO_CHECK(loco_trainer_create_island(&is->t, c, resume, is->id, is->K));
    is->world = loco_trainer_world(is->t);
    is->rank = loco_comm_rank(is->world);
    is->ranks = loco_comm_size(is->world);
    if (is->ranks > LOCO_MAX_ISLAND_RANKS)
        return LOCO_ERR(LOCO_EINVAL, "%d ranks, at most %d", is->ranks, LOCO_MAX_ISLAND_RANKS);
    loco_outer_params op;
    loco_codec_params cp;
    LOCO_CHECK(loco_outer_params_from_config(&op, c));
    LOCO_CHECK(loco_codec_params_from_config(&cp, c));
    if (cp.link_gbps <= 0)
        cp.link_gbps = c->net.link_gbps; /* the link as the config describes it, if at all */
    size_t lo, hi;
    float *own = loco_trainer_owned_params(is->t, &lo, &hi);
    if (!own)
        return LOCO_ERR(LOCO_EIO, "island: the parameters are not readable: %s", loco_errmsg());
    LOCO_CHECK(loco_outer_create(&is->outer, &op, &cp, hi - lo, own));
    LOCO_CHECK(island_hash(is, &is->committed_hash));
    if (resume)
        LOCO_CHECK(load_outer(is));
    LOCO_CHECK(loco_peers_create(&is->svc, &is->np, c->faulttol.listen_host, is->outer,
                                 (int)c->faulttol.timeout_ms));
    loco_peers_publish(is->svc, is->committed, loco_trainer_steps_done(is->t));
    LOCO_CHECK(join(is));
    bool finished = false;
    if (!loco_quorum_has(is->q.members, is->id) || is->q.join) {
        loco_info("island %d (%s): the run is under way; rejoining", is->id, is->site);
        LOCO_CHECK(rejoin(is, &finished));
    } else {
        LOCO_CHECK(choose_algorithm(is, hi - lo));
    }
    loco_info("island %d (%s) of %d: outer step every %lld steps (%s)", is->id, is->site, is->K,
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
    LOCO_CHECK(loco_trainer_begin_run(is->t));
    if (is->rank == 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/outer.jsonl", c->run.dir);
        LOCO_CHECK(loco_metrics_open(&is->metrics, path, true));
    }
    while (!finished && loco_trainer_steps_done(is->t) < c->train.steps) {
        loco_step_stats s;
        double t0 = loco_now();
        LOCO_CHECK(loco_trainer_step(is->t, &s));
        is->step_s = loco_now() - t0;
        loco_faults_inject(&is->f, s.step, is->step_s, is->links, &is->q);
        LOCO_CHECK(check_coordinator(is));
        bool last = s.step == c->train.steps;
        if (s.step % c->outer.H == 0 || last) {
            int64_t outer = (s.step + c->outer.H - 1) / c->outer.H;
            LOCO_CHECK(outer_step(is, outer, s.step, &finished));
        } else if (is->rank == 0) {
            loco_session_heartbeat(is->session, s.step);
        }
        LOCO_CHECK(loco_trainer_after_step(is->t, &s));
        /* With each inner checkpoint, the outer state of the same step. */
        if ((c->run.ckpt_every > 0 && s.step % c->run.ckpt_every == 0) || last)
            LOCO_CHECK(save_outer(is, s.step));
    }
    /* The coordinator's final word: every member's last θ_global agreed. */
    int rc = is->rank == 0 ? loco_session_leave(is->session, (int)c->faulttol.timeout_ms) : 0;
    int bad = rc < 0;
    LOCO_CHECK(loco_comm_allreduce(is->world, &bad, 1, LOCO_DT_I32, LOCO_OP_MAX));
    if (bad)
        return rc < 0 ? rc : LOCO_ERR(LOCO_EPEER, "the coordinator did not confirm the run");
    if (is->rank == 0)
        loco_info("island %s: done; the coordinator confirmed that every island agrees", is->site);
    return 0;
}

int cli_island(int argc, char **argv) {
    const char *config = NULL, *resume = NULL, *site = NULL;
    char *sets[MAX_SETS];
    int nsets = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < MAX_SETS)
            sets[nsets++] = argv[++i];
        else if (!strcmp(argv[i], "--site") && i + 1 < argc)
            site = argv[++i];
        else if (!strcmp(argv[i], "--resume") && i + 1 < argc)
            resume = argv[++i];
        else if (argv[i][0] != '-' && !config)
            config = argv[i];
        else {
            fprintf(stderr, "loco island: unexpected argument: %s\n", argv[i]);
            return CLI_USAGE;
        }
    }
    if (!config || !site) {
        fprintf(stderr, "loco island: expected CONFIG and --site NAME\n");
        return CLI_USAGE;
    }
    island is = {.site = site};
    int rc = cli_load_config(&is.cfg, config, nsets, sets);
    if (rc == 0)
        rc = run_island(&is, resume);
    if (rc < 0) {
        cli_fail(rc);
        /* A failed rank must not leave the others waiting in a collective. */
        if (is.world && loco_comm_size(is.world) > 1)
            loco_comm_abort(is.world, CLI_FAIL);
    }
    island_fini(&is);
    return rc < 0 ? CLI_FAIL : CLI_OK;
}
