/* `loco report RUN_DIR` for ordinary training runs: a short real `loco
 * train`, and synthetic single- and multi-site run directories whose
 * every point is known here, so the charts' polylines can be counted
 * against the lines written; bad inputs must fail naming the file, or be
 * warned about in the page. The page is then rendered by headless Chromium
 * (skipped, saying why, when it is not installed): its DOM must hold the
 * charts and its screenshot the series' colours. Runs build/loco. */
#include "core/core.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define STEPS 40
#define OUTER 4

static char *dir;

static void setup(void) {
    dir = test_tmpdir("loco-report-train");
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(report_train, .init = setup, .fini = teardown, .timeout = 90);

static FILE *create(const char *fmt, const char *a) {
    char path[1024];
    snprintf(path, sizeof path, fmt, dir, a);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    cr_assert_eq(loco_mkdirs(path), 0);
    *slash = '/';
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    return f;
}

static double loss_at(int site, int step) {
    return 5.0 - 0.05 * step + 0.1 * site;
}

/* STEPS training lines (tokens_per_s x step_s = 2048 tokens each), a
 * validation line every 10 steps; resumed: steps 21..25 written a second
 * time (a run resumed from step 20), the later values winning. */
static void write_metrics(FILE *f, int site, bool resumed) {
    for (int s = 1; s <= STEPS; s++) {
        fprintf(f,
                "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.4f,\"tokens_per_s\":4096,"
                "\"step_s\":0.5}\n",
                s, loss_at(site, s) + (resumed && s > 20 && s <= 25 ? 9 : 0), 1e-4 * s,
                s == 12 ? 40.0 : 2.0 - 0.03 * s);
        if (resumed && s == 25)
            for (int r = 21; r <= 25; r++)
                fprintf(f,
                        "{\"step\":%d,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":1.0,"
                        "\"tokens_per_s\":4096,\"step_s\":0.5}\n",
                        r, loss_at(site, r), 1e-4 * r);
        if (s % 10 == 0)
            fprintf(f, "{\"step\":%d,\"val_loss\":%.6f,\"val_tokens\":4096}\n", s,
                    loss_at(site, s) + 0.05);
    }
}

/* A single-site run: training lines, a resumed stretch, one torn line. */
static void write_single(const char *run) {
    FILE *f = create("%s/%s/metrics.jsonl", run);
    write_metrics(f, 0, true);
    fprintf(f, "{\"step\":41,\"loss\":2.9");
    fclose(f);
}

/* A multi-site run of siteA and siteB: the timeline, and per island the
 * metrics and OUTER outer steps of 1 MB sent and 2 MB received each,
 * every 10 steps, 5 s apart. */
static void write_multi(const char *run, bool outer_b) {
    FILE *f = create("%s/%s/events.jsonl", run);
    fprintf(f, "{\"t\":1000.0,\"kind\":\"start\",\"sites\":[\"siteA\",\"siteB\"],"
               "\"config\":\"configs/multisite-2.ini\",\"seed\":7}\n");
    for (int o = 1; o <= OUTER; o++)
        fprintf(f, "{\"t\":%d.5,\"kind\":\"commit\",\"outer_step\":%d,\"epoch\":1}\n", 1000 + 5 * o,
                o);
    fprintf(f, "{\"t\":1025.0,\"kind\":\"end\",\"status\":\"finished\"}\n");
    fclose(f);
    static const char *const sites[2] = {"siteA", "siteB"};
    char sub[600];
    for (int i = 0; i < 2; i++) {
        snprintf(sub, sizeof sub, "%s/%s", run, sites[i]);
        f = create("%s/%s/metrics.jsonl", sub);
        write_metrics(f, i, false);
        fclose(f);
        if (i == 1 && !outer_b)
            continue;
        f = create("%s/%s/outer.jsonl", sub);
        for (int o = 1; o <= OUTER; o++)
            fprintf(
                f,
                "{\"outer_step\":%d,\"step\":%d,\"bytes_sent\":1000000,\"bytes_received\":2000000,"
                "\"wall_s\":5.0,\"wait_s\":0.5,\"theta_hash\":\"00ff\"}\n",
                o, 10 * o);
        fclose(f);
    }
}

static char *read_text(const char *path) {
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0, "%s", path);
    char *s = malloc(len + 1);
    memcpy(s, data, len);
    s[len] = '\0';
    loco_free(data);
    return s;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* The points of the polyline of a series (the first of them, when a
 * series is broken), as pixel coordinates; returns how many, -1 if none. */
static int polyline(const char *html, const char *label, double *x, double *y, int cap) {
    char key[256];
    snprintf(key, sizeof key, "data-label=\"%s\"", label);
    const char *p = strstr(html, key);
    if (!p)
        return -1;
    p = strstr(p, "points=\"");
    cr_assert(p);
    p += 8;
    int n = 0;
    while (*p != '"') {
        char *end;
        double a = strtod(p, &end);
        cr_assert_eq(*end, ',', "points of %s", label);
        double b = strtod(end + 1, &end);
        if (n < cap)
            x[n] = a, y[n] = b;
        n++;
        p = end;
        while (*p == ' ')
            p++;
    }
    return n;
}

/* A series drawn left to right with n points, falling when it should. */
static void expect_series(const char *html, const char *label, int n, bool falls) {
    double x[256], y[256];
    int got = polyline(html, label, x, y, 256);
    cr_expect_eq(got, n, "%s: %d points, want %d", label, got, n);
    for (int i = 1; i < got && i < 256; i++)
        cr_expect_gt(x[i], x[i - 1], "%s: x not increasing at %d", label, i);
    if (falls && got > 1)
        cr_expect_gt(y[got - 1], y[0], "%s: the curve should fall (pixel y grows)", label);
}

Test(report_train, single_site_synthetic) {
    static char out[1 << 16];
    write_single("run");
    int rc = test_run(out, sizeof out, LOCO " report %s/run", dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "/run/report.html"), "%s", out);
    cr_expect(strstr(out, "metrics.jsonl:50: malformed line skipped"), "%s", out);
    char path[600];
    snprintf(path, sizeof path, "%s/run/report.html", dir);
    char *html = read_text(path);
    cr_expect_eq(count(html, "<svg"), 4, "loss, lr, grad norm, tokens/s");
    cr_expect_eq(count(html, "<script"), 0);
    /* steps 21..25 repeat: one point per step, the resumed values */
    expect_series(html, "training loss", STEPS, true);
    expect_series(html, "validation loss", STEPS / 10, true);
    expect_series(html, "learning rate", STEPS, false);
    expect_series(html, "grad norm", STEPS, false);
    expect_series(html, "tokens/s", STEPS, false);
    cr_expect(strstr(html, "single-site"));
    cr_expect(strstr(html, "<td>total tokens</td><td>81920 "), "40 steps x 2048 tokens");
    double sum = 0;
    for (int s = STEPS - 9; s <= STEPS; s++)
        sum += loss_at(0, s);
    char want[128];
    snprintf(want, sizeof want, "<td>final training loss</td><td>%.4f ", sum / 10);
    cr_expect(strstr(html, want), "want %s", want);
    snprintf(want, sizeof want, "<td>final validation loss</td><td>%.4f (step 40)",
             loss_at(0, 40) + 0.05);
    cr_expect(strstr(html, want), "want %s", want);
    cr_expect(strstr(html, "<td>training time</td><td>20.0 s"), "40 x 0.5 s");
    cr_expect(strstr(html, "metrics.jsonl:50: malformed line skipped"), "warning in the page");
    cr_expect(strstr(html, "not recorded (no ckpt_*/config.ini"));
    /* the grad norm chart is on a log axis: 40 and 0.83 are a decade apart */
    cr_expect(strstr(html, ">10</text>"), "a decade tick on the log axis");
    free(html);
}

Test(report_train, multi_site_synthetic) {
    static char out[1 << 16];
    write_multi("ms", true);
    int rc = test_run(out, sizeof out, LOCO " report %s/ms --out %s/elsewhere", dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    char path[600];
    snprintf(path, sizeof path, "%s/elsewhere/report.html", dir);
    char *html = read_text(path);
    cr_expect_eq(count(html, "<svg"), 6, "loss, lr, grad norm, tokens/s, bytes, outer steps");
    cr_expect_eq(count(html, "<script"), 0);
    static const char *const sites[2] = {"siteA", "siteB"};
    char label[64];
    for (int i = 0; i < 2; i++) {
        snprintf(label, sizeof label, "%s training loss", sites[i]);
        expect_series(html, label, STEPS, true);
        snprintf(label, sizeof label, "%s validation loss", sites[i]);
        expect_series(html, label, STEPS / 10, true);
        snprintf(label, sizeof label, "%s tokens/s", sites[i]);
        expect_series(html, label, STEPS, false);
        snprintf(label, sizeof label, "%s sent", sites[i]);
        expect_series(html, label, OUTER, false);
        snprintf(label, sizeof label, "%s received", sites[i]);
        expect_series(html, label, OUTER, false);
        /* outer steps against time: rising, so pixel y falls */
        double x[8], y[8];
        snprintf(label, sizeof label, "%s outer step", sites[i]);
        cr_expect_eq(polyline(html, label, x, y, 8), OUTER, "%s", label);
        cr_expect_lt(y[OUTER - 1], y[0]);
    }
    cr_expect(strstr(html, "multi-site (2 islands: siteA, siteB)"));
    cr_expect(strstr(html, "configs/multisite-2.ini"));
    cr_expect(strstr(html, "<td>total tokens</td><td>163840 "), "2 islands x 40 x 2048");
    cr_expect(strstr(html, "<td>wall time</td><td>25.0 s"));
    cr_expect(strstr(html, "<td>bytes on the wire</td><td>8.00 MB sent, 16.00 MB received"));
    cr_expect(strstr(html, "<td>outer steps committed</td><td>4</td>"));
    cr_expect(strstr(html, "<td>siteB</td><td>40</td>"), "the islands table");
    free(html);
}

Test(report_train, real_single_site_run) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                      LOCO " train configs/tiny.ini --set model.n_layer=1 --set model.n_head=2"
                           " --set model.n_embd=32 --set model.seq_len=32 --set train.batch_size=4"
                           " --set run.threads=1 --set train.steps=12 --set run.eval_every=6"
                           " --set run.eval_batches=1 --set run.log_every=6 --set run.dir=%s/t",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    rc = test_run(out, sizeof out, LOCO " report %s/t", dir);
    cr_assert_eq(rc, 0, "%s", out);
    char path[600];
    snprintf(path, sizeof path, "%s/t/report.html", dir);
    char *html = read_text(path);
    cr_expect_eq(count(html, "<svg"), 4);
    expect_series(html, "training loss", 12, false);
    expect_series(html, "validation loss", 2, false);
    expect_series(html, "grad norm", 12, false);
    cr_expect(strstr(html, "<td>model</td><td>1 layers, 2 heads, width 32, context 32"),
              "config from the checkpoint");
    cr_expect(strstr(html, "<td>total tokens</td><td>1536 "), "12 steps x 4 x 32 tokens");
    cr_expect_eq(count(html, "<h2>Warnings</h2>"), 0);
    free(html);
}

/* Over REPORT_MAX_POINTS (1500) points a series keeps every second point
 * here, and always the last one, at the plot's right edge (x = 740). */
Test(report_train, long_run_is_decimated) {
    static char out[1 << 16];
    FILE *f = create("%s/%s/metrics.jsonl", "long");
    for (int s = 1; s <= 3000; s++)
        fprintf(f,
                "{\"step\":%d,\"loss\":%.4f,\"lr\":0.001,\"grad_norm\":1,\"tokens_per_s\":1,"
                "\"step_s\":1}\n",
                s, 5.0 - s / 1000.0);
    fclose(f);
    cr_assert_eq(test_run(out, sizeof out, LOCO " report %s/long", dir), 0, "%s", out);
    char path[600];
    snprintf(path, sizeof path, "%s/long/report.html", dir);
    char *html = read_text(path);
    static double x[2000], y[2000];
    cr_expect_eq(polyline(html, "training loss", x, y, 2000), 1501);
    cr_expect_float_eq(x[1500], 740.0, 0.05, "the last step drawn: %f", x[1500]);
    cr_expect(x[1499] < x[1500]);
    free(html);
}

Test(report_train, bad_inputs) {
    static char out[1 << 16];
    char path[600];
    /* not a directory, not a run directory */
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/none", dir), 1);
    cr_expect(strstr(out, "/none"), "%s", out);
    snprintf(path, sizeof path, "%s/empty", dir);
    cr_assert_eq(loco_mkdirs(path), 0);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/empty", dir), 1);
    cr_expect(strstr(out, "not a run directory"), "%s", out);
    /* nothing but garbage: an error naming the file, after the line */
    FILE *f = create("%s/%s/metrics.jsonl", "junk");
    fprintf(f, "not json\n{\"step\":1,\"val_loss\":3}\n");
    fclose(f);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/junk", dir), 1);
    cr_expect(strstr(out, "junk/metrics.jsonl:1: malformed line"), "%s", out);
    cr_expect(strstr(out, "junk/metrics.jsonl: no training lines"), "%s", out);
    /* a field of the wrong type: warned about, the rest drawn */
    f = create("%s/%s/metrics.jsonl", "typed");
    write_metrics(f, 0, false);
    fprintf(f, "{\"step\":41,\"loss\":\"low\",\"lr\":0.1}\n");
    fclose(f);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/typed", dir), 0, "%s", out);
    cr_expect(strstr(out, "typed/metrics.jsonl:45: \"loss\" is not a number"), "%s", out);
    /* an island named by the start event without metrics: an error */
    write_multi("ms", true);
    snprintf(path, sizeof path, "%s/ms/siteB/metrics.jsonl", dir);
    cr_assert_eq(remove(path), 0);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/ms", dir), 1);
    cr_expect(strstr(out, "ms/siteB/metrics.jsonl"), "%s", out);
    /* an island without outer.jsonl: a note in the page */
    write_multi("ms2", false);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/ms2", dir), 0, "%s", out);
    snprintf(path, sizeof path, "%s/ms2/report.html", dir);
    char *html = read_text(path);
    cr_expect(strstr(html, "siteB/outer.jsonl: missing"));
    cr_expect_eq(polyline(html, "siteB sent", NULL, NULL, 0), -1);
    expect_series(html, "siteA sent", OUTER, false);
    free(html);
    /* fault-experiment options on a training run */
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/ms2 --strict-loss", dir), 2);
}

/* A fault experiment's directory (RUN/baseline inside) still gets the
 * fault report, against its baseline. */
Test(report_train, fault_experiment_dispatch) {
    static char out[1 << 16];
    char run[600];
    write_multi("fx", true);
    write_multi("fx/baseline", true);
    cr_expect_eq(test_run(out, sizeof out, LOCO " report %s/fx", dir), 0, "%s", out);
    cr_expect(strstr(out, "verdict: PASS"), "%s", out);
    snprintf(run, sizeof run, "%s/fx/report.md", dir);
    struct stat st;
    cr_expect_eq(stat(run, &st), 0, "the fault report writes report.md");
}

/* ------------------------------------------------------ in a browser */

static bool have_chromium(void) {
    return system("command -v chromium >/dev/null 2>&1") == 0;
}

#define CHROMIUM "chromium --headless --no-sandbox --disable-gpu --hide-scrollbars"

/* An RGB(A) 8-bit PNG decoded with the system zlib (loaded here, so the
 * test links nothing new): width, height and pixels as RGB. */
typedef int (*uncompress_fn)(unsigned char *, unsigned long *, const unsigned char *,
                             unsigned long);

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static unsigned char *png_rgb(const char *path, int *w, int *h) {
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0, "%s", path);
    const unsigned char *p = data;
    cr_assert(len > 33 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8), "%s: not a PNG", path);
    *w = (int)be32(p + 16);
    *h = (int)be32(p + 20);
    int depth = p[24], type = p[25], interlace = p[28];
    cr_assert(depth == 8 && (type == 2 || type == 6) && !interlace,
              "%s: depth %d type %d interlace %d", path, depth, type, interlace);
    int bpp = type == 6 ? 4 : 3;
    unsigned char *idat = malloc(len);
    size_t n = 0;
    for (size_t o = 8; o + 12 <= len;) {
        uint32_t clen = be32(p + o);
        if (!memcmp(p + o + 4, "IDAT", 4)) {
            memcpy(idat + n, p + o + 8, clen);
            n += clen;
        }
        o += 12 + clen;
    }
    void *z = dlopen("libz.so.1", RTLD_NOW);
    cr_assert(z, "libz.so.1: %s", dlerror());
    uncompress_fn unz = (uncompress_fn)(uintptr_t)dlsym(z, "uncompress");
    cr_assert(unz);
    size_t stride = (size_t)*w * bpp;
    unsigned long rawlen = (unsigned long)((stride + 1) * (size_t)*h);
    unsigned char *raw = malloc(rawlen);
    cr_assert_eq(unz(raw, &rawlen, idat, n), 0, "%s: inflate", path);
    cr_assert_eq(rawlen, (stride + 1) * (size_t)*h);
    dlclose(z);
    /* undo the filters (PNG spec 9.2), row by row */
    unsigned char *img = malloc(stride * (size_t)*h), *rgb = malloc((size_t)*w * *h * 3);
    for (int y = 0; y < *h; y++) {
        const unsigned char *in = raw + y * (stride + 1) + 1;
        unsigned char *row = img + y * stride, *up = y ? row - stride : NULL;
        int ft = in[-1];
        for (size_t i = 0; i < stride; i++) {
            int a = i >= (size_t)bpp ? row[i - bpp] : 0, b = up ? up[i] : 0,
                c = up && i >= (size_t)bpp ? up[i - bpp] : 0, pred = 0;
            if (ft == 1)
                pred = a;
            else if (ft == 2)
                pred = b;
            else if (ft == 3)
                pred = (a + b) / 2;
            else if (ft == 4) {
                int pp = a + b - c, pa = abs(pp - a), pb = abs(pp - b), pc = abs(pp - c);
                pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
            }
            row[i] = (unsigned char)(in[i] + pred);
        }
        for (int x = 0; x < *w; x++)
            memcpy(rgb + ((size_t)y * *w + x) * 3, row + (size_t)x * bpp, 3);
    }
    free(img);
    free(raw);
    free(idat);
    loco_free(data);
    return rgb;
}

static int pixels_near(const unsigned char *rgb, int n, int r, int g, int b) {
    int k = 0;
    for (int i = 0; i < n; i++)
        k += abs(rgb[3 * i] - r) <= 16 && abs(rgb[3 * i + 1] - g) <= 16 &&
             abs(rgb[3 * i + 2] - b) <= 16;
    return k;
}

Test(report_train, rendered_by_chromium) {
    if (!have_chromium())
        cr_skip_test("chromium not installed: the page is not rendered in a browser "
                     "(apt-get install --no-install-recommends chromium)");
    static char out[1 << 20];
    write_multi("ms", true);
    cr_assert_eq(test_run(out, sizeof out, LOCO " report %s/ms", dir), 0, "%s", out);
    /* the DOM as the browser built it */
    int rc =
        test_run(out, sizeof out,
                 "cd %s && HOME=%s " CHROMIUM " --dump-dom file://%s/ms/report.html 2>/dev/null",
                 dir, dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "</html>"), "a whole document");
    cr_expect_eq(count(out, "<svg"), 6, "six charts in the rendered DOM");
    cr_expect_eq(count(out, "</polyline>"), 2 * 8,
                 "per island: loss, val loss, lr, grad norm, "
                 "tokens/s, sent, received, outer steps");
    expect_series(out, "siteA training loss", STEPS, true);
    expect_series(out, "siteB validation loss", STEPS / 10, true);
    expect_series(out, "siteB received", OUTER, false);
    /* and as it looks */
    char png[700];
    snprintf(png, sizeof png, "%s/shot.png", dir);
    rc = test_run(out, sizeof out,
                  "cd %s && HOME=%s " CHROMIUM " --window-size=900,3600 --screenshot=%s "
                  "file://%s/ms/report.html 2>/dev/null",
                  dir, dir, png, dir);
    cr_assert_eq(rc, 0, "%s", out);
    int w, h;
    unsigned char *rgb = png_rgb(png, &w, &h);
    cr_expect_eq(w, 900);
    cr_expect_eq(h, 3600);
    int n = w * h, white = pixels_near(rgb, n, 255, 255, 255);
    cr_expect(white < n * 0.97, "the page is not blank: %d of %d pixels white", white, n);
    cr_expect(white > n * 0.40, "nor filled: %d of %d pixels white", white, n);
    /* siteA's and siteB's colours, drawn */
    int blue = pixels_near(rgb, n, 0x1f, 0x77, 0xb4),
        orange = pixels_near(rgb, n, 0xff, 0x7f, 0x0e);
    cr_expect_gt(blue, 500, "siteA's blue: %d pixels", blue);
    cr_expect_gt(orange, 500, "siteB's orange: %d pixels", orange);
    free(rgb);
}
