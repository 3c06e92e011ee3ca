/* The go and the commit of every outer step (the rest of the
 * coordinator: coord.c). Per outer step s (= committed + 1): when every
 * member said READY(s) the coordinator answers GO, a QUORUM with
 * outer_step s naming the members and the rejoining islands that observe
 * the step (try_go); each island exchanges and says DONE with its
 * θ_global hash, or FAILED with the islands it suspects or whose
 * contribution it refused (handle_outer); all DONE with equal hashes is a
 * COMMIT, and so is a strict majority of equal hashes, whose dissenters
 * leave and rejoin (try_commit). A failed exchange is retried once with
 * the same islands, then one of two islands that cannot reach each other
 * leaves. */
#include "faulttol/coord_internal.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- failing */

static void send_error(loco_link *l, const char *text) {
    loco_frame_hdr h = {.type = LOCO_FRAME_ERROR};
    if (loco_link_send(l, &h, text, strlen(text)) == 0)
        loco_link_flush(l, LOCO_LINK_FAREWELL_MS);
}

int loco__coord_fail_run(loco_coord *c, const char *why) {
    loco_error("coordinator: stopping the run: %s", why);
    loco__coord_event(c, "\"kind\":\"end\",\"status\":\"failed\",\"reason\":\"%s\"", why);
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].link)
            send_error(c->isl[i].link, why);
    return LOCO_ERR(LOCO_EPEER, "%s", why);
}

/* ----------------------------------------------------------- joiners */

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

/* ------------------------------------------------------- go and commit */

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
        loco__coord_mask_sites(c, out, list, sizeof list);
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
int loco__coord_try_commit(loco_coord *c) {
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
        return loco__coord_fail_run(c, why);
    }
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(c->go_observers, i)) {
            const island *is = &c->isl[i];
            if (is->done_step != s || is->done_epoch != c->epoch)
                return 0;
        }
    /* On disk before anyone hears it: a restarted coordinator finishes
     * this commit instead of redoing the step. */
    LOCO_CHECK(loco__coord_journal_commit(c, s, h, c->go_members, "commit"));
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
    loco__coord_mask_sites(c, loco__coord_members(c), list, sizeof list);
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
void loco__coord_adopt_end(loco_coord *c, const char *site, int64_t end_step) {
    const int64_t limit = c->cfg.train.steps + c->cfg.faults.max_extra_steps;
    if (end_step <= c->end_step)
        return;
    if (end_step > limit) {
        loco_warn("coordinator: %s says the run ends at inner step %lld, past train.steps + "
                  "faults.max_extra_steps = %lld; not believed",
                  site, (long long)end_step, (long long)limit);
        return;
    }
    loco_info("coordinator: %s says the run was extended to inner step %lld; so it is",
              site, (long long)end_step);
    c->end_step = end_step;
}

/* The run does not end while a fault injected into it has an open cycle
 * (docs/FAULTS.md): at the go of the outer step before the last, the
 * last inner step moves on by outer.H, at most faults.max_extra_steps
 * past train.steps. The go carries the end to every island of the step,
 * and every QUORUM after it to the others. */
static void hold_end(loco_coord *c, int64_t s) {
    const loco_config *cfg = &c->cfg;
    const int64_t F = cfg->outer.fragments > 0 ? cfg->outer.fragments : 1;
    const int64_t P = cfg->outer.H / F, limit = cfg->train.steps + cfg->faults.max_extra_steps;
    /* outer step s is taken at inner step s·P; only the one before the last decides */
    if (!c->events[0] || cfg->faults.max_extra_steps <= 0 || P <= 0 ||
        (s + 1) * P < c->end_step || s * P >= c->end_step)
        return;
    char why[256];
    if (loco_fault_cycles_open(c->events, why, sizeof why) <= 0)
        return;
    if (c->end_step + cfg->outer.H > limit) {
        loco_warn("coordinator: a fault's cycle is still open (%s), but the run may not go past "
                  "inner step %lld (faults.max_extra_steps): it ends at %lld",
                  why, (long long)limit, (long long)c->end_step);
        return;
    }
    c->end_step += cfg->outer.H;
    loco_warn("coordinator: a fault's cycle is still open (%s): the run goes on to inner step "
              "%lld (at most %lld)", why, (long long)c->end_step, (long long)limit);
    /* the reason quotes event fields: keep it a JSON string */
    char esc[300];
    size_t o = 0;
    for (const char *p = why; *p && o + 2 < sizeof esc; p++)
        esc[o++] = *p == '"' || *p == '\\' ? '\'' : (unsigned char)*p < 0x20 ? ' ' : *p;
    esc[o] = '\0';
    loco__coord_event(c,
                      "\"kind\":\"extend\",\"end_step\":%lld,\"train_steps\":%lld,\"limit\":%lld,"
                      "\"outer_step\":%lld,\"why\":\"%s\"",
                      (long long)c->end_step, (long long)cfg->train.steps, (long long)limit,
                      (long long)s, esc);
}

/* The tokens island i trains on in one outer period, as its site's keys
 * set them (outer.H x batch x seq_len x grad_accum x dp): its weight in
 * the quorum. Read once: the config does not change. */
static double site_tokens(loco_coord *c, int i) {
    if (c->site_tokens[i] > 0)
        return c->site_tokens[i];
    loco_config *site = loco_alloc(sizeof *site);
    if (!site)
        return 1;
    *site = c->cfg;
    double w = 1;
    if (loco_config_for_site(site, c->sites[i]) == 0)
        w = (double)site->outer.H * (double)site->train.batch_size * (double)site->model.seq_len *
            (double)site->train.grad_accum * (double)site->parallel.dp;
    loco_free(site);
    return c->site_tokens[i] = w;
}

/* outer.quorum: the ready members hold that share of the members' tokens,
 * or outer.grace_s passed since the first was ready. */
static bool quorum_reached(loco_coord *c, int64_t s, uint64_t mem, uint64_t ready) {
    double all = 0, have = 0;
    for (int i = 0; i < c->n; i++) {
        if (!loco_quorum_has(mem, i))
            continue;
        const double w = site_tokens(c, i);
        all += w;
        have += loco_quorum_has(ready, i) ? w : 0;
    }
    if (have >= c->cfg.outer.quorum * all) {
        loco_info("coordinator: outer step %lld: a quorum (%.0f%% of the tokens) is ready",
                  (long long)s, 100 * have / all);
        return true;
    }
    if (loco_now() - c->gather_t0 >= c->cfg.outer.grace_s) {
        loco_info("coordinator: outer step %lld: outer.grace_s (%g s) passed with %.0f%% of the "
                  "tokens ready", (long long)s, c->cfg.outer.grace_s, 100 * have / all);
        return true;
    }
    return false;
}

int loco__coord_try_go(loco_coord *c) {
    if (!c->started || c->exchanging)
        return 0;
    const int64_t s = c->committed + 1;
    uint64_t mem = loco__coord_members(c), ready = 0;
    /* A member that said BYE trains no more: not waited for (an island
     * that missed a held end must not hold the others). */
    for (int i = 0; i < c->n; i++)
        if (c->isl[i].bye)
            mem &= ~(1ull << i);
    for (int i = 0; i < c->n; i++)
        if (loco_quorum_has(mem, i) && c->isl[i].ready_step == s)
            ready |= 1ull << i;
    if (!ready)
        return 0;
    if (!c->gather_t0)
        c->gather_t0 = loco_now();
    if (ready != mem) {
        const bool quorum = c->cfg.outer.quorum > 0;
        if (quorum ? !quorum_reached(c, s, mem, ready)
                   : strcmp(c->cfg.faulttol.straggler_policy, "drop") ||
                         loco_now() - c->gather_t0 < c->cfg.faulttol.straggler_ms / 1e3)
            return 0;
        for (int i = 0; i < c->n; i++)
            if (loco_quorum_has(mem & ~ready, i)) {
                c->isl[i].status = OUT;
                if (quorum) { /* late, not suspect: its work comes with its next contribution */
                    loco_info("coordinator: outer step %lld goes without %s (late; it fetches "
                              "the step and folds its work into its next contribution)",
                              (long long)s, c->sites[i]);
                    loco__coord_event(c, "\"kind\":\"late\",\"site\":\"%s\",\"outer_step\":%lld",
                                      c->sites[i], (long long)s);
                    continue;
                }
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
        LOCO_CHECK(loco__coord_new_epoch(c, quorum ? "late islands left out of a step"
                                                   : "stragglers left out"));
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
        loco__coord_mask_sites(c, mem | obs, list, sizeof list);
        loco__coord_event(c,
                          "\"kind\":\"quorum\",\"epoch\":%llu,\"members\":[%s],\"outer_step\":%lld,"
                          "\"why\":\"islands rejoin\"",
                          (unsigned long long)c->epoch, list, (long long)s);
    }
    hold_end(c, s);
    LOCO_CHECK(
        loco__coord_journal(c,
                            "{\"k\":\"go\",\"step\":%lld,\"epoch\":%llu,\"members\":\"%llx\","
                            "\"observers\":\"%llx\"}",
                            (long long)s, (unsigned long long)c->epoch, (unsigned long long)mem,
                            (unsigned long long)obs));
    c->go_members = mem;
    c->go_observers = obs;
    c->exchanging = true;
    LOCO_CHECK(loco__coord_announce(c, mem | obs, s, mem, obs));
    return 0;
}

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

/* An OUTER frame of island i, sent in epoch `sent_epoch` (its header's:
 * the newest epoch the island had heard of). */
int loco__coord_handle_outer(loco_coord *c, int i, uint64_t sent_epoch, const char *json,
                             size_t len) {
    island *is = &c->isl[i];
    loco__outer_msg m;
    int rc = 0;
    if (loco__coord_outer_parse(&m, json, len) < 0) {
        loco_warn("coordinator: malformed OUTER from %s: ignored", c->sites[i]);
        goto out;
    }
    const int64_t s = m.outer_step;
    if (!strcmp(m.phase, "ready")) {
        /* A member's READY from before the epoch now (a replay, or one the
         * announcement of this epoch overtook: that announcement makes it
         * say ready again) does not count for this epoch. */
        if (is->status == MEMBER && sent_epoch < c->epoch) {
            loco_debug("coordinator: stale ready from %s (step %lld, epoch %llu)", c->sites[i],
                       (long long)s, (unsigned long long)sent_epoch);
            goto out;
        }
        is->ready_step = s;
        is->ready_have = m.have;
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
    const uint64_t epoch = m.epoch;
    if (s != c->committed + 1 || epoch != c->epoch || !c->exchanging ||
        !loco_quorum_has(c->go_members | c->go_observers, i)) {
        loco_debug("coordinator: stale %s from %s (step %lld epoch %llu)", m.phase, c->sites[i],
                   (long long)s, (unsigned long long)epoch);
        goto out;
    }
    is->done_step = s;
    is->done_epoch = epoch;
    is->done_ok = !strcmp(m.phase, "done");
    is->done_hash = m.hash;
    is->suspects = m.suspects;
    if (is->done_ok) {
        rc = loco__coord_try_commit(c);
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
        loco__coord_restart_run(c);
        goto out;
    }
    rc = loco__coord_new_epoch(c, why);
out:
    return rc < 0 ? rc : 0;
}

int loco__coord_outer_parse(loco__outer_msg *m, const char *json, size_t len) {
    cJSON *j = cJSON_ParseWithLength(json, len);
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(j, "phase");
    const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
    const cJSON *hv = cJSON_GetObjectItemCaseSensitive(j, "have");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(j, "epoch");
    const cJSON *hh = cJSON_GetObjectItemCaseSensitive(j, "hash");
    const cJSON *su = cJSON_GetObjectItemCaseSensitive(j, "suspects");
    int rc = 0;
    if (!cJSON_IsString(ph) || !loco__coord_num_in(os, 0, LOCO_JSON_NUM_MAX) ||
        !loco__coord_num_in(hv, 0, LOCO_JSON_NUM_MAX) || !loco__coord_num_in(ep, 0, LOCO_JSON_NUM_MAX) ||
        !cJSON_IsString(hh) || !cJSON_IsString(su) ||
        (strcmp(ph->valuestring, "ready") && strcmp(ph->valuestring, "done") &&
         strcmp(ph->valuestring, "failed"))) {
        rc = LOCO_ERR(LOCO_EPROTO, "malformed OUTER");
        goto out;
    }
    *m = (loco__outer_msg){.outer_step = (int64_t)os->valuedouble,
                           .have = (int64_t)hv->valuedouble,
                           .epoch = (uint64_t)ep->valuedouble,
                           .hash = strtoull(hh->valuestring, NULL, 16),
                           .suspects = strtoull(su->valuestring, NULL, 16)};
    snprintf(m->phase, sizeof m->phase, "%s", ph->valuestring);
out:
    cJSON_Delete(j);
    return rc;
}
