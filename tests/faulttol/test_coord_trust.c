/* What the coordinator believes (issue 17), with islands played by
 * sessions in this process (plain TCP on loopback): a member whose θ_global
 * hash differs from a strict majority's is ejected and rejoins by state
 * transfer while the step commits with the majority's hash; without a
 * strict majority the run stops; numbers an island reports when it
 * (re)registers (committed step, hash, epoch) move nothing that the others,
 * or the coordinator itself, do not confirm. */
#include "faulttol/faulttol.h"
#include "tests/faulttol/coord_harness.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char events[64];

static void start(const char *sites) {
    snprintf(events, sizeof events, "/tmp/loco-trust-%d.jsonl", (int)getpid());
    unlink(events);
    coord_start(sites, events);
}

/* The event line of `kind` that holds every one of `with` (NULL-terminated
 * list); "" when there is none. */
static const char *find_event(const char *kind, const char *const *with) {
    static char line[2048];
    char k[64];
    snprintf(k, sizeof k, "\"kind\":\"%s\"", kind);
    FILE *f = fopen(events, "r");
    cr_assert(f, "%s", events);
    while (fgets(line, sizeof line, f)) {
        bool all = strstr(line, k) != NULL;
        for (int i = 0; all && with && with[i]; i++)
            all = strstr(line, with[i]) != NULL;
        if (all) {
            fclose(f);
            return line;
        }
    }
    fclose(f);
    return "";
}

/* ------------------------------------------------------ islands */

/* An island that reports the θ hash 11 × s after outer step s (another one
 * after bad_step) and, told to fetch the state, takes the committed step
 * and hash the coordinator names (what a state transfer gives it). */
typedef struct {
    const char *site;
    loco_island_progress prog; /* what it registers with */
    int64_t last;              /* it leaves once this outer step is committed */
    int64_t bad_step;          /* its hash differs after this step (0: never) */
    int rc_join, rc;
    int id, commits, observed, joins;
    uint64_t first_epoch;   /* of its first quorum */
    int64_t join_committed; /* what its last join named */
    uint64_t join_hash, join_members;
    int64_t committed; /* where it ended */
    char msg[1024];
} fake;

static uint64_t hash_after(const fake *f, int64_t s) {
    return s == f->bad_step ? 0xbad000u + (uint64_t)s : 11u * (uint64_t)s;
}

/* Outside the quorum: "fetch" the state the coordinator names. */
static int64_t fetch(fake *f, const loco_quorum *q) {
    f->joins++;
    f->join_committed = q->committed;
    f->join_hash = q->committed_hash;
    f->join_members = q->members;
    return q->committed;
}

static void *fake_main(void *arg) {
    fake *f = arg;
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
    f->rc_join = loco_session_join(&s, &cfg, &p, &me, &f->prog, &f->id, &q, 10000);
    if (f->rc_join < 0) {
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
        return NULL;
    }
    f->first_epoch = q.epoch;
    int64_t committed = f->prog.committed;
    if (q.join || !loco_quorum_has(q.members, f->id))
        committed = fetch(f, &q);
    for (int tries = 0; committed < f->last && f->rc == 0 && tries < 100; tries++) {
        const int64_t step = committed + 1;
        loco_verdict v = 0;
        loco_session_heartbeat(s, step * 10);
        f->rc = loco_session_ready(s, step, committed, &q, &v, 10000);
        if (f->rc < 0 || v == LOCO_VERDICT_FINISHED)
            break;
        if (v == LOCO_VERDICT_JOIN) {
            committed = fetch(f, &q);
            continue;
        }
        if (v != LOCO_VERDICT_GO) {
            f->rc = LOCO_ERR(LOCO_EPROTO, "verdict %d on READY", (int)v);
            break;
        }
        f->observed += !loco_quorum_has(q.members, f->id);
        f->rc = loco_session_done(s, step, q.epoch, true, hash_after(f, step), 0, &q, &v, 10000);
        if (f->rc < 0 || v == LOCO_VERDICT_FINISHED)
            break;
        if (v == LOCO_VERDICT_COMMIT) {
            committed = step;
            f->commits++;
        } else if (v == LOCO_VERDICT_JOIN) {
            committed = fetch(f, &q);
        }
    }
    f->committed = committed;
    if (f->rc == 0)
        f->rc = loco_session_leave(s, 10000);
    if (f->rc < 0)
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
    loco_session_destroy(s);
    loco_quorum_fini(&q);
    return NULL;
}

static void run_fakes(fake *f, int n) {
    pthread_t t[8];
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fake_main, &f[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* ------------------------------------------------- hash majority */

Test(coordinator, a_minority_hash_is_ejected_and_rejoins_the_majority_commits, .timeout = 60) {
    start("siteA,siteB,siteC");
    fake f[3] = {
        {.site = "siteA", .last = 4},
        {.site = "siteB", .last = 4},
        {.site = "siteC", .last = 4, .bad_step = 2},
    };
    run_fakes(f, 3);
    cr_expect_eq(finish(), 0, "the run goes on: %s", srv.msg);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(f[i].rc_join, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].committed, 4, "%s ends at the last step", f[i].site);
    }
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f[i].commits, 4, "%s: every step committed", f[i].site);
        cr_expect_eq(f[i].joins, 0, "%s stays a member", f[i].site);
    }
    /* siteC: ejected at step 2, told to fetch step 2 with the majority's
     * hash from siteA or siteB, observes step 3 and is a member for 4. */
    cr_expect_eq(f[2].joins, 1);
    cr_expect_eq(f[2].join_committed, 2);
    cr_expect_eq(f[2].join_hash, 22u, "the committed hash is the majority's");
    cr_expect_eq(f[2].join_members, 3u, "siteA and siteB are the members");
    cr_expect_eq(f[2].observed, 1, "it observed one step after the transfer");
    cr_expect_eq(f[2].commits, 3, "steps 1, 3 (observed) and 4");
    const char *ej[] = {"\"site\":\"siteC\"", "differs from the majority", "outer step 2", NULL};
    cr_expect_str_neq(find_event("suspect", ej), "", "the ejection is in the timeline");
    const char *c2[] = {"\"outer_step\":2,", "\"hash\":\"0000000000000016\"",
                        "\"members\":[\"siteA\",\"siteB\"]", NULL};
    cr_expect_str_neq(find_event("commit", c2), "", "step 2 committed with the majority hash");
    const char *j3[] = {"\"site\":\"siteC\"", "\"outer_step\":3", NULL};
    cr_expect_str_neq(find_event("join", j3), "", "siteC rejoined at step 3");
    cr_expect_str_eq(find_event("divergence", NULL), "", "no divergence: the run went on");
    unlink(events);
}

/* Two against two is no majority: the run stops as it always did. (Two
 * islands disagreeing: test_coord.c.) */
Test(coordinator, without_a_strict_majority_differing_hashes_stop_the_run, .timeout = 60) {
    start("siteA,siteB,siteC,siteD");
    fake f[4] = {
        {.site = "siteA", .last = 3},
        {.site = "siteB", .last = 3},
        {.site = "siteC", .last = 3, .bad_step = 2},
        {.site = "siteD", .last = 3, .bad_step = 2},
    };
    run_fakes(f, 4);
    cr_expect_eq(finish(), LOCO_EPEER);
    cr_expect(strstr(srv.msg, "θ_global differs after outer step 2") != NULL, "%s", srv.msg);
    for (int i = 0; i < 4; i++) {
        cr_expect_eq(f[i].rc, LOCO_EPEER, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].commits, 1, "%s: step 1 committed, step 2 never", f[i].site);
        cr_expect(strstr(f[i].msg, "differs after outer step 2") != NULL, "%s", f[i].msg);
        cr_expect_eq(f[i].joins, 0, "%s: nobody is ejected", f[i].site);
    }
    cr_expect_str_neq(find_event("divergence", NULL), "");
    unlink(events);
}

/* ------------------------------------------- numbers at registration */

/* A restarted coordinator: two islands hold outer step 3 (epoch 5), a
 * third claims step 1000 in epoch 999. The run resumes at step 3, in epoch
 * 6; the third is told to fetch step 3 like any joiner. */
Test(coordinator, a_restart_claiming_step_1000_is_not_believed, .timeout = 60) {
    start("siteA,siteB,siteC");
    const loco_island_progress good = {.committed = 3, .hash = 33, .epoch = 5};
    fake f[3] = {
        {.site = "siteA", .prog = good, .last = 5},
        {.site = "siteB", .prog = good, .last = 5},
        {.site = "siteC", .prog = {.committed = 1000, .hash = 0xbad, .epoch = 999}, .last = 5},
    };
    run_fakes(f, 3);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].first_epoch, 6, "%s: the epoch goes on from 5, not 999", f[i].site);
        cr_expect_eq(f[i].committed, 5, "%s", f[i].site);
    }
    cr_expect_eq(f[0].commits, 2, "siteA: steps 4 and 5");
    cr_expect_eq(f[0].joins, 0);
    cr_expect_eq(f[2].join_committed, 3, "siteC fetches step 3, not 1000");
    cr_expect_eq(f[2].join_hash, 33u);
    cr_expect_eq(f[2].join_members, 3u);
    const char *sus[] = {"\"site\":\"siteC\"", "claims committed outer step 1000", NULL};
    cr_expect_str_neq(find_event("suspect", sus), "");
    const char *c4[] = {"\"outer_step\":4,", NULL};
    cr_expect_str_neq(find_event("commit", c4), "", "the run went on from step 3");
    unlink(events);
}

/* Of two islands nothing confirms either claim: the run does not move
 * forward on one island's word, it resumes at the older one. */
Test(coordinator, of_two_unconfirmed_claims_the_older_one_is_taken, .timeout = 60) {
    start("siteA,siteB");
    fake f[2] = {
        {.site = "siteA", .prog = {.committed = 3, .hash = 33, .epoch = 5}, .last = 4},
        {.site = "siteB", .prog = {.committed = 1000, .hash = 0xbad, .epoch = 999}, .last = 4},
    };
    run_fakes(f, 2);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].first_epoch, 6, "%s", f[i].site);
        cr_expect_eq(f[i].committed, 4, "%s", f[i].site);
    }
    cr_expect_eq(f[0].joins, 0, "siteA is the member");
    cr_expect_eq(f[1].join_committed, 3, "siteB fetches step 3");
    cr_expect_eq(f[1].observed, 1, "and observes step 4");
    unlink(events);
}

/* A raw link playing one process of siteC (incarnation ab). */
static loco_link *raw_register(int64_t committed, const char *hash, uint64_t epoch) {
    loco_net_params p = np;
    snprintf(p.name, sizeof p.name, "siteC");
    loco_link *l = NULL;
    cr_assert_eq(loco_net_connect(&l, &p, "127.0.0.1", loco_coord_port(srv.c), 5000), 0, "%s",
                 loco_errmsg());
    char json[512];
    snprintf(json, sizeof json,
             "{\"site\":\"siteC\",\"mesh\":\"dp=1\",\"model_hash\":\"0000000000000005\","
             "\"inc\":\"00000000000000ab\",\"ranks\":[\"127.0.0.1:1\"],\"committed\":%lld,"
             "\"hash\":\"%s\",\"epoch\":%llu,\"pending\":0,\"pending_hash\":\"0\"}",
             (long long)committed, hash, (unsigned long long)epoch);
    loco_frame_hdr h = {.type = LOCO_FRAME_REGISTER};
    cr_assert_eq(loco_link_send(l, &h, json, strlen(json)), 0, "%s", loco_errmsg());
    return l;
}

/* The next QUORUM on l (within 10 s). */
static void raw_quorum(loco_link *l, loco_quorum *q) {
    for (int k = 0; k < 100; k++) {
        loco_frame_hdr h;
        void *payload = NULL;
        int rc = loco_link_recv(l, &h, &payload, 100);
        if (rc == LOCO_ETIMEDOUT)
            continue;
        cr_assert_eq(rc, 0, "%s", loco_errmsg());
        bool got = h.type == LOCO_FRAME_QUORUM;
        if (got)
            cr_assert_eq(loco_quorum_from_json(q, payload, h.payload_len), 0, "%s", loco_errmsg());
        loco_free(payload);
        if (got)
            return;
    }
    cr_assert_fail("no QUORUM within 10 s");
}

/* A live coordinator: siteC's process, a member, comes back on a new link
 * (same incarnation, so it would keep its place) claiming step 1000 in
 * epoch 999. It is not believed: it leaves the quorum and is told to
 * fetch step 0; siteA and siteB run to the end. */
Test(coordinator, a_member_coming_back_with_a_future_step_is_not_believed, .timeout = 60) {
    start("siteA,siteB,siteC");
    fake f[2] = {{.site = "siteA", .last = 3}, {.site = "siteB", .last = 3}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fake_main, &f[i]), 0);
    loco_link *first = raw_register(0, "0", 0);
    loco_quorum q = {0};
    raw_quorum(first, &q);
    cr_expect_eq(q.members, 7u, "every site is a member of the first quorum");
    loco_quorum_fini(&q);
    loco_link *again = raw_register(1000, "0000000000000bad", 999);
    do {
        loco_quorum_fini(&q);
        raw_quorum(again, &q);
    } while (!q.join);
    cr_expect_eq(q.committed, 0, "the step it must fetch is the run's, not 1000");
    cr_expect_eq(q.members, 3u, "siteC is out");
    cr_expect_lt(q.epoch, 999u);
    loco_quorum_fini(&q);
    loco_link_destroy(again); /* gone: the others need not wait for its transfer */
    loco_link_destroy(first);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(finish(), 0, "%s", srv.msg);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].commits, 3, "%s", f[i].site);
    }
    const char *sus[] = {"\"site\":\"siteC\"", "claims committed outer step 1000", NULL};
    cr_expect_str_neq(find_event("suspect", sus), "");
    unlink(events);
}
