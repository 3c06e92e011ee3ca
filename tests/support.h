/* Helpers shared by the tests that drive build/loco as a user would. */
#ifndef LOCO_TESTS_SUPPORT_H
#define LOCO_TESTS_SUPPORT_H

#include "inner/model/model.h"

#include <criterion/criterion.h>
#include <criterion/options.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Commands started by tests run under a deadline: a hung process must fail
 * its test with its output, not outlive it. Criterion's own timeout kills
 * only the test process; what it started would survive, holding the
 * runner's output pipe open (tests/run.sh ends regardless, see there). */

#define TEST_RUN_TIMED_OUT (-2)  /* test_run_deadline: the deadline passed */
#define TEST_RUN_DEFAULT_S 600.0 /* a command's limit in a test without a timeout */
#define TEST_RUN_MARGIN_S 5.0    /* left of a test's timeout at least, ... */
#define TEST_RUN_MARGIN_FRAC 0.1 /* ... or this much of it */
#define TEST_RUN_GRACE_S 3.0     /* SIGTERM to SIGKILL: loco launch stops its children */
#define TEST_RUN_TAIL 8192       /* output shown with a timeout */
#define TEST_RUN_MAX_PROCS 1024  /* descendants tracked for the stop */

static inline double test__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* A process as /proc/PID/stat shows it. */
typedef struct {
    pid_t pid, ppid, pgrp;
    unsigned long long start; /* clock ticks after boot: tells it from a later one with its pid */
} test__proc;

/* pid's /proc/PID/stat into *p; false when it is gone or a zombie (dead
 * for our purposes: a slow init may take seconds to reap orphans). */
static inline bool test__proc_stat(pid_t pid, test__proc *p) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    const bool got = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    /* the name in parentheses may hold spaces: fields count from its end */
    char *at = got ? strrchr(buf, ')') : NULL;
    if (!at)
        return false;
    p->pid = pid;
    char *save = NULL, *tok = strtok_r(at + 1, " ", &save);
    for (int field = 3; tok; field++, tok = strtok_r(NULL, " ", &save)) {
        if (field == 3 && (tok[0] == 'Z' || tok[0] == 'X'))
            return false;
        if (field == 4)
            p->ppid = (pid_t)atoi(tok);
        if (field == 5)
            p->pgrp = (pid_t)atoi(tok);
        if (field == 22) {
            p->start = strtoull(tok, NULL, 10);
            return true;
        }
    }
    return false;
}

/* Every live process, up to cap, into all; returns how many. */
static inline int test__procs(test__proc *all, int cap) {
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; n < cap && (e = readdir(d));) {
        const pid_t pid = (pid_t)atoi(e->d_name);
        if (pid > 0 && test__proc_stat(pid, &all[n]))
            n++;
    }
    closedir(d);
    return n;
}

/* Seconds since this process started: Criterion starts a process per test
 * and counts its timeout from there. */
static inline double test__elapsed_s(void) {
    static double start = -1;
    if (start < 0) {
        test__proc me;
        start =
            test__proc_stat(getpid(), &me) ? me.start / (double)sysconf(_SC_CLK_TCK) : test__now();
    }
    return test__now() - start;
}

/* The timeout of a test's or suite's data, which a Criterion worker holds
 * at an unaligned address (UBSan objects to a plain load). */
static inline double test__timeout_of(const struct criterion_test_extra_data *data) {
    double t;
    memcpy(&t, (const char *)data + offsetof(struct criterion_test_extra_data, timeout), sizeof t);
    return t;
}

/* How long a command started now may run: what is left of the current
 * test's Criterion timeout (the test's own, else its suite's, else
 * --timeout) less a margin, so the harness stops it and reports its output
 * before Criterion kills the test. LOCO_TEST_CMD_TIMEOUT_S caps it, and is
 * the limit in a test without a timeout (else TEST_RUN_DEFAULT_S). At
 * least one second. */
static inline double test_cmd_timeout_s(void) {
    double limit = TEST_RUN_DEFAULT_S;
    const char *env = getenv("LOCO_TEST_CMD_TIMEOUT_S");
    if (env && strtod(env, NULL) > 0)
        limit = strtod(env, NULL);
    double t = 0;
    if (criterion_current_test && criterion_current_test->data)
        t = test__timeout_of(criterion_current_test->data);
    if (t <= 0 && criterion_current_suite && criterion_current_suite->data)
        t = test__timeout_of(criterion_current_suite->data);
    if (t <= 0)
        t = criterion_options.timeout;
    if (t > 0) {
        const double left =
            t - fmax(TEST_RUN_MARGIN_S, TEST_RUN_MARGIN_FRAC * t) - test__elapsed_s();
        limit = fmin(limit, left);
    }
    return fmax(limit, 1);
}

/* Keeps the last cap-1 bytes of a stream in buf (*len of them so far). */
static inline void test__keep_tail(char *buf, size_t cap, size_t *len, const char *p, size_t n) {
    const size_t keep = cap - 1, skip = n > keep ? n - keep : 0;
    n -= skip;
    if (*len + n > keep) {
        const size_t drop = *len + n - keep;
        memmove(buf, buf + drop, *len - drop);
        *len -= drop;
    }
    memcpy(buf + *len, p + skip, n);
    *len += n;
}

/* Adds to set[n..cap) the live processes below root by parent links (those
 * that left its process group too, as loco launch's children do); returns
 * the new count. */
static inline int test__descendants(pid_t root, test__proc *set, int n, int cap) {
    static test__proc all[4 * TEST_RUN_MAX_PROCS];
    const int n_all = test__procs(all, 4 * TEST_RUN_MAX_PROCS);
    /* below root: its parent is root or below root */
    for (bool grew = true; grew;) {
        grew = false;
        for (int i = 0; i < n_all && n < cap; i++) {
            bool known = false, below = all[i].ppid == root;
            for (int j = 0; j < n && !known; j++) {
                known = set[j].pid == all[i].pid && set[j].start == all[i].start;
                below = below || set[j].pid == all[i].ppid;
            }
            if (below && !known) {
                set[n++] = all[i];
                grew = true;
            }
        }
    }
    return n;
}

/* Whether a live process of group pgid, or one of set[0..n), is left. */
static inline bool test__any_left(pid_t pgid, const test__proc *set, int n) {
    static test__proc all[4 * TEST_RUN_MAX_PROCS];
    const int n_all = test__procs(all, 4 * TEST_RUN_MAX_PROCS);
    for (int i = 0; i < n_all; i++) {
        if (all[i].pgrp == pgid)
            return true;
        for (int j = 0; j < n; j++)
            if (set[j].pid == all[i].pid && set[j].start == all[i].start)
                return true;
    }
    return false;
}

/* Where a command's output goes: the first cap-1 bytes to out, the last
 * tail_cap-1 to tail (when not NULL). */
typedef struct {
    char *out, *tail;
    size_t cap, len, tail_cap, tail_len;
} test__sink;

/* Reads what fd has, waiting up to ms for it, into s: 1 when it read
 * something, 0 when nothing came, -1 at EOF. */
static inline int test__read(int fd, test__sink *s, int ms) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, ms > 0 ? ms : 0) <= 0)
        return 0;
    char buf[4096];
    const ssize_t got = read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR)
        return 0;
    if (got <= 0)
        return -1;
    const size_t room = s->cap - 1 - s->len, take = (size_t)got < room ? (size_t)got : room;
    memcpy(s->out + s->len, buf, take);
    s->len += take;
    if (s->tail)
        test__keep_tail(s->tail, s->tail_cap, &s->tail_len, buf, (size_t)got);
    return 1;
}

/* Stops the command pid (its process group's leader; reaped already or
 * not) at its deadline: SIGTERM to the group and to every process below pid
 * (loco launch's children have groups of their own), TEST_RUN_GRACE_S to
 * end, then SIGKILL to the group and to every process found below pid
 * meanwhile. What they print while stopping goes on into s. Reaps pid. */
static inline void test__stop(pid_t pid, bool reaped, int fd, test__sink *s) {
    static test__proc set[TEST_RUN_MAX_PROCS];
    int n = reaped ? 0 : test__descendants(pid, set, 0, TEST_RUN_MAX_PROCS);
    kill(-pid, SIGTERM);
    for (int i = 0; i < n; i++)
        kill(set[i].pid, SIGTERM);
    bool left = true, more = true;
    for (const double end = test__now() + TEST_RUN_GRACE_S; left && test__now() < end;) {
        if (!more || !(more = test__read(fd, s, 20) >= 0))
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        reaped = reaped || waitpid(pid, NULL, WNOHANG) == pid;
        if (!reaped)
            n = test__descendants(pid, set, n, TEST_RUN_MAX_PROCS);
        left = test__any_left(pid, set, n);
    }
    if (left) {
        kill(-pid, SIGKILL);
        for (int i = 0; i < n; i++) {
            test__proc now;
            if (test__proc_stat(set[i].pid, &now) && now.start == set[i].start)
                kill(set[i].pid, SIGKILL);
        }
    }
    /* what is in the pipe already; a writer that escaped must not keep us */
    for (int i = 0; more && i < 256 && test__read(fd, s, 0) > 0; i++)
        ;
    if (!reaped)
        waitpid(pid, NULL, 0);
}

/* Runs `sh -c cmd` in a process group of its own, stdin from /dev/null,
 * stdout and stderr into one pipe, for at most `seconds`. out gets the
 * first cap-1 bytes of the output, tail (when not NULL) the last
 * tail_cap-1, both NUL-terminated (NUL bytes in tail shown as '?'); the
 * rest is read and dropped, so the command never dies of SIGPIPE. Returns
 * the exit status, -1 when a signal ended it, or TEST_RUN_TIMED_OUT when
 * the output did not end or the command did not exit by the deadline: then
 * its group and the processes below it are stopped (test__stop) before the
 * return, and tail holds what they printed meanwhile too. Asserts only on a
 * failed pipe or fork. */
static inline int test_run_deadline(char *out, size_t cap, char *tail, size_t tail_cap,
                                    double seconds, const char *cmd) {
    const double end = test__now() + seconds;
    int fds[2];
    const int piped = pipe2(fds, O_CLOEXEC);
    cr_assert_eq(piped, 0, "pipe: %s", strerror(errno));
    const pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
        dup2(null, 0);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* the group from this side too: a stop right after the fork must find it */
    setpgid(pid, pid);
    close(fds[1]);
    test__sink s = {.out = out, .cap = cap, .tail = tail, .tail_cap = tail_cap};
    bool more = true;
    while (more && test__now() < end)
        more = test__read(fds[0], &s, (int)ceil((end - test__now()) * 1e3)) >= 0;
    int status = 0;
    bool exited = false;
    for (int ms = 1; !(exited = waitpid(pid, &status, WNOHANG) == pid) && test__now() < end;
         ms = ms < 50 ? 2 * ms : ms)
        nanosleep(&(struct timespec){0, ms * 1000 * 1000}, NULL);
    int rc = exited ? (WIFEXITED(status) ? WEXITSTATUS(status) : -1) : TEST_RUN_TIMED_OUT;
    if (!exited || more) {
        if (exited && tail) {
            char note[160];
            snprintf(note, sizeof note,
                     "\n[test_run: sh exited (status %d); a process it started kept the output "
                     "open]\n",
                     rc);
            test__keep_tail(tail, tail_cap, &s.tail_len, note, strlen(note));
        }
        test__stop(pid, exited, fds[0], &s);
        rc = TEST_RUN_TIMED_OUT;
    }
    close(fds[0]);
    out[s.len] = '\0';
    for (size_t i = 0; tail && i < s.tail_len; i++)
        tail[i] = tail[i] ? tail[i] : '?';
    if (tail)
        tail[s.tail_len] = '\0';
    return rc;
}

/* The failure message of a command that ran past its deadline: the
 * command and the last part of its output (tail). */
static inline void test_run_timeout_message(char *msg, size_t cap, double seconds, const char *cmd,
                                            const char *tail) {
    snprintf(msg, cap, "timed out after %.0f s: %s\n--- its last output ---\n%s", seconds, cmd,
             tail);
}

/* test_run_deadline on a formatted command, out getting the first bytes
 * of its output (the last with keep_tail), asserting that it ended in time
 * (the failure carries the last TEST_RUN_TAIL bytes of output). */
static inline int test__vrun(char *out, size_t cap, bool keep_tail, double seconds, const char *fmt,
                             va_list ap) {
    static char cmd[8192], head[256], tail[TEST_RUN_TAIL], msg[sizeof cmd + (1 << 16)];
    const int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    cr_assert_lt(n, (int)sizeof cmd, "command too long: %s...", cmd);
    const int rc = keep_tail ? test_run_deadline(head, sizeof head, out, cap, seconds, cmd)
                             : test_run_deadline(out, cap, tail, sizeof tail, seconds, cmd);
    if (rc == TEST_RUN_TIMED_OUT) {
        test_run_timeout_message(msg, sizeof msg, seconds, cmd, keep_tail ? out : tail);
        cr_assert_fail("%s", msg);
    }
    return rc;
}

/* Runs a shell command (formatted), capturing stdout and stderr together
 * into out; returns its exit status (-1 when it did not exit). Fails the
 * test when it runs past test_cmd_timeout_s(). */
__attribute__((format(printf, 3, 4))) static inline int test_run(char *out, size_t cap,
                                                                 const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = test__vrun(out, cap, false, test_cmd_timeout_s(), fmt, ap);
    va_end(ap);
    return rc;
}

/* test_run with a deadline of its own, in seconds. */
__attribute__((format(printf, 4, 5))) static inline int
test_run_timeout(char *out, size_t cap, double seconds, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = test__vrun(out, cap, false, seconds, fmt, ap);
    va_end(ap);
    return rc;
}

/* test_run keeping the last cap-1 bytes of the output (where a tally or an
 * error ends a long log). */
__attribute__((format(printf, 3, 4))) static inline int test_run_tail(char *out, size_t cap,
                                                                      const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int rc = test__vrun(out, cap, true, test_cmd_timeout_s(), fmt, ap);
    va_end(ap);
    return rc;
}

/* A new directory /tmp/NAME-XXXXXX; free() the returned path. */
static inline char *test_tmpdir(const char *name) {
    char *d = malloc(strlen(name) + 16);
    cr_assert(d);
    sprintf(d, "/tmp/%s-XXXXXX", name);
    cr_assert(mkdtemp(d), "mkdtemp %s", d);
    return d;
}

/* OpenMPI 4 jobs started at the same moment race to create their shared
 * session directory ("mkdir ... File exists", open-mpi/ompi#8510): the
 * mpiruns of this test process get theirs under dir (keep it short: PMIx
 * puts its sockets there). */
static inline void test_mpi_session_dir(const char *dir) {
    setenv("OMPI_MCA_orte_tmpdir_base", dir, 1);
}

/* Whether mpirun is on the PATH (multi-rank tests skip without it). */
static inline bool test_have_mpirun(void) {
    return system("command -v mpirun >/dev/null 2>&1") == 0;
}

/* Losses of steps 1..steps from a run's metrics.jsonl into loss[1..steps]
 * (0 where absent). */
static inline void test_read_losses(const char *run_dir, double *loss, int steps) {
    char path[4096];
    cr_assert(snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir) < (int)sizeof path);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    char line[1024];
    memset(loss, 0, sizeof(double) * (size_t)(steps + 1));
    while (fgets(line, sizeof line, f)) {
        int step;
        double l;
        char *p = strstr(line, "\"loss\":");
        if (sscanf(line, "{\"step\":%d", &step) == 1 && p && sscanf(p, "\"loss\":%lf", &l) == 1 &&
            step >= 1 && step <= steps)
            loss[step] = l;
    }
    fclose(f);
}

/* The losses got[from .. to] equal ref's within 1e-5 relative (the
 * parallel tests' definition of "the same curve"); `what` names the run. */
static inline void test_expect_losses(const double *got, const double *ref, int from, int to,
                                      const char *what) {
    for (int s = from; s <= to; s++)
        cr_expect(fabs(got[s] - ref[s]) <= 1e-5 * fabs(ref[s]),
                  "%s, step %d: loss %.9g, one rank %.9g", what, s, got[s], ref[s]);
}

/* How far two Hugging Face layout model files (DIR/model.safetensors:
 * exported or single-rank checkpoints of the model mc) are apart:
 * *l2 = ||a - b|| / ||b|| over every parameter, *worst = max |a - b| /
 * max |b|. Shapes must agree. */
static inline void test_model_diff(const loco_gpt_config *mc, const char *a_dir,
                                   const char *b_dir, double *l2, double *worst) {
    loco_ttable tt;
    cr_assert_eq(loco_gpt_build_table(&tt, mc), 0);
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/model.safetensors", a_dir);
    snprintf(pb, sizeof pb, "%s/model.safetensors", b_dir);
    loco_st *a, *b;
    cr_assert_eq(loco_st_open(&a, pa), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_st_open(&b, pb), 0, "%s", loco_errmsg());
    double maxd = 0, maxr = 0, dd = 0, bb = 0;
    for (int t = 0; t < tt.n; t++) {
        const float *fa, *fb;
        int64_t sa[LOCO_TENSOR_MAX_DIM], sb[LOCO_TENSOR_MAX_DIM];
        int na, nb;
        cr_assert_eq(loco_st_get(a, tt.t[t].name, &fa, &na, sa), 0, "%s", tt.t[t].name);
        cr_assert_eq(loco_st_get(b, tt.t[t].name, &fb, &nb, sb), 0, "%s", tt.t[t].name);
        cr_assert(na == nb && sa[0] == sb[0], "%s: shapes differ", tt.t[t].name);
        for (size_t i = 0; i < tt.t[t].numel; i++) {
            const double d = (double)fa[i] - fb[i];
            maxd = fmax(maxd, fabs(d));
            maxr = fmax(maxr, fabs((double)fb[i]));
            dd += d * d;
            bb += (double)fb[i] * fb[i];
        }
    }
    loco_st_close(a);
    loco_st_close(b);
    loco_ttable_fini(&tt);
    *l2 = sqrt(dd / bb);
    *worst = maxd / maxr;
}

/* A multi-rank run DIR/RUN against the single rank DIR/ref on the same
 * global batch: the losses of steps 1..steps within 1e-5 relative, and its
 * last checkpoint (ckpt_STEPS), exported to the Hugging Face layout in
 * DIR/export, holds ref's parameters: relative L2 <= 1e-5 and largest
 * element <= 1e-4 of the largest parameter (AdamW amplifies the rounding
 * of the few elements whose moments nearly cancel; a real error moves
 * elements by the learning rate in one step). `what` names the run. */
static inline void test_expect_like_reference(const loco_gpt_config *mc, const char *dir,
                                              const char *run, int steps, const char *what) {
    double *got = calloc((size_t)steps + 1, sizeof *got);
    double *ref = calloc((size_t)steps + 1, sizeof *ref);
    cr_assert(got && ref);
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", dir, run);
    snprintf(b, sizeof b, "%s/ref", dir);
    test_read_losses(a, got, steps);
    test_read_losses(b, ref, steps);
    test_expect_losses(got, ref, 1, steps, what);
    free(got);
    free(ref);
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      "\"${LOCO_BIN:-build/loco}\" ckpt export %s/%s/ckpt_%08d %s/export", dir, run,
                      steps, dir);
    cr_assert_eq(rc, 0, "%s", out);
    snprintf(a, sizeof a, "%s/export", dir);
    snprintf(b, sizeof b, "%s/ref/ckpt_%08d", dir, steps);
    double l2, worst;
    test_model_diff(mc, a, b, &l2, &worst);
    cr_expect(l2 <= 1e-5 && worst <= 1e-4,
              "%s: final parameters differ by %g (relative L2), %g (largest element, relative "
              "to the largest parameter)",
              what, l2, worst);
}

/* A run DIR/RUN resumed at step `from` continues ref's curve: nothing
 * logged before `from`, the losses of from..steps within 1e-5. */
static inline void test_expect_resumed(const char *dir, const char *run, int from, int steps) {
    double *got = calloc((size_t)steps + 1, sizeof *got);
    double *ref = calloc((size_t)steps + 1, sizeof *ref);
    cr_assert(got && ref);
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", dir, run);
    snprintf(b, sizeof b, "%s/ref", dir);
    test_read_losses(a, got, steps);
    test_read_losses(b, ref, steps);
    cr_expect(got[from - 1] == 0 && got[from] != 0, "%s: the resumed run did not start at step %d",
              run, from);
    test_expect_losses(got, ref, from, steps, run);
    free(got);
    free(ref);
}

#endif
