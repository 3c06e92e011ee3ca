/* `loco lab CONFIG [--set k=v]... [--seeds N] [--sweep KEY=V1,V2,...]...`:
 * the quality lab (lab/, docs/QUALITY.md). For every setting of the sweep
 * (the product of the --sweep lists) and every seed, the islands of
 * outer.sites in one process and data parallelism on the same tokens;
 * prints each seed's losses and the gap's mean with its 95% interval and
 * the traffic ratio, and writes them as JSON (--json) for plots. The data
 * parallel run of a seed is shared by the settings that differ only in
 * [outer] and [compress] keys. */
#include "cli/cli.h"

#include "lab/lab.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SETS 256
#define MAX_SWEEPS 8
#define MAX_VALUES 16
#define MAX_SEEDS 1000
#define MAX_DP 4096

typedef struct {
    char key[96];
    char values[MAX_VALUES][96];
    int n;
} sweep_axis;

typedef struct {
    char key[1024]; /* the setting's assignments that change the data-parallel run, and the seed */
    loco_lab_dp_result r;
} dp_entry;

typedef struct {
    const char *config, *json, *trace;
    char *sets[MAX_SETS];
    int nsets, seeds, islands;
    long long seed0;
    bool seed_given, no_dp;
    sweep_axis ax[MAX_SWEEPS];
    int n_ax;
} lab_args;

static void usage(FILE *f) {
    fprintf(f,
            "usage: loco lab CONFIG [--set k=v]... [--seeds N] [--seed S] [--islands M]\n"
            "                [--sweep KEY=V1,V2,...]... [--json FILE] [--trace FILE] [--no-dp]\n"
            "  M islands (outer.sites, or --islands M) in one process, the outer loop of a\n"
            "  launched run with the bytes handed over in memory, against data parallelism\n"
            "  on the same tokens; N seeds (train.seed = S, S+1, ...; S: train.seed).\n"
            "  --sweep: every combination of the lists (KEY may be `islands`).\n"
            "  --trace: island 0's committed outer steps of the first run (outer.jsonl's\n"
            "  outer_step, step, fragment, theta_hash), one JSON line each.\n");
}

static int parse_axis(sweep_axis *a, const char *spec) {
    const char *eq = strchr(spec, '=');
    if (!eq || eq == spec || (size_t)(eq - spec) >= sizeof a->key || !eq[1]) {
        fprintf(stderr, "loco lab: --sweep %s: expected KEY=V1,V2,...\n", spec);
        return CLI_USAGE;
    }
    memset(a, 0, sizeof *a);
    memcpy(a->key, spec, (size_t)(eq - spec));
    const char *p = eq + 1;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (a->n == MAX_VALUES || len == 0 || len >= sizeof a->values[0]) {
            fprintf(stderr, "loco lab: --sweep %s: at most %d non-empty values of under %zu "
                            "characters\n", spec, MAX_VALUES, sizeof a->values[0]);
            return CLI_USAGE;
        }
        memcpy(a->values[a->n++], p, len);
        p += len + (end ? 1 : 0);
    }
    return 0;
}

static int parse_int(const char *opt, const char *s, long long lo, long long hi, long long *v) {
    char *end;
    errno = 0;
    *v = strtoll(s, &end, 10);
    if (errno || end == s || *end || *v < lo || *v > hi) {
        fprintf(stderr, "loco lab: %s %s: expected an integer in [%lld, %lld]\n", opt, s, lo, hi);
        return CLI_USAGE;
    }
    return 0;
}

static int parse_args(lab_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->seeds = 1;
    for (int i = 0; i < argc; i++) {
        const bool more = i + 1 < argc;
        long long v;
        if (!strcmp(argv[i], "--set") && more && a->nsets < MAX_SETS - 8) {
            a->sets[a->nsets++] = argv[++i];
        } else if (!strcmp(argv[i], "--seeds") && more) {
            if (parse_int("--seeds", argv[++i], 1, MAX_SEEDS, &v))
                return CLI_USAGE;
            a->seeds = (int)v;
        } else if (!strcmp(argv[i], "--seed") && more) {
            if (parse_int("--seed", argv[++i], 0, (1ll << 62), &a->seed0))
                return CLI_USAGE;
            a->seed_given = true;
        } else if (!strcmp(argv[i], "--islands") && more) {
            if (parse_int("--islands", argv[++i], 2, 64, &v))
                return CLI_USAGE;
            a->islands = (int)v;
        } else if (!strcmp(argv[i], "--sweep") && more) {
            if (a->n_ax == MAX_SWEEPS) {
                fprintf(stderr, "loco lab: at most %d --sweep options\n", MAX_SWEEPS);
                return CLI_USAGE;
            }
            if (parse_axis(&a->ax[a->n_ax++], argv[++i]))
                return CLI_USAGE;
        } else if (!strcmp(argv[i], "--json") && more) {
            a->json = argv[++i];
        } else if (!strcmp(argv[i], "--trace") && more) {
            a->trace = argv[++i];
        } else if (!strcmp(argv[i], "--no-dp")) {
            a->no_dp = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            exit(CLI_OK);
        } else if (argv[i][0] != '-' && !a->config) {
            a->config = argv[i];
        } else {
            fprintf(stderr, "loco lab: unexpected argument: %s\n", argv[i]);
            usage(stderr);
            return CLI_USAGE;
        }
    }
    if (!a->config) {
        fprintf(stderr, "loco lab: expected CONFIG\n");
        usage(stderr);
        return CLI_USAGE;
    }
    return 0;
}

/* "islands=M" becomes outer.sites = i0,i1,...; the names only label. */
static void sites_of(int M, char *buf, size_t cap) {
    size_t at = (size_t)snprintf(buf, cap, "outer.sites=");
    for (int k = 0; k < M && at < cap; k++)
        at += (size_t)snprintf(buf + at, cap - at, "%si%d", k ? "," : "", k);
}

typedef struct {
    FILE *f;
} trace_file;

static void trace_line(void *ctx, int64_t outer, int64_t inner, int frag, uint64_t hash) {
    char hh[17];
    loco_hash_hex(hash, hh);
    fprintf(((trace_file *)ctx)->f,
            "{\"outer_step\":%lld,\"step\":%lld,\"fragment\":%d,\"theta_hash\":\"%s\"}\n",
            (long long)outer, (long long)inner, frag, hh);
}

/* Whether an assignment changes the data-parallel run: everything but
 * [outer] and [compress] does (islands change its batch). */
static bool changes_dp(const char *key) {
    return strncmp(key, "outer.", 6) != 0 && strncmp(key, "compress.", 9) != 0;
}

typedef struct {
    lab_args *a;
    dp_entry *dp;
    int n_dp;
    cJSON *runs;
    bool traced;
} lab_state;

/* One setting (idx[] into the axes): every seed; its summary line. */
static int run_setting(lab_state *S, const int *idx) {
    lab_args *a = S->a;
    char assign[MAX_SWEEPS + 1][160], label[1024] = "", dpkey[1024] = "";
    char *sets[MAX_SETS + MAX_SWEEPS + 4];
    int n = 0;
    for (int i = 0; i < a->nsets; i++)
        sets[n++] = a->sets[i];
    if (a->islands) {
        sites_of(a->islands, assign[MAX_SWEEPS], sizeof assign[MAX_SWEEPS]);
        sets[n++] = assign[MAX_SWEEPS];
    }
    cJSON *setting = cJSON_CreateObject();
    for (int x = 0; x < a->n_ax; x++) {
        const char *k = a->ax[x].key, *v = a->ax[x].values[idx[x]];
        if (!strcmp(k, "islands")) {
            long long m;
            if (parse_int("--sweep islands", v, 2, 64, &m)) {
                cJSON_Delete(setting);
                return LOCO_ERR(LOCO_EINVAL, "lab: --sweep islands=%s", v);
            }
            sites_of((int)m, assign[x], sizeof assign[x]);
        } else {
            snprintf(assign[x], sizeof assign[x], "%s=%s", k, v);
        }
        sets[n++] = assign[x];
        size_t at = strlen(label);
        snprintf(label + at, sizeof label - at, "%s%s=%s", at ? " " : "", k, v);
        if (changes_dp(k)) {
            at = strlen(dpkey);
            snprintf(dpkey + at, sizeof dpkey - at, "%s=%s;", k, v);
        }
        cJSON_AddStringToObject(setting, k, v);
    }
    char seedset[64];
    sets[n++] = seedset;
    double gaps[MAX_SEEDS], ratio_sum = 0;
    cJSON *run = cJSON_CreateObject(), *seeds = cJSON_CreateArray();
    cJSON_AddItemToObject(run, "setting", setting);
    cJSON_AddItemToObject(run, "seeds", seeds);
    cJSON_AddItemToArray(S->runs, run);
    printf("\n== %s\n", label[0] ? label : "(the config as given)");
    printf("%6s %12s %12s %9s %14s %14s %9s %8s %8s\n", "seed", "diloco loss", "dp loss", "gap",
           "bytes/island", "dp bytes/rank", "ratio", "diloco s", "dp s");
    int rc = 0;
    for (int s = 0; s < a->seeds && rc == 0; s++) {
        loco_config cfg;
        long long seed = a->seed0 + s;
        if (!a->seed_given) {
            /* the config's own seed first */
            loco_config base;
            rc = cli_load_config(&base, a->config, n - 1, sets);
            if (rc < 0)
                break;
            seed = base.train.seed + s;
        }
        snprintf(seedset, sizeof seedset, "train.seed=%lld", seed);
        if ((rc = cli_load_config(&cfg, a->config, n, sets)) < 0)
            break;
        if ((rc = loco_lab_check(&cfg, NULL, 0)) < 0)
            break;
        loco_lab_diloco_result d;
        trace_file tf = {0};
        if (a->trace && !S->traced) {
            if (!(tf.f = fopen(a->trace, "w"))) {
                rc = LOCO_ERR(LOCO_EIO, "lab: --trace %s: %s", a->trace, strerror(errno));
                break;
            }
        }
        rc = loco_lab_diloco(&cfg, tf.f ? trace_line : NULL, &tf, &d);
        if (tf.f) {
            if (fclose(tf.f) != 0 && rc == 0)
                rc = LOCO_ERR(LOCO_EIO, "lab: --trace %s: %s", a->trace, strerror(errno));
            S->traced = true;
        }
        if (rc < 0)
            break;
        loco_lab_dp_result dp = {.val_loss = NAN};
        if (!a->no_dp) {
            char key[1024];
            snprintf(key, sizeof key, "%s|%s|seed=%lld", cfg.outer.sites, dpkey, seed);
            int hit = -1;
            for (int i = 0; i < S->n_dp && hit < 0; i++)
                if (!strcmp(S->dp[i].key, key))
                    hit = i;
            if (hit >= 0) {
                dp = S->dp[hit].r;
            } else {
                if ((rc = loco_lab_dp(&cfg, &dp)) < 0)
                    break;
                if (S->n_dp < MAX_DP) {
                    snprintf(S->dp[S->n_dp].key, sizeof S->dp[S->n_dp].key, "%s", key);
                    S->dp[S->n_dp++].r = dp;
                }
            }
        }
        const double gap = (d.val_loss - dp.val_loss) / dp.val_loss;
        const double ratio = d.bytes_sent > 0 ? dp.bytes_sent / d.bytes_sent : NAN;
        gaps[s] = gap;
        ratio_sum += ratio;
        printf("%6lld %12.5f %12.5f %+8.3f%% %14.0f %14.0f %8.1fx %8.1f %8.1f\n", seed, d.val_loss,
               dp.val_loss, gap * 100, d.bytes_sent, dp.bytes_sent, ratio, d.seconds, dp.seconds);
        fflush(stdout);
        char hh[17];
        loco_hash_hex(d.theta_hash, hh);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "seed", (double)seed);
        cJSON_AddNumberToObject(o, "diloco_loss", d.val_loss);
        cJSON_AddNumberToObject(o, "dp_loss", dp.val_loss);
        cJSON_AddNumberToObject(o, "gap", gap);
        cJSON_AddNumberToObject(o, "bytes_per_island", d.bytes_sent);
        cJSON_AddNumberToObject(o, "raw_bytes_per_island", d.raw_bytes);
        cJSON_AddNumberToObject(o, "dp_bytes_per_rank", dp.bytes_sent);
        cJSON_AddNumberToObject(o, "outer_steps", (double)d.outer_steps);
        cJSON_AddStringToObject(o, "theta_hash", hh);
        cJSON_AddNumberToObject(o, "diloco_s", d.seconds);
        cJSON_AddNumberToObject(o, "dp_s", dp.seconds);
        cJSON_AddItemToArray(seeds, o);
    }
    if (rc < 0)
        return rc;
    if (a->no_dp)
        return 0;
    loco_lab_interval iv;
    LOCO_CHECK(loco_lab_interval_of(gaps, a->seeds, &iv));
    const double ratio = ratio_sum / a->seeds;
    printf("gap %+.3f%% (95%% interval %+.3f%% .. %+.3f%%, sd %.3f%%, %d seeds), traffic %.1fx "
           "less than data parallel\n",
           iv.mean * 100, iv.lo * 100, iv.hi * 100, iv.sd * 100, iv.n, ratio);
    cJSON_AddNumberToObject(run, "gap_mean", iv.mean);
    cJSON_AddNumberToObject(run, "gap_lo", iv.lo);
    cJSON_AddNumberToObject(run, "gap_hi", iv.hi);
    cJSON_AddNumberToObject(run, "gap_sd", iv.sd);
    cJSON_AddNumberToObject(run, "traffic_ratio", ratio);
    return 0;
}

static int write_json(const char *path, cJSON *root) {
    char *s = cJSON_Print(root);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "lab: JSON");
    int rc = loco_file_write_sync(path, s, strlen(s));
    free(s);
    return rc;
}

int cli_lab(int argc, char **argv) {
    lab_args a;
    if (parse_args(&a, argc, argv))
        return CLI_USAGE;
    lab_state S = {.a = &a, .dp = calloc(MAX_DP, sizeof(dp_entry))};
    cJSON *root = cJSON_CreateObject();
    S.runs = cJSON_AddArrayToObject(root, "runs");
    cJSON_AddStringToObject(root, "config", a.config);
    int rc = S.dp && S.runs ? 0 : LOCO_ERR(LOCO_ENOMEM, "lab");
    int idx[MAX_SWEEPS] = {0};
    while (rc == 0) {
        rc = run_setting(&S, idx);
        int x = a.n_ax - 1;
        while (x >= 0 && ++idx[x] == a.ax[x].n)
            idx[x--] = 0;
        if (x < 0)
            break;
    }
    if (rc == 0 && a.json)
        rc = write_json(a.json, root);
    cJSON_Delete(root);
    free(S.dp);
    return rc < 0 ? cli_fail(rc) : CLI_OK;
}
