/* `loco pipeline`: pipeline schedules generated, checked and timed by the
 * simulator (inner/parallel/schedule.c), against the published figures
 * (docs/PIPELINE.md). */
#include "cli/cli.h"
#include "inner/parallel/parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETS 256
/* The table's grid; v for the schedules that take more than one chunk. */
static const int table_p[] = {2, 4, 8};
static const int table_m[] = {4, 8, 16};
#define TABLE_V 2
/* Width of the wrapped action lists. */
#define LIST_WIDTH 100

static int usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "loco pipeline: %s%s%s\n(run `loco help` for usage)\n", msg, arg ? ": " : "",
            arg ? arg : "");
    return CLI_USAGE;
}

/* This thread's error message without its "file:line: " prefix and
 * breadcrumbs, for a table cell. */
static void short_error(char *buf, size_t cap) {
    const char *m = loco_errmsg(), *colon = strstr(m, ": ");
    snprintf(buf, cap, "%s", colon ? colon + 2 : m);
    buf[strcspn(buf, "\n")] = '\0';
}

static void print_number(double x) {
    if (isnan(x))
        printf(" — |");
    else
        printf(" %.4f |", x);
}

/* One row: schedule name at (p, m) with its v. */
static int table_row(const char *name, int p, int m, const loco_pp_costs *c) {
    const bool multi =
        !strcmp(name, "interleaved") || !strcmp(name, "zbv") || !strcmp(name, "dualpipev");
    const int v = multi ? TABLE_V : 1;
    printf("| %s | %d | %d | %d |", name, p, m, v);
    loco_pp_schedule *s;
    int rc = loco_pp_schedule_create(&s, name, p, v, m);
    if (rc == LOCO_EINVAL) {
        char why[512];
        short_error(why, sizeof why);
        printf(" — | — | — | — | — | refused: %s |\n", why);
        return 0;
    }
    LOCO_CHECK(rc);
    loco_pp_sim r;
    double bubble, peak;
    rc = loco_pp_simulate(s, c, &r);
    loco_pp_schedule_destroy(s);
    LOCO_CHECK(rc);
    LOCO_CHECK(loco_pp_published(name, p, v, m, c, &bubble, &peak));
    print_number(r.bubble);
    print_number(bubble);
    printf(" %d | %g | %g | |\n", r.peak_live, peak, r.peak_live / (double)v);
    loco_pp_sim_fini(&r);
    return 0;
}

/* The Markdown table of every schedule on the grid. */
static int print_table(const loco_pp_costs *c) {
    printf("Simulated pipeline schedules beside the published figures (docs/PIPELINE.md).\n"
           "Costs per chunk: F %g, B %g, W %g (BW %g), latency %g; v = %d for interleaved, "
           "zbv and dualpipev.\n"
           "bubble: idle / makespan of a rank (every rank does the same work, so all agree); "
           "peak: most live (micro-batch, chunk) activations on one rank, a chunk being 1/v of "
           "a rank's layers (peak / v: in whole-rank activations).\n\n",
           c->f, c->b, c->w, c->b + c->w, c->latency, TABLE_V);
    printf("| schedule | p | m | v | bubble (sim) | bubble (published) | peak (sim) | "
           "peak (published) | peak / v | note |\n"
           "|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof table_p / sizeof table_p[0]; i++)
        for (size_t j = 0; j < sizeof table_m / sizeof table_m[0]; j++)
            for (int k = 0; loco_pp_generator_name(k); k++)
                LOCO_CHECK(table_row(loco_pp_generator_name(k), table_p[i], table_m[j], c));
    return 0;
}

/* Rank r's chunks, then its actions wrapped at LIST_WIDTH. */
static void print_rank(const loco_pp_schedule *s, const loco_pp_rank_stats *st, int r) {
    int p, v, m, n;
    loco_pp_schedule_shape(s, &p, &v, &m);
    printf("rank %d (chunks", r);
    for (int c = 0; c < p * v; c++)
        if (loco_pp_chunk_rank(s, c) == r)
            printf(" %d", c);
    printf("): busy %g from %g to %g, bubble %.4f, peak %d live activations\n", st->busy, st->start,
           st->end, st->bubble, st->peak_live);
    const loco_pp_action *a = loco_pp_rank_actions(s, r, &n);
    int col = 0;
    for (int i = 0; i < n; i++) {
        char buf[48];
        loco_pp_action_str(&a[i], buf, sizeof buf);
        const int w = (int)strlen(buf) + 1;
        if (col > 0 && col + w > LIST_WIDTH) {
            putchar('\n');
            col = 0;
        }
        printf("%s%s", col ? " " : "  ", buf);
        col += w + (col ? 0 : 1);
    }
    printf("\n");
}

/* The configured schedule: checked, timed, and its lists. */
static int print_schedule(const loco_config *cfg, const loco_pp_costs *c) {
    loco_pp_schedule *s;
    LOCO_CHECK(loco_pp_schedule_from_config(&s, cfg));
    int p, v, m, rc = 0;
    loco_pp_schedule_shape(s, &p, &v, &m);
    loco_pp_sim r;
    double bubble, peak;
    LOCO_CHECK_GOTO(loco_pp_simulate(s, c, &r), out);
    LOCO_CHECK_GOTO(loco_pp_published(loco_pp_schedule_name(s), p, v, m, c, &bubble, &peak),
                    out_sim);
    char published[32] = "no closed form";
    if (!isnan(bubble))
        snprintf(published, sizeof published, "%.4f", bubble);
    printf("schedule %s: p = %d ranks, v = %d chunk%s per rank, m = %d micro-batches\n"
           "costs per chunk: F %g, B %g, W %g (BW %g), latency %g\n"
           "checked: every action, transfer and dependency; no deadlock\n"
           "makespan %g, bubble %.4f (published %s), peak %d live activations "
           "(published %g)\n"
           "transfers listed in one order at both ends of every rank pair: %s; of every rank "
           "pair and kind: %s\n"
           "legend: F/B/W/BW mb.chunk (+ = overlapped with the next compute); Sa mb.chunk>peer "
           "sends an activation, Rg mb.chunk<peer receives a gradient\n\n",
           loco_pp_schedule_name(s), p, v, v == 1 ? "" : "s", m, c->f, c->b, c->w, c->b + c->w,
           c->latency, r.makespan, r.bubble, published, r.peak_live, peak,
           r.in_order ? "yes" : "no", r.in_order_by_kind ? "yes" : "no");
    for (int k = 0; k < p; k++)
        print_rank(s, &r.ranks[k], k);
out_sim:
    loco_pp_sim_fini(&r);
out:
    loco_pp_schedule_destroy(s);
    return rc;
}

int cli_pipeline(int argc, char **argv) {
    const char *config = NULL;
    char *sets[MAX_SETS];
    int nsets = 0;
    loco_pp_costs costs = {.f = 1, .b = 1, .w = 1};
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc && nsets < MAX_SETS)
            sets[nsets++] = argv[++i];
        else if (!strcmp(argv[i], "--costs") && i + 1 < argc) {
            if (!loco_pp_parse_costs(argv[++i], &costs))
                return usage_error("--costs expects F,B,W (three numbers >= 0)", argv[i]);
        } else if (!strcmp(argv[i], "--latency") && i + 1 < argc) {
            char *end;
            costs.latency = strtod(argv[++i], &end);
            if (end == argv[i] || *end || !(costs.latency >= 0) || !isfinite(costs.latency))
                return usage_error("--latency expects a number >= 0", argv[i]);
        } else if (argv[i][0] != '-' && !config)
            config = argv[i];
        else
            return usage_error("unexpected argument", argv[i]);
    }
    int rc;
    if (!config && nsets == 0) {
        rc = print_table(&costs);
    } else {
        loco_config cfg;
        rc = cli_load_config(&cfg, config, nsets, sets);
        if (rc == 0)
            rc = print_schedule(&cfg, &costs);
    }
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}
