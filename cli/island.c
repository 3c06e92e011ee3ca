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

#define MAX_SETS 256

typedef struct {
    loco_config cfg;
    const char *site;
    int id, K;
    loco_trainer *t;
    loco_comm *world;
    int rank, ranks;
    loco_net_params np;
    loco_net_listener *listener;
    loco_session *session;     /* rank 0 only */
    loco_quorum q;
    loco_link *peers[LOCO_MAX_PEERS];
    loco_outer *outer;
    loco_exchange_algo algo;
    bool auto_algo, measure;    /* outer.algorithm = auto; links measured, not configured */
    double rtt_s, bytes_per_s;  /* this rank's estimate of its links */
    double elems_max;           /* largest owned range of the island */
    loco_metrics *metrics;     /* rank 0: outer-step records */
} island;

static void island_fini(island *is) {
    for (int k = 0; k < LOCO_MAX_PEERS; k++)
        loco_link_destroy(is->peers[k]);
    loco_outer_destroy(is->outer);
    loco_session_destroy(is->session);
    loco_net_listener_destroy(is->listener);
    loco_quorum_fini(&is->q);
    loco_metrics_close(is->metrics);
    loco_trainer_destroy(is->t);
}

static int rechoose(island *is, const loco_exchange_stats *st);

/* Every rank learns the peer-listener address of every rank. */
static int gather_addrs(island *is, char (*addrs)[LOCO_ADDR_MAX]) {
    char mine[LOCO_ADDR_MAX] = {0};
    snprintf(mine, sizeof mine, "%.80s:%d", is->cfg.faulttol.listen_host,
             loco_net_listener_port(is->listener));
    size_t counts[LOCO_MAX_ISLAND_RANKS];
    for (int r = 0; r < is->ranks; r++)
        counts[r] = LOCO_ADDR_MAX;
    return loco_comm_allgather(is->world, mine, addrs, counts, LOCO_DT_U8);
}

/* Rank 0 registers; the quorum reaches every rank as JSON. */
static int join(island *is) {
    char (*addrs)[LOCO_ADDR_MAX] = loco_alloc((size_t)is->ranks * LOCO_ADDR_MAX);
    if (!addrs)
        return LOCO_ERR(LOCO_ENOMEM, "addresses");
    int rc = gather_addrs(is, addrs);
    char *json = NULL;
    int64_t len = 0;
    if (rc == 0 && is->rank == 0) {
        char mesh[160];
        snprintf(mesh, sizeof mesh, "dp=%lld tp=%lld pp=%lld cp=%lld ep=%lld zero=%lld",
                 (long long)is->cfg.parallel.dp, (long long)is->cfg.parallel.tp,
                 (long long)is->cfg.parallel.pp, (long long)is->cfg.parallel.cp,
                 (long long)is->cfg.parallel.ep, (long long)is->cfg.parallel.zero_stage);
        static const char *const agree[] = {"model", "outer", "compress", NULL};
        loco_island_info me = {.site = is->site, .n_ranks = is->ranks,
                               .addrs = (const char (*)[LOCO_ADDR_MAX])addrs, .mesh = mesh,
                               .model_hash = loco_config_hash(&is->cfg, agree)};
        int id;
        rc = loco_session_join(&is->session, &is->cfg, &is->np, &me, &id, &is->q,
                               (int)is->cfg.faulttol.timeout_ms);
        if (rc == 0 && id != is->id)
            rc = LOCO_ERR(LOCO_EPROTO, "coordinator calls %s island %d, outer.sites says %d",
                          is->site, id, is->id);
        if (rc == 0) {
            json = loco_quorum_to_json(&is->q);
            len = json ? (int64_t)strlen(json) + 1 : 0;
        }
    }
    loco_free(addrs);
    /* Rank 0's outcome travels with the length: 0 = failed. */
    int rc2 = loco_comm_broadcast(is->world, &len, 1, LOCO_DT_I64, 0);
    if (rc < 0 || rc2 < 0) {
        free(json);
        return rc < 0 ? rc : rc2;
    }
    if (len <= 0)
        return LOCO_ERR(LOCO_EPEER, "island rank 0 could not join the run");
    if (is->rank != 0) {
        json = malloc((size_t)len);
        if (!json)
            return LOCO_ERR(LOCO_ENOMEM, "quorum");
    }
    rc = loco_comm_broadcast(is->world, json, (size_t)len, LOCO_DT_U8, 0);
    if (rc == 0 && is->rank != 0)
        rc = loco_quorum_from_json(&is->q, json, (size_t)len - 1);
    free(json);
    LOCO_CHECK(rc);
    if (is->q.n != is->K)
        return LOCO_ERR(LOCO_EPROTO, "quorum of %d islands, outer.sites lists %d", is->q.n, is->K);
    for (int k = 0; k < is->K; k++)
        if (is->q.m[k].n_ranks != is->ranks)
            return LOCO_ERR(LOCO_EPROTO, "island %s has %d ranks, this one %d", is->q.m[k].site,
                            is->q.m[k].n_ranks, is->ranks);
    return 0;
}

/* Rank r links to rank r of every other island: it connects to the islands
 * above it and accepts those below. */
static int connect_peers(island *is) {
    for (int k = is->id + 1; k < is->K; k++) {
        char host[LOCO_ADDR_MAX];
        int port;
        LOCO_CHECK(loco_parse_hostport(is->q.m[k].addrs[is->rank], host, sizeof host, &port));
        loco_net_params p = is->np;
        if (p.backend == LOCO_NET_TLS)
            snprintf(p.expect_peer, sizeof p.expect_peer, "%s", is->q.m[k].site);
        LOCO_CHECK(loco_net_connect(&is->peers[k], &p, host, port, -1));
    }
    for (int n = 0; n < is->id; n++) {
        loco_link *l;
        LOCO_CHECK(loco_net_accept(is->listener, &l, (int)is->cfg.faulttol.timeout_ms));
        int from = -1;
        for (int k = 0; k < is->id; k++)
            if (!strcmp(loco_link_peer_name(l), is->q.m[k].site) && !is->peers[k])
                from = k;
        if (from < 0) {
            int rc = LOCO_ERR(LOCO_EAUTH, "a peer link from '%s', which is no island below %s",
                              loco_link_peer_name(l), is->site);
            loco_link_destroy(l);
            return rc;
        }
        is->peers[from] = l;
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

static int outer_step(island *is, int64_t outer, int64_t inner) {
    size_t lo, hi;
    float *own = loco_trainer_owned_params(is->t, &lo, &hi);
    loco_exchange x = {.n_islands = is->K, .me = is->id, .peers = is->peers,
                       .epoch = is->q.epoch, .shard = (uint32_t)is->rank,
                       .max_frame = (size_t)is->cfg.net.max_frame_mb << 20,
                       .timeout_ms = (int)is->cfg.faulttol.timeout_ms,
                       .est_rtt_s = is->rtt_s, .est_bytes_per_s = is->bytes_per_s};
    loco_exchange_stats st;
    if (is->algo == LOCO_EXCHANGE_RSAG)
        LOCO_CHECK(loco_outer_step_rsag(is->outer, &x, own, outer, &st));
    else
        LOCO_CHECK(loco_outer_step_allgather(is->outer, &x, own, outer, &st));
    LOCO_CHECK(loco_trainer_sync_params(is->t));
    LOCO_CHECK(rechoose(is, &st));
    uint64_t h;
    LOCO_CHECK(island_hash(is, &h));
    /* Island totals of the bytes, for the metrics. */
    double sums[4] = {(double)st.raw_bytes * (is->K - 1), (double)st.bytes_sent,
                      (double)st.bytes_received, st.exchange_s};
    LOCO_CHECK(loco_comm_allreduce(is->world, sums, 3, LOCO_DT_F64, LOCO_OP_SUM));
    LOCO_CHECK(loco_comm_allreduce(is->world, sums + 3, 1, LOCO_DT_F64, LOCO_OP_MAX));
    if (is->rank == 0) {
        LOCO_CHECK(loco_session_heartbeat(is->session, inner, outer, h));
        char hh[17];
        loco_hash_hex(h, hh);
        loco_info("outer step %lld (inner %lld) | sent %.2f MB for %.2f MB raw (x%.1f) | "
                  "exchange %.3f s | θ %s",
                  (long long)outer, (long long)inner, sums[1] / 1e6, sums[0] / 1e6,
                  sums[1] > 0 ? sums[0] / sums[1] : 0.0, sums[3], hh);
        loco_metrics_begin(is->metrics);
        loco_metrics_int(is->metrics, "outer_step", outer);
        loco_metrics_int(is->metrics, "step", inner);
        loco_metrics_num(is->metrics, "bytes_raw", sums[0]);
        loco_metrics_num(is->metrics, "bytes_sent", sums[1]);
        loco_metrics_num(is->metrics, "bytes_received", sums[2]);
        loco_metrics_num(is->metrics, "compression_ratio", sums[1] > 0 ? sums[0] / sums[1] : 0);
        loco_metrics_num(is->metrics, "exchange_s", sums[3]);
        loco_metrics_num(is->metrics, "inner_wait_s", sums[3] + st.encode_s + st.apply_s);
        loco_metrics_str(is->metrics, "theta_hash", hh);
        loco_metrics_str(is->metrics, "algorithm",
                         is->algo == LOCO_EXCHANGE_RSAG ? "rsag" : "allgather");
        LOCO_CHECK(loco_metrics_end(is->metrics));
    }
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
        loco_exchange x = {.n_islands = is->K, .me = is->id, .peers = is->peers,
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
    LOCO_CHECK(loco_net_params_from_config(&is->np, c));
    snprintf(is->np.name, sizeof is->np.name, "%s", is->site);
    LOCO_CHECK(loco_trainer_create_island(&is->t, c, resume, is->id, is->K));
    is->world = loco_trainer_world(is->t);
    is->rank = loco_comm_rank(is->world);
    is->ranks = loco_comm_size(is->world);
    if (is->ranks > LOCO_MAX_ISLAND_RANKS)
        return LOCO_ERR(LOCO_EINVAL, "%d ranks, at most %d", is->ranks, LOCO_MAX_ISLAND_RANKS);
    LOCO_CHECK(loco_net_listen(&is->listener, &is->np, c->faulttol.listen_host, 0));
    LOCO_CHECK(join(is));
    LOCO_CHECK(connect_peers(is));
    loco_info("island %d (%s) of %d: linked to its peers; outer step every %lld steps (%s)",
              is->id, is->site, is->K, (long long)c->outer.H, c->outer.optimizer);
    loco_outer_params op;
    loco_codec_params cp;
    LOCO_CHECK(loco_outer_params_from_config(&op, c));
    LOCO_CHECK(loco_codec_params_from_config(&cp, c));
    size_t lo, hi;
    float *own = loco_trainer_owned_params(is->t, &lo, &hi);
    LOCO_CHECK(loco_outer_create(&is->outer, &op, &cp, hi - lo, own));
    LOCO_CHECK(choose_algorithm(is, hi - lo));
    LOCO_CHECK(loco_trainer_begin_run(is->t));
    if (is->rank == 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/outer.jsonl", c->run.dir);
        LOCO_CHECK(loco_metrics_open(&is->metrics, path, loco_trainer_steps_done(is->t) > 0));
    }
    while (loco_trainer_steps_done(is->t) < c->train.steps) {
        loco_step_stats s;
        LOCO_CHECK(loco_trainer_step(is->t, &s));
        bool last = s.step == c->train.steps;
        if (s.step % c->outer.H == 0 || last) {
            LOCO_CHECK(check_coordinator(is));
            LOCO_CHECK(outer_step(is, (s.step + c->outer.H - 1) / c->outer.H, s.step));
        } else if (is->rank == 0) {
            LOCO_CHECK(loco_session_heartbeat(is->session, s.step, 0, 0));
        }
        LOCO_CHECK(loco_trainer_after_step(is->t, &s));
    }
    /* The coordinator's final word: every island's last θ_global agreed. */
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
    /* Checkpoints hold the inner state only; an island resumed from one
     * would restart its outer momentum and error feedback and drift from
     * the others. Refuse rather than diverge. */
    if (rc == 0 && resume)
        rc = LOCO_ERR(LOCO_ENOTSUP,
                      "loco island --resume: checkpoints do not hold the outer state (θ_global, "
                      "momentum, error feedback) yet; restart the run, or use the checkpoint with "
                      "loco train / eval / ckpt export");
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
