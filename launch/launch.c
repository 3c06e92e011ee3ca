/* The plan of `loco launch`: which processes a multi-site run on one
 * machine starts (the coordinator, then one island per site of
 * outer.sites, each under mpirun when its mesh has more than one rank) and
 * the exact argv of each, the fault-free baseline run's argv, and the
 * run-directory facts the supervisor needs (a checkpoint to resume from, a
 * finished run, a free port). The supervision itself (spawning, merged
 * output, injected kills and restarts) is the front end's. */
#include "launch/launch.h"

#include "faulttol/faulttol.h"
#include "net/net.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Strings one child's argv points into besides the caller's. */
enum { S_CERT, S_KEY, S_CA, S_RUNDIR, S_RESUME, S_OMPI, S_METRICS, S_NP, S_COUNT };
#define ARGV_MAX (LOCO_LAUNCH_MAX_SETS * 2 + 40)

typedef struct {
    char name[LOCO_NET_NAME_MAX];
    char s[S_COUNT][LOCO_PATH_MAX + 96];
    char *argv[ARGV_MAX];
    int argc;
    bool ompi_dir; /* s[S_OMPI] is a session directory to remove */
} plan_child;

struct loco_launch_plan {
    int n; /* coordinator + K islands */
    plan_child kids[LOCO_MAX_ISLANDS + 1];
    char coord_set[LOCO_ADDR_MAX + 64];
    char run_dir[LOCO_PATH_MAX];
    /* the baseline run's argv */
    char base_set[LOCO_PATH_MAX * 2 + 16];
    char *base_argv[ARGV_MAX];
};

bool loco_launch_has_ckpt(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool any = false;
    for (struct dirent *e; !any && (e = readdir(d));) {
        long long step;
        char tail;
        any = sscanf(e->d_name, "ckpt_%lld%c", &step, &tail) == 1;
    }
    closedir(d);
    return any;
}

bool loco_launch_run_finished(const char *dir) {
    char path[LOCO_PATH_MAX * 2 + 32];
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    loco_run_progress p = {0};
    loco_run_progress_read(&p, path);
    return p.finished;
}

int loco_launch_free_port(int *port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    *port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        *port = ntohs(a.sin_port);
    if (s >= 0)
        close(s);
    return *port < 0 ? LOCO_ERR(LOCO_EIO, "no free port for the coordinator") : 0;
}

static int push(plan_child *c, char *arg) {
    if (c->argc + 2 > ARGV_MAX)
        return LOCO_ERR(LOCO_EINVAL, "launch: %s: more than %d arguments", c->name, ARGV_MAX - 1);
    c->argv[c->argc++] = arg;
    c->argv[c->argc] = NULL;
    return 0;
}

static int push_set(plan_child *c, char *kv) {
    LOCO_CHECK(push(c, "--set"));
    return push(c, kv);
}

/* One child's argv: [mpirun ...] SELF coordinator|island CONFIG [--site S]
 * --set ... (k < 0: the coordinator). */
static int plan_one(loco_launch_plan *p, plan_child *c, int k, const char *site,
                    const loco_config *cfg, const loco_launch_args *a, const char *certs) {
    char(*s)[LOCO_PATH_MAX + 96] = c->s;
    snprintf(c->name, sizeof c->name, "%s", k < 0 ? "coordinator" : site);
    /* The island's own mesh: its [site.NAME] keys may set one. */
    loco_config *own = loco_alloc(sizeof *own);
    if (!own)
        return LOCO_ERR(LOCO_ENOMEM, "launch: config of %s", c->name);
    *own = *cfg;
    const int site_rc = k < 0 ? 0 : loco_config_for_site(own, site);
    /* parallel.ep is folded out of dp: it adds no ranks */
    const int64_t ranks = own->parallel.dp * own->parallel.tp * own->parallel.pp *
                          own->parallel.cp;
    loco_free(own);
    LOCO_CHECK(site_rc);
    if (k >= 0 && ranks > 1) {
        snprintf(s[S_NP], sizeof s[S_NP], "%lld", (long long)ranks);
        LOCO_CHECK(push(c, "mpirun"));
        LOCO_CHECK(push(c, "--allow-run-as-root"));
        LOCO_CHECK(push(c, "--oversubscribe"));
        /* A session directory of its own: OpenMPI 4 jobs started at the
         * same moment race to create the shared one ("mkdir ... File
         * exists", open-mpi/ompi#8510). Short, for PMIx's socket paths. */
        snprintf(s[S_OMPI], sizeof s[S_OMPI], "/tmp/loco-ompi-XXXXXX");
        if (!mkdtemp(s[S_OMPI]))
            return LOCO_ERR(LOCO_EIO, "launch: no session directory for %s's mpirun", c->name);
        c->ompi_dir = true;
        LOCO_CHECK(push(c, "--mca"));
        LOCO_CHECK(push(c, "orte_tmpdir_base"));
        LOCO_CHECK(push(c, s[S_OMPI]));
        LOCO_CHECK(push(c, "-np"));
        LOCO_CHECK(push(c, s[S_NP]));
    }
    LOCO_CHECK(push(c, (char *)a->self));
    LOCO_CHECK(push(c, k < 0 ? "coordinator" : "island"));
    LOCO_CHECK(push(c, (char *)a->config));
    if (k >= 0) {
        LOCO_CHECK(push(c, "--site"));
        LOCO_CHECK(push(c, c->name));
    }
    for (int i = 0; i < a->nsets; i++)
        LOCO_CHECK(push_set(c, a->sets[i]));
    LOCO_CHECK(push_set(c, p->coord_set));
    if (cfg->net.tls && !cfg->net.cert[0]) {
        snprintf(s[S_CERT], sizeof s[S_CERT], "net.cert=%s/%s.pem", certs, c->name);
        snprintf(s[S_KEY], sizeof s[S_KEY], "net.key=%s/%s.key", certs, c->name);
        snprintf(s[S_CA], sizeof s[S_CA], "net.ca=%s/ca.pem", certs);
        LOCO_CHECK(push_set(c, s[S_CERT]));
        LOCO_CHECK(push_set(c, s[S_KEY]));
        LOCO_CHECK(push_set(c, s[S_CA]));
    }
    if (k < 0)
        return 0;
    snprintf(s[S_RUNDIR], sizeof s[S_RUNDIR], "run.dir=%s/%s", cfg->run.dir, c->name);
    LOCO_CHECK(push_set(c, s[S_RUNDIR]));
    /* Live metrics: islands share the config, so each takes a free port on
     * the configured host and writes it to its run.dir/metrics_addr. */
    const char *mc = strrchr(cfg->run.metrics_addr, ':');
    if (mc) {
        snprintf(s[S_METRICS], sizeof s[S_METRICS], "run.metrics_addr=%.*s:0",
                 (int)(mc - cfg->run.metrics_addr), cfg->run.metrics_addr);
        LOCO_CHECK(push_set(c, s[S_METRICS]));
    }
    /* --resume: every island from its newest valid checkpoint. */
    if (a->resume_all)
        LOCO_CHECK(loco_launch_plan_add_resume(p, k + 1));
    return 0;
}

/* The baseline: `SELF launch CONFIG --set ... (faults cleared) --set
 * run.dir=DIR --no-baseline`; DIR is filled in by loco_launch_plan_baseline. */
static int plan_baseline(loco_launch_plan *p, const loco_launch_args *a) {
    const char *clear[32];
    const int n_clear = loco_faults_clear_sets(clear, 32);
    LOCO_CHECK(n_clear);
    plan_child tmp = {.name = "baseline"};
    LOCO_CHECK(push(&tmp, (char *)a->self));
    LOCO_CHECK(push(&tmp, "launch"));
    LOCO_CHECK(push(&tmp, (char *)a->config));
    for (int i = 0; i < a->nsets; i++)
        LOCO_CHECK(push_set(&tmp, a->sets[i]));
    for (int i = 0; i < n_clear; i++)
        LOCO_CHECK(push_set(&tmp, (char *)clear[i]));
    LOCO_CHECK(push_set(&tmp, p->base_set));
    LOCO_CHECK(push(&tmp, "--no-baseline"));
    memcpy(p->base_argv, tmp.argv, sizeof p->base_argv);
    return 0;
}

int loco_launch_plan_create(loco_launch_plan **out, const loco_config *cfg,
                            const loco_launch_args *a, const char *coord_host, int coord_port) {
    *out = NULL;
    if (a->nsets < 0 || a->nsets > LOCO_LAUNCH_MAX_SETS)
        return LOCO_ERR(LOCO_EINVAL, "launch: %d --set options, expected at most %d", a->nsets,
                        LOCO_LAUNCH_MAX_SETS);
    if (coord_port < 1 || coord_port > 65535)
        return LOCO_ERR(LOCO_EINVAL, "launch: coordinator port %d, expected 1..65535", coord_port);
    int K;
    LOCO_CHECK(loco_site_id(cfg, NULL, NULL, &K));
    loco_launch_plan *p = calloc(1, sizeof *p);
    if (!p)
        return LOCO_ERR(LOCO_ENOMEM, "launch plan");
    snprintf(p->coord_set, sizeof p->coord_set, "faulttol.coordinator=%s:%d", coord_host,
             coord_port);
    snprintf(p->run_dir, sizeof p->run_dir, "%s", cfg->run.dir);
    char certs[LOCO_PATH_MAX + 16];
    snprintf(certs, sizeof certs, "%s/certs", cfg->run.dir);
    char sites[LOCO_PATH_MAX];
    snprintf(sites, sizeof sites, "%s", cfg->outer.sites);
    char *save = NULL, *tok = strtok_r(sites, ",", &save);
    p->n = 1;
    int rc = plan_one(p, &p->kids[0], -1, NULL, cfg, a, certs);
    for (int k = 0; k < K && rc == 0 && tok; k++, tok = strtok_r(NULL, ",", &save)) {
        p->n = k + 2; /* counted first: add_resume sees it, destroy cleans it */
        rc = plan_one(p, &p->kids[k + 1], k, tok, cfg, a, certs);
    }
    if (rc == 0)
        rc = plan_baseline(p, a);
    if (rc < 0) {
        loco_launch_plan_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

void loco_launch_plan_destroy(loco_launch_plan *p) {
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        if (p->kids[i].ompi_dir)
            loco_rmtree(p->kids[i].s[S_OMPI]);
    free(p);
}

int loco_launch_plan_count(const loco_launch_plan *p) {
    return p->n;
}

const char *loco_launch_plan_name(const loco_launch_plan *p, int i) {
    return i >= 0 && i < p->n ? p->kids[i].name : NULL;
}

char *const *loco_launch_plan_argv(const loco_launch_plan *p, int i) {
    return i >= 0 && i < p->n ? p->kids[i].argv : NULL;
}

int loco_launch_plan_add_resume(loco_launch_plan *p, int i) {
    if (i < 1 || i >= p->n)
        return LOCO_ERR(LOCO_EINVAL, "launch: process %d is not an island (1..%d)", i, p->n - 1);
    plan_child *c = &p->kids[i];
    for (int j = 0; j < c->argc; j++)
        if (!strcmp(c->argv[j], "--resume"))
            return 0; /* already the island's directory */
    char dir[sizeof c->s[S_RESUME]];
    snprintf(dir, sizeof dir, "%s/%s", p->run_dir, c->name);
    if (!loco_launch_has_ckpt(dir))
        return 0;
    memcpy(c->s[S_RESUME], dir, sizeof dir);
    LOCO_CHECK(push(c, "--resume"));
    return push(c, c->s[S_RESUME]);
}

char *const *loco_launch_plan_baseline(loco_launch_plan *p, const char *dir) {
    snprintf(p->base_set, sizeof p->base_set, "run.dir=%s", dir);
    return p->base_argv;
}
