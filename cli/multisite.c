/* `loco coordinator`, `loco certs` and `loco launch`: the multi-site
 * commands around `loco island`. */
#include "cli/cli.h"
#include "faulttol/faulttol.h"
#include "net/net.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
    if (rc == 0)
        rc = loco_coord_serve(c);
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

/* The run id of `loco certs`: --run-id, else net.run_id of --config/--set,
 * else the one DIR/run_id holds (the run the CA in DIR serves), else a new
 * random one. *from says which. */
static int certs_run_id(char id[LOCO_NET_RUN_ID_MAX], const char **from, const char *opt,
                        const char *config, int nsets, char **sets, const char *dir) {
    id[0] = '\0';
    if (opt) {
        LOCO_CHECK(loco_net_run_id_check(opt));
        snprintf(id, LOCO_NET_RUN_ID_MAX, "%.63s", opt);
        *from = "from --run-id";
        return 0;
    }
    if (config || nsets) {
        loco_config cfg;
        LOCO_CHECK(cli_load_config(&cfg, config, nsets, sets));
        if (cfg.net.run_id[0]) {
            LOCO_CHECK(loco_net_run_id_check(cfg.net.run_id));
            snprintf(id, LOCO_NET_RUN_ID_MAX, "%.63s", cfg.net.run_id);
            *from = "from net.run_id";
            return 0;
        }
    }
    const int kept = loco_net_certs_run_id(dir, id);
    if (kept != 0) {
        *from = "kept from DIR/run_id";
        return kept < 0 ? kept : 0;
    }
    *from = "new, random";
    return loco_net_new_run_id(id);
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

typedef struct {
    char name[LOCO_NET_NAME_MAX];
    char **argv;     /* to start it again after an injected kill */
    double restart_at; /* loco_now() of a scheduled restart, 0 = none */
    bool killed;     /* by a fault: its death is expected */
    bool restarted;  /* started again after an injected kill */
    pid_t pid;
    int fd;          /* its merged stdout/stderr */
    char line[4096]; /* a partial line */
    size_t len;
    int status;
    bool done;
} child;

static volatile sig_atomic_t stop_requested;
static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

/* Starts argv with stdout and stderr into a pipe; `restarted` marks a
 * process started again after an injected kill (it does not kill itself
 * twice). */
static int spawn(child *c, char *const *argv, bool restarted) {
    int fds[2];
    if (pipe(fds) != 0)
        return LOCO_ERR(LOCO_EIO, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        return LOCO_ERR(LOCO_EIO, "fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a stop reaches mpirun's ranks too */
        if (restarted)
            setenv("LOCO_RESTARTED", "1", 1);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    c->pid = pid;
    c->fd = fds[0];
    return 0;
}

/* Prints a child's complete lines with its name in front. */
static void drain(child *c) {
    char buf[4096];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n <= 0) {
        if (c->len) {
            printf("[%s] %.*s\n", c->name, (int)c->len, c->line);
            c->len = 0;
        }
        close(c->fd);
        c->fd = -1;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || c->len == sizeof c->line - 1) {
            printf("[%s] %.*s\n", c->name, (int)c->len, c->line);
            c->len = 0;
        } else {
            c->line[c->len++] = buf[i];
        }
    }
    fflush(stdout);
}

/* A free TCP port on the loopback (bound and released: a small race). */
static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0)
        close(s);
    return port;
}

static bool faults_active(const loco_config *c) {
    return c->faults.kill[0] || c->faults.freeze[0] || c->faults.partition[0] || c->faults.link[0] ||
           c->faults.corrupt > 0 || c->faults.drop > 0 || c->faults.duplicate > 0 ||
           c->faults.reorder > 0 || c->faults.slow[0] || c->faults.coordinator_kill_s > 0;
}

/* Whether DIR holds a checkpoint (ckpt_N) to resume from. Which one, the
 * island chooses: the newest that verifies (loco_ckpt_pick_resume), done
 * there so that reading a large checkpoint never stalls this loop. */
static bool has_ckpt(const char *dir) {
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

/* True when DIR holds a run that finished (its events say so). */
static bool finished_run(const char *dir) {
    char path[LOCO_PATH_MAX * 2 + 32];
    snprintf(path, sizeof path, "%s/events.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char line[2048];
    bool ok = false;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"kind\":\"end\"") && strstr(line, "\"status\":\"finished\""))
            ok = true;
    fclose(f);
    return ok;
}

/* The fault-free run of the same config and seed, in dir (reused when a
 * finished one is there). */
static int run_baseline(const char *self, const char *config, char **sets, int nsets,
                        const char *dir) {
    if (finished_run(dir)) {
        printf("launch: reusing the fault-free baseline in %s\n", dir);
        return 0;
    }
    printf("launch: fault-free baseline of the same config and seed first, in %s\n", dir);
    fflush(stdout);
    static char rundir[LOCO_PATH_MAX * 2 + 16];
    snprintf(rundir, sizeof rundir, "run.dir=%s", dir);
    static const char *const clear[] = {
        "faults.kill=", "faults.freeze=", "faults.partition=", "faults.link=", "faults.corrupt=0",
        "faults.drop=0", "faults.duplicate=0", "faults.reorder=0", "faults.slow=",
        "faults.coordinator_kill_s=0"};
    char *av[MAX_SETS * 2 + 40];
    int n = 0;
    av[n++] = (char *)self;
    av[n++] = "launch";
    av[n++] = (char *)config;
    for (int i = 0; i < nsets; i++) {
        av[n++] = "--set";
        av[n++] = sets[i];
    }
    for (size_t i = 0; i < sizeof clear / sizeof *clear; i++) {
        av[n++] = "--set";
        av[n++] = (char *)clear[i];
    }
    av[n++] = "--set";
    av[n++] = rundir;
    av[n++] = "--no-baseline";
    av[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return LOCO_ERR(LOCO_EIO, "fork: %s", strerror(errno));
    if (pid == 0) {
        execv(self, av);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return LOCO_ERR(LOCO_EPEER, "the fault-free baseline run in %s failed", dir);
    return 0;
}

/* A restarted island resumes from its own newest valid checkpoint
 * (weights, AdamW, data position, outer state); the others' state then
 * tells it what it missed. */
static void with_resume(child *c, const char *run_dir) {
    static char paths[LOCO_MAX_ISLANDS + 1][LOCO_PATH_MAX + 96];
    static int used;
    char dir[LOCO_PATH_MAX + 80];
    snprintf(dir, sizeof dir, "%s/%s", run_dir, c->name);
    if (!has_ckpt(dir) || used > LOCO_MAX_ISLANDS)
        return;
    int n = 0;
    while (c->argv[n])
        n++;
    for (int i = 0; i < n; i++)
        if (!strcmp(c->argv[i], "--resume"))
            return; /* already the island's directory */
    snprintf(paths[used], sizeof paths[used], "%s", dir);
    c->argv[n] = "--resume";
    c->argv[n + 1] = paths[used++];
    c->argv[n + 2] = NULL;
}

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
    int K = 0;
    if (rc == 0)
        rc = loco_site_id(&cfg, NULL, NULL, &K);
    if (rc < 0)
        return cli_fail(rc);
    char sites[LOCO_MAX_ISLANDS][LOCO_NET_NAME_MAX];
    {
        char buf[LOCO_PATH_MAX];
        snprintf(buf, sizeof buf, "%s", cfg.outer.sites);
        int n = 0;
        for (char *tok = strtok(buf, ","); tok && n < K; tok = strtok(NULL, ","))
            snprintf(sites[n++], LOCO_NET_NAME_MAX, "%s", tok);
    }
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0)
        return cli_fail(LOCO_ERR(LOCO_EIO, "cannot find the loco binary"));
    self[sl] = '\0';
    /* Certificates for the run, made once. */
    char certs[LOCO_PATH_MAX + 16];
    snprintf(certs, sizeof certs, "%s/certs", cfg.run.dir);
    if (cfg.net.tls) {
        char ca[LOCO_PATH_MAX + 32];
        snprintf(ca, sizeof ca, "%s/ca.pem", certs);
        const char *names[LOCO_MAX_ISLANDS + 1] = {"coordinator"};
        for (int k = 0; k < K; k++)
            names[k + 1] = sites[k];
        if (!cfg.net.cert[0] &&
            (rc = loco_net_make_certs_run(certs, names, K + 1, 30, cfg.net.run_id)) < 0)
            return cli_fail(rc);
    }
    char host[LOCO_ADDR_MAX];
    int port;
    if ((rc = loco_parse_hostport(cfg.faulttol.coordinator, host, sizeof host, &port)) < 0)
        return cli_fail(rc);
    if (port == 0 && (port = free_port()) < 0)
        return cli_fail(LOCO_ERR(LOCO_EIO, "no free port for the coordinator"));
    static char coord_set[LOCO_ADDR_MAX + 64];
    snprintf(coord_set, sizeof coord_set, "faulttol.coordinator=%s:%d", host, port);

    if ((rc = loco_mkdirs(cfg.run.dir)) < 0)
        return cli_fail(rc);
    const bool with_report = faults_active(&cfg) && !no_baseline;
    char base_dir[LOCO_PATH_MAX * 2];
    snprintf(base_dir, sizeof base_dir, "%s", baseline ? baseline : "");
    if (with_report && !baseline)
        snprintf(base_dir, sizeof base_dir, "%s/baseline", cfg.run.dir);
    if (with_report && (rc = run_baseline(self, config, sets, nsets, base_dir)) < 0)
        return cli_fail(rc);
    char events[LOCO_PATH_MAX + 32];
    snprintf(events, sizeof events, "%s/events.jsonl", cfg.run.dir);
    /* A new timeline for this run (a baseline inside keeps its own). */
    unlink(events);
    setenv("LOCO_EVENTS", events, 1);
    {
        char list[LOCO_MAX_ISLANDS * 72] = "";
        size_t o = 0;
        for (int k = 0; k < K; k++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s\"%s\"", k ? "," : "", sites[k]);
        loco_event_append(events, "\"kind\":\"start\",\"sites\":[%s],\"config\":\"%s\",\"seed\":%lld",
                     list, config, (long long)cfg.train.seed);
    }
    const double t_start = loco_now();
    bool coord_killed = false, run_over = false;
    child kids[LOCO_MAX_ISLANDS + 1];
    memset(kids, 0, sizeof kids);
    int n_kids = 0;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    static char ompi_dirs[LOCO_MAX_ISLANDS][32]; /* mpirun session directories */
    int n_ompi = 0;
    /* argv of every child: [mpirun ...] loco CMD CONFIG [--site S] --set ... */
    static char strs[LOCO_MAX_ISLANDS + 1][8][LOCO_PATH_MAX + 64];
    static char *avs[LOCO_MAX_ISLANDS + 1][MAX_SETS * 2 + 32];
    for (int k = -1; k < K && rc == 0; k++) {
        char **av = avs[k + 1];
        int n = 0;
        child *c = &kids[n_kids];
        char(*s)[LOCO_PATH_MAX + 64] = strs[k + 1];
        const char *who = k < 0 ? "coordinator" : sites[k];
        snprintf(c->name, sizeof c->name, "%s", who);
        static char np_str[24];
        if (k >= 0 && cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp *
                              cfg.parallel.ep > 1) {
            snprintf(np_str, sizeof np_str, "%lld",
                     (long long)(cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp *
                                 cfg.parallel.cp * cfg.parallel.ep));
            av[n++] = "mpirun";
            av[n++] = "--allow-run-as-root";
            av[n++] = "--oversubscribe";
            /* A session directory of its own: OpenMPI 4 jobs started at the
             * same moment race to create the shared one ("mkdir ... File
             * exists", open-mpi/ompi#8510). Short, for PMIx's socket paths. */
            snprintf(s[5], sizeof s[5], "/tmp/loco-ompi-XXXXXX");
            if (!mkdtemp(s[5])) {
                rc = LOCO_ERR(LOCO_EIO, "launch: no session directory for %s's mpirun", who);
                break;
            }
            snprintf(ompi_dirs[n_ompi++], sizeof ompi_dirs[0], "%s", s[5]);
            av[n++] = "--mca";
            av[n++] = "orte_tmpdir_base";
            av[n++] = s[5];
            av[n++] = "-np";
            av[n++] = np_str;
        }
        av[n++] = self;
        av[n++] = k < 0 ? "coordinator" : "island";
        av[n++] = (char *)config;
        if (k >= 0) {
            av[n++] = "--site";
            av[n++] = sites[k];
        }
        for (int i = 0; i < nsets; i++) {
            av[n++] = "--set";
            av[n++] = sets[i];
        }
        av[n++] = "--set";
        av[n++] = coord_set;
        if (cfg.net.tls && !cfg.net.cert[0]) {
            snprintf(s[0], sizeof s[0], "net.cert=%s/%s.pem", certs, who);
            snprintf(s[1], sizeof s[1], "net.key=%s/%s.key", certs, who);
            snprintf(s[2], sizeof s[2], "net.ca=%s/ca.pem", certs);
            for (int i = 0; i < 3; i++) {
                av[n++] = "--set";
                av[n++] = s[i];
            }
        }
        if (k >= 0) {
            snprintf(s[3], sizeof s[3], "run.dir=%s/%s", cfg.run.dir, who);
            av[n++] = "--set";
            av[n++] = s[3];
            /* Live metrics: islands share the config, so each takes a free
             * port on the configured host and writes it to its
             * run.dir/metrics_addr. */
            const char *mc = strrchr(cfg.run.metrics_addr, ':');
            if (mc) {
                snprintf(s[6], sizeof s[6], "run.metrics_addr=%.*s:0",
                         (int)(mc - cfg.run.metrics_addr), cfg.run.metrics_addr);
                av[n++] = "--set";
                av[n++] = s[6];
            }
            /* --resume: every island from its newest valid checkpoint. */
            snprintf(s[4], sizeof s[4], "%s/%s", cfg.run.dir, who);
            if (resume_all && has_ckpt(s[4])) {
                av[n++] = "--resume";
                av[n++] = s[4];
            }
        }
        av[n] = NULL;
        c->argv = av;
        rc = spawn(c, av, false);
        if (rc == 0)
            n_kids++;
    }
    printf("launch: coordinator on %s:%d and %d islands (%s); Ctrl-C stops them all\n", host,
           port, K, cfg.outer.sites);
    if (cfg.faulttol.metrics_addr[0])
        printf("launch: coordinator metrics at http://ADDR/metrics, ADDR in %s/metrics_addr\n",
               cfg.run.dir);
    if (cfg.run.metrics_addr[0])
        printf("launch: island metrics at http://ADDR/metrics, ADDR in %s/SITE/metrics_addr\n",
               cfg.run.dir);
    fflush(stdout);
    int failed = rc < 0;
    bool stopping = rc < 0;
    for (int alive = n_kids; alive > 0;) {
        if ((stop_requested || failed) && !stopping) {
            stopping = true;
            printf("launch: stopping every process\n");
            for (int i = 0; i < n_kids; i++)
                if (!kids[i].done)
                    kill(-kids[i].pid, SIGTERM);
        }
        struct pollfd pf[LOCO_MAX_ISLANDS + 1];
        int map[LOCO_MAX_ISLANDS + 1], np = 0;
        for (int i = 0; i < n_kids; i++)
            if (kids[i].fd >= 0) {
                pf[np] = (struct pollfd){.fd = kids[i].fd, .events = POLLIN};
                map[np++] = i;
            }
        if (np > 0 && poll(pf, (nfds_t)np, 200) > 0)
            for (int j = 0; j < np; j++)
                if (pf[j].revents)
                    drain(&kids[map[j]]);
        /* [faults]: the coordinator killed at a time, and restarted. */
        double now = loco_now();
        if (!stopping && !coord_killed && cfg.faults.coordinator_kill_s > 0 &&
            now - t_start >= cfg.faults.coordinator_kill_s && !kids[0].done) {
            coord_killed = true;
            kids[0].killed = true;
            printf("launch: faults: killing the coordinator (SIGKILL)\n");
            loco_event_append(events, "\"kind\":\"fault\",\"fault\":\"kill_coordinator\","
                                 "\"site\":\"coordinator\"");
            kill(-kids[0].pid, SIGKILL);
        }
        for (int i = 0; i < n_kids; i++) {
            child *c = &kids[i];
            /* Once the coordinator finished the run, nothing comes back. */
            if (c->done && c->restart_at > 0 && run_over) {
                c->restart_at = 0;
                alive--;
                printf("launch: the run finished before %s could restart\n", c->name);
            }
            if (c->done && c->restart_at > 0 && now >= c->restart_at && !stopping) {
                c->restart_at = 0;
                c->done = false;
                c->killed = false;
                c->len = 0;
                bool coord = i == 0;
                printf("launch: faults: restarting %s\n", c->name);
                loco_event_append(events, "\"kind\":\"fault\",\"fault\":\"%s\",\"site\":\"%s\"",
                             coord ? "restart_coordinator" : "restart", c->name);
                c->restarted = true;
                if (!coord)
                    with_resume(c, cfg.run.dir);
                if (spawn(c, c->argv, true) < 0) {
                    failed = 1;
                    c->done = true;
                    alive--;
                }
            }
            if (c->done && c->restart_at > 0 && stopping) {
                c->restart_at = 0;
                alive--;
            }
            if (c->done || c->fd >= 0)
                continue;
            int st;
            if (waitpid(c->pid, &st, WNOHANG) == c->pid) {
                c->done = true;
                c->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                alive--;
                /* mpirun reports a rank killed by SIGKILL as exit status 137. */
                bool sigkill = (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) ||
                               (WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL);
                if (i > 0 && sigkill && cfg.faults.kill[0] && !stopping) {
                    /* An island that killed itself as [faults] said (it
                     * wrote the event itself). */
                    c->killed = true;
                    if (cfg.faults.restart_ms >= 0) {
                        c->restart_at = loco_now() + cfg.faults.restart_ms / 1e3;
                        alive++; /* it comes back */
                    }
                    printf("launch: faults: %s was killed%s\n", c->name,
                           cfg.faults.restart_ms >= 0 ? "; it restarts shortly" : "");
                } else if (i == 0 && c->killed && !stopping) {
                    c->restart_at = loco_now() + cfg.faults.coordinator_restart_ms / 1e3;
                    alive++;
                } else if (i == 0 && c->status == 0) {
                    run_over = true;
                } else if (i > 0 && c->status != 0 && run_over && c->restarted) {
                    /* Restarted too late to rejoin: the run is complete without it. */
                    c->killed = true;
                    printf("launch: %s came back after the run finished\n", c->name);
                } else if (c->status != 0 && !stopping) {
                    printf("launch: %s exited with status %d\n", c->name, c->status);
                    failed = 1;
                }
            }
        }
    }
    int worst = 0;
    for (int i = 0; i < n_kids; i++)
        if (kids[i].status && !kids[i].killed)
            worst = kids[i].status;
    loco_event_append(events, "\"kind\":\"launch_end\",\"status\":\"%s\"",
                 failed || worst || stop_requested ? "failed" : "finished");
    printf("launch: %s\n", failed || worst || stop_requested ? "FAILED" : "done: every process finished cleanly");
    for (int i = 0; i < n_ompi; i++)
        loco_rmtree(ompi_dirs[i]);
    if (rc < 0)
        return cli_fail(rc);
    bool bad = failed || worst || stop_requested;
    if (with_report && !stop_requested) {
        int ok = 0;
        rc = loco_report_write(cfg.run.dir, base_dir, cfg.run.dir, &ok);
        if (rc < 0)
            return cli_fail(rc);
        bad = bad || !ok;
    }
    return bad ? CLI_FAIL : CLI_OK;
}
