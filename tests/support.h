/* Helpers shared by the tests that drive build/loco as a user would. */
#ifndef LOCO_TESTS_SUPPORT_H
#define LOCO_TESTS_SUPPORT_H

#include "inner/inner.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Runs a shell command (formatted), capturing stdout and stderr together
 * into out; returns its exit status (-1 when it did not exit). */
__attribute__((format(printf, 3, 4))) static inline int test_run(char *out, size_t cap,
                                                                   const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    /* Drain the rest so the command never dies of SIGPIPE. */
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0)
        ;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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
