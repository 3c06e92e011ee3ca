/* Live metrics (core/metrics_http.c): the exposition text against the
 * Prometheus format written out by hand (escaping of label values and
 * help, NaN and infinities, types), the registry's contract (undeclared
 * names, label mismatch, set_only), and the HTTP side over a bare socket:
 * GET /metrics, 404 and 405, the port file, a port already taken, bad
 * addresses, and scrapers that send garbage, stall or open many
 * connections without harming the server. */
#include "core/core.h"

#include "tests/prom_check.h"

#include <errno.h>
#include <math.h>
#include <sys/stat.h>

static char *dir;

static void setup(void) {
    dir = strdup("/tmp/loco-prom-XXXXXX");
    cr_assert(mkdtemp(dir));
    loco_log_set_level(LOCO_LOG_ERROR);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(metrics_http, .init = setup, .fini = teardown, .timeout = 60);

Test(metrics_http, renders_the_exposition_format) {
    loco_prom *p;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_assert_eq(loco_prom_declare(p, "t_gauge", LOCO_PROM_GAUGE, NULL, "a plain gauge"), 0);
    cr_assert_eq(loco_prom_declare(p, "t_labelled", LOCO_PROM_GAUGE, "site",
                                   "help with a \\ backslash\nand a newline"),
                 0);
    cr_assert_eq(loco_prom_declare(p, "t_total", LOCO_PROM_COUNTER, NULL, "a counter"), 0);
    cr_assert_eq(loco_prom_declare(p, "t_unset", LOCO_PROM_GAUGE, NULL, "never set"), 0);
    loco_prom_set(p, "t_gauge", NULL, 42);
    loco_prom_set(p, "t_labelled", "plain", 0.5);
    loco_prom_set(p, "t_labelled", "q\"uo\\te\nnl", NAN);
    loco_prom_set(p, "t_labelled", "up", INFINITY);
    loco_prom_set(p, "t_labelled", "down", -INFINITY);
    loco_prom_add(p, "t_total", NULL, 2);
    loco_prom_add(p, "t_total", NULL, 3);
    loco_prom_set(p, "t_gauge", NULL, 0.1); /* replaces 42 */
    char *text;
    size_t len;
    cr_assert_eq(loco_prom_render(p, &text, &len), 0);
    static const char want[] = "# HELP t_gauge a plain gauge\n"
                               "# TYPE t_gauge gauge\n"
                               "t_gauge 0.1\n"
                               "# HELP t_labelled help with a \\\\ backslash\\nand a newline\n"
                               "# TYPE t_labelled gauge\n"
                               "t_labelled{site=\"plain\"} 0.5\n"
                               "t_labelled{site=\"q\\\"uo\\\\te\\nnl\"} NaN\n"
                               "t_labelled{site=\"up\"} +Inf\n"
                               "t_labelled{site=\"down\"} -Inf\n"
                               "# HELP t_total a counter\n"
                               "# TYPE t_total counter\n"
                               "t_total 5\n";
    cr_expect_str_eq(text, want);
    cr_expect_eq(len, strlen(want));
    char why[1200];
    why[0] = 0;
    const int n = prom_check_text(text, why, sizeof why);
    cr_expect_eq(n, 6, "%d samples: %s", n, why);
    loco_free(text);
    loco_prom_destroy(p);
}

Test(metrics_http, values_read_back_exactly) {
    const double vals[] = {0,         1,
                           -1,        0.1,
                           1.0 / 3,   1e300,
                           -2.5e-308, 123456789012345678.0,
                           4.9e-324,  9007199254740993.0};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        char s[LOCO_PROM_VALUE_MAX];
        loco_prom_format_value(vals[i], s);
        cr_expect_eq(strtod(s, NULL), vals[i], "%.17g written as %s", vals[i], s);
        cr_expect(!strchr(s, ' ') && !strchr(s, ','), "%s", s);
    }
    char s[LOCO_PROM_VALUE_MAX];
    loco_prom_format_value(3, s);
    cr_expect_str_eq(s, "3");
    loco_prom_format_value(-NAN, s);
    cr_expect_str_eq(s, "NaN");
}

Test(metrics_http, registry_contract) {
    loco_prom *p;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_expect_eq(loco_prom_declare(p, "9bad", LOCO_PROM_GAUGE, NULL, "x"), LOCO_EINVAL);
    cr_expect_eq(loco_prom_declare(p, "bad-name", LOCO_PROM_GAUGE, NULL, "x"), LOCO_EINVAL);
    cr_expect_eq(loco_prom_declare(p, "ok", LOCO_PROM_GAUGE, "has:colon", "x"), LOCO_EINVAL);
    cr_expect_eq(loco_prom_declare(p, "ok", LOCO_PROM_GAUGE, "__reserved", "x"), LOCO_EINVAL);
    cr_assert_eq(loco_prom_declare(p, "ok:name", LOCO_PROM_GAUGE, "l", "x"), 0);
    cr_expect_eq(loco_prom_declare(p, "ok:name", LOCO_PROM_GAUGE, NULL, "x"), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "declared twice"), "%s", loco_errmsg());
    loco_prom_set(p, "undeclared", NULL, 1); /* ignored */
    loco_prom_set(p, "ok:name", NULL, 1);    /* no label: the declaration has one */
    loco_prom_set(p, "ok:name", "a", 1);
    loco_prom_set_only(p, "ok:name", "b", 2); /* a is forgotten */
    char *text;
    size_t len;
    cr_assert_eq(loco_prom_render(p, &text, &len), 0);
    cr_expect_str_eq(text, "# HELP ok:name x\n# TYPE ok:name gauge\nok:name{l=\"b\"} 2\n");
    loco_free(text);
    loco_prom_set(NULL, "ok:name", "a", 1); /* metrics off */
    loco_prom_destroy(p);
    loco_prom_destroy(NULL);
}

static int port_from_file(const char *path) {
    char *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, (void **)&data, &len), 0, "%s", loco_errmsg());
    char host[64];
    int port = -1;
    cr_expect_eq(sscanf(data, "%63[^:]:%d", host, &port), 2, "%s", data);
    cr_expect_str_eq(host, "127.0.0.1");
    loco_free(data);
    return port;
}

Test(metrics_http, serves_get_metrics_and_404_elsewhere) {
    loco_prom *p;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_assert_eq(loco_prom_declare(p, "t_up", LOCO_PROM_GAUGE, NULL, "up"), 0);
    loco_prom_set(p, "t_up", NULL, 1);
    char file[600];
    snprintf(file, sizeof file, "%s/metrics_addr", dir);
    cr_assert_eq(loco_prom_serve(p, "127.0.0.1:0", "test.addr", file), 0, "%s", loco_errmsg());
    const int port = loco_prom_port(p);
    cr_assert_gt(port, 0);
    cr_expect_eq(port_from_file(file), port);
    static char out[65536];
    const char *body;
    cr_assert_eq(prom_get(port, "/metrics", out, sizeof out, &body), 200, "%s", out);
    cr_expect(strstr(out, "Content-Type: text/plain; version=0.0.4"), "%s", out);
    cr_expect_str_eq(body, "# HELP t_up up\n# TYPE t_up gauge\nt_up 1\n");
    loco_prom_set(p, "t_up", NULL, 7); /* the next scrape sees it */
    cr_assert_eq(prom_get(port, "/metrics", out, sizeof out, &body), 200);
    double v;
    cr_expect(prom_value(body, "t_up", &v) && v == 7, "%s", body);
    cr_expect_eq(prom_get(port, "/", out, sizeof out, &body), 404, "%s", out);
    cr_expect_eq(prom_get(port, "/metrics/x", out, sizeof out, &body), 404, "%s", out);
    static const char post[] = "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc";
    cr_assert_gt(prom_raw(port, post, sizeof post - 1, out, sizeof out, 5000), 0);
    cr_expect(!strncmp(out, "HTTP/1.0 405", 12) || !strncmp(out, "HTTP/1.1 405", 12), "%s", out);
    loco_prom_destroy(p);
    struct stat st;
    cr_expect_neq(stat(file, &st), 0, "the port file outlives the server");
    cr_expect_eq(prom_raw(port, "", 0, out, sizeof out, 100), -1, "still listening on %d", port);
}

Test(metrics_http, bad_address_or_taken_port_is_a_clear_error) {
    loco_prom *a, *b;
    cr_assert_eq(loco_prom_create(&a), 0);
    cr_assert_eq(loco_prom_create(&b), 0);
    static const char *const bad[] = {
        "localhost", ":9100", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(loco_prom_serve(a, bad[i], "faulttol.metrics_addr", NULL), LOCO_EINVAL, "%s",
                     bad[i]);
        cr_expect(strstr(loco_errmsg(), "faulttol.metrics_addr") &&
                      strstr(loco_errmsg(), "HOST:PORT"),
                  "%s", loco_errmsg());
    }
    cr_expect_eq(loco_prom_serve(a, "no-such-host.invalid:0", "run.metrics_addr", NULL),
                 LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "run.metrics_addr"), "%s", loco_errmsg());
    cr_assert_eq(loco_prom_serve(a, "127.0.0.1:0", "x", NULL), 0, "%s", loco_errmsg());
    char taken[64];
    snprintf(taken, sizeof taken, "127.0.0.1:%d", loco_prom_port(a));
    cr_expect_eq(loco_prom_serve(b, taken, "run.metrics_addr", NULL), LOCO_EIO);
    cr_expect(strstr(loco_errmsg(), "run.metrics_addr") && strstr(loco_errmsg(), taken) &&
                  strstr(loco_errmsg(), "in use"),
              "%s", loco_errmsg());
    cr_expect_eq(loco_prom_serve(a, "127.0.0.1:0", "x", NULL), LOCO_EINVAL, "served twice");
    cr_expect_eq(loco_prom_port(b), 0);
    loco_prom_destroy(a);
    loco_prom_destroy(b);
}

/* Garbage, a stalled request and more connections than the limit: the
 * server answers or drops them, and a well-behaved scrape afterwards (and
 * during the stall) still works. */
Test(metrics_http, survives_garbage_stalls_and_floods) {
    loco_prom *p;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_assert_eq(loco_prom_declare(p, "t_up", LOCO_PROM_GAUGE, NULL, "up"), 0);
    loco_prom_set(p, "t_up", NULL, 1);
    cr_assert_eq(loco_prom_serve(p, "127.0.0.1:0", "x", NULL), 0, "%s", loco_errmsg());
    const int port = loco_prom_port(p);
    static char out[65536];
    const char *body;
    /* Bytes that are no HTTP: an error status or a closed connection. */
    unsigned char junk[4096];
    loco_rng rng;
    loco_rng_seed(&rng, 7);
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (unsigned char)loco_rng_u64(&rng);
    for (int k = 0; k < 5; k++) {
        int n = prom_raw(port, junk, sizeof junk, out, sizeof out, 3000);
        cr_expect(n <= 0 || !strncmp(out, "HTTP/1.1 4", 10), "answer to garbage: %.40s", out);
    }
    static const char bad_line[] = "GARBAGE \x01\x02 /metrics HTTP/9.9\r\n\r\n";
    prom_raw(port, bad_line, sizeof bad_line - 1, out, sizeof out, 3000);
    /* A header far over the per-connection memory limit. */
    static char huge[LOCO_PROM_CONN_MEMORY * 2];
    memcpy(huge, "GET /metrics HTTP/1.1\r\nX: ", 26);
    memset(huge + 26, 'a', sizeof huge - 26);
    prom_raw(port, huge, sizeof huge, out, sizeof out, 3000);
    cr_assert_eq(prom_get(port, "/metrics", out, sizeof out, &body), 200, "%s", out);
    /* A scraper that stalls half-way through its request line. */
    int stall = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(stall, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(send(stall, "GET /metr", 9, MSG_NOSIGNAL), 9);
    cr_assert_eq(prom_get(port, "/metrics", out, sizeof out, &body), 200, "blocked by a stall");
    /* More idle connections than the limit and the backlog hold (connects
     * that do not wait for the server): the owner still updates at once,
     * and once they go a scrape works again. */
    enum { FLOOD = 3 * (LOCO_PROM_MAX_CONNECTIONS + LOCO_PROM_BACKLOG) };
    int idle[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        idle[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        cr_assert_geq(idle[i], 0);
        const int c = connect(idle[i], (struct sockaddr *)&a, sizeof a);
        cr_assert(c == 0 || errno == EINPROGRESS, "connect: %s", strerror(errno));
    }
    loco_sleep_ms(200);
    const double t0 = loco_now();
    loco_prom_set(p, "t_up", NULL, 2);
    cr_expect_lt(loco_now() - t0, 0.1, "an update waited for the scrapers");
    loco_prom_set(p, "t_up", NULL, 1);
    for (int i = 0; i < FLOOD; i++)
        close(idle[i]);
    close(stall);
    int code = -1;
    for (int tries = 0; tries < 50 && code != 200; tries++) {
        code = prom_get(port, "/metrics", out, sizeof out, &body);
        if (code != 200)
            loco_sleep_ms(100);
    }
    cr_expect_eq(code, 200, "no scrape after the flood: %s", out);
    cr_expect_str_eq(body, "# HELP t_up up\n# TYPE t_up gauge\nt_up 1\n");
    loco_prom_destroy(p);
}
