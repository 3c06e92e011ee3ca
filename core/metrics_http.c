/* Live metrics over HTTP in the Prometheus text exposition format (0.0.4):
 * a registry of gauges and counters, each sample with at most one label,
 * set by the owning thread under a mutex and rendered on every
 * GET /metrics by GNU libmicrohttpd's own thread. The library holds the
 * line against scrapers: a connection limit, an idle timeout and a memory
 * limit per connection; a request it cannot parse gets its 400 and the
 * connection closes. Nothing a scraper does reaches the caller. */
#include "core/core.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    char *label_value; /* NULL: the family's sample without a label */
    double v;
} sample;

typedef struct {
    char name[LOCO_PROM_NAME_MAX];
    char label[LOCO_PROM_NAME_MAX]; /* label name, "" = none */
    char *help;
    loco_prom_type type;
    sample *s;
    int n, cap;
} family;

struct loco_prom {
    pthread_mutex_t mu;
    family fam[LOCO_PROM_MAX_FAMILIES];
    int n_fam;
    struct MHD_Daemon *daemon;
    int port;
    char port_file[LOCO_PATH_MAX]; /* written by serve, removed by destroy */
};

/* ---------------------------------------------------------- the registry */

static char *dup_str(const char *s) {
    const size_t n = strlen(s) + 1;
    char *d = loco_alloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static bool name_ok(const char *s, bool colon) {
    if (!s[0] || strlen(s) >= LOCO_PROM_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_' || (colon && *s == ':')))
            return false;
    return true;
}

int loco_prom_create(loco_prom **out) {
    *out = NULL;
    loco_prom *p = loco_alloc(sizeof *p);
    if (!p)
        return LOCO_ERR(LOCO_ENOMEM, "metrics registry");
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return 0;
}

static void stop(loco_prom *p) {
    if (p->daemon)
        MHD_stop_daemon(p->daemon); /* joins its thread, closes the socket */
    p->daemon = NULL;
    if (p->port_file[0])
        unlink(p->port_file);
    p->port_file[0] = '\0';
}

void loco_prom_destroy(loco_prom *p) {
    if (!p)
        return;
    stop(p);
    for (int i = 0; i < p->n_fam; i++) {
        for (int k = 0; k < p->fam[i].n; k++)
            loco_free(p->fam[i].s[k].label_value);
        loco_free(p->fam[i].s);
        loco_free(p->fam[i].help);
    }
    pthread_mutex_destroy(&p->mu);
    loco_free(p);
}

static family *find(loco_prom *p, const char *name) {
    for (int i = 0; i < p->n_fam; i++)
        if (!strcmp(p->fam[i].name, name))
            return &p->fam[i];
    return NULL;
}

int loco_prom_declare(loco_prom *p, const char *name, loco_prom_type type, const char *label,
                      const char *help) {
    if (!p)
        return 0;
    if (!name_ok(name, true))
        return LOCO_ERR(LOCO_EINVAL,
                        "metrics: '%s' is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", name);
    if (label && (!name_ok(label, false) || !strncmp(label, "__", 2)))
        return LOCO_ERR(LOCO_EINVAL, "metrics: '%s' is not a label name of %s", label, name);
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (find(p, name))
        rc = LOCO_ERR(LOCO_EINVAL, "metrics: %s is declared twice", name);
    else if (p->n_fam == LOCO_PROM_MAX_FAMILIES)
        rc = LOCO_ERR(LOCO_EINVAL, "metrics: more than %d metrics", LOCO_PROM_MAX_FAMILIES);
    else {
        family *f = &p->fam[p->n_fam];
        memset(f, 0, sizeof *f);
        f->help = dup_str(help ? help : "");
        if (!f->help)
            rc = LOCO_ERR(LOCO_ENOMEM, "metrics: help of %s", name);
        else {
            snprintf(f->name, sizeof f->name, "%s", name);
            snprintf(f->label, sizeof f->label, "%s", label ? label : "");
            f->type = type;
            p->n_fam++;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The sample of f with this label value, made when missing (NULL when out
 * of memory, or when the value's presence does not match the family's). */
static sample *sample_of(family *f, const char *value) {
    if (!f->label[0] != !value)
        return NULL;
    for (int i = 0; i < f->n; i++)
        if (!value || !strcmp(f->s[i].label_value, value))
            return &f->s[i];
    if (f->n == f->cap) {
        const int cap = f->cap ? 2 * f->cap : 4;
        sample *s = loco_alloc((size_t)cap * sizeof *s);
        if (!s)
            return NULL;
        if (f->n)
            memcpy(s, f->s, (size_t)f->n * sizeof *s);
        loco_free(f->s);
        f->s = s;
        f->cap = cap;
    }
    sample *s = &f->s[f->n];
    s->label_value = NULL;
    if (value && !(s->label_value = dup_str(value)))
        return NULL;
    s->v = 0;
    f->n++;
    return s;
}

static void update(loco_prom *p, const char *name, const char *value, double v, bool add) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    family *f = find(p, name);
    sample *s = f ? sample_of(f, value) : NULL;
    if (s)
        s->v = add ? s->v + v : v;
    pthread_mutex_unlock(&p->mu);
    if (!s)
        loco_debug("metrics: %s%s%s not updated (undeclared, label mismatch or no memory)", name,
                   value ? " " : "", value ? value : "");
}

void loco_prom_set(loco_prom *p, const char *name, const char *label_value, double v) {
    update(p, name, label_value, v, false);
}

void loco_prom_add(loco_prom *p, const char *name, const char *label_value, double dv) {
    update(p, name, label_value, dv, true);
}

void loco_prom_set_only(loco_prom *p, const char *name, const char *label_value, double v) {
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    family *f = find(p, name);
    if (f) {
        for (int k = 0; k < f->n; k++)
            loco_free(f->s[k].label_value);
        f->n = 0;
    }
    sample *s = f ? sample_of(f, label_value) : NULL;
    if (s)
        s->v = v;
    pthread_mutex_unlock(&p->mu);
    if (!s)
        loco_debug("metrics: %s not updated (undeclared, label mismatch or no memory)", name);
}

/* ------------------------------------------------------------- rendering */

typedef struct {
    char *b;
    size_t len, cap;
    bool oom;
} buf;

static void put(buf *o, const char *s, size_t n) {
    if (o->oom)
        return;
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (o->len + n + 1 > cap)
            cap *= 2;
        char *b = loco_alloc(cap);
        if (!b) {
            o->oom = true;
            return;
        }
        if (o->len)
            memcpy(b, o->b, o->len);
        loco_free(o->b);
        o->b = b;
        o->cap = cap;
    }
    memcpy(o->b + o->len, s, n);
    o->len += n;
    o->b[o->len] = '\0';
}

static void puts_(buf *o, const char *s) {
    put(o, s, strlen(s));
}

/* Escapes as the format says: in HELP text backslash and newline, in label
 * values also the double quote. */
static void put_escaped(buf *o, const char *s, bool quote) {
    for (; *s; s++) {
        if (*s == '\\')
            puts_(o, "\\\\");
        else if (*s == '\n')
            puts_(o, "\\n");
        else if (*s == '"' && quote)
            puts_(o, "\\\"");
        else
            put(o, s, 1);
    }
}

void loco_prom_format_value(double v, char out[LOCO_PROM_VALUE_MAX]) {
    if (isnan(v))
        snprintf(out, LOCO_PROM_VALUE_MAX, "NaN");
    else if (isinf(v))
        snprintf(out, LOCO_PROM_VALUE_MAX, "%s", v > 0 ? "+Inf" : "-Inf");
    else {
        /* The shortest of %.15g and %.17g that reads back as v. */
        snprintf(out, LOCO_PROM_VALUE_MAX, "%.15g", v);
        if (strtod(out, NULL) != v)
            snprintf(out, LOCO_PROM_VALUE_MAX, "%.17g", v);
    }
}

int loco_prom_render(loco_prom *p, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    buf o = {0};
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_fam; i++) {
        const family *f = &p->fam[i];
        if (!f->n)
            continue; /* nothing known yet: no sample rather than a made-up one */
        puts_(&o, "# HELP ");
        puts_(&o, f->name);
        puts_(&o, " ");
        put_escaped(&o, f->help, false);
        puts_(&o, "\n# TYPE ");
        puts_(&o, f->name);
        puts_(&o, f->type == LOCO_PROM_COUNTER ? " counter\n" : " gauge\n");
        for (int k = 0; k < f->n; k++) {
            puts_(&o, f->name);
            if (f->s[k].label_value) {
                puts_(&o, "{");
                puts_(&o, f->label);
                puts_(&o, "=\"");
                put_escaped(&o, f->s[k].label_value, true);
                puts_(&o, "\"}");
            }
            char v[LOCO_PROM_VALUE_MAX];
            loco_prom_format_value(f->s[k].v, v);
            puts_(&o, " ");
            puts_(&o, v);
            puts_(&o, "\n");
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (!o.b && !o.oom)
        puts_(&o, "");
    if (o.oom) {
        loco_free(o.b);
        return LOCO_ERR(LOCO_ENOMEM, "metrics: rendering");
    }
    *text = o.b;
    *len = o.len;
    return 0;
}

/* ---------------------------------------------------------------- serving */

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
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, LOCO_PROM_BACKLOG) != 0)
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

int loco_prom_serve(loco_prom *p, const char *addr, const char *what, const char *port_file) {
    if (p->daemon)
        return LOCO_ERR(LOCO_EINVAL, "metrics: already serving on port %d", p->port);
    int fd = -1, port = 0;
    LOCO_CHECK(bind_addr(addr, what, &fd, &port));
    p->daemon = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                                 on_request, p, MHD_OPTION_LISTEN_SOCKET, fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)LOCO_PROM_MAX_CONNECTIONS,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)LOCO_PROM_TIMEOUT_S,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)LOCO_PROM_CONN_MEMORY,
                                 MHD_OPTION_EXTERNAL_LOGGER, on_log, NULL, MHD_OPTION_END);
    if (!p->daemon) {
        close(fd);
        return LOCO_ERR(LOCO_EIO, "%s = \"%s\": the HTTP server did not start", what, addr);
    }
    p->port = port;
    /* The address a scraper should use: the configured host, the real port. */
    char where[300];
    const char *colon = strrchr(addr, ':');
    snprintf(where, sizeof where, "%.*s:%d", (int)(colon - addr), addr, port);
    loco_info("metrics: serving http://%s/metrics (%s)", where, what);
    if (port_file) {
        char tmp[LOCO_PATH_MAX + 8], line[320];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        const int n = snprintf(line, sizeof line, "%s\n", where);
        int rc = loco_file_write_sync(tmp, line, (size_t)n);
        if (rc == 0 && rename(tmp, port_file) != 0)
            rc = LOCO_ERR(LOCO_EIO, "metrics: rename %s: %s", port_file, strerror(errno));
        if (rc < 0) {
            stop(p);
            return rc;
        }
        snprintf(p->port_file, sizeof p->port_file, "%s", port_file);
    }
    return 0;
}

int loco_prom_port(const loco_prom *p) {
    return p && p->daemon ? p->port : 0;
}
