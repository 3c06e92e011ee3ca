/* The coordinator: registration, quorum epochs, the go and the commit of
 * every outer step, failure detection and rejoins. One thread polls the
 * listener and every link; the messages are small.
 *
 * Per outer step s (= committed + 1): every member says READY(s); the
 * coordinator answers GO (a QUORUM with outer_step s: members, and the
 * rejoining islands that observe this step); each island exchanges and
 * says DONE (with its θ_global hash) or FAILED (with the islands it
 * suspects); all DONE with equal hashes is a COMMIT. A member lost or
 * dropped, or a failed exchange, bumps the epoch and announces it (QUORUM
 * with outer_step 0): the survivors say READY again and redo the step from
 * the pseudo-gradient they kept. The coordinator holds nothing the islands
 * cannot tell it again: a restarted one rebuilds the run from their
 * registrations (docs/PROTOCOL.md). */
#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Frames read from one island per round of the loop. */
#define POLL_FRAMES 16

typedef enum { ABSENT = 0, MEMBER, OUT } island_status;

typedef struct {
    loco_link *link;
    island_status status;
    uint64_t inc;
    bool bye;
    int n_ranks;
    char (*addrs)[LOCO_ADDR_MAX];
    loco_phi_detector phi; /* over its frame arrivals */
    loco_island_progress reg; /* what it said when it registered */
    int64_t ready_step, ready_have;
    int64_t done_step;
    uint64_t done_epoch, done_hash, suspects;
    bool done_ok;
    double join_sent;  /* when it was last told to fetch the state (0: not) */
    bool hold_spent;   /* the members already waited once for its transfer */
} island;

/* A connection that has not registered (yet). */
typedef struct {
    loco_link *link;
    double since; /* accepted, or refused (closing) */
    bool closing; /* refused and told why: waits for the peer to hang up */
} pending_link;

struct loco_coord {
    loco_config cfg;
    loco_net_params np;
    loco_net_listener *listener;
    int n; /* islands expected (outer.sites) */
    char sites[LOCO_MAX_ISLANDS][LOCO_NET_NAME_MAX];
    island isl[LOCO_MAX_ISLANDS]; /* by id */
    pending_link pending[LOCO_NET_MAX_PENDING]; /* np.max_pending used */
    /* The mesh and model every island must match: the first registration's. */
    bool have_ref;
    char ref_mesh[160];
    int ref_ranks;
    uint64_t ref_model;
    bool started;
    double first_reg; /* a restarted coordinator waits for the others from here */
    uint64_t epoch;
    int64_t committed;
    uint64_t committed_hash;
    bool exchanging;        /* GO sent for committed + 1, verdicts pending */
    uint64_t go_members, go_observers;
    double gather_t0;       /* first member ready for the step (straggler clock) */
    int failures;           /* failed attempts of the current step */
    char events[LOCO_PATH_MAX]; /* the run's timeline, "" = none */
};

/* ----------------------------------------------------------- events */

static void event(loco_coord *c, const char *fmt, ...) {
    if (!c->events[0])
        return;
    char body[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    if (loco_event_append(c->events, "%s", body) < 0)
        loco_warn("coordinator: %s", loco_errmsg());
}

static void mask_sites(const loco_coord *c, uint64_t mask, char *out, size_t cap) {
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < c->n && o + 70 < cap; i++)
        if (loco_quorum_has(mask, i))
            o += (size_t)snprintf(out + o, cap - o, "%s\"%s\"", o ? "," : "", c->sites[i]);
}

static uint64_t members(const loco_coord *c) {
    uint64_t m = 0;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].status == MEMBER)
            m |= 1ull << i;
    return m;
}

/* ------------------------------------------------------------- sending */

static int send_json(loco_link *l, int type, uint64_t epoch, const char *json) {
    loco_frame_hdr h = {.type = (uint16_t)type, .epoch = epoch};
    return loco_link_send(l, &h, json, json ? strlen(json) : 0);
}

static void send_error(loco_link *l, const char *text) {
    loco_frame_hdr h = {.type = LOCO_FRAME_ERROR};
    if (loco_link_send(l, &h, text, strlen(text)) == 0)
        loco_link_flush(l, 2000);
}

static char *quorum_json(loco_coord *c, int64_t outer_step, bool join, uint64_t mem,
                         uint64_t obs) {
    loco_quorum q = {.epoch = c->epoch, .outer_step = outer_step, .committed = c->committed,
                     .committed_hash = c->committed_hash, .join = join, .n = c->n,
                     .members = mem, .observers = obs};
    for (int i = 0; i < c->n; i++) {
        q.m[i].id = i;
        snprintf(q.m[i].site, sizeof q.m[i].site, "%s", c->sites[i]);
        if (c->isl[i].link) {
            q.m[i].n_ranks = c->isl[i].n_ranks;
            q.m[i].addrs = c->isl[i].addrs;
        }
    }
    return loco_quorum_to_json(&q);
}

/* Sends a QUORUM to every island of mask `to`; a failed send is noticed
 * when the link is next read. */
static int announce(loco_coord *c, uint64_t to, int64_t outer_step, uint64_t mem, uint64_t obs) {
    char *json = quorum_json(c, outer_step, false, mem, obs);
    if (!json)
        return LOCO_ERR(LOCO_ENOMEM, "quorum");
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(to, i) && c->isl[i].link)
            send_json(c->isl[i].link, LOCO_FRAME_QUORUM, c->epoch, json);
    free(json);
    return 0;
}

/* Tells island i it is outside the quorum: fetch the committed state from
 * a member, then say ready. */
static int send_join(loco_coord *c, int i) {
    char *json = quorum_json(c, 0, true, members(c), 0);
    if (!json)
        return LOCO_ERR(LOCO_ENOMEM, "quorum");
    if (c->isl[i].link) {
        send_json(c->isl[i].link, LOCO_FRAME_QUORUM, c->epoch, json);
        c->isl[i].join_sent = loco_now();
    }
    free(json);
    return 0;
}

/* An island fetching the state should enter at the next step, not chase
 * the members: the go waits for its transfer once (at most
 * faulttol.timeout_ms), then goes without it. */
static bool hold_for_joiners(loco_coord *c, int64_t s) {
    bool hold = false;
    for (int i = 0; i < c->n; i++) {
        island *is = &c->isl[i];
        if (is->status != OUT || !is->link || !is->join_sent || is->hold_spent)
            continue;
        if (is->ready_step == s && is->ready_have == c->committed)
            continue; /* ready: it observes this step */
        if (loco_now() - is->join_sent < c->cfg.faulttol.timeout_ms / 1e3)
            hold = true;
        else
            is->hold_spent = true;
    }
    return hold;
}

/* A membership change: a new epoch, announced to everyone in the run. */
static int new_epoch(loco_coord *c, const char *why) {
    c->epoch++;
    uint64_t m = members(c);
    char list[LOCO_MAX_ISLANDS * 72];
    mask_sites(c, m, list, sizeof list);
    loco_info("coordinator: quorum epoch %llu: %d islands (%s)", (unsigned long long)c->epoch,
              __builtin_popcountll(m), why);
    event(c, "\"kind\":\"quorum\",\"epoch\":%llu,\"members\":[%s],\"outer_step\":%lld,\"why\":\"%s\"",
          (unsigned long long)c->epoch, list, (long long)(c->committed + 1), why);
    for (int i = 0; i < c->n; i++)
        c->isl[i].ready_step = 0; /* everyone says ready again */
    c->exchanging = false;
    c->gather_t0 = 0;
    uint64_t to = 0;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link)
            to |= 1ull << i;
    return announce(c, to, 0, m, 0);
}

/* Stops the run: every live island hears why. */
static int fail_run(loco_coord *c, const char *why) {
    loco_error("coordinator: stopping the run: %s", why);
    event(c, "\"kind\":\"end\",\"status\":\"failed\",\"reason\":\"%s\"", why);
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link)
            send_error(c->isl[i].link, why);
    return LOCO_ERR(LOCO_EPEER, "%s", why);
}

/* ------------------------------------------------------------ lifecycle */

int loco_coord_create(loco_coord **out, const loco_config *cfg, const loco_net_params *np,
                      const char *host, int port, const char *events_path) {
    *out = NULL;
    loco_coord *c = loco_alloc(sizeof *c);
    if (!c)
        return LOCO_ERR(LOCO_ENOMEM, "coordinator");
    int rc;
    c->cfg = *cfg;
    c->np = *np;
    /* Islands send small JSON: a peer claiming more is refused at the
     * header, and what a link may hold follows from that. */
    c->np.recv_max_bytes =
        LOCO_COORD_MAX_FRAME < np->max_frame_bytes ? LOCO_COORD_MAX_FRAME : np->max_frame_bytes;
    c->np.link_buffer_bytes = 0;
    c->np.max_streams = LOCO_COORD_MAX_STREAMS;
    c->np.streams = 1; /* it never connects; a listener takes as many as it would open */
    LOCO_CHECK_GOTO(loco_site_id(cfg, NULL, NULL, &c->n), out_fail);
    const char *p = cfg->outer.sites;
    for (int i = 0; i < c->n; i++) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= LOCO_NET_NAME_MAX) {
            rc = LOCO_ERR(LOCO_EINVAL, "outer.sites: site %d has a bad name", i);
            goto out_fail;
        }
        memcpy(c->sites[i], p, len);
        c->sites[i][len] = '\0';
        p = comma ? comma + 1 : p + len;
    }
    if (events_path) {
        FILE *f = fopen(events_path, "a"); /* refuse an unwritable path now */
        if (!f) {
            rc = LOCO_ERR(LOCO_EIO, "cannot open %s for events", events_path);
            goto out_fail;
        }
        fclose(f);
        snprintf(c->events, sizeof c->events, "%s", events_path);
    }
    char h[LOCO_ADDR_MAX];
    int prt;
    if (host) {
        snprintf(h, sizeof h, "%s", host);
        prt = port;
    } else {
        LOCO_CHECK_GOTO(loco_parse_hostport(cfg->faulttol.coordinator, h, sizeof h, &prt),
                        out_fail);
    }
    LOCO_CHECK_GOTO(loco_net_listen(&c->listener, &c->np, h, prt), out_fail);
    loco_info("coordinator: listening on %s:%d for %d islands (%s)", h,
              loco_net_listener_port(c->listener), c->n, cfg->outer.sites);
    *out = c;
    return 0;
out_fail:
    loco_coord_destroy(c);
    return rc;
}

int loco_coord_port(const loco_coord *c) { return loco_net_listener_port(c->listener); }

static void drop_island(island *is) {
    loco_link_destroy(is->link);
    is->link = NULL;
    loco_free(is->addrs);
    is->addrs = NULL;
    loco_phi_fini(&is->phi);
    is->status = ABSENT;
    is->ready_step = is->done_step = 0;
    is->bye = false;
    is->join_sent = 0;
    is->hold_spent = false;
}

void loco_coord_destroy(loco_coord *c) {
    if (!c)
        return;
    for (int i = 0; i < LOCO_NET_MAX_PENDING; i++)
        loco_link_destroy(c->pending[i].link);
    for (int i = 0; i < LOCO_MAX_ISLANDS; i++)
        drop_island(&c->isl[i]);
    loco_net_listener_destroy(c->listener);
    loco_free(c);
}

/* ------------------------------------------------------- the step state */

static int try_commit(loco_coord *c);

/* Every member is gone: which state the run is in is for the islands to
 * say again. Start over as a restarted coordinator would: drop every link
 * (the islands register again with what they hold) and resume at the
 * newest committed step they report. */
static void restart_run(loco_coord *c) {
    loco_warn("coordinator: every island of the quorum is gone; waiting for the islands to "
              "register again");
    for (int i = 0; i < c->n; i++) {
        loco_link_abort(c->isl[i].link);
        drop_island(&c->isl[i]);
    }
    c->started = false;
    c->exchanging = false;
    c->first_reg = 0;
    c->failures = 0;
    c->gather_t0 = 0;
    c->go_members = c->go_observers = 0;
}

/* Island i is gone (link closed, silent, or replaced by a restarted
 * process). A member leaving starts a new epoch, unless every remaining
 * member already finished the step (then it commits without it). < 0 only
 * when the run must stop (a commit that found differing hashes). */
static int island_lost(loco_coord *c, int i, const char *reason) {
    island *is = &c->isl[i];
    bool was_member = is->status == MEMBER;
    loco_warn("coordinator: island %d (%s) is out: %s", i, c->sites[i], reason);
    event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"%s\"", c->sites[i], reason);
    loco_link_abort(is->link); /* a peer not worth waiting for */
    drop_island(is);
    if (!was_member || !c->started)
        return 0;
    if (!members(c)) {
        restart_run(c);
        return 0;
    }
    if (c->exchanging) {
        /* Everyone else may have finished with its contribution already. */
        c->go_members &= ~(1ull << i);
        c->go_observers &= ~(1ull << i);
        LOCO_CHECK(try_commit(c));
    }
    return new_epoch(c, "an island left");
}

/* Commits when every member and observer of the go reported DONE for it;
 * 1 when committed, 0 when still waiting, < 0 when the run must stop. */
static int try_commit(loco_coord *c) {
    const int64_t s = c->committed + 1;
    uint64_t h = 0;
    int first = -1;
    for (int i = 0; i < c->n; i++) {
        if (!loco_quorum_has(c->go_members, i))
            continue;
        const island *is = &c->isl[i];
        if (is->done_step != s || is->done_epoch != c->epoch || !is->done_ok)
            return 0;
        if (first < 0) {
            first = i;
            h = is->done_hash;
        } else if (is->done_hash != h) {
            char why[512];
            snprintf(why, sizeof why,
                     "θ_global differs after outer step %lld: %s has %016llx, %s has %016llx",
                     (long long)s, c->sites[first], (unsigned long long)h, c->sites[i],
                     (unsigned long long)is->done_hash);
            event(c, "\"kind\":\"divergence\",\"outer_step\":%lld,\"detail\":\"%s\"", (long long)s,
                  why);
            return fail_run(c, why);
        }
    }
    if (first < 0)
        return 0;
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(c->go_observers, i)) {
            const island *is = &c->isl[i];
            if (is->done_step != s || is->done_epoch != c->epoch)
                return 0;
        }
    c->committed = s;
    c->committed_hash = h;
    c->exchanging = false;
    c->failures = 0;
    c->gather_t0 = 0;
    char json[160], hh[17];
    loco_hash_hex(h, hh);
    snprintf(json, sizeof json, "{\"outer_step\":%lld,\"epoch\":%llu,\"hash\":\"%s\"}",
             (long long)s, (unsigned long long)c->epoch, hh);
    bool joined = false;
    for (int i = 0; i < c->n; i++) {
        island *is = &c->isl[i];
        if (!is->link)
            continue;
        if (loco_quorum_has(c->go_observers, i)) {
            if (is->done_ok && is->done_hash == h) {
                is->status = MEMBER; /* its hash check passed: it contributes next */
                is->join_sent = 0;
                is->hold_spent = false;
                joined = true;
                loco_info("coordinator: island %d (%s) rejoined at outer step %lld", i,
                          c->sites[i], (long long)s);
                event(c, "\"kind\":\"join\",\"site\":\"%s\",\"outer_step\":%lld", c->sites[i],
                      (long long)s);
            } else {
                loco_warn("coordinator: %s failed its first step after rejoining; it fetches "
                          "the state again",
                          c->sites[i]);
                send_join(c, i);
                continue;
            }
        }
        if (is->status == MEMBER)
            send_json(is->link, LOCO_FRAME_COMMIT, c->epoch, json);
        else if (is->status == OUT && is->ready_step == s) {
            /* Ready too late to observe this step: its state is old now. */
            is->ready_step = 0;
            send_join(c, i);
        }
    }
    char list[LOCO_MAX_ISLANDS * 72];
    mask_sites(c, members(c), list, sizeof list);
    event(c, "\"kind\":\"commit\",\"outer_step\":%lld,\"epoch\":%llu,\"hash\":\"%s\",\"members\":[%s]",
          (long long)s, (unsigned long long)c->epoch, hh, list);
    loco_debug("coordinator: outer step %lld committed (%s)", (long long)s, hh);
    if (joined)
        return new_epoch(c, "an island rejoined") < 0 ? -1 : 1;
    return 1;
}

/* Every member ready for the step: go (with the rejoining islands that
 * hold the committed state as observers). Stragglers past the deadline
 * leave the quorum when faulttol.straggler_policy = drop. */
static int try_go(loco_coord *c) {
    if (!c->started || c->exchanging)
        return 0;
    const int64_t s = c->committed + 1;
    uint64_t mem = members(c), ready = 0;
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(mem, i) && c->isl[i].ready_step == s)
            ready |= 1ull << i;
    if (!ready)
        return 0;
    if (!c->gather_t0)
        c->gather_t0 = loco_now();
    if (ready != mem) {
        if (strcmp(c->cfg.faulttol.straggler_policy, "drop") ||
            loco_now() - c->gather_t0 < c->cfg.faulttol.straggler_ms / 1e3)
            return 0;
        for (int i = 0; i < c->n; i++)
            if (loco_quorum_has(mem & ~ready, i)) {
                c->isl[i].status = OUT;
                loco_warn("coordinator: %s is not ready for outer step %lld after %lld ms: left "
                          "out of this step (it catches up through a state transfer)",
                          c->sites[i], (long long)s, (long long)c->cfg.faulttol.straggler_ms);
                event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"straggler\"",
                      c->sites[i]);
            }
        uint64_t keep = ready;
        LOCO_CHECK(new_epoch(c, "stragglers left out"));
        /* The ready ones stay ready: they need not say it again. */
        for (int i = 0; i < c->n; i++)
            if (loco_quorum_has(keep, i))
                c->isl[i].ready_step = s;
        mem = keep;
    }
    if (hold_for_joiners(c, s))
        return 0;
    uint64_t obs = 0;
    for (int i = 0; i < c->n; i++) {
        const island *is = &c->isl[i];
        if (is->status == OUT && is->link && is->ready_step == s &&
            is->ready_have == c->committed)
            obs |= 1ull << i;
    }
    if (obs) {
        c->epoch++;
        char list[LOCO_MAX_ISLANDS * 72];
        mask_sites(c, mem | obs, list, sizeof list);
        event(c, "\"kind\":\"quorum\",\"epoch\":%llu,\"members\":[%s],\"outer_step\":%lld,"
                 "\"why\":\"islands rejoin\"",
              (unsigned long long)c->epoch, list, (long long)s);
    }
    c->go_members = mem;
    c->go_observers = obs;
    c->exchanging = true;
    LOCO_CHECK(announce(c, mem | obs, s, mem, obs));
    return 0;
}

/* A JSON number in [lo, hi] (NaN and overflowing values refused). */
static bool num_in(const cJSON *j, double lo, double hi) {
    return cJSON_IsNumber(j) && j->valuedouble >= lo && j->valuedouble <= hi;
}

static int handle_outer(loco_coord *c, int i, const char *json, size_t len) {
    island *is = &c->isl[i];
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(j, "phase");
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    const cJSON *hv = cJSON_GetObjectItemCaseSensitive(j, "have");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "epoch");
    const cJSON *hh = cJSON_GetObjectItemCaseSensitive(j, "hash");
    const cJSON *su = cJSON_GetObjectItemCaseSensitive(j, "suspects");
    int rc = 0;
    if (!cJSON_IsString(ph) || !num_in(os, 0, 1e15) || !num_in(hv, 0, 1e15) ||
        !num_in(ep, 0, 1e15) || !cJSON_IsString(hh) || !cJSON_IsString(su)) {
        loco_warn("coordinator: malformed OUTER from %s: ignored", c->sites[i]);
        goto out;
    }
    const int64_t s = (int64_t)os->valuedouble;
    if (!strcmp(ph->valuestring, "ready")) {
        is->ready_step = s;
        is->ready_have = (int64_t)hv->valuedouble;
        /* Outside the quorum, or behind it: fetch the state first. */
        if (c->started && (is->status == OUT || s != c->committed + 1) &&
            (s != c->committed + 1 || is->ready_have != c->committed)) {
            is->status = OUT;
            is->ready_step = 0;
            rc = send_join(c, i);
        }
        goto out;
    }
    const uint64_t epoch = (uint64_t)ep->valuedouble;
    if (s != c->committed + 1 || epoch != c->epoch || !c->exchanging) {
        loco_debug("coordinator: stale %s from %s (step %lld epoch %llu)", ph->valuestring,
                   c->sites[i], (long long)s, (unsigned long long)epoch);
        goto out;
    }
    is->done_step = s;
    is->done_epoch = epoch;
    is->done_ok = !strcmp(ph->valuestring, "done");
    is->done_hash = strtoull(hh->valuestring, NULL, 16);
    is->suspects = strtoull(su->valuestring, NULL, 16);
    if (is->done_ok) {
        rc = try_commit(c);
        goto out;
    }
    /* A failed exchange: retry with the same islands once (a dropped or
     * corrupted frame costs a link, not a member); when the same step fails
     * again, of two live islands that cannot reach each other the one with
     * the higher id leaves and rejoins later. */
    c->failures++;
    char why[256];
    snprintf(why, sizeof why, "exchange of outer step %lld failed at %s", (long long)s,
             c->sites[i]);
    event(c, "\"kind\":\"exchange_failed\",\"site\":\"%s\",\"outer_step\":%lld,\"attempt\":%d",
          c->sites[i], (long long)s, c->failures);
    if (c->failures >= 2) {
        for (int k = 0; k < c->n; k++)
            if (loco_quorum_has(is->suspects, k) && c->isl[k].status == MEMBER && k != i) {
                int out_id = k > i ? k : i;
                c->isl[out_id].status = OUT;
                char r[160];
                snprintf(r, sizeof r, "exchange failure between %s and %s", c->sites[i],
                         c->sites[k]);
                event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"%s\"",
                      c->sites[out_id], r);
                loco_warn("coordinator: %s leaves the quorum (%s)", c->sites[out_id], r);
                send_join(c, out_id);
                break;
            }
    }
    if (!members(c)) {
        restart_run(c);
        goto out;
    }
    rc = new_epoch(c, why);
out:
    cJSON_Delete(j);
    return rc < 0 ? rc : 0;
}

/* ----------------------------------------------------------- registering */

static int start_run(loco_coord *c);

/* A REGISTER from a pending link: 1 when it became an island (which owns l
 * now), 0 when it is refused (why_out says why), < 0 when the run must
 * stop. */
static int handle_register(loco_coord *c, loco_link *l, const char *json, size_t len,
                           char *why_out, size_t why_cap) {
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *site = cJSON_GetObjectItemCaseSensitive(j, "site");
    const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(j, "mesh");
    const cJSON *mh = cJSON_GetObjectItemCaseSensitive(j, "model_hash");
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(j, "inc");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(j, "ranks");
    const cJSON *jc = cJSON_GetObjectItemCaseSensitive(j, "committed");
    const cJSON *jh = cJSON_GetObjectItemCaseSensitive(j, "hash");
    const cJSON *je = cJSON_GetObjectItemCaseSensitive(j, "epoch");
    const cJSON *jp = cJSON_GetObjectItemCaseSensitive(j, "pending");
    const cJSON *jph = cJSON_GetObjectItemCaseSensitive(j, "pending_hash");
    char why[1024] = "";
    int id = -1;
    int nr = cJSON_GetArraySize(ranks);
    if (!cJSON_IsString(site) || !cJSON_IsString(mesh) || !cJSON_IsString(mh) ||
        !cJSON_IsString(inc) || !cJSON_IsArray(ranks) || nr < 1 || nr > LOCO_MAX_ISLAND_RANKS ||
        strlen(mesh->valuestring) >= sizeof c->ref_mesh || !num_in(jc, 0, 1e15) ||
        !cJSON_IsString(jh) || !num_in(je, 0, 1e15) || !num_in(jp, 0, 1e15) ||
        !cJSON_IsString(jph)) {
        snprintf(why, sizeof why, "malformed REGISTER");
        goto refuse;
    }
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->sites[i], site->valuestring))
            id = i;
    if (id < 0) {
        snprintf(why, sizeof why, "site '%.64s' is not in this run's outer.sites (%.300s)",
                 site->valuestring, c->cfg.outer.sites);
        goto refuse;
    }
    if (strcmp(loco_link_peer_name(l), site->valuestring)) {
        snprintf(why, sizeof why, "site '%.64s' registered with the certificate of '%.64s'",
                 site->valuestring, loco_link_peer_name(l));
        goto refuse;
    }
    uint64_t model_hash = strtoull(mh->valuestring, NULL, 16);
    if (c->have_ref) {
        if (strcmp(c->ref_mesh, mesh->valuestring) || c->ref_ranks != nr) {
            snprintf(why, sizeof why,
                     "mesh of '%.64s' (%.150s, %d ranks) differs from the run's (%.150s, %d "
                     "ranks); islands of one run need the same mesh",
                     site->valuestring, mesh->valuestring, nr, c->ref_mesh, c->ref_ranks);
            goto refuse;
        }
        if (c->ref_model != model_hash) {
            snprintf(why, sizeof why,
                     "'%.64s' has another [model]/[outer]/[compress] configuration than the "
                     "islands before it",
                     site->valuestring);
            goto refuse;
        }
    }
    island *is = &c->isl[id];
    const uint64_t their_inc = strtoull(inc->valuestring, NULL, 16);
    loco_island_progress reg = {.committed = (int64_t)jc->valuedouble,
                                .hash = strtoull(jh->valuestring, NULL, 16),
                                .epoch = (uint64_t)je->valuedouble,
                                .pending = (int64_t)jp->valuedouble,
                                .pending_hash = strtoull(jph->valuestring, NULL, 16)};
    if (is->link && is->inc == their_inc) {
        /* The same process lost its link and came back: keep its place. */
        loco_link_abort(is->link);
        loco_link_destroy(is->link);
        is->link = l;
        is->reg = reg;
        cJSON_Delete(j);
        char ack[64];
        snprintf(ack, sizeof ack, "{\"island_id\":%d}", id);
        send_json(l, LOCO_FRAME_ACK, c->epoch, ack);
        if (c->started) {
            char *q = quorum_json(c, 0, is->status != MEMBER, members(c), 0);
            if (q)
                send_json(l, LOCO_FRAME_QUORUM, c->epoch, q);
            free(q);
        }
        return 1;
    }
    char (*addrs)[LOCO_ADDR_MAX] = loco_alloc((size_t)nr * sizeof *addrs);
    loco_phi_detector phi = {0};
    const double beat = (double)c->cfg.faulttol.heartbeat_ms;
    if (!addrs ||
        loco_phi_init(&phi, 1000, beat / 4, (double)c->cfg.faulttol.phi_pause_ms, beat) < 0) {
        loco_free(addrs);
        snprintf(why, sizeof why, "the coordinator is out of memory");
        goto refuse;
    }
    for (int r = 0; r < nr; r++) {
        const cJSON *a = cJSON_GetArrayItem(ranks, r);
        snprintf(addrs[r], LOCO_ADDR_MAX, "%s", cJSON_IsString(a) ? a->valuestring : "");
    }
    if (is->link) {
        /* A new process for a site we still hold: the old one is dead. */
        int rc = island_lost(c, id, "restarted (a new process registered)");
        if (rc < 0) {
            loco_free(addrs);
            loco_phi_fini(&phi);
            cJSON_Delete(j);
            return rc;
        }
    }
    is->addrs = addrs;
    is->phi = phi;
    loco_phi_start(&is->phi, loco_now());
    is->link = l;
    is->inc = their_inc;
    is->n_ranks = nr;
    is->reg = reg;
    is->status = OUT;
    is->bye = false;
    if (!c->have_ref) {
        c->have_ref = true;
        snprintf(c->ref_mesh, sizeof c->ref_mesh, "%s", mesh->valuestring);
        c->ref_ranks = nr;
        c->ref_model = model_hash;
    }
    if (!c->first_reg)
        c->first_reg = loco_now();
    cJSON_Delete(j);
    char ack[64];
    snprintf(ack, sizeof ack, "{\"island_id\":%d}", id);
    loco_info("coordinator: island %d = %s registered (%s, %d ranks, committed outer step %lld)",
              id, c->sites[id], c->ref_mesh, nr, (long long)reg.committed);
    event(c, "\"kind\":\"register\",\"site\":\"%s\",\"committed\":%lld", c->sites[id],
          (long long)reg.committed);
    /* A link that fails from here on is noticed when it is next read. */
    send_json(l, LOCO_FRAME_ACK, c->epoch, ack);
    if (c->started && send_join(c, id) < 0) /* the run goes on: it rejoins */
        loco_warn("coordinator: %s", loco_errmsg());
    return 1;
refuse:
    cJSON_Delete(j);
    snprintf(why_out, why_cap, "%s", why);
    return 0;
}

/* The first quorum: of every site on a fresh start; after a coordinator
 * restart (islands report committed steps), of those that registered
 * within the grace period, at the newest committed step any of them
 * holds. */
static int start_run(loco_coord *c) {
    int registered = 0;
    int64_t newest = 0;
    uint64_t newest_epoch = 0;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link) {
            registered++;
            if (c->isl[i].reg.committed > newest)
                newest = c->isl[i].reg.committed;
            if (c->isl[i].reg.epoch > newest_epoch)
                newest_epoch = c->isl[i].reg.epoch;
        }
    const bool resumed = newest > 0 || newest_epoch > 0;
    if (registered < c->n &&
        (!resumed || loco_now() - c->first_reg < c->cfg.faulttol.timeout_ms / 1e3))
        return 0;
    c->committed = newest;
    c->epoch = newest_epoch;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link && c->isl[i].reg.committed == newest) {
            c->committed_hash = c->isl[i].reg.hash;
            break;
        }
    char hh[17];
    loco_hash_hex(c->committed_hash, hh);
    char json[160];
    snprintf(json, sizeof json, "{\"outer_step\":%lld,\"epoch\":%llu,\"hash\":\"%s\"}",
             (long long)newest, (unsigned long long)c->epoch, hh);
    for (int i = 0; i < c->n; i++) {
        island *is = &c->isl[i];
        if (!is->link)
            continue;
        if (is->reg.committed == newest && is->reg.hash == c->committed_hash) {
            is->status = MEMBER;
        } else if (is->reg.committed == newest - 1 && is->reg.pending == newest &&
                   is->reg.pending_hash == c->committed_hash) {
            /* It finished the step the others committed: commit it there too. */
            is->status = MEMBER;
            send_json(is->link, LOCO_FRAME_COMMIT, c->epoch, json);
        } else {
            is->status = OUT;
        }
    }
    c->started = true;
    if (resumed)
        loco_info("coordinator: resuming the run at committed outer step %lld", (long long)newest);
    LOCO_CHECK(new_epoch(c, resumed ? "resumed" : "every island registered"));
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link && c->isl[i].status == OUT)
            LOCO_CHECK(send_join(c, i));
    return 0;
}

/* ------------------------------------------------------------- serving */

/* Reads what island i sent, at most a few frames a round so that a chatty
 * island cannot starve the others. */
static int poll_island(loco_coord *c, int i, bool *busy) {
    island *is = &c->isl[i];
    for (int k = 0; k < POLL_FRAMES && is->link; k++) {
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(is->link, &h, &payload, 0);
        if (rc == LOCO_ETIMEDOUT)
            return 0;
        if (rc < 0) {
            if (is->bye) {
                drop_island(is);
                return 0;
            }
            char why[256];
            snprintf(why, sizeof why, "link closed: %.200s", loco_errmsg());
            return island_lost(c, i, why);
        }
        *busy = true;
        loco_phi_heartbeat(&is->phi, loco_now());
        rc = 0;
        if (h.type == LOCO_FRAME_OUTER)
            rc = handle_outer(c, i, payload, h.payload_len);
        else if (h.type == LOCO_FRAME_BYE) {
            is->bye = true;
            loco_info("coordinator: island %d (%s) finished", i, c->sites[i]);
        } else if (h.type != LOCO_FRAME_HEARTBEAT)
            loco_warn("coordinator: ignored a %s frame from %s", loco_frame_type_name(h.type),
                      c->sites[i]);
        loco_free(payload);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Takes links from the listener while there is room for them; the others
 * wait there (and past net.max_pending the listener refuses new ones). */
static void accept_pending(loco_coord *c, bool *busy) {
    for (int i = 0; i < c->np.max_pending; i++) {
        if (c->pending[i].link)
            continue;
        loco_link *l;
        if (loco_net_accept(c->listener, &l, 0) < 0)
            return;
        *busy = true;
        c->pending[i] = (pending_link){.link = l, .since = loco_now()};
    }
}

/* Tells a pending link why it is refused; it is dropped once the peer
 * hangs up, or after net.linger_ms: the loop never waits for it. */
static void refuse_pending(loco_coord *c, pending_link *p, const char *why) {
    loco_warn("coordinator: refused a connection from %s: %s", loco_link_peer_name(p->link),
              why);
    loco_frame_hdr h = {.type = LOCO_FRAME_ERROR};
    loco_link_send(p->link, &h, why, strlen(why));
    p->closing = true;
    p->since = loco_now();
}

static void drop_pending(pending_link *p) {
    loco_link_abort(p->link);
    loco_link_destroy(p->link);
    *p = (pending_link){0};
}

/* One frame from each pending link: a REGISTER, or the link goes. Nothing
 * a pending link does stops the run, except a registration that replaced
 * an island whose loss found differing hashes (< 0). */
static int read_pending(loco_coord *c, bool *busy) {
    const double now = loco_now();
    for (int i = 0; i < c->np.max_pending; i++) {
        pending_link *p = &c->pending[i];
        if (!p->link)
            continue;
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(p->link, &h, &payload, 0);
        if (p->closing) {
            loco_free(payload); /* whatever it still says */
            if ((rc < 0 && rc != LOCO_ETIMEDOUT) || now - p->since > c->np.linger_ms / 1e3)
                drop_pending(p);
            continue;
        }
        if (rc == LOCO_ETIMEDOUT) {
            /* Registering is part of connecting: as long as a handshake. */
            if (now - p->since > c->np.handshake_timeout_ms / 1e3) {
                char why[128];
                snprintf(why, sizeof why, "no REGISTER within %d ms",
                         c->np.handshake_timeout_ms);
                refuse_pending(c, p, why);
            }
            continue;
        }
        *busy = true;
        if (rc < 0) {
            loco_info("coordinator: a connection from %s went before registering: %s",
                      loco_link_peer_name(p->link), loco_errmsg());
            drop_pending(p);
            continue;
        }
        char why[1024];
        if (h.type == LOCO_FRAME_REGISTER) {
            rc = handle_register(c, p->link, payload, h.payload_len, why, sizeof why);
        } else {
            snprintf(why, sizeof why, "expected REGISTER, got %s", loco_frame_type_name(h.type));
            rc = 0;
        }
        loco_free(payload);
        if (rc == 1)
            *p = (pending_link){0}; /* now owned by its island */
        else if (rc == 0)
            refuse_pending(c, p, why);
        else
            return rc;
    }
    return 0;
}

int loco_coord_serve(loco_coord *c) {
    const double timeout = (double)c->cfg.faulttol.timeout_ms / 1000.0;
    double last_loop = loco_now();
    for (;;) {
        bool busy = false;
        /* A coordinator that was not scheduled for a while (an overloaded
         * machine, a paused VM) heard nobody meanwhile: that silence is its
         * own, not the islands'. */
        const double gap = loco_now() - last_loop;
        last_loop = loco_now();
        if (gap > 0.2)
            for (int i = 0; i < c->n; i++)
                if (c->isl[i].link && loco_phi_beats(&c->isl[i].phi) > 0)
                    c->isl[i].phi.last_s += gap;
        accept_pending(c, &busy);
        LOCO_CHECK(read_pending(c, &busy));
        int done = 0, live_members = 0;
        for (int i = 0; i < c->n; i++) {
            island *is = &c->isl[i];
            if (!is->link)
                continue;
            LOCO_CHECK(poll_island(c, i, &busy));
            if (!is->link)
                continue;
            double now = loco_now();
            if (is->status == MEMBER) {
                live_members++;
                if (is->bye)
                    done++;
            }
            /* The last member standing is only ever lost with its link:
             * when everyone looks silent at once the fault is more likely
             * here than there. */
            const bool last_member = is->status == MEMBER && __builtin_popcountll(members(c)) == 1;
            if (!is->bye && !last_member &&
                loco_phi_suspect(&is->phi, now, c->cfg.faulttol.phi, timeout)) {
                char why[256];
                snprintf(why, sizeof why,
                         "silent for %.0f ms (phi %.1f, threshold %.1f; hard timeout %lld ms)",
                         (now - loco_phi_last(&is->phi)) * 1e3, loco_phi(&is->phi, now),
                         c->cfg.faulttol.phi, (long long)c->cfg.faulttol.timeout_ms);
                LOCO_CHECK(island_lost(c, i, why));
            }
        }
        if (!c->started && c->have_ref)
            LOCO_CHECK(start_run(c));
        LOCO_CHECK(try_go(c));
        if (c->started && live_members > 0 && done == live_members && !c->exchanging) {
            /* Every member finished and every committed step agreed. */
            for (int i = 0; i < c->n; i++) {
                if (!c->isl[i].link)
                    continue;
                loco_frame_hdr h = {.type = LOCO_FRAME_BYE, .epoch = c->epoch};
                if (loco_link_send(c->isl[i].link, &h, NULL, 0) == 0)
                    loco_link_flush(c->isl[i].link, 2000);
            }
            loco_info("coordinator: run finished; θ_global agreed through outer step %lld",
                      (long long)c->committed);
            event(c, "\"kind\":\"end\",\"status\":\"finished\",\"outer_step\":%lld",
                  (long long)c->committed);
            return 0;
        }
        if (!busy)
            loco_sleep_ms(2);
    }
}
