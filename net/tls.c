/* The TLS backend: TLS 1.3 only, both sides present a certificate and verify
 * the other's against the run's CA (OpenSSL 3). Sessions run over a small
 * socket BIO of our own that sends with MSG_NOSIGNAL (a peer that vanished
 * is an error code, never a SIGPIPE) and counts the bytes on the wire. */
#include "net/internal.h"

#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ the BIO */

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int bio_sock_write(BIO *b, const char *buf, int len) {
    loco__conn *c = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    for (;;) {
        const ssize_t n = send(c->fd, buf, (size_t)len, MSG_NOSIGNAL);
        if (n >= 0) {
            atomic_fetch_add(&c->wire_out, (uint64_t)n);
            return (int)n;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            BIO_set_retry_write(b);
            return -1;
        }
        c->last_errno = errno;
        return -1;
    }
}

static int bio_sock_read(BIO *b, char *buf, int len) {
    loco__conn *c = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    for (;;) {
        const ssize_t n = recv(c->fd, buf, (size_t)len, 0);
        if (n >= 0) {
            atomic_fetch_add(&c->wire_in, (uint64_t)n);
            c->bio_eof = n == 0;
            return (int)n;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            BIO_set_retry_read(b);
            return -1;
        }
        c->last_errno = errno;
        return -1;
    }
}

/* OpenSSL asks BIO_CTRL_EOF to tell a peer that hung up from a read error
 * (with SSL_OP_IGNORE_UNEXPECTED_EOF, a hang-up is a clean end). */
static long bio_sock_ctrl(BIO *b, int cmd, long num, void *ptr) {
    const loco__conn *c = BIO_get_data(b);
    switch (cmd) {
    case BIO_CTRL_FLUSH: return 1;
    case BIO_CTRL_EOF: return c && c->bio_eof;
    default: return 0;
    }
}

static int bio_sock_create(BIO *b) {
    BIO_set_init(b, 1);
    return 1;
}

static void bio_method_make(void) {
    bio_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "loco socket");
    if (!bio_method)
        return;
    BIO_meth_set_write(bio_method, bio_sock_write);
    BIO_meth_set_read(bio_method, bio_sock_read);
    BIO_meth_set_ctrl(bio_method, bio_sock_ctrl);
    BIO_meth_set_create(bio_method, bio_sock_create);
}

/* ---------------------------------------------------------- messages */

/* The OpenSSL error queue of this thread as "reason; reason" (emptied). */
static void ssl_errors(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    unsigned long e;
    while ((e = ERR_get_error()) != 0) {
        const char *r = ERR_reason_error_string(e);
        char full[256];
        if (!r) {
            ERR_error_string_n(e, full, sizeof full);
            r = full;
        }
        if (n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? "; " : "", r);
    }
}

/* Alerts a peer sends when it refuses our certificate or we refused its. */
static bool cert_alert(unsigned long e) {
    if (ERR_GET_LIB(e) != ERR_LIB_SSL)
        return false;
    const int r = ERR_GET_REASON(e);
    if (r == SSL_R_CERTIFICATE_VERIFY_FAILED || r == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE ||
        r == SSL_R_NO_CERTIFICATES_RETURNED)
        return true;
    if (r < SSL_AD_REASON_OFFSET)
        return false;
    switch (r - SSL_AD_REASON_OFFSET) {
    case SSL_AD_HANDSHAKE_FAILURE:
    case SSL_AD_BAD_CERTIFICATE:
    case SSL_AD_UNSUPPORTED_CERTIFICATE:
    case SSL_AD_CERTIFICATE_REVOKED:
    case SSL_AD_CERTIFICATE_EXPIRED:
    case SSL_AD_CERTIFICATE_UNKNOWN:
    case SSL_AD_UNKNOWN_CA:
    case SSL_AD_ACCESS_DENIED:
    case SSL_AD_CERTIFICATE_REQUIRED: return true;
    default: return false;
    }
}

/* Records a failed SSL call on c: LOCO_EAUTH for certificate trouble,
 * LOCO_EPEER when the peer hung up, LOCO_EIO otherwise. */
static int tls_fail(loco__conn *c, int ssl_err, const char *what) {
    c->failed = true;
    const unsigned long first = ERR_peek_error();
    char why[512];
    ssl_errors(why, sizeof why);
    if (c->verify_reason[0])
        return LOCO_ERR(LOCO_EAUTH, "net: TLS %s %s: refused the peer's certificate: %s", what,
                        c->addr, c->verify_reason);
    if (cert_alert(first))
        return LOCO_ERR(LOCO_EAUTH, "net: TLS %s %s: %s", what, c->addr, why);
    if (ssl_err == SSL_ERROR_SYSCALL || !why[0]) {
        const int e = c->last_errno ? c->last_errno : errno;
        return LOCO_ERR(LOCO_EPEER, "net: TLS %s %s: %s", what, c->addr,
                        e ? strerror(e) : "connection closed by the peer");
    }
    return LOCO_ERR(ssl_err == SSL_ERROR_SSL ? LOCO_EAUTH : LOCO_EIO, "net: TLS %s %s: %s", what,
                    c->addr, why);
}

/* ------------------------------------------------------------- context */

static int verify_cb(int ok, X509_STORE_CTX *sc) {
    if (ok)
        return ok;
    SSL *ssl = X509_STORE_CTX_get_ex_data(sc, SSL_get_ex_data_X509_STORE_CTX_idx());
    loco__conn *c = ssl ? SSL_get_app_data(ssl) : NULL;
    if (!c)
        return ok;
    const int err = X509_STORE_CTX_get_error(sc);
    X509 *cert = X509_STORE_CTX_get_current_cert(sc);
    char cn[LOCO_NET_NAME_MAX] = "?";
    if (cert)
        X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
    snprintf(c->verify_reason, sizeof c->verify_reason, "%s (certificate CN=%s, depth %d)",
             X509_verify_cert_error_string(err), cn, X509_STORE_CTX_get_error_depth(sc));
    return ok;
}

static int ctx_fail(SSL_CTX *ctx, const char *what, const char *path) {
    char why[512];
    ssl_errors(why, sizeof why);
    SSL_CTX_free(ctx);
    return LOCO_ERR(LOCO_EINVAL, "net: %s '%s': %s", what, path, why);
}

static int tls_ctx_create(void **out, const loco_net_params *p, bool server) {
    *out = NULL;
    pthread_once(&bio_once, bio_method_make);
    if (!bio_method)
        return LOCO_ERR(LOCO_ENOMEM, "net: TLS socket BIO");
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx)
        return LOCO_ERR(LOCO_ENOMEM, "net: SSL_CTX_new failed");
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    if (SSL_CTX_set_ciphersuites(ctx, LOCO__TLS_SUITES) != 1)
        return ctx_fail(ctx, "TLS 1.3 suites", LOCO__TLS_SUITES);
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (p->cert[0]) {
        if (SSL_CTX_use_certificate_chain_file(ctx, p->cert) != 1)
            return ctx_fail(ctx, "cannot load certificate", p->cert);
        if (SSL_CTX_use_PrivateKey_file(ctx, p->key, SSL_FILETYPE_PEM) != 1)
            return ctx_fail(ctx, "cannot load private key", p->key);
        if (SSL_CTX_check_private_key(ctx) != 1)
            return ctx_fail(ctx, "private key does not match the certificate", p->key);
        struct stat st;
        if (stat(p->key, &st) == 0 && (st.st_mode & 077))
            loco_warn("net: private key %s is readable by others (mode %03o); chmod 600 it", p->key,
                      (unsigned)(st.st_mode & 0777));
    } else {
        loco_warn("net: no certificate configured; this side presents none and a loco "
                  "listener will refuse it");
    }
    if (SSL_CTX_load_verify_locations(ctx, p->ca, NULL) != 1)
        return ctx_fail(ctx, "cannot load CA", p->ca);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, verify_cb);
    if (server) {
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(p->ca);
        if (names)
            SSL_CTX_set_client_CA_list(ctx, names);
    }
    ERR_clear_error();
    *out = ctx;
    return 0;
}

static void tls_ctx_destroy(void *ctx) {
    SSL_CTX_free(ctx);
}

/* ------------------------------------------------------------ sessions */

static int tls_attach(loco__conn *c, void *ctx, bool server) {
    ERR_clear_error();
    SSL *ssl = SSL_new(ctx);
    BIO *bio = ssl ? BIO_new(bio_method) : NULL;
    if (!ssl || !bio) {
        BIO_free(bio);
        SSL_free(ssl);
        ERR_clear_error();
        return LOCO_ERR(LOCO_ENOMEM, "net: TLS session");
    }
    BIO_set_data(bio, c);
    SSL_set_bio(ssl, bio, bio);
    SSL_set_app_data(ssl, c);
    if (server)
        SSL_set_accept_state(ssl);
    else
        SSL_set_connect_state(ssl);
    c->impl = ssl;
    return 0;
}

static int tls_handshake(loco__conn *c) {
    SSL *ssl = c->impl;
    ERR_clear_error();
    errno = 0;
    const int r = SSL_do_handshake(ssl);
    if (r == 1)
        return 0;
    const int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return LOCO__WANT_READ;
    if (e == SSL_ERROR_WANT_WRITE)
        return LOCO__WANT_WRITE;
    const int rc = tls_fail(c, e, "handshake with");
    return rc == LOCO_EIO ? LOCO_EAUTH : rc;
}

static long tls_read(loco__conn *c, void *buf, size_t len) {
    SSL *ssl = c->impl;
    ERR_clear_error();
    errno = 0;
    const int r = SSL_read(ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
    if (r > 0)
        return r;
    const int e = SSL_get_error(ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ: return LOCO__WANT_READ;
    case SSL_ERROR_WANT_WRITE: return LOCO__WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN: return LOCO__EOF;
    default: return tls_fail(c, e, "read from");
    }
}

static long tls_write(loco__conn *c, const void *buf, size_t len) {
    SSL *ssl = c->impl;
    ERR_clear_error();
    errno = 0;
    const int r = SSL_write(ssl, buf, len > INT_MAX ? INT_MAX : (int)len);
    if (r > 0)
        return r;
    const int e = SSL_get_error(ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ: return LOCO__WANT_READ;
    case SSL_ERROR_WANT_WRITE: return LOCO__WANT_WRITE;
    default: return tls_fail(c, e, "write to");
    }
}

static void tls_shutdown(loco__conn *c) {
    if (c->failed || !SSL_is_init_finished((SSL *)c->impl))
        return;
    ERR_clear_error();
    (void)SSL_shutdown(c->impl);
    ERR_clear_error();
}

static int tls_peer_name(loco__conn *c) {
    c->peer_name[0] = '\0';
    X509 *x = SSL_get0_peer_certificate(c->impl);
    if (!x)
        return LOCO_ERR(LOCO_EAUTH, "net: %s presented no certificate", c->addr);
    char cn[256];
    const int n =
        X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn);
    if (n > 0 && (size_t)n == strlen(cn) && loco__name_ok(cn)) {
        snprintf(c->peer_name, sizeof c->peer_name, "%.63s", cn);
        return 0;
    }
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans); i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type != GEN_DNS)
            continue;
        const int len = ASN1_STRING_length(g->d.dNSName);
        const unsigned char *s = ASN1_STRING_get0_data(g->d.dNSName);
        char name[LOCO_NET_NAME_MAX];
        if (len <= 0 || len >= (int)sizeof name)
            continue;
        memcpy(name, s, (size_t)len);
        name[len] = '\0';
        if ((size_t)len == strlen(name) && loco__name_ok(name)) {
            snprintf(c->peer_name, sizeof c->peer_name, "%s", name);
            break;
        }
    }
    GENERAL_NAMES_free(sans);
    if (!c->peer_name[0])
        return LOCO_ERR(LOCO_EAUTH, "net: the certificate of %s has no usable CN or DNS name",
                        c->addr);
    return 0;
}

static void tls_describe(loco__conn *c, char *buf, size_t cap) {
    snprintf(buf, cap, "%s %s", SSL_get_version(c->impl), SSL_get_cipher_name((SSL *)c->impl));
}

static void tls_detach(loco__conn *c) {
    SSL_free(c->impl); /* frees the BIO too */
    c->impl = NULL;
}

const loco__transport_ops loco__tls_ops = {
    .name = "tls",
    .ctx_create = tls_ctx_create,
    .ctx_destroy = tls_ctx_destroy,
    .attach = tls_attach,
    .handshake = tls_handshake,
    .read = tls_read,
    .write = tls_write,
    .shutdown = tls_shutdown,
    .peer_name = tls_peer_name,
    .describe = tls_describe,
    .detach = tls_detach,
};
