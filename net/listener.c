/* The listening side: one background thread accepts connections and drives
 * their handshakes (TLS, then HELLO) as non-blocking state machines, groups
 * the streams of a link by the link id of their HELLO, and queues complete
 * links for loco_net_accept. A client that stalls, talks garbage or
 * presents a bad certificate costs one slot until its deadline, is logged
 * and counted, and delays nobody. */
#include "net/internal.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* The streams of one link arriving. */
typedef struct {
    uint64_t link_id;
    char peer[LOCO_NET_NAME_MAX]; /* identity all streams must share */
    char name[LOCO_NET_NAME_MAX]; /* the name in the first HELLO */
    uint64_t run_id;
    int n, have, done;
    uint64_t peer_max;
    double deadline;
    loco__conn *conns[LOCO_NET_MAX_STREAMS];
} group;

struct loco_net_listener {
    loco_net_params p;
    const loco__transport_ops *ops;
    void *ctx;
    int fd, port, stop_fd;
    int notify_fd; /* the owner's eventfd (-1: none), see loco_net_listener_set_notify */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu; /* ready, info */
    pthread_cond_t cv;
    loco_link *ready[LOCO__MAX_PENDING];
    int n_ready;
    loco_net_listener_info info;
    /* The acceptor thread's own. */
    loco__hs *hs[LOCO__MAX_PENDING];
    int n_hs;
    group *groups[LOCO__MAX_PENDING];
    int n_groups;
};

static void refused(loco_net_listener *L, const char *addr, const char *reason) {
    loco_warn("net: refused %s: %s", addr, reason);
    pthread_mutex_lock(&L->mu);
    L->info.refused++;
    snprintf(L->info.last_refusal, sizeof L->info.last_refusal, "%.63s: %.440s", addr, reason);
    pthread_mutex_unlock(&L->mu);
}

static void group_drop(loco_net_listener *L, group *g, const char *reason) {
    char addr[64] = "?";
    for (int i = 0; i < g->n; i++)
        if (g->conns[i]) {
            snprintf(addr, sizeof addr, "%s", g->conns[i]->addr);
            break;
        }
    char why[384];
    snprintf(why, sizeof why, "link %016llx from %s: %s", (unsigned long long)g->link_id, g->peer,
             reason);
    refused(L, addr, why);
    /* Handshakes still running for this group go with it. */
    for (int i = 0; i < L->n_hs;) {
        if (L->hs[i]->user == g) {
            loco_free(L->hs[i]);
            L->hs[i] = L->hs[--L->n_hs];
        } else {
            i++;
        }
    }
    for (int i = 0; i < g->n; i++)
        loco__conn_destroy(g->conns[i]);
    for (int i = 0; i < L->n_groups; i++)
        if (L->groups[i] == g) {
            L->groups[i] = L->groups[--L->n_groups];
            break;
        }
    loco_free(g);
}

/* Removes handshake i; its connection goes too unless a group holds it. */
static void hs_remove(loco_net_listener *L, int i) {
    loco__hs *h = L->hs[i];
    if (!h->user)
        loco__conn_destroy(h->c);
    loco_free(h);
    L->hs[i] = L->hs[--L->n_hs];
}

/* Decides on a client's HELLO: join or open a group, or refuse with a reason
 * the client will see. Returns the group, or NULL with reply->status set. */
static group *hello_decide(loco_net_listener *L, loco__hs *h, loco__hello *reply) {
    const loco__hello *in = &h->peer;
    memset(reply, 0, sizeof *reply);
    reply->link_id = in->link_id;
    reply->stream = in->stream;
    reply->n_streams = in->n_streams;
    reply->max_frame = loco__recv_max(&L->p);
    reply->run_id = L->p.run_id;
    snprintf(reply->name, sizeof reply->name, "%s", L->p.name);
    /* Identity: the certificate's name, or (plain) the HELLO's. */
    const char *who = h->c->peer_name[0] ? h->c->peer_name : in->name;
    if (L->p.run_id && in->run_id != L->p.run_id) {
        reply->status = LOCO_EAUTH;
        snprintf(reply->reason, sizeof reply->reason,
                 "run id %016llx, this listener serves %016llx", (unsigned long long)in->run_id,
                 (unsigned long long)L->p.run_id);
        return NULL;
    }
    /* A listener takes as many streams as it would open itself. */
    const int max_streams = L->p.max_streams > L->p.streams ? L->p.max_streams : L->p.streams;
    if ((int)in->n_streams > max_streams) {
        reply->status = LOCO_EPEER;
        snprintf(reply->reason, sizeof reply->reason,
                 "a link of %u streams; this listener takes at most %d (net.max_streams)",
                 in->n_streams, max_streams);
        return NULL;
    }
    group *g = NULL;
    for (int i = 0; i < L->n_groups; i++)
        if (L->groups[i]->link_id == in->link_id)
            g = L->groups[i];
    if (g) {
        if (strcmp(g->peer, who) != 0 || (int)in->n_streams != g->n) {
            reply->status = LOCO_EAUTH;
            snprintf(reply->reason, sizeof reply->reason,
                     "stream of link %016llx does not match its other streams (peer or count)",
                     (unsigned long long)in->link_id);
            return NULL;
        }
        if (g->conns[in->stream]) {
            reply->status = LOCO_EPROTO;
            snprintf(reply->reason, sizeof reply->reason, "stream %u of link %016llx twice",
                     in->stream, (unsigned long long)in->link_id);
            return NULL;
        }
    } else {
        /* Refused now, before it costs threads and buffers: a link that
         * would find no room once complete. */
        pthread_mutex_lock(&L->mu);
        const int waiting = L->n_ready;
        pthread_mutex_unlock(&L->mu);
        if (L->n_groups >= L->p.max_pending || waiting >= L->p.max_pending) {
            reply->status = LOCO_EPEER;
            snprintf(reply->reason, sizeof reply->reason,
                     "too many links in handshake or waiting (net.max_pending = %d)",
                     L->p.max_pending);
            return NULL;
        }
        g = loco_alloc(sizeof *g);
        if (!g) {
            reply->status = LOCO_ENOMEM;
            snprintf(reply->reason, sizeof reply->reason, "listener out of memory");
            return NULL;
        }
        g->link_id = in->link_id;
        snprintf(g->peer, sizeof g->peer, "%s", who);
        snprintf(g->name, sizeof g->name, "%s", in->name);
        g->run_id = in->run_id;
        g->n = (int)in->n_streams;
        g->peer_max = in->max_frame;
        g->deadline = loco_now() + L->p.handshake_timeout_ms * 1e-3;
        L->groups[L->n_groups++] = g;
    }
    g->conns[in->stream] = h->c;
    g->have++;
    if (in->max_frame < g->peer_max)
        g->peer_max = in->max_frame;
    return g;
}

static void group_complete(loco_net_listener *L, group *g) {
    for (int i = 0; i < L->n_groups; i++)
        if (L->groups[i] == g) {
            L->groups[i] = L->groups[--L->n_groups];
            break;
        }
    /* Plain peers without a name are known by the address of stream 0. */
    char peer[LOCO_NET_NAME_MAX];
    if (g->peer[0])
        snprintf(peer, sizeof peer, "%s", g->peer);
    else
        snprintf(peer, sizeof peer, "%s", g->conns[0]->addr);
    char addr[64];
    snprintf(addr, sizeof addr, "%s", g->conns[0]->addr);
    loco_link *link = NULL;
    const int rc = loco__link_start(&link, &L->p, g->conns, g->n, peer, g->peer_max, true);
    loco_free(g);
    if (rc < 0) {
        char why[512];
        loco__errmsg_line(why, sizeof why);
        refused(L, addr, why);
        return;
    }
    pthread_mutex_lock(&L->mu);
    if (L->n_ready < L->p.max_pending) {
        L->ready[L->n_ready++] = link;
        L->info.links++;
        link = NULL;
        if (L->notify_fd >= 0) {
            const uint64_t one = 1;
            ssize_t w = write(L->notify_fd, &one, sizeof one);
            (void)w; /* a full eventfd is already readable */
        }
        pthread_cond_broadcast(&L->cv);
    }
    pthread_mutex_unlock(&L->mu);
    if (link) {
        refused(L, addr, "too many links waiting for accept");
        loco_link_abort(link); /* this thread serves every handshake: no lingering */
        loco_link_destroy(link);
    }
}

/* Advances handshake i after its socket became ready (or on a timer). */
static void hs_advance(loco_net_listener *L, int i) {
    loco__hs *h = L->hs[i];
    int rc = loco__hs_step(h);
    if (rc == 0 && h->state == LOCO__HS_GOT_HELLO) {
        loco__hello reply;
        h->user = hello_decide(L, h, &reply);
        if (!h->user) {
            char why[256];
            snprintf(why, sizeof why, "HELLO refused: %s", reply.reason);
            refused(L, h->c->addr, why);
            /* Tell the client why; one try, whatever happens next. */
            loco__hs_reply(h, &reply);
            (void)loco__hs_step(h);
            hs_remove(L, i);
            return;
        }
        loco__hs_reply(h, &reply);
        rc = loco__hs_step(h);
    }
    if (rc == 1)
        return;
    group *g = h->user;
    if (rc < 0) {
        char why[512];
        loco__errmsg_line(why, sizeof why);
        if (g) {
            group_drop(L, g, why); /* removes h too */
        } else {
            refused(L, h->c->addr, why);
            hs_remove(L, i);
        }
        return;
    }
    /* DONE: the stream belongs to its group now. */
    loco_free(h);
    L->hs[i] = L->hs[--L->n_hs];
    if (++g->done == g->n)
        group_complete(L, g);
}

static void accept_new(loco_net_listener *L) {
    for (;;) {
        const int fd = accept4(L->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN, or a connection that died in the backlog */
        loco__sock_tune(fd, &L->p);
        loco__conn *c = NULL;
        if (loco__conn_create(&c, fd, L->ops) != 0) {
            close(fd);
            continue;
        }
        if (L->n_hs >= LOCO__MAX_PENDING) {
            refused(L, c->addr, "too many connections in handshake");
            loco__conn_destroy(c);
            continue;
        }
        loco__hs *h = loco_alloc(sizeof *h);
        if (!h || c->ops->attach(c, L->ctx, true) != 0) {
            refused(L, c->addr, "listener out of memory");
            loco_free(h);
            loco__conn_destroy(c);
            continue;
        }
        loco__hs_init_server(h, c, loco_now() + L->p.handshake_timeout_ms * 1e-3);
        L->hs[L->n_hs++] = h;
        hs_advance(L, L->n_hs - 1);
    }
}

static void expire(loco_net_listener *L) {
    const double now = loco_now();
    for (int i = 0; i < L->n_hs;) {
        loco__hs *h = L->hs[i];
        if (now < h->deadline) {
            i++;
            continue;
        }
        if (h->user) {
            group_drop(L, h->user, "a stream's handshake timed out");
            i = 0; /* the list changed under us */
        } else {
            char why[128];
            snprintf(why, sizeof why, "handshake not complete after %d ms",
                     L->p.handshake_timeout_ms);
            refused(L, h->c->addr, why);
            hs_remove(L, i);
        }
    }
    for (int i = 0; i < L->n_groups;) {
        group *g = L->groups[i];
        if (now < g->deadline) {
            i++;
            continue;
        }
        char why[128];
        snprintf(why, sizeof why, "only %d of %d streams arrived within %d ms", g->done, g->n,
                 L->p.handshake_timeout_ms);
        group_drop(L, g, why);
        i = 0;
    }
}

static void *acceptor_main(void *arg) {
    loco_net_listener *L = arg;
    struct pollfd pf[2 + LOCO__MAX_PENDING];
    loco__hs *polled[LOCO__MAX_PENDING];
    for (;;) {
        int np = 0;
        pf[np++] = (struct pollfd){.fd = L->stop_fd, .events = POLLIN};
        pf[np++] = (struct pollfd){.fd = L->fd, .events = POLLIN};
        double next = 0;
        const int n_polled = L->n_hs;
        for (int i = 0; i < n_polled; i++) {
            polled[i] = L->hs[i];
            pf[np++] = (struct pollfd){.fd = L->hs[i]->c->fd, .events = L->hs[i]->want};
            if (next == 0 || L->hs[i]->deadline < next)
                next = L->hs[i]->deadline;
        }
        for (int i = 0; i < L->n_groups; i++)
            if (next == 0 || L->groups[i]->deadline < next)
                next = L->groups[i]->deadline;
        int timeout = -1;
        if (next > 0) {
            const double ms = (next - loco_now()) * 1e3;
            timeout = ms <= 0 ? 0 : (int)ms + 1;
        }
        const int n = poll(pf, (nfds_t)np, timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (pf[0].revents & POLLIN)
            break;
        /* Handshakes first (by identity: the list changes as they finish). */
        for (int k = 0; n > 0 && k < n_polled; k++) {
            if (!pf[2 + k].revents)
                continue;
            for (int i = 0; i < L->n_hs; i++)
                if (L->hs[i] == polled[k]) {
                    hs_advance(L, i);
                    break;
                }
        }
        if (n > 0 && (pf[1].revents & POLLIN))
            accept_new(L);
        expire(L);
    }
    while (L->n_groups > 0) {
        group *g = L->groups[0];
        for (int i = 0; i < L->n_hs;)
            if (L->hs[i]->user == g) {
                loco_free(L->hs[i]);
                L->hs[i] = L->hs[--L->n_hs];
            } else {
                i++;
            }
        for (int i = 0; i < g->n; i++)
            loco__conn_destroy(g->conns[i]);
        L->groups[0] = L->groups[--L->n_groups];
        loco_free(g);
    }
    while (L->n_hs > 0)
        hs_remove(L, 0);
    return NULL;
}

int loco_net_listen(loco_net_listener **out, const loco_net_params *p, const char *host, int port) {
    *out = NULL;
    LOCO_CHECK(loco_net_params_check(p, true));
    if (port < 0 || port > 65535)
        return LOCO_ERR(LOCO_EINVAL, "net: port %d out of range", port);
    loco_net_listener *L = loco_alloc(sizeof *L);
    if (!L)
        return LOCO_ERR(LOCO_ENOMEM, "net: listener");
    L->p = *p;
    L->ops = loco__backend_ops(p->backend);
    L->fd = -1;
    L->stop_fd = -1;
    pthread_mutex_init(&L->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&L->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = 0;
    LOCO_CHECK_GOTO(L->ops->ctx_create(&L->ctx, p, true), out_destroy);

    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    const int gai = getaddrinfo(host, port_s, &hints, &ai);
    if (gai != 0) {
        rc = LOCO_ERR(LOCO_EINVAL, "net: listen on %s:%d: %s", host ? host : "*", port,
                      gai_strerror(gai));
        goto out_destroy;
    }
    int err = 0;
    for (struct addrinfo *a = ai; a && L->fd < 0; a = a->ai_next) {
        const int fd =
            socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        const int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        loco__sock_tune(fd, p); /* accepted sockets inherit the buffers */
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
            err = errno;
            close(fd);
            continue;
        }
        L->fd = fd;
    }
    freeaddrinfo(ai);
    if (L->fd < 0) {
        rc = LOCO_ERR(LOCO_EIO, "net: listen on %s:%d: %s", host ? host : "*", port, strerror(err));
        goto out_destroy;
    }
    char addr[64];
    loco__sock_addr(L->fd, false, addr, sizeof addr);
    const char *colon = strrchr(addr, ':');
    L->port = colon ? atoi(colon + 1) : port;
    L->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    L->notify_fd = -1;
    if (L->stop_fd < 0) {
        rc = LOCO_ERR(LOCO_EIO, "net: eventfd: %s", strerror(errno));
        goto out_destroy;
    }
    if (pthread_create(&L->thread, NULL, acceptor_main, L) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "net: cannot start the acceptor thread");
        goto out_destroy;
    }
    L->thread_started = true;
    loco_info("net: listening on %s (%s)", addr, L->ops->name);
    *out = L;
    return 0;
out_destroy:
    loco_net_listener_destroy(L);
    return rc;
}

int loco_net_listener_port(const loco_net_listener *l) {
    return l ? l->port : -1;
}

void loco_net_listener_set_notify(loco_net_listener *L, int fd) {
    pthread_mutex_lock(&L->mu);
    L->notify_fd = fd;
    if (fd >= 0 && L->n_ready > 0) {
        const uint64_t one = 1;
        ssize_t w = write(fd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&L->mu);
}

int loco_net_accept(loco_net_listener *L, loco_link **out, int timeout_ms) {
    if (!L || !out)
        return LOCO_ERR(LOCO_EINVAL, "net: accept: missing listener or output");
    *out = NULL;
    const double deadline = timeout_ms < 0 ? 0 : loco_now() + timeout_ms * 1e-3;
    int rc = 0;
    pthread_mutex_lock(&L->mu);
    while (L->n_ready == 0) {
        const double now = loco_now();
        if (timeout_ms == 0 || (deadline > 0 && now >= deadline)) {
            rc = LOCO_ERR(LOCO_ETIMEDOUT, "net: no link arrived within %d ms", timeout_ms);
            break;
        }
        if (deadline > 0) {
            struct timespec ts = {.tv_sec = (time_t)deadline,
                                  .tv_nsec = (long)((deadline - (double)(time_t)deadline) * 1e9)};
            pthread_cond_timedwait(&L->cv, &L->mu, &ts);
        } else {
            pthread_cond_wait(&L->cv, &L->mu);
        }
    }
    if (rc == 0) {
        *out = L->ready[0];
        memmove(L->ready, L->ready + 1, (size_t)(--L->n_ready) * sizeof L->ready[0]);
    }
    pthread_mutex_unlock(&L->mu);
    return rc;
}

void loco_net_listener_get_info(loco_net_listener *l, loco_net_listener_info *out) {
    memset(out, 0, sizeof *out);
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    *out = l->info;
    pthread_mutex_unlock(&l->mu);
}

void loco_net_listener_destroy(loco_net_listener *L) {
    if (!L)
        return;
    if (L->thread_started) {
        const uint64_t one = 1;
        ssize_t w = write(L->stop_fd, &one, sizeof one);
        (void)w;
        pthread_join(L->thread, NULL);
    }
    for (int i = 0; i < L->n_ready; i++)
        loco_link_destroy(L->ready[i]);
    if (L->fd >= 0)
        close(L->fd);
    if (L->stop_fd >= 0)
        close(L->stop_fd);
    if (L->ctx)
        L->ops->ctx_destroy(L->ctx);
    pthread_cond_destroy(&L->cv);
    pthread_mutex_destroy(&L->mu);
    loco_free(L);
}
