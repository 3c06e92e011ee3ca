/* The coordinator: quorum epochs, failure detection and rejoins, and the
 * loop that serves it all (the go and the commit of every outer step:
 * coord_step.c; registration and the first quorum: coord_register.c). One
 * thread polls the listener and every link, and sleeps on one eventfd they
 * all write to when it has nothing to do; the messages are small.
 *
 * A member lost or dropped, or a failed exchange, bumps the epoch and
 * announces it (QUORUM with outer_step 0): the survivors say READY again
 * and redo the step from the pseudo-gradient they kept. The coordinator
 * holds nothing the islands cannot tell it again: a restarted one rebuilds
 * the run from their registrations, believing what two of them confirm
 * (docs/PROTOCOL.md). */
#include "faulttol/coord_internal.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

/* Frames read from one island per round of the loop. */
#define POLL_FRAMES 16
/* Longest wait of an idle loop: how late a timer (phi over a 100 ms
 * heartbeat, straggler_ms, a pending link's handshake_timeout_ms) may be
 * seen, a few percent of the shortest of them. Frames wake it at once. */
#define COORD_TICK_MS 10

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

void loco__coord_mask_sites(const loco_coord *c, uint64_t mask, char *out, size_t cap) {
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

char *loco__coord_quorum_json(loco_coord *c, int64_t outer_step, bool join, uint64_t mem,
                              uint64_t obs) {
    loco_quorum q = {.epoch = c->epoch, .outer_step = outer_step, .committed = c->committed,
                     .committed_hash = c->committed_hash, .join = join, .n = c->n,
                     .members = mem, .observers = obs, .end_step = c->end_step};
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

int loco__coord_announce(loco_coord *c, uint64_t to, int64_t outer_step, uint64_t mem,
                         uint64_t obs) {
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

/* A membership change: a new epoch, announced to everyone in the run. */
int loco__coord_new_epoch(loco_coord *c, const char *why) {
    c->epoch++;
    uint64_t m = loco__coord_members(c);
    char list[LOCO_MAX_ISLANDS * 72];
    loco__coord_mask_sites(c, m, list, sizeof list);
    loco_info("coordinator: quorum epoch %llu: %d islands (%s)", (unsigned long long)c->epoch,
              __builtin_popcountll(m), why);
    loco__coord_event(
        c, "\"kind\":\"quorum\",\"epoch\":%llu,\"members\":[%s],\"outer_step\":%lld,\"why\":\"%s\"",
        (unsigned long long)c->epoch, list, (long long)(c->committed + 1), why);
    for (int i = 0; i < c->n; i++)
        c->isl[i].ready_step = 0; /* everyone says ready again */
    c->exchanging = false;
    c->gather_t0 = 0;
    LOCO_CHECK(loco__coord_journal(c, "{\"k\":\"epoch\",\"epoch\":%llu,\"members\":\"%llx\"}",
                                   (unsigned long long)c->epoch, (unsigned long long)m));
    uint64_t to = 0;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link)
            to |= 1ull << i;
    return loco__coord_announce(c, to, 0, m, 0);
}

/* ------------------------------------------------------------ lifecycle */

int loco_coord_create(loco_coord **out, const loco_config *cfg, const loco_net_params *np,
                      const char *host, int port, const char *events_path) {
    *out = NULL;
    loco_coord *c = loco_alloc(sizeof *c);
    if (!c)
        return LOCO_ERR(LOCO_ENOMEM, "coordinator");
    int rc;
    c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (c->wake_fd < 0) {
        rc = LOCO_ERR(LOCO_EIO, "coordinator: eventfd: %s", strerror(errno));
        goto out_fail;
    }
    c->cfg = *cfg;
    c->np = *np;
    c->end_step = cfg->train.steps;
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
    loco_net_listener_set_notify(c->listener, c->wake_fd);
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
    if (c->journal_on)
        close(c->journal_fd);
    if (c->wake_fd >= 0) /* after every link and the listener that write to it */
        close(c->wake_fd);
    loco_free(c);
}

/* ----------------------------------------------------------- membership */

/* Every member is gone: which state the run is in is for the islands to
 * say again. Start over as a restarted coordinator would: drop every link
 * (the islands register again with what they hold) and resume at the
 * newest committed step they report. */
void loco__coord_restart_run(loco_coord *c) {
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
        loco__coord_restart_run(c);
        return 0;
    }
    if (c->exchanging) {
        /* Everyone else may have finished with its contribution already. */
        c->go_members &= ~(1ull << i);
        c->go_observers &= ~(1ull << i);
        LOCO_CHECK(loco__coord_try_commit(c));
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
            rc = loco__coord_handle_outer(c, i, h.epoch, payload, h.payload_len);
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

/* Sleeps until the listener or a link has news (loco_link_set_notify) or
 * COORD_TICK_MS passed, for what only time moves: phi, the straggler and
 * pending-link timeouts. The count is read before the next round reads
 * the links, so news that comes meanwhile wakes the round after. */
static void await_news(loco_coord *c) {
    struct pollfd pf = {.fd = c->wake_fd, .events = POLLIN};
    if (poll(&pf, 1, COORD_TICK_MS) > 0) {
        uint64_t n;
        ssize_t r = read(c->wake_fd, &n, sizeof n);
        (void)r; /* EAGAIN: another round took it */
    }
}

int loco_coord_serve(loco_coord *c) {
    const double timeout = (double)c->cfg.faulttol.timeout_ms / 1000.0;
    /* Restarted for a run that is over (its timeline says it finished):
     * no island will come back to it. */
    loco_run_progress done = {0};
    if (c->events[0])
        loco_run_progress_read(&done, c->events);
    if (done.finished) {
        loco_info("coordinator: %s says the run already finished (outer step %lld); nothing "
                  "to coordinate", c->events, (long long)done.committed);
        return 0;
    }
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
                if (c->isl[i].link) {
                    c->isl[i].phi.start_s += gap;
                    if (loco_phi_beats(&c->isl[i].phi) > 0)
                        c->isl[i].phi.last_s += gap;
                }
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
             * here than there. Before the run starts nobody is: an island
             * heartbeats only from its first quorum on, so until then only
             * a closed link tells it is gone (loco__coord_start_run starts
             * every clock afresh). */
            const bool last_member =
                is->status == MEMBER && __builtin_popcountll(loco__coord_members(c)) == 1;
            if (c->started && !is->bye && !last_member &&
                loco_phi_suspect(&is->phi, now, c->cfg.faulttol.phi, timeout)) {
                /* Never heard: silent since it registered or the run
                 * started (loco_phi_start), not since time 0. */
                const bool heard = loco_phi_beats(&is->phi) > 0;
                const double since = heard ? loco_phi_last(&is->phi) : is->phi.start_s;
                char why[256];
                snprintf(why, sizeof why,
                         "silent for %.0f ms%s (phi %.1f, threshold %.1f; hard timeout %lld ms)",
                         (now - since) * 1e3, heard ? "" : ", no heartbeat yet",
                         loco_phi(&is->phi, now), c->cfg.faulttol.phi,
                         (long long)c->cfg.faulttol.timeout_ms);
                LOCO_CHECK(loco__coord_island_lost(c, i, why));
            }
        }
        if (!c->started && c->have_ref)
            LOCO_CHECK(loco__coord_start_run(c));
        LOCO_CHECK(loco__coord_try_go(c));
        loco__coord_metrics_update(c);
        if (c->started && live_members > 0 && done == live_members && !c->exchanging) {
            /* Every member finished and every committed step agreed. */
            for (int i = 0; i < c->n; i++) {
                if (!c->isl[i].link)
                    continue;
                loco_frame_hdr h = {.type = LOCO_FRAME_BYE, .epoch = c->epoch};
                if (loco_link_send(c->isl[i].link, &h, NULL, 0) == 0)
                    loco_link_flush(c->isl[i].link, LOCO_LINK_FAREWELL_MS);
            }
            loco_info("coordinator: run finished; θ_global agreed through outer step %lld",
                      (long long)c->committed);
            loco__coord_event(c, "\"kind\":\"end\",\"status\":\"finished\",\"outer_step\":%lld",
                              (long long)c->committed);
            return 0;
        }
        if (!busy)
            await_news(c);
    }
}