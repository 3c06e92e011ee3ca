/* Helpers of the tests of live metrics: a checker of the Prometheus text
 * exposition format 0.0.4 written from its specification (independent of
 * core/metrics_http.c), the value of one sample, and a bare HTTP/1.0
 * client over a socket. */
#ifndef LOCO_TESTS_PROM_CHECK_H
#define LOCO_TESTS_PROM_CHECK_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <regex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROM_NAME "[a-zA-Z_:][a-zA-Z0-9_:]*"
#define PROM_LABELS                                                                                \
    "\\{[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\[\\\\\"n])*\""                                     \
    "(,[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\[\\\\\"n])*\")*\\}"
#define PROM_FLOAT "(NaN|[+-]Inf|[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?)"

/* Checks every line of an exposition: `# HELP name text`, `# TYPE name
 * gauge|counter|...` (HELP and TYPE at most once per name, before its
 * samples), `name{labels} value` whose name has both; no blank lines but
 * the final newline. Returns the number of samples, or -1 with the reason
 * (and the line) in why. */
static inline int prom_check_text(const char *text, char *why, size_t cap) {
    regex_t help, type, smp;
    cr_assert_eq(regcomp(&help, "^# HELP (" PROM_NAME ") .*$", REG_EXTENDED), 0);
    cr_assert_eq(regcomp(&type,
                         "^# TYPE (" PROM_NAME ") (counter|gauge|histogram|summary|untyped)$",
                         REG_EXTENDED),
                 0);
    cr_assert_eq(regcomp(&smp, "^(" PROM_NAME ")(" PROM_LABELS ")? " PROM_FLOAT "$", REG_EXTENDED),
                 0);
    char helped[64][100], typed[64][100];
    int nh = 0, nt = 0, samples = 0;
    const size_t len = strlen(text);
    int rc = 0;
    if (len == 0 || text[len - 1] != '\n') {
        snprintf(why, cap, "the text does not end with a newline");
        rc = -1;
    }
    for (const char *p = text; rc == 0 && *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)n, p);
        p += n + (nl != NULL);
        regmatch_t m[3];
        char name[100];
        if (regexec(&help, line, 2, m, 0) == 0) {
            snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
            for (int i = 0; i < nh; i++)
                if (!strcmp(helped[i], name)) {
                    snprintf(why, cap, "HELP twice: %s", line);
                    rc = -1;
                }
            if (nh < 64)
                snprintf(helped[nh++], sizeof helped[0], "%s", name);
        } else if (regexec(&type, line, 2, m, 0) == 0) {
            snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
            for (int i = 0; i < nt; i++)
                if (!strcmp(typed[i], name)) {
                    snprintf(why, cap, "TYPE twice: %s", line);
                    rc = -1;
                }
            if (nt < 64)
                snprintf(typed[nt++], sizeof typed[0], "%s", name);
        } else if (regexec(&smp, line, 2, m, 0) == 0) {
            snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
            bool h = false, t = false;
            for (int i = 0; i < nh; i++)
                h |= !strcmp(helped[i], name);
            for (int i = 0; i < nt; i++)
                t |= !strcmp(typed[i], name);
            if (!h || !t) {
                snprintf(why, cap, "sample without %s before it: %s", h ? "TYPE" : "HELP", line);
                rc = -1;
            }
            samples++;
        } else {
            snprintf(why, cap, "not a HELP, TYPE or sample line: '%s'", line);
            rc = -1;
        }
    }
    regfree(&help);
    regfree(&type);
    regfree(&smp);
    return rc < 0 ? -1 : samples;
}

/* The value of the sample written `series` (a name, or a name with its
 * labels as rendered: `loco_coord_member{site="siteA"}`); false when absent. */
static inline bool prom_value(const char *text, const char *series, double *v) {
    const size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ') {
            *v = strtod(p + n + 1, NULL);
            return true;
        }
    return false;
}

/* Sends req (raw bytes) to 127.0.0.1:port and reads the answer until the
 * server closes or timeout_ms passes; returns the bytes read (-1: no
 * connection). */
static inline int prom_raw(int port, const void *req, size_t req_len, char *out, size_t cap,
                           int timeout_ms) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        if (s >= 0)
            close(s);
        return -1;
    }
    if (req_len)
        (void)!send(s, req, req_len, MSG_NOSIGNAL);
    size_t got = 0;
    for (;;) {
        struct pollfd pf = {.fd = s, .events = POLLIN};
        if (poll(&pf, 1, timeout_ms) <= 0 || got + 1 >= cap)
            break;
        ssize_t r = recv(s, out + got, cap - 1 - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    out[got] = '\0';
    close(s);
    return (int)got;
}

/* GET path over HTTP/1.0; *body points into out after the headers.
 * Returns the status code (-1: no answer). */
static inline int prom_get(int port, const char *path, char *out, size_t cap, const char **body) {
    char req[256];
    const int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (prom_raw(port, req, (size_t)n, out, cap, 5000) <= 0)
        return -1;
    int code = -1;
    if (sscanf(out, "HTTP/1.%*d %d", &code) != 1)
        return -1;
    const char *b = strstr(out, "\r\n\r\n");
    *body = b ? b + 4 : "";
    return code;
}

#endif
