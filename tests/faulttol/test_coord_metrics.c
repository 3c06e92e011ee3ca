/* The coordinator's live metrics against what fake islands (sessions in
 * this process, plain TCP on loopback) made happen: siteB registers and
 * vanishes, siteA commits three outer steps alone with θ hashes it chose;
 * a scrape after the third commit must show exactly that. */
#include "cli/cli.h"
#include "faulttol/faulttol.h"
#include "tests/prom_check.h"

#include <pthread.h>

static loco_config cfg;
static loco_net_params np;
static loco_coord *coord;
static int serve_rc;

static void *serve(void *arg) {
    serve_rc = loco_coord_serve(coord);
    return NULL;
}

typedef struct {
    const char *site;
    bool vanish;        /* register, then drop the link without BYE */
    int rc, commits;    /* siteA: outcome and commits seen */
    char text[1 << 15]; /* siteA: the scrape after its last commit */
    int code;
} fake;

static int metrics_port(void) {
    char path[LOCO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/metrics_addr", cfg.run.dir);
    FILE *f = fopen(path, "r");
    int port = 0;
    if (f) {
        if (fscanf(f, "127.0.0.1:%d", &port) != 1)
            port = 0;
        fclose(f);
    }
    return port;
}

static void *island(void *arg) {
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
    int id;
    f->rc = loco_session_join(&s, &cfg, &p, &me, NULL, &id, &q, 10000);
    for (int step = 1; step <= 3 && f->rc == 0 && !f->vanish; step++) {
        loco_verdict v = 0;
        f->rc = loco_session_ready(s, step, step - 1, &q, &v, 10000);
        if (f->rc == 0 && v == LOCO_VERDICT_GO)
            f->rc = loco_session_done(s, step, q.epoch, true, 0x100u + (unsigned)step, 0, &q, &v,
                                      10000);
        if (f->rc == 0 && v == LOCO_VERDICT_COMMIT)
            f->commits++;
    }
    if (!f->vanish && f->rc == 0) {
        /* The coordinator refreshes its metrics every 50 ms. */
        const int port = metrics_port();
        double os = 0;
        for (int tries = 0; tries < 100 && os != 3; tries++) {
            const char *body = "";
            static char out[1 << 15];
            f->code = prom_get(port, "/metrics", out, sizeof out, &body);
            snprintf(f->text, sizeof f->text, "%s", body);
            if (!prom_value(f->text, "loco_coord_outer_step", &os) || os != 3)
                loco_sleep_ms(50);
        }
        f->rc = loco_session_leave(s, 10000);
    }
    loco_session_destroy(s);
    loco_quorum_fini(&q);
    return NULL;
}

Test(coord_metrics, a_scrape_shows_what_the_islands_did, .timeout = 30) {
    char dir[] = "/tmp/loco-coord-metrics-XXXXXX";
    cr_assert(mkdtemp(dir));
    loco_config_defaults(&cfg);
    snprintf(cfg.outer.sites, sizeof cfg.outer.sites, "siteA,siteB");
    snprintf(cfg.run.dir, sizeof cfg.run.dir, "%s", dir);
    snprintf(cfg.faulttol.metrics_addr, sizeof cfg.faulttol.metrics_addr, "127.0.0.1:0");
    cfg.faulttol.timeout_ms = 20000;
    loco_net_params_default(&np);
    np.backend = LOCO_NET_PLAIN;
    np.streams = 1;
    snprintf(np.name, sizeof np.name, "coordinator");
    loco_log_set_level(LOCO_LOG_ERROR);
    cr_assert_eq(loco_coord_create(&coord, &cfg, &np, "127.0.0.1", 0, NULL), 0, "%s",
                 loco_errmsg());
    cli_metrics *srv; /* as `loco coordinator` serves it */
    cr_assert_eq(cli_metrics_serve_run(&srv, loco_coord_prom(coord), cfg.faulttol.metrics_addr,
                                       "faulttol.metrics_addr", cfg.run.dir),
                 0, "%s", loco_errmsg());
    cr_assert_gt(metrics_port(), 0, "no %s/metrics_addr", dir);
    snprintf(cfg.faulttol.coordinator, sizeof cfg.faulttol.coordinator, "127.0.0.1:%d",
             loco_coord_port(coord));
    pthread_t ts, ta, tb;
    cr_assert_eq(pthread_create(&ts, NULL, serve, NULL), 0);
    static fake a = {.site = "siteA"}, b = {.site = "siteB", .vanish = true};
    cr_assert_eq(pthread_create(&tb, NULL, island, &b), 0);
    cr_assert_eq(pthread_create(&ta, NULL, island, &a), 0);
    pthread_join(tb, NULL);
    pthread_join(ta, NULL);
    pthread_join(ts, NULL);
    cli_metrics_stop(srv);
    loco_coord_destroy(coord);
    cr_assert_eq(serve_rc, 0, "%s", loco_errmsg());
    cr_assert_eq(a.rc, 0, "siteA: %s", loco_errmsg());
    cr_assert_eq(a.commits, 3);
    cr_assert_eq(a.code, 200, "%s", a.text);
    char why[1200];
    cr_assert_gt(prom_check_text(a.text, why, sizeof why), 0, "%s\n%s", why, a.text);
    double v;
    const struct {
        const char *series;
        double want;
    } exact[] = {
        {"loco_coord_islands", 2},
        {"loco_coord_members", 1},
        {"loco_coord_member{site=\"siteA\"}", 1},
        {"loco_coord_member{site=\"siteB\"}", 0},
        {"loco_coord_connected{site=\"siteB\"}", 0},
        {"loco_coord_started", 1},
        {"loco_coord_outer_step", 3},
        {"loco_coord_exchanging", 0},
        {"loco_coord_last_hash_info{hash=\"0000000000000103\"}", 1},
        {"loco_coord_islands_lost_total", 1},
        {"loco_coord_suspicions_total", 1},
        {"loco_coord_ejections_total", 0},
        {"loco_coord_run_restarts_total", 0},
        {"loco_coord_registrations_total", 2},
    };
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) {
        cr_expect(prom_value(a.text, exact[i].series, &v), "no %s in\n%s", exact[i].series, a.text);
        cr_expect_eq(v, exact[i].want, "%s = %g, expected %g", exact[i].series, v, exact[i].want);
    }
    cr_expect_eq(strstr(a.text, "loco_coord_last_hash_info{hash=\"0000000000000102\"}"), NULL,
                 "the previous hash is still listed");
    cr_expect(prom_value(a.text, "loco_coord_epoch", &v) && v >= 2,
              "siteB's loss made a new epoch: %g", v);
    cr_expect(prom_value(a.text, "loco_coord_bytes_received_total", &v) && v > 0);
    cr_expect(prom_value(a.text, "loco_coord_bytes_sent_total", &v) && v > 0);
    char path[600];
    snprintf(path, sizeof path, "%s/metrics_addr", dir);
    FILE *f = fopen(path, "r");
    cr_expect_null(f, "the address file outlives the server");
    if (f)
        fclose(f);
    loco_rmtree(dir);
}
