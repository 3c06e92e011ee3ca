/* `loco bench tokenizer`: MB/s of text encoded by tokenizer/'s byte-level
 * BPE, on one core and on all cores, beside GPT-2's regex split alone
 * (PCRE2, no merges) and the plain Python reference BPE of
 * tests/fixtures/bpe_ref.py measured in the same run on the same text. */
#include "bench/bench.h"
#include "core/core.h"
#include "tokenizer/tokenizer.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* CPU seconds of this process (all threads). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* s: wall seconds; cpu: CPU seconds (MB per CPU second is the per-core
 * speed, whatever else the machine runs). */
static void row(const char *what, int threads, size_t bytes, double s, double cpu, size_t ids) {
    char percpu[32] = "-";
    if (cpu > 0)
        snprintf(percpu, sizeof percpu, "%.2f", (double)bytes / 1e6 / cpu);
    printf("| %-34s | %7d | %8.2f | %9.2f | %13s | %10zu |\n", what, threads, (double)bytes / 1e6,
           (double)bytes / 1e6 / s, percpu, ids);
}

int loco_bench_tokenizer(int argc, char **argv) {
    const char *text_path = "data/kjv.txt", *spec = "data/kjv_bpe_tokenizer.json";
    int reps = 3;
    double py_mb = 1.0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc)
            text_path = argv[++i];
        else if (!strcmp(argv[i], "--tokenizer") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]) > 0 ? atoi(argv[i]) : 1;
        else if (!strcmp(argv[i], "--python-mb") && i + 1 < argc)
            py_mb = atof(argv[++i]);
        else
            return LOCO_ERR(LOCO_EINVAL,
                            "bench tokenizer: unexpected argument %s (options: "
                            "--text FILE --tokenizer FILE --reps N --python-mb MB)",
                            argv[i]);
    }
    loco_tok *t;
    LOCO_CHECK(loco_tok_load(&t, spec));
    void *data;
    size_t len;
    int rc = loco_file_read(text_path, &data, &len);
    if (rc < 0) {
        loco_tok_destroy(t);
        return rc;
    }
    const uint8_t *text = data;
    int all = omp_get_max_threads();
    printf("tokenizer %s (%d ids, %d merges) on %s (%.2f MB); best of %d\n\n", spec,
           loco_tok_vocab_size(t), loco_tok_num_merges(t), text_path, (double)len / 1e6, reps);
    printf("| %-34s | threads | MB       | MB/s wall | MB/CPU-second | ids/pieces |\n", "encoder");
    printf("|------------------------------------|---------|----------|-----------|---------------|"
           "------------|\n");
    double best = 1e30, bcpu = 1e30;
    size_t pieces = 0, n = 0;
    for (int r = 0; r < reps && rc == 0; r++) {
        double t0 = loco_now(), c0 = cpu_now();
        rc = loco_tok_split_count(t, text, len, &pieces);
        double dt = loco_now() - t0, dc = cpu_now() - c0;
        best = dt < best ? dt : best;
        bcpu = dc < bcpu ? dc : bcpu;
    }
    if (rc == 0)
        row("GPT-2 regex split only (PCRE2)", 1, len, best, bcpu, pieces);
    best = bcpu = 1e30;
    for (int r = 0; r < reps && rc == 0; r++) {
        int32_t *ids;
        double t0 = loco_now(), c0 = cpu_now();
        rc = loco_tok_encode(t, text, len, &ids, &n);
        double dt = loco_now() - t0, dc = cpu_now() - c0;
        best = dt < best ? dt : best;
        bcpu = dc < bcpu ? dc : bcpu;
        loco_free(ids);
    }
    if (rc == 0)
        row("loco BPE (split + merges)", 1, len, best, bcpu, n);
    best = bcpu = 1e30;
    for (int r = 0; r < reps && rc == 0; r++) {
        int32_t *ids;
        double t0 = loco_now(), c0 = cpu_now();
        rc = loco_tok_encode_parallel(t, text, len, 1 << 18, all, NULL, NULL, &ids, &n);
        double dt = loco_now() - t0, dc = cpu_now() - c0;
        best = dt < best ? dt : best;
        bcpu = dc < bcpu ? dc : bcpu;
        loco_free(ids);
    }
    if (rc == 0)
        row("loco BPE (split + merges)", all, len, best, bcpu, n);
    /* the Python reference on the first py_mb MB (cut after a newline) */
    size_t plen = (size_t)(py_mb * 1e6) < len ? (size_t)(py_mb * 1e6) : len;
    while (plen < len && plen > 0 && text[plen - 1] != '\n')
        plen--;
    char tmp[] = "/tmp/loco-bench-tok-XXXXXX";
    int fd = rc == 0 ? mkstemp(tmp) : -1;
    if (fd >= 0) {
        ssize_t w = write(fd, text, plen);
        close(fd);
        char cmd[1024], out[512] = {0};
        snprintf(cmd, sizeof cmd, "python3 tests/fixtures/bpe_ref.py bench '%s' '%s' 2>/dev/null",
                 spec, tmp);
        FILE *p = w == (ssize_t)plen ? popen(cmd, "r") : NULL;
        size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
        int st = p ? pclose(p) : -1;
        const char *m = got ? strstr(out, "\"mb_per_s\": ") : NULL;
        const char *k = got ? strstr(out, "\"ids\": ") : NULL;
        if (st == 0 && m && k) {
            double mbs = atof(m + 12);
            const char *c = strstr(out, "\"cpu_seconds\": ");
            row("Python reference BPE (bpe_ref.py)", 1, plen, (double)plen / 1e6 / mbs,
                c ? atof(c + 15) : 0, (size_t)atoll(k + 7));
        } else {
            printf("| %-34s | (python3 tests/fixtures/bpe_ref.py not runnable here) |\n",
                   "Python reference BPE");
        }
        unlink(tmp);
    }
    loco_free(data);
    loco_tok_destroy(t);
    return rc;
}
