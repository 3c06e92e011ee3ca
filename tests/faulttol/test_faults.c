/* One scenario per fault kind, each a real `loco launch` of three islands
 * over loopback TLS with the fault injected (configs/faults-*.ini): the
 * run finishes, the islands of the last quorum end bit-identical, a
 * rejoined island matches after its first outer step, detection happens
 * within the configured bound, no corrupted or stale frame is applied
 * (that would break the agreement the coordinator checks every step), and
 * the final loss is the fault-free run's: bit for bit where no island
 * missed a step, near it where one did (loss_near_baseline).
 *
 * One file: the scenarios share the one fault-free baseline run. */
#include "tests/support.h"
#include "core/core.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
/* A short grace: an island thawed after the run ended (a loaded machine)
 * must not wait minutes for a coordinator that is gone. */
#define SMALL " --set train.steps=120 --set run.eval_every=0 --set run.log_every=1000" \
              " --set faulttol.coordinator_grace_s=0"

typedef struct {
    char dir[64];
    char out[1 << 17];
    int rc;
} scenario;

static void run(scenario *s, const char *name, const char *extra) {
    snprintf(s->dir, sizeof s->dir, "/tmp/loco-faults-XXXXXX");
    cr_assert(mkdtemp(s->dir));
    s->rc = test_run(s->out, sizeof s->out,
                     LOCO " launch configs/faults-%s.ini --no-baseline --set run.dir=%s" SMALL " %s",
                     name, s->dir, extra);
}

static void done(scenario *s) { loco_rmtree(s->dir); }

/* Time of the first event of `kind` (and site, fault when given) at or
 * after `after`; < 0 when none. */
static double event_at(const scenario *s, const char *kind, const char *site, const char *fault,
                       double after) {
    char path[128];
    snprintf(path, sizeof path, "%s/events.jsonl", s->dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char line[4096];
    double t = -1;
    while (t < 0 && fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kind");
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "site");
        const cJSON *fl = cJSON_GetObjectItemCaseSensitive(j, "fault");
        const cJSON *tt = cJSON_GetObjectItemCaseSensitive(j, "t");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, kind) && cJSON_IsNumber(tt) &&
            tt->valuedouble >= after &&
            (!site || (cJSON_IsString(st) && !strcmp(st->valuestring, site))) &&
            (!fault || (cJSON_IsString(fl) && !strcmp(fl->valuestring, fault))))
            t = tt->valuedouble;
        cJSON_Delete(j);
    }
    fclose(f);
    return t;
}

/* The last outer step an island recorded and its θ_global hash. */
static int last_outer(const scenario *s, const char *site, char hash[17]) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s/outer.jsonl", s->dir, site);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char line[4096];
    int step = -1;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "theta_hash");
        if (cJSON_IsNumber(os) && cJSON_IsString(h) && os->valueint >= step) {
            step = os->valueint;
            snprintf(hash, 17, "%s", h->valuestring);
        }
        cJSON_Delete(j);
    }
    fclose(f);
    return step;
}

/* The last commit on the timeline: its outer step, hash and members. */
static int last_commit(const scenario *s, char hash[17], bool member[3]) {
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    char path[128];
    snprintf(path, sizeof path, "%s/events.jsonl", s->dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char line[4096];
    int step = -1;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kind");
        const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "hash");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "members");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, "commit") && cJSON_IsNumber(os) &&
            cJSON_IsString(h) && cJSON_IsArray(m) && os->valueint >= step) {
            step = os->valueint;
            snprintf(hash, 17, "%s", h->valuestring);
            for (int i = 0; i < 3; i++) {
                member[i] = false;
                const cJSON *e;
                cJSON_ArrayForEach(e, m) member[i] |=
                    cJSON_IsString(e) && !strcmp(e->valuestring, sites[i]);
            }
        }
        cJSON_Delete(j);
    }
    fclose(f);
    return step;
}

/* The run committed every outer step (at least outer_steps: the run goes
 * on while a fault's cycle is open, docs/FAULTS.md), the end event names
 * the last, and every island of the last quorum ends there with its
 * θ_global: bit-identical survivors. Islands still catching up at the end
 * (a loaded machine can make anyone late) are not members and are not
 * compared. */
static void all_agree(const scenario *s, int outer_steps) {
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    char hc[17] = "";
    bool member[3];
    const int last = last_commit(s, hc, member);
    cr_assert_geq(last, outer_steps, "every outer step committed");
    char end[64];
    snprintf(end, sizeof end, "run finished; θ_global agreed through outer step %d", last);
    cr_expect(strstr(s->out, end) != NULL, "the end is the last commit (%d): %s", last, s->out);
    if (last > outer_steps)
        cr_expect(strstr(s->out, "goes on to inner step") != NULL,
                  "only a held end goes past train.steps: %s", s->out);
    int n = 0;
    for (int k = 0; k < 3; k++) {
        if (!member[k])
            continue;
        char h[17] = "";
        n++;
        cr_expect_eq(last_outer(s, sites[k], h), last, "%s", sites[k]);
        cr_expect_str_eq(h, hc, "%s differs from the committed θ_global", sites[k]);
    }
    cr_expect_geq(n, 2, "at least two islands in the final quorum");
    cr_expect(strstr(s->out, "run finished; θ_global agreed through outer step") != NULL);
}

/* Runs `prep` (shell, in s->dir) on a finished run, then resumes it with
 * `loco launch --resume` and the run's arguments. The restarted
 * coordinator waits faulttol.timeout_ms after the first registration for
 * the others, and they as long for its first quorum: 15 s, for a loaded
 * machine that starts one island's process seconds after the others. */
static void resume_after(scenario *s, const char *prep, const char *args) {
    s->rc = test_run(s->out, sizeof s->out, "cd %s && %s", s->dir, prep);
    cr_assert_eq(s->rc, 0, "%s", s->out);
    s->rc = test_run(s->out, sizeof s->out,
                     LOCO " launch configs/faults-kill.ini --no-baseline --resume --set run.dir=%s"
                          SMALL " --set faulttol.timeout_ms=15000 %s",
                     s->dir, args);
    cr_assert_eq(s->rc, 0, "%s", s->out);
}

/* b: a copy of the finished run a without its checkpoints of steps 50 and
 * 60, resumed (from step 25). */
static void resume_copy(const scenario *a, scenario *b, const char *args) {
    snprintf(b->dir, sizeof b->dir, "/tmp/loco-faults-XXXXXX");
    cr_assert(mkdtemp(b->dir));
    b->rc = test_run(b->out, sizeof b->out, "cp -r %s/. %s/", a->dir, b->dir);
    cr_assert_eq(b->rc, 0, "%s", b->out);
    resume_after(b, "rm -rf */ckpt_00000050 */outer_00000050 */ckpt_00000060 */outer_00000060",
                 args);
}

/* Every outer step's time accounting is within the run: wait_s and wall_s
 * of each island's outer.jsonl, and each "waited W of T s" logged, lie in
 * [0, elapsed] (an uninitialised start time once gave a rejoined island's
 * first step the machine's uptime). That step, observed while the island
 * sets up, is only in the log: outer.jsonl is opened after it. */
static void times_within(const scenario *s, double elapsed) {
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    int records = 0;
    for (int k = 0; k < 3; k++) {
        char path[160];
        snprintf(path, sizeof path, "%s/%s/outer.jsonl", s->dir, sites[k]);
        FILE *f = fopen(path, "r");
        cr_assert(f, "%s", path);
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            cJSON *j = cJSON_Parse(line);
            const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, "wait_s");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "wall_s");
            if (cJSON_IsNumber(w) && cJSON_IsNumber(t)) {
                records++;
                cr_expect(w->valuedouble >= 0 && w->valuedouble <= elapsed &&
                              t->valuedouble >= 0 && t->valuedouble <= elapsed,
                          "%s outer step %d: waited %.3f of %.3f s in a run of %.3f s", sites[k],
                          cJSON_IsNumber(os) ? os->valueint : -1, w->valuedouble, t->valuedouble,
                          elapsed);
            }
            cJSON_Delete(j);
        }
        fclose(f);
    }
    cr_expect_gt(records, 0, "outer.jsonl records wait_s and wall_s");
    for (const char *p = strstr(s->out, "| waited "); p; p = strstr(p + 1, "| waited ")) {
        double w = -1, t = -1;
        cr_expect_eq(sscanf(p, "| waited %lf of %lf s", &w, &t), 2, "%.60s", p);
        cr_expect(w >= 0 && w <= elapsed && t >= 0 && t <= elapsed,
                  "logged: waited %.3f of %.3f s in a run of %.3f s", w, t, elapsed);
    }
}

/* Mean training loss of steps last-9..last over the islands of run dir
 * (each step's last value, as the report reads them: a restarted island
 * logs steps again): the report's final loss at a fixed step, ten steps
 * because one step's loss is too noisy (docs/REPORTS.md). */
static double window_loss(const char *dir, int last) {
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    double sum = 0;
    int n = 0;
    for (int k = 0; k < 3; k++) {
        char path[160];
        snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, sites[k]);
        FILE *f = fopen(path, "r");
        cr_assert(f, "%s", path);
        double loss[10];
        bool have[10] = {false};
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            cJSON *j = cJSON_Parse(line);
            const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(j, "loss");
            const int i = cJSON_IsNumber(st) ? last - st->valueint : -1;
            if (cJSON_IsNumber(l) && i >= 0 && i < 10)
                loss[i] = l->valuedouble, have[i] = true;
            cJSON_Delete(j);
        }
        fclose(f);
        for (int i = 0; i < 10; i++)
            if (have[i])
                sum += loss[i], n++;
    }
    cr_assert_gt(n, 0, "%s: no training loss in steps %d..%d", dir, last - 9, last);
    return sum / n;
}

/* The fault-free run of the scenarios' configuration (configs/faults-*.ini
 * share [model], [train], [outer] and [compress]; SMALL, faults cleared),
 * run once for the whole suite: by the first test that needs it, the
 * others waiting on its lock. One per run of the test binary (the
 * runner's pid: it removes it when the run ends, see below). */
static const char *baseline(void) {
    static char dir[64];
    char path[96];
    snprintf(dir, sizeof dir, "/tmp/loco-faults-baseline-%d", (int)getppid());
    snprintf(path, sizeof path, "%s.lock", dir);
    const int fd = open(path, O_CREAT | O_RDWR, 0600);
    cr_assert(fd >= 0 && flock(fd, LOCK_EX) == 0, "%s", path);
    snprintf(path, sizeof path, "%s/finished", dir);
    if (access(path, F_OK) != 0) {
        static char out[1 << 17];
        loco_rmtree(dir);
        const int rc = test_run(out, sizeof out,
                                LOCO " launch configs/faults-kill.ini --no-baseline --set "
                                     "run.dir=%s" SMALL " --set faults.kill= && touch %s",
                                dir, path);
        cr_assert_eq(rc, 0, "%s", out);
    }
    close(fd); /* and the lock with it */
    return dir;
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
    (void)stats;
    char dir[64], lock[80];
    snprintf(dir, sizeof dir, "/tmp/loco-faults-baseline-%d", (int)getpid());
    snprintf(lock, sizeof lock, "%s.lock", dir);
    loco_rmtree(dir);
    unlink(lock);
}

/* Whether every island recorded outer steps 1..n each with all three
 * members: then every step averaged the contributions the fault-free run
 * averaged. */
static bool nothing_lost(const scenario *s, int n) {
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    for (int k = 0; k < 3; k++) {
        char path[160];
        snprintf(path, sizeof path, "%s/%s/outer.jsonl", s->dir, sites[k]);
        FILE *f = fopen(path, "r");
        cr_assert(f, "%s", path);
        uint64_t full = 0; /* bit i: outer step i + 1 with three members */
        char line[4096];
        while (fgets(line, sizeof line, f)) {
            cJSON *j = cJSON_Parse(line);
            const cJSON *os = cJSON_GetObjectItemCaseSensitive(j, "outer_step");
            const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "members");
            if (cJSON_IsNumber(os) && cJSON_IsNumber(m) && os->valueint >= 1 && os->valueint <= n &&
                m->valueint == 3)
                full |= 1ULL << (os->valueint - 1);
            cJSON_Delete(j);
        }
        fclose(f);
        if (full != (1ULL << n) - 1)
            return false;
    }
    return true;
}

/* The fault run's final loss against the fault-free run's, both at
 * train.steps = 120 (which every run reaches: outer step 12). Where no
 * island missed an outer step, the training is the fault-free run's (the
 * same batches, the same contributions averaged in the same order) and so
 * is every bit of the loss. Where islands were out, the global steps
 * averaged fewer contributions and the loss moves either way: measured
 * here from 0.4% (poison) to 17% (corrupt at 0.1, which ejects an island
 * from nearly every step) of what the fault-free run gains over its 120
 * steps (5.57 at step 1 to 3.01); a fault run off by half that gain has
 * lost training, not just taken another path. */
static void loss_near_baseline(const scenario *s) {
    const char *base = baseline();
    const double lf = window_loss(s->dir, 120), lb = window_loss(base, 120);
    const double gain = window_loss(base, 1) - lb;
    cr_log_info("final loss %.6f, fault-free %.6f (%+.2f%% of its gain)", lf, lb,
                100 * (lf - lb) / gain);
    if (nothing_lost(s, 12))
        cr_expect_eq(lf, lb, "no island missed a step: final loss %.9g, fault-free %.9g", lf, lb);
    else
        cr_expect(fabs(lf - lb) <= 0.5 * gain,
                  "final loss %.6f, fault-free %.6f: %+.1f%% of the fault-free gain %.4f", lf, lb,
                  100 * (lf - lb) / gain, gain);
}

TestSuite(faults, .timeout = 240);

Test(faults, killed_island_is_detected_rejoins_and_matches) {
    scenario *s = calloc(1, sizeof *s);
    const double t0 = loco_now();
    run(s, "kill", "--set faults.kill=siteC@30 --set faults.restart_ms=200");
    const double elapsed = loco_now() - t0;
    cr_assert_eq(s->rc, 0, "%s", s->out);
    times_within(s, elapsed);
    double kill = event_at(s, "fault", "siteC", "kill", 0);
    double sus = event_at(s, "suspect", "siteC", NULL, kill);
    double join = event_at(s, "join", "siteC", NULL, kill);
    cr_assert(kill > 0 && sus > 0 && join > 0, "kill %.3f suspect %.3f join %.3f", kill, sus,
              join);
    cr_expect_lt(sus - kill, 3.0, "a dead island on a LAN is noticed within 3 s");
    cr_expect(strstr(s->out, "hash checked") != NULL, "the rejoined island checked its state");
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

/* Islands at batch 8, 4 and 2 ([site.NAME] keys), their contributions
 * weighted by tokens, and of three meshes (outer.layout = whole: one
 * rank, dp = 2, tp = 2): the killed one (batch 2, tp = 2) rejoins by
 * state transfer of the whole model from a donor of another mesh,
 * observes a step (the token counts reach it with the link estimates) and
 * ends in agreement, still at its own batch. */
Test(faults, islands_of_different_batch_sizes_and_meshes_survive_a_kill) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill",
        "--set faults.kill=siteC@30 --set faults.restart_ms=200"
        " --set site.siteB.train.batch_size=4 --set site.siteC.train.batch_size=2"
        " --set outer.layout=whole --set site.siteB.parallel.dp=2"
        " --set site.siteC.parallel.tp=2");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "hash checked") != NULL, "the rejoined island checked its state");
    all_agree(s, 12);
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    static const char *const batch[] = {"\nbatch_size = 8\n", "\nbatch_size = 4\n",
                                        "\nbatch_size = 2\n"};
    static const char *const mesh[] = {"\ndp = 1\ntp = 1\n", "\ndp = 2\ntp = 1\n",
                                       "\ndp = 1\ntp = 2\n"};
    for (int k = 0; k < 3; k++) {
        /* the last checkpoint: the end may be held past train.steps
         * while the killed island restarts */
        char path[160];
        char hc[17];
        const int last = last_outer(s, sites[k], hc);
        snprintf(path, sizeof path, "%s/%s/ckpt_%08d/config.ini", s->dir, sites[k], last * 10);
        void *data;
        size_t len;
        cr_assert_eq(loco_file_read(path, &data, &len), 0, "%s", loco_errmsg());
        char *text = strndup(data, len);
        loco_free(data);
        cr_expect(strstr(text, batch[k]) != NULL, "%s trained at another batch:\n%s", sites[k],
                  text);
        cr_expect(strstr(text, mesh[k]) != NULL, "%s trained on another mesh:\n%s", sites[k],
                  text);
        free(text);
    }
    done(s);
    free(s);
}

/* outer.sync = time: the killed island restarts from inner step 0,
 * fetches θ_global and goes on from its donor's inner step (the islands'
 * inner steps differ); every outer step still commits once. */
Test(faults, killed_island_rejoins_under_time_sync) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill",
        "--set faults.kill=siteC@30 --set faults.restart_ms=200 --set outer.sync=time"
        " --set outer.period_s=0.25");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "hash checked") != NULL, "the rejoined island checked its state");
    all_agree(s, 12);
    done(s);
    free(s);
}

/* The fault scenarios with islands that differ and do not wait for the
 * slowest: siteB at batch 4 beside the others' 8 ([site.siteB]) and on
 * two tensor-parallel ranks (outer.layout = whole), outer steps by the
 * clock (outer.sync = time, inner steps differing between islands): the
 * fault's cycle completes, every outer step commits once and every island
 * ends on one θ_global. */
/* configs/faults-NAME.ini with `mode` and `extra`: the cycle of `fault`
 * completes, every outer step commits once and every island ends on one
 * θ_global. */
static void cycle_completes(const char *name, const char *fault, const char *mode,
                            const char *extra) {
    scenario *s = calloc(1, sizeof *s);
    char args[512];
    snprintf(args, sizeof args, "%s %s", mode, extra);
    run(s, name, args);
    cr_assert_eq(s->rc, 0, "%s", s->out);
    char cycle[96];
    snprintf(cycle, sizeof cycle, "faults: %s", fault);
    cr_expect(strstr(s->out, cycle) && strstr(s->out, "cycle complete"), "%s", s->out);
    all_agree(s, 12);
    done(s);
    free(s);
}

static void differing_islands(const char *name, const char *fault, const char *extra) {
    cycle_completes(name, fault,
                    "--set site.siteB.train.batch_size=4 --set outer.layout=whole "
                    "--set site.siteB.parallel.tp=2 --set outer.sync=time "
                    "--set outer.period_s=0.25",
                    extra);
}

Test(faults, differing_islands_under_time_sync_survive_a_coordinator_restart) {
    differing_islands("coordinator", "kill_coordinator", "");
}

Test(faults, differing_islands_under_time_sync_survive_a_partition) {
    differing_islands("partition", "partition", "");
}

/* siteB (batch 4, two tp ranks) takes about 80 inner steps over the
 * run's 12 outer steps: frozen at its step 20 (outer step 3 or so), it
 * sleeps at least 6 outer steps (thaw_after_steps 60 at H = 10, counted
 * from the run's commit at the freeze: the others' inner steps run
 * ahead), long enough to be suspected, and rejoins before the end. At
 * its step 40 with 30 steps the freeze could come too late to be
 * noticed (2026-12-06, a loaded CI machine). */
Test(faults, differing_islands_under_time_sync_survive_a_freeze) {
    differing_islands("kill", "freeze siteB",
                      "--set faults.kill= --set faults.freeze=siteB@20+60000 "
                      "--set faults.thaw_after_steps=60");
}

/* outer.algorithm = auto choosing reduce-scatter + all-gather (links as
 * configured: 1 ms, 0.1 Gbit/s; three chunks): the killed island rejoins
 * without the figures the others chose from, so the first step with it
 * all-gathers and then every member chooses from the same agreed figures.
 * Before issue 30 it stayed on all-gather while the others ran rsag: 8
 * failed exchanges, settled only by the failing pairs leaving. */
Test(faults, rejoined_island_runs_the_members_exchange_algorithm) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill",
        "--set outer.algorithm=auto --set net.rtt_ms=1 --set net.link_gbps=0.1 "
        "--set compress.chunk_mb=1 --set model.n_embd=160");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "reduce-scatter + all-gather (auto") != NULL, "%s", s->out);
    cr_expect(event_at(s, "join", "siteC", NULL, 0) > 0, "siteC rejoined: %s", s->out);
    cr_expect_lt(event_at(s, "exchange_failed", NULL, NULL, 0), 0,
                 "no exchange failed over the algorithm: %s", s->out);
    all_agree(s, 12);
    char path[128], line[4096] = "", last[4096] = "";
    snprintf(path, sizeof path, "%s/siteC/outer.jsonl", s->dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    while (fgets(line, sizeof line, f))
        memcpy(last, line, sizeof last);
    fclose(f);
    cr_expect(strstr(last, "\"algorithm\":\"rsag\"") != NULL, "siteC ends on rsag: %s", last);
    done(s);
    free(s);
}

Test(faults, frozen_island_is_suspected_by_phi_and_rejoins) {
    scenario *s = calloc(1, sizeof *s);
    /* Timed by the run: siteB sleeps until the others committed inner step
     * 70 (60 s at most), and the run does not end before it rejoined. */
    run(s, "kill",
        "--set faults.kill= --set faults.freeze=siteB@40+60000 --set faults.thaw_after_steps=30");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    double fr = event_at(s, "fault", "siteB", "freeze", 0);
    double sus = event_at(s, "suspect", "siteB", NULL, fr);
    cr_assert(fr > 0 && sus > 0);
    cr_expect_lt(sus - fr, 3.0, "a silent island on a LAN is suspected within 3 s");
    const double thaw = event_at(s, "fault", "siteB", "thaw", fr);
    cr_expect(thaw > sus && event_at(s, "join", "siteB", NULL, thaw) > 0, "%s", s->out);
    cr_expect(strstr(s->out, "faults: freeze siteB at") && strstr(s->out, "cycle complete"), "%s",
              s->out);
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

/* 100 ms one way with 20 ms jitter on every link (200 ms RTT): the
 * detector adapts and still notices a frozen island within
 * faulttol.timeout_ms, without false suspicions before. */
Test(faults, frozen_island_on_a_200ms_rtt_wan_within_the_bound) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill",
        "--set faults.kill= --set faults.freeze=siteB@40+4000 --set net.wan_delay_ms=100"
        " --set net.wan_jitter_ms=20 --set faulttol.heartbeat_ms=100"
        " --set faulttol.phi_pause_ms=1000 --set faulttol.timeout_ms=3000");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    double start = event_at(s, "start", NULL, NULL, 0);
    double fr = event_at(s, "fault", "siteB", "freeze", 0);
    double sus = event_at(s, "suspect", NULL, NULL, start);
    cr_assert(fr > 0 && sus > 0);
    cr_expect_geq(sus, fr, "no island was suspected before the freeze");
    cr_expect_lt(sus - fr, 3.0, "suspected within faulttol.timeout_ms");
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

Test(faults, partition_redoes_the_step_and_the_cut_island_comes_back) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "partition", "--set faulttol.timeout_ms=1500");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    double cut = event_at(s, "fault", "siteA", "partition", 0);
    cr_assert(cut > 0);
    cr_expect(event_at(s, "exchange_failed", NULL, NULL, cut) > 0,
              "the exchange across the cut failed and was redone");
    cr_expect(strstr(s->out, "redone in epoch") != NULL);
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

Test(faults, corrupted_frames_are_refused_never_applied) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "corrupt", "--set faults.corrupt=0.1");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "checksum") || strstr(s->out, "refused"),
              "receivers refused corrupted frames: %s", s->out);
    cr_expect(event_at(s, "exchange_failed", NULL, NULL, 0) > 0);
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

/* An outlier contribution from the island with the lowest id: refused by
 * every island before anything is applied, its sender (not the island
 * with the higher id, as for a broken link) leaves and rejoins. */
Test(faults, poisoned_contribution_is_refused_and_its_island_dropped) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "poison", "");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(event_at(s, "fault", "siteA", "poison", 0) > 0, "%s", s->out);
    double refused = event_at(s, "refused", "siteB", NULL, 0);
    cr_expect(refused > 0, "siteB refused the contribution: %s", s->out);
    cr_expect(strstr(s->out, "contribution of siteA refused") != NULL, "%s", s->out);
    cr_expect(event_at(s, "suspect", "siteA", NULL, 0) > 0, "siteA dropped: %s", s->out);
    cr_expect(event_at(s, "suspect", "siteB", NULL, 0) < 0, "siteB kept: %s", s->out);
    cr_expect(event_at(s, "suspect", "siteC", NULL, 0) < 0, "siteC kept: %s", s->out);
    cr_expect(event_at(s, "join", "siteA", NULL, refused) > 0, "siteA rejoined: %s", s->out);
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

Test(faults, dropped_duplicated_and_reordered_frames_leave_no_trace) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "corrupt",
        "--set faults.corrupt=0 --set faults.drop=0.02 --set faults.duplicate=0.05"
        " --set faults.reorder=0.1 --set faulttol.timeout_ms=1500");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

Test(faults, straggler_is_left_out_and_catches_up) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "straggler",
        "--set faults.slow=siteB*10 --set faulttol.straggler_ms=300 --set train.steps=300");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    double sus = event_at(s, "suspect", "siteB", NULL, 0);
    cr_assert(sus > 0, "siteB was left out");
    cr_expect(event_at(s, "join", "siteB", NULL, sus) > 0, "and came back");
    all_agree(s, 30);
    done(s);
    free(s);
}

Test(faults, restarted_coordinator_loses_nothing) {
    scenario *s = calloc(1, sizeof *s);
    /* Killed once inner step 40 committed (configs/faults-coordinator.ini). */
    run(s, "coordinator", "");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    double k = event_at(s, "fault", "coordinator", "kill_coordinator", 0);
    cr_assert(k > 0);
    /* Killed after the first quorum (the usual case): the new coordinator
     * resumes the run from what the islands report. A slow machine may
     * still be starting at the kill; then the run simply starts later. */
    double q1 = event_at(s, "quorum", NULL, NULL, 0);
    if (q1 > 0 && q1 < k)
        cr_expect(strstr(s->out, "resuming the run at committed outer step") != NULL, "%s",
                  s->out);
    cr_expect(strstr(s->out, "faults: kill_coordinator coordinator at") &&
                  strstr(s->out, "cycle complete"),
              "%s", s->out);
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

/* The coordinator is down for longer than faulttol.timeout_ms (5 s here):
 * the islands keep trying it (capped exponential back-off) within
 * faulttol.coordinator_grace_s and carry on with the restarted one. */
Test(faults, islands_wait_out_a_coordinator_down_longer_than_the_timeout) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "coordinator",
        "--set faults.coordinator_restart_ms=7000 --set faulttol.coordinator_grace_s=60");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "registered again with the coordinator") != NULL, "%s", s->out);
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

/* The run does not end while an injected fault's cycle is open: siteC,
 * killed at step 30, comes back only once the others committed step 180,
 * past train.steps = 120. The coordinator holds the end, outer step by
 * outer step, until siteC rejoined; every island ends at the same step. */
Test(faults, the_run_goes_on_while_a_faults_cycle_is_open) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill", "--set faults.kill=siteC@30 --set faults.restart_after_steps=150");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "it restarts once outer step 18 commits") != NULL, "%s", s->out);
    const double kill = event_at(s, "fault", "siteC", "kill", 0);
    const double join = event_at(s, "join", "siteC", NULL, kill);
    cr_assert(kill > 0 && join > 0, "%s", s->out);
    cr_expect(event_at(s, "extend", NULL, NULL, 0) > 0, "the end was held: %s", s->out);
    cr_expect(strstr(s->out, "faults: kill siteC at") && strstr(s->out, ": cycle complete"), "%s",
              s->out);
    all_agree(s, 19);
    loss_near_baseline(s);
    done(s);
    free(s);
}

/* A restart that can only come after the end (and no hold: max_extra_steps
 * = 0), and a freeze due after the end: neither cycle completes, launch
 * says INCOMPLETE with both reasons and exits non-zero. */
Test(faults, a_cycle_that_cannot_complete_is_incomplete_not_a_pass) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill",
        "--set faults.kill=siteC@30 --set faults.restart_after_steps=0 --set faults.restart_ms=3600000"
        " --set faults.max_extra_steps=0"
        " --set faults.freeze=siteB@500+1000");
    cr_expect_neq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "launch: siteC: the run finished before it could restart") != NULL,
              "%s", s->out);
    cr_expect(strstr(s->out, "faults: kill siteC at") &&
                  strstr(s->out, ": INCOMPLETE: never restarted"),
              "%s", s->out);
    cr_expect(strstr(s->out, "faults: freeze siteB: INCOMPLETE: not injected: due at inner step "
                             "500; the run ended at outer step 12") != NULL,
              "%s", s->out);
    cr_expect(strstr(s->out, "launch: INCOMPLETE: 2 fault cycles did not complete") != NULL, "%s",
              s->out);
    done(s);
    free(s);
}

/* A coordinator started for a run whose timeline says it finished ends at
 * once, saying so, instead of waiting for islands that are gone. */
Test(faults, a_coordinator_restarted_after_the_end_exits) {
    scenario *s = calloc(1, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/loco-faults-XXXXXX");
    cr_assert(mkdtemp(s->dir));
    s->rc = test_run(s->out, sizeof s->out,
                     "echo '{\"t\":1,\"kind\":\"commit\",\"outer_step\":12}' > %s/events.jsonl"
                     " && echo '{\"t\":2,\"kind\":\"end\",\"status\":\"finished\"}' >> "
                     "%s/events.jsonl && " LOCO " coordinator configs/faults-kill.ini --set "
                     "run.dir=%s --set net.tls=false --set faulttol.coordinator=127.0.0.1:0",
                     s->dir, s->dir, s->dir);
    cr_expect_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "says the run already finished (outer step 12); nothing to "
                             "coordinate") != NULL,
              "%s", s->out);
    done(s);
    free(s);
}

Test(faults, degraded_link_slows_but_does_not_break) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "link", "");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(event_at(s, "fault", "siteA", "link", 0) > 0);
    cr_expect_lt(event_at(s, "suspect", NULL, NULL, 0), 0, "no island was suspected");
    all_agree(s, 12);
    loss_near_baseline(s);
    done(s);
    free(s);
}

/* The whole experiment: baseline, fault run, report with a PASS verdict. */
Test(faults, launch_writes_the_report_against_a_baseline) {
    scenario *s = calloc(1, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/loco-faults-XXXXXX");
    cr_assert(mkdtemp(s->dir));
    s->rc = test_run(s->out, sizeof s->out,
                     LOCO " launch configs/faults-kill.ini --set run.dir=%s" SMALL
                          " --set faults.kill=siteC@30 --set faults.restart_ms=200",
                     s->dir);
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "verdict: PASS") != NULL, "%s", s->out);
    char path[160];
    snprintf(path, sizeof path, "%s/report.html", s->dir);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    cr_expect(n > 100);
    snprintf(path, sizeof path, "%s/baseline/events.jsonl", s->dir);
    cr_expect(access(path, F_OK) == 0, "the baseline ran in run.dir/baseline");
    /* A second launch reuses the stored baseline. */
    s->rc = test_run(s->out, sizeof s->out,
                     LOCO " launch configs/faults-kill.ini --set run.dir=%s" SMALL
                          " --set faults.kill=siteC@30 --set faults.restart_ms=200",
                     s->dir);
    cr_expect_eq(s->rc, 0, "%s", s->out);
    cr_expect(strstr(s->out, "reusing the fault-free baseline") != NULL, "%s", s->out);
    done(s);
    free(s);
}

/* Every island stopped and started again from its checkpoint (mid outer
 * interval: step 25 with H = 10), with a new coordinator: the run ends
 * bit-identical to the one that never stopped. */
Test(faults, whole_run_resumes_from_checkpoints_bit_identical) {
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    scenario *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    const char *args = "--set faults.kill= --set train.steps=60 --set run.ckpt_every=25";
    run(a, "kill", args);
    cr_assert_eq(a->rc, 0, "%s", a->out);
    resume_copy(a, b, args);
    cr_expect(strstr(b->out, "outer state of outer step 2 (inner step 25) loaded") != NULL, "%s",
              b->out);
    for (int k = 0; k < 3; k++) {
        char ha[17], hb[17];
        cr_expect_eq(last_outer(a, sites[k], ha), 6);
        cr_expect_eq(last_outer(b, sites[k], hb), 6);
        cr_expect_str_eq(ha, hb, "%s", sites[k]);
    }
    done(a);
    done(b);
    free(a);
    free(b);
}

/* A torn outer state (truncated file) is never used: the island says so
 * and fetches θ_global from the others instead. The run resumes at the
 * step the others hold (3): siteB, holding none, does not take it back to
 * the start, even when siteC registers late (tests/faulttol/
 * test_coord_resume.c). */
Test(faults, torn_outer_state_is_refused_and_fetched_instead) {
    scenario *a = calloc(1, sizeof *a);
    const char *args = "--set faults.kill= --set train.steps=60 --set run.ckpt_every=30";
    run(a, "kill", args);
    cr_assert_eq(a->rc, 0, "%s", a->out);
    /* What the resume starts from (step 60's are removed below): every
     * island's checkpoint of step 30 with its outer state beside it. */
    int rc = test_run(a->out, sizeof a->out,
                      "cd %s && ls -d site?/ckpt_* site?/outer_* | grep -v _00000060 | "
                      "LC_ALL=C sort | tr '\\n' ' '",
                      a->dir);
    cr_assert_eq(rc, 0, "%s", a->out);
    cr_assert_str_eq(a->out,
                     "siteA/ckpt_00000030 siteA/outer_00000030 siteB/ckpt_00000030 "
                     "siteB/outer_00000030 siteC/ckpt_00000030 siteC/outer_00000030 ",
                     "the first run's checkpoints");
    resume_after(a,
                 "rm -rf */ckpt_00000060 */outer_00000060 && "
                 "truncate -s 100 siteB/outer_00000030/rank_00000.safetensors",
                 args);
    cr_expect(strstr(a->out, "no usable outer state for step 30") != NULL, "%s", a->out);
    cr_expect(strstr(a->out, "resuming the run at committed outer step 3") != NULL &&
                  strstr(a->out, "not believed") == NULL,
              "the run resumed at the islands' step 3: %s", a->out);
    cr_expect(strstr(a->out, "hash checked") != NULL, "siteB fetched the state: %s", a->out);
    all_agree(a, 6);
    done(a);
    free(a);
}

/* Islands of two ranks each (mpirun, data parallel with ZeRO-1): every rank
 * exchanges its own shard, the killed island's ranks all come back and each
 * fetches its shard from the same rank of a live island. */
Test(faults, killed_two_rank_island_rejoins_shard_by_shard) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill",
        "--set parallel.dp=2 --set parallel.zero_stage=1 --set train.steps=200"
        " --set faults.kill=siteC@20 --set faults.restart_ms=100");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    double kill = event_at(s, "fault", "siteC", "kill", 0);
    cr_assert(kill > 0);
    cr_expect(event_at(s, "join", "siteC", NULL, kill) > 0, "siteC came back: %s", s->out);
    all_agree(s, 20);
    done(s);
    free(s);
}

/* Streaming DiLoCo (2 fragments, one synced every 5 steps, exchanges
 * overlapping 3 steps, a 300 ms one-way delay on every link so that an
 * exchange outlasts them): siteC is killed at step 47, while the exchange
 * of outer step 9 (fragment 0, begun after step 45) is in flight. The
 * survivors redo that step without it and agree; siteC rejoins by state
 * transfer, fragment schedule included, and ends with the others. */
Test(faults, island_killed_during_an_overlapped_exchange_is_redone_without_and_rejoins) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "kill",
        "--set faults.kill=siteC@47 --set faults.restart_ms=200 --set outer.fragments=2"
        " --set outer.overlap=3 --set net.wan_delay_ms=300 --set train.steps=70");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    double kill = event_at(s, "fault", "siteC", "kill", 0);
    cr_assert(kill > 0, "%s", s->out);
    cr_expect(strstr(s->out, "outer step 9: redone in epoch") != NULL,
              "the survivors redid the step in flight: %s", s->out);
    cr_expect(event_at(s, "join", "siteC", NULL, kill) > 0, "siteC came back: %s", s->out);
    cr_expect(strstr(s->out, "hash checked") != NULL, "the rejoined island checked its state");
    all_agree(s, 70 / 5 + 1); /* 14 fragment syncs, and the other fragment at the end */
    done(s);
    free(s);
}

/* Every island stopped at step 25 and started again from its checkpoint,
 * which was taken with the exchange of outer step 5 (fragment 0) in
 * flight: fragment 0 synced, fragment 1 not, and the merge of fragment 0
 * still due at step 27. The run ends as the one that never stopped. */
Test(faults, streaming_run_resumed_mid_cycle_is_bit_identical) {
    static const char *const sites[] = {"siteA", "siteB", "siteC"};
    scenario *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    const char *args = "--set faults.kill= --set train.steps=60 --set run.ckpt_every=25"
                       " --set outer.fragments=2 --set outer.overlap=2 --set outer.merge_alpha=0.5";
    run(a, "kill", args);
    cr_assert_eq(a->rc, 0, "%s", a->out);
    resume_copy(a, b, args);
    cr_expect(strstr(b->out, "outer state of outer step 5 (inner step 25) loaded") != NULL, "%s",
              b->out);
    for (int k = 0; k < 3; k++) {
        char ha[17], hb[17];
        cr_expect_eq(last_outer(a, sites[k], ha), 13);
        cr_expect_eq(last_outer(b, sites[k], hb), 13);
        cr_expect_str_eq(ha, hb, "%s", sites[k]);
        int same = test_run(b->out, sizeof b->out,
                            "cmp %s/%s/ckpt_00000060/model.safetensors "
                            "%s/%s/ckpt_00000060/model.safetensors",
                            a->dir, sites[k], b->dir, sites[k]);
        cr_expect_eq(same, 0, "%s: the final weights differ: %s", sites[k], b->out);
    }
    done(a);
    done(b);
    free(a);
    free(b);
}

/* A torn newest checkpoint (siteB's model.safetensors cut in half) does
 * not stop a restart: siteB skips it, saying why, resumes from the one
 * before (step 20, outer step 2), is behind the others (outer step 4) and
 * rejoins by state transfer; the run finishes with the islands agreeing. */
Test(faults, torn_newest_checkpoint_falls_back_to_the_previous) {
    scenario *a = calloc(1, sizeof *a);
    const char *args = "--set faults.kill= --set train.steps=60 --set run.ckpt_every=20";
    run(a, "kill", args);
    cr_assert_eq(a->rc, 0, "%s", a->out);
    resume_after(a,
                 "rm -rf */ckpt_00000060 */outer_00000060 && f="
                 "siteB/ckpt_00000040/model.safetensors && truncate -s $(($(stat -c %s $f) / "
                 "2)) $f",
                 args);
    cr_expect(strstr(a->out, "resume: skipping") && strstr(a->out, "siteB/ckpt_00000040") &&
                  strstr(a->out, "model.safetensors is corrupt or truncated"),
              "the torn checkpoint was named: %s", a->out);
    cr_expect(strstr(a->out, "siteB/ckpt_00000020, the newest earlier checkpoint") != NULL,
              "siteB fell back to step 20: %s", a->out);
    all_agree(a, 6);
    done(a);
    free(a);
}

/* ------------------------------------------------------------ quorum mode */

/* outer.quorum = 0.6 of the tokens (two of three equal islands): siteB,
 * four times slower, is left out of the steps it is late for ("late",
 * not a suspicion), fetches the step, and folds its period's work, damped
 * by 1/(1 + steps late), into its next contribution; every island ends on
 * one θ_global. */
Test(faults, quorum_goes_without_the_straggler_and_folds_its_work) {
    scenario *s = calloc(1, sizeof *s);
    run(s, "straggler",
        "--set faulttol.straggler_policy=wait --set outer.quorum=0.6 --set outer.grace_s=30"
        " --set faults.slow=siteB*4 --set train.steps=120");
    cr_assert_eq(s->rc, 0, "%s", s->out);
    cr_expect(event_at(s, "late", "siteB", NULL, 0) > 0, "siteB was left out as late");
    cr_expect(event_at(s, "suspect", "siteB", NULL, 0) < 0, "late is not suspect");
    cr_expect(strstr(s->out, "[siteB]") && strstr(s->out, "folded into θ_local"),
              "siteB's late work was folded: %s", s->out);
    all_agree(s, 12);
    done(s);
    free(s);
}

/* The fault scenarios in quorum mode (outer.quorum = 0.6: an outer step
 * goes once two of the three islands are ready): the fault's cycle
 * completes and every island ends on one θ_global. */
static void quorum_scenario(const char *name, const char *fault, const char *extra) {
    cycle_completes(name, fault, "--set outer.quorum=0.6 --set outer.grace_s=30", extra);
}

Test(faults, quorum_mode_survives_a_kill) {
    quorum_scenario("kill", "kill siteC", "--set faults.kill=siteC@30 --set faults.restart_ms=200");
}
Test(faults, quorum_mode_survives_a_coordinator_restart) {
    quorum_scenario("coordinator", "kill_coordinator", "");
}
Test(faults, quorum_mode_survives_a_partition) {
    quorum_scenario("partition", "partition", "");
}
Test(faults, quorum_mode_survives_a_freeze) {
    quorum_scenario("kill", "freeze siteB",
                    "--set faults.kill= --set faults.freeze=siteB@40+60000 "
                    "--set faults.thaw_after_steps=30");
}
