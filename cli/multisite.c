/* `loco coordinator`, `loco certs` and `loco launch`: the multi-site
 * commands around `loco island`. */
#include "cli/cli.h"
#include "faulttol/faulttol.h"
#include "launch/launch.h"
#include "net/net.h"
#include "outer/outer.h"
#include "report/report.h"

#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SETS 256

static int parse_config_args(const char *cmd, int argc, char **argv, const char **config,
                             char **sets, int *nsets) {
    *config = NULL;
    *nsets = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && *nsets < MAX_SETS)
            sets[(*nsets)++] = argv[++i];
        else if (argv[i][0] != '-' && !*config)
            *config = argv[i];
        else {
            fprintf(stderr, "loco %s: unexpected argument: %s\n", cmd, argv[i]);
            return CLI_USAGE;
        }
    }
    if (!*config) {
        fprintf(stderr, "loco %s: missing CONFIG\n", cmd);
        return CLI_USAGE;
    }
    return 0;
}

int cli_coordinator(int argc, char **argv) {
    const char *config;
    char *sets[MAX_SETS];
    int nsets;
    int u = parse_config_args("coordinator", argc, argv, &config, sets, &nsets);
    if (u)
        return u;
    loco_config cfg;
    int rc = cli_load_config(&cfg, config, nsets, sets);
    loco_net_params np;
    if (rc == 0)
        rc = loco_net_params_from_config(&np, &cfg);
    if (rc == 0)
        snprintf(np.name, sizeof np.name, "coordinator");
    /* The run's timeline: events.jsonl in run.dir, shared with `loco launch`. */
    char events[LOCO_PATH_MAX + 32];
    snprintf(events, sizeof events, "%s/events.jsonl", cfg.run.dir);
    if (rc == 0)
        rc = loco_mkdirs(cfg.run.dir);
    loco_coord *c = NULL;
    if (rc == 0)
        rc = loco_coord_create(&c, &cfg, &np, NULL, 0, events);
    /* Its decisions, synced before any island hears them: a restart
     * reads them back (docs/FAULTS.md, "Durable decisions"). */
    char journal[LOCO_PATH_MAX + 32];
    snprintf(journal, sizeof journal, "%s/decisions.log", cfg.run.dir);
    if (rc == 0)
        rc = loco_coord_open_journal(c, journal);
    cli_metrics *metrics = NULL;
    if (rc == 0)
        rc = cli_metrics_serve_run(&metrics, loco_coord_prom(c), cfg.faulttol.metrics_addr,
                                   "faulttol.metrics_addr", cfg.run.dir);
    if (rc == 0)
        rc = loco_coord_serve(c);
    cli_metrics_stop(metrics); /* before the registry it serves goes */
    loco_coord_destroy(c);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}

/* Splits a comma-separated list of names into list (in buf); returns n. */
static int split_names(const char *names, char *buf, size_t cap, const char **list, int max) {
    snprintf(buf, cap, "%s", names);
    int n = 0;
    for (char *tok = strtok(buf, ","); tok && n < max; tok = strtok(NULL, ","))
        list[n++] = tok;
    return n;
}

/* `loco certs revoke --out DIR --names siteB,...`: DIR/crl.pem lists them. */
static int certs_revoke(int argc, char **argv) {
    const char *dir = NULL, *names = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--names") && i + 1 < argc)
            names = argv[++i];
        else {
            fprintf(stderr, "loco certs revoke: unexpected argument: %s\n", argv[i]);
            return CLI_USAGE;
        }
    }
    if (!dir || !names) {
        fprintf(stderr, "loco certs revoke: expected --out DIR --names siteB,...\n");
        return CLI_USAGE;
    }
    char buf[4096];
    const char *list[LOCO_MAX_ISLANDS + 1];
    const int n = split_names(names, buf, sizeof buf, list, LOCO_MAX_ISLANDS + 1);
    int listed = 0;
    const int rc = loco_net_revoke_certs(dir, list, n, &listed);
    if (rc < 0)
        return cli_fail(rc);
    printf("revoked %s: %s/crl.pem lists %d certificate%s; set net.crl = %s/crl.pem on every "
           "site (read when a listener starts or a connection is made)\n",
           names, dir, listed, listed == 1 ? "" : "s", dir);
    return CLI_OK;
}

/* The run id of `loco certs` (loco_net_pick_run_id), net.run_id read from
 * --config/--set when there is no --run-id. */
static int certs_run_id(char id[LOCO_NET_RUN_ID_MAX], const char **from, const char *opt,
                        const char *config, int nsets, char **sets, const char *dir) {
    loco_config cfg;
    const char *cfg_id = NULL;
    if (!opt && (config || nsets)) {
        LOCO_CHECK(cli_load_config(&cfg, config, nsets, sets));
        cfg_id = cfg.net.run_id;
    }
    return loco_net_pick_run_id(id, from, opt, cfg_id, dir);
}

int cli_certs(int argc, char **argv) {
    if (argc > 0 && !strcmp(argv[0], "revoke"))
        return certs_revoke(argc - 1, argv + 1);
    const char *out = NULL, *names = NULL, *run_id = NULL, *config = NULL;
    char *sets[MAX_SETS];
    int nsets = 0;
    int days = 365;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--names") && i + 1 < argc)
            names = argv[++i];
        else if (!strcmp(argv[i], "--days") && i + 1 < argc)
            days = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--run-id") && i + 1 < argc)
            run_id = argv[++i];
        else if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[++i];
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < MAX_SETS)
            sets[nsets++] = argv[++i];
        else {
            fprintf(stderr, "loco certs: unexpected argument: %s\n", argv[i]);
            return CLI_USAGE;
        }
    }
    if (!out || !names) {
        fprintf(stderr, "loco certs: expected --out DIR --names coordinator,siteA,...\n");
        return CLI_USAGE;
    }
    char buf[4096];
    const char *list[LOCO_MAX_ISLANDS + 1];
    const int n = split_names(names, buf, sizeof buf, list, LOCO_MAX_ISLANDS + 1);
    char id[LOCO_NET_RUN_ID_MAX];
    const char *from = "";
    int rc = certs_run_id(id, &from, run_id, config, nsets, sets, out);
    if (rc == 0)
        rc = loco_net_make_certs_run(out, list, n, days, id);
    if (rc < 0)
        return cli_fail(rc);
    printf("wrote %s/ca.pem, ca.key and a certificate + key for each of: %s\n", out, names);
    printf("run id %s (%s), in each certificate and in %s/run_id: set net.run_id = %s on every "
           "site\n",
           id, from, out, id);
    return CLI_OK;
}

/* ---------------------------------------------------------------- launch */

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

static int launch_run(const loco_config *c, loco_launch_plan *plan, const char *self,
                      const char *config, const char *host, int port, bool no_baseline,
                      const char *baseline);

int cli_launch(int argc, char **argv) {
    const char *config;
    char *sets[MAX_SETS];
    int nsets;
    /* --no-baseline / --baseline DIR are launch's own; the rest is the config's. */
    char *rest[MAX_SETS * 2 + 8];
    int nrest = 0;
    bool no_baseline = false, resume_all = false;
    const char *baseline = NULL;
    for (int i = 0; i < argc && nrest < (int)(sizeof rest / sizeof *rest); i++) {
        if (!strcmp(argv[i], "--no-baseline"))
            no_baseline = true;
        else if (!strcmp(argv[i], "--baseline") && i + 1 < argc)
            baseline = argv[++i];
        else if (!strcmp(argv[i], "--resume"))
            resume_all = true;
        else
            rest[nrest++] = argv[i];
    }
    int u = parse_config_args("launch", nrest, rest, &config, sets, &nsets);
    if (u)
        return u;
    loco_config cfg;
    int rc = cli_load_config(&cfg, config, nsets, sets);
    if (rc < 0)
        return cli_fail(rc);
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        return cli_fail(LOCO_ERR(LOCO_EIO, "cannot find the loco binary"));
    self[sl] = '\0';
    char host[LOCO_ADDR_MAX];
    int port;
    if ((rc = loco_parse_hostport(cfg.faulttol.coordinator, host, sizeof host, &port)) < 0)
        return cli_fail(rc);
    if (port == 0 && (rc = loco_launch_free_port(&port)) < 0)
        return cli_fail(rc);
    const loco_launch_args la = {.self = self, .config = config, .sets = sets, .nsets = nsets,
                                 .resume_all = resume_all};
    loco_launch_plan *plan;
    if ((rc = loco_launch_plan_create(&plan, &cfg, &la, host, port)) < 0)
        return cli_fail(rc);
    rc = launch_run(&cfg, plan, self, config, host, port, no_baseline, baseline);
    loco_launch_plan_destroy(plan);
    return rc;
}

/* Certificates, the baseline, then every process of the plan supervised
 * until all are done; the report when faults were injected. */
static int launch_run(const loco_config *c, loco_launch_plan *plan, const char *self,
                      const char *config, const char *host, int port, bool no_baseline,
                      const char *baseline) {
    const loco_config cfg = *c;
    const int K = loco_launch_plan_count(plan) - 1;
    int rc;
    if ((rc = loco_launch_certs(plan, &cfg)) < 0)
        return cli_fail(rc);
    if ((rc = loco_mkdirs(cfg.run.dir)) < 0)
        return cli_fail(rc);
    const bool with_report = loco_faults_active(&cfg) && !no_baseline;
    char base_dir[LOCO_PATH_MAX * 2];
    snprintf(base_dir, sizeof base_dir, "%s", baseline ? baseline : "");
    if (with_report && !baseline)
        snprintf(base_dir, sizeof base_dir, "%s/baseline", cfg.run.dir);
    if (with_report && (rc = loco_launch_baseline(plan, self, base_dir, stdout)) < 0)
        return cli_fail(rc);
    char events[LOCO_PATH_MAX + 32];
    snprintf(events, sizeof events, "%s/events.jsonl", cfg.run.dir);
    if ((rc = loco_launch_start(plan, &cfg, config, events)) < 0)
        return cli_fail(rc);
    setenv("LOCO_EVENTS", events, 1);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    printf("launch: coordinator on %s:%d and %d islands (%s); Ctrl-C stops them all\n", host,
           port, K, cfg.outer.sites);
    if (cfg.faulttol.metrics_addr[0])
        printf("launch: coordinator metrics at http://ADDR/metrics, ADDR in %s/metrics_addr\n",
               cfg.run.dir);
    if (cfg.run.metrics_addr[0])
        printf("launch: island metrics at http://ADDR/metrics, ADDR in %s/SITE/metrics_addr\n",
               cfg.run.dir);
    fflush(stdout);
    bool clean = false;
    rc = loco_launch_supervise(plan, &cfg, events, stdout, &stop_requested, &clean);
    if (rc < 0)
        return cli_fail(rc);
    bool bad = !clean || stop_requested;
    if (loco_faults_active(&cfg) && !with_report && !stop_requested) {
        /* No baseline, no report: the cycles still decide (docs/FAULTS.md). */
        int open = 0;
        if ((rc = loco_fault_cycles_print(events, stdout, &open)) < 0)
            return cli_fail(rc);
        if (open)
            printf("launch: INCOMPLETE: %d fault cycle%s did not complete\n", open,
                   open > 1 ? "s" : "");
        bad = bad || open;
    }
    if (with_report && !stop_requested) {
        int ok = 0;
        rc = loco_report_write(cfg.run.dir, base_dir, cfg.run.dir, &ok);
        if (rc < 0)
            return cli_fail(rc);
        bad = bad || !ok;
    }
    return bad ? CLI_FAIL : CLI_OK;
}
