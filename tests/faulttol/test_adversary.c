/* The coordinator against a client that holds a valid certificate of the
 * run and misbehaves: frame headers that claim megabytes and never send
 * them, then a hang-up mid-frame; connections that come and go before they
 * register, at random moments; garbage; a REGISTER under another site's
 * name, before and during the run; an island replaying its frames of an
 * epoch already past; every member hanging up. The coordinator runs in
 * this process, or as `loco coordinator` where its memory is measured (TLS
 * on loopback): its memory stays small, it refuses what it must, and the
 * islands that behave still run to the end (it ends the run cleanly).
 *
 * One file: the adversaries share one forged-peer harness. */
#include "faulttol/faulttol.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define STEPS 2 /* outer steps the behaving islands run */

static char *dir;
static loco_config cfg;
static int port;
/* In this process: */
static loco_coord *coord;
static pthread_t serve_th;
static int serve_rc;
static char serve_msg[1024];
/* Or `loco coordinator`: */
static pid_t child;
static char child_log[4200];

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *serve(void *arg) {
    (void)arg;
    serve_rc = loco_coord_serve(coord);
    snprintf(serve_msg, sizeof serve_msg, "%s", loco_errmsg());
    return NULL;
}

/* TLS params presenting NAME's certificate of the run. */
static void params(loco_net_params *p, const char *name) {
    loco_net_params_default(p);
    snprintf(p->cert, sizeof p->cert, "%s/%s.pem", dir, name);
    snprintf(p->key, sizeof p->key, "%s/%s.key", dir, name);
    snprintf(p->ca, sizeof p->ca, "%s/ca.pem", dir);
}

/* Certificates, and the config of a run of siteA and siteB. */
static void setup(void) {
    dir = strdup("/tmp/loco-adversary-XXXXXX");
    cr_assert(mkdtemp(dir));
    const char *names[] = {"coordinator", "siteA", "siteB", "mallory"};
    cr_assert_eq(loco_net_make_certs(dir, names, 4, 1), 0, "%s", loco_errmsg());
    loco_config_defaults(&cfg);
    snprintf(cfg.outer.sites, sizeof cfg.outer.sites, "siteA,siteB");
    cfg.faulttol.timeout_ms = 20000;
    cfg.faulttol.coordinator_grace_s = 3; /* islands give up soon on a dead coordinator */
    loco_log_set_level(LOCO_LOG_ERROR);   /* every refusal below is a warning */
}

/* A coordinator in this process, serving in a thread, with its timeline
 * in DIR/events.jsonl. */
static void setup_in_process(void) {
    setup();
    loco_net_params np;
    params(&np, "coordinator");
    char events[4200];
    snprintf(events, sizeof events, "%s/events.jsonl", dir);
    cr_assert_eq(loco_coord_create(&coord, &cfg, &np, "127.0.0.1", 0, events), 0, "%s",
                 loco_errmsg());
    port = loco_coord_port(coord);
    snprintf(cfg.faulttol.coordinator, sizeof cfg.faulttol.coordinator, "127.0.0.1:%d", port);
    cr_assert_eq(pthread_create(&serve_th, NULL, serve, NULL), 0);
}

/* `loco coordinator` with its output in DIR/coordinator.log, where it says
 * which port it took. */
static void setup_process(void) {
    setup();
    char ini[4200];
    snprintf(ini, sizeof ini, "%s/run.ini", dir);
    FILE *f = fopen(ini, "w");
    cr_assert(f);
    fprintf(f,
            "[outer]\nsites = siteA,siteB\n[faulttol]\ncoordinator = 127.0.0.1:0\n"
            "timeout_ms = 20000\n[run]\ndir = %s/run\n[net]\ncert = %s/coordinator.pem\n"
            "key = %s/coordinator.key\nca = %s/ca.pem\n",
            dir, dir, dir, dir);
    fclose(f);
    snprintf(child_log, sizeof child_log, "%s/coordinator.log", dir);
    const char *bin = getenv("LOCO_BIN") ? getenv("LOCO_BIN") : "build/loco";
    child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        const int fd = open(child_log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(bin, bin, "coordinator", ini, (char *)NULL);
        _exit(127);
    }
    for (int k = 0; k < 1000 && !port; k++) {
        sleep_ms(10);
        f = fopen(child_log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            const char *at = strstr(line, "coordinator: listening on 127.0.0.1:");
            if (at)
                port = atoi(at + strlen("coordinator: listening on 127.0.0.1:"));
        }
        if (f)
            fclose(f);
    }
    cr_assert_gt(port, 0, "loco coordinator did not start (%s)", child_log);
    snprintf(cfg.faulttol.coordinator, sizeof cfg.faulttol.coordinator, "127.0.0.1:%d", port);
}

static void teardown(void) {
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        child = 0;
    }
    if (dir) {
        loco_rmtree(dir);
        free(dir);
        dir = NULL;
    }
    port = 0;
}

TestSuite(adversary, .fini = teardown, .timeout = 60);

/* Waits for the coordinator to end: 0 when it ended the run cleanly. */
static int finish(void) {
    if (child > 0) {
        int st;
        cr_assert_eq(waitpid(child, &st, 0), child);
        child = 0;
        snprintf(serve_msg, sizeof serve_msg, "exit status %d, see %.900s",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, child_log);
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    pthread_join(serve_th, NULL);
    loco_coord_destroy(coord);
    coord = NULL;
    return serve_rc;
}

/* ------------------------------------------------- islands that behave */

typedef struct {
    const char *site;
    const char *cert; /* whose certificate it presents (NULL: its own) */
    bool hold;        /* after outer step 1: held says so, it waits for go_on */
    atomic_bool held, go_on;
    int rc_join, rc_run;
    int commits;
    char msg[1024];
} island;

/* Both behaving islands joined, committed every step, and the coordinator
 * ended the run cleanly. */
static void expect_both_finished(const island f[2]) {
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(f[i].rc_join, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].rc_run, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].commits, STEPS, "%s", f[i].site);
    }
    cr_expect_eq(finish(), 0, "the coordinator stopped: %s", serve_msg);
}

static void *island_main(void *arg) {
    island *f = arg;
    loco_net_params p;
    params(&p, f->cert ? f->cert : f->site);
    char addr[1][LOCO_ADDR_MAX] = {"127.0.0.1:1"};
    loco_island_info me = {.site = f->site,
                           .n_ranks = 1,
                           .addrs = (const char(*)[LOCO_ADDR_MAX])addr,
                           .mesh = "dp=1",
                           .model_hash = 5};
    loco_session *s = NULL;
    loco_quorum q = {0};
    int id;
    f->rc_join = loco_session_join(&s, &cfg, &p, &me, NULL, &id, &q, 10000);
    if (f->rc_join < 0) {
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
        return NULL;
    }
    for (int step = 1; step <= STEPS && f->rc_run == 0; step++) {
        loco_verdict v = 0;
        loco_session_heartbeat(s, step * 10);
        f->rc_run = loco_session_ready(s, step, step - 1, &q, &v, 10000);
        if (f->rc_run == 0 && v != LOCO_VERDICT_GO)
            f->rc_run = LOCO_EPROTO;
        if (f->rc_run == 0)
            f->rc_run =
                loco_session_done(s, step, q.epoch, true, 11u * (unsigned)step, 0, &q, &v, 10000);
        if (f->rc_run == 0 && v == LOCO_VERDICT_COMMIT)
            f->commits++;
        else if (f->rc_run == 0 && v == LOCO_VERDICT_AGAIN)
            step--; /* a new epoch: the step is redone */
        else if (f->rc_run == 0)
            f->rc_run = LOCO_EPROTO;
        if (f->hold && step == 1 && f->commits == 1) {
            atomic_store(&f->held, true); /* its heartbeats go on meanwhile */
            while (!atomic_load(&f->go_on))
                sleep_ms(5);
        }
    }
    if (f->rc_run == 0)
        f->rc_run = loco_session_leave(s, 10000);
    if (f->rc_run < 0)
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
    loco_session_destroy(s);
    loco_quorum_fini(&q);
    return NULL;
}

/* siteA and siteB join, run STEPS outer steps and leave; the coordinator
 * then ends the run cleanly. */
static void islands_finish_the_run(void) {
    island f[2] = {{.site = "siteA"}, {.site = "siteB"}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, island_main, &f[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    expect_both_finished(f);
}

/* --------------------------------------------------------- the attacker */

/* A link to the coordinator with siteA's (valid) certificate. */
static int attacker(loco_link **l, int streams) {
    loco_net_params p;
    params(&p, "siteA");
    p.streams = streams;
    return loco_net_connect(l, &p, "127.0.0.1", port, 5000);
}

/* On stream st: the header of a REGISTER claiming `len` payload bytes (the
 * frame number a stream expects first is its index). */
static int claim(loco_link *l, int st, uint64_t len) {
    loco_frame_hdr h = {.type = LOCO_FRAME_REGISTER, .seq = (uint64_t)st, .payload_len = len};
    uint8_t b[LOCO_FRAME_HEADER_BYTES];
    cr_assert_eq(loco_frame_encode_header(b, &h, UINT64_MAX), 0);
    return loco_link_write_raw(l, st, b, sizeof b);
}

/* Resident memory of a process (/proc/PID/status, VmRSS). */
static long rss_kib(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

#define CLAIM_LINKS 16
/* What the coordinator's resident memory may grow by while 1 GiB is
 * claimed (threads, TLS sessions, first buffers; it grew 2.7 GiB before
 * issue 17); ASan's shadow memory and quarantine triple it. */
#ifdef __SANITIZE_ADDRESS__
#define RSS_BOUND_MIB 160
#else
#define RSS_BOUND_MIB 48
#endif

Test(adversary, claimed_payloads_cost_nothing_and_a_hang_up_mid_frame_is_survived,
     .init = setup_process) {
    const long rss0 = rss_kib(child);
    double claimed = 0;
    /* The client: 32 streams, each a header claiming 64 MiB.
     * Refused at the handshake (too many streams for the coordinator). */
    loco_link *wide = NULL;
    cr_expect_eq(attacker(&wide, 32), LOCO_EPEER);
    cr_expect(strstr(loco_errmsg(), "net.max_streams") != NULL, "%s", loco_errmsg());
    for (int st = 0; wide && st < 32; st++, claimed += 64 << 20)
        (void)claim(wide, st, (uint64_t)64 << 20);
    /* Then links of the most streams it takes, every stream a REGISTER
     * header claiming the most the coordinator takes, or 64 MiB (refused at
     * the header: that link goes), and nothing more. */
    loco_link *l[CLAIM_LINKS];
    for (int i = 0; i < CLAIM_LINKS; i++) {
        cr_assert_eq(attacker(&l[i], LOCO_COORD_MAX_STREAMS), 0, "%s", loco_errmsg());
        const uint64_t len = i % 4 == 3 ? (uint64_t)64 << 20 : LOCO_COORD_MAX_FRAME;
        for (int st = 0; st < LOCO_COORD_MAX_STREAMS; st++, claimed += (double)len)
            (void)claim(l[i], st, len);
    }
    sleep_ms(500); /* the coordinator takes the links and reads the headers */
    const long grown_kib = rss_kib(child) - rss0;
    cr_log_info("adversary: %.0f MiB claimed; the coordinator's resident memory went from "
                "%.1f to %.1f MiB",
                claimed / (1 << 20), rss0 / 1024.0, (rss0 + grown_kib) / 1024.0);
    cr_expect_lt(grown_kib, RSS_BOUND_MIB * 1024L, "resident memory grew %ld KiB", grown_kib);

    /* Some payload bytes, then the client hangs up mid-frame. */
    uint8_t some[1000];
    memset(some, 'x', sizeof some);
    loco_link_destroy(wide);
    for (int i = 0; i < CLAIM_LINKS; i++) {
        (void)loco_link_write_raw(l[i], 0, some, sizeof some);
        loco_link_abort(l[i]);
        loco_link_destroy(l[i]);
    }
    sleep_ms(100);
    islands_finish_the_run();
}

/* One of several ways to come and go before registering. */
static void come_and_go(loco_rng *r) {
    const int how = (int)(loco_rng_u64(r) % 7);
    uint8_t junk[256];
    for (size_t k = 0; k < sizeof junk; k++)
        junk[k] = (uint8_t)loco_rng_u64(r);
    if (how == 0) {
        /* Plain TCP, no TLS: bytes, then gone. */
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            (void)send(fd, junk, loco_rng_u64(r) % sizeof junk, MSG_NOSIGNAL);
        close(fd);
        return;
    }
    loco_link *l = NULL;
    if (attacker(&l, 1 + (int)(loco_rng_u64(r) % LOCO_COORD_MAX_STREAMS)) < 0)
        return; /* the listener may refuse while it is busy: that is fine too */
    loco_frame_hdr h = {.type = LOCO_FRAME_REGISTER};
    switch (how) {
    case 1: /* nothing at all */ break;
    case 2: /* part of a header */
        (void)loco_link_write_raw(l, 0, junk, 1 + loco_rng_u64(r) % 95);
        break;
    case 3: /* garbage where a header belongs */
        (void)loco_link_write_raw(l, 0, junk, sizeof junk);
        break;
    case 4: /* a REGISTER that is not JSON */ (void)loco_link_send(l, &h, junk, sizeof junk); break;
    case 5: /* anything but a REGISTER */
        h.type = LOCO_FRAME_OUTER;
        (void)loco_link_send(l, &h, "{}", 2);
        break;
    default: /* a REGISTER header and part of its payload */
        (void)claim(l, 0, 5000);
        (void)loco_link_write_raw(l, 0, junk, loco_rng_u64(r) % sizeof junk);
        break;
    }
    sleep_ms((int)(loco_rng_u64(r) % 4));
    if (loco_rng_u64(r) % 2)
        loco_link_abort(l); /* a reset rather than an orderly end */
    loco_link_destroy(l);
}

static atomic_int come_and_go_rounds;

static void *come_and_go_main(void *arg) {
    loco_rng r;
    loco_rng_seed(&r, 17);
    for (int k = 0; k < 60; k++) {
        come_and_go(&r);
        atomic_fetch_add(&come_and_go_rounds, 1);
        sleep_ms((int)(loco_rng_u64(&r) % 5));
    }
    (void)arg;
    return NULL;
}

Test(adversary, connections_that_come_and_go_or_talk_garbage_do_not_stop_it,
     .init = setup_in_process) {
    pthread_t t;
    atomic_store(&come_and_go_rounds, 0);
    cr_assert_eq(pthread_create(&t, NULL, come_and_go_main, NULL), 0);
    /* The islands register in the middle of it: once 10 of its 60 rounds
     * came and went (the sleep paces the check). */
    while (atomic_load(&come_and_go_rounds) < 10)
        sleep_ms(1);
    islands_finish_the_run();
    pthread_join(t, NULL);
}

Test(adversary, a_register_under_another_sites_name_is_refused, .init = setup_in_process) {
    island forged[] = {
        {.site = "siteA", .cert = "siteB"},
        {.site = "siteB", .cert = "mallory"},
        {.site = "mallory"},
    };
    const char *want[] = {
        "site 'siteA' registered with the certificate of 'siteB'",
        "site 'siteB' registered with the certificate of 'mallory'",
        "site 'mallory' is not in this run's outer.sites",
    };
    for (size_t i = 0; i < sizeof forged / sizeof *forged; i++) {
        island_main(&forged[i]);
        cr_expect_eq(forged[i].rc_join, LOCO_EPEER, "%s", forged[i].site);
        cr_expect(strstr(forged[i].msg, want[i]) != NULL, "%s", forged[i].msg);
    }
    islands_finish_the_run();
}

/* Lines of DIR/events.jsonl holding both a and b. */
static int count_events(const char *a, const char *b) {
    char path[4200], line[2048];
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, a) && strstr(line, b);
    fclose(f);
    return n;
}

/* Waits until DIR/events.jsonl holds n lines with both a and b (the file
 * comes with the first event); the sleep paces the rereads. */
static void await_events(const char *a, const char *b, int n) {
    char path[4200];
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    for (int k = 0; k < 2000; k++) {
        if (access(path, F_OK) == 0 && count_events(a, b) >= n)
            return;
        sleep_ms(5);
    }
    cr_assert_fail("%s never held %d lines with %s %s", path, n, a, b);
}

static void *vanish_main(void *arg) {
    island *f = arg;
    loco_net_params p;
    params(&p, f->site);
    char addr[1][LOCO_ADDR_MAX] = {"127.0.0.1:1"};
    loco_island_info me = {.site = f->site,
                           .n_ranks = 1,
                           .addrs = (const char(*)[LOCO_ADDR_MAX])addr,
                           .mesh = "dp=1",
                           .model_hash = 5};
    loco_session *s = NULL;
    loco_quorum q = {0};
    int id;
    f->rc_join = loco_session_join(&s, &cfg, &p, &me, NULL, &id, &q, 10000);
    loco_session_destroy(s); /* gone without BYE */
    loco_quorum_fini(&q);
    return NULL;
}

/* Every member hangs up: the coordinator waits for the islands to register
 * again, as a restarted one would, and the new processes run to the end. */
Test(adversary, every_island_gone_is_waited_for, .init = setup_in_process) {
    island gone[2] = {{.site = "siteA"}, {.site = "siteB"}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, vanish_main, &gone[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        cr_expect_eq(gone[i].rc_join, 0, "%s", gone[i].site);
    }
    await_events("\"kind\":\"suspect\"", "", 2); /* the coordinator saw both links close */
    islands_finish_the_run();
}

/* ------------------------------------------------ frames out of place */


/* A client presenting CERT's certificate (and NAME in its HELLO). */
static loco_link *raw_connect(const char *cert, const char *name) {
    loco_net_params p;
    params(&p, cert);
    snprintf(p.name, sizeof p.name, "%s", name);
    loco_link *l = NULL;
    cr_assert_eq(loco_net_connect(&l, &p, "127.0.0.1", port, 5000), 0, "%s", loco_errmsg());
    return l;
}

static void raw_register(loco_link *l, const char *site) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"site\":\"%s\",\"mesh\":\"dp=1\",\"model_hash\":\"0000000000000005\","
             "\"inc\":\"00000000000000a1\",\"ranks\":[\"127.0.0.1:1\"],\"committed\":0,"
             "\"hash\":\"0\",\"epoch\":0,\"pending\":0,\"pending_hash\":\"0\"}",
             site);
    loco_frame_hdr h = {.type = LOCO_FRAME_REGISTER};
    cr_assert_eq(loco_link_send(l, &h, json, strlen(json)), 0, "%s", loco_errmsg());
}

/* An OUTER frame whose header says it was sent in epoch sent_in. */
static void raw_outer(loco_link *l, uint64_t sent_in, const char *phase, int64_t step, int64_t have,
                      uint64_t epoch, uint64_t hash) {
    char json[256];
    snprintf(json, sizeof json,
             "{\"phase\":\"%s\",\"outer_step\":%lld,\"have\":%lld,\"epoch\":%llu,"
             "\"hash\":\"%016llx\",\"suspects\":\"0000000000000000\"}",
             phase, (long long)step, (long long)have, (unsigned long long)epoch,
             (unsigned long long)hash);
    loco_frame_hdr h = {.type = LOCO_FRAME_OUTER, .epoch = sent_in};
    cr_assert_eq(loco_link_send(l, &h, json, strlen(json)), 0, "%s", loco_errmsg());
}

/* The next frame on l (within 10 s), its payload as text in buf. */
static int raw_next(loco_link *l, char *buf, size_t cap) {
    for (int k = 0; k < 100; k++) {
        loco_frame_hdr h;
        void *payload = NULL;
        const int rc = loco_link_recv(l, &h, &payload, 100);
        if (rc == LOCO_ETIMEDOUT)
            continue;
        cr_assert_eq(rc, 0, "%s", loco_errmsg());
        const size_t n = h.payload_len < cap - 1 ? h.payload_len : cap - 1;
        memcpy(buf, payload ? payload : "", payload ? n : 0);
        buf[payload ? n : 0] = '\0';
        loco_free(payload);
        return h.type;
    }
    cr_assert_fail("nothing from the coordinator within 10 s");
    return -1;
}

/* Reads until a QUORUM for outer step `step` (0: a membership), into q.
 * Being told to rejoin on the way fails the test; so does, with
 * `same_epoch`, any announcement of another epoch. */
static void raw_quorum(loco_link *l, int64_t step, loco_quorum *q, uint64_t same_epoch) {
    char buf[8192];
    for (;;) {
        const int type = raw_next(l, buf, sizeof buf);
        cr_assert_neq(type, LOCO_FRAME_ERROR, "%s", buf);
        if (type != LOCO_FRAME_QUORUM)
            continue;
        cr_assert_eq(loco_quorum_from_json(q, buf, strlen(buf)), 0, "%s", loco_errmsg());
        cr_assert(!q->join, "siteA was told to rejoin: %s", buf);
        cr_assert(!same_epoch || q->epoch == same_epoch, "a new epoch: %s", buf);
        if (q->outer_step == step)
            return;
        loco_quorum_fini(q);
    }
}

/* Reads until the COMMIT; any announcement before it (a redo, a new
 * epoch) fails the test. */
static void raw_commit(loco_link *l, char *buf, size_t cap) {
    for (;;) {
        const int type = raw_next(l, buf, cap);
        cr_assert(type != LOCO_FRAME_ERROR && type != LOCO_FRAME_QUORUM, "%s before the commit: %s",
                  loco_frame_type_name(type), buf);
        if (type == LOCO_FRAME_COMMIT)
            return;
    }
}

/* siteA is a client that plays its part, and replays its frames of an
 * epoch already past: READY, DONE with another hash, FAILED, before the
 * go, during the exchange and after the commit. None of them counts: the
 * steps commit with the hashes of this epoch, nobody leaves, and siteB
 * (an island that behaves) runs to the end. */
Test(adversary, frames_replayed_from_a_past_epoch_change_nothing, .init = setup_in_process) {
    island b = {.site = "siteB"};
    pthread_t tb;
    cr_assert_eq(pthread_create(&tb, NULL, island_main, &b), 0);
    loco_link *a = raw_connect("siteA", "siteA");
    raw_register(a, "siteA");
    loco_quorum q = {0};
    raw_quorum(a, 0, &q, 0);
    const uint64_t e1 = q.epoch;
    loco_quorum_fini(&q);
    /* Step 1 in epoch e1, failed once by siteA: it is redone in e2. */
    raw_outer(a, e1, "ready", 1, 0, 0, 0);
    raw_quorum(a, 1, &q, 0);
    cr_assert_eq(q.epoch, e1);
    loco_quorum_fini(&q);
    raw_outer(a, e1, "failed", 1, 0, e1, 0);
    raw_quorum(a, 0, &q, 0);
    const uint64_t e2 = q.epoch;
    cr_assert_gt(e2, e1);
    loco_quorum_fini(&q);
    /* Before the go of e2: e1's READY, DONE and FAILED. */
    raw_outer(a, e1, "ready", 1, 0, 0, 0);
    raw_outer(a, e1, "done", 1, 0, e1, 0xbad);
    raw_outer(a, e1, "failed", 1, 0, e1, 0);
    raw_outer(a, e2, "ready", 1, 0, 0, 0);
    raw_quorum(a, 1, &q, e2);
    loco_quorum_fini(&q);
    /* During the exchange: a DONE with another hash and a FAILED of e1. */
    raw_outer(a, e1, "done", 1, 0, e1, 0xbad);
    raw_outer(a, e1, "failed", 1, 0, e1, 0);
    raw_outer(a, e2, "done", 1, 0, e2, 11);
    char buf[512];
    raw_commit(a, buf, sizeof buf);
    cr_expect(strstr(buf, "\"outer_step\":1") && strstr(buf, "000000000000000b"), "%s", buf);
    /* After the commit: step 1's frames of both epochs, READY of e1. */
    raw_outer(a, e1, "ready", 1, 0, 0, 0);
    raw_outer(a, e1, "failed", 2, 0, e1, 0);
    raw_outer(a, e1, "done", 2, 0, e1, 0xbad);
    raw_outer(a, e2, "done", 1, 0, e2, 0xbad);
    raw_outer(a, e2, "failed", 1, 0, e2, 0);
    raw_outer(a, e2, "ready", 2, 1, 0, 0);
    raw_quorum(a, 2, &q, e2); /* still e2: no one left, nothing redone */
    cr_expect_eq(q.members, 3u, "siteA and siteB");
    loco_quorum_fini(&q);
    raw_outer(a, e1, "done", 2, 0, e1, 0xbad);
    raw_outer(a, e2, "done", 2, 0, e2, 22);
    raw_commit(a, buf, sizeof buf);
    cr_expect(strstr(buf, "\"outer_step\":2") && strstr(buf, "0000000000000016"), "%s", buf);
    loco_frame_hdr bye = {.type = LOCO_FRAME_BYE, .epoch = e2};
    cr_assert_eq(loco_link_send(a, &bye, NULL, 0), 0);
    int type;
    while ((type = raw_next(a, buf, sizeof buf)) != LOCO_FRAME_BYE)
        cr_assert_neq(type, LOCO_FRAME_ERROR, "%s", buf);
    pthread_join(tb, NULL);
    cr_expect_eq(b.rc_run, 0, "siteB: %s", b.msg);
    cr_expect_eq(b.commits, STEPS);
    cr_expect_eq(finish(), 0, "the coordinator stopped: %s", serve_msg);
    cr_expect_eq(count_events("\"kind\":\"suspect\"", ""), 0, "nobody left");
    cr_expect_eq(count_events("\"kind\":\"divergence\"", ""), 0);
    cr_expect_eq(count_events("\"kind\":\"exchange_failed\"", ""), 1, "siteA's one failure");
    cr_expect_eq(count_events("\"kind\":\"commit\"", "\"hash\":\"000000000000000b\""), 1);
    cr_expect_eq(count_events("\"kind\":\"commit\"", "\"hash\":\"0000000000000016\""), 1);
    loco_link_destroy(a);
}

/* While siteB is registered and running, a client with siteA's
 * certificate (saying siteB in its HELLO too) registers as siteB, or sends
 * an island's frames without registering: refused every time, with the
 * reason; siteB keeps its link (it registered once, was never out) and the
 * run ends cleanly. */
Test(adversary, a_forged_site_cannot_displace_a_registered_one, .init = setup_in_process) {
    island f[2] = {{.site = "siteA", .hold = true}, {.site = "siteB"}};
    pthread_t t[2];
    cr_assert_eq(pthread_create(&t[1], NULL, island_main, &f[1]), 0);
    await_events("\"kind\":\"register\"", "\"site\":\"siteB\"", 1); /* waiting for siteA */
    int refused = 0;
    for (int k = 0; k < 12; k++) {
        if (k == 4) {
            /* The rest while the run is under way: step 1 committed. */
            cr_assert_eq(pthread_create(&t[0], NULL, island_main, &f[0]), 0);
            for (int w = 0; w < 2000 && !atomic_load(&f[0].held); w++)
                sleep_ms(5);
            cr_assert(atomic_load(&f[0].held), "siteA: %s", f[0].msg);
        }
        loco_link *l = raw_connect("siteA", "siteB");
        if (k % 2 == 0) {
            raw_register(l, "siteB");
        } else {
            loco_frame_hdr h = {.type = LOCO_FRAME_OUTER, .epoch = 1};
            const char *done = "{\"phase\":\"done\",\"outer_step\":2,\"have\":0,\"epoch\":1,"
                               "\"hash\":\"0\",\"suspects\":\"0\"}";
            cr_assert_eq(loco_link_send(l, &h, done, strlen(done)), 0);
        }
        char buf[1024];
        const int type = raw_next(l, buf, sizeof buf);
        cr_expect_eq(type, LOCO_FRAME_ERROR, "%s: %s", loco_frame_type_name(type), buf);
        const char *want = k % 2 == 0 ? "site 'siteB' registered with the certificate of 'siteA'"
                                      : "expected REGISTER, got OUTER";
        cr_expect(strstr(buf, want) != NULL, "%s", buf);
        refused += type == LOCO_FRAME_ERROR;
        loco_link_destroy(l);
    }
    cr_expect_eq(refused, 12);
    atomic_store(&f[0].go_on, true);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    expect_both_finished(f);
    cr_expect_eq(count_events("\"kind\":\"register\"", "\"site\":\"siteB\""), 1,
                 "siteB registered once: its link was never replaced");
    cr_expect_eq(count_events("\"kind\":\"suspect\"", "\"site\":\"siteB\""), 0);
}
