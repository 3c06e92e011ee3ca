/* The coordinator's registration: connections waiting to register
 * (at most net.max_pending, each for at most net.handshake_timeout_ms, a
 * refused one told why and dropped once it hangs up or after
 * net.linger_ms), the REGISTER that makes one an island, and the first
 * quorum: of every site on a fresh start, or rebuilt from what the islands
 * report after a restart (docs/PROTOCOL.md). */
#include "faulttol/coord_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------- what islands hold */

/* Islands that vouch for the state (step, hash): they hold it committed,
 * or finished that step with that hash and never heard its commit; the
 * coordinator counts as one when it committed that state itself. */
/* Whether an island's registration holds the state (step, hash): it
 * committed it, or finished that step with that hash. */
static bool vouchers_one(const loco_island_progress *r, int64_t step, uint64_t hash) {
    return (r->committed == step && r->hash == hash) ||
           (r->committed == step - 1 && r->pending == step && r->pending_hash == hash);
}

static int vouchers(const loco_coord *c, int64_t step, uint64_t hash) {
    int v = c->known && c->committed == step && c->committed_hash == hash;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link && vouchers_one(&c->isl[i].reg, step, hash))
            v++;
    return v;
}

/* Whether what an island says it holds goes beyond the run as the
 * coordinator knows it (committed step `step` with `hash`, epoch `epoch`):
 * a step it never committed, another hash for that step, an epoch it never
 * announced. */
static bool claims_beyond(const loco_island_progress *r, int64_t step, uint64_t hash,
                          uint64_t epoch) {
    return r->committed > step || (r->committed == step && r->hash != hash) || r->epoch > epoch;
}

/* Why an island's numbers are not believed, for the log and the timeline. */
static void beyond_reason(const loco_island_progress *r, char *out, size_t cap) {
    char hh[17];
    loco_hash_hex(r->hash, hh);
    snprintf(out, cap,
             "claims committed outer step %lld (hash %s, epoch %llu), beyond what the run confirms",
             (long long)r->committed, hh, (unsigned long long)r->epoch);
}

/* An island outside the quorum whose numbers are not believed: it fetches
 * the state like a fresh joiner, and the timeline says why. */
static void not_believed(loco_coord *c, int i, int64_t step) {
    char reason[256];
    beyond_reason(&c->isl[i].reg, reason, sizeof reason);
    loco_warn("coordinator: %s %s: not believed; it fetches the state of outer step %lld",
              c->sites[i], reason, (long long)step);
    loco__coord_event(c, "\"kind\":\"suspect\",\"site\":\"%s\",\"reason\":\"%s\"", c->sites[i],
                      reason);
}

/* ----------------------------------------------------------- registering */

/* A parsed REGISTER and the island it names. */
typedef struct {
    loco__register_msg msg;
    int id; /* its site's place in outer.sites */
} register_msg;

/* Reads the REGISTER payload into m (m->msg.root: its parsed JSON, which
 * the caller deletes, also after an error) and checks it against the run:
 * its site and certificate, the mesh and model of the islands before it.
 * 0, or -1 with the reason for the island in why. */
static int parse_register(const loco_coord *c, const loco_link *l, const char *json, size_t len,
                          register_msg *m, char *why, size_t cap) {
    m->id = -1;
    if (loco__coord_register_parse(&m->msg, json, len) < 0) {
        snprintf(why, cap, "malformed REGISTER");
        return -1;
    }
    const int nr = m->msg.n_ranks;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->sites[i], m->msg.site))
            m->id = i;
    if (m->id < 0) {
        snprintf(why, cap, "site '%.64s' is not in this run's outer.sites (%.300s)", m->msg.site,
                 c->cfg.outer.sites);
        return -1;
    }
    if (strcmp(loco_link_peer_name(l), m->msg.site)) {
        snprintf(why, cap, "site '%.64s' registered with the certificate of '%.64s'", m->msg.site,
                 loco_link_peer_name(l));
        return -1;
    }
    if (!c->have_ref)
        return 0;
    if (strcmp(c->ref_mesh, m->msg.mesh) || c->ref_ranks != nr) {
        snprintf(why, cap,
                 "mesh of '%.64s' (%.150s, %d ranks) differs from the run's (%.150s, %d "
                 "ranks); islands of one run need the same mesh",
                 m->msg.site, m->msg.mesh, nr, c->ref_mesh, c->ref_ranks);
        return -1;
    }
    if (c->ref_model != m->msg.model_hash) {
        snprintf(why, cap,
                 "'%.64s' has another [model]/[outer]/[compress] configuration than the "
                 "islands before it",
                 m->msg.site);
        return -1;
    }
    return 0;
}

/* The same process (same incarnation) lost its link and came back on l:
 * it keeps its place. 1, or < 0 when the run must stop. */
static int register_again(loco_coord *c, loco_link *l, const register_msg *m) {
    island *is = &c->isl[m->id];
    loco_link_abort(is->link);
    loco__coord_retire_link(is);
    loco_link_destroy(is->link);
    is->link = l;
    is->reg = m->msg.reg;
    /* Its silence while it reconnected ends with this REGISTER. */
    loco__coord_heard_now(is, loco_now());
    c->n_registrations++;
    char ack[64];
    snprintf(ack, sizeof ack, "{\"island_id\":%d}", m->id);
    loco__coord_send_json(l, LOCO_FRAME_ACK, c->epoch, ack);
    if (c->started && is->status == MEMBER &&
        claims_beyond(&m->msg.reg, c->committed, c->committed_hash, c->epoch)) {
        /* The same process cannot hold what this coordinator never
         * committed: it is not taken at its word, and fetches the state. */
        char reason[256];
        beyond_reason(&m->msg.reg, reason, sizeof reason);
        const int rc = loco__coord_island_out(c, m->id, reason);
        return rc < 0 ? rc : 1;
    }
    if (c->started && is->status == MEMBER && m->msg.reg.committed == c->committed - 1 &&
        m->msg.reg.pending == c->committed && m->msg.reg.pending_hash == c->committed_hash) {
        /* It finished the step the others committed; its COMMIT went
         * to the link it lost. */
        char json[160], hh[17];
        loco_hash_hex(c->committed_hash, hh);
        snprintf(json, sizeof json, "{\"outer_step\":%lld,\"epoch\":%llu,\"hash\":\"%s\"}",
                 (long long)c->committed, (unsigned long long)c->epoch, hh);
        loco__coord_send_json(l, LOCO_FRAME_COMMIT, c->epoch, json);
    }
    if (c->started) {
        char *q = loco__coord_quorum_json(c, 0, is->status != MEMBER, loco__coord_members(c), 0);
        if (q)
            loco__coord_send_json(l, LOCO_FRAME_QUORUM, c->epoch, q);
        free(q);
    }
    return 1;
}

/* A new process for site m->id on l: its addresses and a fresh detector,
 * the run's reference mesh and model if it is the first, then the rejoin.
 * 1; 0 with why when the coordinator cannot hold it; < 0 when the run must
 * stop. */
static int register_new(loco_coord *c, loco_link *l, const register_msg *m, char *why,
                        size_t cap) {
    island *is = &c->isl[m->id];
    const int nr = m->msg.n_ranks;
    const double beat = (double)c->cfg.faulttol.heartbeat_ms;
    int rc = 0;
    loco_phi_detector phi = {0};
    char (*addrs)[LOCO_ADDR_MAX] = loco_alloc((size_t)nr * sizeof *addrs);
    if (!addrs) {
        snprintf(why, cap, "the coordinator is out of memory");
        goto out;
    }
    if (loco_phi_init(&phi, LOCO_PHI_WINDOW, beat / 4, (double)c->cfg.faulttol.phi_pause_ms,
                      beat) < 0) {
        snprintf(why, cap, "the coordinator is out of memory");
        goto out_free_addrs;
    }
    for (int r = 0; r < nr; r++) {
        const cJSON *a = cJSON_GetArrayItem(m->msg.ranks, r);
        snprintf(addrs[r], LOCO_ADDR_MAX, "%s", cJSON_IsString(a) ? a->valuestring : "");
    }
    if (is->link) {
        /* A new process for a site we still hold: the old one is dead. */
        rc = loco__coord_island_lost(c, m->id, "restarted (a new process registered)");
        if (rc < 0)
            goto out_fini_phi;
    }
    is->addrs = addrs;
    is->phi = phi;
    loco_phi_start(&is->phi, loco_now());
    is->link = l;
    is->inc = m->msg.inc;
    is->n_ranks = nr;
    is->reg = m->msg.reg;
    is->status = OUT;
    is->bye = false;
    c->n_registrations++;
    if (!c->have_ref) {
        c->have_ref = true;
        snprintf(c->ref_mesh, sizeof c->ref_mesh, "%s", m->msg.mesh);
        c->ref_ranks = nr;
        c->ref_model = m->msg.model_hash;
    }
    if (!c->first_reg)
        c->first_reg = loco_now();
    char ack[64];
    snprintf(ack, sizeof ack, "{\"island_id\":%d}", m->id);
    loco_info("coordinator: island %d = %s registered (%s, %d ranks, committed outer step %lld)",
              m->id, c->sites[m->id], c->ref_mesh, nr, (long long)m->msg.reg.committed);
    loco__coord_event(c, "\"kind\":\"register\",\"site\":\"%s\",\"committed\":%lld",
                      c->sites[m->id], (long long)m->msg.reg.committed);
    /* A link that fails from here on is noticed when it is next read. */
    loco__coord_send_json(l, LOCO_FRAME_ACK, c->epoch, ack);
    /* Like any new process it rejoins; what it claims moves nothing. */
    if (c->started && claims_beyond(&m->msg.reg, c->committed, c->committed_hash, c->epoch))
        not_believed(c, m->id, c->committed);
    if (c->started && loco__coord_send_join(c, m->id) < 0) /* the run goes on: it rejoins */
        loco_warn("coordinator: %s", loco_errmsg());
    return 1;
out_fini_phi:
    loco_phi_fini(&phi);
out_free_addrs:
    loco_free(addrs);
out:
    return rc;
}

/* A REGISTER from a pending link: 1 when it became an island (which owns l
 * now), 0 when it is refused (why_out says why), < 0 when the run must
 * stop. */
static int handle_register(loco_coord *c, loco_link *l, const char *json, size_t len,
                           char *why_out, size_t why_cap) {
    register_msg m;
    int rc = 0;
    if (parse_register(c, l, json, len, &m, why_out, why_cap) < 0)
        goto out_free_json;
    loco__coord_adopt_end(c, m.msg.site, m.msg.reg.end_step);
    const island *is = &c->isl[m.id];
    if (is->link && is->inc == m.msg.inc)
        rc = register_again(c, l, &m);
    else
        rc = register_new(c, l, &m, why_out, why_cap);
out_free_json:
    cJSON_Delete(m.msg.root);
    return rc;
}

/* Whether island i's registration may say where the run resumes: its
 * committed step does not go beyond what this coordinator committed (top),
 * nor is that step with another hash. */
static bool may_tell(const loco_coord *c, int i, int64_t top) {
    const loco_island_progress *r = &c->isl[i].reg;
    return c->isl[i].link && r->committed <= top &&
           !(c->known && r->committed == top && r->hash != c->committed_hash);
}

/* Where a run resumes after a restart (this coordinator's or, when every
 * member was gone, its own start over): the newest committed state that
 * two of those who can tell vouch for, so that no island's word alone
 * moves the others forward; without one, the oldest state an island
 * claims that does not go beyond what this coordinator committed (a lone
 * island's own, when it is the only one). An island alone at step 0 holds
 * no state (a fresh process, or one resumed from a checkpoint whose outer
 * state was lost: its weights are not step 0's) and does not take the
 * others back to the start (docs/DECISIONS.md). Nothing at all: what this
 * coordinator committed. */
static void resume_point(const loco_coord *c, int64_t *step, uint64_t *hash) {
    const int64_t top = c->known ? c->committed : INT64_MAX;
    bool confirmed = false, any = false, held = false;
    *step = c->known ? c->committed : 0;
    *hash = c->known ? c->committed_hash : 0;
    /* Its own last commit (remembered, or read back from its journal) is
     * final: one island that holds it, or finished the step with its
     * hash, is enough to go on from there. */
    if (c->known && vouchers(c, c->committed, c->committed_hash) >= 2)
        return;
    for (int i = 0; i < c->n; i++)
        held |= may_tell(c, i, top) && c->isl[i].reg.committed > 0;
    for (int i = 0; i < c->n; i++) {
        const loco_island_progress *r = &c->isl[i].reg;
        if (!may_tell(c, i, top))
            continue;
        if (vouchers(c, r->committed, r->hash) >= 2) {
            if (!confirmed || r->committed > *step) {
                *step = r->committed;
                *hash = r->hash;
            }
            confirmed = true;
        } else if (!confirmed && (r->committed > 0 || !held) &&
                   (!any || r->committed < *step)) {
            *step = r->committed;
            *hash = r->hash;
            any = true;
        }
    }
}

/* The first quorum: of every site on a fresh start; after a coordinator
 * restart (islands report committed steps), of those that registered
 * within the grace period, at the newest committed step they confirm
 * (resume_point). The epoch goes on above every epoch reported by an
 * island that is believed. */
int loco__coord_start_run(loco_coord *c) {
    int registered = 0;
    bool resumed = false;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link) {
            registered++;
            resumed |= c->isl[i].reg.committed > 0 || c->isl[i].reg.epoch > 0;
        }
    if (registered < c->n &&
        (!registered || !resumed || loco_now() - c->first_reg < c->cfg.faulttol.timeout_ms / 1e3))
        return 0;
    int64_t step;
    uint64_t hash;
    resume_point(c, &step, &hash);
    if (c->known && step < c->committed) {
        /* No island here holds the last committed state: going on from an
         * older one would commit its steps a second time, with other
         * values. Wait for one that holds it; with every site here and
         * none, the state is gone and the run stops saying so. */
        if (registered < c->n) {
            if (!c->hold_warned)
                loco_warn("coordinator: outer step %lld was committed, and none of the %d "
                          "islands registered holds it; waiting for the others",
                          (long long)c->committed, registered);
            c->hold_warned = true;
            return 0;
        }
        char why[512];
        snprintf(why, sizeof why,
                 "outer step %lld was committed (hash %016llx), and no island holds its state; "
                 "going on from an older one would commit steps twice (remove %.300s to accept the "
                 "loss)",
                 (long long)c->committed, (unsigned long long)c->committed_hash,
                 c->journal_on ? c->journal : "the decision journal");
        return loco__coord_fail_run(c, why);
    }
    c->hold_warned = false;
    /* Epochs this coordinator never announced are not believed either;
     * the epoch goes on above every one it announced. */
    const uint64_t top_epoch = c->known ? c->epoch : UINT64_MAX;
    uint64_t epoch = c->epoch;
    for (int i = 0; i < c->n; i++) {
        const loco_island_progress *r = &c->isl[i].reg;
        if (c->isl[i].link && !claims_beyond(r, step, hash, top_epoch) && r->epoch > epoch)
            epoch = r->epoch;
    }
    c->committed = step;
    c->committed_hash = hash;
    c->epoch = epoch;
    uint64_t holders = 0;
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link && vouchers_one(&c->isl[i].reg, step, hash))
            holders |= 1ull << i;
    /* What the run resumes at is a decision too (the first a coordinator
     * without a journal makes). */
    if (step > 0)
        LOCO_CHECK(loco__coord_journal_commit(c, step, hash, holders, "resumed"));
    char hh[17];
    loco_hash_hex(c->committed_hash, hh);
    char json[160];
    snprintf(json, sizeof json, "{\"outer_step\":%lld,\"epoch\":%llu,\"hash\":\"%s\"}",
             (long long)step, (unsigned long long)c->epoch, hh);
    bool finished = false;
    for (int i = 0; i < c->n; i++) {
        island *is = &c->isl[i];
        if (!is->link)
            continue;
        if (is->reg.committed == step && is->reg.hash == hash) {
            is->status = MEMBER;
        } else if (is->reg.committed == step - 1 && is->reg.pending == step &&
                   is->reg.pending_hash == hash) {
            /* It finished the step the others committed (a coordinator
             * that recorded the commit and died before it was heard, or
             * whose COMMIT it missed): commit it there too. */
            is->status = MEMBER;
            finished = true;
            loco__coord_send_json(is->link, LOCO_FRAME_COMMIT, c->epoch, json);
        } else {
            is->status = OUT;
            if (claims_beyond(&is->reg, step, hash, top_epoch))
                not_believed(c, i, step);
        }
    }
    loco_run_progress tl = {0};
    if (finished && c->events[0])
        loco_run_progress_read(&tl, c->events);
    if (finished && tl.committed < step) {
        /* The timeline lacks it (the commit's event comes after its
         * frames, and the coordinator died between): the step and the
         * hash it recorded. */
        char list[LOCO_MAX_ISLANDS * 72];
        loco__coord_mask_sites(c, holders, list, sizeof list);
        loco__coord_event(c,
                          "\"kind\":\"commit\",\"outer_step\":%lld,\"epoch\":%llu,\"hash\":\"%s\","
                          "\"members\":[%s],\"finished_after_restart\":true",
                          (long long)step, (unsigned long long)c->epoch, hh, list);
    }
    c->started = true;
    c->known = true;
    /* Failure detection starts with the run (an island heartbeats from its
     * first quorum on): every island's silence counts from now. */
    const double t_start = loco_now();
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link)
            loco__coord_heard_now(&c->isl[i], t_start);
    if (resumed)
        loco_info("coordinator: resuming the run at committed outer step %lld", (long long)step);
    LOCO_CHECK(loco__coord_new_epoch(c, resumed ? "resumed" : "every island registered"));
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link && c->isl[i].status == OUT)
            LOCO_CHECK(loco__coord_send_join(c, i));
    return 0;
}

/* ------------------------------------------------------ pending links */

/* Takes links from the listener while there is room for them; the others
 * wait there (and past net.max_pending the listener refuses new ones). */
void loco__coord_accept_pending(loco_coord *c, bool *busy) {
    for (int i = 0; i < c->np.max_pending; i++) {
        if (c->pending[i].link)
            continue;
        loco_link *l;
        if (loco_net_accept(c->listener, &l, 0) < 0)
            return;
        *busy = true;
        c->pending[i] = (pending_link){.link = l, .since = loco_now()};
        loco_link_set_notify(l, c->wake_fd);
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
int loco__coord_read_pending(loco_coord *c, bool *busy) {
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

int loco__coord_register_parse(loco__register_msg *m, const char *json, size_t len) {
    *m = (loco__register_msg){.root = cJSON_ParseWithLength(json, len)};
    const cJSON *j = m->root;
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
    const cJSON *jes = cJSON_GetObjectItemCaseSensitive(j, "end_step");
    const int nr = cJSON_GetArraySize(ranks);
    if (!cJSON_IsString(site) || !cJSON_IsString(mesh) || !cJSON_IsString(mh) ||
        !cJSON_IsString(inc) || !cJSON_IsArray(ranks) || nr < 1 || nr > LOCO_MAX_ISLAND_RANKS ||
        strlen(mesh->valuestring) >= sizeof((loco_coord *)0)->ref_mesh ||
        !loco__coord_num_in(jc, 0, LOCO_JSON_NUM_MAX) || !cJSON_IsString(jh) ||
        !loco__coord_num_in(je, 0, LOCO_JSON_NUM_MAX) || !loco__coord_num_in(jp, 0, LOCO_JSON_NUM_MAX) ||
        !cJSON_IsString(jph) || (jes && !loco__coord_num_in(jes, 0, LOCO_JSON_NUM_MAX)))
        return LOCO_ERR(LOCO_EPROTO, "malformed REGISTER");
    m->site = site->valuestring;
    m->mesh = mesh->valuestring;
    m->model_hash = strtoull(mh->valuestring, NULL, 16);
    m->inc = strtoull(inc->valuestring, NULL, 16);
    m->ranks = ranks;
    m->n_ranks = nr;
    m->reg = (loco_island_progress){.committed = (int64_t)jc->valuedouble,
                                    .hash = strtoull(jh->valuestring, NULL, 16),
                                    .epoch = (uint64_t)je->valuedouble,
                                    .pending = (int64_t)jp->valuedouble,
                                    .pending_hash = strtoull(jph->valuestring, NULL, 16),
                                    .end_step = jes ? (int64_t)jes->valuedouble : 0};
    return 0;
}
