/* The coordinator's decision journal (faulttol/journal.c, issue 30): a
 * commit is on disk before any island hears it, so a coordinator killed
 * right after that record finishes the commit when it restarts instead of
 * redoing the step; and a restarted coordinator whose islands report
 * different committed steps (one ahead, one behind, one fresh) resumes at
 * its own last commit, which the island ahead serves to the others. The
 * coordinator is the real `loco coordinator` process (plain TCP on
 * loopback), so that its crash (LOCO_COORD_CRASH_AFTER_COMMIT: SIGKILL
 * right after the record) kills it alone; the islands are sessions in
 * this process. Their θ hash after outer step s in epoch e is
 * 11 s + 1000 e, so a step redone in another epoch gets another hash. */
#include "faulttol/faulttol.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static loco_config cfg;
static loco_net_params np;
static char dir[64], cfg_path[96], journal[96], events[96];

/* A port free now on loopback (the restarted coordinator keeps it). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The run's config for `loco coordinator` and, as cfg/np, for the
 * sessions: three sites, plain TCP. */
static void setup_run(const char *name) {
    snprintf(dir, sizeof dir, "/tmp/loco-%s-XXXXXX", name);
    cr_assert(mkdtemp(dir));
    snprintf(cfg_path, sizeof cfg_path, "%s/run.ini", dir);
    snprintf(journal, sizeof journal, "%s/decisions.log", dir);
    snprintf(events, sizeof events, "%s/events.jsonl", dir);
    const int port = free_port();
    FILE *f = fopen(cfg_path, "w");
    cr_assert(f);
    fprintf(f,
            "[run]\ndir = %s\nlog_level = info\n[outer]\nsites = siteA,siteB,siteC\n[net]\n"
            "tls = false\n[faulttol]\ncoordinator = 127.0.0.1:%d\ntimeout_ms = 5000\n",
            dir, port);
    fclose(f);
    loco_config_defaults(&cfg);
    snprintf(cfg.outer.sites, sizeof cfg.outer.sites, "siteA,siteB,siteC");
    snprintf(cfg.faulttol.coordinator, sizeof cfg.faulttol.coordinator, "127.0.0.1:%d", port);
    cfg.faulttol.timeout_ms = 5000;
    loco_net_params_default(&np);
    np.backend = LOCO_NET_PLAIN;
    np.streams = 1;
    loco_log_set_level(LOCO_LOG_ERROR);
}

/* `loco coordinator` on the run (crash_at: LOCO_COORD_CRASH_AFTER_COMMIT),
 * its output to DIR/coordinator.N.log. */
static pid_t coord_spawn(const char *crash_at, int n) {
    const char *bin = getenv("LOCO_BIN") ? getenv("LOCO_BIN") : "build/loco";
    char log[128], crash[64];
    snprintf(log, sizeof log, "%s/coordinator.%d.log", dir, n);
    snprintf(crash, sizeof crash, "LOCO_COORD_CRASH_AFTER_COMMIT=%s", crash_at ? crash_at : "");
    int ne = 0;
    while (environ[ne])
        ne++;
    char **env = calloc((size_t)ne + 2, sizeof *env);
    cr_assert(env);
    memcpy(env, environ, (size_t)ne * sizeof *env);
    env[ne] = crash;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    char *argv[] = {(char *)bin, "coordinator", cfg_path, NULL};
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, bin, &fa, NULL, argv, env), 0, "spawn %s", bin);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    return pid;
}

/* The coordinator's log, for a failure message. */
static const char *coord_log(int n) {
    static char buf[8192];
    char path[128];
    snprintf(path, sizeof path, "%s/coordinator.%d.log", dir, n);
    FILE *f = fopen(path, "r");
    size_t len = 0;
    if (f) {
        fseek(f, 0, SEEK_END);
        long sz = ftell(f);
        fseek(f, sz > (long)sizeof buf - 1 ? sz - (long)sizeof buf + 1 : 0, SEEK_SET);
        len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
    }
    buf[len] = '\0';
    return buf;
}

/* Waits for pid (a deadline under the test's timeout); its wait status. */
static int reap(pid_t pid, double seconds) {
    const double t0 = loco_now();
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return st;
        if (loco_now() - t0 > seconds) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            cr_assert_fail("the coordinator did not end within %.0f s", seconds);
        }
        const struct timespec ms = {0, 20 * 1000000L};
        nanosleep(&ms, NULL); /* a child's exit has no fd to wait on here */
    }
}

/* An island: registers with prog, takes 50 ms per outer step, reports
 * hash 11 s + 1000 e, takes the step and hash a JOIN names (what a state
 * transfer gives it), and leaves once `last` is committed — saying BYE,
 * or (vanish) just closing its link. */
typedef struct {
    const char *site;
    loco_island_progress prog;
    int64_t last;
    bool vanish;
    int rc;
    int joins, commits[64], dones[64];
    int64_t first_join, committed;
    uint64_t hash[64]; /* θ hash it held after each step */
    char msg[1024];
} fake;

static void *fake_main(void *arg) {
    fake *f = arg;
    /* an outer step's training time, not a wait for an event: the
     * coordinator's verdicts are what the loop waits for */
    const struct timespec pause = {0, 50 * 1000000L};
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
    int64_t committed = f->prog.committed;
    uint64_t hash = f->prog.hash;
    f->rc = loco_session_join(&s, &cfg, &p, &me, &f->prog, &id, &q, 30000);
    if (f->rc == 0 && (q.join || !loco_quorum_has(q.members, id))) {
        f->joins++;
        f->first_join = committed = q.committed;
        hash = q.committed_hash;
    }
    for (int tries = 0; f->rc == 0 && committed < f->last && tries < 200; tries++) {
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
            hash = q.committed_hash;
            continue;
        }
        if (v != LOCO_VERDICT_GO)
            continue; /* AGAIN: say ready again */
        const uint64_t h = 11u * (uint64_t)step + 1000u * q.epoch;
        loco_island_progress pr = {
            .committed = committed, .hash = hash, .pending = step, .pending_hash = h};
        loco_session_progress(s, &pr);
        if (step < 64)
            f->dones[step]++;
        f->rc = loco_session_done(s, step, q.epoch, true, h, 0, &q, &v, 30000);
        if (f->rc < 0 || v == LOCO_VERDICT_FINISHED)
            break;
        if (v == LOCO_VERDICT_COMMIT) {
            committed = step;
            hash = h;
            f->commits[step]++;
        } else if (v == LOCO_VERDICT_JOIN) {
            f->joins++;
            committed = q.committed;
            hash = q.committed_hash;
        }
        loco_island_progress now = {.committed = committed, .hash = hash};
        loco_session_progress(s, &now);
        if (committed < 64)
            f->hash[committed] = hash;
    }
    f->committed = committed;
    if (committed < 64)
        f->hash[committed] = hash;
    if (f->rc == 0 && !f->vanish)
        f->rc = loco_session_leave(s, 30000);
    if (f->rc < 0)
        snprintf(f->msg, sizeof f->msg, "%s", loco_errmsg());
    loco_session_destroy(s);
    loco_quorum_fini(&q);
    return NULL;
}

static void run_fakes(fake *f, int n) {
    pthread_t t[3];
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fake_main, &f[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* Every commit the journal and the timeline hold: no outer step with two
 * hashes. The hash of step s (0 when never committed) into hash[s]. */
static void expect_one_value_per_step(uint64_t hash[64]) {
    memset(hash, 0, 64 * sizeof *hash);
    const char *files[2] = {journal, events};
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(files[k], "r");
        cr_expect(f, "%s", files[k]);
        if (!f)
            continue;
        char line[2048];
        while (fgets(line, sizeof line, f)) {
            const char *st = strstr(line, k == 0 ? "\"step\":" : "\"outer_step\":");
            const char *h = strstr(line, "\"hash\":\"");
            if (!strstr(line, k == 0 ? "\"k\":\"commit\"" : "\"kind\":\"commit\"") || !st || !h)
                continue;
            const long s = strtol(strchr(st, ':') + 1, NULL, 10);
            const uint64_t v = strtoull(h + 8, NULL, 16);
            cr_assert(s > 0 && s < 64, "%s", line);
            cr_expect(!hash[s] || hash[s] == v,
                      "outer step %ld committed with two values (%016llx, then %016llx in %s)", s,
                      (unsigned long long)hash[s], (unsigned long long)v, files[k]);
            if (!hash[s])
                hash[s] = v;
        }
        fclose(f);
    }
}

/* How many `commit` events of outer step s the timeline holds. */
static int commit_events(int s) {
    char want[48], line[2048];
    snprintf(want, sizeof want, "\"outer_step\":%d,", s);
    FILE *f = fopen(events, "r");
    cr_assert(f, "%s", events);
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, "\"kind\":\"commit\"") && strstr(line, want);
    fclose(f);
    return n;
}

/* The coordinator is killed right after the commit record of outer step
 * 3 (before any island hears it); restarted, it reads its journal back and
 * tells the islands that finished step 3 that it is committed, with the
 * hash it recorded: step 3 is committed once, never redone. */
Test(coord_journal, a_commit_recorded_before_a_crash_is_finished_not_redone, .timeout = 60) {
    setup_run("journal-crash");
    pid_t c1 = coord_spawn("3", 1);
    fake f[3] = {
        {.site = "siteA", .last = 6}, {.site = "siteB", .last = 6}, {.site = "siteC", .last = 6}};
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, fake_main, &f[i]), 0);
    int st = reap(c1, 40);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
              "the coordinator was to kill itself after the record of step 3 (status %d):\n%s", st,
              coord_log(1));
    pid_t c2 = coord_spawn(NULL, 2);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    st = reap(c2, 40);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "restarted coordinator: status %d:\n%s", st,
              coord_log(2));
    uint64_t committed[64];
    expect_one_value_per_step(committed);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].committed, 6, "%s ends at the last step", f[i].site);
        cr_expect_eq(f[i].commits[3], 1, "%s heard the commit of step 3 once", f[i].site);
        cr_expect_eq(f[i].dones[3], 1, "%s did step 3 once (it was not redone)", f[i].site);
        cr_expect_eq(f[i].hash[3], committed[3],
                     "%s holds the recorded hash of step 3 (%016llx), not a redo's (%016llx)",
                     f[i].site, (unsigned long long)committed[3], (unsigned long long)f[i].hash[3]);
        cr_expect_eq(f[i].joins, 0, "%s never had to fetch the state", f[i].site);
    }
    cr_expect(strstr(coord_log(2), "read back") != NULL, "%s", coord_log(2));
    cr_expect_eq(commit_events(3), 1,
                 "the timeline commits step 3 once (the restarted "
                 "coordinator writes the event the killed one could not)");
    loco_rmtree(dir);
}

/* Steps 1-5 are committed; every island goes, and the coordinator is
 * killed. Then the islands come back holding different states: siteA
 * step 5 (ahead: before issue 30 a lone claim nobody confirmed), siteB
 * step 3 (an older checkpoint), siteC nothing (a fresh start). The
 * restarted coordinator resumes at its own last commit, step 5: siteA
 * stays a member and serves it, siteB and siteC fetch it, and steps 4
 * and 5 are never committed again (they would get other hashes). */
Test(coord_journal, islands_at_different_steps_resume_at_the_recorded_commit, .timeout = 60) {
    setup_run("journal-claims");
    pid_t c1 = coord_spawn(NULL, 1);
    fake g[3] = {{.site = "siteA", .last = 5, .vanish = true},
                 {.site = "siteB", .last = 5, .vanish = true},
                 {.site = "siteC", .last = 5, .vanish = true}};
    run_fakes(g, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(g[i].rc, 0, "%s: %s", g[i].site, g[i].msg);
    kill(c1, SIGKILL); /* it waits for the islands to register again */
    reap(c1, 10);
    pid_t c2 = coord_spawn(NULL, 2);
    fake f[3] = {
        {.site = "siteA", .prog = {.committed = 5, .hash = g[0].hash[5], .epoch = 1}, .last = 8},
        {.site = "siteB", .prog = {.committed = 3, .hash = g[1].hash[3], .epoch = 1}, .last = 8},
        {.site = "siteC", .prog = {.committed = 0, .hash = 0x7e57}, .last = 8},
    };
    run_fakes(f, 3);
    int st = reap(c2, 40);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "restarted coordinator: status %d:\n%s", st,
              coord_log(2));
    uint64_t committed[64];
    expect_one_value_per_step(committed);
    for (int s = 1; s <= 8; s++)
        cr_expect(committed[s] != 0, "outer step %d was committed", s);
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(f[i].rc, 0, "%s: %s", f[i].site, f[i].msg);
        cr_expect_eq(f[i].committed, 8, "%s ends at the last step", f[i].site);
        cr_expect_eq(f[i].hash[8], committed[8], "%s ends with the committed hash", f[i].site);
    }
    cr_expect_eq(f[0].joins, 0, "siteA's step 5 was the coordinator's own: it never fetched");
    cr_expect_eq(f[1].first_join, 5, "siteB fetches step 5, is not believed at 3");
    cr_expect_eq(f[2].first_join, 5, "siteC fetches step 5");
    loco_rmtree(dir);
}

/* A line of the journal: the XXH3 of the JSON, a space, the JSON. */
static void put_record(FILE *f, const char *json) {
    char hh[17];
    loco_hash_hex(loco_hash64(json, strlen(json)), hh);
    fprintf(f, "%s %s\n", hh, json);
}

/* A crash mid-write leaves a torn last record: it is skipped with a
 * warning (and cut off, so that the next record follows a whole one); a
 * record that does not check before the last is an error that names the
 * file and the record. */
Test(coord_journal, a_torn_last_record_is_skipped_a_corrupt_one_is_an_error) {
    setup_run("journal-torn");
    loco_net_params cnp = np;
    snprintf(cnp.name, sizeof cnp.name, "coordinator");
    FILE *f = fopen(journal, "w");
    put_record(f, "{\"k\":\"epoch\",\"epoch\":1,\"members\":\"7\"}");
    put_record(f, "{\"k\":\"commit\",\"step\":1,\"epoch\":1,\"hash\":\"00000000000000aa\","
                  "\"members\":\"7\",\"how\":\"commit\"}");
    const long whole = ftell(f);
    fputs("0123456789abcdef {\"k\":\"commit\",\"st", f); /* torn */
    fclose(f);
    loco_coord *c = NULL;
    cr_assert_eq(loco_coord_create(&c, &cfg, &cnp, "127.0.0.1", 0, NULL), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_coord_open_journal(c, journal), 0, "%s", loco_errmsg());
    loco_coord_destroy(c);
    f = fopen(journal, "r");
    fseek(f, 0, SEEK_END);
    cr_expect_eq(ftell(f), whole, "the torn record was cut off");
    fclose(f);

    f = fopen(journal, "w");
    put_record(f, "{\"k\":\"epoch\",\"epoch\":1,\"members\":\"7\"}");
    fputs("0000000000000000 {\"k\":\"epoch\",\"epoch\":2,\"members\":\"7\"}\n", f); /* bad sum */
    put_record(f, "{\"k\":\"epoch\",\"epoch\":3,\"members\":\"7\"}");
    fclose(f);
    cr_assert_eq(loco_coord_create(&c, &cfg, &cnp, "127.0.0.1", 0, NULL), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_coord_open_journal(c, journal), LOCO_EIO);
    cr_expect(strstr(loco_errmsg(), journal) && strstr(loco_errmsg(), "record 2"), "%s",
              loco_errmsg());
    loco_coord_destroy(c);
    loco_rmtree(dir);
}
