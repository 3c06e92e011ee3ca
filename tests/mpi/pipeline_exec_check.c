/* The pipeline executor (inner/parallel/pipeline.c) under `mpirun -np p`,
 * p the pipeline's ranks (tests/parallel/test_pipeline_exec.c runs it at
 * p = 2 and 4). Every schedule at m = 4 and 8 (v = 2 where the schedule
 * takes chunks) runs two steps with callbacks that check the data flow:
 * F(mb, c) checks that its input is the activation F(mb, c-1) wrote and
 * writes one that names (mb, c); B(mb, c) checks that its output gradient
 * is the one B(mb, c+1) wrote and writes its own; every F, B and W runs
 * once per (mb, chunk) on the rank holding the chunk, W after its B. Two
 * message sizes: a small one and one above OpenMPI's eager limit, so the
 * sends go by rendezvous and a send waited for too early would hang.
 * Then failures: a callback that fails makes its rank return the error,
 * ranks fed by it return LOCO_EPEER, nothing stays pending, and the next
 * step on the same executors is clean.
 *
 * Not a Criterion test: a plain program. Each rank prints its failures to
 * stderr; rank 0 prints "N passed, N failed" over all ranks; the exit
 * status is 0 only when nothing failed anywhere. Built with
 * -DLOCO_PP_CHECK_MAIN (the Makefile's rule for
 * build/tests/pipeline_exec_check); without it this file is empty. */
#ifdef LOCO_PP_CHECK_MAIN

#include "inner/comm/comm.h"
#include "inner/parallel/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/mpi/mpi_check.h"

/* Message sizes: odd and small (eager), and 512 KB (rendezvous). */
static const size_t msg_sizes[] = {7, 1 << 17};
static const int micro[] = {4, 8};

/* Exact in a float: (mb, chunk) < (64, 64) and the element's index. */
static float act_val(int mb, int c, size_t i) {
    return (float)((mb * 64 + c) * 1024 + (int)(i % 1024));
}
static float grad_val(int mb, int c, size_t i) {
    return -act_val(mb, c, i) - 1.0f;
}

/* The stage of the checks: what ran, and a failure to inject. */
typedef struct {
    const loco_pp_schedule *s;
    int rank, C;
    size_t n;
    int f[64 * 64], b[64 * 64], w[64 * 64]; /* runs per unit mb * C + chunk */
    int fail_op, fail_mb, fail_chunk;       /* -1: none */
} stage;

/* First mismatch of buf against val(mb, c, .), or -1. */
static long mismatch(const float *buf, size_t n, float (*val)(int, int, size_t), int mb, int c) {
    for (size_t i = 0; i < n; i++)
        if (buf[i] != val(mb, c, i))
            return (long)i;
    return -1;
}

static int injected(const stage *st, int op, int mb, int chunk) {
    if (st->fail_op == op && st->fail_mb == mb && st->fail_chunk == chunk)
        return LOCO_ERR(LOCO_EIO, "injected failure of op %d (mb %d, chunk %d)", op, mb, chunk);
    return 0;
}

static int forward(void *ctx, int mb, int c, const float *in, float *out) {
    stage *st = ctx;
    const int u = mb * st->C + c;
    CHECK(loco_pp_chunk_rank(st->s, c) == st->rank, "F%d.%d on rank %d", mb, c, st->rank);
    CHECK(st->f[u] == 0 && st->b[u] == 0, "F%d.%d: ran before (F %d, B %d)", mb, c, st->f[u],
          st->b[u]);
    CHECK((in == NULL) == (c == 0), "F%d.%d: in %p", mb, c, (const void *)in);
    CHECK((out == NULL) == (c == st->C - 1), "F%d.%d: out %p", mb, c, (void *)out);
    if (in) {
        const long at = mismatch(in, st->n, act_val, mb, c - 1);
        CHECK(at < 0, "F%d.%d: input[%ld] = %g, not F%d.%d's %g", mb, c, at, at < 0 ? 0 : in[at],
              mb, c - 1, at < 0 ? 0 : act_val(mb, c - 1, (size_t)at));
    }
    st->f[u]++;
    LOCO_CHECK(injected(st, LOCO_PP_F, mb, c));
    for (size_t i = 0; out && i < st->n; i++)
        out[i] = act_val(mb, c, i);
    return 0;
}

static int backward_input(void *ctx, int mb, int c, const float *dout, float *din) {
    stage *st = ctx;
    const int u = mb * st->C + c;
    CHECK(loco_pp_chunk_rank(st->s, c) == st->rank, "B%d.%d on rank %d", mb, c, st->rank);
    CHECK(st->f[u] == 1 && st->b[u] == 0, "B%d.%d: F ran %d times, B %d", mb, c, st->f[u],
          st->b[u]);
    CHECK((dout == NULL) == (c == st->C - 1), "B%d.%d: dout %p", mb, c, (const void *)dout);
    CHECK((din == NULL) == (c == 0), "B%d.%d: din %p", mb, c, (void *)din);
    if (dout) {
        const long at = mismatch(dout, st->n, grad_val, mb, c + 1);
        CHECK(at < 0, "B%d.%d: dout[%ld] = %g, not B%d.%d's %g", mb, c, at, at < 0 ? 0 : dout[at],
              mb, c + 1, at < 0 ? 0 : grad_val(mb, c + 1, (size_t)at));
    }
    st->b[u]++;
    LOCO_CHECK(injected(st, LOCO_PP_B, mb, c));
    for (size_t i = 0; din && i < st->n; i++)
        din[i] = grad_val(mb, c, i);
    return 0;
}

static int backward_weight(void *ctx, int mb, int c) {
    stage *st = ctx;
    const int u = mb * st->C + c;
    CHECK(st->b[u] == 1 && st->w[u] == 0, "W%d.%d: B ran %d times, W %d", mb, c, st->b[u],
          st->w[u]);
    st->w[u]++;
    return injected(st, LOCO_PP_W, mb, c);
}

/* After a clean step: each unit of this rank's chunks ran F, B, W once. */
static void check_counts(const stage *st, int m, const char *what) {
    for (int mb = 0; mb < m; mb++)
        for (int c = 0; c < st->C; c++) {
            const int u = mb * st->C + c, want = loco_pp_chunk_rank(st->s, c) == st->rank;
            CHECK(st->f[u] == want && st->b[u] == want && st->w[u] == want,
                  "%s: (mb %d, chunk %d) ran F %d, B %d, W %d times, wanted %d", what, mb, c,
                  st->f[u], st->b[u], st->w[u], want);
        }
}

static void stage_reset(stage *st) {
    memset(st->f, 0, sizeof st->f), memset(st->b, 0, sizeof st->b), memset(st->w, 0, sizeof st->w);
}

static loco_pp_stage_ops ops_of(stage *st) {
    return (loco_pp_stage_ops){.ctx = st,
                               .forward = forward,
                               .backward_input = backward_input,
                               .backward_weight = backward_weight};
}

/* Compute actions in this rank's list (BW counts once). */
static int computes_of(const loco_pp_schedule *s, int rank) {
    int n, k = 0;
    const loco_pp_action *a = loco_pp_rank_actions(s, rank, &n);
    for (int i = 0; i < n; i++)
        k += a[i].op <= LOCO_PP_BW;
    return k;
}

/* Two clean steps of one executor. */
static void clean_steps(loco_pp_exec *e, stage *st, int m, const char *what) {
    const loco_pp_stage_ops ops = ops_of(st);
    for (int step = 0; step < 2; step++) {
        stage_reset(st);
        loco_pp_exec_stats stats;
        const int rc = loco_pp_execute(e, &ops, &stats);
        CHECK(rc == 0, "%s step %d -> %s\n%s", what, step, loco_strerror(rc), loco_errmsg());
        CHECK(loco_pp_exec_pending(e) == 0, "%s: %d transfers pending", what,
              loco_pp_exec_pending(e));
        CHECK(stats.computes == computes_of(st->s, st->rank), "%s: %d computes, wanted %d", what,
              stats.computes, computes_of(st->s, st->rank));
        CHECK(stats.wall >= stats.compute + stats.wait, "%s: wall %g < compute %g + wait %g", what,
              stats.wall, stats.compute, stats.wait);
        check_counts(st, m, what);
    }
}

static int v_of(const char *name) {
    return !strcmp(name, "interleaved") || !strcmp(name, "zbv") || !strcmp(name, "dualpipev") ? 2
                                                                                              : 1;
}

/* Every schedule, m and message size: two clean steps each. */
static void every_schedule(loco_comm *pp, stage *st) {
    const int p = loco_comm_size(pp);
    for (int k = 0; loco_pp_generator_name(k); k++)
        for (size_t j = 0; j < sizeof micro / sizeof *micro; j++) {
            const char *name = loco_pp_generator_name(k);
            const int m = micro[j], v = v_of(name);
            loco_pp_schedule *s;
            int rc = loco_pp_schedule_create(&s, name, p, v, m);
            if (!strcmp(name, "dualpipev") && m < 2 * p) {
                CHECK(rc == LOCO_EINVAL, "dualpipev p = %d m = %d accepted", p, m);
                continue;
            }
            CHECK(rc == 0, "%s p = %d m = %d -> %s", name, p, m, loco_errmsg());
            for (size_t z = 0; rc == 0 && z < sizeof msg_sizes / sizeof *msg_sizes; z++) {
                char what[96];
                snprintf(what, sizeof what, "%s p = %d v = %d m = %d, %zu floats", name, p, v, m,
                         msg_sizes[z]);
                loco_pp_exec *e = NULL;
                const int rc2 = loco_pp_exec_create(&e, s, pp, msg_sizes[z]);
                CHECK(rc2 == 0, "%s: create -> %s", what, loco_errmsg());
                st->s = s, st->C = p * v, st->n = msg_sizes[z];
                if (rc2 == 0)
                    clean_steps(e, st, m, what);
                loco_pp_exec_destroy(e);
            }
            loco_pp_schedule_destroy(s);
        }
}

/* One failing step: rank fail_rank fails at (op, mb, chunk); want_others
 * is what every other rank must return (0 or LOCO_EPEER), then a clean
 * step on the same executor. */
static void failing_step(loco_comm *pp, stage *st, const char *name, int fail_rank, int op, int mb,
                         int chunk, int want_others) {
    const int p = loco_comm_size(pp), v = v_of(name), m = 4;
    loco_pp_schedule *s = NULL;
    loco_pp_exec *e = NULL;
    CHECK(loco_pp_schedule_create(&s, name, p, v, m) == 0, "%s: %s", name, loco_errmsg());
    CHECK(s && loco_pp_exec_create(&e, s, pp, msg_sizes[1]) == 0, "%s: %s", name, loco_errmsg());
    if (!e) {
        loco_pp_schedule_destroy(s);
        return;
    }
    st->s = s, st->C = p * v, st->n = msg_sizes[1];
    stage_reset(st);
    st->fail_op = st->rank == fail_rank ? op : -1, st->fail_mb = mb, st->fail_chunk = chunk;
    const loco_pp_stage_ops ops = ops_of(st);
    loco_err_clear();
    const int rc = loco_pp_execute(e, &ops, NULL);
    const int want = st->rank == fail_rank ? LOCO_EIO : want_others;
    CHECK(rc == want, "%s, rank %d failing at op %d (mb %d, chunk %d): returned %s, wanted %s\n%s",
          name, fail_rank, op, mb, chunk, loco_strerror(rc), loco_strerror(want), loco_errmsg());
    if (st->rank == fail_rank)
        CHECK(strstr(loco_errmsg(), "injected failure"), "%s: message lost: %s", name,
              loco_errmsg());
    CHECK(loco_pp_exec_pending(e) == 0, "%s: %d pending after a failure", name,
          loco_pp_exec_pending(e));
    st->fail_op = -1;
    char what[96];
    snprintf(what, sizeof what, "%s after a failed step", name);
    clean_steps(e, st, m, what);
    loco_pp_exec_destroy(e);
    loco_pp_schedule_destroy(s);
}

/* Refusals that need a real pp communicator: missing callbacks, and each
 * allocation of create failing in turn (LOCO_ENOMEM, nothing leaked). */
static void refusals(loco_comm *pp, stage *st) {
    loco_pp_schedule *s;
    loco_pp_exec *e = NULL;
    const int p = loco_comm_size(pp);
    CHECK(loco_pp_schedule_create(&s, "zbv", p, 2, 4) == 0, "zbv: %s", loco_errmsg());
    CHECK(loco_pp_exec_create(&e, s, pp, 5) == 0, "zbv: %s", loco_errmsg());
    loco_pp_stage_ops ops = ops_of(st);
    ops.backward_weight = NULL;
    CHECK(loco_pp_execute(e, &ops, NULL) == LOCO_EINVAL && strstr(loco_errmsg(), "backward_weight"),
          "ops without backward_weight: %s", loco_errmsg());
    CHECK(loco_pp_exec_pending(e) == 0, "pending after a refused step");
    loco_pp_exec_destroy(e);
    const size_t live = loco_alloc_live_bytes();
    int n = 1, rc;
    for (;; n++) {
        e = NULL;
        loco_alloc_fail_after(n);
        rc = loco_pp_exec_create(&e, s, pp, 5);
        loco_alloc_fail_after(0);
        if (rc == 0)
            break;
        CHECK(rc == LOCO_ENOMEM && !e, "allocation %d failing: %s", n, loco_strerror(rc));
        CHECK(loco_alloc_live_bytes() == live, "allocation %d failing: %zu bytes leaked", n,
              loco_alloc_live_bytes() - live);
    }
    CHECK(n > 3, "create succeeded with allocation %d failing", n);
    loco_pp_exec_destroy(e);
    loco_pp_schedule_destroy(s);
}

int main(void) {
    loco_comm *pp;
    if (loco_comm_world(&pp, "mpi") < 0) {
        fprintf(stderr, "no mpi communicator: %s\n", loco_errmsg());
        return 1;
    }
    g_rank = loco_comm_rank(pp);
    const int p = loco_comm_size(pp);
    stage *st = calloc(1, sizeof *st);
    st->rank = g_rank, st->fail_op = -1;
    every_schedule(pp, st);
    refusals(pp, st);
    /* The last rank's first forward fails: every other rank gets a flagged
     * gradient of that micro-batch. */
    failing_step(pp, st, "1f1b", p - 1, LOCO_PP_F, 1, p - 1, LOCO_EPEER);
    failing_step(pp, st, "zbv", p - 1, LOCO_PP_F, 1, p - 1, LOCO_EPEER);
    /* Rank 0's last W: nobody depends on it. */
    failing_step(pp, st, "zb-h1", 0, LOCO_PP_W, 3, 0, 0);
    /* A B in the middle of a V. */
    failing_step(pp, st, "zbv", p - 1, LOCO_PP_B, 0, p, LOCO_EPEER);
    free(st);
    double tally[2] = {(double)n_pass, (double)n_fail};
    loco_comm_allreduce(pp, tally, 2, LOCO_DT_F64, LOCO_OP_SUM);
    if (g_rank == 0)
        printf("pipeline executor, p = %d: %.0f passed, %.0f failed\n", p, tally[0], tally[1]);
    loco_comm_destroy(pp);
    return tally[1] == 0 ? 0 : 1;
}

#endif /* LOCO_PP_CHECK_MAIN */
