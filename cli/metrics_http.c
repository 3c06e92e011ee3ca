/* Serving a metrics registry (core's loco_prom) over HTTP: GET /metrics
 * in the Prometheus text exposition format, by GNU libmicrohttpd's own
 * thread. The library holds the line against scrapers: a connection limit,
 * an idle timeout and a memory limit per connection; a request it cannot
 * parse gets its 400 and the connection closes. Nothing a scraper does
 * reaches the registry's owner. */
#include "cli/cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct cli_metrics {
    loco_prom *prom; /* the caller's */
    struct MHD_Daemon *daemon;
    int port;
    char port_file[LOCO_PATH_MAX + 16]; /* written by serve, removed by stop */
};

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, const char *type,
                               const char *body, size_t len) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    const enum MHD_Result ok = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ok;
}

/* Called by the library's thread for each request. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **req_cls) {
    loco_prom *p = cls;
    if (*upload_size) {
        *upload_size = 0; /* a body is read and ignored */
        return MHD_YES;
    }
    static const char plain[] = "text/plain; charset=utf-8";
    const bool get = !strcmp(method, MHD_HTTP_METHOD_GET) || !strcmp(method, MHD_HTTP_METHOD_HEAD);
    if (strcmp(url, "/metrics")) {
        static const char nf[] = "not found: metrics are at /metrics\n";
        return respond(conn, MHD_HTTP_NOT_FOUND, plain, nf, sizeof nf - 1);
    }
    if (!get) {
        static const char na[] = "method not allowed: GET /metrics\n";
        return respond(conn, MHD_HTTP_METHOD_NOT_ALLOWED, plain, na, sizeof na - 1);
    }
    char *text;
    size_t len;
    if (loco_prom_render(p, &text, &len) < 0) {
        static const char oom[] = "out of memory\n";
        return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, plain, oom, sizeof oom - 1);
    }
    const enum MHD_Result ok =
        respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", text, len);
    loco_free(text);
    return ok;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = '\0';
    loco_debug("metrics: %s", msg);
}

/* Splits "HOST:PORT" ("[v6]:PORT" too) and binds a listening socket. */
static int bind_addr(const char *addr, const char *what, int *fd_out, int *port_out) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    const char *h = addr;
    size_t hl = colon ? (size_t)(colon - addr) : 0;
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']')
        h++, hl -= 2;
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || hl == 0 || hl >= sizeof host || !colon[1] || *end || port < 0 || port > 65535)
        return LOCO_ERR(LOCO_EINVAL, "%s = \"%s\": expected HOST:PORT (port 0: any free one)", what,
                        addr);
    memcpy(host, h, hl);
    host[hl] = '\0';
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%ld", port);
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0)
        return LOCO_ERR(LOCO_EINVAL, "%s = \"%s\": cannot resolve %s: %s", what, addr, host,
                        gai_strerror(g));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1, err = 0;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, CLI_METRICS_BACKLOG) != 0)
        err = errno;
    freeaddrinfo(ai);
    struct sockaddr_storage sa;
    socklen_t sl = sizeof sa;
    if (!err && getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
        err = errno;
    if (err) {
        if (fd >= 0)
            close(fd);
        return LOCO_ERR(LOCO_EIO, "%s = \"%s\": cannot listen there: %s", what, addr,
                        strerror(err));
    }
    *port_out = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                               : ((struct sockaddr_in *)&sa)->sin_port);
    *fd_out = fd;
    return 0;
}

static void stop(cli_metrics *m) {
    if (m->daemon)
        MHD_stop_daemon(m->daemon); /* joins its thread, closes the socket */
    if (m->port_file[0])
        unlink(m->port_file);
    loco_free(m);
}

int cli_metrics_serve(cli_metrics **out, loco_prom *p, const char *addr, const char *what,
                      const char *port_file) {
    *out = NULL;
    if (!p)
        return LOCO_ERR(LOCO_EINVAL, "metrics: no registry to serve (%s)", what);
    cli_metrics *m = loco_alloc(sizeof *m);
    if (!m)
        return LOCO_ERR(LOCO_ENOMEM, "metrics: server");
    memset(m, 0, sizeof *m);
    m->prom = p;
    int fd = -1, port = 0, rc = bind_addr(addr, what, &fd, &port);
    if (rc < 0) {
        loco_free(m);
        return rc;
    }
    m->daemon = MHD_start_daemon(
        MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, p,
        MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)CLI_METRICS_MAX_CONNECTIONS,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CLI_METRICS_TIMEOUT_S,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CLI_METRICS_CONN_MEMORY,
        MHD_OPTION_EXTERNAL_LOGGER, on_log, NULL, MHD_OPTION_END);
    if (!m->daemon) {
        close(fd);
        loco_free(m);
        return LOCO_ERR(LOCO_EIO, "%s = \"%s\": the HTTP server did not start", what, addr);
    }
    m->port = port;
    /* The address a scraper should use: the configured host, the real port. */
    char where[300];
    const char *colon = strrchr(addr, ':');
    snprintf(where, sizeof where, "%.*s:%d", (int)(colon - addr), addr, port);
    loco_info("metrics: serving http://%s/metrics (%s)", where, what);
    if (port_file) {
        char tmp[LOCO_PATH_MAX + 32], line[320];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        const int n = snprintf(line, sizeof line, "%s\n", where);
        rc = loco_file_write_sync(tmp, line, (size_t)n);
        if (rc == 0 && rename(tmp, port_file) != 0)
            rc = LOCO_ERR(LOCO_EIO, "metrics: rename %s: %s", port_file, strerror(errno));
        if (rc < 0) {
            stop(m);
            return rc;
        }
        snprintf(m->port_file, sizeof m->port_file, "%s", port_file);
    }
    *out = m;
    return 0;
}

int cli_metrics_serve_run(cli_metrics **out, loco_prom *p, const char *addr, const char *what,
                          const char *run_dir) {
    *out = NULL;
    if (!p || !addr[0])
        return 0;
    char file[LOCO_PATH_MAX + 16];
    snprintf(file, sizeof file, "%s/metrics_addr", run_dir);
    LOCO_CHECK(loco_mkdirs(run_dir));
    return cli_metrics_serve(out, p, addr, what, file);
}

int cli_metrics_port(const cli_metrics *m) {
    return m ? m->port : 0;
}

int cli_metrics_connections(const cli_metrics *m) {
    if (!m)
        return 0;
    const union MHD_DaemonInfo *i =
        MHD_get_daemon_info(m->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return i ? (int)i->num_connections : 0;
}

void cli_metrics_stop(cli_metrics *m) {
    if (m)
        stop(m);
}
