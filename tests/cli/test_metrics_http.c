/* Serving live metrics (cli/metrics_http.c) over a bare socket: GET
 * /metrics, 404 and 405, the port file, a port already taken, bad
 * addresses, and scrapers that send garbage, stall or open many
 * connections without harming the server or the registry's owner. */
#include "cli/cli.h"

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
    cli_metrics *srv;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_assert_eq(loco_prom_declare(p, "t_up", LOCO_PROM_GAUGE, NULL, "up"), 0);
    loco_prom_set(p, "t_up", NULL, 1);
    char file[600];
    snprintf(file, sizeof file, "%s/metrics_addr", dir);
    cr_assert_eq(cli_metrics_serve(&srv, p, "127.0.0.1:0", "test.addr", file), 0, "%s",
                 loco_errmsg());
    const int port = cli_metrics_port(srv);
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
    cli_metrics_stop(srv);
    struct stat st;
    cr_expect_neq(stat(file, &st), 0, "the port file outlives the server");
    /* nothing listens: the connection is refused, no answer is waited for */
    cr_expect_eq(prom_raw(port, "", 0, out, sizeof out, 100), -1, "still listening on %d", port);
    loco_prom_destroy(p);
}

Test(metrics_http, bad_address_or_taken_port_is_a_clear_error) {
    loco_prom *p;
    cli_metrics *a, *b = NULL;
    cr_assert_eq(loco_prom_create(&p), 0);
    static const char *const bad[] = {
        "localhost", ":9100", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", "127.0.0.1:-1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(cli_metrics_serve(&a, p, bad[i], "faulttol.metrics_addr", NULL), LOCO_EINVAL,
                     "%s", bad[i]);
        cr_expect_null(a);
        cr_expect(strstr(loco_errmsg(), "faulttol.metrics_addr") &&
                      strstr(loco_errmsg(), "HOST:PORT"),
                  "%s", loco_errmsg());
    }
    cr_expect_eq(cli_metrics_serve(&a, p, "no-such-host.invalid:0", "run.metrics_addr", NULL),
                 LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "run.metrics_addr"), "%s", loco_errmsg());
    cr_expect_eq(cli_metrics_serve(&a, NULL, "127.0.0.1:0", "x", NULL), LOCO_EINVAL, "no registry");
    cr_assert_eq(cli_metrics_serve(&a, p, "127.0.0.1:0", "x", NULL), 0, "%s", loco_errmsg());
    char taken[64];
    snprintf(taken, sizeof taken, "127.0.0.1:%d", cli_metrics_port(a));
    cr_expect_eq(cli_metrics_serve(&b, p, taken, "run.metrics_addr", NULL), LOCO_EIO);
    cr_expect(strstr(loco_errmsg(), "run.metrics_addr") && strstr(loco_errmsg(), taken) &&
                  strstr(loco_errmsg(), "in use"),
              "%s", loco_errmsg());
    cr_expect_null(b);
    cr_expect_eq(cli_metrics_port(b), 0);
    /* metrics off, or a rank that does not serve: nothing, no error */
    cr_expect_eq(cli_metrics_serve_run(&b, NULL, "127.0.0.1:0", "run.metrics_addr", dir), 0);
    cr_expect_eq(cli_metrics_serve_run(&b, p, "", "run.metrics_addr", dir), 0);
    cr_expect_null(b);
    cli_metrics_stop(a);
    cli_metrics_stop(NULL);
    loco_prom_destroy(p);
}

/* A scrape, retried until one is answered: the server may refuse or drop
 * connections while it sheds others, and answers once it can. The suite's
 * timeout bounds the wait. */
static int scrape_when_answered(int port, char *out, size_t cap, const char **body) {
    int code;
    while ((code = prom_get(port, "/metrics", out, cap, body)) != 200)
        loco_sleep_ms(10);
    return code;
}

/* Garbage, a stalled request and more connections than the limit: the
 * server answers or drops them, and a well-behaved scrape afterwards (and
 * during the stall) still works; while the server holds every connection
 * it may, the registry's owner still updates (a blocked update would hang
 * here until the suite's timeout) and the next scrape shows it. */
Test(metrics_http, survives_garbage_stalls_and_floods) {
    loco_prom *p;
    cli_metrics *srv;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_assert_eq(loco_prom_declare(p, "t_up", LOCO_PROM_GAUGE, NULL, "up"), 0);
    loco_prom_set(p, "t_up", NULL, 1);
    cr_assert_eq(cli_metrics_serve(&srv, p, "127.0.0.1:0", "x", NULL), 0, "%s", loco_errmsg());
    const int port = cli_metrics_port(srv);
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
    static char huge[CLI_METRICS_CONN_MEMORY * 2];
    memcpy(huge, "GET /metrics HTTP/1.1\r\nX: ", 26);
    memset(huge + 26, 'a', sizeof huge - 26);
    prom_raw(port, huge, sizeof huge, out, sizeof out, 3000);
    cr_assert_eq(scrape_when_answered(port, out, sizeof out, &body), 200, "%s", out);
    /* A scraper that stalls half-way through its request line. */
    int stall = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(stall, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(send(stall, "GET /metr", 9, MSG_NOSIGNAL), 9);
    cr_assert_eq(prom_get(port, "/metrics", out, sizeof out, &body), 200, "blocked by a stall");
    /* More idle connections than the limit and the backlog hold (connects
     * that do not wait for the server), until the server holds as many as
     * it may. */
    enum { FLOOD = 3 * (CLI_METRICS_MAX_CONNECTIONS + CLI_METRICS_BACKLOG) };
    int idle[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        idle[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        cr_assert_geq(idle[i], 0);
        const int c = connect(idle[i], (struct sockaddr *)&a, sizeof a);
        cr_assert(c == 0 || errno == EINPROGRESS, "connect: %s", strerror(errno));
    }
    /* the event is the server holding its limit; the sleep paces the check */
    while (cli_metrics_connections(srv) < CLI_METRICS_MAX_CONNECTIONS)
        loco_sleep_ms(1);
    cr_expect_eq(cli_metrics_connections(srv), CLI_METRICS_MAX_CONNECTIONS, "over the limit");
    loco_prom_set(p, "t_up", NULL, 2);
    for (int i = 0; i < FLOOD; i++)
        close(idle[i]);
    close(stall);
    cr_assert_eq(scrape_when_answered(port, out, sizeof out, &body), 200, "%s", out);
    cr_expect_str_eq(body, "# HELP t_up up\n# TYPE t_up gauge\nt_up 2\n");
    cli_metrics_stop(srv);
    loco_prom_destroy(p);
}
