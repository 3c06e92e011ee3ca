/* Token-shard loader, writer and byte-level prep: batches against windows
 * computed here from the known token sequences, rank striding, resume via
 * tell/seek, and every malformed-shard path returning an error that names
 * the file. Each test works in its own mkdtemp directory.
 *
 * One file: the loader and the shard writer tested against each other. */
#include "inner/data/data.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/loco_test_data_XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    loco_log_set_level(LOCO_LOG_ERROR);
}

static void teardown(void) {
    loco_alloc_fail_after(0);
    cr_assert_eq(loco_rmtree(tmpdir), 0, "%s", loco_errmsg());
}

TestSuite(data, .init = setup, .fini = teardown);

static char *in_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

#define PATH(name) in_dir((char[512]){0}, 512, (name))

/* Token i of a shard whose sequence is tok(i) = (base + i) % mod. */
static int32_t seq_tok(int32_t base, int32_t mod, int64_t i) { return (int32_t)((base + i) % mod); }

static void write_seq(const char *path, int32_t base, int32_t mod, size_t n, int version) {
    int32_t *t = malloc(n * sizeof *t + 1);
    for (size_t i = 0; i < n; i++)
        t[i] = seq_tok(base, mod, (int64_t)i);
    int rc = loco_data_write_shard(path, t, n, version);
    free(t);
    cr_assert_eq(rc, 0, "write %s: %s", path, loco_errmsg());
}

/* Asserts one batch equals the window of B*T+1 tokens starting at `start`. */
static void check_window(const int32_t *in, const int32_t *tg, int64_t bt, int32_t base,
                         int32_t mod, int64_t start, int step) {
    for (int64_t j = 0; j < bt; j++) {
        cr_assert_eq(in[j], seq_tok(base, mod, start + j), "step %d: input %lld", step,
                     (long long)j);
        cr_assert_eq(tg[j], seq_tok(base, mod, start + j + 1), "step %d: target %lld", step,
                     (long long)j);
    }
}

static size_t file_size(const char *path) {
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "stat %s", path);
    return (size_t)st.st_size;
}

static void patch_le32(const char *path, off_t off, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, b, 4, off), 4);
    close(fd);
}

static uint32_t le32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void expect_open_fails(const char *pattern, int B, int T, int world, int vocab, int rc,
                              const char *needle) {
    loco_data *d = (loco_data *)0x1;
    loco_err_clear();
    int got = loco_data_open(&d, pattern, B, T, 0, world, vocab);
    cr_assert_eq(got, rc, "open %s: rc %d (%s), want %d", pattern, got, loco_errmsg(), rc);
    cr_assert_null(d);
    cr_assert_not_null(strstr(loco_errmsg(), needle), "message '%s' lacks '%s'", loco_errmsg(),
                       needle);
}

/* ------------------------------------------------------------- formats */

Test(data, write_shard_layout_is_llmc) {
    int32_t toks[5] = {0, 1, 255, 65535, 7};
    char *p1 = PATH("v1.bin"), *p7 = PATH("v7.bin");
    cr_assert_eq(loco_data_write_shard(p1, toks, 5, 1), 0, "%s", loco_errmsg());
    toks[4] = 70000;
    cr_assert_eq(loco_data_write_shard(p7, toks, 5, 7), 0, "%s", loco_errmsg());
    cr_assert_eq(access(PATH("v1.bin.tmp"), F_OK), -1, "temporary left behind");

    uint8_t *buf;
    size_t len;
    cr_assert_eq(loco_file_read(p1, (void **)&buf, &len), 0);
    cr_assert_eq(len, 1024 + 5 * 2);
    cr_assert_eq(le32_at(buf), 20240520);
    cr_assert_eq(le32_at(buf + 4), 1);
    cr_assert_eq(le32_at(buf + 8), 5);
    for (int i = 3; i < 256; i++)
        cr_assert_eq(le32_at(buf + 4 * i), 0, "header int %d", i);
    const uint16_t want1[5] = {0, 1, 255, 65535, 7};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(buf[1024 + 2 * i] | buf[1024 + 2 * i + 1] << 8, want1[i]);
    loco_free(buf);

    cr_assert_eq(loco_file_read(p7, (void **)&buf, &len), 0);
    cr_assert_eq(len, 1024 + 5 * 4);
    cr_assert_eq(le32_at(buf), 20240801);
    cr_assert_eq(le32_at(buf + 4), 7);
    cr_assert_eq(le32_at(buf + 8), 5);
    cr_assert_eq(le32_at(buf + 1024 + 4 * 4), 70000);
    loco_free(buf);
}

Test(data, write_shard_rejects_bad_tokens) {
    int32_t big[3] = {1, 65536, 2};
    int32_t neg[3] = {1, -1, 2};
    char *p = PATH("bad.bin");
    cr_assert_eq(loco_data_write_shard(p, big, 3, 1), LOCO_EINVAL);
    cr_assert_not_null(strstr(loco_errmsg(), "bad.bin"));
    cr_assert_eq(loco_data_write_shard(p, neg, 3, 1), LOCO_EINVAL);
    cr_assert_eq(loco_data_write_shard(p, neg, 3, 7), LOCO_EINVAL);
    cr_assert_eq(loco_data_write_shard(p, big, 3, 2), LOCO_EINVAL);
    cr_assert_eq(access(p, F_OK), -1);
    cr_assert_eq(access(PATH("bad.bin.tmp"), F_OK), -1);
    cr_assert_eq(loco_data_write_shard(p, big, 3, 7), 0, "%s", loco_errmsg());
    /* Unwritable place: error names the file. */
    cr_assert_eq(loco_data_write_shard(PATH("no/such/dir/x.bin"), big, 3, 7), LOCO_EIO);
    cr_assert_not_null(strstr(loco_errmsg(), "x.bin"), "%s", loco_errmsg());
}

/* ------------------------------------------------------------- batches */

Test(data, batches_match_windows_both_versions) {
    const int B = 3, T = 5, bt = 15;
    const int n = 600; /* 600 = 39*15 + 15: windows at 0, 15, ..., 570 */
    for (int version = 1; version <= 7; version += 6) {
        char name[32];
        snprintf(name, sizeof name, "seq_v%d.bin", version);
        char *p = PATH(name);
        write_seq(p, 0, 251, (size_t)n, version);
        cr_assert_eq(file_size(p), 1024 + (size_t)n * (version == 1 ? 2 : 4));
        loco_data *d;
        cr_assert_eq(loco_data_open(&d, p, B, T, 0, 1, 251), 0, "%s", loco_errmsg());
        cr_assert_eq(loco_data_num_shards(d), 1);
        cr_assert_eq(loco_data_num_tokens(d), n);
        int32_t in[15], tg[15];
        int steps = (n - 1) / bt; /* 39 windows of 16 tokens fit in 600 */
        for (int s = 0; s < steps; s++) {
            cr_assert_eq(loco_data_next(d, in, tg), 0, "%s", loco_errmsg());
            check_window(in, tg, bt, 0, 251, (int64_t)s * bt, s);
        }
        loco_data_pos p0 = loco_data_tell(d);
        cr_assert_eq(p0.shard, 0);
        cr_assert_eq(p0.pos, 0);
        cr_assert_eq(p0.epoch, 1);
        cr_assert_eq(loco_data_next(d, in, tg), 0);
        check_window(in, tg, bt, 0, 251, 0, steps);
        loco_data_close(d);
    }
}

Test(data, large_uint32_tokens) {
    char *p = PATH("big.bin");
    write_seq(p, 70000, 1 << 20, 50, 7);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, p, 2, 4, 0, 1, 1 << 20), 0, "%s", loco_errmsg());
    int32_t in[8], tg[8];
    cr_assert_eq(loco_data_next(d, in, tg), 0);
    check_window(in, tg, 8, 70000, 1 << 20, 0, 0);
    cr_assert_eq(in[0], 70000);
    loco_data_close(d);
}

Test(data, crosses_shards_and_wraps_epochs) {
    /* B*T = 6. Shard a (v1, 20 tokens): windows at 0, 6, 12 (18+7 > 20).
     * Shard b (v7, 14 tokens): windows at 0, 6 (12+7 > 14), then wrap. */
    write_seq(PATH("s_a.bin"), 0, 251, 20, 1);
    write_seq(PATH("s_b.bin"), 100, 251, 14, 7);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, PATH("s_*.bin"), 2, 3, 0, 1, 251), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_data_num_shards(d), 2);
    cr_assert_eq(loco_data_num_tokens(d), 34);
    const struct {
        int base, start;
        loco_data_pos after;
    } want[5] = {
        {0, 0, {0, 6, 0}},  {0, 6, {0, 12, 0}}, {0, 12, {1, 0, 0}},
        {100, 0, {1, 6, 0}}, {100, 6, {0, 0, 1}},
    };
    int32_t in[6], tg[6];
    for (int epoch = 0; epoch < 3; epoch++) {
        for (int k = 0; k < 5; k++) {
            cr_assert_eq(loco_data_next(d, in, tg), 0, "%s", loco_errmsg());
            check_window(in, tg, 6, want[k].base, 251, want[k].start, epoch * 5 + k);
            loco_data_pos p = loco_data_tell(d);
            cr_assert_eq(p.shard, want[k].after.shard, "step %d", k);
            cr_assert_eq(p.pos, want[k].after.pos, "step %d", k);
            cr_assert_eq(p.epoch, want[k].after.epoch + epoch, "step %d", k);
        }
    }
    loco_data_close(d);
}

Test(data, comma_list_sorted_by_name) {
    write_seq(PATH("x_b.bin"), 100, 251, 10, 1);
    write_seq(PATH("x_a.bin"), 0, 251, 10, 7);
    write_seq(PATH("y_c.bin"), 200, 251, 10, 1);
    char pat[1200];
    snprintf(pat, sizeof pat, "%s/y_*.bin, %s/x_b.bin,%s/x_a*", tmpdir, tmpdir, tmpdir);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, pat, 1, 8, 0, 1, 251), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_data_num_shards(d), 3);
    cr_assert_eq(loco_data_num_tokens(d), 30);
    int32_t in[8], tg[8];
    const int bases[3] = {0, 100, 200}; /* x_a, x_b, y_c */
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(loco_data_next(d, in, tg), 0);
        check_window(in, tg, 8, bases[k], 251, 0, k);
    }
    loco_data_close(d);
}

/* Start offset of a window with globally unique tokens (shard*1000 + i). */
static int64_t window_id(const int32_t *in) { return in[0]; }

Test(data, ranks_stride_disjoint_and_cover) {
    /* B*T = 8, world = 2: each step consumes 16 tokens. Shards of 49 and 33
     * tokens hold 3 and 2 steps exactly, so world=1 with the same B*T sees
     * the same 10 windows that ranks 0 and 1 see together. */
    const int B = 2, T = 4, bt = 8;
    write_seq(PATH("r_0.bin"), 0, 1 << 20, 49, 7);
    write_seq(PATH("r_1.bin"), 1000, 1 << 20, 33, 7);
    char *pat = PATH("r_*.bin");
    loco_data *one, *r0, *r1;
    cr_assert_eq(loco_data_open(&one, pat, B, T, 0, 1, 1 << 20), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_data_open(&r0, pat, B, T, 0, 2, 1 << 20), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_data_open(&r1, pat, B, T, 1, 2, 1 << 20), 0, "%s", loco_errmsg());

    int32_t ref_in[10][8], ref_tg[10][8];
    for (int k = 0; k < 10; k++)
        cr_assert_eq(loco_data_next(one, ref_in[k], ref_tg[k]), 0);
    cr_assert_eq(loco_data_tell(one).epoch, 1);
    const int64_t ref_starts[10] = {0, 8, 16, 24, 32, 40, 1000, 1008, 1016, 1024};
    for (int k = 0; k < 10; k++)
        cr_assert_eq(window_id(ref_in[k]), ref_starts[k]);

    int seen[10] = {0};
    for (int step = 0; step < 5; step++) {
        loco_data *rs[2] = {r0, r1};
        for (int r = 0; r < 2; r++) {
            int32_t in[8], tg[8];
            cr_assert_eq(loco_data_next(rs[r], in, tg), 0, "%s", loco_errmsg());
            int hit = -1;
            for (int k = 0; k < 10; k++)
                if (!memcmp(in, ref_in[k], sizeof in) && !memcmp(tg, ref_tg[k], sizeof tg))
                    hit = k;
            cr_assert_geq(hit, 0, "rank %d step %d: window %lld not a reference window", r,
                          step, (long long)window_id(in));
            seen[hit]++;
        }
        loco_data_pos a = loco_data_tell(r0), b = loco_data_tell(r1);
        cr_assert(a.shard == b.shard && a.pos == b.pos && a.epoch == b.epoch,
                  "ranks disagree on the position at step %d", step);
    }
    for (int k = 0; k < 10; k++)
        cr_assert_eq(seen[k], 1, "window %d seen %d times", k, seen[k]);
    cr_assert_eq(loco_data_tell(r0).epoch, 1);
    /* Rank 1's first window of the next epoch is again 8 tokens in. */
    int32_t in[8], tg[8];
    cr_assert_eq(loco_data_next(r1, in, tg), 0);
    cr_assert_eq(window_id(in), bt);
    loco_data_close(one);
    loco_data_close(r0);
    loco_data_close(r1);
}

Test(data, tell_seek_reproduces_continuation) {
    write_seq(PATH("t_0.bin"), 0, 251, 101, 1);
    write_seq(PATH("t_1.bin"), 50, 251, 77, 7);
    write_seq(PATH("t_2.bin"), 9, 251, 64, 1);
    char *pat = PATH("t_*.bin");
    enum { B = 2, T = 5, BT = 10, N = 40 };
    for (int rank = 0; rank < 2; rank++) {
        for (int skip = 0; skip < 20; skip += 3) {
            loco_data *a, *b;
            cr_assert_eq(loco_data_open(&a, pat, B, T, rank, 2, 251), 0, "%s", loco_errmsg());
            cr_assert_eq(loco_data_open(&b, pat, B, T, rank, 2, 251), 0, "%s", loco_errmsg());
            int32_t in[BT], tg[BT];
            for (int s = 0; s < skip; s++)
                cr_assert_eq(loco_data_next(a, in, tg), 0);
            loco_data_pos p = loco_data_tell(a);
            static int32_t want_in[N][BT], want_tg[N][BT];
            for (int s = 0; s < N; s++)
                cr_assert_eq(loco_data_next(a, want_in[s], want_tg[s]), 0);
            loco_data_pos end = loco_data_tell(a);
            /* A fresh loader seeks and continues identically ... */
            cr_assert_eq(loco_data_seek(b, p), 0, "%s", loco_errmsg());
            for (int s = 0; s < N; s++) {
                cr_assert_eq(loco_data_next(b, in, tg), 0);
                cr_assert(!memcmp(in, want_in[s], sizeof in), "rank %d skip %d step %d", rank,
                          skip, s);
                cr_assert(!memcmp(tg, want_tg[s], sizeof tg));
            }
            loco_data_pos e2 = loco_data_tell(b);
            cr_assert(e2.shard == end.shard && e2.pos == end.pos && e2.epoch == end.epoch);
            /* ... and so does the same loader rewound. */
            cr_assert_eq(loco_data_seek(a, p), 0);
            for (int s = 0; s < N; s++) {
                cr_assert_eq(loco_data_next(a, in, tg), 0);
                cr_assert(!memcmp(in, want_in[s], sizeof in));
            }
            loco_data_close(a);
            loco_data_close(b);
        }
    }
}

Test(data, seek_to_shard_start) {
    write_seq(PATH("q_0.bin"), 0, 251, 30, 1);
    write_seq(PATH("q_1.bin"), 77, 251, 30, 1);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, PATH("q_*.bin"), 1, 4, 0, 1, 251), 0);
    cr_assert_eq(loco_data_seek(d, (loco_data_pos){.shard = 1, .pos = 0, .epoch = 5}), 0);
    int32_t in[4], tg[4];
    cr_assert_eq(loco_data_next(d, in, tg), 0);
    check_window(in, tg, 4, 77, 251, 0, 0);
    cr_assert_eq(loco_data_tell(d).epoch, 5);
    cr_assert_eq(loco_data_seek(d, (loco_data_pos){.shard = 0, .pos = 25, .epoch = 0}), 0);
    cr_assert_eq(loco_data_next(d, in, tg), 0);
    check_window(in, tg, 4, 0, 251, 25, 1);
    loco_data_pos p = loco_data_tell(d);
    cr_assert(p.shard == 1 && p.pos == 0 && p.epoch == 0);
    loco_data_close(d);
}

/* ------------------------------------------------------------ bad input */

Test(data, seek_out_of_range) {
    char *p = PATH("so.bin");
    write_seq(p, 0, 251, 40, 1);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, p, 2, 4, 0, 2, 251), 0); /* step 16, needs 17 */
    int32_t in[8], tg[8];
    cr_assert_eq(loco_data_next(d, in, tg), 0);
    loco_data_pos before = loco_data_tell(d);
    const loco_data_pos bad[] = {
        {-1, 0, 0}, {1, 0, 0}, {0, -1, 0}, {0, 24, 0}, {0, 40, 0}, {0, 0, -1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(loco_data_seek(d, bad[i]), LOCO_EINVAL, "case %zu", i);
        loco_data_pos now = loco_data_tell(d);
        cr_assert(now.shard == before.shard && now.pos == before.pos &&
                  now.epoch == before.epoch);
    }
    cr_assert_eq(loco_data_seek(d, (loco_data_pos){0, 24, 0}), LOCO_EINVAL);
    cr_assert_not_null(strstr(loco_errmsg(), "so.bin"), "%s", loco_errmsg());
    cr_assert_eq(loco_data_seek(d, (loco_data_pos){0, 23, 0}), 0); /* 23 + 17 = 40 fits */
    cr_assert_eq(loco_data_next(d, in, tg), 0);
    check_window(in, tg, 8, 0, 251, 23, 0);
    loco_data_close(d);
}

Test(data, missing_file_and_empty_glob) {
    expect_open_fails(PATH("nope.bin"), 1, 4, 1, 256, LOCO_EINVAL, "nope.bin: no such file");
    expect_open_fails(PATH("none_*.bin"), 1, 4, 1, 256, LOCO_EINVAL,
                      "none_*.bin: no file matches");
    write_seq(PATH("ok.bin"), 0, 251, 40, 1);
    char pat[1200];
    snprintf(pat, sizeof pat, "%s/ok.bin,%s/gone_*.bin", tmpdir, tmpdir);
    expect_open_fails(pat, 1, 4, 1, 256, LOCO_EINVAL, "gone_*.bin");
    snprintf(pat, sizeof pat, "%s/ok.bin,,%s/ok.bin", tmpdir, tmpdir);
    expect_open_fails(pat, 1, 4, 1, 256, LOCO_EINVAL, "empty item");
    expect_open_fails("", 1, 4, 1, 256, LOCO_EINVAL, "pattern");
}

Test(data, bad_arguments) {
    char *p = PATH("args.bin");
    write_seq(p, 0, 251, 40, 1);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, p, 0, 4, 0, 1, 256), LOCO_EINVAL);
    cr_assert_eq(loco_data_open(&d, p, 1, -4, 0, 1, 256), LOCO_EINVAL);
    cr_assert_eq(loco_data_open(&d, p, 1, 4, 2, 2, 256), LOCO_EINVAL);
    cr_assert_eq(loco_data_open(&d, p, 1, 4, -1, 2, 256), LOCO_EINVAL);
    cr_assert_eq(loco_data_open(&d, p, 1, 4, 0, 0, 256), LOCO_EINVAL);
    cr_assert_eq(loco_data_open(&d, p, 1, 4, 0, 1, 0), LOCO_EINVAL);
    cr_assert_eq(loco_data_open(&d, p, 1 << 16, 1 << 16, 0, 1, 256), LOCO_EINVAL);
    cr_assert_null(d);
    loco_data_close(NULL);
}

Test(data, wrong_magic) {
    char *p = PATH("magic.bin");
    write_seq(p, 0, 251, 40, 1);
    patch_le32(p, 0, 12345678);
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "magic.bin");
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "bad magic 12345678");
}

Test(data, wrong_version) {
    char *p1 = PATH("ver1.bin"), *p7 = PATH("ver7.bin");
    write_seq(p1, 0, 251, 40, 1);
    patch_le32(p1, 4, 7); /* uint16 magic with the uint32 version */
    expect_open_fails(p1, 1, 4, 1, 256, LOCO_EPROTO, "ver1.bin");
    write_seq(p7, 0, 251, 40, 7);
    patch_le32(p7, 4, 2);
    expect_open_fails(p7, 1, 4, 1, 256, LOCO_EPROTO, "ver7.bin");
    expect_open_fails(p7, 1, 4, 1, 256, LOCO_EPROTO, "version 2");
}

Test(data, truncated_mid_token_and_mid_header) {
    char *p = PATH("trunc.bin");
    write_seq(p, 0, 251, 100, 1);
    cr_assert_eq(truncate(p, 1024 + 199), 0);
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO,
                      "truncated: header says 100 tokens (1224 bytes) but file has 1223 bytes");
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "trunc.bin");

    char *p7 = PATH("trunc7.bin");
    write_seq(p7, 0, 251, 100, 7);
    cr_assert_eq(truncate(p7, 1024 + 4 * 60), 0); /* whole tokens, but fewer */
    expect_open_fails(p7, 1, 4, 1, 256, LOCO_EPROTO, "trunc7.bin: truncated");

    cr_assert_eq(truncate(p, 500), 0);
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "trunc.bin");
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "truncated");
    cr_assert_eq(truncate(p, 0), 0);
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "truncated");
}

Test(data, longer_than_header_claims) {
    char *p = PATH("long.bin");
    write_seq(p, 0, 251, 100, 1);
    int fd = open(p, O_WRONLY | O_APPEND);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "\0\0", 2), 2);
    close(fd);
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "long.bin");
    expect_open_fails(p, 1, 4, 1, 256, LOCO_EPROTO, "1226 bytes");
}

Test(data, bad_shard_among_good_ones) {
    write_seq(PATH("m_0.bin"), 0, 251, 100, 1);
    write_seq(PATH("m_1.bin"), 0, 251, 100, 1);
    write_seq(PATH("m_2.bin"), 0, 251, 100, 1);
    cr_assert_eq(truncate(PATH("m_2.bin"), 1100), 0);
    expect_open_fails(PATH("m_*.bin"), 1, 4, 1, 256, LOCO_EPROTO, "m_2.bin");
}

Test(data, shard_shorter_than_one_batch) {
    write_seq(PATH("sh_0.bin"), 0, 251, 100, 1);
    write_seq(PATH("sh_1.bin"), 0, 251, 32, 1);
    /* world*B*T+1 = 2*2*8+1 = 33 > 32 */
    expect_open_fails(PATH("sh_*.bin"), 2, 8, 2, 256, LOCO_EINVAL, "sh_1.bin");
    expect_open_fails(PATH("sh_*.bin"), 2, 8, 2, 256, LOCO_EINVAL, "32 tokens");
    /* 2*2*8 fits at world=1 (17 <= 32). */
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, PATH("sh_*.bin"), 2, 8, 0, 1, 256), 0, "%s",
                 loco_errmsg());
    loco_data_close(d);
    write_seq(PATH("empty.bin"), 0, 251, 0, 7);
    expect_open_fails(PATH("empty.bin"), 1, 1, 1, 256, LOCO_EINVAL, "empty.bin");
}

Test(data, token_out_of_vocab) {
    int32_t t[100];
    for (int i = 0; i < 100; i++)
        t[i] = i;
    t[37] = 300;
    char *p = PATH("vocab.bin");
    cr_assert_eq(loco_data_write_shard(p, t, 100, 1), 0);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, p, 4, 8, 0, 1, 256), 0, "%s", loco_errmsg());
    int32_t in[32], tg[32];
    cr_assert_eq(loco_data_next(d, in, tg), 0, "%s", loco_errmsg()); /* tokens 0..32 */
    loco_data_pos before = loco_data_tell(d);
    cr_assert_eq(loco_data_next(d, in, tg), LOCO_EPROTO); /* tokens 32..64 */
    cr_assert_not_null(strstr(loco_errmsg(), "vocab.bin"), "%s", loco_errmsg());
    cr_assert_not_null(strstr(loco_errmsg(), "token offset 37"), "%s", loco_errmsg());
    loco_data_pos after = loco_data_tell(d);
    cr_assert(before.shard == after.shard && before.pos == after.pos, "advanced on error");
    loco_data_close(d);

    /* The extra target token (offset B*T) is checked too. */
    t[37] = 37;
    t[32] = 256;
    cr_assert_eq(loco_data_write_shard(p, t, 100, 1), 0);
    cr_assert_eq(loco_data_open(&d, p, 4, 8, 0, 1, 256), 0);
    cr_assert_eq(loco_data_next(d, in, tg), LOCO_EPROTO);
    cr_assert_not_null(strstr(loco_errmsg(), "token offset 32"), "%s", loco_errmsg());
    loco_data_close(d);
}

Test(data, shard_changed_after_open) {
    char *p = PATH("chg.bin");
    write_seq(p, 0, 251, 100, 1);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, p, 4, 8, 0, 1, 256), 0);
    cr_assert_eq(truncate(p, 1024 + 40), 0);
    int32_t in[32], tg[32];
    int rc = loco_data_next(d, in, tg);
    cr_assert_lt(rc, 0);
    cr_assert_not_null(strstr(loco_errmsg(), "chg.bin"), "%s", loco_errmsg());
    loco_data_close(d);
}

Test(data, allocation_failures_are_clean) {
    write_seq(PATH("af_0.bin"), 0, 251, 100, 1);
    write_seq(PATH("af_1.bin"), 0, 251, 100, 7);
    int failures = 0;
    for (long n = 1; n < 200; n++) {
        loco_data *d;
        loco_alloc_fail_after(n);
        int rc = loco_data_open(&d, PATH("af_*.bin"), 2, 4, 0, 1, 256);
        loco_alloc_fail_after(0);
        if (rc == 0) {
            loco_data_close(d);
            break;
        }
        cr_assert_eq(rc, LOCO_ENOMEM, "n=%ld: %s", n, loco_errmsg());
        cr_assert_null(d);
        failures++;
    }
    cr_assert_gt(failures, 2);
}

/* ------------------------------------------------------------------ prep */

static void write_text(const char *path, const uint8_t *b, size_t n) {
    cr_assert_eq(loco_file_write_sync(path, b, n), 0);
}

/* Reads a v1 shard back with this file's own decoder. */
static size_t decode_v1(const char *path, uint8_t *out, size_t cap) {
    uint8_t *buf;
    size_t len;
    cr_assert_eq(loco_file_read(path, (void **)&buf, &len), 0, "%s", loco_errmsg());
    cr_assert_geq(len, 1024);
    cr_assert_eq(le32_at(buf), 20240520, "%s", path);
    cr_assert_eq(le32_at(buf + 4), 1);
    size_t n = le32_at(buf + 8);
    cr_assert_eq(len, 1024 + 2 * n, "%s", path);
    cr_assert_leq(n, cap);
    for (size_t i = 0; i < n; i++) {
        unsigned t = buf[1024 + 2 * i] | buf[1024 + 2 * i + 1] << 8;
        cr_assert_lt(t, 256);
        out[i] = (uint8_t)t;
    }
    loco_free(buf);
    return n;
}

Test(data, prep_bytes_splits_and_round_trips) {
    enum { N = 1000 };
    uint8_t text[N];
    for (int i = 0; i < N; i++)
        text[i] = (uint8_t)((i * 7 + i / 256) & 0xff); /* every byte value, 0 and 255 too */
    char *tp = PATH("input.txt");
    write_text(tp, text, N);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s/out/sub/tiny", tmpdir); /* parents are created */
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.1, 300), 0, "%s", loco_errmsg());

    /* floor(0.9 * 1000) = 900 train bytes: 300 + 300 + 300; 100 val bytes. */
    const char *names[] = {"train_000000", "train_000001", "train_000002", "val_000000"};
    const size_t sizes[] = {300, 300, 300, 100};
    uint8_t got[N];
    size_t off = 0;
    for (int k = 0; k < 4; k++) {
        char path[700];
        snprintf(path, sizeof path, "%s_%s.bin", prefix, names[k]);
        size_t n = decode_v1(path, got + off, N - off);
        cr_assert_eq(n, sizes[k], "%s", path);
        off += n;
    }
    cr_assert_eq(off, N);
    cr_assert(!memcmp(got, text, N), "decoded shards differ from the text");
    char extra[700];
    snprintf(extra, sizeof extra, "%s_train_000003.bin", prefix);
    cr_assert_eq(access(extra, F_OK), -1);
    snprintf(extra, sizeof extra, "%s_val_000001.bin", prefix);
    cr_assert_eq(access(extra, F_OK), -1);

    /* The loader reads the train split back as the same bytes. */
    char pat[700];
    snprintf(pat, sizeof pat, "%s_train_*.bin", prefix);
    loco_data *d;
    cr_assert_eq(loco_data_open(&d, pat, 1, 299, 0, 1, 256), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_data_num_shards(d), 3);
    cr_assert_eq(loco_data_num_tokens(d), 900);
    int32_t in[299], tg[299];
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(loco_data_next(d, in, tg), 0);
        for (int j = 0; j < 299; j++) {
            cr_assert_eq(in[j], text[300 * k + j]);
            cr_assert_eq(tg[j], text[300 * k + j + 1]);
        }
    }
    loco_data_close(d);

    /* Re-running with bigger shards replaces the old set, leaving no stale shards. */
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.1, 1000), 0, "%s", loco_errmsg());
    snprintf(extra, sizeof extra, "%s_train_000001.bin", prefix);
    cr_assert_eq(access(extra, F_OK), -1, "stale shard kept");
    cr_assert_eq(loco_data_open(&d, pat, 1, 8, 0, 1, 256), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_data_num_shards(d), 1);
    cr_assert_eq(loco_data_num_tokens(d), 900);
    loco_data_close(d);
}

Test(data, prep_bytes_uneven_split) {
    const char *s = "hello, world\n"; /* 13 bytes; floor(0.75 * 13) = 9 train */
    char *tp = PATH("hello.txt");
    write_text(tp, (const uint8_t *)s, 13);
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s/h", tmpdir);
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.25, 4), 0, "%s", loco_errmsg());
    uint8_t got[16];
    char path[700];
    const char *names[] = {"train_000000", "train_000001", "train_000002", "val_000000"};
    const size_t sizes[] = {4, 4, 1, 4};
    size_t off = 0;
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s_%s.bin", prefix, names[k]);
        size_t n = decode_v1(path, got + off, sizeof got - off);
        cr_assert_eq(n, sizes[k], "%s", path);
        off += n;
    }
    cr_assert_eq(off, 13);
    cr_assert(!memcmp(got, s, 13));
}

Test(data, prep_bytes_errors) {
    char prefix[600];
    snprintf(prefix, sizeof prefix, "%s/p", tmpdir);
    cr_assert_eq(loco_data_prep_bytes(PATH("missing.txt"), prefix, 0.1, 100), LOCO_EINVAL);
    cr_assert_not_null(strstr(loco_errmsg(), "missing.txt"), "%s", loco_errmsg());

    char *tp = PATH("tiny.txt");
    write_text(tp, (const uint8_t *)"abc", 3);
    /* floor(0.9 * 3) = 2 train bytes, 1 val byte: fine. One byte cannot split. */
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.1, 100), 0, "%s", loco_errmsg());
    write_text(tp, (const uint8_t *)"a", 1);
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.5, 100), LOCO_EINVAL);
    cr_assert_not_null(strstr(loco_errmsg(), "tiny.txt"), "%s", loco_errmsg());
    write_text(tp, (const uint8_t *)"", 0);
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.5, 100), LOCO_EINVAL);
    write_text(tp, (const uint8_t *)"abcdef", 6);
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.0, 100), LOCO_EINVAL);
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 1.0, 100), LOCO_EINVAL);
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.9, 100), LOCO_EINVAL); /* train empty */
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 1e-18, 100), LOCO_EINVAL); /* val empty */
    cr_assert_not_null(strstr(loco_errmsg(), "non-empty"), "%s", loco_errmsg());
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.5, 0), LOCO_EINVAL);
    cr_assert_eq(loco_data_prep_bytes(tp, prefix, 0.5, 2), 0, "%s", loco_errmsg());
}
