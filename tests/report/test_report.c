/* `loco report` on synthetic run directories: a fault run (3 sites, a kill,
 * restart and join, a partition and heal) beside a fault-free baseline. The
 * expected detection and recovery times are those of the events written
 * here; variants must FAIL with the right reason. Runs build/loco. */
#include "core/core.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""

static char *dir;

static void setup(void) {
    dir = strdup("/tmp/loco-report-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(report, .init = setup, .fini = teardown, .timeout = 30);

/* What to change in the fault run. */
typedef struct {
    bool divergence, end_failed, no_end, drop_commit3, malformed, bad_hash, no_metrics_c;
    bool utilisation; /* the fault run's siteA and siteB write wait_s and wall_s */
    bool no_rejoin;   /* the killed siteB never joins again */
    bool planned;     /* the start event plans a freeze of siteC that never happens */
    bool late;        /* quorum mode: outer step 2 goes without siteC */
    const char *detail; /* of the kill */
    double loss_scale;  /* fault run's losses against the baseline's */
} variant;

static const char *const SITES[3] = {"siteA", "siteB", "siteC"};

static FILE *open_file(const char *run, const char *site, const char *name) {
    char path[700];
    if (site) {
        snprintf(path, sizeof path, "%s/%s/%s", dir, run, site);
        cr_assert_eq(loco_mkdirs(path), 0);
        snprintf(path, sizeof path, "%s/%s/%s/%s", dir, run, site, name);
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, run);
        cr_assert_eq(loco_mkdirs(path), 0);
        snprintf(path, sizeof path, "%s/%s/%s", dir, run, name);
    }
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    return f;
}

/* 60 steps per island, val loss at 30 and 60; siteB of the fault run
 * restarts from step 15 and writes those steps again. */
static void write_metrics(const char *run, int s, double scale, bool restart) {
    FILE *f = open_file(run, SITES[s], "metrics.jsonl");
    for (int step = 1; step <= 60; step++) {
        if (restart && step == 21) /* killed after 20, resumes at 16 */
            for (int r = 16; r <= 20; r++)
                fprintf(f, "{\"step\":%d,\"loss\":%.4f,\"lr\":0.001,\"grad_norm\":1.0}\n", r,
                        scale * (4.0 - 0.02 * r));
        fprintf(f,
                "{\"step\":%d,\"loss\":%.4f,\"lr\":0.001,\"grad_norm\":1.1,\"tokens_per_s\":1000,"
                "\"step_s\":0.1}\n",
                step, scale * (4.0 - 0.02 * step + 0.01 * s));
        if (step % 30 == 0)
            fprintf(f, "{\"step\":%d,\"val_loss\":%.4f,\"val_tokens\":4096}\n", step,
                    scale * (4.1 - 0.02 * step));
    }
    fclose(f);
}

/* wait (NULL: an older island without the utilisation fields) holds
 * wait_s per record; wall_s is 10 s each. */
static void write_outer(const char *run, int s, const int *steps, int n, bool bad_last,
                        const double *wait) {
    FILE *f = open_file(run, SITES[s], "outer.jsonl");
    for (int i = 0; i < n; i++) {
        fprintf(f,
                "{\"outer_step\":%d,\"step\":%d,\"bytes_raw\":4000,\"bytes_sent\":1000,"
                "\"bytes_received\":2000,\"compression_ratio\":4,\"exchange_s\":0.1,"
                "\"inner_wait_s\":0.1,\"theta_hash\":\"%s%015d\",\"algorithm\":\"allgather\","
                "\"epoch\":1,\"members\":3",
                steps[i], steps[i] * 10, bad_last && i == n - 1 ? "f" : "0", steps[i]);
        if (wait)
            fprintf(f,
                    ",\"wait_s\":%.2f,\"wall_s\":10.0,\"utilisation\":%.4f,\"fragment\":%d,"
                    "\"overlap\":2",
                    wait[i], 1 - wait[i] / 10, steps[i] % 2);
        fprintf(f, "}\n");
    }
    fclose(f);
}

static void commit(FILE *f, double t, int step, const char *members) {
    fprintf(f,
            "{\"t\":%.2f,\"kind\":\"commit\",\"outer_step\":%d,\"epoch\":1,\"hash\":\"0%015d\","
            "\"members\":[%s]}\n",
            t, step, step, members);
}

#define ALL "\"siteA\",\"siteB\",\"siteC\""

static void write_baseline(void) {
    FILE *f = open_file("base", NULL, "events.jsonl");
    fprintf(f, "{\"t\":1000.0,\"kind\":\"start\",\"sites\":[" ALL "],"
               "\"config\":\"configs/faults-kill.ini\",\"seed\":1}\n");
    fprintf(f, "{\"t\":1000.5,\"kind\":\"quorum\",\"epoch\":1,\"members\":[" ALL "],"
               "\"outer_step\":0}\n");
    for (int k = 1; k <= 6; k++)
        commit(f, 1000 + 5 * k, k, ALL);
    fprintf(f, "{\"t\":1032.0,\"kind\":\"end\",\"status\":\"finished\",\"reason\":\"\"}\n");
    fclose(f);
    const int steps[6] = {1, 2, 3, 4, 5, 6};
    for (int s = 0; s < 3; s++) {
        write_metrics("base", s, 1.0, false);
        write_outer("base", s, steps, 6, false, NULL);
    }
}

static void write_fault(const variant *v) {
    FILE *f = open_file("fault", NULL, "events.jsonl");
#define EV(...) fprintf(f, __VA_ARGS__)
    EV("{\"t\":2000.0,\"kind\":\"start\",\"sites\":[" ALL "],"
       "\"config\":\"configs/faults-kill.ini\",\"seed\":1%s}\n",
       v->planned ? ",\"planned\":[{\"fault\":\"kill\",\"site\":\"siteB\",\"due\":\"inner step "
                    "20\",\"detect\":true,\"recover\":true},{\"fault\":\"freeze\",\"site\":"
                    "\"siteC\",\"due\":\"inner step 500\",\"detect\":true,\"recover\":true}]"
                  : "");
    EV("{\"t\":2000.5,\"kind\":\"quorum\",\"epoch\":1,\"members\":[" ALL "],\"outer_step\":0}\n");
    commit(f, 2005, 1, ALL);
    if (v->late)
        EV("{\"t\":2008.0,\"kind\":\"late\",\"site\":\"siteC\",\"outer_step\":2}\n");
    commit(f, 2009, 2, ALL);
    EV("{\"t\":2010.0,\"kind\":\"fault\",\"fault\":\"kill\",\"site\":\"siteB\",\"detail\":\"%s\","
       "\"future_field\":[1,2]}\n",
       v->detail ? v->detail : "SIGKILL");
    if (v->malformed)
        EV("{\"t\":2011.0,\"kind\":\"suspect\",\"site\":\n"); /* line 6 */
    EV("{\"t\":2011.5,\"kind\":\"future_kind\",\"site\":\"siteB\"}\n");
    EV("{\"t\":2012.5,\"kind\":\"suspect\",\"site\":\"siteB\",\"reason\":\"phi 9.3\"}\n");
    EV("{\"t\":2012.6,\"kind\":\"quorum\",\"epoch\":2,\"members\":[\"siteA\",\"siteC\"],"
       "\"outer_step\":3}\n");
    if (!v->drop_commit3)
        commit(f, 2014, 3, "\"siteA\",\"siteC\"");
    EV("{\"t\":2015.0,\"kind\":\"fault\",\"fault\":\"restart\",\"site\":\"siteB\"}\n");
    if (!v->no_rejoin)
        EV("{\"t\":2018.25,\"kind\":\"join\",\"site\":\"siteB\",\"outer_step\":4,"
           "\"transfer_s\":0.8,\"transfer_bytes\":5000}\n");
    EV("{\"t\":2018.3,\"kind\":\"quorum\",\"epoch\":3,\"members\":[" ALL "],\"outer_step\":4}\n");
    commit(f, 2020, 4, ALL);
    EV("{\"t\":2030.0,\"kind\":\"fault\",\"fault\":\"partition\",\"site\":\"siteA\","
       "\"peer\":\"siteC\",\"detail\":\"drop all\"}\n");
    EV("{\"t\":2031.0,\"kind\":\"refused\",\"site\":\"siteA\",\"reason\":\"stale epoch\"}\n");
    EV("{\"t\":2033.0,\"kind\":\"suspect\",\"site\":\"siteC\",\"reason\":\"link closed\"}\n");
    EV("{\"t\":2033.1,\"kind\":\"quorum\",\"epoch\":4,\"members\":[\"siteA\",\"siteB\"],"
       "\"outer_step\":5}\n");
    commit(f, 2035, 5, "\"siteA\",\"siteB\"");
    if (v->divergence)
        EV("{\"t\":2036.0,\"kind\":\"divergence\",\"outer_step\":5,\"detail\":\"siteA != "
           "siteB\"}\n");
    EV("{\"t\":2040.5,\"kind\":\"fault\",\"fault\":\"heal\",\"site\":\"siteA\",\"peer\":"
       "\"siteC\"}\n");
    EV("{\"t\":2042.0,\"kind\":\"join\",\"site\":\"siteC\",\"outer_step\":6,\"transfer_s\":0.5,"
       "\"transfer_bytes\":5000}\n");
    EV("{\"t\":2042.1,\"kind\":\"quorum\",\"epoch\":5,\"members\":[" ALL "],\"outer_step\":6}\n");
    EV("{\"t\":2043.0,\"kind\":\"fault\",\"fault\":\"corrupt\",\"site\":\"siteA\","
       "\"detail\":\"flip a byte\"}\n");
    EV("{\"t\":2043.4,\"kind\":\"refused\",\"site\":\"siteB\",\"reason\":\"corrupt frame\"}\n");
    commit(f, 2045, 6, ALL);
    if (v->end_failed)
        EV("{\"t\":2050.0,\"kind\":\"end\",\"status\":\"failed\",\"reason\":\"island siteB "
           "lost\"}\n");
    else if (!v->no_end)
        EV("{\"t\":2050.0,\"kind\":\"end\",\"status\":\"finished\"}\n");
#undef EV
    fclose(f);
    const int a[6] = {1, 2, 3, 4, 5, 6}, b[5] = {1, 2, 4, 5, 6}, c[5] = {1, 2, 3, 4, 6};
    double scale = v->loss_scale > 0 ? v->loss_scale : 1.0;
    for (int s = 0; s < 3; s++)
        if (s != 2 || !v->no_metrics_c)
            write_metrics("fault", s, scale, s == 1);
    /* siteA: waits 1 s and 3 s of every 10 s in turn, 80%, lowest 70%;
     * siteB: 0.5 s of 10 s, 95%; siteC: older, no fields */
    const double wa[6] = {1, 3, 1, 3, 1, 3}, wb[5] = {0.5, 0.5, 0.5, 0.5, 0.5};
    write_outer("fault", 0, a, 6, false, v->utilisation ? wa : NULL);
    write_outer("fault", 1, b, 5, v->bad_hash, v->utilisation ? wb : NULL);
    write_outer("fault", 2, c, 5, false, NULL);
}

/* Runs loco report on the two runs; out receives its output. */
static int report(char *out, size_t cap, const variant *v, const char *extra) {
    write_baseline();
    write_fault(v);
    return test_run(out, cap, LOCO " report %s/fault %s/base %s", dir, dir, extra ? extra : "");
}

static char *slurp(const char *name) {
    char path[700];
    snprintf(path, sizeof path, "%s/fault/%s", dir, name);
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0, "%s", path);
    return data;
}

Test(report, pass_with_charts_fault_table_and_bytes) {
    static char out[1 << 16];
    variant v = {0};
    int rc = report(out, sizeof out, &v, NULL);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "verdict: PASS") != NULL, "%s", out);
    char *md = slurp("report.md"), *html = slurp("report.html");
    for (int k = 0; k < 2; k++) {
        const char *doc = k ? html : md;
        const char *svg1 = strstr(doc, "<svg"), *svg2 = svg1 ? strstr(svg1 + 1, "<svg") : NULL;
        cr_expect(svg1 && svg2, "two inline SVG charts");
        cr_expect(strstr(doc, "Training loss against step") && strstr(doc, "<polyline"));
        cr_expect(strstr(doc, "Membership against time") && strstr(doc, "in the quorum"));
        cr_expect(strstr(doc, "Verdict: PASS") != NULL);
        cr_expect(strstr(doc, "configs/faults-kill.ini") != NULL);
        cr_expect(strstr(doc, "16000 bytes") && strstr(doc, "18000 bytes"), "byte totals");
        cr_expect(strstr(doc, "10000 bytes") != NULL, "state transfer bytes");
        cr_expect(strstr(doc, "extra +18.00 s") != NULL, "extra wall time");
    }
    cr_expect(strstr(html, "http") == NULL || strstr(html, "xmlns=\"http://www.w3.org/2000/svg\""),
              "no external assets");
    cr_expect(strstr(html, "<script") == NULL);
    /* one row per fault's cycle: injected, detected, detection, recovered,
     * recovery from the events; the restart and the heal close their
     * fault's cycle (the kill's at siteB's join, the partition's at siteC's) */
    cr_expect(strstr(md, "| 1 | kill | siteB | 10.00 | 12.50 | 2.50 | 18.25 | 8.25 | complete | "
                         "SIGKILL; siteB suspected (phi 9.3); siteB rejoined |") != NULL,
              "%s", md);
    cr_expect(strstr(md, "| 2 | partition | siteA, siteC | 30.00 | 33.00 | 3.00 | 42.00 | 12.00 "
                         "| complete | drop all; siteC suspected (link closed); healed; siteC "
                         "rejoined |") != NULL,
              "%s", md);
    cr_expect(strstr(md, "| 3 | corrupt | siteA | 43.00 | 43.40 | 0.40 | 45.00 | 2.00 | complete | "
                         "flip a byte; refused by siteB (corrupt frame) |") != NULL,
              "%s", md);
    cr_expect(strstr(md, "| restart |") == NULL && strstr(md, "| heal |") == NULL, "%s", md);
    cr_expect(strstr(html, "<td>kill</td><td>siteB</td><td>10.00</td><td>12.50</td><td>2.50</td>"
                           "<td>18.25</td><td>8.25</td>") != NULL);
    cr_expect(strstr(md, "within the tolerance of 1.00%") != NULL, "%s", md);
    loco_free(md);
    loco_free(html);
}

/* Quorum mode: an island left out of a step as late is counted and drawn
 * apart from a suspicion (it is not one), and the verdict holds. */
Test(report, a_late_island_is_drawn_and_counted) {
    static char out[1 << 16];
    variant v = {.late = true};
    cr_assert_eq(report(out, sizeof out, &v, NULL), 0, "%s", out);
    cr_expect(strstr(out, "verdict: PASS") != NULL, "%s", out);
    char *md = slurp("report.md"), *html = slurp("report.html");
    cr_expect(strstr(md, "suspect 2, late 1, join 2") != NULL, "%s", md);
    cr_expect(strstr(html, "outer step 2 went without siteC (late) at 8.00 s") &&
                  strstr(html, "late (quorum)"),
              "the membership chart marks it");
    loco_free(md);
    loco_free(html);
}

Test(report, utilisation_per_island_and_mean) {
    static char out[1 << 16];
    variant v = {.utilisation = true};
    cr_assert_eq(report(out, sizeof out, &v, NULL), 0, "%s", out);
    cr_expect(strstr(out, "verdict: PASS") != NULL, "%s", out);
    cr_expect(strstr(out, "not usable") == NULL, "%s", out);
    char *md = slurp("report.md"), *html = slurp("report.html");
    /* 1 - (1+3+1+3+1+3) / 60 = 80%; 1 - 2.5 / 50 = 95%; mean 87.5% */
    cr_expect(strstr(md, "| fault run | siteA | 6 | 12.00 | 60.00 | 80.0% | 70.0% |") != NULL,
              "%s", md);
    cr_expect(strstr(md, "| fault run | siteB | 5 | 2.50 | 50.00 | 95.0% | 95.0% |") != NULL,
              "%s", md);
    cr_expect(strstr(md, "| fault run | siteC | 0 | — | — | not recorded | — |") != NULL, "%s",
              md);
    cr_expect(strstr(md, "| fault run | mean over islands |  |  |  | 87.5% (2 of 3 islands) |  |") !=
                  NULL,
              "%s", md);
    cr_expect(strstr(md, "| baseline | siteA | 0 | — | — | not recorded | — |") != NULL, "%s",
              md);
    for (int k = 0; k < 2; k++) {
        const char *doc = k ? html : md;
        cr_expect(strstr(doc, "Compute utilisation (mean over islands)") &&
                      strstr(doc, "fault run 87.5% (2 of 3 islands); baseline not recorded"),
                  "%s", doc);
        cr_expect(strstr(doc, "Compute utilisation against outer step") != NULL, "chart");
    }
    cr_expect(strstr(html, "<td>siteA</td><td>6</td><td>12.00</td><td>60.00</td><td>80.0%</td>"
                           "<td>70.0%</td>") != NULL,
              "%s", html);
    /* per outer step, the mean over records: step 2 is (70% + 95%) / 2 */
    cr_expect(strstr(html, "fault run: 82.5% at outer step 2") != NULL, "%s", html);
    cr_expect(strstr(html, "fault run: 90.0% at outer step 3") != NULL, "%s", html);
    loco_free(md);
    loco_free(html);
}

Test(report, utilisation_not_recorded_without_the_fields) {
    static char out[1 << 16];
    variant v = {0};
    cr_assert_eq(report(out, sizeof out, &v, NULL), 0, "%s", out);
    char *md = slurp("report.md");
    cr_expect(strstr(md, "## Compute utilisation\n\nNot recorded: no outer.jsonl record of "
                         "either run carries") != NULL,
              "%s", md);
    cr_expect(strstr(md, "fault run not recorded; baseline not recorded") != NULL, "%s", md);
    cr_expect(strstr(md, "Compute utilisation against outer step") == NULL, "no chart");
    loco_free(md);
}

Test(report, unusable_utilisation_fields_are_warned_and_skipped) {
    static char out[1 << 16];
    variant v = {.utilisation = true};
    write_baseline();
    write_fault(&v);
    char path[700];
    snprintf(path, sizeof path, "%s/fault/siteC/outer.jsonl", dir);
    FILE *f = fopen(path, "a");
    cr_assert(f);
    fprintf(f, "{\"outer_step\":7,\"wait_s\":12,\"wall_s\":10}\n"); /* line 6 */
    fclose(f);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/fault %s/base", dir, dir), 0, "%s",
                 out);
    cr_expect(strstr(out, "siteC/outer.jsonl:6: \"wait_s\" and \"wall_s\" not usable") != NULL,
              "%s", out);
    char *md = slurp("report.md");
    cr_expect(strstr(md, "| fault run | siteC | 0 | — | — | not recorded | — |") != NULL, "%s",
              md);
    loco_free(md);
}

Test(report, out_dir_and_escaping) {
    static char out[1 << 16];
    variant v = {.detail = "<script>alert(1)</script> & *bold* | pipe"};
    char extra[700];
    snprintf(extra, sizeof extra, "--out %s/rep", dir);
    cr_assert_eq(report(out, sizeof out, &v, extra), 0, "%s", out);
    char path[700];
    void *data;
    size_t len;
    snprintf(path, sizeof path, "%s/rep/report.html", dir);
    cr_assert_eq(loco_file_read(path, &data, &len), 0);
    cr_expect(strstr(data, "<script>") == NULL);
    cr_expect(strstr(data, "&lt;script&gt;alert(1)&lt;/script&gt; &amp; *bold* | pipe") != NULL);
    loco_free(data);
    snprintf(path, sizeof path, "%s/rep/report.md", dir);
    cr_assert_eq(loco_file_read(path, &data, &len), 0);
    cr_expect(strstr(data, "<script>") == NULL);
    cr_expect(strstr(data, "&lt;script&gt;alert(1)&lt;/script&gt; &amp; \\*bold\\* \\| pipe") !=
                  NULL,
              "%s", (char *)data);
    loco_free(data);
}

/* A fault whose cycle did not complete (siteB never rejoined), and one the
 * plan had that was never injected: INCOMPLETE, with both reasons, and the
 * exit status says so; a FAIL still outranks it. */
Test(report, incomplete_cycle_is_not_a_pass) {
    char out[8192];
    variant v = {.no_rejoin = true, .planned = true};
    cr_expect_eq(report(out, sizeof out, &v, NULL), 1, "%s", out);
    cr_expect(strstr(out, "verdict: INCOMPLETE: a fault's cycle did not complete: kill of siteB: "
                          "siteB never came back; freeze of siteC: not injected: due at inner "
                          "step 500; the run ended at outer step 6") != NULL,
              "%s", out);
    char *md = slurp("report.md");
    cr_expect(strstr(md, "**Verdict: INCOMPLETE**") != NULL, "%s", md);
    cr_expect(strstr(md, "| 1 | kill | siteB | 10.00 | 12.50 | 2.50 | — | — | INCOMPLETE: siteB "
                         "never came back |") != NULL,
              "%s", md);
    loco_free(md);
    variant w = {.no_rejoin = true, .divergence = true};
    cr_expect_eq(report(out, sizeof out, &w, NULL), 1, "%s", out);
    cr_expect(strstr(out, "verdict: FAIL: divergence at outer step 5") &&
                  strstr(out, "a fault's cycle did not complete: kill of siteB"),
              "%s", out);
}

Test(report, divergence_fails) {
    static char out[1 << 16];
    variant v = {.divergence = true};
    cr_expect_eq(report(out, sizeof out, &v, NULL), 1, "%s", out);
    cr_expect(strstr(out, "verdict: FAIL") && strstr(out, "divergence at outer step 5: siteA != "
                                                          "siteB"),
              "%s", out);
    char *md = slurp("report.md");
    cr_expect(strstr(md, "**Verdict: FAIL**") != NULL);
    loco_free(md);
}

Test(report, failed_or_missing_end_fails) {
    static char out[1 << 16];
    variant v = {.end_failed = true};
    cr_expect_eq(report(out, sizeof out, &v, NULL), 1, "%s", out);
    cr_expect(strstr(out, "ended with status failed (island siteB lost)") != NULL, "%s", out);
    variant w = {.no_end = true};
    cr_expect_eq(report(out, sizeof out, &w, NULL), 1, "%s", out);
    cr_expect(strstr(out, "did not finish (no end event)") != NULL, "%s", out);
}

Test(report, lost_update_fails) {
    static char out[1 << 16];
    variant v = {.drop_commit3 = true};
    cr_expect_eq(report(out, sizeof out, &v, NULL), 1, "%s", out);
    cr_expect(strstr(out, "lost update: 1 outer step never committed in the fault run (3)") != NULL,
              "%s", out);
}

Test(report, differing_final_hashes_fail) {
    static char out[1 << 16];
    variant v = {.bad_hash = true};
    cr_expect_eq(report(out, sizeof out, &v, NULL), 1, "%s", out);
    cr_expect(strstr(out, "θ hash of siteB at outer step 6") != NULL, "%s", out);
}

Test(report, loss_tolerance_fails_only_when_strict) {
    static char out[1 << 16];
    variant v = {.loss_scale = 1.05};
    cr_expect_eq(report(out, sizeof out, &v, NULL), 0, "%s", out);
    char *md = slurp("report.md");
    cr_expect(strstr(md, "+5.00%, outside the tolerance of 1.00%") != NULL, "%s", md);
    loco_free(md);
    cr_expect_eq(report(out, sizeof out, &v, "--loss-tol 0.1 --strict-loss"), 0, "%s", out);
    cr_expect_eq(report(out, sizeof out, &v, "--strict-loss"), 1, "%s", out);
    cr_expect(strstr(out, "final loss differs from the baseline by +5.00%") != NULL, "%s", out);
}

Test(report, malformed_line_is_reported_and_skipped) {
    static char out[1 << 16];
    variant v = {.malformed = true};
    cr_expect_eq(report(out, sizeof out, &v, NULL), 0, "%s", out);
    cr_expect(strstr(out, "fault/events.jsonl:6: malformed line skipped") != NULL, "%s", out);
    cr_expect(strstr(out, "verdict: PASS") != NULL, "%s", out);
    char *md = slurp("report.md");
    cr_expect(strstr(md, "## Warnings") && strstr(md, "events.jsonl:6: malformed"), "%s", md);
    /* the lines after it still count */
    cr_expect(strstr(md, "| 1 | kill | siteB | 10.00 | 12.50 | 2.50 |") != NULL, "%s", md);
    loco_free(md);
}

Test(report, missing_inputs_are_clear_errors) {
    static char out[1 << 16];
    variant v = {0};
    write_baseline();
    write_fault(&v);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/fault %s/nobaseline", dir, dir), 1);
    cr_expect(strstr(out, "baseline run directory") && strstr(out, "/nobaseline"), "%s", out);
    char path[700];
    snprintf(path, sizeof path, "%s/base/events.jsonl", dir);
    cr_assert_eq(remove(path), 0);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/fault %s/base", dir, dir), 1);
    cr_expect(strstr(out, "base/events.jsonl: cannot open") != NULL, "%s", out);
    loco_rmtree(dir);
    v.no_metrics_c = true;
    cr_expect_eq(report(out, sizeof out, &v, NULL), 1, "%s", out);
    cr_expect(strstr(out, "fault/siteC/metrics.jsonl: cannot open") != NULL, "%s", out);
}

Test(report, usage_errors_exit_2) {
    static char out[4096];
    cr_expect_eq(test_run(out, sizeof out, LOCO " report"), 2);
    /* one directory is a training run's (tests/report/test_report_train.c):
     * a missing one is an input error naming it, not a usage error */
    cr_expect_eq(test_run(out, sizeof out, LOCO " report /nonexistent-run-dir"), 1);
    cr_expect(strstr(out, "/nonexistent-run-dir"), "%s", out);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report a --frob"), 2);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report a b c"), 2);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report a b --loss-tol -1"), 2);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report a b --frob"), 2);
}
