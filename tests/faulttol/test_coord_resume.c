/* A restarted run where one island registers late (a loaded machine: it
 * loads its checkpoint seconds after the others) and another lost its
 * outer state (a torn outer_N file, or an inner checkpoint written without
 * one): the coordinator starts with those that came, after
 * faulttol.timeout_ms. The island that lost its state registers at
 * committed outer step 0 with the hash of weights that are not step 0's;
 * alone, that must not take the run back to the start. Seen once as the
 * flake of faults/torn_outer_state_is_refused_and_fetched_instead: siteA's
 * step 3 was not believed, the run resumed at 0 with siteB's weights, siteB
 * (at inner step 30) left at once, and the restarted coordinator, which
 * now knew step 0 only, believed neither siteA nor siteC again. Islands
 * are sessions in this process (plain TCP on loopback). */
#include "faulttol/faulttol.h"
#include "tests/faulttol/coord_harness.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char events[64];

/* Set once siteA or siteB got its first quorum: the run started. */
static atomic_int run_started;

/* Whether the timeline has an event of `kind` whose line holds `a` and `b`. */
static bool has_event(const char *kind, const char *a, const char *b) {
    char line[2048], k[64];
    snprintf(k, sizeof k, "\"kind\":\"%s\"", kind);
    FILE *f = fopen(events, "r");
    cr_assert(f, "%s", events);
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, k) && strstr(line, a) && (!b || strstr(line, b));
    fclose(f);
    return found;
}

/* An island that registers with `prog` (once the run started, for a late
 * one), takes 200 ms per outer step, reports the θ hash 11 × s after outer
 * step s, and, told to fetch the state, takes the step and hash the
 * coordinator names (what a state transfer gives it). */
typedef struct {
    const char *site;
    loco_island_progress prog;
    bool after_start; /* registers once the run started without it */
    int64_t last; /* it leaves once this outer step is committed */
    int rc;
    int joins, commits;
    int64_t first_join; /* the committed step its first join named (-1: none) */
    int64_t committed;  /* where it ended */
    char msg[1024];
} fake;

static void *fake_main(void *arg) {
    fake *f = arg;
    const struct timespec pause = {0, 200 * 1000000L}; /* per step: time for siteC */
    while (f->after_start && !run_started)
        nanosleep(&pause, NULL);
    loco_net_params p = np;
    snprintf(p.name, sizeof p.name, "%s", f->site);
    char addr[1][LOCO_ADDR_MAX] = {"127.0.0.1:1"};
    loco_island_info me = {.site = f->site,
                           .n_ranks = 1,
                           .addrs = (const char(*)[LOCO_ADDR_MAX])addr,
                           .mesh = "dp=1",
                           .model_hash = 5};
    loco_session *s = NULL;
    loco_quorum q = {0};
    int id = -1;
    f->first_join = -1;
    f->rc = loco_session_join(&s, &cfg, &p, &me, &f->prog, &id, &q, 30000);
    int64_t committed = f->prog.committed;
    if (f->rc == 0 && !f->after_start)
        run_started = 1;
    if (f->rc == 0 && (q.join || !loco_quorum_has(q.members, id))) {
        f->joins++;
        f->first_join = committed = q.committed;
    }
    for (int tries = 0; f->rc == 0 && committed < f->last && tries < 100; tries++) {
        const int64_t step = committed + 1;
        loco_verdict v = 0;
        nanosleep(&pause, NULL);
        loco_session_heartbeat(s, step * 10);
        f->rc = loco_session_ready(s, step, committed, &q, &v, 30000);
        if (f->rc < 0 || v == LOCO_VERDICT_FINISHED)
            break;
        if (v == LOCO_VERDICT_JOIN) {
            if (f->first_join < 0)
                f->first_join = q.committed;
            f->joins++;
            committed = q.committed;
            continue;
        }
        if (v != LOCO_VERDICT_GO)
            continue; /* AGAIN: say ready again */
        f->rc = loco_session_done(s, step, q.epoch, true, 11u * (uint64_t)step, 0, &q, &v, 30000);
        if (f->rc < 0 || v == LOCO_VERDICT_FINISHED)
            break;
        if (v == LOCO_VERDICT_COMMIT) {
            committed = step;
            f->commits++;
        } else if (v == LOCO_VERDICT_JOIN) {
            f->joins++;
            committed = q.committed;
        }
    }
    f->committed = committed;
    if (f->rc == 0)
        f->rc = loco_session_leave(s, 30000);
    if (f->rc < 0)
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
    loco_session_destroy(s);
    loco_quorum_fini(&q);
    return NULL;
}

/* A coordinator (restarted: it knows nothing) that waits
 * faulttol.timeout_ms = 1 s for the islands after the first registration. */
static void start_fast(const char *sites) {
    (void)coord_start; /* the harness's own waits 20 s */
    loco_config_defaults(&cfg);
    snprintf(cfg.outer.sites, sizeof cfg.outer.sites, "%s", sites);
    cfg.faulttol.timeout_ms = 1000;
    loco_net_params_default(&np);
    np.backend = LOCO_NET_PLAIN;
    np.streams = 1;
    snprintf(np.name, sizeof np.name, "coordinator");
    loco_log_set_level(LOCO_LOG_ERROR);
    cr_assert_eq(loco_coord_create(&srv.c, &cfg, &np, "127.0.0.1", 0, events), 0, "%s",
                 loco_errmsg());
    snprintf(cfg.faulttol.coordinator, sizeof cfg.faulttol.coordinator, "127.0.0.1:%d",
             loco_coord_port(srv.c));
    cr_assert_eq(pthread_create(&th, NULL, serve, &srv), 0);
}

/* siteA holds outer step 3 (hash 33, epoch 5); siteB's outer state was
 * lost (committed 0, the hash of its step-30 weights); siteC holds step 3
 * too but registers only once the coordinator started without it. The
 * run resumes at step 3 on siteA's word: siteA stays a member, siteB
 * fetches step 3, siteC fetches what is committed when it comes, and every
 * one ends at step 8. */
Test(coord_resume, a_late_island_and_one_without_outer_state_keep_the_committed_step,
     .timeout = 90) {
    snprintf(events, sizeof events, "/tmp/loco-resume-%d.jsonl", (int)getpid());
    unlink(events);
    start_fast("siteA,siteB,siteC");
    fake f[3] = {
        {.site = "siteA", .prog = {.committed = 3, .hash = 33, .epoch = 5}, .last = 8},
        {.site = "siteB", .prog = {.committed = 0, .hash = 0x7e57, .epoch = 0}, .last = 8},
        {.site = "siteC", .prog = {.committed = 3, .hash = 33, .epoch = 5}, .after_start = true,
         .last = 8},
    };
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fake_main, &f[i]), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].committed, 8, "%s ends at the run's last step", f[i].site);
    }
    cr_expect_eq(f[0].joins, 0, "siteA's step 3 was believed: it never fetched");
    cr_expect_eq(f[0].commits, 5, "siteA: steps 4 to 8");
    cr_expect_eq(f[1].first_join, 3, "siteB fetches step 3, not the start");
    cr_expect_geq(f[2].first_join, 3, "siteC fetches the committed state");
    cr_expect(!has_event("suspect", "\"site\":\"siteA\"", "claims committed"),
              "siteA was not believed");
    cr_expect(has_event("commit", "\"outer_step\":4,", NULL), "the run went on from step 3");
    cr_expect(!has_event("commit", "\"outer_step\":1,", NULL), "the run went back to the start");
    unlink(events);
}
