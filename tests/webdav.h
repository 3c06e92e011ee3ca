/* A real WebDAV server over TLS for the tests of the object store and of
 * checkpoints at https:// URLs: Debian's nginx, started by the test in a
 * temporary directory with its own nginx.conf (pid, logs and temporary
 * files inside it), on a free loopback port, with a certificate for
 * "localhost" from loco_net_make_certs. One process (`master_process off`,
 * `daemon off`) that dies with the test (PR_SET_PDEATHSIG) and is stopped by
 * t_dav_stop. Locations: /full/ (PUT creates parents), /dav/ (collections
 * need MKCOL), /ro/ (no WebDAV: PUT is refused with 405). Static
 * functions: a test file includes this once. */
#ifndef LOCO_TESTS_WEBDAV_H
#define LOCO_TESTS_WEBDAV_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "net/net.h"

#define T_DAV_START_MS 10000 /* generous: catches a hang, never a slow machine */

typedef struct {
    char dir[64];  /* the temporary directory */
    char ca[128];  /* certs/ca.pem: the CA that signed the server's certificate */
    char www[128]; /* the server's root: URL path /full/x is www/full/x */
    char url[64];  /* https://localhost:PORT */
    int port;
    pid_t pid;
} t_dav;

/* Path of the nginx binary (PATH, then /usr/sbin), or NULL. */
__attribute__((unused)) static const char *t_nginx_path(void) {
    static char found[512];
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:/usr/sbin:/usr/local/sbin", path ? path : "");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(found, sizeof found, "%s/nginx", d);
        if (access(found, X_OK) == 0)
            return found;
    }
    return NULL;
}

/* A loopback port nobody listens on now. */
__attribute__((unused)) static int t_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static bool t_port_open(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Prints the server's error log (on a failed start). */
static void t_dav_dump_log(const t_dav *d) {
    char path[160], buf[4096];
    snprintf(path, sizeof path, "%s/error.log", d->dir);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    fprintf(stderr, "nginx error.log:\n%s\n", buf);
}

/* Starts the server, or skips the test (visibly) when nginx is absent. */
__attribute__((unused)) static void t_dav_start(t_dav *d) {
    memset(d, 0, sizeof *d);
    const char *nginx = t_nginx_path();
    if (!nginx)
        cr_skip_test("nginx not found (PATH, /usr/sbin): the WebDAV tests need Debian's nginx "
                     "(scripts/install-deps.sh installs it)");
    snprintf(d->dir, sizeof d->dir, "/tmp/loco-dav-XXXXXX");
    cr_assert(mkdtemp(d->dir));
    char certs[96], conf[96], path[160];
    snprintf(certs, sizeof certs, "%s/certs", d->dir);
    const char *names[] = {"localhost"};
    cr_assert_eq(loco_net_make_certs(certs, names, 1, 1), 0, "%s", loco_errmsg());
    snprintf(d->ca, sizeof d->ca, "%s/ca.pem", certs);
    snprintf(d->www, sizeof d->www, "%s/www", d->dir);
    const char *sub[] = {"www", "www/full", "www/dav", "www/ro", "tmp"};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", d->dir, sub[i]);
        cr_assert_eq(mkdir(path, 0755), 0, "mkdir %s", path);
    }
    d->port = t_free_port();
    snprintf(d->url, sizeof d->url, "https://localhost:%d", d->port);
    snprintf(conf, sizeof conf, "%s/nginx.conf", d->dir);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fprintf(f,
            "daemon off;\nmaster_process off;\nworker_processes 1;\n%s"
            "pid %s/nginx.pid;\nerror_log %s/error.log info;\n"
            "events { worker_connections 64; }\n"
            "http {\n"
            "  access_log %s/access.log;\n"
            "  client_body_temp_path %s/tmp/body;\n  proxy_temp_path %s/tmp/proxy;\n"
            "  fastcgi_temp_path %s/tmp/fastcgi;\n  uwsgi_temp_path %s/tmp/uwsgi;\n"
            "  scgi_temp_path %s/tmp/scgi;\n"
            "  client_max_body_size 0;\n"
            "  server {\n"
            "    listen 127.0.0.1:%d ssl;\n    server_name localhost;\n"
            "    ssl_certificate %s/localhost.pem;\n    ssl_certificate_key %s/localhost.key;\n"
            "    root %s;\n"
            "    location /full/ { dav_methods PUT DELETE MKCOL; create_full_put_path on; }\n"
            "    location /dav/ { dav_methods PUT DELETE MKCOL; }\n"
            "    location /ro/ { }\n"
            "  }\n"
            "}\n",
            geteuid() == 0 ? "user root;\n" : "", d->dir, d->dir, d->dir, d->dir, d->dir, d->dir,
            d->dir, d->dir, d->port, certs, certs, d->www);
    fclose(f);
    snprintf(path, sizeof path, "%s/error.log", d->dir);
    d->pid = fork();
    cr_assert(d->pid >= 0);
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char out[160];
        snprintf(out, sizeof out, "%s/nginx.out", d->dir);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(nginx, "nginx", "-p", d->dir, "-e", path, "-c", conf, (char *)NULL);
        _exit(127);
    }
    for (int waited = 0; !t_port_open(d->port); waited += 10) {
        int status;
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            t_dav_dump_log(d);
            cr_assert_fail("nginx exited at start (status %d); see its error.log above", status);
        }
        if (waited > T_DAV_START_MS) {
            t_dav_dump_log(d);
            cr_assert_fail("nginx did not listen on port %d within %d ms", d->port, T_DAV_START_MS);
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Stops the server (if it runs) and removes its directory. */
__attribute__((unused)) static void t_dav_stop(t_dav *d) {
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        waitpid(d->pid, NULL, 0);
        d->pid = 0;
    }
    if (d->dir[0])
        loco_rmtree(d->dir);
    d->dir[0] = '\0';
}

/* Options of a store that trusts the server's CA. */
__attribute__((unused)) static void t_dav_opts(const t_dav *d, loco_store_opts *o) {
    loco_store_opts_default(o);
    snprintf(o->ca, sizeof o->ca, "%s", d->ca);
    o->connect_timeout_ms = 5000;
    o->stall_timeout_s = 10;
}

#endif
