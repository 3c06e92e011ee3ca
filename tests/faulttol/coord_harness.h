/* An in-process coordinator on loopback (plain TCP) serving from a thread,
 * for the tests that drive it with fake islands (test_coord.c,
 * test_coord_trust.c). Each test file includes it once: the state is
 * file-local. */
#ifndef LOCO_TESTS_COORD_HARNESS_H
#define LOCO_TESTS_COORD_HARNESS_H

#include "faulttol/faulttol.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>

typedef struct {
    loco_coord *c;
    int rc;
    char msg[1024];
} server;

static void *serve(void *arg) {
    server *s = arg;
    s->rc = loco_coord_serve(s->c);
    snprintf(s->msg, sizeof s->msg, "%s", loco_errmsg());
    return NULL;
}

static loco_config cfg;
static loco_net_params np;
static server srv;
static pthread_t th;

/* A coordinator for `sites` (events to events_path, NULL for none);
 * cfg.faulttol.coordinator names it for the fake islands. */
static void coord_start(const char *sites, const char *events_path) {
    loco_config_defaults(&cfg);
    snprintf(cfg.outer.sites, sizeof cfg.outer.sites, "%s", sites);
    cfg.faulttol.timeout_ms = 20000;
    loco_net_params_default(&np);
    np.backend = LOCO_NET_PLAIN;
    np.streams = 1;
    snprintf(np.name, sizeof np.name, "coordinator");
    loco_log_set_level(LOCO_LOG_ERROR);
    cr_assert_eq(loco_coord_create(&srv.c, &cfg, &np, "127.0.0.1", 0, events_path), 0, "%s",
                 loco_errmsg());
    snprintf(cfg.faulttol.coordinator, sizeof cfg.faulttol.coordinator, "127.0.0.1:%d",
             loco_coord_port(srv.c));
    cr_assert_eq(pthread_create(&th, NULL, serve, &srv), 0);
}

/* Waits for the serve loop to end; its return code. */
static int finish(void) {
    pthread_join(th, NULL);
    loco_coord_destroy(srv.c);
    return srv.rc;
}

#endif
