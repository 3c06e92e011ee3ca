/* The coordinator's failure detection around the start of a run. An island
 * heartbeats only from its first quorum on, so one that registered early
 * and waits for the others is silent, not dead: it must not be dropped
 * before the run starts (seen in a log as "silent for 20769694 ms", the
 * detector's never-set last-heard time 0 against the machine's uptime).
 * Once the run started, an island never heard from is dropped after
 * faulttol.timeout_ms, and the silence reported is the real one. Islands
 * are sessions in this process (plain TCP on loopback). */
#include "faulttol/faulttol.h"
#include "tests/faulttol/coord_harness.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_MS 1000

static char events[64];

/* A coordinator for siteA,siteB (fresh: it starts once both registered)
 * with faulttol.timeout_ms = TIMEOUT_MS. */
static void start_coord(void) {
    (void)coord_start; /* the harness's own waits 20 s */
    snprintf(events, sizeof events, "/tmp/loco-coord-wait-%d.jsonl", (int)getpid());
    unlink(events);
    loco_config_defaults(&cfg);
    snprintf(cfg.outer.sites, sizeof cfg.outer.sites, "siteA,siteB");
    cfg.faulttol.timeout_ms = TIMEOUT_MS;
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

/* An island that registers, takes `last` outer steps (hash 7 × s after
 * step s) and leaves; with `silent` it sends nothing at all after its
 * first quorum (heartbeats every 10 minutes) until `release` is set. */
typedef struct {
    const char *site;
    int64_t last;
    bool silent;
    atomic_bool *release;
    int rc, id, commits;
    bool first_member; /* its first quorum made it a member (no fetch) */
    char msg[1024];
} fake;

static void *fake_main(void *arg) {
    fake *f = arg;
    loco_config my = cfg;
    if (f->silent)
        my.faulttol.heartbeat_ms = 600000;
    loco_net_params p = np;
    snprintf(p.name, sizeof p.name, "%s", f->site);
    char addr[1][LOCO_ADDR_MAX] = {"127.0.0.1:1"};
    loco_island_info me = {.site = f->site, .n_ranks = 1,
                           .addrs = (const char (*)[LOCO_ADDR_MAX])addr, .mesh = "dp=1",
                           .model_hash = 5};
    loco_session *s = NULL;
    loco_quorum q = {0};
    f->rc = loco_session_join(&s, &my, &p, &me, NULL, &f->id, &q, 30000);
    f->first_member = f->rc == 0 && !q.join && loco_quorum_has(q.members, f->id);
    if (f->rc == 0 && f->silent) {
        const struct timespec tick = {0, 10 * 1000000L};
        while (!atomic_load(f->release))
            nanosleep(&tick, NULL);
    }
    int64_t committed = 0;
    for (int tries = 0; f->rc == 0 && !f->silent && committed < f->last && tries < 100;
         tries++) {
        const int64_t step = committed + 1;
        loco_verdict v = 0;
        loco_session_heartbeat(s, step * 10);
        f->rc = loco_session_ready(s, step, committed, &q, &v, 30000);
        if (f->rc < 0 || v == LOCO_VERDICT_FINISHED)
            break;
        if (v == LOCO_VERDICT_JOIN) {
            committed = q.committed;
            continue;
        }
        if (v != LOCO_VERDICT_GO)
            continue; /* AGAIN: say ready again */
        f->rc = loco_session_done(s, step, q.epoch, true, 7u * (uint64_t)step, 0, &q, &v, 30000);
        if (f->rc == 0 && v == LOCO_VERDICT_COMMIT) {
            committed = step;
            f->commits++;
        } else if (f->rc == 0 && v == LOCO_VERDICT_JOIN) {
            committed = q.committed;
        }
    }
    if (f->rc == 0 && !f->silent)
        f->rc = loco_session_leave(s, 30000);
    if (f->rc < 0)
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
    loco_session_destroy(s);
    loco_quorum_fini(&q);
    return NULL;
}

/* The suspect events of the timeline naming `site` (any site when NULL);
 * the silence of the first one that says "silent for N ms" into *ms
 * (-1 when none says it). */
static int suspects(const char *site, double *ms) {
    char line[2048], want[96];
    snprintf(want, sizeof want, "\"site\":\"%s\"", site ? site : "");
    FILE *f = fopen(events, "r");
    cr_assert(f, "%s", events);
    int n = 0;
    *ms = -1;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"kind\":\"suspect\"") || (site && !strstr(line, want)))
            continue;
        n++;
        const char *p = strstr(line, "silent for ");
        if (p && *ms < 0)
            *ms = strtod(p + strlen("silent for "), NULL);
    }
    fclose(f);
    return n;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* siteA registers and waits 2.5 × the timeout for siteB, sending nothing
 * meanwhile: both start as members of the first quorum, nobody is
 * suspected, and the run commits its two steps. */
Test(coord_wait, an_island_waiting_for_the_first_quorum_is_not_dropped, .timeout = 60) {
    start_coord();
    fake f[2] = {{.site = "siteA", .last = 2}, {.site = "siteB", .last = 2}};
    pthread_t t[2];
    cr_assert_eq(pthread_create(&t[0], NULL, fake_main, &f[0]), 0);
    const struct timespec wait = {2, 500 * 1000000L};
    nanosleep(&wait, NULL);
    cr_assert_eq(pthread_create(&t[1], NULL, fake_main, &f[1]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect(f[i].first_member, "%s is a member of the first quorum", f[i].site);
        cr_expect_eq(f[i].commits, 2, "%s committed both steps", f[i].site);
    }
    double ms;
    const int n = suspects(NULL, &ms);
    cr_expect_eq(n, 0, "no island suspected before or during the run (first silence %.0f ms)",
                 ms);
    unlink(events);
}

/* siteB says nothing after its first quorum: it is dropped once it was
 * silent for the timeout, counted from the start of the run (not from
 * time 0, nor from its registration), and siteA finishes alone. */
Test(coord_wait, an_island_silent_from_the_start_is_dropped_with_its_real_silence,
     .timeout = 60) {
    const double t0 = now_s();
    start_coord();
    atomic_bool release = false;
    fake f[2] = {{.site = "siteA", .last = 2},
                 {.site = "siteB", .silent = true, .release = &release}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fake_main, &f[i]), 0);
    pthread_join(t[0], NULL);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    atomic_store(&release, true);
    pthread_join(t[1], NULL);
    const double elapsed_ms = (now_s() - t0) * 1e3;
    cr_expect_eq(f[0].rc, 0, "siteA: %s", f[0].msg);
    cr_expect_eq(f[0].commits, 2, "siteA committed both steps alone");
    for (int i = 0; i < 2; i++)
        cr_expect(f[i].first_member, "%s is a member of the first quorum", f[i].site);
    double ms_a, ms_b;
    cr_expect_eq(suspects("siteA", &ms_a), 0, "siteA heartbeats: never suspected");
    cr_expect_eq(suspects("siteB", &ms_b), 1, "siteB suspected once");
    cr_expect(ms_b >= TIMEOUT_MS && ms_b < elapsed_ms,
              "siteB's silence %.0f ms: at least the timeout %d ms, at most the test's %.0f ms",
              ms_b, TIMEOUT_MS, elapsed_ms);
    unlink(events);
}
