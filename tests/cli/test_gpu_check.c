/* scripts/gpu-check.sh without a GPU: --dry-run goes through every step,
 * reports each GPU step skipped ("no GPU", with the reason) and still writes
 * results.json (checked key by key with cJSON) and table.md into $OUT; the
 * step budgets add up to under 8 minutes; the script is bash -n and
 * shellcheck clean. Runs from the repository root, as tests/run.sh does. */
#include "tests/support.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define SCRIPT "scripts/gpu-check.sh"

static char *dir;

static void setup(void) {
    dir = test_tmpdir("loco-gpu-check");
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(gpu_check, .init = setup, .fini = teardown, .timeout = 10);

static char *slurp(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s was not written", path);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    cr_assert(s);
    cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

/* The dry run into dir; returns its exit status, its console in out. */
static int dry_run(char *out, size_t cap) {
    return test_run(out, cap, "OUT=%s/out GPU_CHECK_BUILD=%s/build bash " SCRIPT " --dry-run", dir,
                    dir);
}

static const cJSON *get(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    cr_assert(v, "results.json: no \"%s\"", key);
    return v;
}

static bool starts(const char *s, const char *prefix) {
    return s && !strncmp(s, prefix, strlen(prefix));
}

Test(gpu_check, dry_run_writes_results_with_every_gpu_step_skipped) {
    static char out[1 << 16];
    const int rc = dry_run(out, sizeof out);
    cr_assert_eq(rc, 0, "dry run exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "tests: skipped: no GPU"), "%s", out);

    char *text = slurp("out/results.json");
    cJSON *r = cJSON_Parse(text);
    cr_assert(r, "results.json is not JSON:\n%s", text);
    cr_expect(cJSON_IsString(get(r, "date")) && strlen(get(r, "date")->valuestring) == 20);
    cr_expect_str_eq(get(r, "how")->valuestring, "dry-run");
    cr_expect(strstr(get(r, "command")->valuestring, SCRIPT " --dry-run"));
    cr_expect_eq(get(r, "exit_status")->valueint, 0);

    const cJSON *dev = get(r, "device");
    static const char *const dev_keys[] = {"name",  "driver_version", "cuda_runtime", "cublaslt",
                                           "cudnn", "nccl",           "torch"};
    for (size_t i = 0; i < sizeof dev_keys / sizeof *dev_keys; i++)
        cr_expect(cJSON_IsNull(get(dev, dev_keys[i])), "device.%s should be null", dev_keys[i]);

    /* every step skipped for want of a GPU, each with its timeout; the
     * timeouts add up to less than the deadline, itself under 8 minutes */
    const cJSON *budget = get(get(r, "budget_s"), "steps"), *b;
    int sum = 0;
    cJSON_ArrayForEach(b, budget) sum += b->valueint;
    const int total = get(get(r, "budget_s"), "total")->valueint;
    cr_expect_lt(sum - get(budget, "summary")->valueint, total, "steps %d s, deadline %d s", sum,
                 total);
    cr_expect_lt(total + get(budget, "summary")->valueint, 8 * 60);
    const cJSON *steps = get(r, "steps"), *s;
    cr_expect_eq(cJSON_GetArraySize(steps), 12); /* multi-rank and loco-recompute included */
    cJSON_ArrayForEach(s, steps) {
        const char *name = get(s, "name")->valuestring;
        cr_expect_str_eq(get(s, "status")->valuestring, "skipped", "%s", name);
        cr_expect(starts(get(s, "reason")->valuestring, "no GPU"), "%s: %s", name,
                  get(s, "reason")->valuestring);
        cr_expect(cJSON_IsNumber(get(s, "timeout_s")), "%s", name);
    }

    const cJSON *t = get(r, "tests");
    static const char *const counts[] = {"tested", "passed", "failed", "crashed"};
    for (size_t i = 0; i < 4; i++)
        cr_expect_eq(get(t, counts[i])->valueint, 0, "tests.%s", counts[i]);
    const cJSON *skipped = get(t, "skipped");
    cr_expect_geq(cJSON_GetArraySize(skipped), 7, "one entry per GPU suite");
    bool kernels = false;
    cJSON_ArrayForEach(s, skipped) {
        const char *name = get(s, "name")->valuestring;
        kernels |= !strcmp(name, "gpu_kernels::*");
        cr_expect(starts(get(s, "reason")->valuestring, "no GPU: dry run"), "%s", name);
    }
    cr_expect(kernels, "gpu_kernels::* not among the skipped");

    /* each benchmark named with its reference, nothing measured */
    const cJSON *benches = get(r, "benchmarks");
    const char *want[] = {"gpt2_124m_train_tokens_per_s_vs_eager",
                          "gpt2_124m_train_tokens_per_s_vs_compile",
                          "attention_fwd_bwd_B16_T1024_12x64_bf16", "codec_int8_encode_2^27_floats",
                          "codec_int8_decode_2^27_floats"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        bool found = false;
        cJSON_ArrayForEach(s, benches) found |= !strcmp(get(s, "name")->valuestring, want[i]);
        cr_expect(found, "no benchmark %s", want[i]);
    }
    cJSON_ArrayForEach(s, benches) {
        const char *name = get(s, "name")->valuestring;
        cr_expect(cJSON_IsNull(get(s, "loco")) && cJSON_IsNull(get(s, "reference")) &&
                      cJSON_IsNull(get(s, "ratio")),
                  "%s: a value in a dry run", name);
        cr_expect(strlen(get(s, "reference_name")->valuestring) > 10, "%s", name);
        cr_expect(strlen(get(s, "unit")->valuestring) > 0, "%s", name);
        cr_expect(starts(get(s, "note")->valuestring, "skipped: no GPU"), "%s", name);
    }
    const cJSON *runs = get(get(r, "gpt2"), "runs");
    cr_expect(cJSON_IsObject(get(runs, "loco-gpt2")));
    cr_expect(cJSON_IsNull(get(get(runs, "pytorch-compile"), "tok_per_s")));
    cr_expect_gt(get(get(r, "gpt2"), "flops_per_token")->valuedouble, 8e8);
    cJSON_Delete(r);
    free(text);

    char *md = slurp("out/table.md");
    cr_expect(strstr(md, "| benchmark | loco | reference |"), "%s", md);
    cr_expect(strstr(md, "scaled_dot_product_attention"), "%s", md);
    cr_expect(strstr(md, "scripts/gpu-check.sh --dry-run`"), "%s", md);
    cr_expect(strstr(md, "no GPU: dry run"), "%s", md);
    free(md);
}

Test(gpu_check, script_is_sound) {
    char out[8192];
    cr_expect_eq(test_run(out, sizeof out, "bash -n " SCRIPT), 0, "%s", out);
    if (test_run(out, sizeof out, "command -v shellcheck") == 0)
        cr_expect_eq(test_run(out, sizeof out, "shellcheck " SCRIPT), 0, "%s", out);
    cr_expect_eq(test_run(out, sizeof out, "bash " SCRIPT " --no-such-flag"), 2, "%s", out);
}

/* Without --dry-run and without a GPU nothing is checked: exit status 2,
 * results still written. */
Test(gpu_check, real_run_without_gpu_exits_2) {
    char out[1 << 15];
    if (test_run(out, sizeof out, "command -v nvidia-smi") == 0)
        cr_skip_test("nvidia-smi is here: a real run would use the GPU and take minutes");
    const int rc =
        test_run(out, sizeof out, "OUT=%s/out GPU_CHECK_BUILD=%s/build bash " SCRIPT, dir, dir);
    cr_expect_eq(rc, 2, "exit %d:\n%s", rc, out);
    char *text = slurp("out/results.json");
    cJSON *r = cJSON_Parse(text);
    cr_assert(r, "%s", text);
    cr_expect_eq(get(r, "exit_status")->valueint, 2);
    cr_expect(starts(get(get(r, "tests"), "status")->valuestring, "skipped"));
    cJSON_Delete(r);
    free(text);
}
