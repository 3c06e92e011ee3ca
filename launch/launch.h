/* launch/: `loco launch`'s plan of processes (launch/launch.c) and their
 * supervision (launch/launch_run.c). It reads configs and run directories
 * and calls down (outer, faulttol, net, core); nothing below includes it. */
#ifndef LOCO_LAUNCH_H
#define LOCO_LAUNCH_H

#include "core/core.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

/* The plan of `loco launch` (launch/launch.c): the coordinator and one
 * island per site of outer.sites on this machine, their argv, and the
 * fault-free baseline's. The caller supervises the processes. */
#define LOCO_LAUNCH_MAX_SETS 256
typedef struct {
    const char *self;   /* the loco binary */
    const char *config; /* CONFIG as given (may be NULL only with sets) */
    char *const *sets;  /* the --set values as given, in order */
    int nsets;
    bool resume_all;    /* `launch --resume`: islands with a checkpoint resume */
} loco_launch_args;
typedef struct loco_launch_plan loco_launch_plan;

/* Plans process 0, `SELF coordinator CONFIG --set ...`, and processes
 * 1..K, `[mpirun --allow-run-as-root --oversubscribe --mca orte_tmpdir_base
 * DIR -np N] SELF island CONFIG --site S --set ...` (mpirun when the mesh
 * dp*tp*pp*cp*ep = N > 1; DIR a fresh session directory the plan removes
 * when destroyed). After the caller's sets each gets
 * faulttol.coordinator=HOST:PORT; with net.tls and no net.cert, the
 * certificate, key and CA under run.dir/certs named after the process;
 * islands also run.dir=RUN_DIR/S, run.metrics_addr=HOST:0 when
 * run.metrics_addr is set, and with resume_all --resume RUN_DIR/S when that
 * holds a checkpoint. The plan keeps pointers to a's strings. LOCO_EINVAL
 * for a port outside 1..65535, too many sets or a bad outer.sites;
 * LOCO_EIO when no session directory can be made. */
int loco_launch_plan_create(loco_launch_plan **out, const loco_config *cfg,
                            const loco_launch_args *a, const char *coord_host, int coord_port);
void loco_launch_plan_destroy(loco_launch_plan *p); /* accepts NULL */
int loco_launch_plan_count(const loco_launch_plan *p); /* 1 + K */
/* Process i's name ("coordinator", then the sites) and NULL-terminated
 * argv, valid until the plan is destroyed; NULL outside 0..count-1. */
const char *loco_launch_plan_name(const loco_launch_plan *p, int i);
char *const *loco_launch_plan_argv(const loco_launch_plan *p, int i);
/* Island i (1..K) restarted after a kill resumes from its own newest
 * valid checkpoint: appends --resume RUN_DIR/SITE when that directory
 * holds a ckpt_N and the argv has no --resume yet (else changes nothing).
 * LOCO_EINVAL for the coordinator or an index outside the plan. */
int loco_launch_plan_add_resume(loco_launch_plan *p, int i);
/* The fault-free run of the same config and seed in dir: `SELF launch
 * CONFIG --set ... --set faults.X=<off>... --set run.dir=DIR
 * --no-baseline`; valid until the next call or the plan's destruction. */
char *const *loco_launch_plan_baseline(loco_launch_plan *p, const char *dir);

/* Runs the plan's fault-free baseline in dir (loco_launch_plan_baseline,
 * SELF being the loco binary) to its end, saying so on out; reuses a
 * finished one already there. LOCO_EPEER when it did not finish cleanly. */
int loco_launch_baseline(loco_launch_plan *p, const char *self, const char *dir, FILE *out);
/* The run's certificates in cfg's run.dir/certs, one per process of the
 * plan (when net.tls and no net.cert was given; nothing otherwise). */
int loco_launch_certs(const loco_launch_plan *p, const loco_config *cfg);
/* A new timeline at events for this run: its start event names the
 * islands, the config file, the seed and the planned faults. */
int loco_launch_start(const loco_launch_plan *p, const loco_config *cfg, const char *config,
                      const char *events);

/* Starts every process of the plan (each in a process group of its own,
 * stdout and stderr merged) and supervises them until all are done,
 * writing each one's lines to out as "[NAME] line" and its own notes as
 * "launch: ...". [faults] of cfg: the coordinator is SIGKILLed after
 * coordinator_kill_s, or once the run committed the outer step of
 * coordinator_kill_step, and restarted after coordinator_restart_ms; an
 * island that died of SIGKILL (faults.kill) restarts after restart_ms (>=
 * 0), or once the others committed restart_after_steps past its kill
 * step, with LOCO_RESTARTED=1, resuming from its checkpoint
 * (loco_launch_plan_add_resume); fault events go to events, and the run's
 * progress is read from there too. Nothing due after the run ended is
 * done (it is said on out). Once every island has ended, the coordinator
 * gets a few seconds to end too, then SIGTERM: launch never waits on a
 * coordinator that has no run left. When a process fails, or *stop (may
 * be NULL; a signal handler's flag) becomes nonzero, every process group
 * gets SIGTERM. Appends the launch_end event. *ok:
 * every process finished cleanly (expected deaths aside) and no stop was
 * asked. A process that could not be started: its error, after the others
 * were stopped and reaped. */
int loco_launch_supervise(loco_launch_plan *plan, const loco_config *cfg, const char *events,
                          FILE *out, volatile sig_atomic_t *stop, bool *ok);
/* Whether dir holds a checkpoint ckpt_N (which one to resume from, the
 * island chooses: loco_ckpt_pick_resume). */
bool loco_launch_has_ckpt(const char *dir);
/* Whether dir's events.jsonl records the run's end with status finished. */
bool loco_launch_run_finished(const char *dir);
/* A free TCP port on the loopback in *port (bound and released: a small
 * race); LOCO_EIO when none. */
int loco_launch_free_port(int *port);

#endif /* LOCO_LAUNCH_H */
