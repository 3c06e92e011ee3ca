/* The plan of `loco launch` (launch/launch.c): every process's argv written
 * out here in full for plain, TLS + metrics, mpirun and resume runs; the
 * baseline's argv; the run-directory facts; and refused arguments. */
#include "faulttol/faulttol.h"
#include "launch/launch.h"

#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *dir;
static loco_config cfg;
static char *sets[] = {"train.steps=4", "outer.sites=siteA,siteB"};

static void set(const char *kv) {
    cr_assert_eq(loco_config_set(&cfg, kv), 0, "%s", kv);
}

static void setup(void) {
    dir = strdup("/tmp/loco-launch-XXXXXX");
    cr_assert(mkdtemp(dir));
    loco_log_set_level(LOCO_LOG_ERROR);
    loco_config_defaults(&cfg);
    set("outer.sites=siteA,siteB");
    set("net.tls=false");
    snprintf(cfg.run.dir, sizeof cfg.run.dir, "%s", dir);
}

static void teardown(void) {
    cr_assert_eq(loco_rmtree(dir), 0, "%s", loco_errmsg());
    free(dir);
}

TestSuite(launch, .init = setup, .fini = teardown, .timeout = 60);

/* Asserts argv equals want (NULL-terminated), naming the first difference. */
static void expect_argv(char *const *argv, const char *const *want, const char *who) {
    int i = 0;
    for (; want[i]; i++) {
        cr_assert_not_null(argv[i], "%s: argv ends at %d, want %s", who, i, want[i]);
        cr_assert_str_eq(argv[i], want[i], "%s: argv[%d]", who, i);
    }
    cr_assert_null(argv[i], "%s: argv[%d] = %s past the end", who, i, argv[i]);
}

static loco_launch_plan *plan_ok(const loco_launch_args *a) {
    loco_launch_plan *p;
    cr_assert_eq(loco_launch_plan_create(&p, &cfg, a, "127.0.0.1", 5000), 0, "%s", loco_errmsg());
    return p;
}

Test(launch, plain_run) {
    const loco_launch_args a = {.self = "/bin/loco", .config = "c.ini", .sets = sets, .nsets = 2};
    loco_launch_plan *p = plan_ok(&a);
    cr_assert_eq(loco_launch_plan_count(p), 3);
    cr_expect_str_eq(loco_launch_plan_name(p, 0), "coordinator");
    cr_expect_str_eq(loco_launch_plan_name(p, 1), "siteA");
    cr_expect_str_eq(loco_launch_plan_name(p, 2), "siteB");
    cr_expect_null(loco_launch_plan_name(p, 3));
    cr_expect_null(loco_launch_plan_argv(p, -1));
    const char *coord[] = {"/bin/loco",
                           "coordinator",
                           "c.ini",
                           "--set",
                           "train.steps=4",
                           "--set",
                           "outer.sites=siteA,siteB",
                           "--set",
                           "faulttol.coordinator=127.0.0.1:5000",
                           NULL};
    expect_argv(loco_launch_plan_argv(p, 0), coord, "coordinator");
    char rundir[600];
    snprintf(rundir, sizeof rundir, "run.dir=%s/siteB", dir);
    const char *b[] = {"/bin/loco",
                       "island",
                       "c.ini",
                       "--site",
                       "siteB",
                       "--set",
                       "train.steps=4",
                       "--set",
                       "outer.sites=siteA,siteB",
                       "--set",
                       "faulttol.coordinator=127.0.0.1:5000",
                       "--set",
                       rundir,
                       NULL};
    expect_argv(loco_launch_plan_argv(p, 2), b, "siteB");
    const char *base[] = {"/bin/loco",
                          "launch",
                          "c.ini",
                          "--set",
                          "train.steps=4",
                          "--set",
                          "outer.sites=siteA,siteB",
                          "--set",
                          "faults.kill=",
                          "--set",
                          "faults.freeze=",
                          "--set",
                          "faults.partition=",
                          "--set",
                          "faults.link=",
                          "--set",
                          "faults.corrupt=0",
                          "--set",
                          "faults.drop=0",
                          "--set",
                          "faults.duplicate=0",
                          "--set",
                          "faults.reorder=0",
                          "--set",
                          "faults.slow=",
                          "--set",
                          "faults.poison=",
                          "--set",
                          "faults.coordinator_kill_s=0",
                          "--set",
                          "faults.coordinator_kill_step=0",
                          "--set",
                          "run.dir=/tmp/b",
                          "--no-baseline",
                          NULL};
    expect_argv(loco_launch_plan_baseline(p, "/tmp/b"), base, "baseline");
    loco_launch_plan_destroy(p);
    loco_launch_plan_destroy(NULL);
}

Test(launch, tls_certificates_and_island_metrics) {
    set("net.tls=true");
    set("run.metrics_addr=0.0.0.0:9100");
    const loco_launch_args a = {.self = "loco", .config = "c.ini"};
    loco_launch_plan *p = plan_ok(&a);
    char cert[600], key[600], ca[600], rundir[600];
    snprintf(cert, sizeof cert, "net.cert=%s/certs/siteA.pem", dir);
    snprintf(key, sizeof key, "net.key=%s/certs/siteA.key", dir);
    snprintf(ca, sizeof ca, "net.ca=%s/certs/ca.pem", dir);
    snprintf(rundir, sizeof rundir, "run.dir=%s/siteA", dir);
    const char *want[] = {"loco",
                          "island",
                          "c.ini",
                          "--site",
                          "siteA",
                          "--set",
                          "faulttol.coordinator=127.0.0.1:5000",
                          "--set",
                          cert,
                          "--set",
                          key,
                          "--set",
                          ca,
                          "--set",
                          rundir,
                          "--set",
                          "run.metrics_addr=0.0.0.0:0",
                          NULL};
    expect_argv(loco_launch_plan_argv(p, 1), want, "siteA");
    snprintf(cert, sizeof cert, "net.cert=%s/certs/coordinator.pem", dir);
    cr_expect_str_eq(loco_launch_plan_argv(p, 0)[6], cert);
    loco_launch_plan_destroy(p);
    /* A configured certificate: the plan adds none. */
    set("net.cert=/etc/mine.pem");
    p = plan_ok(&a);
    cr_expect_str_eq(loco_launch_plan_argv(p, 1)[8], rundir);
    loco_launch_plan_destroy(p);
}

Test(launch, multi_rank_islands_under_mpirun_with_own_session_dirs) {
    set("parallel.dp=2");
    set("parallel.tp=2");
    const loco_launch_args a = {.self = "loco", .config = "c.ini"};
    loco_launch_plan *p = plan_ok(&a);
    char *const *c = loco_launch_plan_argv(p, 0);
    cr_expect_str_eq(c[0], "loco", "the coordinator is one process");
    char sess[2][256];
    for (int i = 1; i <= 2; i++) {
        char *const *v = loco_launch_plan_argv(p, i);
        const char *want[] = {"mpirun", "--allow-run-as-root", "--oversubscribe", "--mca",
                              "orte_tmpdir_base"};
        for (int j = 0; j < 5; j++)
            cr_expect_str_eq(v[j], want[j], "island %d argv[%d]", i, j);
        cr_expect_str_eq(v[6], "-np");
        cr_expect_str_eq(v[7], "4");
        cr_expect_str_eq(v[8], "loco");
        cr_expect_str_eq(v[9], "island");
        struct stat st;
        cr_expect(stat(v[5], &st) == 0 && S_ISDIR(st.st_mode), "session dir %s", v[5]);
        snprintf(sess[i - 1], sizeof sess[0], "%s", v[5]);
    }
    cr_expect_str_neq(sess[0], sess[1]);
    loco_launch_plan_destroy(p);
    struct stat st;
    cr_expect_neq(stat(sess[0], &st), 0, "destroy removes %s", sess[0]);
    cr_expect_neq(stat(sess[1], &st), 0, "destroy removes %s", sess[1]);
}

static void mkdir_in(const char *sub) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    cr_assert_eq(loco_mkdirs(path), 0, "%s", loco_errmsg());
}

static int count_resume(char *const *v, const char **arg) {
    int n = 0;
    for (int i = 0; v[i]; i++)
        if (!strcmp(v[i], "--resume")) {
            n++;
            *arg = v[i + 1];
        }
    return n;
}

Test(launch, resume_only_islands_with_a_checkpoint) {
    mkdir_in("siteA/ckpt_00000006");
    mkdir_in("siteB/ckpt_00000006.tmp");
    const loco_launch_args a = {.self = "loco", .config = "c.ini", .resume_all = true};
    loco_launch_plan *p = plan_ok(&a);
    const char *arg = NULL;
    char want[600];
    snprintf(want, sizeof want, "%s/siteA", dir);
    cr_expect_eq(count_resume(loco_launch_plan_argv(p, 1), &arg), 1);
    cr_expect_str_eq(arg, want);
    cr_expect_eq(count_resume(loco_launch_plan_argv(p, 2), &arg), 0, "a .tmp is no checkpoint");
    /* siteB restarted after it wrote one: resumes; once. */
    mkdir_in("siteB/ckpt_00000008");
    cr_assert_eq(loco_launch_plan_add_resume(p, 2), 0);
    cr_assert_eq(loco_launch_plan_add_resume(p, 2), 0);
    cr_expect_eq(count_resume(loco_launch_plan_argv(p, 2), &arg), 1);
    snprintf(want, sizeof want, "%s/siteB", dir);
    cr_expect_str_eq(arg, want);
    cr_expect_eq(count_resume(loco_launch_plan_argv(p, 1), &arg), 1);
    cr_expect_eq(loco_launch_plan_add_resume(p, 0), LOCO_EINVAL, "the coordinator never resumes");
    cr_expect_eq(loco_launch_plan_add_resume(p, 3), LOCO_EINVAL);
    loco_launch_plan_destroy(p);
}

Test(launch, refused_arguments) {
    loco_launch_plan *p = (loco_launch_plan *)1;
    const loco_launch_args a = {.self = "loco", .config = "c.ini"};
    cr_expect_eq(loco_launch_plan_create(&p, &cfg, &a, "127.0.0.1", 0), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "port 0, expected 1..65535"), "%s", loco_errmsg());
    cr_expect_null(p);
    const loco_launch_args many = {.self = "loco", .config = "c.ini", .sets = sets, .nsets = 300};
    cr_expect_eq(loco_launch_plan_create(&p, &cfg, &many, "127.0.0.1", 1), LOCO_EINVAL);
    set("outer.sites=");
    cr_expect_lt(loco_launch_plan_create(&p, &cfg, &a, "127.0.0.1", 1), 0,
                 "no sites: nothing to launch");
}

/* Every shipped fault scenario is one the launcher knows is faulty, so
 * each gets its fault-free baseline and its report (issue 27 found
 * faults-poison.ini without either: its key was missing from the list). */
Test(launch, every_shipped_scenario_is_a_fault_run) {
    glob_t g;
    cr_assert_eq(glob("configs/faults-*.ini", 0, NULL, &g), 0, "no configs/faults-*.ini");
    cr_assert_geq(g.gl_pathc, 7, "%zu scenarios", g.gl_pathc);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        loco_config c;
        loco_config_defaults(&c);
        cr_assert_eq(loco_config_load(&c, g.gl_pathv[i]), 0, "%s: %s", g.gl_pathv[i],
                     loco_errmsg());
        cr_expect(loco_faults_active(&c), "%s: no fault the launcher knows of", g.gl_pathv[i]);
    }
    globfree(&g);
}

Test(launch, run_directory_facts) {
    cr_expect(!loco_faults_active(&cfg));
    set("faults.drop=0.1");
    cr_expect(loco_faults_active(&cfg));
    set("faults.drop=0");
    set("faults.kill=siteA@3");
    cr_expect(loco_faults_active(&cfg));

    cr_expect(!loco_launch_has_ckpt(dir));
    mkdir_in("ckpt_x");
    cr_expect(!loco_launch_has_ckpt(dir));
    mkdir_in("ckpt_12");
    cr_expect(loco_launch_has_ckpt(dir));
    cr_expect(!loco_launch_has_ckpt("/nonexistent"));

    char ev[700];
    snprintf(ev, sizeof ev, "%s/events.jsonl", dir);
    cr_expect(!loco_launch_run_finished(dir));
    const char *failed = "{\"kind\":\"start\"}\n{\"kind\":\"end\",\"status\":\"failed\"}\n";
    cr_assert_eq(loco_file_write_sync(ev, failed, strlen(failed)), 0);
    cr_expect(!loco_launch_run_finished(dir));
    const char *ok = "{\"kind\":\"start\"}\n{\"t\":1,\"kind\":\"end\",\"status\":\"finished\"}\n";
    cr_assert_eq(loco_file_write_sync(ev, ok, strlen(ok)), 0);
    cr_expect(loco_launch_run_finished(dir));

    int port = 0;
    cr_assert_eq(loco_launch_free_port(&port), 0);
    cr_expect(port > 0 && port < 65536, "port %d", port);
}

/* A stand-in for the loco binary: `SELF coordinator|island CONFIG [--site
 * S] ...` runs the shell function of that name in script. */
static const char *fake_self(const char *script) {
    static char path[700];
    snprintf(path, sizeof path, "%s/fake.sh", dir);
    char text[4096];
    snprintf(text, sizeof text,
             "#!/bin/sh\n%s\ncmd=$1; shift 2; [ \"$1\" = --site ] && site=$2\n$cmd\n", script);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    cr_assert_eq(chmod(path, 0755), 0);
    return path;
}

/* Supervises the plan of self with output into a file; returns it. */
static char *supervise(const char *self, volatile sig_atomic_t *stop, int want_rc, bool *ok) {
    const loco_launch_args a = {.self = self, .config = "c.ini"};
    loco_launch_plan *p = plan_ok(&a);
    char outp[700], ev[700];
    snprintf(outp, sizeof outp, "%s/out.txt", dir);
    snprintf(ev, sizeof ev, "%s/events.jsonl", dir);
    FILE *out = fopen(outp, "w");
    cr_assert(out);
    int rc = loco_launch_supervise(p, &cfg, ev, out, stop, ok);
    fclose(out);
    loco_launch_plan_destroy(p);
    cr_assert_eq(rc, want_rc, "rc %d: %s", rc, loco_errmsg());
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(outp, &text, &len), 0);
    return text;
}

static void expect_has(const char *text, const char *needle) {
    cr_expect(strstr(text, needle) != NULL, "no '%s' in:\n%s", needle, text);
}

static void expect_event(const char *needle) {
    char ev[700];
    snprintf(ev, sizeof ev, "%s/events.jsonl", dir);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(ev, &text, &len), 0);
    expect_has(text, needle);
    loco_free(text);
}

Test(launch, supervise_merges_named_lines) {
    const char *self = fake_self("coordinator() { echo up; printf partial; }\n"
                                 "island() { echo \"$site out\"; echo \"$site err\" >&2; }");
    bool ok = false;
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(ok);
    expect_has(out, "[coordinator] up\n");
    expect_has(out, "[coordinator] partial\n");
    expect_has(out, "[siteA] siteA out\n");
    expect_has(out, "[siteA] siteA err\n");
    expect_has(out, "[siteB] siteB out\n");
    expect_has(out, "launch: done: every process finished cleanly\n");
    expect_event("\"kind\":\"launch_end\",\"status\":\"finished\"");
    loco_free(out);
}

Test(launch, supervise_stops_everything_when_one_fails) {
    const char *self = fake_self("coordinator() { exec sleep 30; }\n"
                                 "island() { [ $site = siteB ] && exit 3; exec sleep 30; }");
    bool ok = true;
    const double t0 = loco_now();
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(!ok);
    cr_expect_lt(loco_now() - t0, 10, "the sleepers were not stopped");
    expect_has(out, "launch: siteB exited with status 3\n");
    expect_has(out, "launch: stopping every process\n");
    expect_has(out, "launch: FAILED\n");
    expect_event("\"kind\":\"launch_end\",\"status\":\"failed\"");
    loco_free(out);
}

Test(launch, supervise_honours_a_stop_request) {
    const char *self = fake_self("coordinator() { exec sleep 30; }\nisland() { exec sleep 30; }");
    volatile sig_atomic_t stop = 1;
    bool ok = true;
    const double t0 = loco_now();
    char *out = supervise(self, &stop, 0, &ok);
    cr_expect(!ok);
    cr_expect_lt(loco_now() - t0, 10);
    expect_has(out, "launch: stopping every process\n");
    loco_free(out);
}

Test(launch, supervise_restarts_a_killed_island) {
    set("faults.kill=siteA@1");
    set("faults.restart_ms=0");
    const char *self =
        fake_self("coordinator() { sleep 2; }\n"
                  "island() { [ $site = siteA ] && [ -z \"$LOCO_RESTARTED\" ] && kill -9 $$; "
                  "echo \"$site ${LOCO_RESTARTED:-first}\"; }");
    bool ok = false;
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(ok, "an injected kill is expected:\n%s", out);
    expect_has(out, "launch: faults: siteA was killed; it restarts shortly\n");
    expect_has(out, "launch: faults: restarting siteA\n");
    expect_has(out, "[siteA] siteA 1\n");
    expect_has(out, "[siteB] siteB first\n");
    cr_expect(strstr(out, "[siteA] siteA first") == NULL, "%s", out);
    expect_event("\"fault\":\"restart\",\"site\":\"siteA\"");
    loco_free(out);
}

Test(launch, supervise_reports_a_process_that_cannot_start) {
    /* self is no program: every exec fails (exit 127). */
    char self[700];
    snprintf(self, sizeof self, "%s/no-such-loco", dir);
    bool ok = true;
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(!ok);
    expect_has(out, "exec ");
    expect_has(out, "exited with status 127");
    loco_free(out);
}

/* Every island ended but the coordinator hangs on (restarted for a run
 * that was over, say): launch stops it after a short grace and ends. */
Test(launch, supervise_ends_once_every_island_ended_whatever_the_coordinator) {
    /* the sleep is the hung coordinator's whole life, not a wait for an event */
    const char *self = fake_self("coordinator() { exec sleep 60; }\nisland() { echo done; }");
    bool ok = false;
    const double t0 = loco_now();
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(ok, "%s", out);
    cr_expect_lt(loco_now() - t0, 15, "launch waited on the coordinator");
    expect_has(out, "launch: every island has ended; stopping the coordinator\n");
    expect_has(out, "launch: done: every process finished cleanly\n");
    loco_free(out);
}

/* The coordinator's kill falls due after the run's end event: it is not
 * injected (the hang of issue 33: a coordinator killed and restarted for a
 * run that was over, waited for by launch forever). */
Test(launch, supervise_injects_no_coordinator_kill_after_the_end) {
    /* the sleeps only keep the fakes alive past the kill's due time (0.6 s):
     * the end event is written before it, so no timing makes this wrong */
    set("faults.coordinator_kill_s=0.6");
    set("faults.coordinator_restart_ms=0");
    char script[2048];
    snprintf(script, sizeof script,
             "coordinator() { echo '{\"t\":1,\"kind\":\"end\",\"status\":\"finished\"}' >> "
             "%s/events.jsonl; exec sleep 2; }\nisland() { exec sleep 1.5; }",
             dir);
    const char *self = fake_self(script);
    bool ok = false;
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(ok, "%s", out);
    expect_has(out, "launch: faults: the coordinator's kill fell due after the run ended; not "
                    "injected\n");
    cr_expect(strstr(out, "killing the coordinator") == NULL, "%s", out);
    loco_free(out);
}

/* A coordinator killed while the islands run comes back only while one
 * of them still does. */
Test(launch, supervise_restarts_no_coordinator_once_the_islands_ended) {
    set("faults.coordinator_kill_s=0.3");
    set("faults.coordinator_restart_ms=60000");
    /* the islands live 3 s, ten times the kill's due time, so the kill lands
     * while they run even on a loaded machine; the coordinator's sleep is
     * only its life */
    const char *self = fake_self("coordinator() { exec sleep 30; }\nisland() { exec sleep 3; }");
    bool ok = false;
    const double t0 = loco_now();
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(ok, "%s", out);
    cr_expect_lt(loco_now() - t0, 15);
    expect_has(out, "launch: faults: killing the coordinator (SIGKILL)\n");
    expect_has(out, "launch: coordinator: every island has ended; not restarted\n");
    loco_free(out);
}

/* faults.restart_after_steps: the killed island comes back once the run
 * committed the outer step 20 steps past its kill (H = 10: step 21 is
 * outer step 3), not before, whatever the time. */
Test(launch, supervise_restarts_a_killed_island_by_the_runs_progress) {
    /* the sleeps pace the fake coordinator's commits; the test checks the
     * order on the timeline (restart after commit 3), which no pace changes */
    set("faults.kill=siteA@1");
    set("faults.restart_after_steps=20");
    set("outer.H=10");
    char script[2048];
    snprintf(script, sizeof script,
             "coordinator() { for i in 1 2 3; do sleep 0.4; echo \"commit $i\"; "
             "echo \"{\\\"t\\\":$i,\\\"kind\\\":\\\"commit\\\",\\\"outer_step\\\":$i}\" >> "
             "%s/events.jsonl; done; sleep 1.5; }\n"
             "island() { [ $site = siteA ] && [ -z \"$LOCO_RESTARTED\" ] && kill -9 $$; "
             "echo \"$site ${LOCO_RESTARTED:-first}\"; if [ $site = siteB ]; then sleep 2.5; fi; }",
             dir);
    const char *self = fake_self(script);
    bool ok = false;
    char *out = supervise(self, NULL, 0, &ok);
    cr_expect(ok, "%s", out);
    expect_has(out, "launch: faults: siteA was killed; it restarts once outer step 3 commits\n");
    char ev[700];
    snprintf(ev, sizeof ev, "%s/events.jsonl", dir);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(ev, &text, &len), 0);
    const char *c3 = strstr(text, "\"outer_step\":3"), *r = strstr(text, "\"fault\":\"restart\"");
    cr_expect(c3 && r && c3 < r, "restarted after the commit of outer step 3:\n%s", (char *)text);
    loco_free(text);
    expect_has(out, "[siteA] siteA 1\n");
    loco_free(out);
}
