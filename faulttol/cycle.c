/* Why one file: one concept, what a fault run's timeline says of its
 * faults (the plan, the cycles, the progress read off it); split it when a
 * second reader of the timeline needs more than these.
 *
 * The fault lab's one table of fault kinds (docs/FAULTS.md): for each kind
 * the [faults] key that asks for it, what turns it off for the fault-free
 * baseline, and its cycle — injected, detected, recovered — read off the
 * run's timeline (events.jsonl). `loco launch` writes the plan of faults
 * into the start event; the report's verdict, the launcher's exit status
 * and the coordinator's decision to hold the end of a run all read the
 * cycles from here, so a fault means one thing everywhere. */
#include "faulttol/faulttol.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What closes a cycle once the fault is detected (or injected, when
 * nothing detects it). */
typedef enum {
    REC_NONE,        /* detection is the whole cycle */
    REC_REJOIN,      /* the site's join, after its action (restart, thaw) when it has one */
    REC_COMMIT,      /* the next commit: nothing was applied, the run went on */
    REC_COMMIT_PAIR, /* a commit with both sites of the pair as members */
    REC_HEAL,        /* the heal, and the rejoin of a side that was left out */
    REC_COORDINATOR, /* the coordinator back and a quorum or commit after it */
} recovery;

/* What detects it. */
typedef enum {
    DET_NONE,             /* nothing needs to: absorbed (link change, duplicates) */
    DET_SUSPECT,          /* the site leaves the quorum */
    DET_REFUSED,          /* an island refuses a frame */
    DET_FAILED,           /* an exchange fails */
    DET_FAILED_OR_SUSPECT /* either, for the site or its peer */
} detection;

static const struct fault_kind {
    const char *name;     /* the fault event's "fault" */
    const char *clear[2]; /* --set values that turn it off (the baseline) */
    const char *action;   /* the injected event that starts its recovery, or NULL */
    detection det;
    recovery rec;
    const char *cycle; /* the cycle, in words (report, docs) */
} kinds[] = {
    {"kill", {"faults.kill=", NULL}, "restart", DET_SUSPECT, REC_REJOIN,
     "SIGKILL → suspected → restarted → rejoined"},
    {"freeze", {"faults.freeze=", NULL}, "thaw", DET_SUSPECT, REC_REJOIN,
     "SIGSTOP → suspected → thawed → rejoined"},
    {"partition", {"faults.partition=", NULL}, "heal", DET_FAILED_OR_SUSPECT, REC_HEAL,
     "links cut → exchange failed or a side left → healed → the side left out rejoined"},
    {"link", {"faults.link=", NULL}, NULL, DET_NONE, REC_COMMIT_PAIR,
     "link degraded → an outer step committed across it"},
    {"corrupt", {"faults.corrupt=0", NULL}, NULL, DET_REFUSED, REC_COMMIT,
     "frame corrupted → refused by its receiver → next commit"},
    {"drop", {"faults.drop=0", NULL}, NULL, DET_FAILED, REC_COMMIT,
     "frame dropped → exchange failed → next commit"},
    {"duplicate", {"faults.duplicate=0", NULL}, NULL, DET_NONE, REC_COMMIT,
     "frames sent twice → absorbed → a commit"},
    {"reorder", {"faults.reorder=0", NULL}, NULL, DET_NONE, REC_COMMIT,
     "frames held back → absorbed → a commit"},
    {"slow", {"faults.slow=", NULL}, NULL, DET_SUSPECT, REC_REJOIN,
     "straggler → left out (drop policy) → caught up and rejoined"},
    {"poison", {"faults.poison=", NULL}, NULL, DET_REFUSED, REC_REJOIN,
     "bad pseudo-gradient → refused, its island dropped → rejoined"},
    {"kill_coordinator",
     {"faults.coordinator_kill_s=0", "faults.coordinator_kill_step=0"},
     "restart_coordinator",
     DET_NONE,
     REC_COORDINATOR,
     "coordinator SIGKILL → restarted → a quorum or commit after it"},
};
#define N_KINDS (sizeof kinds / sizeof *kinds)

static const struct fault_kind *kind_of(const char *name) {
    for (size_t i = 0; name && i < N_KINDS; i++)
        if (!strcmp(kinds[i].name, name))
            return &kinds[i];
    return NULL;
}

bool loco_faults_active(const loco_config *c) {
    const __typeof__(c->faults) *f = &c->faults;
    return f->kill[0] || f->freeze[0] || f->partition[0] || f->link[0] || f->corrupt > 0 ||
           f->drop > 0 || f->duplicate > 0 || f->reorder > 0 || f->slow[0] || f->poison[0] ||
           f->coordinator_kill_s > 0 || f->coordinator_kill_step > 0;
}

int loco_faults_clear_sets(const char **out, int cap) {
    int n = 0;
    for (size_t i = 0; i < N_KINDS; i++)
        for (int k = 0; k < 2 && kinds[i].clear[k]; k++) {
            if (n >= cap)
                return LOCO_ERR(LOCO_EINVAL, "faults: more than %d settings clear them", cap);
            out[n++] = kinds[i].clear[k];
        }
    return n;
}

const char *loco_fault_cycle_words(const char *fault) {
    const struct fault_kind *k = kind_of(fault);
    return k ? k->cycle : NULL;
}

/* ------------------------------------------------------------- the plan */

typedef struct {
    cJSON *arr;
} plan;

static void plan_add(plan *p, const char *fault, const char *site, const char *peer,
                     const char *due, bool detect, bool recover) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "fault", fault);
    if (site)
        cJSON_AddStringToObject(o, "site", site);
    if (peer)
        cJSON_AddStringToObject(o, "peer", peer);
    cJSON_AddStringToObject(o, "due", due);
    cJSON_AddBoolToObject(o, "detect", detect);
    cJSON_AddBoolToObject(o, "recover", recover);
    cJSON_AddItemToArray(p->arr, o);
}

/* SITE@STEP[...] lists: one entry each. */
static void plan_sites(plan *p, const char *fault, const char *spec, bool detect, bool recover) {
    char buf[LOCO_PATH_MAX + 64], due[96];
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@');
        if (!at)
            continue; /* loco_faults_parse refuses it with the reason */
        *at = '\0';
        snprintf(due, sizeof due, "inner step %lld", atoll(at + 1));
        plan_add(p, fault, tok, NULL, due, detect, recover);
    }
}

/* A pair spec SITEA-SITEB@STEP...: one entry. */
static void plan_pair(plan *p, const char *fault, const char *spec, bool detect) {
    char buf[LOCO_PATH_MAX + 64], due[96];
    snprintf(buf, sizeof buf, "%s", spec);
    char *dash = strchr(buf, '-'), *at = strchr(buf, '@');
    if (!dash || !at || at < dash)
        return;
    *dash = *at = '\0';
    snprintf(due, sizeof due, "inner step %lld", atoll(at + 1));
    plan_add(p, fault, buf, dash + 1, due, detect, true);
}

char *loco_faults_plan_json(const loco_config *c) {
    const __typeof__(c->faults) *f = &c->faults;
    plan p = {cJSON_CreateArray()};
    if (!p.arr)
        return NULL;
    const bool restarts = f->restart_ms >= 0 || f->restart_after_steps > 0;
    plan_sites(&p, "kill", f->kill, true, restarts);
    plan_sites(&p, "freeze", f->freeze, true, true);
    if (f->partition[0])
        plan_pair(&p, "partition", f->partition, true);
    if (f->link[0])
        plan_pair(&p, "link", f->link, false);
    const char *frames[4] = {"corrupt", "drop", "duplicate", "reorder"};
    const double probs[4] = {f->corrupt, f->drop, f->duplicate, f->reorder};
    for (int k = 0; k < 4; k++)
        if (probs[k] > 0)
            plan_add(&p, frames[k], NULL, NULL, "from the start", k < 2, true);
    if (f->slow[0]) {
        char site[LOCO_NET_NAME_MAX];
        snprintf(site, sizeof site, "%.*s", (int)strcspn(f->slow, "*"), f->slow);
        /* Only the drop policy leaves a straggler out; with wait the others wait. */
        const bool drop = !strcmp(c->faulttol.straggler_policy, "drop");
        plan_add(&p, "slow", site, NULL, "from the start", drop, drop);
    }
    if (f->poison[0])
        plan_sites(&p, "poison", f->poison, true, true);
    if (f->coordinator_kill_step > 0 || f->coordinator_kill_s > 0) {
        char due[96];
        if (f->coordinator_kill_step > 0)
            snprintf(due, sizeof due, "inner step %lld", (long long)f->coordinator_kill_step);
        else
            snprintf(due, sizeof due, "%.2f s after the start", f->coordinator_kill_s);
        plan_add(&p, "kill_coordinator", "coordinator", NULL, due, false, true);
    }
    char *s = cJSON_PrintUnformatted(p.arr);
    cJSON_Delete(p.arr);
    return s;
}

/* ----------------------------------------------------------- the cycles */

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(j) ? j->valuestring : NULL;
}

static double jt(const cJSON *e) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(e, "t");
    return cJSON_IsNumber(j) ? j->valuedouble : NAN;
}

static bool is_kind(const cJSON *e, const char *kind) {
    const char *k = jstr(e, "kind");
    return k && !strcmp(k, kind);
}

static bool same(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static bool members_has(const cJSON *e, const char *site) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "members"), *x;
    cJSON_ArrayForEach(x, m) if (cJSON_IsString(x) && same(x->valuestring, site)) return true;
    return false;
}

/* The first event of `kind` at index > from and time >= t, for site or
 * peer when one is given; -1 when none. */
static int next(cJSON *const *ev, int nev, int from, double t, const char *kind, const char *site,
                const char *peer) {
    for (int i = from + 1; i < nev; i++) {
        if (!is_kind(ev[i], kind) || !(jt(ev[i]) >= t))
            continue;
        if ((!site && !peer) || same(jstr(ev[i], "site"), site) || same(jstr(ev[i], "site"), peer))
            return i;
    }
    return -1;
}

/* The first injected `fault` event for site (and peer) after index from. */
static int next_fault(cJSON *const *ev, int nev, int from, const char *fault, const char *site) {
    for (int i = from + 1; i < nev; i++)
        if (is_kind(ev[i], "fault") && same(jstr(ev[i], "fault"), fault) &&
            (!site || same(jstr(ev[i], "site"), site) || same(jstr(ev[i], "peer"), site)))
            return i;
    return -1;
}

static void note(loco_fault_cycle *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(loco_fault_cycle *c, const char *fmt, ...) {
    size_t n = strlen(c->notes);
    if (n && n + 2 < sizeof c->notes) {
        memcpy(c->notes + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->notes + n, sizeof c->notes - n, fmt, ap);
    va_end(ap);
}

static void missing(loco_fault_cycle *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void missing(loco_fault_cycle *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->missing, sizeof c->missing, fmt, ap);
    va_end(ap);
    c->complete = false;
    c->can_complete = true;
}

/* The join of site after t, -1 when none. */
static int rejoin(cJSON *const *ev, int nev, int from, double t, const char *site) {
    return next(ev, nev, from, t, "join", site, NULL);
}

/* Detection of the cycle at ev[i]: sets c->detected; the index of the
 * detecting event or -1. */
static int detect(cJSON *const *ev, int nev, int i, const struct fault_kind *k,
                  loco_fault_cycle *c) {
    const double t = c->injected;
    int d = -1;
    switch (k->det) {
    case DET_NONE:
        return -1;
    case DET_SUSPECT:
        d = next(ev, nev, i, t, "suspect", c->site, NULL);
        break;
    case DET_REFUSED:
        d = next(ev, nev, i, t, "refused", NULL, NULL);
        if (c->site[0] && !strcmp(k->name, "poison")) {
            /* its island dropped counts as much as a refusal */
            int s = next(ev, nev, i, t, "suspect", c->site, NULL);
            if (d < 0 || (s >= 0 && s < d))
                d = s;
        }
        break;
    case DET_FAILED:
        d = next(ev, nev, i, t, "exchange_failed", NULL, NULL);
        break;
    case DET_FAILED_OR_SUSPECT: {
        d = next(ev, nev, i, t, "exchange_failed", NULL, NULL);
        int s = next(ev, nev, i, t, "suspect", c->site, c->peer[0] ? c->peer : NULL);
        if (d < 0 || (s >= 0 && s < d))
            d = s;
        break;
    }
    }
    if (d >= 0) {
        c->detected = jt(ev[d]);
        const char *why = jstr(ev[d], "reason");
        const char *who = jstr(ev[d], "site");
        if (is_kind(ev[d], "suspect"))
            note(c, "%s suspected%s%s%s", who ? who : "an island", why ? " (" : "", why ? why : "",
                 why ? ")" : "");
        else if (is_kind(ev[d], "refused"))
            note(c, "refused by %s%s%s%s", who ? who : "an island", why ? " (" : "",
                 why ? why : "", why ? ")" : "");
        else
            note(c, "exchange of outer step %.0f failed",
                 cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(ev[d], "outer_step"))
                     ? cJSON_GetObjectItemCaseSensitive(ev[d], "outer_step")->valuedouble
                     : 0.0);
    }
    return d;
}

/* The cycle of the fault injected at ev[i] (its kind k), as far as the
 * timeline goes; expect_detect/expect_recover from the plan. */
static void analyse(cJSON *const *ev, int nev, int i, const struct fault_kind *k,
                    bool expect_detect, bool expect_recover, loco_fault_cycle *c) {
    c->injected = jt(ev[i]);
    c->complete = true;
    const char *detail = jstr(ev[i], "detail");
    if (detail && detail[0])
        note(c, "%s", detail);
    int d = detect(ev, nev, i, k, c);
    if (d < 0 && k->det != DET_NONE && expect_detect) {
        missing(c, "not detected");
        /* over before anyone noticed (a freeze thawed, a cut healed):
         * nothing can detect it any more */
        c->can_complete = !(k->action && next_fault(ev, nev, i, k->action,
                                                    c->site[0] ? c->site : NULL) >= 0);
        return;
    }
    const double from_t = d >= 0 ? c->detected : c->injected;
    const int from_i = d >= 0 ? d : i;
    if (!expect_recover)
        return;
    /* Its recovery action (restart, thaw, heal), injected by whoever
     * injected the fault. */
    int a = -1;
    if (k->action) {
        a = next_fault(ev, nev, i, k->action, c->site[0] ? c->site : NULL);
        if (a < 0) {
            missing(c, "never %s", !strcmp(k->action, "thaw")   ? "thawed"
                               : !strcmp(k->action, "heal") ? "healed"
                                                            : "restarted");
            return;
        }
        c->action = jt(ev[a]);
    }
    int r = -1;
    const char *who = c->site;
    switch (k->rec) {
    case REC_NONE:
        return;
    case REC_REJOIN:
        if (k->det == DET_SUSPECT && d < 0) {
            /* never left out (a straggler under the wait policy): a commit
             * with it as a member closes the cycle */
            for (int j = i + 1; j < nev && r < 0; j++)
                if (is_kind(ev[j], "commit") && members_has(ev[j], who))
                    r = j;
            break;
        }
        if (!strcmp(k->name, "poison") && d >= 0 && !is_kind(ev[d], "suspect")) {
            int s = next(ev, nev, d - 1, c->detected, "suspect", who, NULL);
            if (s < 0) {
                missing(c, "%s was refused but never dropped", who);
                return;
            }
        }
        r = rejoin(ev, nev, a >= 0 ? (a > from_i ? a : from_i) : from_i,
                   a >= 0 && c->action > from_t ? c->action : from_t, who);
        if (r < 0) {
            missing(c, "%s never came back", who);
            return;
        }
        note(c, "%s rejoined", who);
        break;
    case REC_COMMIT:
        r = next(ev, nev, from_i, from_t, "commit", NULL, NULL);
        break;
    case REC_COMMIT_PAIR:
        for (int j = i + 1; j < nev && r < 0; j++)
            if (is_kind(ev[j], "commit") && members_has(ev[j], c->site) &&
                members_has(ev[j], c->peer))
                r = j;
        if (r >= 0)
            note(c, "outer step %.0f committed across it",
                 cJSON_GetObjectItemCaseSensitive(ev[r], "outer_step")
                     ? cJSON_GetObjectItemCaseSensitive(ev[r], "outer_step")->valuedouble
                     : 0.0);
        break;
    case REC_HEAL:
        note(c, "healed");
        r = a;
        if (d >= 0 && is_kind(ev[d], "suspect")) {
            const char *out = jstr(ev[d], "site");
            r = rejoin(ev, nev, a, c->action, out);
            if (r < 0) {
                missing(c, "%s never came back after the heal", out ? out : "the side left out");
                return;
            }
            note(c, "%s rejoined", out);
        }
        break;
    case REC_COORDINATOR: {
        int q = next(ev, nev, a, c->action, "quorum", NULL, NULL);
        int m = next(ev, nev, a, c->action, "commit", NULL, NULL);
        r = q < 0 ? m : m < 0 ? q : (q < m ? q : m);
        if (r >= 0)
            note(c, "first %s after it", jstr(ev[r], "kind"));
        break;
    }
    }
    if (r < 0) {
        missing(c, "not recovered: no %s after it",
                k->rec == REC_COMMIT_PAIR ? "commit across the link"
                : k->rec == REC_COORDINATOR ? "quorum or commit of the restarted coordinator"
                                            : "commit");
        return;
    }
    c->recovered = jt(ev[r]);
}

/* How far the run got, for a fault never injected. */
static void run_reach(cJSON *const *ev, int nev, char *out, size_t cap) {
    double top = -1;
    bool ended = false;
    for (int i = 0; i < nev; i++) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(ev[i], "outer_step");
        if (is_kind(ev[i], "commit") && cJSON_IsNumber(s) && s->valuedouble > top)
            top = s->valuedouble;
        ended |= is_kind(ev[i], "end");
    }
    if (top >= 0)
        snprintf(out, cap, "the run %s at outer step %.0f", ended ? "ended" : "stopped", top);
    else
        snprintf(out, cap, "the run %s before its first commit", ended ? "ended" : "stopped");
}

static void cycle_init(loco_fault_cycle *c, const char *fault, const char *site, const char *peer) {
    memset(c, 0, sizeof *c);
    snprintf(c->fault, sizeof c->fault, "%s", fault ? fault : "?");
    snprintf(c->site, sizeof c->site, "%s", site ? site : "");
    snprintf(c->peer, sizeof c->peer, "%s", peer ? peer : "");
    c->injected = c->detected = c->action = c->recovered = NAN;
}

int loco_fault_cycles(cJSON *const *ev, int nev, loco_fault_cycle *out, int cap) {
    const cJSON *planned = NULL;
    for (int i = 0; i < nev && !planned; i++)
        if (is_kind(ev[i], "start"))
            planned = cJSON_GetObjectItemCaseSensitive(ev[i], "planned");
    int n = 0, np = cJSON_GetArraySize(planned);
    bool *used = calloc((size_t)(np > 0 ? np : 1), 1);
    if (!used)
        return LOCO_ERR(LOCO_ENOMEM, "fault cycles");
    /* Every injected fault that starts a cycle, matched to its plan entry. */
    for (int i = 0; i < nev && n < cap; i++) {
        const char *fault = jstr(ev[i], "fault");
        const struct fault_kind *k = is_kind(ev[i], "fault") ? kind_of(fault) : NULL;
        if (!k)
            continue; /* a recovery action, or not a fault */
        const char *site = jstr(ev[i], "site"), *peer = jstr(ev[i], "peer");
        bool det = true, rec = true;
        for (int p = 0; p < np; p++) {
            const cJSON *e = cJSON_GetArrayItem(planned, p);
            const char *ps = jstr(e, "site"), *pp = jstr(e, "peer");
            if (used[p] || !same(jstr(e, "fault"), fault))
                continue;
            /* frame faults name the island that announced them, not the plan's */
            if (ps && !(same(ps, site) || same(ps, peer)) )
                continue;
            if (pp && !(same(pp, site) || same(pp, peer)))
                continue;
            used[p] = true;
            det = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(e, "detect"));
            rec = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(e, "recover"));
            break;
        }
        loco_fault_cycle *c = &out[n++];
        cycle_init(c, fault, site, peer);
        c->injected_ok = true;
        analyse(ev, nev, i, k, det, rec, c);
    }
    /* Planned and never injected: the run ended first (or the plan's
     * process never got there). */
    for (int p = 0; p < np && n < cap; p++) {
        if (used[p])
            continue;
        const cJSON *e = cJSON_GetArrayItem(planned, p);
        loco_fault_cycle *c = &out[n++];
        cycle_init(c, jstr(e, "fault"), jstr(e, "site"), jstr(e, "peer"));
        char reach[96];
        run_reach(ev, nev, reach, sizeof reach);
        const char *due = jstr(e, "due");
        missing(c, "not injected: due at %s; %s", due ? due : "?", reach);
    }
    free(used);
    return n;
}

/* ------------------------------------------------------- the timeline */

/* Sorts events by time, keeping the file order of events of equal time:
 * a merge sort (qsort is not stable). */
static int sort_by_time(cJSON **ev, int n, const char *path) {
    cJSON **tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    if (!tmp)
        return LOCO_ERR(LOCO_ENOMEM, "%s: sorting %d events", path, n);
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            const int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = jt(ev[j]) < jt(ev[i]) ? ev[j++] : ev[i++];
            while (i < mid)
                tmp[k++] = ev[i++];
            while (j < hi)
                tmp[k++] = ev[j++];
        }
        memcpy(ev, tmp, (size_t)n * sizeof *tmp);
    }
    free(tmp);
    return 0;
}

/* Appends event j to *ev (taking it); LOCO_ENOMEM leaves j to the caller. */
static int push_event(cJSON ***ev, int *nev, int *cap, cJSON *j, const char *path) {
    if (*nev == *cap) {
        const int c = *cap ? 2 * *cap : 64;
        cJSON **g = realloc(*ev, (size_t)c * sizeof *g);
        if (!g)
            return LOCO_ERR(LOCO_ENOMEM, "%s: events", path);
        *ev = g;
        *cap = c;
    }
    (*ev)[(*nev)++] = j;
    return 0;
}

int loco_events_load(const char *path, cJSON ***ev, int *nev, loco_events_skip_fn skip,
                     void *arg) {
    *ev = NULL;
    *nev = 0;
    void *data;
    size_t len;
    LOCO_CHECK(loco_file_read(path, &data, &len)); /* LOCO_EIO naming the file */
    const char *s = data, *end = s + len;
    int cap = 0, rc = 0;
    for (int line = 1; s < end && rc == 0; line++) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *e = nl ? nl : end;
        const char *p = s;
        while (p < e && (*p == ' ' || *p == '\t' || *p == '\r'))
            p++;
        if (p < e) {
            cJSON *j = cJSON_ParseWithLength(s, (size_t)(e - s));
            const char *why = !cJSON_IsObject(j) ? "not a JSON object"
                              : isnan(jt(j)) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "kind"))
                                  ? "an event without a numeric \"t\" and a \"kind\""
                                  : NULL;
            if (why) {
                if (skip)
                    skip(arg, path, line, why);
                cJSON_Delete(j);
            } else if ((rc = push_event(ev, nev, &cap, j, path)) < 0) {
                cJSON_Delete(j);
            }
        }
        s = e + 1;
    }
    loco_free(data);
    if (rc == 0)
        rc = sort_by_time(*ev, *nev, path);
    if (rc < 0) {
        loco_events_free(*ev, *nev);
        *ev = NULL;
        *nev = 0;
    }
    return rc;
}

void loco_events_free(cJSON **ev, int nev) {
    for (int i = 0; i < nev; i++)
        cJSON_Delete(ev[i]);
    free(ev);
}

int loco_fault_cycles_open(const char *events_path, char *why, size_t cap) {
    cJSON **ev;
    int nev;
    if (why && cap)
        why[0] = '\0';
    if (loco_events_load(events_path, &ev, &nev, NULL, NULL) < 0)
        return 0; /* no timeline: nothing was injected that it knows of */
    loco_fault_cycle cyc[LOCO_MAX_CYCLES];
    int n = loco_fault_cycles(ev, nev, cyc, LOCO_MAX_CYCLES), open = 0;
    for (int i = 0; i < n; i++)
        if (cyc[i].injected_ok && !cyc[i].complete && cyc[i].can_complete) {
            if (!open && why && cap)
                snprintf(why, cap, "%s%s%s: %s", cyc[i].fault, cyc[i].site[0] ? " of " : "",
                         cyc[i].site, cyc[i].missing);
            open++;
        }
    loco_events_free(ev, nev);
    return n < 0 ? n : open;
}

int loco_fault_cycles_print(const char *events_path, FILE *out, int *open) {
    cJSON **ev;
    int nev;
    *open = 0;
    LOCO_CHECK(loco_events_load(events_path, &ev, &nev, NULL, NULL));
    loco_fault_cycle cyc[LOCO_MAX_CYCLES];
    int n = loco_fault_cycles(ev, nev, cyc, LOCO_MAX_CYCLES);
    double t0 = nev ? jt(ev[0]) : 0;
    loco_events_free(ev, nev);
    if (n < 0)
        return n;
    for (int i = 0; i < n; i++) {
        const loco_fault_cycle *c = &cyc[i];
        char when[64] = "";
        if (c->injected_ok)
            snprintf(when, sizeof when, " at %.2f s", c->injected - t0);
        fprintf(out, "faults: %s%s%s%s%s%s: %s%s\n", c->fault, c->site[0] ? " " : "", c->site,
                c->peer[0] ? "-" : "", c->peer, when,
                c->complete ? "cycle complete" : "INCOMPLETE: ", c->complete ? "" : c->missing);
        *open += !c->complete;
    }
    return n;
}

int64_t loco_faults_commit_at(const loco_config *c, int64_t s) {
    const int64_t F = c->outer.fragments > 0 ? c->outer.fragments : 1;
    const int64_t P = c->outer.H / F;
    return P > 0 ? (s + P - 1) / P : s;
}

void loco_run_progress_read(loco_run_progress *p, const char *events_path) {
    FILE *f = fopen(events_path, "r");
    if (!f)
        return;
    if (fseek(f, p->offset, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    char line[4096];
    for (;;) {
        long at = ftell(f);
        if (!fgets(line, sizeof line, f))
            break;
        if (!strchr(line, '\n')) { /* a line still being written: read it next time */
            fseek(f, at, SEEK_SET);
            break;
        }
        p->offset = ftell(f);
        cJSON *j = cJSON_Parse(line);
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
        if (is_kind(j, "commit") && cJSON_IsNumber(s) && s->valuedouble > (double)p->committed)
            p->committed = (int64_t)s->valuedouble;
        if (is_kind(j, "end")) {
            p->ended = true;
            p->finished |= same(jstr(j, "status"), "finished");
        }
        cJSON_Delete(j);
    }
    fclose(f);
}
