/* core/: errors and breadcrumbs, logging, the RNG against a reference
 * xoshiro256** written here from the published algorithm, XXH3, allocation
 * with failure injection, files and atomic directory commits, tensor tables,
 * safetensors (round trip, an independent JSON parse, a file written by
 * Python, and every kind of damage refused), and JSONL metrics.
 *
 * Why one file: core/'s small pieces, a few tests each, share the fixtures. */
#include "core/core.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

static char *dir;

static void setup(void) {
    dir = strdup("/tmp/loco-core-XXXXXX");
    cr_assert(mkdtemp(dir));
    loco_err_clear();
}

static void teardown(void) {
    loco_alloc_fail_after(0);
    loco_rmtree(dir);
    free(dir);
}

/* dir/name into buf (512 bytes). */
static const char *in_dir(char *buf, const char *name) {
    snprintf(buf, 512, "%s/%s", dir, name);
    return buf;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void assert_has(const char *msg, const char *part) {
    cr_assert(strstr(msg, part), "message lacks \"%s\":\n%s", part, msg);
}

/* ================================================================ errors */

TestSuite(errors, .init = setup, .fini = teardown);

Test(errors, strerror_names_every_code) {
    static const struct {
        int rc;
        const char *name;
    } codes[] = {{LOCO_OK, "LOCO_OK"},
                 {LOCO_EINVAL, "LOCO_EINVAL"},
                 {LOCO_ENOMEM, "LOCO_ENOMEM"},
                 {LOCO_EIO, "LOCO_EIO"},
                 {LOCO_ETIMEDOUT, "LOCO_ETIMEDOUT"},
                 {LOCO_EPROTO, "LOCO_EPROTO"},
                 {LOCO_EAUTH, "LOCO_EAUTH"},
                 {LOCO_EPEER, "LOCO_EPEER"},
                 {LOCO_ECUDA, "LOCO_ECUDA"},
                 {LOCO_ENCCL, "LOCO_ENCCL"},
                 {LOCO_EMPI, "LOCO_EMPI"},
                 {LOCO_ENOTSUP, "LOCO_ENOTSUP"}};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *s = loco_strerror(codes[i].rc);
        cr_assert(s);
        /* The name, then ':' (so LOCO_EIO does not pass as a prefix of another). */
        size_t n = strlen(codes[i].name);
        cr_expect(!strncmp(s, codes[i].name, n) && s[n] == ':', "%d -> %s", codes[i].rc, s);
    }
    cr_expect(strstr(loco_strerror(-99), "unknown"));
    cr_expect(strstr(loco_strerror(7), "unknown"));
}

/* __LINE__ inside a macro is the line of the invocation, so these record
 * the line LOCO_ERR / LOCO_CHECK see, whatever a formatter does. */
#define ERR_AT(line_out, ...) (*(line_out) = __LINE__, LOCO_ERR(__VA_ARGS__))
#define CHECK_AT(line_out, call)                                                                   \
    do {                                                                                           \
        *(line_out) = __LINE__;                                                                    \
        LOCO_CHECK(call);                                                                          \
    } while (0)

Test(errors, err_prefixes_file_and_line) {
    int line;
    int rc = ERR_AT(&line, LOCO_EIO, "boom %d %s", 7, "x");
    cr_assert_eq(rc, LOCO_EIO);
    char want[128];
    snprintf(want, sizeof want, "test_core.c:%d: boom 7 x", line);
    cr_expect_str_eq(loco_errmsg(), want);
    loco_err_clear();
    cr_expect_str_eq(loco_errmsg(), "");
}

static int check_line;
static int leaf(void) {
    return LOCO_ERR(LOCO_EPROTO, "bad frame");
}
static int middle(void) {
    CHECK_AT(&check_line, leaf());
    return 0;
}
static int top_goto(bool *cleaned) {
    int rc = 0;
    LOCO_CHECK_GOTO(middle(), out_clean);
    cr_assert_fail("LOCO_CHECK_GOTO did not jump");
out_clean:
    *cleaned = true;
    return rc;
}

Test(errors, check_leaves_breadcrumbs) {
    bool cleaned = false;
    cr_assert_eq(top_goto(&cleaned), LOCO_EPROTO);
    cr_expect(cleaned);
    const char *msg = loco_errmsg();
    char want[128];
    snprintf(want, sizeof want, "\n  at test_core.c:%d (leaf())", check_line);
    assert_has(msg, "bad frame");
    assert_has(msg, want);
    assert_has(msg, "(middle())");
    /* Innermost first: the message reads like a backtrace. */
    cr_expect_lt(strstr(msg, "(leaf())"), strstr(msg, "(middle())"));
}

static int succeeds(void) {
    return 3;
}
static int check_passes_nonnegative(void) {
    LOCO_CHECK(succeeds());
    return 0;
}

Test(errors, check_passes_success_through) {
    cr_expect_eq(check_passes_nonnegative(), 0);
    cr_expect_str_eq(loco_errmsg(), "");
}

Test(errors, long_messages_are_truncated_not_overflowed) {
    char *big = malloc(10000);
    memset(big, 'z', 9999);
    big[9999] = '\0';
    LOCO_ERR(LOCO_EINVAL, "%s", big);
    size_t n = strlen(loco_errmsg());
    cr_expect(n > 1000 && n < 4096, "%zu", n);
    for (int i = 0; i < 100; i++)
        loco__err_trace(__FILE__, __LINE__, "again()");
    cr_expect_lt(strlen(loco_errmsg()), 4096);
    free(big);
}

static void *set_error_in_thread(void *arg) {
    LOCO_ERR(LOCO_EPEER, "from the other thread");
    *(bool *)arg = strstr(loco_errmsg(), "other thread") != NULL;
    return NULL;
}

Test(errors, message_is_per_thread) {
    LOCO_ERR(LOCO_EIO, "main thread");
    bool seen = false;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, set_error_in_thread, &seen), 0);
    pthread_join(t, NULL);
    cr_expect(seen);
    assert_has(loco_errmsg(), "main thread");
}

/* =================================================================== log */

TestSuite(log, .init = setup, .fini = teardown);

Test(log, parse_level) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        loco_log_level l = LOCO_LOG_ERROR;
        cr_expect_eq(loco_log_parse_level(names[i], &l), 0);
        cr_expect_eq((int)l, i);
    }
    loco_log_level l = LOCO_LOG_WARN;
    cr_expect_eq(loco_log_parse_level("loud", &l), LOCO_EINVAL);
    cr_expect_eq(l, LOCO_LOG_WARN, "untouched on error");
    assert_has(loco_errmsg(), "'loud'");
    cr_expect_eq(loco_log_parse_level("INFO", &l), LOCO_EINVAL);
}

Test(log, filters_by_level_one_line_each) {
    char path[512];
    in_dir(path, "stderr.txt");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    cr_assert(fd >= 0);
    fflush(stderr);
    int saved = dup(2);
    dup2(fd, 2);
    loco_log_set_level(LOCO_LOG_WARN);
    cr_expect_eq(loco_log_get_level(), LOCO_LOG_WARN);
    loco_info("hidden %d", 1);
    loco_debug("hidden %d", 2);
    loco_warn("shown %d", 3);
    loco_error("boom");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    loco_log_set_level(LOCO_LOG_INFO);
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0);
    const char *s = data;
    cr_expect_null(strstr(s, "hidden"), "%s", s);
    assert_has(s, " warn  shown 3\n");
    assert_has(s, " error boom\n");
    int lines = 0;
    for (const char *p = s; *p; p++)
        lines += *p == '\n';
    cr_expect_eq(lines, 2, "%s", s);
    /* HH:MM:SS.mmm timestamp first. */
    cr_expect(s[2] == ':' && s[5] == ':' && s[8] == '.' && s[12] == ' ', "%s", s);
    loco_free(data);
}

/* =================================================================== RNG */

/* Reference splitmix64 and xoshiro256** transcribed from Vigna's published
 * C sources (prng.di.unimi.it/splitmix64.c, xoshiro256starstar.c). */
static uint64_t ref_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    return z ^ (z >> 31);
}

static uint64_t ref_rotl(const uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t ref_next(uint64_t s[4]) {
    const uint64_t result = ref_rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ref_rotl(s[3], 45);
    return result;
}

TestSuite(rng);

Test(rng, matches_reference_xoshiro256starstar) {
    const uint64_t seeds[] = {0, 1, 1337, 0xdeadbeefcafebabeULL, UINT64_MAX};
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
        uint64_t x = seeds[k], s[4];
        for (int i = 0; i < 4; i++)
            s[i] = ref_splitmix64(&x);
        loco_rng r;
        loco_rng_seed(&r, seeds[k]);
        for (int i = 0; i < 4; i++)
            cr_expect_eq(r.s[i], s[i], "seed %llu state word %d", (unsigned long long)seeds[k], i);
        for (int i = 0; i < 10; i++) {
            uint64_t want = ref_next(s);
            cr_expect_eq(loco_rng_u64(&r), want, "seed %llu output %d",
                         (unsigned long long)seeds[k], i);
        }
    }
}

/* Published splitmix64 outputs for seed 0 (the state seed 0 starts from). */
Test(rng, seed_zero_state_is_published_splitmix64) {
    loco_rng r;
    loco_rng_seed(&r, 0);
    cr_expect_eq(r.s[0], 0xe220a8397b1dcdafULL);
    cr_expect_eq(r.s[1], 0x6e789e6aa1b965f4ULL);
    cr_expect_eq(r.s[2], 0x06c45d188009454fULL);
    cr_expect_eq(r.s[3], 0xf88bb8a8724c81ecULL);
}

Test(rng, same_seed_same_sequence_different_seeds_differ) {
    loco_rng a, b, c;
    loco_rng_seed(&a, 42);
    loco_rng_seed(&b, 42);
    loco_rng_seed(&c, 43);
    int differ = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = loco_rng_u64(&a);
        cr_assert_eq(x, loco_rng_u64(&b));
        differ += x != loco_rng_u64(&c);
    }
    cr_expect_eq(differ, 1000);
    /* The state is plain: a copy continues the same stream. */
    loco_rng copy = a;
    cr_expect_eq(loco_rng_u64(&copy), loco_rng_u64(&a));
}

Test(rng, uniform_in_unit_interval_with_mean_half) {
    loco_rng r;
    loco_rng_seed(&r, 7);
    const int n = 100000;
    double sum = 0, sumd = 0;
    float lo = 1, hi = 0;
    for (int i = 0; i < n; i++) {
        float u = loco_rng_uniform(&r);
        double d = loco_rng_uniform_d(&r);
        cr_assert(u >= 0.0f && u < 1.0f, "%.9g", u);
        cr_assert(d >= 0.0 && d < 1.0, "%.17g", d);
        lo = fminf(lo, u), hi = fmaxf(hi, u);
        sum += u, sumd += d;
    }
    /* sd of the mean = sqrt(1/12/n) = 0.00091; allow ~5 sigma. */
    cr_expect(fabs(sum / n - 0.5) < 0.0046, "mean %g", sum / n);
    cr_expect(fabs(sumd / n - 0.5) < 0.0046, "mean %g", sumd / n);
    cr_expect(lo < 1e-3 && hi > 1 - 1e-3, "range [%g, %g]", lo, hi);
}

/* Inverse of an odd number modulo 2^64 (Newton: each step doubles the bits). */
static uint64_t inv_odd(uint64_t a) {
    uint64_t x = a;
    for (int i = 0; i < 6; i++)
        x *= 2 - a * x;
    return x;
}

/* A state whose next loco_rng_u64 output is exactly `out`. */
static loco_rng state_giving(uint64_t out) {
    uint64_t y = out * inv_odd(9);     /* = rotl(s1 * 5, 7) */
    uint64_t z = (y >> 7) | (y << 57); /* = s1 * 5 */
    loco_rng r = {{0x1234, z * inv_odd(5), 0x5678, 0x9abc}};
    return r;
}

Test(rng, uniform_extremes_stay_in_half_open_interval) {
    loco_rng r = state_giving(UINT64_MAX);
    loco_rng r2 = r;
    cr_assert_eq(loco_rng_u64(&r2), UINT64_MAX, "state construction");
    r2 = r;
    cr_expect_lt(loco_rng_uniform(&r2), 1.0f);
    r2 = r;
    cr_expect_lt(loco_rng_uniform_d(&r2), 1.0);
    r = state_giving(0);
    r2 = r;
    cr_expect_eq(loco_rng_uniform(&r2), 0.0f);
    r2 = r;
    cr_expect_eq(loco_rng_uniform_d(&r2), 0.0);
    /* A normal draw whose first uniform is exactly 0 stays finite. */
    r2 = r;
    cr_expect(isfinite(loco_rng_normal(&r2)));
}

Test(rng, normal_has_mean_zero_variance_one) {
    loco_rng r;
    loco_rng_seed(&r, 11);
    const int n = 100000;
    double sum = 0, sq = 0, quart = 0;
    int beyond3 = 0;
    for (int i = 0; i < n; i++) {
        double x = loco_rng_normal(&r);
        cr_assert(isfinite(x));
        sum += x, sq += x * x, quart += x * x * x * x;
        beyond3 += fabs(x) > 3;
    }
    double mean = sum / n, var = sq / n - mean * mean;
    /* sd of the mean 1/sqrt(n) = 0.0032, of the variance sqrt(2/n) = 0.0045. */
    cr_expect(fabs(mean) < 0.016, "mean %g", mean);
    cr_expect(fabs(var - 1) < 0.023, "variance %g", var);
    cr_expect(fabs(quart / n - 3) < 0.15, "fourth moment %g", quart / n); /* 3 for a normal */
    /* P(|x| > 3) = 0.0027: 270 expected, sd 16. */
    cr_expect(beyond3 > 190 && beyond3 < 350, "%d beyond 3 sigma", beyond3);
}

/* ================================================================== hash */

TestSuite(hash);

Test(hash, xxh3_known_value_and_hex) {
    cr_expect_eq(loco_hash64("", 0), 0x2D06800538D394C2ULL);
    char hex[17];
    loco_hash_hex(0x2D06800538D394C2ULL, hex);
    cr_expect_str_eq(hex, "2d06800538d394c2");
    loco_hash_hex(0x1, hex);
    cr_expect_str_eq(hex, "0000000000000001");
}

Test(hash, covers_every_byte) {
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++)
        buf[i] = (unsigned char)(i * 31 + 7);
    uint64_t h = loco_hash64(buf, sizeof buf);
    cr_expect_eq(h, XXH3_64bits(buf, sizeof buf));
    cr_expect_neq(h, loco_hash64(buf, sizeof buf - 1), "length matters");
    buf[999] ^= 1;
    cr_expect_neq(h, loco_hash64(buf, sizeof buf), "last byte matters");
    buf[999] ^= 1;
    buf[0] ^= 0x80;
    cr_expect_neq(h, loco_hash64(buf, sizeof buf), "first byte matters");
    cr_expect_neq(loco_hash64("a", 1), loco_hash64("b", 1));
    cr_expect_neq(loco_hash64("a", 1), loco_hash64("", 0));
}

/* ================================================================= alloc */

static void disarm(void) {
    loco_alloc_fail_after(0);
}

TestSuite(alloc, .fini = disarm);

Test(alloc, aligned_and_zeroed) {
    const size_t sizes[] = {0, 1, 63, 64, 65, 1000, 1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        /* Dirty a block first so a reused one would show. */
        unsigned char *dirty = loco_alloc(sizes[i] + 1);
        cr_assert(dirty);
        memset(dirty, 0xa5, sizes[i] + 1);
        loco_free(dirty);
        unsigned char *p = loco_alloc(sizes[i]);
        cr_assert(p, "size %zu", sizes[i]);
        cr_expect_eq((uintptr_t)p % 64, 0, "size %zu at %p", sizes[i], (void *)p);
        for (size_t j = 0; j < sizes[i]; j++)
            cr_assert_eq(p[j], 0, "size %zu byte %zu", sizes[i], j);
        loco_free(p);
    }
    loco_free(NULL);
}

Test(alloc, fail_after_n_fails_exactly_the_nth) {
    void *p[6];
    loco_alloc_fail_after(3);
    for (int i = 0; i < 6; i++)
        p[i] = loco_alloc(16);
    cr_expect_not_null(p[0]);
    cr_expect_not_null(p[1]);
    cr_expect_null(p[2], "the 3rd call must fail");
    cr_expect_not_null(p[3], "one failure, then allocations work again");
    cr_expect_not_null(p[4]);
    cr_expect_not_null(p[5]);
    for (int i = 0; i < 6; i++)
        loco_free(p[i]);

    loco_alloc_fail_after(1);
    void *q = loco_alloc(8);
    cr_expect_null(q, "n = 1 fails the very next call");

    loco_alloc_fail_after(2);
    loco_alloc_fail_after(0); /* disarm */
    for (int i = 0; i < 5; i++) {
        q = loco_alloc(8);
        cr_expect_not_null(q, "disarmed, call %d", i);
        loco_free(q);
    }
}

/* ================================================================= files */

TestSuite(files, .init = setup, .fini = teardown);

Test(files, write_sync_read_round_trip) {
    char path[512];
    in_dir(path, "blob.bin");
    unsigned char data[3000];
    for (int i = 0; i < 3000; i++)
        data[i] = (unsigned char)(i * 7); /* includes zero bytes */
    cr_assert_eq(loco_file_write_sync(path, data, sizeof data), 0, "%s", loco_errmsg());
    void *back;
    size_t len;
    cr_assert_eq(loco_file_read(path, &back, &len), 0, "%s", loco_errmsg());
    cr_expect_eq(len, sizeof data);
    cr_expect_eq(memcmp(back, data, sizeof data), 0);
    cr_expect_eq(((char *)back)[len], '\0', "a NUL after the data for text users");
    loco_free(back);

    /* Rewriting truncates. */
    cr_assert_eq(loco_file_write_sync(path, "ab", 2), 0);
    cr_assert_eq(loco_file_read(path, &back, &len), 0);
    cr_expect_eq(len, 2);
    cr_expect_str_eq(back, "ab");
    loco_free(back);

    cr_assert_eq(loco_file_write_sync(path, "", 0), 0);
    cr_assert_eq(loco_file_read(path, &back, &len), 0);
    cr_expect_eq(len, 0);
    cr_expect_not_null(back);
    loco_free(back);
}

Test(files, read_missing_is_eio_naming_the_path) {
    char path[512];
    in_dir(path, "nope.bin");
    void *data = (void *)1;
    size_t len = 9;
    cr_assert_eq(loco_file_read(path, &data, &len), LOCO_EIO);
    cr_expect_null(data);
    cr_expect_eq(len, 0);
    assert_has(loco_errmsg(), path);
}

Test(files, read_a_directory_fails) {
    void *data;
    size_t len;
    int rc = loco_file_read(dir, &data, &len);
    cr_expect_eq(rc, LOCO_EIO, "%s: %s", loco_strerror(rc), loco_errmsg());
    cr_expect_null(data);
    assert_has(loco_errmsg(), dir);
}

Test(files, write_into_missing_dir_is_eio) {
    char path[512];
    in_dir(path, "no/such/dir/file");
    cr_assert_eq(loco_file_write_sync(path, "x", 1), LOCO_EIO);
    assert_has(loco_errmsg(), path);
}

Test(files, read_fails_cleanly_when_allocation_fails) {
    char path[512];
    in_dir(path, "f");
    cr_assert_eq(loco_file_write_sync(path, "hello", 5), 0);
    void *data;
    size_t len;
    loco_alloc_fail_after(1);
    cr_expect_eq(loco_file_read(path, &data, &len), LOCO_ENOMEM);
    cr_expect_null(data);
}

Test(files, mkdirs_nested_and_idempotent) {
    char path[512], file[512];
    in_dir(path, "a/b/c/d");
    cr_assert_eq(loco_mkdirs(path), 0, "%s", loco_errmsg());
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect(S_ISDIR(st.st_mode));
    cr_expect_eq(loco_mkdirs(path), 0, "existing is fine");
    in_dir(path, "x/y/");
    cr_expect_eq(loco_mkdirs(path), 0, "trailing slash: %s", loco_errmsg());
    in_dir(path, "x/y");
    cr_expect(exists(path));

    /* A file in the way is an error, at the end or in the middle. */
    in_dir(file, "plain");
    cr_assert_eq(loco_file_write_sync(file, "x", 1), 0);
    cr_expect_eq(loco_mkdirs(file), LOCO_EIO, "mkdir -p over a file");
    in_dir(path, "plain/sub");
    cr_expect_eq(loco_mkdirs(path), LOCO_EIO);
    assert_has(loco_errmsg(), "plain");
}

Test(files, rmtree_removes_everything_but_follows_no_links) {
    char path[512], outside[512], link[512];
    in_dir(path, "t/a/b");
    cr_assert_eq(loco_mkdirs(path), 0);
    in_dir(path, "t/a/b/f1");
    cr_assert_eq(loco_file_write_sync(path, "1", 1), 0);
    in_dir(path, "t/f2");
    cr_assert_eq(loco_file_write_sync(path, "2", 1), 0);
    in_dir(outside, "keep");
    cr_assert_eq(loco_mkdirs(outside), 0);
    in_dir(path, "keep/precious");
    cr_assert_eq(loco_file_write_sync(path, "p", 1), 0);
    in_dir(link, "t/a/link");
    cr_assert_eq(symlink(outside, link), 0);

    in_dir(path, "t");
    cr_assert_eq(loco_rmtree(path), 0, "%s", loco_errmsg());
    cr_expect_not(exists(path));
    in_dir(path, "keep/precious");
    cr_expect(exists(path), "rmtree followed a symlink");
    cr_expect_eq(loco_rmtree(path), 0, "a plain file");
    cr_expect_not(exists(path));
    in_dir(path, "never-was");
    cr_expect_eq(loco_rmtree(path), 0, "missing is fine");
}

/* A directory with one file `name` holding `text`. */
static void make_dir_with(const char *d, const char *name, const char *text) {
    char path[600];
    cr_assert_eq(loco_mkdirs(d), 0, "%s", loco_errmsg());
    snprintf(path, sizeof path, "%s/%s", d, name);
    cr_assert_eq(loco_file_write_sync(path, text, strlen(text)), 0);
}

static void expect_file(const char *d, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", d, name);
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0, "%s", loco_errmsg());
    cr_expect_str_eq(data, text);
    loco_free(data);
}

Test(files, dir_commit_publishes_and_replaces) {
    char tmp[512], final[512], old[600], path[600];
    in_dir(tmp, "ckpt.tmp");
    in_dir(final, "ckpt");
    snprintf(old, sizeof old, "%s.old", final);

    make_dir_with(tmp, "a", "first");
    cr_assert_eq(loco_dir_commit(tmp, final), 0, "%s", loco_errmsg());
    expect_file(final, "a", "first");
    cr_expect_not(exists(tmp));
    cr_expect_not(exists(old));

    /* Replace: nothing of the old directory survives, no leftovers. */
    make_dir_with(final, "stale", "from the first");
    make_dir_with(tmp, "a", "second");
    cr_assert_eq(loco_dir_commit(tmp, final), 0, "%s", loco_errmsg());
    expect_file(final, "a", "second");
    snprintf(path, sizeof path, "%s/stale", final);
    cr_expect_not(exists(path));
    cr_expect_not(exists(tmp));
    cr_expect_not(exists(old));

    /* A .old left by a crash between the two renames is cleared too. */
    make_dir_with(old, "junk", "x");
    make_dir_with(tmp, "a", "third");
    cr_assert_eq(loco_dir_commit(tmp, final), 0, "%s", loco_errmsg());
    expect_file(final, "a", "third");
    cr_expect_not(exists(old));
    cr_expect_not(exists(tmp));
}

Test(files, dir_commit_without_tmp_fails_and_keeps_final) {
    char tmp[512], final[512];
    in_dir(tmp, "missing.tmp");
    in_dir(final, "ckpt");
    make_dir_with(final, "a", "keep me");
    cr_expect_eq(loco_dir_commit(tmp, final), LOCO_EIO);
    assert_has(loco_errmsg(), tmp);
    expect_file(final, "a", "keep me");
}

Test(files, clocks) {
    double a = loco_now(), b = loco_now();
    cr_expect_geq(b, a);
    cr_expect(fabs(loco_wall_time() - (double)time(NULL)) < 2.0);
}

Test(files, set_threads) {
    cr_expect_eq(loco_set_threads(3), 3);
    cr_expect_eq(omp_get_max_threads(), 3);
    int all = loco_set_threads(0);
    cr_expect_eq(all, (int)sysconf(_SC_NPROCESSORS_ONLN));
    cr_expect_eq(omp_get_max_threads(), all);
}

/* ========================================================= tensor tables */

TestSuite(ttable, .fini = disarm);

Test(ttable, offsets_are_cumulative) {
    loco_ttable tt;
    loco_ttable_init(&tt);
    const int64_t a[2] = {3, 5}, b[1] = {7}, c[4] = {2, 1, 3, 2};
    cr_assert_eq(loco_ttable_add(&tt, "a", 2, a, 0, true), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_ttable_add(&tt, "b", 1, b, -1, false), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_ttable_add(&tt, "c", 4, c, 3, false), 0, "%s", loco_errmsg());
    cr_expect_eq(tt.n, 3);
    cr_expect_eq(tt.t[0].offset, 0);
    cr_expect_eq(tt.t[0].numel, 15);
    cr_expect_eq(tt.t[1].offset, 15);
    cr_expect_eq(tt.t[1].numel, 7);
    cr_expect_eq(tt.t[2].offset, 22);
    cr_expect_eq(tt.t[2].numel, 12);
    cr_expect_eq(tt.numel, 34);
    cr_expect_str_eq(tt.t[2].name, "c");
    cr_expect_eq(tt.t[2].ndim, 4);
    cr_expect(tt.t[2].shape[0] == 2 && tt.t[2].shape[1] == 1 && tt.t[2].shape[2] == 3 &&
              tt.t[2].shape[3] == 2);
    cr_expect_eq(tt.t[0].split_dim, 0);
    cr_expect_eq(tt.t[0].decay, true);
    cr_expect_eq(tt.t[1].split_dim, -1);
    cr_expect_eq(tt.t[1].decay, false);
    cr_expect_eq(loco_ttable_find(&tt, "a"), 0);
    cr_expect_eq(loco_ttable_find(&tt, "c"), 2);
    cr_expect_eq(loco_ttable_find(&tt, "d"), -1);
    cr_expect_eq(loco_ttable_find(&tt, ""), -1);
    loco_ttable_fini(&tt);
    cr_expect_eq(tt.n, 0);
    cr_expect_eq(tt.numel, 0);
    cr_expect_null(tt.t);
    loco_ttable_fini(&tt); /* twice is harmless */
}

Test(ttable, grows_past_its_first_capacity) {
    loco_ttable tt;
    loco_ttable_init(&tt);
    size_t want = 0;
    for (int i = 0; i < 300; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        const int64_t shape[2] = {i % 7 + 1, i % 3 + 1};
        cr_assert_eq(loco_ttable_add(&tt, name, 2, shape, -1, false), 0, "%s", loco_errmsg());
        want += (size_t)(shape[0] * shape[1]);
    }
    cr_expect_eq(tt.numel, want);
    size_t off = 0;
    for (int i = 0; i < 300; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        cr_assert_eq(loco_ttable_find(&tt, name), i);
        cr_assert_eq(tt.t[i].offset, off, "t%d", i);
        off += tt.t[i].numel;
    }
    loco_ttable_fini(&tt);
}

/* Each refused add leaves the table as it was. */
static void expect_refused(loco_ttable *tt, const char *name, int ndim, const int64_t *shape,
                           int rc_want, const char *phrase) {
    int n = tt->n;
    size_t numel = tt->numel;
    loco_err_clear();
    cr_expect_eq(loco_ttable_add(tt, name, ndim, shape, -1, false), rc_want, "%s", phrase);
    cr_expect_eq(tt->n, n, "%s changed the count", phrase);
    cr_expect_eq(tt->numel, numel, "%s changed numel", phrase);
    cr_expect(strstr(loco_errmsg(), phrase), "lacks \"%s\": %s", phrase, loco_errmsg());
}

Test(ttable, bad_adds_are_refused) {
    loco_ttable tt;
    loco_ttable_init(&tt);
    const int64_t ok[2] = {2, 3};
    cr_assert_eq(loco_ttable_add(&tt, "w", 2, ok, -1, true), 0);
    expect_refused(&tt, "w", 2, ok, LOCO_EINVAL, "w added twice");
    const int64_t five[5] = {1, 1, 1, 1, 1};
    expect_refused(&tt, "x0", 0, five, LOCO_EINVAL, "0 dims");
    expect_refused(&tt, "x5", 5, five, LOCO_EINVAL, "5 dims");
    const int64_t zero[2] = {2, 0}, neg[2] = {-3, 2};
    expect_refused(&tt, "xz", 2, zero, LOCO_EINVAL, "dim 1 is 0");
    expect_refused(&tt, "xn", 2, neg, LOCO_EINVAL, "dim 0 is -3");
    char longname[LOCO_TENSOR_NAME_MAX + 8];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    expect_refused(&tt, longname, 2, ok, LOCO_EINVAL, "too long");
    /* Names refused above were never recorded. */
    cr_expect_eq(loco_ttable_find(&tt, "xz"), -1);
    cr_expect_eq(loco_ttable_add(&tt, "xz", 2, ok, -1, false), 0, "%s", loco_errmsg());
    cr_expect_eq(tt.t[1].offset, 6);
    loco_ttable_fini(&tt);
}

Test(ttable, failed_allocation_is_enomem) {
    loco_ttable tt;
    loco_ttable_init(&tt);
    const int64_t s[1] = {4};
    loco_alloc_fail_after(1);
    expect_refused(&tt, "a", 1, s, LOCO_ENOMEM, "entries");
    loco_alloc_fail_after(0);
    cr_expect_eq(loco_ttable_add(&tt, "a", 1, s, -1, false), 0);
    loco_ttable_fini(&tt);
}

/* =============================================================== metrics */

TestSuite(metrics, .init = setup, .fini = teardown);

/* The lines of a file, each parsed with cJSON (caller deletes). */
static int read_jsonl(const char *path, cJSON **rec, int cap) {
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0, "%s", loco_errmsg());
    int n = 0;
    char *save = NULL;
    cr_expect(len == 0 || ((char *)data)[len - 1] == '\n', "last line ends with a newline");
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        cr_assert_lt(n, cap);
        rec[n] = cJSON_Parse(line);
        cr_assert(cJSON_IsObject(rec[n]), "line %d is not a JSON object: %s", n + 1, line);
        n++;
    }
    loco_free(data);
    return n;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    cr_assert(cJSON_IsNumber(v), "%s is not a number", k);
    return v->valuedouble;
}

Test(metrics, records_are_json_lines) {
    char path[512];
    in_dir(path, "metrics.jsonl");
    loco_metrics *m;
    cr_assert_eq(loco_metrics_open(&m, path, false), 0, "%s", loco_errmsg());
    loco_metrics_begin(m);
    loco_metrics_int(m, "step", 1);
    loco_metrics_num(m, "loss", 2.5);
    loco_metrics_str(m, "phase", "train");
    cr_assert_eq(loco_metrics_end(m), 0, "%s", loco_errmsg());
    loco_metrics_begin(m);
    loco_metrics_int(m, "step", 2);
    loco_metrics_num(m, "loss", NAN);
    loco_metrics_num(m, "lr", INFINITY);
    loco_metrics_num(m, "tiny", 1e-300);
    cr_assert_eq(loco_metrics_end(m), 0, "%s", loco_errmsg());
    loco_metrics_begin(m);
    loco_metrics_int(m, "step", 3);
    loco_metrics_int(m, "tokens", 1LL << 40);
    loco_metrics_str(m, "note", "say \"hi\"\nnext line\t\\");
    cr_assert_eq(loco_metrics_end(m), 0, "%s", loco_errmsg());
    /* Flushed per record: readable before close. */
    cJSON *rec[8];
    int n = read_jsonl(path, rec, 8);
    cr_assert_eq(n, 3);
    cr_expect_eq(num(rec[0], "step"), 1);
    cr_expect_eq(num(rec[0], "loss"), 2.5);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec[0], "phase")),
                     "train");
    cr_expect_eq(num(rec[1], "step"), 2);
    cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(rec[1], "loss")), "NaN -> null");
    cr_expect(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(rec[1], "lr")), "inf -> null");
    cr_expect_eq(num(rec[1], "tiny"), 1e-300);
    cr_expect_eq(num(rec[2], "tokens"), 1099511627776.0);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(rec[2], "note")),
                     "say \"hi\"\nnext line\t\\");
    for (int i = 0; i < n; i++)
        cJSON_Delete(rec[i]);
    loco_metrics_close(m);
    loco_metrics_close(NULL);
}

Test(metrics, append_keeps_and_truncate_drops) {
    char path[512];
    in_dir(path, "m.jsonl");
    loco_metrics *m;
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(loco_metrics_open(&m, path, true), 0, "%s", loco_errmsg());
        loco_metrics_begin(m);
        loco_metrics_int(m, "round", round);
        cr_assert_eq(loco_metrics_end(m), 0);
        loco_metrics_close(m);
    }
    cJSON *rec[4];
    int n = read_jsonl(path, rec, 4);
    cr_expect_eq(n, 2);
    for (int i = 0; i < n; i++) {
        cr_expect_eq(num(rec[i], "round"), i);
        cJSON_Delete(rec[i]);
    }
    cr_assert_eq(loco_metrics_open(&m, path, false), 0);
    loco_metrics_begin(m);
    loco_metrics_int(m, "round", 9);
    cr_assert_eq(loco_metrics_end(m), 0);
    loco_metrics_close(m);
    n = read_jsonl(path, rec, 4);
    cr_expect_eq(n, 1);
    cJSON_Delete(rec[0]);
}

Test(metrics, failures) {
    char path[512];
    in_dir(path, "no/dir/m.jsonl");
    loco_metrics *m = (loco_metrics *)1;
    cr_expect_eq(loco_metrics_open(&m, path, false), LOCO_EIO);
    cr_expect_null(m);
    assert_has(loco_errmsg(), path);

    in_dir(path, "m.jsonl");
    loco_alloc_fail_after(1);
    cr_expect_eq(loco_metrics_open(&m, path, false), LOCO_ENOMEM);
    loco_alloc_fail_after(0);
    cr_expect_null(m);

    /* end without begin is an error, not a crash or an empty line */
    cr_assert_eq(loco_metrics_open(&m, path, false), 0);
    cr_expect_lt(loco_metrics_end(m), 0);
    loco_metrics_close(m);
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0);
    cr_expect_eq(len, 0);
    loco_free(data);
}
