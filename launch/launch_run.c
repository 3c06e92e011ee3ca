/* Supervising the processes of a launch plan (launch/launch.c): each started
 * in a process group of its own with its output merged, line by line, into
 * one stream under its name; [faults] kills and restarts as the config
 * says; every process stopped when one fails or a stop is requested. */
#include "launch/launch.h"

#include "faulttol/faulttol.h"
#include "net/net.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Seconds the coordinator has to end by itself once every island ended. */
#define COORD_GRACE_S 3.0

typedef struct {
    char name[LOCO_NET_NAME_MAX];
    double restart_at;      /* loco_now() of a scheduled restart, 0 = none */
    int64_t restart_commit; /* or: once this outer step committed (0 = by time) */
    bool killed;            /* by a fault: its death is expected */
    bool retired;           /* the coordinator stopped once every island ended */
    bool restarted;         /* started again after an injected kill */
    pid_t pid;
    int fd;          /* its merged stdout/stderr */
    char line[4096]; /* a partial line */
    size_t len;
    int status;
    bool done;
} child;

/* Starts argv with stdout and stderr into a pipe; `restarted` marks a
 * process started again after an injected kill (it does not kill itself
 * twice). */
static int spawn(child *c, char *const *argv, bool restarted) {
    int fds[2];
    if (pipe(fds) != 0)
        return LOCO_ERR(LOCO_EIO, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return LOCO_ERR(LOCO_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0); /* its own group: a stop reaches mpirun's ranks too */
        /* A launcher that dies (SIGKILL, a test's watchdog) takes its
         * children with it: nothing of a run outlives its supervisor. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(127);
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
    /* the group from this side too: a stop right after the fork must not
     * find it missing (the child may not have run its setpgid yet) */
    setpgid(pid, pid);
    close(fds[1]);
    c->pid = pid;
    c->fd = fds[0];
    return 0;
}

/* Prints a child's complete lines with its name in front. */
static void drain(child *c, FILE *out) {
    char buf[4096];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n <= 0) {
        if (c->len) {
            fprintf(out, "[%s] %.*s\n", c->name, (int)c->len, c->line);
            c->len = 0;
        }
        close(c->fd);
        c->fd = -1;
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n' || c->len == sizeof c->line - 1) {
            fprintf(out, "[%s] %.*s\n", c->name, (int)c->len, c->line);
            c->len = 0;
        } else {
            c->line[c->len++] = buf[i];
        }
    }
    fflush(out);
}

/* The inner step at which faults.kill kills site (0 when it names none). */
static int64_t kill_step_of(const loco_config *c, const char *site) {
    char buf[LOCO_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", c->faults.kill);
    int64_t step = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@');
        if (at && (size_t)(at - tok) == strlen(site) && !strncmp(tok, site, (size_t)(at - tok)))
            step = atoll(at + 1);
    }
    return step;
}

typedef struct {
    const loco_config *cfg;
    const char *events;
    FILE *out;
    child *kids;
    int n_kids;
    int alive;
    double t_start;
    loco_run_progress prog;
    bool coord_killed, coord_kill_skipped, stopping, run_over;
    int failed;
    double islands_ended_at; /* when the last island ended (0: not yet) */
} supervisor;

/* Islands still running or coming back. */
static int islands_running(const supervisor *s) {
    int n = 0;
    for (int i = 1; i < s->n_kids; i++)
        n += !s->kids[i].done || s->kids[i].restart_at > 0 || s->kids[i].restart_commit > 0;
    return n;
}

static bool restart_pending(const child *c) { return c->restart_at > 0 || c->restart_commit > 0; }

static void cancel_restart(supervisor *s, child *c, const char *why) {
    c->restart_at = 0;
    c->restart_commit = 0;
    s->alive--;
    fprintf(s->out, "launch: %s: %s\n", c->name, why);
}

/* [faults]: the coordinator killed at a time or at a step of the run,
 * never after the run ended. */
static void maybe_kill_coordinator(supervisor *s, double now) {
    const loco_config *c = s->cfg;
    child *co = &s->kids[0];
    if (s->stopping || s->coord_killed || s->coord_kill_skipped || co->done)
        return;
    const bool by_time = c->faults.coordinator_kill_s > 0 &&
                         now - s->t_start >= c->faults.coordinator_kill_s;
    const bool by_step = c->faults.coordinator_kill_step > 0 &&
                         s->prog.committed >= loco_faults_commit_at(c, c->faults.coordinator_kill_step);
    if (!by_time && !by_step)
        return;
    if (s->prog.ended || s->run_over || islands_running(s) == 0) {
        s->coord_kill_skipped = true;
        fprintf(s->out, "launch: faults: the coordinator's kill fell due after the run ended; "
                        "not injected\n");
        return;
    }
    s->coord_killed = true;
    co->killed = true;
    fprintf(s->out, "launch: faults: killing the coordinator (SIGKILL)\n");
    loco_event_append(s->events, "\"kind\":\"fault\",\"fault\":\"kill_coordinator\","
                                 "\"site\":\"coordinator\",\"detail\":\"SIGKILL %s\"",
                      by_step ? "at a step of the run" : "at a time");
    kill(-co->pid, SIGKILL);
}

static void restart(supervisor *s, loco_launch_plan *plan, int i) {
    child *c = &s->kids[i];
    c->restart_at = 0;
    c->restart_commit = 0;
    c->done = false;
    c->killed = false;
    c->len = 0;
    const bool coord = i == 0;
    fprintf(s->out, "launch: faults: restarting %s\n", c->name);
    loco_event_append(s->events, "\"kind\":\"fault\",\"fault\":\"%s\",\"site\":\"%s\"",
                      coord ? "restart_coordinator" : "restart", c->name);
    c->restarted = true;
    if ((!coord && loco_launch_plan_add_resume(plan, i) < 0) ||
        spawn(c, loco_launch_plan_argv(plan, i), true) < 0) {
        s->failed = 1;
        c->done = true;
        s->alive--;
    }
}

/* Scheduled restarts that are due, and those that no longer can be. */
static void restarts(supervisor *s, loco_launch_plan *plan, double now) {
    for (int i = 0; i < s->n_kids; i++) {
        child *c = &s->kids[i];
        if (!c->done || !restart_pending(c))
            continue;
        if (s->stopping) {
            c->restart_at = c->restart_commit = 0;
            s->alive--;
            continue;
        }
        if (i > 0 && (s->run_over || s->prog.ended)) {
            cancel_restart(s, c, "the run finished before it could restart");
            continue;
        }
        if (i == 0 && islands_running(s) == 0) {
            cancel_restart(s, c, "every island has ended; not restarted");
            continue;
        }
        /* By progress: once the others are far enough, or at once when no
         * island is left to make any. */
        const bool due = c->restart_commit > 0
                             ? s->prog.committed >= c->restart_commit || islands_running(s) <= 1
                             : now >= c->restart_at;
        if (due)
            restart(s, plan, i);
    }
}

/* A process that ended: expected (an injected kill), the end of the run,
 * or a failure. */
static void ended(supervisor *s, int i, int st) {
    const loco_config *cfg = s->cfg;
    child *c = &s->kids[i];
    c->done = true;
    c->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    s->alive--;
    /* mpirun reports a rank killed by SIGKILL as exit status 137. */
    bool sigkill = (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) ||
                   (WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL);
    if (i > 0 && sigkill && cfg->faults.kill[0] && !s->stopping) {
        /* An island that killed itself as [faults] said (it wrote the
         * event itself). */
        c->killed = true;
        const int64_t after = cfg->faults.restart_after_steps;
        if (after > 0) {
            loco_run_progress_read(&s->prog, s->events);
            int64_t from = kill_step_of(cfg, c->name);
            c->restart_commit = loco_faults_commit_at(cfg, from + after);
            if (c->restart_commit <= s->prog.committed)
                c->restart_commit = s->prog.committed + 1;
            s->alive++;
        } else if (cfg->faults.restart_ms >= 0) {
            c->restart_at = loco_now() + cfg->faults.restart_ms / 1e3;
            s->alive++; /* it comes back */
        }
        if (after > 0)
            fprintf(s->out, "launch: faults: %s was killed; it restarts once outer step %lld "
                            "commits\n", c->name, (long long)c->restart_commit);
        else
            fprintf(s->out, "launch: faults: %s was killed%s\n", c->name,
                    cfg->faults.restart_ms >= 0 ? "; it restarts shortly" : "");
    } else if (i == 0 && c->killed && !c->retired && !s->stopping) {
        c->restart_at = loco_now() + cfg->faults.coordinator_restart_ms / 1e3;
        s->alive++;
    } else if (i == 0 && (c->status == 0 || c->killed)) {
        s->run_over = s->run_over || c->status == 0;
    } else if (i > 0 && c->status != 0 && s->run_over && c->restarted) {
        /* Restarted too late to rejoin: the run is complete without it. */
        c->killed = true;
        fprintf(s->out, "launch: %s came back after the run finished\n", c->name);
    } else if (c->status != 0 && !s->stopping) {
        fprintf(s->out, "launch: %s exited with status %d\n", c->name, c->status);
        s->failed = 1;
    }
}

/* Every island ended: the coordinator has nothing left to coordinate. A
 * restart still due is dropped, a live one gets COORD_GRACE_S to end by
 * itself (its final word to the islands), then SIGTERM. */
static void coordinator_after_islands(supervisor *s, double now) {
    child *co = &s->kids[0];
    if (islands_running(s) > 0) {
        s->islands_ended_at = 0;
        return;
    }
    if (!s->islands_ended_at)
        s->islands_ended_at = now;
    if (co->done && restart_pending(co)) {
        cancel_restart(s, co, "every island has ended; not restarted");
        return;
    }
    if (!co->done && !co->killed && !s->stopping && now - s->islands_ended_at >= COORD_GRACE_S) {
        fprintf(s->out, "launch: every island has ended; stopping the coordinator\n");
        co->killed = co->retired = true; /* its end is ours, not a failure */
        kill(-co->pid, SIGTERM);
    }
}

int loco_launch_supervise(loco_launch_plan *plan, const loco_config *c, const char *events,
                          FILE *out, volatile sig_atomic_t *stop, bool *ok) {
    const loco_config cfg = *c;
    int rc = 0;
    child kids[LOCO_MAX_ISLANDS + 1];
    memset(kids, 0, sizeof kids);
    supervisor s = {.cfg = &cfg, .events = events, .out = out, .kids = kids,
                    .t_start = loco_now()};
    for (int i = 0; i < loco_launch_plan_count(plan) && rc == 0; i++) {
        child *ch = &kids[s.n_kids];
        snprintf(ch->name, sizeof ch->name, "%s", loco_launch_plan_name(plan, i));
        rc = spawn(ch, loco_launch_plan_argv(plan, i), false);
        if (rc == 0)
            s.n_kids++;
    }
    s.alive = s.n_kids;
    s.failed = rc < 0;
    s.stopping = rc < 0;
    while (s.alive > 0) {
        if (((stop && *stop) || s.failed) && !s.stopping) {
            s.stopping = true;
            fprintf(out, "launch: stopping every process\n");
            for (int i = 0; i < s.n_kids; i++)
                if (!kids[i].done)
                    kill(-kids[i].pid, SIGTERM);
        }
        struct pollfd pf[LOCO_MAX_ISLANDS + 1];
        int map[LOCO_MAX_ISLANDS + 1], np = 0;
        for (int i = 0; i < s.n_kids; i++)
            if (kids[i].fd >= 0) {
                pf[np] = (struct pollfd){.fd = kids[i].fd, .events = POLLIN};
                map[np++] = i;
            }
        if (np > 0 && poll(pf, (nfds_t)np, 200) > 0)
            for (int j = 0; j < np; j++)
                if (pf[j].revents)
                    drain(&kids[map[j]], out);
        if (np == 0)
            loco_sleep_ms(50); /* only processes without output left: reap them */
        loco_run_progress_read(&s.prog, events);
        const double now = loco_now();
        maybe_kill_coordinator(&s, now);
        for (int i = 0; i < s.n_kids; i++) {
            child *k = &kids[i];
            int st;
            if (!k->done && k->fd < 0 && waitpid(k->pid, &st, WNOHANG) == k->pid)
                ended(&s, i, st);
        }
        restarts(&s, plan, now);
        coordinator_after_islands(&s, now);
    }
    int worst = 0;
    for (int i = 0; i < s.n_kids; i++)
        if (kids[i].status && !kids[i].killed)
            worst = kids[i].status;
    const bool bad = s.failed || worst || (stop && *stop);
    loco_event_append(events, "\"kind\":\"launch_end\",\"status\":\"%s\"",
                      bad ? "failed" : "finished");
    fprintf(out, "launch: %s\n", bad ? "FAILED" : "done: every process finished cleanly");
    *ok = !bad;
    return rc;
}

int loco_launch_baseline(loco_launch_plan *p, const char *self, const char *dir, FILE *out) {
    if (loco_launch_run_finished(dir)) {
        fprintf(out, "launch: reusing the fault-free baseline in %s\n", dir);
        return 0;
    }
    fprintf(out, "launch: fault-free baseline of the same config and seed first, in %s\n", dir);
    fflush(out);
    char *const *av = loco_launch_plan_baseline(p, dir);
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

int loco_launch_certs(const loco_launch_plan *p, const loco_config *cfg) {
    if (!cfg->net.tls || cfg->net.cert[0])
        return 0;
    char certs[LOCO_PATH_MAX + 16];
    snprintf(certs, sizeof certs, "%s/certs", cfg->run.dir);
    const int n = loco_launch_plan_count(p);
    const char *names[LOCO_MAX_ISLANDS + 1];
    for (int k = 0; k < n; k++)
        names[k] = loco_launch_plan_name(p, k);
    return loco_net_make_certs_run(certs, names, n, 30, cfg->net.run_id);
}

int loco_launch_start(const loco_launch_plan *p, const loco_config *cfg, const char *config,
                      const char *events) {
    unlink(events); /* a new timeline (a baseline inside keeps its own) */
    char journal[LOCO_PATH_MAX + 32];
    snprintf(journal, sizeof journal, "%s/decisions.log", cfg->run.dir);
    unlink(journal); /* and a new run: no decisions of an earlier one */
    char list[LOCO_MAX_ISLANDS * 72] = "";
    size_t o = 0;
    for (int k = 1; k < loco_launch_plan_count(p); k++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s\"%s\"", k > 1 ? "," : "",
                              loco_launch_plan_name(p, k));
    char *planned = loco_faults_plan_json(cfg);
    loco_event_append(events,
                      "\"kind\":\"start\",\"sites\":[%s],\"config\":\"%s\",\"seed\":%lld,"
                      "\"planned\":%s",
                      list, config, (long long)cfg->train.seed, planned ? planned : "[]");
    free(planned);
    return 0;
}
