/* The quality lab (lab/, `loco lab`): one seed of the lab is bit for bit a
 * `loco launch` of the same config (every committed outer step's θ_global
 * hash on every island, and the final validation loss), for DiLoCo and
 * for Streaming DiLoCo with fragments, overlap and merge; a sweep shares
 * each seed's data-parallel run and its summary is the mean and Student's
 * interval of its seeds' gaps, recomputed here; what the lab cannot run is
 * refused by name. */
#include "lab/lab.h"
#include "tests/support.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define ARGS                                                                                       \
    " --set model.n_layer=4 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32"    \
    " --set train.batch_size=4 --set train.warmup_steps=5 --set run.eval_batches=4"               \
    " --set run.threads=1 --set run.eval_every=0 --set run.log_every=100"                          \
    " --set compress.zstd=on --set net.wan_delay_ms=0 --set net.wan_gbps=0"                      \
    " --set outer.algorithm=allgather --set faulttol.phi_pause_ms=5000"

TestSuite(lab, .timeout = 180);

static cJSON *read_json(const char *path) {
    void *buf;
    size_t len;
    cr_assert_eq(loco_file_read(path, &buf, &len), 0, "%s", loco_errmsg());
    cJSON *j = cJSON_ParseWithLength(buf, len);
    loco_free(buf);
    cr_assert_not_null(j, "%s is not JSON", path);
    return j;
}

/* The "key" of every JSON line of path, in order (at most cap). */
static int read_lines(const char *path, cJSON **lines, int cap) {
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        cJSON *j = cJSON_Parse(line);
        cr_assert_not_null(j, "%s: %s", path, line);
        lines[n++] = j;
    }
    fclose(f);
    return n;
}

static const char *str_of(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    cr_assert(cJSON_IsString(v), "no string %s", k);
    return v->valuestring;
}

static double num_of(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    cr_assert(cJSON_IsNumber(v), "no number %s", k);
    return v->valuedouble;
}

/* Launches sites (K islands) with extra settings, runs the lab on the same
 * command line, and holds them equal: the trace against every island's
 * outer.jsonl, the lab's final loss against siteA's last val_loss. */
static void lab_equals_launch(int K, const char *extra) {
    static const char *const names[] = {"siteA", "siteB", "siteC"};
    char *dir = test_tmpdir("loco-lab");
    char sites[64] = "outer.sites=siteA";
    for (int k = 1; k < K; k++)
        strcat(strcat(sites, ","), names[k]);
    static char out[1 << 18];
    int rc = test_run(out, sizeof out,
                      LOCO " launch configs/multisite-2.ini" ARGS " --set %s %s --set run.dir=%s/run",
                      sites, extra, dir);
    cr_assert_eq(rc, 0, "%s", out);
    rc = test_run(out, sizeof out,
                  LOCO " lab configs/multisite-2.ini" ARGS
                       " --set %s %s --trace %s/trace.jsonl --json %s/lab.json",
                  sites, extra, dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    char path[600];
    cJSON *trace[64], *rec[64];
    snprintf(path, sizeof path, "%s/trace.jsonl", dir);
    const int nt = read_lines(path, trace, 64);
    cr_assert_gt(nt, 2, "the lab traced %d outer steps", nt);
    for (int k = 0; k < K; k++) {
        snprintf(path, sizeof path, "%s/run/%s/outer.jsonl", dir, names[k]);
        const int nr = read_lines(path, rec, 64);
        cr_expect_eq(nr, nt, "%s committed %d outer steps, the lab %d", names[k], nr, nt);
        for (int i = 0; i < nr && i < nt; i++) {
            cr_expect_eq(num_of(rec[i], "outer_step"), num_of(trace[i], "outer_step"));
            cr_expect_eq(num_of(rec[i], "step"), num_of(trace[i], "step"), "%s outer step %d",
                         names[k], i + 1);
            cr_expect_eq(num_of(rec[i], "fragment"), num_of(trace[i], "fragment"));
            cr_expect_str_eq(str_of(rec[i], "theta_hash"), str_of(trace[i], "theta_hash"),
                             "%s, outer step %d", names[k], i + 1);
        }
        for (int i = 0; i < nr; i++)
            cJSON_Delete(rec[i]);
    }
    for (int i = 0; i < nt; i++)
        cJSON_Delete(trace[i]);
    /* The final validation loss, the same windows of the same model. */
    snprintf(path, sizeof path, "%s/run/siteA/metrics.jsonl", dir);
    cJSON *m[512];
    const int nm = read_lines(path, m, 512);
    double launched = NAN;
    for (int i = 0; i < nm; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m[i], "val_loss");
        if (cJSON_IsNumber(v))
            launched = v->valuedouble;
        cJSON_Delete(m[i]);
    }
    snprintf(path, sizeof path, "%s/lab.json", dir);
    cJSON *lab = read_json(path);
    const cJSON *seed0 =
        cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(lab, "runs"),
                                                                  0),
                                               "seeds"),
                           0);
    cr_assert_not_null(seed0);
    cr_expect_eq(num_of(seed0, "diloco_loss"), launched, "lab %.17g, launched %.17g",
                 num_of(seed0, "diloco_loss"), launched);
    cJSON_Delete(lab);
    loco_rmtree(dir);
    free(dir);
}

Test(lab, one_seed_is_a_launched_diloco_run_bit_for_bit) {
    lab_equals_launch(2, "--set train.steps=20 --set outer.H=5 --set compress.codec=int8");
}

Test(lab, one_seed_is_a_launched_streaming_run_bit_for_bit) {
    /* three islands, two fragments, an overlapped exchange, a merge, int4,
     * and a run that ends between outer steps */
    lab_equals_launch(3, "--set train.steps=22 --set outer.H=6 --set outer.fragments=2"
                         " --set outer.overlap=1 --set outer.merge_alpha=0.5"
                         " --set compress.codec=int4");
}

/* Two settings of outer.H, three seeds: each seed's data-parallel run is
 * shared (one loss per seed in both settings), each setting's summary is
 * the mean and 95% interval of its gaps, and the traffic ratio is data
 * parallel's ring bytes over an island's. */
Test(lab, a_sweep_shares_data_parallel_and_summarises_its_seeds) {
    char *dir = test_tmpdir("loco-lab-sweep");
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      LOCO " lab configs/multisite-2.ini" ARGS
                           " --set train.steps=10 --seeds 3 --seed 7 --sweep outer.H=5,10"
                           " --json %s/lab.json",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    char path[600];
    snprintf(path, sizeof path, "%s/lab.json", dir);
    cJSON *lab = read_json(path);
    const cJSON *runs = cJSON_GetObjectItem(lab, "runs");
    cr_assert_eq(cJSON_GetArraySize(runs), 2);
    double dp[3] = {0}, loss[2][3];
    for (int r = 0; r < 2; r++) {
        const cJSON *run = cJSON_GetArrayItem(runs, r);
        cr_expect_str_eq(str_of(cJSON_GetObjectItem(run, "setting"), "outer.H"),
                         r ? "10" : "5");
        const cJSON *seeds = cJSON_GetObjectItem(run, "seeds");
        cr_assert_eq(cJSON_GetArraySize(seeds), 3);
        double g[3], sum = 0, ratio = 0;
        for (int s = 0; s < 3; s++) {
            const cJSON *o = cJSON_GetArrayItem(seeds, s);
            cr_expect_eq(num_of(o, "seed"), 7 + s);
            if (r == 0)
                dp[s] = num_of(o, "dp_loss");
            cr_expect_eq(num_of(o, "dp_loss"), dp[s], "seed %d: one data-parallel run", 7 + s);
            loss[r][s] = num_of(o, "diloco_loss");
            g[s] = (loss[r][s] - dp[s]) / dp[s];
            cr_expect_float_eq(num_of(o, "gap"), g[s], 1e-12);
            sum += g[s];
            /* ring all-reduce: 10 steps, 2 (K-1)/K of the fp32 parameters */
            cr_expect_float_eq(num_of(o, "dp_bytes_per_rank") / num_of(o, "raw_bytes_per_island"),
                               r ? 10.0 : 5.0, 1e-9);
            ratio += num_of(o, "dp_bytes_per_rank") / num_of(o, "bytes_per_island") / 3;
        }
        cr_expect_neq(dp[0], dp[1], "seeds 7 and 8 trained alike");
        const double mean = sum / 3;
        double ss = 0;
        for (int s = 0; s < 3; s++)
            ss += (g[s] - mean) * (g[s] - mean);
        const double half = 4.302653 * sqrt(ss / 2) / sqrt(3.0); /* t(0.975, 2) */
        cr_expect_float_eq(num_of(run, "gap_mean"), mean, 1e-12);
        cr_expect_float_eq(num_of(run, "gap_lo"), mean - half, 1e-3 * half + 1e-12);
        cr_expect_float_eq(num_of(run, "gap_hi"), mean + half, 1e-3 * half + 1e-12);
        cr_expect_float_eq(num_of(run, "traffic_ratio"), ratio, 1e-9 * ratio);
    }
    cr_expect_neq(loss[0][0], loss[1][0], "outer.H = 5 and 10 gave one model");
    cJSON_Delete(lab);
    loco_rmtree(dir);
    free(dir);
}

Test(lab, interval_of_a_mean) {
    loco_lab_interval iv;
    const double x[] = {1, 2, 3, 4};
    cr_assert_eq(loco_lab_interval_of(x, 4, &iv), 0);
    /* sd = sqrt(5/3); t(0.975, 3) = 3.182446 */
    cr_expect_float_eq(iv.mean, 2.5, 1e-15);
    cr_expect_float_eq(iv.sd, sqrt(5.0 / 3), 1e-12);
    cr_expect_float_eq(iv.hi - iv.mean, 3.182446 * sqrt(5.0 / 3) / 2, 1e-3);
    cr_expect_float_eq(iv.mean - iv.lo, iv.hi - iv.mean, 1e-15);
    cr_assert_eq(loco_lab_interval_of(x, 1, &iv), 0);
    cr_expect(iv.lo == 1 && iv.hi == 1 && iv.sd == 0);
    const double bad[] = {1, NAN};
    cr_expect_eq(loco_lab_interval_of(bad, 2, &iv), LOCO_EINVAL);
    cr_expect_eq(loco_lab_interval_of(x, 0, &iv), LOCO_EINVAL);
    /* Student's t against published values, and towards the normal's 1.96 */
    cr_expect_float_eq(loco_lab_t975(1), 12.706, 1e-3);
    cr_expect_float_eq(loco_lab_t975(10), 2.228, 1e-3);
    cr_expect_float_eq(loco_lab_t975(60), 2.000, 2e-3);
    cr_expect_float_eq(loco_lab_t975(120), 1.980, 2e-3);
    cr_expect(isnan(loco_lab_t975(0)));
}

Test(lab, refuses_what_it_cannot_run) {
    loco_config c;
    loco_config_defaults(&c);
    snprintf(c.outer.sites, sizeof c.outer.sites, "a,b");
    char why[256];
    cr_expect_eq(loco_lab_check(&c, why, sizeof why), 0, "%s", why);
    c.parallel.tp = 2;
    cr_expect_eq(loco_lab_check(&c, why, sizeof why), LOCO_EINVAL);
    cr_expect(strstr(why, "one rank") != NULL, "%s", why);
    c.parallel.tp = 1;
    snprintf(c.outer.algorithm, sizeof c.outer.algorithm, "rsag");
    cr_expect_eq(loco_lab_check(&c, why, sizeof why), LOCO_EINVAL);
    cr_expect(strstr(why, "rsag") != NULL, "%s", why);
    snprintf(c.outer.algorithm, sizeof c.outer.algorithm, "auto");
    snprintf(c.outer.sites, sizeof c.outer.sites, "a");
    cr_expect_eq(loco_lab_check(&c, why, sizeof why), LOCO_EINVAL);
    cr_expect(strstr(why, "two islands") != NULL, "%s", why);
    /* the command line: usage errors exit 2 and say what was expected */
    static char out[1 << 14];
    cr_expect_eq(test_run(out, sizeof out, LOCO " lab configs/multisite-2.ini --seeds 0"), 2);
    cr_expect(strstr(out, "--seeds 0: expected an integer") != NULL, "%s", out);
    cr_expect_eq(test_run(out, sizeof out, LOCO " lab configs/multisite-2.ini --sweep outer.H"), 2);
    cr_expect(strstr(out, "expected KEY=V1,V2") != NULL, "%s", out);
    cr_expect_eq(test_run(out, sizeof out, LOCO " lab configs/multisite-2.ini --set parallel.tp=2"),
                 1);
    cr_expect(strstr(out, "one rank each") != NULL, "%s", out);
}
