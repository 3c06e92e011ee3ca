/* The coordinator: quorum epochs, the go and the commit of every outer
 * step, failure detection and rejoins (registration and the first quorum:
 * coord_register.c). One thread polls the listener and every link; the
 * messages are small.
 *
 * Per outer step s (= committed + 1): every member says READY(s); the
 * coordinator answers GO (a QUORUM with outer_step s: members, and the
 * rejoining islands that observe this step); each island exchanges and
 * says DONE (with its θ_global hash) or FAILED (with the islands it
 * suspects); all DONE with equal hashes is a COMMIT, and so is a strict
 * majority of equal hashes, whose dissenters leave and rejoin. A member
 * lost or dropped, or a failed exchange, bumps the epoch and announces it
 * (QUORUM with outer_step 0): the survivors say READY again and redo the
 * step from the pseudo-gradient they kept. The coordinator holds nothing
 * the islands cannot tell it again: a restarted one rebuilds the run from
 * their registrations, believing what two of them confirm
 * (docs/PROTOCOL.md). */
#include "faulttol/coord_internal.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Frames read from one island per round of the loop. */
#define POLL_FRAMES 16

/* ----------------------------------------------------------- events */

void loco__coord_event(loco_coord *c, const char *fmt, ...) {
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

uint64_t loco__coord_members(const loco_coord *c) {
    uint64_t m = 0;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].status == MEMBER)
            m |= 1ull << i;
    return m;
}

/* ------------------------------------------------------------- sending */

int loco__coord_send_json(loco_link *l, int type, uint64_t epoch, const char *json) {
    loco_frame_hdr h = {.type = (uint16_t)type, .epoch = epoch};
    return loco_link_send(l, &h, json, json ? strlen(json) : 0);
}

static void send_error(loco_link *l, const char *text) {
    loco_frame_hdr h = {.type = LOCO_FRAME_ERROR};
    if (loco_link_send(l, &h, text, strlen(text)) == 0)
        loco_link_flush(l, 2000);
}

char *loco__coord_quorum_json(loco_coord *c, int64_t outer_step, bool join, uint64_t mem,
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
    char *json = loco__coord_quorum_json(c, outer_step, false, mem, obs);
    if (!json)
        return LOCO_ERR(LOCO_ENOMEM, "quorum");
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(to, i) && c->isl[i].link)
            loco__coord_send_json(c->isl[i].link, LOCO_FRAME_QUORUM, c->epoch, json);
    free(json);
    return 0;
}

/* Tells island i it is outside the quorum: fetch the committed state from
 * a member, then say ready. */
int loco__coord_send_join(loco_coord *c, int i) {
    char *json = loco__coord_quorum_json(c, 0, true, loco__coord_members(c), 0);
    if (!json)
        return LOCO_ERR(LOCO_ENOMEM, "quorum");
    if (c->isl[i].link) {
        loco__coord_send_json(c->isl[i].link, LOCO_FRAME_QUORUM, c->epoch, json);
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
int loco__coord_new_epoch(loco_coord *c, const char *why) {
    c->epoch++;
    uint64_t m = loco__coord_members(c);
    char list[LOCO_MAX_ISLANDS * 72];
    mask_sites(c, m, list, sizeof list);
    loco_info("coordinator: quorum epoch %llu: %d islands (%s)", (unsigned long long)c->epoch,
              __builtin_popcountll(m), why);
    loco__coord_event(
        c, "\"kind\":\"quorum\",\"epoch\":%llu,\"members\":[%s],\"outer_step\":%lld,\"why\":\"%s\"",
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
    loco__coord_event(c, "\"kind\":\"end\",\"status\":\"failed\",\"reason\":\"%s\"", why);
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
    LOCO_CHECK_GOTO(loco__coord_metrics_start(c), out_fail);
    *out = c;
    return 0;
out_fail:
    loco_coord_destroy(c);
    return rc;
}

int loco_coord_port(const loco_coord *c) { return loco_net_listener_port(c->listener); }

static void drop_island(island *is) {
    loco__coord_retire_link(is);
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
    loco_prom_destroy(c->prom);
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
    c->n_restarts++;
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

/* Member i left the quorum: a new epoch, unless every remaining member
 * already finished the step (then it commits without it); with no member
 * left the run starts over. < 0 only when the run must stop (a commit that
 * found differing hashes). */
static int quorum_without(loco_coord *c, int i) {
    if (!loco__coord_members(c)) {
        restart_run(c);
        return 0;
    }
    if (c->exchanging) {
        /* Everyone else may have finished with its contribution already. */
        c->go_members &= ~(1ull << i);
        c->go_observers &= ~(1ull << i);
        LOCO_CHECK(try_commit(c));
    }
    return loco__coord_new_epoch(c, "an island left");
}

/* Island i is gone (link closed, silent, or replaced by a restarted
 * process). A member leaving starts a new epoch (quorum_without). */
int loco__coord_island_lost(loco_coord *c, int i, const char *reason) {
    island *is = &c->isl[i];
    bool was_member = is->status == MEMBER;
    loco_warn("coordinator: island %d (%s) is out: %s", i, c->sites[i], reason);
    c->n_suspicions++;
    c->n_lost++;
    loco__coord_event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"%s\"", c->sites[i],
                      reason);
    loco_link_abort(is->link); /* a peer not worth waiting for */
    drop_island(is);
    if (!was_member || !c->started)
        return 0;
    return quorum_without(c, i);
}

int loco__coord_island_out(loco_coord *c, int i, const char *reason) {
    island *is = &c->isl[i];
    const bool was_member = is->status == MEMBER;
    is->status = OUT;
    is->ready_step = 0;
    if (was_member && c->started) {
        loco_warn("coordinator: %s leaves the quorum: %s", c->sites[i], reason);
        c->n_suspicions++;
        c->n_ejected++;
        loco__coord_event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"%s\"", c->sites[i],
                          reason);
        is->hold_spent = false; /* the members wait once for its transfer */
        LOCO_CHECK(quorum_without(c, i));
    }
    return loco__coord_send_join(c, i);
}

/* The θ_global hash a strict majority of the go's members reported (every
 * one of them DONE), in *h: false when no hash has one. */
static bool majority_hash(const loco_coord *c, uint64_t *h) {
    int n = 0, best = 0;
    for (int i = 0; i < c->n; i++) {
        if (!loco_quorum_has(c->go_members, i))
            continue;
        n++;
        int votes = 0;
        for (int k = 0; k < c->n; k++)
            votes +=
                loco_quorum_has(c->go_members, k) && c->isl[k].done_hash == c->isl[i].done_hash;
        if (votes > best) {
            best = votes;
            *h = c->isl[i].done_hash;
        }
    }
    return 2 * best > n;
}

/* Members whose hash differs from the majority's h leave the quorum before
 * the commit (their mask is returned): each is named in the log and the
 * timeline (a `suspect` event), and is told to fetch the committed state. */
static uint64_t eject_minority(loco_coord *c, int64_t s, uint64_t h) {
    uint64_t out = 0;
    int agree = 0;
    for (int i = 0; i < c->n; i++) {
        if (!loco_quorum_has(c->go_members, i))
            continue;
        island *is = &c->isl[i];
        if (is->done_hash == h) {
            agree++;
            continue;
        }
        out |= 1ull << i;
        is->status = OUT;
        is->hold_spent = false;
        c->n_suspicions++;
        c->n_ejected++;
        char reason[160];
        snprintf(reason, sizeof reason,
                 "θ_global hash %016llx after outer step %lld differs from the majority's %016llx",
                 (unsigned long long)is->done_hash, (long long)s, (unsigned long long)h);
        loco__coord_event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"%s\"", c->sites[i],
                          reason);
    }
    if (out) {
        char list[LOCO_MAX_ISLANDS * 72];
        mask_sites(c, out, list, sizeof list);
        loco_warn("coordinator: outer step %lld: θ_global of %s differs from the hash %016llx of "
                  "%d of the %d members; they leave the quorum and rejoin by state transfer",
                  (long long)s, list, (unsigned long long)h, agree,
                  __builtin_popcountll(c->go_members));
    }
    return out;
}

/* Commits when every member and observer of the go reported DONE for it,
 * with the hash of a strict majority of the members (the others are
 * ejected: eject_minority); without one the run stops. 1 when committed,
 * 0 when still waiting, < 0 when the run must stop. */
static int try_commit(loco_coord *c) {
    const int64_t s = c->committed + 1;
    int first = -1;
    for (int i = 0; i < c->n; i++) {
        if (!loco_quorum_has(c->go_members, i))
            continue;
        const island *is = &c->isl[i];
        if (is->done_step != s || is->done_epoch != c->epoch || !is->done_ok)
            return 0;
        if (first < 0)
            first = i;
    }
    if (first < 0)
        return 0;
    uint64_t h = c->isl[first].done_hash;
    if (!majority_hash(c, &h)) {
        int other = first;
        while (c->isl[other].done_hash == c->isl[first].done_hash ||
               !loco_quorum_has(c->go_members, other))
            other++;
        char why[512];
        snprintf(why, sizeof why,
                 "θ_global differs after outer step %lld: %s has %016llx, %s has %016llx",
                 (long long)s, c->sites[first], (unsigned long long)c->isl[first].done_hash,
                 c->sites[other], (unsigned long long)c->isl[other].done_hash);
        loco__coord_event(c, "\"kind\":\"divergence\",\"outer_step\":%lld,\"detail\":\"%s\"",
                          (long long)s, why);
        return fail_run(c, why);
    }
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(c->go_observers, i)) {
            const island *is = &c->isl[i];
            if (is->done_step != s || is->done_epoch != c->epoch)
                return 0;
        }
    const uint64_t ejected = eject_minority(c, s, h);
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
        if (!is->link || loco_quorum_has(ejected, i))
            continue;
        if (loco_quorum_has(c->go_observers, i)) {
            if (is->done_ok && is->done_hash == h) {
                is->status = MEMBER; /* its hash check passed: it contributes next */
                is->join_sent = 0;
                is->hold_spent = false;
                joined = true;
                loco_info("coordinator: island %d (%s) rejoined at outer step %lld", i,
                          c->sites[i], (long long)s);
                loco__coord_event(c, "\"kind\":\"join\",\"site\":\"%s\",\"outer_step\":%lld",
                                  c->sites[i], (long long)s);
            } else {
                loco_warn("coordinator: %s failed its first step after rejoining; it fetches "
                          "the state again",
                          c->sites[i]);
                loco__coord_send_join(c, i);
                continue;
            }
        }
        if (is->status == MEMBER)
            loco__coord_send_json(is->link, LOCO_FRAME_COMMIT, c->epoch, json);
        else if (is->status == OUT && is->ready_step == s) {
            /* Ready too late to observe this step: its state is old now. */
            is->ready_step = 0;
            loco__coord_send_join(c, i);
        }
    }
    char list[LOCO_MAX_ISLANDS * 72];
    mask_sites(c, loco__coord_members(c), list, sizeof list);
    loco__coord_event(
        c,
        "\"kind\":\"commit\",\"outer_step\":%lld,\"epoch\":%llu,\"hash\":\"%s\",\"members\":[%s]",
        (long long)s, (unsigned long long)c->epoch, hh, list);
    loco_debug("coordinator: outer step %lld committed (%s)", (long long)s, hh);
    /* The join goes out before the new epoch, as for any island that
     * leaves: its answer to DONE is "fetch the committed state". */
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(ejected, i))
            LOCO_CHECK(loco__coord_send_join(c, i));
    if (ejected || joined)
        LOCO_CHECK(loco__coord_new_epoch(c, ejected ? "islands with another θ_global left"
                                                    : "an island rejoined"));
    return 1;
}

/* Every member ready for the step: go (with the rejoining islands that
 * hold the committed state as observers). Stragglers past the deadline
 * leave the quorum when faulttol.straggler_policy = drop. */
static int try_go(loco_coord *c) {
    if (!c->started || c->exchanging)
        return 0;
    const int64_t s = c->committed + 1;
    uint64_t mem = loco__coord_members(c), ready = 0;
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
                c->n_suspicions++;
                c->n_ejected++;
                loco_warn("coordinator: %s is not ready for outer step %lld after %lld ms: left "
                          "out of this step (it catches up through a state transfer)",
                          c->sites[i], (long long)s, (long long)c->cfg.faulttol.straggler_ms);
                loco__coord_event(c,
                                  "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"straggler\"",
                                  c->sites[i]);
            }
        uint64_t keep = ready;
        LOCO_CHECK(loco__coord_new_epoch(c, "stragglers left out"));
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
        loco__coord_event(c,
                          "\"kind\":\"quorum\",\"epoch\":%llu,\"members\":[%s],\"outer_step\":%lld,"
                          "\"why\":\"islands rejoin\"",
                          (unsigned long long)c->epoch, list, (long long)s);
    }
    c->go_members = mem;
    c->go_observers = obs;
    c->exchanging = true;
    LOCO_CHECK(announce(c, mem | obs, s, mem, obs));
    return 0;
}

/* An OUTER frame of island i, sent in epoch `sent_epoch` (its header's:
 * the newest epoch the island had heard of). */
/* Islands that refused a contribution (NaN, Inf, an outlier norm:
 * outer/outer.h) name whose in their FAILED. Every island decodes the same
 * bytes of a contributor, so the honest ones agree; a liar alone cannot
 * get an honest island dropped. The accused leaves the quorum when a
 * strict majority of the other members of the go refused it, or it
 * refused itself, and the others redo the step without it (no retry with
 * it first: the redo would send the same bytes); while members have still
 * to report, wait for them. 1 when there is no such majority (an ordinary
 * failed exchange then), 0 when handled or waiting, < 0 when the run must
 * stop. */
static int judge_refusal(loco_coord *c, int64_t s) {
    for (int a = 0; a < c->n; a++) {
        if (!loco_quorum_has(c->go_members, a))
            continue;
        int others = 0, reported = 0, votes = 0;
        bool self = false;
        for (int m = 0; m < c->n; m++) {
            if (!loco_quorum_has(c->go_members, m))
                continue;
            const island *im = &c->isl[m];
            const bool in = im->done_step == s && im->done_epoch == c->epoch;
            const bool refused_a = in && !im->done_ok && (im->done_hash >> a & 1);
            if (m == a) {
                self = refused_a;
                continue;
            }
            others++;
            reported += in;
            votes += refused_a;
        }
        if (votes == 0 && !self)
            continue;
        if (self || 2 * votes > others) {
            char why[200];
            snprintf(why, sizeof why,
                     "its contribution to outer step %lld was refused by %d of %d islands%s",
                     (long long)s, votes, others, self ? " and by itself" : "");
            c->failures = 0;
            return loco__coord_island_out(c, a, why);
        }
        if (reported < others)
            return 0; /* the rest may refuse it too */
    }
    return 1;
}

static int handle_outer(loco_coord *c, int i, uint64_t sent_epoch, const char *json, size_t len) {
    island *is = &c->isl[i];
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(j, "phase");
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    const cJSON *hv = cJSON_GetObjectItemCaseSensitive(j, "have");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "epoch");
    const cJSON *hh = cJSON_GetObjectItemCaseSensitive(j, "hash");
    const cJSON *su = cJSON_GetObjectItemCaseSensitive(j, "suspects");
    int rc = 0;
    if (!cJSON_IsString(ph) || !loco__coord_num_in(os, 0, 1e15) ||
        !loco__coord_num_in(hv, 0, 1e15) || !loco__coord_num_in(ep, 0, 1e15) ||
        !cJSON_IsString(hh) || !cJSON_IsString(su) ||
        (strcmp(ph->valuestring, "ready") && strcmp(ph->valuestring, "done") &&
         strcmp(ph->valuestring, "failed"))) {
        loco_warn("coordinator: malformed OUTER from %s: ignored", c->sites[i]);
        goto out;
    }
    const int64_t s = (int64_t)os->valuedouble;
    if (!strcmp(ph->valuestring, "ready")) {
        /* A member's READY from before the epoch now (a replay, or one the
         * announcement of this epoch overtook: that announcement makes it
         * say ready again) does not count for this epoch. */
        if (is->status == MEMBER && sent_epoch < c->epoch) {
            loco_debug("coordinator: stale ready from %s (step %lld, epoch %llu)", c->sites[i],
                       (long long)s, (unsigned long long)sent_epoch);
            goto out;
        }
        is->ready_step = s;
        is->ready_have = (int64_t)hv->valuedouble;
        /* Outside the quorum, or behind it: fetch the state first. A member
         * that says so leaves the quorum (a new epoch). */
        if (c->started && (is->status == OUT || s != c->committed + 1) &&
            (s != c->committed + 1 || is->ready_have != c->committed)) {
            char why[160];
            snprintf(why, sizeof why, "ready for outer step %lld holding %lld, the run is at %lld",
                     (long long)s, (long long)is->ready_have, (long long)c->committed);
            rc = loco__coord_island_out(c, i, why);
        }
        goto out;
    }
    /* DONE and FAILED count from the islands of the go, in its epoch. */
    const uint64_t epoch = (uint64_t)ep->valuedouble;
    if (s != c->committed + 1 || epoch != c->epoch || !c->exchanging ||
        !loco_quorum_has(c->go_members | c->go_observers, i)) {
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
    if (is->done_hash) { /* a failed outcome carries the islands it refused */
        rc = judge_refusal(c, s);
        if (rc != 1)
            goto out;
        rc = 0;
    }
    /* A failed exchange: retry with the same islands once (a dropped or
     * corrupted frame costs a link, not a member); when the same step fails
     * again, of two live islands that cannot reach each other the one with
     * the higher id leaves and rejoins later. */
    c->failures++;
    char why[256];
    snprintf(why, sizeof why, "exchange of outer step %lld failed at %s", (long long)s,
             c->sites[i]);
    loco__coord_event(
        c, "\"kind\":\"exchange_failed\",\"site\":\"%s\",\"outer_step\":%lld,\"attempt\":%d",
        c->sites[i], (long long)s, c->failures);
    if (c->failures >= 2) {
        for (int k = 0; k < c->n; k++)
            if (loco_quorum_has(is->suspects, k) && c->isl[k].status == MEMBER && k != i) {
                int out_id = k > i ? k : i;
                c->isl[out_id].status = OUT;
                c->n_suspicions++;
                c->n_ejected++;
                char r[160];
                snprintf(r, sizeof r, "exchange failure between %s and %s", c->sites[i],
                         c->sites[k]);
                loco__coord_event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"%s\"",
                                  c->sites[out_id], r);
                loco_warn("coordinator: %s leaves the quorum (%s)", c->sites[out_id], r);
                loco__coord_send_join(c, out_id);
                break;
            }
    }
    if (!loco__coord_members(c)) {
        restart_run(c);
        goto out;
    }
    rc = loco__coord_new_epoch(c, why);
out:
    cJSON_Delete(j);
    return rc < 0 ? rc : 0;
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
            return loco__coord_island_lost(c, i, why);
        }
        *busy = true;
        loco_phi_heartbeat(&is->phi, loco_now());
        rc = 0;
        if (h.type == LOCO_FRAME_OUTER)
            rc = handle_outer(c, i, h.epoch, payload, h.payload_len);
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
        loco__coord_accept_pending(c, &busy);
        LOCO_CHECK(loco__coord_read_pending(c, &busy));
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
            const bool last_member =
                is->status == MEMBER && __builtin_popcountll(loco__coord_members(c)) == 1;
            if (!is->bye && !last_member &&
                loco_phi_suspect(&is->phi, now, c->cfg.faulttol.phi, timeout)) {
                char why[256];
                snprintf(why, sizeof why,
                         "silent for %.0f ms (phi %.1f, threshold %.1f; hard timeout %lld ms)",
                         (now - loco_phi_last(&is->phi)) * 1e3, loco_phi(&is->phi, now),
                         c->cfg.faulttol.phi, (long long)c->cfg.faulttol.timeout_ms);
                LOCO_CHECK(loco__coord_island_lost(c, i, why));
            }
        }
        if (!c->started && c->have_ref)
            LOCO_CHECK(loco__coord_start_run(c));
        LOCO_CHECK(try_go(c));
        loco__coord_metrics_update(c);
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
            loco__coord_event(c, "\"kind\":\"end\",\"status\":\"finished\",\"outer_step\":%lld",
                              (long long)c->committed);
            return 0;
        }
        if (!busy)
            loco_sleep_ms(2);
    }
}