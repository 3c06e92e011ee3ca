/* Supervising the processes of a launch plan (outer/launch.c): each started
 * in a process group of its own with its output merged, line by line, into
 * one stream under its name; [faults] kills and restarts as the config
 * says; every process stopped when one fails or a stop is requested. */
#include "outer/outer.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    char name[LOCO_NET_NAME_MAX];
    double restart_at; /* loco_now() of a scheduled restart, 0 = none */
    bool killed;       /* by a fault: its death is expected */
    bool restarted;    /* started again after an injected kill */
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

int loco_launch_supervise(loco_launch_plan *plan, const loco_config *c, const char *events,
                          FILE *out, volatile sig_atomic_t *stop, bool *ok) {
    const loco_config cfg = *c;
    int rc = 0;
    const double t_start = loco_now();
    bool coord_killed = false, run_over = false;
    child kids[LOCO_MAX_ISLANDS + 1];
    memset(kids, 0, sizeof kids);
    int n_kids = 0;
    for (int i = 0; i < loco_launch_plan_count(plan) && rc == 0; i++) {
        child *ch = &kids[n_kids];
        snprintf(ch->name, sizeof ch->name, "%s", loco_launch_plan_name(plan, i));
        rc = spawn(ch, loco_launch_plan_argv(plan, i), false);
        if (rc == 0)
            n_kids++;
    }
    int failed = rc < 0;
    bool stopping = rc < 0;
    for (int alive = n_kids; alive > 0;) {
        if (((stop && *stop) || failed) && !stopping) {
            stopping = true;
            fprintf(out, "launch: stopping every process\n");
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
                    drain(&kids[map[j]], out);
        /* [faults]: the coordinator killed at a time, and restarted. */
        double now = loco_now();
        if (!stopping && !coord_killed && cfg.faults.coordinator_kill_s > 0 &&
            now - t_start >= cfg.faults.coordinator_kill_s && !kids[0].done) {
            coord_killed = true;
            kids[0].killed = true;
            fprintf(out, "launch: faults: killing the coordinator (SIGKILL)\n");
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
                fprintf(out, "launch: the run finished before %s could restart\n", c->name);
            }
            if (c->done && c->restart_at > 0 && now >= c->restart_at && !stopping) {
                c->restart_at = 0;
                c->done = false;
                c->killed = false;
                c->len = 0;
                bool coord = i == 0;
                fprintf(out, "launch: faults: restarting %s\n", c->name);
                loco_event_append(events, "\"kind\":\"fault\",\"fault\":\"%s\",\"site\":\"%s\"",
                                  coord ? "restart_coordinator" : "restart", c->name);
                c->restarted = true;
                if ((!coord && loco_launch_plan_add_resume(plan, i) < 0) ||
                    spawn(c, loco_launch_plan_argv(plan, i), true) < 0) {
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
                    fprintf(out, "launch: faults: %s was killed%s\n", c->name,
                            cfg.faults.restart_ms >= 0 ? "; it restarts shortly" : "");
                } else if (i == 0 && c->killed && !stopping) {
                    c->restart_at = loco_now() + cfg.faults.coordinator_restart_ms / 1e3;
                    alive++;
                } else if (i == 0 && c->status == 0) {
                    run_over = true;
                } else if (i > 0 && c->status != 0 && run_over && c->restarted) {
                    /* Restarted too late to rejoin: the run is complete without it. */
                    c->killed = true;
                    fprintf(out, "launch: %s came back after the run finished\n", c->name);
                } else if (c->status != 0 && !stopping) {
                    fprintf(out, "launch: %s exited with status %d\n", c->name, c->status);
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
                      failed || worst || (stop && *stop) ? "failed" : "finished");
    fprintf(out, "launch: %s\n",
            failed || worst || (stop && *stop) ? "FAILED" : "done: every process finished cleanly");
    *ok = !(failed || worst || (stop && *stop));
    return rc;
}
