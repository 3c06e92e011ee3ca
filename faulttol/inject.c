/* Fault injection of the fault lab ([faults], docs/FAULTS.md): what one
 * island does to itself and to its island-to-island links, at the inner
 * steps the config names, and the timeline events that record it. */
#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A string as a JSON string literal (quotes included) in out. */
static void json_str(const char *in, char *out, size_t cap) {
    cJSON *j = cJSON_CreateString(in);
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    snprintf(out, cap, "%s", t ? t : "\"\"");
    cJSON_free(t);
    cJSON_Delete(j);
}

void loco_faults_refused_event(const loco_faults *f, const char *reason) {
    const char *path = getenv("LOCO_EVENTS");
    if (!path || !f->events)
        return;
    char r[400];
    json_str(reason, r, sizeof r);
    loco_event_append(path, "\"kind\":\"refused\",\"site\":\"%s\",\"reason\":%s", f->site, r);
}

void loco_faults_event(const loco_faults *f, const char *fault, const char *peer,
                       const char *detail) {
    const char *path = getenv("LOCO_EVENTS");
    if (!path || !f->events)
        return;
    char d[400], p[96] = "";
    json_str(detail, d, sizeof d);
    if (peer)
        snprintf(p, sizeof p, ",\"peer\":\"%s\"", peer);
    loco_event_append(path, "\"kind\":\"fault\",\"fault\":\"%s\",\"site\":\"%s\"%s,\"detail\":%s",
                      fault, f->site, p, d);
}

int loco_faults_parse(loco_faults *f, const loco_config *c, const char *site, int id,
                      bool events) {
    memset(f, 0, sizeof *f);
    snprintf(f->site, sizeof f->site, "%s", site);
    f->id = id;
    f->events = events;
    f->slow = 1;
    f->part_peer = f->link_peer = -1;
    char buf[LOCO_PATH_MAX + 64];
    /* kill = SITE@STEP,...: only the first incarnation (launch marks restarts). */
    snprintf(buf, sizeof buf, "%s", c->faults.kill);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@');
        if (!at)
            return LOCO_ERR(LOCO_EINVAL, "faults.kill: '%s': expected SITE@STEP", tok);
        *at = '\0';
        if (!strcmp(tok, f->site) && !getenv("LOCO_RESTARTED"))
            f->kill_step = atoll(at + 1);
    }
    snprintf(buf, sizeof buf, "%s", c->faults.freeze);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@'), *plus = at ? strchr(at, '+') : NULL;
        if (!at || !plus)
            return LOCO_ERR(LOCO_EINVAL, "faults.freeze: '%s': expected SITE@STEP+MS", tok);
        *at = '\0';
        if (!strcmp(tok, f->site) && !getenv("LOCO_RESTARTED")) {
            f->freeze_step = atoll(at + 1);
            f->freeze_ms = atoll(plus + 1);
            if (c->faults.thaw_after_steps > 0) {
                f->thaw_commit = loco_faults_commit_at(c, f->freeze_step + c->faults.thaw_after_steps);
                f->thaw_span = loco_faults_commit_at(c, c->faults.thaw_after_steps);
            }
        }
    }
    /* poison = SITE@STEP*FACTOR: first incarnation only, like kill. */
    f->poison_factor = 1;
    if (c->faults.poison[0]) {
        snprintf(buf, sizeof buf, "%s", c->faults.poison);
        char *at = strchr(buf, '@'), *star = at ? strchr(at, '*') : NULL, *end = NULL;
        double factor = star ? strtod(star + 1, &end) : 0;
        if (!at || !star || end == star + 1 || *end || atoll(at + 1) < 1 || !isfinite(factor))
            return LOCO_ERR(LOCO_EINVAL,
                            "faults.poison: '%s': expected SITE@STEP*FACTOR (a finite number: the "
                            "encoder refuses NaN and Inf; tests/outer sends those as a hostile "
                            "peer would)",
                            c->faults.poison);
        *at = '\0';
        if (!strcmp(buf, f->site) && !getenv("LOCO_RESTARTED")) {
            f->poison_step = atoll(at + 1);
            f->poison_factor = (float)factor;
        }
    }
    if (c->faults.slow[0]) {
        snprintf(buf, sizeof buf, "%s", c->faults.slow);
        char *star = strchr(buf, '*');
        if (!star || atof(star + 1) < 1)
            return LOCO_ERR(LOCO_EINVAL, "faults.slow: '%s': expected SITE*FACTOR (>= 1)", buf);
        *star = '\0';
        if (!strcmp(buf, f->site))
            f->slow = atof(star + 1);
    }
    /* Pair specs: SITEA-SITEB@REST. */
    const char *pairs[2] = {c->faults.partition, c->faults.link};
    for (int w = 0; w < 2; w++) {
        if (!pairs[w][0])
            continue;
        snprintf(buf, sizeof buf, "%s", pairs[w]);
        char *dash = strchr(buf, '-'), *at = strchr(buf, '@');
        if (!dash || !at || at < dash)
            return LOCO_ERR(LOCO_EINVAL, "faults.%s: '%s': expected SITEA-SITEB@...",
                            w ? "link" : "partition", pairs[w]);
        *dash = *at = '\0';
        int a, b;
        LOCO_CHECK(loco_site_id(c, buf, &a, NULL));
        LOCO_CHECK(loco_site_id(c, dash + 1, &b, NULL));
        int peer = a == f->id ? b : b == f->id ? a : -1;
        if (w == 0) {
            char *plus = strchr(at + 1, '+');
            if (!plus)
                return LOCO_ERR(LOCO_EINVAL, "faults.partition: expected ...@STEP+MS");
            f->part_peer = peer;
            f->part_step = atoll(at + 1);
            f->part_ms = atoll(plus + 1);
            if (c->faults.heal_after_steps > 0)
                f->heal_commit = loco_faults_commit_at(c, f->part_step + c->faults.heal_after_steps);
        } else {
            double d, j, g;
            char *colon = strchr(at + 1, ':');
            if (!colon || sscanf(colon + 1, "%lf/%lf/%lf", &d, &j, &g) != 3)
                return LOCO_ERR(LOCO_EINVAL,
                                "faults.link: expected ...@STEP:DELAY_MS/JITTER_MS/GBPS");
            f->link_peer = peer;
            f->link_step = atoll(at + 1);
            f->link_wan = (loco_wan){.delay_ms = d, .jitter_ms = j, .gbps = g,
                                     .seed = (uint64_t)c->faults.seed};
        }
    }
    f->frames = (loco_link_faults){.drop = c->faults.drop, .corrupt = c->faults.corrupt,
                                   .duplicate = c->faults.duplicate, .delay = c->faults.reorder,
                                   .delay_ms = (double)c->faults.reorder_ms,
                                   .types = 1u << LOCO_FRAME_PSEUDOGRAD,
                                   .seed = (uint64_t)c->faults.seed * 1000003u + (uint64_t)f->id};
    return 0;
}

float loco_faults_poison(loco_faults *f, int64_t step) {
    if (!f->poison_step || step < f->poison_step)
        return 1;
    f->poison_step = 0;
    char d[160];
    snprintf(d, sizeof d, "pseudo-gradient sent times %g at the outer step of inner step %lld",
             (double)f->poison_factor, (long long)step);
    loco_warn("faults: %s poisons its contribution: %s", f->site, d);
    loco_faults_event(f, "poison", NULL, d);
    return f->poison_factor;
}

/* Whether the run reached outer step `commit` (or ended), by its timeline. */
static bool run_reached(loco_faults *f, int64_t commit) {
    const char *path = getenv("LOCO_EVENTS");
    if (!path)
        return false; /* no timeline: the time bound alone */
    loco_run_progress_read(&f->prog, path);
    return f->prog.committed >= commit || f->prog.ended;
}

/* A partition timed by the run heals once the run got that far; MS bounds it. */
static bool heal_due(loco_faults *f) {
    return loco_now() >= f->part_until || (f->heal_commit > 0 && run_reached(f, f->heal_commit));
}

bool loco_faults_partitioned(loco_faults *f, int peer) {
    return peer == f->part_peer && f->part_until > 0 && !heal_due(f);
}

/* The faults a link to `peer` carries now. */
void loco_faults_arm_link(loco_faults *f, int peer, loco_link *l) {
    if (loco_faults_partitioned(f, peer)) {
        loco_link_faults cut = {.drop = 1.0, .seed = 1};
        loco_link_set_faults(l, &cut);
    } else if (f->frames.drop > 0 || f->frames.corrupt > 0 || f->frames.duplicate > 0 ||
               f->frames.delay > 0) {
        loco_link_set_faults(l, &f->frames);
    }
    if (f->link_done && peer == f->link_peer)
        loco_link_set_wan(l, &f->link_wan);
}

/* After inner step `step`: the faults scheduled for it. */
void loco_faults_inject(loco_faults *f, int64_t step, double step_s, loco_link *const *links,
                        const loco_quorum *q) {
    char d[160];
    if (f->kill_step && step >= f->kill_step) {
        loco_warn("faults: %s kills itself (SIGKILL) at step %lld", f->site, (long long)step);
        snprintf(d, sizeof d, "SIGKILL at inner step %lld", (long long)step);
        loco_faults_event(f, "kill", NULL, d);
        fflush(NULL);
        raise(SIGKILL);
    }
    if (f->freeze_step && step >= f->freeze_step) {
        /* Every thread stops (heartbeats too) while the sockets stay open:
         * only the failure detector can tell. A child wakes us up. */
        f->freeze_step = 0;
        /* Counted from the run's last commit too: under outer.sync = time
         * the islands' inner steps differ, and a slow island's step 40 may
         * come after the outer step the others' step 70 closes. */
        if (f->thaw_commit > 0) {
            run_reached(f, f->thaw_commit); /* reads the timeline so far */
            if (f->prog.committed + f->thaw_span > f->thaw_commit)
                f->thaw_commit = f->prog.committed + f->thaw_span;
        }
        loco_warn("faults: %s freezes (SIGSTOP) for %lld ms at step %lld", f->site,
                  (long long)f->freeze_ms, (long long)step);
        if (f->thaw_commit > 0)
            snprintf(d, sizeof d, "SIGSTOP at inner step %lld until outer step %lld commits (at "
                     "most %lld ms)", (long long)step, (long long)f->thaw_commit,
                     (long long)f->freeze_ms);
        else
            snprintf(d, sizeof d, "SIGSTOP for %lld ms at inner step %lld",
                     (long long)f->freeze_ms, (long long)step);
        loco_faults_event(f, "freeze", NULL, d);
        fflush(NULL);
        pid_t parent = getpid(), waker = fork();
        if (waker == 0) {
            /* Timed by the run: awake once the others got thaw_after_steps
             * further (or the run ended), MS at the most; else after MS. */
            const double until = loco_now() + f->freeze_ms / 1e3;
            while (loco_now() < until && !(f->thaw_commit > 0 && run_reached(f, f->thaw_commit)))
                loco_sleep_ms(f->thaw_commit > 0 ? 20 : 5);
            kill(parent, SIGCONT);
            _exit(0);
        }
        if (waker > 0) {
            raise(SIGSTOP);
            waitpid(waker, NULL, 0);
            loco_faults_event(f, "thaw", NULL, "running again");
        }
    }
    if (f->slow > 1 && step_s > 0) {
        double extra = (f->slow - 1) * step_s;
        struct timespec ts = {(time_t)extra, (long)((extra - (double)(time_t)extra) * 1e9)};
        nanosleep(&ts, NULL);
    }
    if (f->part_peer >= 0 && f->part_until == 0 && step >= f->part_step) {
        f->part_until = loco_now() + f->part_ms / 1e3;
        loco_warn("faults: %s cut from %s for %lld ms", f->site, q->m[f->part_peer].site,
                  (long long)f->part_ms);
        snprintf(d, sizeof d, "every frame between them dropped for %lld ms", (long long)f->part_ms);
        if (f->id < f->part_peer) /* one event per pair */
            loco_faults_event(f, "partition", q->m[f->part_peer].site, d);
        if (links[f->part_peer])
            loco_faults_arm_link(f, f->part_peer, links[f->part_peer]);
    }
    if (f->part_peer >= 0 && f->part_until > 0 && f->part_until != -1 && heal_due(f)) {
        loco_warn("faults: %s and %s reconnected", f->site, q->m[f->part_peer].site);
        if (f->id < f->part_peer)
            loco_faults_event(f, "heal", q->m[f->part_peer].site, "partition over");
        f->part_until = -1;
        if (links[f->part_peer])
            loco_link_set_faults(links[f->part_peer], NULL);
    }
    if (f->link_peer >= 0 && !f->link_done && step >= f->link_step) {
        f->link_done = true;
        loco_warn("faults: link %s-%s now %.0f ms delay, %.0f ms jitter, %.2f Gbit/s", f->site,
                  q->m[f->link_peer].site, f->link_wan.delay_ms, f->link_wan.jitter_ms,
                  f->link_wan.gbps);
        snprintf(d, sizeof d, "%.0f ms delay, %.0f ms jitter, %.2f Gbit/s", f->link_wan.delay_ms,
                 f->link_wan.jitter_ms, f->link_wan.gbps);
        if (f->id < f->link_peer)
            loco_faults_event(f, "link", q->m[f->link_peer].site, d);
        if (links[f->link_peer])
            loco_link_set_wan(links[f->link_peer], &f->link_wan);
    }
}
