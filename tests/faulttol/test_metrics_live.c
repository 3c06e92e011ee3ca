/* Live metrics of a real multi-site run: `loco launch` starts a
 * coordinator and two islands on a tiny model with faulttol.metrics_addr
 * and run.metrics_addr on port 0; while it trains, the coordinator's and
 * an island's endpoints are scraped with the curl command line (their
 * addresses from run.dir/metrics_addr and run.dir/SITE/metrics_addr). The
 * exposition must parse line by line, and the values must be the run's:
 * two members, an epoch, an outer step that advances between two scrapes,
 * training steps and a finite loss. Garbage and a bad path sent to both
 * ports meanwhile do not stop the run, which ends cleanly and takes its
 * endpoints (and address files) with it. */
#include "cli/cli.h"
#include "tests/prom_check.h"
#include "tests/support.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
/* 2 islands, 80 steps, an outer step every 5: about 16 commits spread over
 * the run; a WAN delay keeps each exchange in the tens of ms. */
#define ARGS                                                                                       \
    " --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32"     \
    " --set train.batch_size=4 --set train.steps=80 --set train.warmup_steps=5"                    \
    " --set run.threads=1 --set run.eval_every=40 --set run.eval_batches=2"                        \
    " --set run.log_every=1000 --set outer.H=5 --set compress.zstd=off"                            \
    " --set net.wan_delay_ms=20 --set net.wan_gbps=0 --set outer.algorithm=allgather"              \
    " --set faulttol.phi_pause_ms=5000"                                                            \
    " --set faulttol.metrics_addr=127.0.0.1:0 --set run.metrics_addr=127.0.0.1:0"

static pid_t launch_pid;

/* Reads "HOST:PORT" from path once it exists (the process writes it when
 * it serves); 0 when it did not appear within timeout_s or the launch
 * ended. */
static int wait_port(const char *path, double timeout_s, char *addr, size_t cap) {
    const double t0 = loco_now();
    while (loco_now() - t0 < timeout_s) {
        FILE *f = fopen(path, "r");
        if (f) {
            char line[128] = "";
            const bool ok = fgets(line, sizeof line, f) != NULL;
            fclose(f);
            char *colon = strrchr(line, ':');
            if (ok && colon) {
                line[strcspn(line, "\n")] = '\0';
                snprintf(addr, cap, "%s", line);
                return atoi(colon + 1);
            }
        }
        if (waitpid(launch_pid, NULL, WNOHANG) == launch_pid) {
            launch_pid = 0;
            return 0;
        }
        loco_sleep_ms(100);
    }
    return 0;
}

/* One scrape with curl: the body into out, checked against the format. */
static void scrape(const char *addr, char *out, size_t cap) {
    const int rc = test_run(out, cap, "curl -sS --fail --max-time 5 http://%s/metrics", addr);
    cr_assert_eq(rc, 0, "curl http://%s/metrics: %s", addr, out);
    char why[1200];
    const int n = prom_check_text(out, why, sizeof why);
    cr_assert_gt(n, 0, "%s: %s\n%s", addr, why, out);
}

static double value(const char *text, const char *series) {
    double v = NAN;
    cr_assert(prom_value(text, series, &v), "no %s in\n%s", series, text);
    return v;
}

/* Garbage to a port, and a path that is not /metrics (404 with curl). */
static void abuse(int port, const char *addr) {
    unsigned char junk[2048];
    loco_rng rng;
    loco_rng_seed(&rng, (uint64_t)port);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)loco_rng_u64(&rng);
    char out[4096];
    for (int k = 0; k < 3; k++)
        prom_raw(port, junk, sizeof junk, out, sizeof out, 2000);
    static const char half[] = "GET /metrics HTTP/1.1\r\nHost";
    prom_raw(port, half, sizeof half - 1, out, sizeof out, 200); /* hangs up mid-request */
    cr_expect_eq(test_run(out, sizeof out,
                          "curl -s -o /dev/null -w '%%{http_code}' "
                          "--max-time 5 http://%s/nothing-here",
                          addr),
                 0);
    cr_expect_str_eq(out, "404", "GET /nothing-here on %s", addr);
}

static void stop_launch(void) {
    if (launch_pid > 0) {
        kill(launch_pid, SIGTERM);
        waitpid(launch_pid, NULL, 0);
        launch_pid = 0;
    }
}

TestSuite(metrics_live, .timeout = 120, .fini = stop_launch);

Test(metrics_live, coordinator_and_island_scraped_during_a_run) {
    char *dir = test_tmpdir("loco-metrics-live");
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "exec " LOCO " launch configs/multisite-2.ini" ARGS
             " --set run.dir=%s > %s/launch.log "
             "2>&1",
             dir, dir);
    launch_pid = fork();
    cr_assert_geq(launch_pid, 0);
    if (launch_pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    char cpath[600], ipath[600], caddr[128], iaddr[128];
    snprintf(cpath, sizeof cpath, "%s/metrics_addr", dir);
    snprintf(ipath, sizeof ipath, "%s/siteA/metrics_addr", dir);
    const int cport = wait_port(cpath, 30, caddr, sizeof caddr);
    cr_assert_gt(cport, 0, "no %s (see %s/launch.log)", cpath, dir);
    const int iport = wait_port(ipath, 30, iaddr, sizeof iaddr);
    cr_assert_gt(iport, 0, "no %s (see %s/launch.log)", ipath, dir);
    cr_expect_neq(cport, iport);

    static char c1[1 << 16], c2[1 << 16], isl[1 << 16];
    /* First scrape once the run committed an outer step. */
    double s1 = 0;
    for (const double t0 = loco_now(); loco_now() - t0 < 30;) {
        scrape(caddr, c1, sizeof c1);
        if (prom_value(c1, "loco_coord_outer_step", &s1) && s1 >= 1)
            break;
        loco_sleep_ms(100);
    }
    cr_assert_geq(s1, 1, "no outer step committed within 30 s:\n%s", c1);
    cr_expect_eq(value(c1, "loco_coord_islands"), 2);
    cr_expect_eq(value(c1, "loco_coord_members"), 2);
    cr_expect_eq(value(c1, "loco_coord_member{site=\"siteA\"}"), 1);
    cr_expect_eq(value(c1, "loco_coord_member{site=\"siteB\"}"), 1);
    cr_expect_geq(value(c1, "loco_coord_epoch"), 1);
    cr_expect_eq(value(c1, "loco_coord_started"), 1);
    cr_expect_gt(value(c1, "loco_coord_bytes_received_total"), 0);
    cr_expect_gt(value(c1, "loco_coord_bytes_sent_total"), 0);
    value(c1, "loco_coord_suspicions_total"); /* present; a loaded machine may suspect */
    cr_expect_eq(value(c1, "loco_coord_registrations_total"), 2);
    const char *h = strstr(c1, "loco_coord_last_hash_info{hash=\"");
    cr_expect(h && strspn(h + 32, "0123456789abcdef") == 16 && !strncmp(h + 48, "\"} 1\n", 5), "%s",
              c1);

    /* Abuse both ports; the run goes on. */
    abuse(cport, caddr);
    abuse(iport, iaddr);

    /* Second scrape: the outer step moved on. */
    double s2 = s1;
    for (const double t0 = loco_now(); loco_now() - t0 < 30 && s2 <= s1;) {
        loco_sleep_ms(100);
        scrape(caddr, c2, sizeof c2);
        s2 = value(c2, "loco_coord_outer_step");
    }
    cr_expect_gt(s2, s1, "outer step %g then %g", s1, s2);
    cr_expect_geq(value(c2, "loco_coord_bytes_received_total"),
                  value(c1, "loco_coord_bytes_received_total"));

    scrape(iaddr, isl, sizeof isl);
    const double step = value(isl, "loco_train_step");
    const double loss = value(isl, "loco_train_loss");
    cr_expect_gt(step, 0);
    cr_expect_leq(step, 80);
    cr_expect(isfinite(loss) && loss > 0 && loss < 10, "loss %g", loss);
    cr_expect_eq(value(isl, "loco_train_steps_target"), 80);
    /* Set one after the other: a scrape may fall between step and tokens. */
    const double tokens = value(isl, "loco_train_tokens_total");
    cr_expect(fmod(tokens, 4 * 32) == 0 && fabs(tokens / (4 * 32) - step) <= 1,
              "%g tokens at step %g of 4 x 32", tokens, step);
    cr_expect_gt(value(isl, "loco_train_lr"), 0);
    cr_expect(isfinite(value(isl, "loco_train_grad_norm")));
    cr_expect_gt(value(isl, "loco_train_tokens_per_second"), 0);
    cr_expect_eq(value(isl, "loco_island_info{site=\"siteA\"}"), 1);
    const double ios = value(isl, "loco_island_outer_step");
    cr_expect_geq(ios, 1);
    const double ois = value(isl, "loco_island_outer_inner_step");
    cr_expect(ois >= 5 && fmod(ois, 5) == 0, "outer step at inner step %g, H = 5", ois);
    cr_expect_eq(value(isl, "loco_island_members"), 2);
    cr_expect_geq(value(isl, "loco_island_epoch"), 1);
    cr_expect_gt(value(isl, "loco_island_bytes_sent_total"), 0);
    cr_expect_gt(value(isl, "loco_island_bytes_received_total"), 0);
    cr_expect(isfinite(value(isl, "loco_island_delta_ratio")));

    /* The run ends cleanly despite the abuse, and its endpoints go. */
    int st = 0;
    for (const double t0 = loco_now(); loco_now() - t0 < 60;) {
        pid_t w = waitpid(launch_pid, &st, WNOHANG);
        if (w == launch_pid || (w < 0 && errno != EINTR)) {
            launch_pid = 0;
            break;
        }
        loco_sleep_ms(100);
    }
    cr_assert_eq(launch_pid, 0, "the run did not end within 60 s");
    char log[600];
    snprintf(log, sizeof log, "cat %s/launch.log", dir);
    static char out[1 << 16];
    test_run(out, sizeof out, "%s", log);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "launch failed:\n%s", out);
    cr_expect(strstr(out, "metrics: serving http://127.0.0.1:"), "%s", out);
    struct stat sb;
    cr_expect_neq(stat(cpath, &sb), 0, "%s outlives the coordinator", cpath);
    cr_expect_neq(stat(ipath, &sb), 0, "%s outlives the island", ipath);
    cr_expect_eq(prom_raw(cport, "", 0, out, sizeof out, 100), -1);
    loco_rmtree(dir);
    free(dir);
}

/* A port already taken is an error at start, naming the key. */
Test(metrics_live, coordinator_refuses_a_taken_port) {
    loco_log_set_level(LOCO_LOG_ERROR);
    loco_prom *p;
    cli_metrics *srv;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_assert_eq(cli_metrics_serve(&srv, p, "127.0.0.1:0", "x", NULL), 0);
    char *dir = test_tmpdir("loco-metrics-taken");
    static char out[1 << 16];
    const int rc = test_run(out, sizeof out,
                            "timeout 20 " LOCO " coordinator configs/multisite-2.ini --set "
                            "net.tls=false --set faulttol.coordinator=127.0.0.1:0 --set "
                            "run.dir=%s --set faulttol.metrics_addr=127.0.0.1:%d",
                            dir, cli_metrics_port(srv));
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect_neq(rc, 124, "the coordinator kept running: %s", out);
    cr_expect(strstr(out, "faulttol.metrics_addr") && strstr(out, "in use"), "%s", out);
    cli_metrics_stop(srv);
    loco_prom_destroy(p);
    loco_rmtree(dir);
    free(dir);
}
