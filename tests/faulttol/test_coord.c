/* The coordinator protocol with islands played by sessions in this process
 * (plain TCP links on loopback): registration, the quorum, agreement and
 * disagreement of θ_global hashes, and refusals with their reasons. */
#include "faulttol/faulttol.h"
#include "tests/faulttol/coord_harness.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void start(const char *sites) { coord_start(sites, NULL); }

/* Waits until the coordinator's timeline at `events` holds the line that
 * registers `site` (the order a test needs, not a guess of its time). The
 * sleep only paces the rereads. */
static void await_registered(const char *events, const char *site) {
    char want[128];
    snprintf(want, sizeof want, "\"kind\":\"register\",\"site\":\"%s\"", site);
    const double end = loco_now() + 10;
    for (;;) {
        char line[2048];
        FILE *f = fopen(events, "r");
        bool seen = false;
        while (f && !seen && fgets(line, sizeof line, f))
            seen = strstr(line, want) != NULL;
        if (f)
            fclose(f);
        if (seen)
            return;
        cr_assert(loco_now() < end, "%s never registered (%s)", site, events);
        loco_sleep_ms(5);
    }
}

typedef struct {
    const char *site;
    const char *mesh;
    uint64_t model_hash;
    uint64_t hashes[4]; /* θ hash reported after outer steps 1..3 */
    int rc_join, rc_steps, rc_leave;
    int gos, commits;
    int id;
    char msg[1024];
    loco_quorum q;
} fake_island;

static void *island_main(void *arg) {
    fake_island *f = arg;
    loco_net_params p = np;
    snprintf(p.name, sizeof p.name, "%s", f->site);
    char addr[1][LOCO_ADDR_MAX] = {"127.0.0.1:1"};
    loco_island_info me = {.site = f->site, .n_ranks = 1,
                           .addrs = (const char (*)[LOCO_ADDR_MAX])addr, .mesh = f->mesh,
                           .model_hash = f->model_hash};
    loco_session *s = NULL;
    f->rc_join = loco_session_join(&s, &cfg, &p, &me, NULL, &f->id, &f->q, 10000);
    if (f->rc_join < 0) {
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
        return NULL;
    }
    /* Each outer step: ready, go, done with the θ hash, commit. */
    for (int step = 1; step <= 3 && f->rc_steps == 0; step++) {
        loco_verdict v = 0;
        loco_session_heartbeat(s, step * 10);
        f->rc_steps = loco_session_ready(s, step, step - 1, &f->q, &v, 10000);
        if (f->rc_steps == 0 && v != LOCO_VERDICT_GO)
            f->rc_steps = LOCO_EPROTO;
        if (f->rc_steps == 0) {
            f->gos++;
            f->rc_steps = loco_session_done(s, step, f->q.epoch, true, f->hashes[step], 0,
                                            &f->q, &v, 10000);
        }
        if (f->rc_steps == 0 && v == LOCO_VERDICT_COMMIT)
            f->commits++;
        else if (f->rc_steps == 0)
            f->rc_steps = LOCO_EPROTO;
    }
    if (f->rc_steps < 0) {
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
        loco_session_destroy(s);
        return NULL;
    }
    f->rc_leave = loco_session_leave(s, 10000);
    if (f->rc_leave < 0)
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
    loco_session_destroy(s);
    return NULL;
}

static void run_islands(fake_island *f, int n) {
    pthread_t t[8];
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, island_main, &f[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

Test(coordinator, islands_that_agree_finish_cleanly, .timeout = 30) {
    start("siteA,siteB,siteC");
    fake_island f[3] = {
        {.site = "siteC", .mesh = "dp=1", .model_hash = 5, .hashes = {0, 11, 22, 33}},
        {.site = "siteA", .mesh = "dp=1", .model_hash = 5, .hashes = {0, 11, 22, 33}},
        {.site = "siteB", .mesh = "dp=1", .model_hash = 5, .hashes = {0, 11, 22, 33}},
    };
    run_islands(f, 3);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(f[i].rc_join, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].rc_leave, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].commits, 3, "%s: every outer step committed", f[i].site);
        cr_expect_eq(f[i].q.n, 3);
        cr_expect_eq(__builtin_popcountll(f[i].q.members), 3);
        cr_expect_str_eq(f[i].q.m[f[i].id].site, f[i].site);
        loco_quorum_fini(&f[i].q);
    }
    cr_expect_eq(f[0].id, 2, "ids follow outer.sites, not the order of arrival");
    cr_expect_eq(f[1].id, 0);
}

Test(coordinator, a_different_theta_stops_the_run_naming_step_and_islands, .timeout = 30) {
    start("siteA,siteB");
    fake_island f[2] = {
        {.site = "siteA", .mesh = "dp=1", .model_hash = 5, .hashes = {0, 11, 22, 33}},
        {.site = "siteB", .mesh = "dp=1", .model_hash = 5, .hashes = {0, 11, 99, 33}},
    };
    run_islands(f, 2);
    cr_expect_eq(finish(), LOCO_EPEER);
    cr_expect(strstr(srv.msg, "outer step 2") && strstr(srv.msg, "siteA") &&
                  strstr(srv.msg, "siteB"),
              "%s", srv.msg);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f[i].rc_steps, LOCO_EPEER, "%s", f[i].site);
        cr_expect_eq(f[i].commits, 1, "%s: step 1 committed, step 2 never", f[i].site);
        cr_expect(strstr(f[i].msg, "differs after outer step 2") != NULL, "%s", f[i].msg);
        loco_quorum_fini(&f[i].q);
    }
}

Test(coordinator, a_different_mesh_or_site_is_refused_with_the_reason, .timeout = 30) {
    char events[64];
    snprintf(events, sizeof events, "/tmp/loco-coord-%d.jsonl", (int)getpid());
    unlink(events);
    coord_start("siteA,siteB", events);
    fake_island bad[2] = {
        {.site = "siteA", .mesh = "dp=2", .model_hash = 5},
        {.site = "siteZ", .mesh = "dp=2", .model_hash = 5},
    };
    /* siteA registers first (alone), then a siteB with another mesh and an
     * unknown siteZ are refused; then a good siteB completes the run. */
    pthread_t ta;
    cr_assert_eq(pthread_create(&ta, NULL, island_main, &bad[0]), 0);
    fake_island wrong = {.site = "siteB", .mesh = "dp=4", .model_hash = 5};
    await_registered(events, "siteA");
    run_islands(&wrong, 1);
    cr_expect_eq(wrong.rc_join, LOCO_EPEER);
    cr_expect(strstr(wrong.msg, "mesh of 'siteB' (dp=4") && strstr(wrong.msg, "differs"), "%s",
              wrong.msg);
    run_islands(&bad[1], 1);
    cr_expect_eq(bad[1].rc_join, LOCO_EPEER);
    cr_expect(strstr(bad[1].msg, "not in this run's outer.sites") != NULL, "%s", bad[1].msg);
    fake_island other = {.site = "siteB", .mesh = "dp=2", .model_hash = 6};
    run_islands(&other, 1);
    cr_expect(strstr(other.msg, "another [model]") != NULL, "%s", other.msg);
    fake_island good = {.site = "siteB", .mesh = "dp=2", .model_hash = 5};
    run_islands(&good, 1);
    pthread_join(ta, NULL);
    cr_expect_eq(good.rc_leave, 0, "%s", good.msg);
    cr_expect_eq(bad[0].rc_leave, 0, "%s", bad[0].msg);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    loco_quorum_fini(&good.q);
    loco_quorum_fini(&bad[0].q);
    unlink(events);
}

Test(coordinator, quorum_json_round_trip_and_bad_input) {
    char a0[2][LOCO_ADDR_MAX] = {"10.0.0.1:5", "10.0.0.2:6"};
    char a1[1][LOCO_ADDR_MAX] = {"10.0.0.3:7"};
    loco_quorum q = {.epoch = 3, .n = 3, .outer_step = 9, .committed = 8,
                     .committed_hash = 0xabcdef0123456789ull, .members = 1, .observers = 4};
    q.m[0] = (loco_member){.id = 0, .site = "x", .n_ranks = 2, .addrs = a0};
    q.m[2] = (loco_member){.id = 2, .site = "z", .n_ranks = 1, .addrs = a1};
    char *json = loco_quorum_to_json(&q);
    loco_quorum back;
    cr_assert_eq(loco_quorum_from_json(&back, json, strlen(json)), 0, "%s", loco_errmsg());
    cr_expect_eq(back.epoch, 3);
    cr_expect_eq(back.outer_step, 9);
    cr_expect_eq(back.committed, 8);
    cr_expect_eq(back.committed_hash, 0xabcdef0123456789ull);
    cr_expect_eq(back.members, 1);
    cr_expect_eq(back.observers, 4);
    cr_expect_eq(back.m[1].n_ranks, 0, "island 1 is not registered");
    cr_expect_str_eq(back.m[0].addrs[1], "10.0.0.2:6");
    cr_expect_str_eq(back.m[2].site, "z");
    loco_quorum_fini(&back);
    free(json);
    const char *bad[] = {
        "", "{}", "[1,2",
        "{\"epoch\":1,\"outer_step\":0,\"committed\":0,\"hash\":\"0\",\"join\":false,\"n\":1,"
        "\"islands\":[{\"id\":1,\"site\":\"x\",\"role\":\"member\",\"ranks\":[\"a\"]}]}",
        "{\"epoch\":1,\"outer_step\":0,\"committed\":0,\"hash\":\"0\",\"join\":false,\"n\":1,"
        "\"islands\":[{\"id\":0,\"site\":\"x\",\"role\":\"member\",\"ranks\":[]}]}",
        "{\"epoch\":1,\"outer_step\":-1,\"committed\":0,\"hash\":\"0\",\"join\":false,\"n\":1,"
        "\"islands\":[]}",
        "{\"epoch\":1,\"outer_step\":0,\"committed\":0,\"hash\":\"0\",\"join\":false,\"n\":99,"
        "\"islands\":[]}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(loco_quorum_from_json(&back, bad[i], strlen(bad[i])), LOCO_EPROTO, "%s", bad[i]);
    char host[64];
    int port;
    cr_expect_eq(loco_parse_hostport("127.0.0.1:29500", host, sizeof host, &port), 0);
    cr_expect(port == 29500 && !strcmp(host, "127.0.0.1"));
    cr_expect_eq(loco_parse_hostport("nohost", host, sizeof host, &port), LOCO_EINVAL);
    cr_expect_eq(loco_parse_hostport("h:99999", host, sizeof host, &port), LOCO_EINVAL);
}

static void *vanish_main(void *arg) {
    fake_island *f = arg;
    loco_net_params p = np;
    snprintf(p.name, sizeof p.name, "%s", f->site);
    char addr[1][LOCO_ADDR_MAX] = {"127.0.0.1:1"};
    loco_island_info me = {.site = f->site, .n_ranks = 1,
                           .addrs = (const char (*)[LOCO_ADDR_MAX])addr, .mesh = f->mesh,
                           .model_hash = f->model_hash};
    loco_session *s = NULL;
    f->rc_join = loco_session_join(&s, &cfg, &p, &me, NULL, &f->id, &f->q, 10000);
    loco_session_destroy(s); /* gone without BYE */
    return NULL;
}

/* A registered island whose link drops leaves the quorum (a new epoch,
 * logged with its name); the others go on and finish the run. */
Test(coordinator, an_island_lost_leaves_the_quorum_and_the_others_finish, .timeout = 30) {
    start("siteA,siteB");
    fake_island f[2] = {
        {.site = "siteA", .mesh = "dp=1", .model_hash = 5, .hashes = {0, 11, 22, 33}},
        {.site = "siteB", .mesh = "dp=1", .model_hash = 5},
    };
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&tb, NULL, vanish_main, &f[1]), 0);
    cr_assert_eq(pthread_create(&ta, NULL, island_main, &f[0]), 0);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    cr_expect_eq(f[0].rc_leave, 0, "%s", f[0].msg);
    cr_expect_eq(f[0].commits, 3, "siteA commits every step alone");
    cr_expect_eq(f[0].q.members, 1, "siteB is no member any more");
    loco_quorum_fini(&f[0].q);
    loco_quorum_fini(&f[1].q);
}
