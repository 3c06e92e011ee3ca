/* The TLS backend: TLS 1.3 only, both sides present a certificate and verify
 * the other's against the run's CA (OpenSSL 3), its revocation list
 * (net.crl) and the run id the certificate carries (net.run_id); a refusal
 * says whose certificate, why and since when. Sessions run over a small
 * socket BIO of our own that sends with MSG_NOSIGNAL (a peer that vanished
 * is an error code, never a SIGPIPE) and counts the bytes on the wire. */
#include "net/internal.h"

#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

/* ------------------------------------------------------------ the BIO */

static BIO_METHOD *bio_method;
static int run_id_idx = -1; /* SSL_CTX ex data: the run id peers must carry */
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

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

static void run_id_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                        void *argp) {
    OPENSSL_free(ptr);
}

static void tls_init_once(void) {
    run_id_idx = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, run_id_free);
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

/* For an alert by which the peer refused our certificate as expired or
 * revoked: which certificate of ours, and its validity. */
static void own_cert_note(loco__conn *c, unsigned long e, char *buf, size_t cap) {
    buf[0] = '\0';
    const int r = ERR_GET_REASON(e) - SSL_AD_REASON_OFFSET;
    if (ERR_GET_LIB(e) != ERR_LIB_SSL ||
        (r != SSL_AD_CERTIFICATE_EXPIRED && r != SSL_AD_CERTIFICATE_REVOKED))
        return;
    X509 *x = c->impl ? SSL_get_certificate(c->impl) : NULL;
    if (!x)
        return;
    char cn[LOCO_NET_NAME_MAX] = "?", nb[40], na[40];
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn);
    loco__asn1_time_str(X509_get0_notBefore(x), nb, sizeof nb);
    loco__asn1_time_str(X509_get0_notAfter(x), na, sizeof na);
    if (r == SSL_AD_CERTIFICATE_REVOKED)
        snprintf(buf, cap, " (the peer's net.crl lists our certificate CN=%s)", cn);
    else
        snprintf(buf, cap, " (our certificate CN=%s is valid from %s to %s: check both clocks)", cn,
                 nb, na);
}

/* Records a failed SSL call on c: LOCO_EAUTH for certificate trouble,
 * LOCO_EPEER when the peer hung up, LOCO_EIO otherwise. */
static int tls_fail(loco__conn *c, int ssl_err, const char *what) {
    c->failed = true;
    const unsigned long first = ERR_peek_error();
    char why[512], note[256];
    ssl_errors(why, sizeof why);
    if (c->verify_reason[0])
        return LOCO_ERR(LOCO_EAUTH, "net: TLS %s %s: refused the peer's certificate: %s", what,
                        c->addr, c->verify_reason);
    if (cert_alert(first)) {
        own_cert_note(c, first, note, sizeof note);
        return LOCO_ERR(LOCO_EAUTH, "net: TLS %s %s: %s%s", what, c->addr, why, note);
    }
    if (ssl_err == SSL_ERROR_SYSCALL || !why[0]) {
        const int e = c->last_errno ? c->last_errno : errno;
        return LOCO_ERR(LOCO_EPEER, "net: TLS %s %s: %s", what, c->addr,
                        e ? strerror(e) : "connection closed by the peer");
    }
    return LOCO_ERR(ssl_err == SSL_ERROR_SSL ? LOCO_EAUTH : LOCO_EIO, "net: TLS %s %s: %s", what,
                    c->addr, why);
}

/* ------------------------------------------------------------- context */

static void cert_cn(X509 *x, char *buf, int cap) {
    snprintf(buf, (size_t)cap, "?");
    if (x && X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, buf, cap) < 0)
        snprintf(buf, (size_t)cap, "?");
}

/* Why the chain of the peer's certificate failed, naming the certificate
 * and, for times, since or until when. */
static void refusal_reason(char *out, size_t cap, X509_STORE_CTX *sc) {
    const int err = X509_STORE_CTX_get_error(sc);
    const int depth = X509_STORE_CTX_get_error_depth(sc);
    X509 *cert = X509_STORE_CTX_get_current_cert(sc);
    X509 *leaf = X509_STORE_CTX_get0_cert(sc);
    const char *what = X509_verify_cert_error_string(err);
    char cn[LOCO_NET_NAME_MAX], peer[LOCO_NET_NAME_MAX], who[192], when[40];
    cert_cn(cert, cn, sizeof cn);
    cert_cn(leaf, peer, sizeof peer);
    if (!cert || cert == leaf)
        snprintf(who, sizeof who, "certificate of peer '%s'", peer);
    else
        snprintf(who, sizeof who, "certificate '%s' in the chain of peer '%s'", cn, peer);
    switch (err) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
        loco__asn1_time_str(X509_get0_notAfter(cert), when, sizeof when);
        snprintf(out, cap, "%s expired on %s (%s, depth %d)", who, when, what, depth);
        return;
    case X509_V_ERR_CERT_NOT_YET_VALID:
        loco__asn1_time_str(X509_get0_notBefore(cert), when, sizeof when);
        snprintf(out, cap, "%s is not valid before %s (%s, depth %d)", who, when, what, depth);
        return;
    case X509_V_ERR_CERT_REVOKED: {
        BIGNUM *bn = cert ? ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), NULL) : NULL;
        char *hex = bn ? BN_bn2hex(bn) : NULL;
        snprintf(out, cap, "%s (serial %s) is revoked by net.crl (%s, depth %d)", who,
                 hex ? hex : "?", what, depth);
        OPENSSL_free(hex);
        BN_free(bn);
        return;
    }
    case X509_V_ERR_CRL_HAS_EXPIRED:
    case X509_V_ERR_CRL_NOT_YET_VALID: {
        const X509_CRL *crl = X509_STORE_CTX_get0_current_crl(sc);
        const bool expired = err == X509_V_ERR_CRL_HAS_EXPIRED;
        loco__asn1_time_str(
            crl ? (expired ? X509_CRL_get0_nextUpdate(crl) : X509_CRL_get0_lastUpdate(crl)) : NULL,
            when, sizeof when);
        snprintf(out, cap, "net.crl %s %s, so the %s cannot be checked (%s)",
                 expired ? "expired on" : "is not valid before", when, who, what);
        return;
    }
    default: snprintf(out, cap, "%s (certificate CN=%s, depth %d)", what, cn, depth);
    }
}

static int verify_cb(int ok, X509_STORE_CTX *sc) {
    if (ok)
        return ok;
    SSL *ssl = X509_STORE_CTX_get_ex_data(sc, SSL_get_ex_data_X509_STORE_CTX_idx());
    loco__conn *c = ssl ? SSL_get_app_data(ssl) : NULL;
    if (c)
        refusal_reason(c->verify_reason, sizeof c->verify_reason, sc);
    return ok;
}

/* The whole verification: OpenSSL's (chain, times, key usage, CRL), then
 * the run id of the peer's certificate when want (net.run_id) is set. */
static int verify_chain(X509_STORE_CTX *sc, void *want_run_id) {
    const int ok = X509_verify_cert(sc);
    const char *want = want_run_id;
    if (ok <= 0 || !want || !want[0])
        return ok;
    X509 *leaf = X509_STORE_CTX_get0_cert(sc);
    char got[LOCO_NET_RUN_ID_MAX];
    if (loco__cert_run_id_match(leaf, want, got, sizeof got))
        return ok;
    X509_STORE_CTX_set_error(sc, X509_V_ERR_APPLICATION_VERIFICATION);
    SSL *ssl = X509_STORE_CTX_get_ex_data(sc, SSL_get_ex_data_X509_STORE_CTX_idx());
    loco__conn *c = ssl ? SSL_get_app_data(ssl) : NULL;
    if (c) {
        char peer[LOCO_NET_NAME_MAX];
        cert_cn(leaf, peer, sizeof peer);
        if (got[0])
            snprintf(c->verify_reason, sizeof c->verify_reason,
                     "certificate of peer '%s' is for run '%s', this process is in run '%s' "
                     "(net.run_id)",
                     peer, got, want);
        else
            snprintf(c->verify_reason, sizeof c->verify_reason,
                     "certificate of peer '%s' carries no run id (SAN URI " LOCO__RUN_URI
                     "ID), this process is in run '%s' (net.run_id)",
                     peer, want);
    }
    return 0;
}

static int ctx_fail(SSL_CTX *ctx, const char *what, const char *path) {
    char why[512];
    ssl_errors(why, sizeof why);
    SSL_CTX_free(ctx);
    return LOCO_ERR(LOCO_EINVAL, "net: %s '%s': %s", what, path, why);
}

/* Checks one CRL of net.crl: signed by a certificate of net.ca, and inside
 * its validity window. */
static int check_crl(X509_CRL *crl, const loco_net_params *p) {
    char when[40];
    const ASN1_TIME *next = X509_CRL_get0_nextUpdate(crl);
    if (X509_cmp_current_time(X509_CRL_get0_lastUpdate(crl)) > 0) {
        loco__asn1_time_str(X509_CRL_get0_lastUpdate(crl), when, sizeof when);
        return LOCO_ERR(LOCO_EINVAL, "net.crl '%s' is not valid before %s", p->crl, when);
    }
    if (next && X509_cmp_current_time(next) < 0) {
        loco__asn1_time_str(next, when, sizeof when);
        return LOCO_ERR(LOCO_EINVAL,
                        "net.crl '%s' expired on %s (its nextUpdate); issue a new one (`loco "
                        "certs revoke`)",
                        p->crl, when);
    }
    BIO *in = BIO_new_file(p->ca, "r");
    bool signed_by_ca = false;
    X509 *ca;
    while (in && !signed_by_ca && (ca = PEM_read_bio_X509(in, NULL, NULL, NULL))) {
        signed_by_ca = X509_NAME_cmp(X509_CRL_get_issuer(crl), X509_get_subject_name(ca)) == 0 &&
                       X509_CRL_verify(crl, X509_get0_pubkey(ca)) == 1;
        X509_free(ca);
    }
    BIO_free(in);
    ERR_clear_error();
    if (!signed_by_ca)
        return LOCO_ERR(LOCO_EINVAL, "net.crl '%s' was not issued by the CA of net.ca '%s'", p->crl,
                        p->ca);
    return 0;
}

/* Loads every CRL of net.crl into the context's store and turns on the
 * revocation check of the peer's certificate. */
static int load_crl(SSL_CTX *ctx, const loco_net_params *p) {
    BIO *in = BIO_new_file(p->crl, "r");
    if (!in) {
        ERR_clear_error();
        return LOCO_ERR(LOCO_EINVAL, "net.crl '%s': cannot open it", p->crl);
    }
    X509_STORE *st = SSL_CTX_get_cert_store(ctx);
    int rc = 0, n = 0;
    X509_CRL *crl;
    while (rc == 0 && (crl = PEM_read_bio_X509_CRL(in, NULL, NULL, NULL))) {
        rc = check_crl(crl, p);
        if (rc == 0 && X509_STORE_add_crl(st, crl) != 1)
            rc = LOCO_ERR(LOCO_ENOMEM, "net.crl '%s': cannot add it", p->crl);
        X509_CRL_free(crl); /* the store holds its own reference */
        n++;
    }
    BIO_free(in);
    ERR_clear_error(); /* the end of the file reads as an error */
    if (rc == 0 && n == 0)
        rc = LOCO_ERR(LOCO_EINVAL, "net.crl '%s' holds no PEM CRL", p->crl);
    if (rc == 0 && X509_STORE_set_flags(st, X509_V_FLAG_CRL_CHECK) != 1)
        rc = LOCO_ERR(LOCO_ENOMEM, "net.crl: cannot turn the check on");
    return rc;
}

/* The run id peers must carry, owned by ctx (freed with it). */
static int set_run_id(SSL_CTX *ctx, const char *run_id) {
    if (!run_id[0])
        return 0;
    char *copy = OPENSSL_strdup(run_id);
    if (!copy || run_id_idx < 0 || SSL_CTX_set_ex_data(ctx, run_id_idx, copy) != 1) {
        OPENSSL_free(copy);
        return LOCO_ERR(LOCO_ENOMEM, "net: run id");
    }
    SSL_CTX_set_cert_verify_callback(ctx, verify_chain, copy);
    return 0;
}

static int tls_ctx_create(void **out, const loco_net_params *p, bool server) {
    *out = NULL;
    pthread_once(&tls_once, tls_init_once);
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
    const int rc = p->crl[0] ? load_crl(ctx, p) : 0;
    if (rc < 0 || set_run_id(ctx, p->cert_run_id) < 0) {
        SSL_CTX_free(ctx);
        return rc < 0 ? rc : LOCO_ENOMEM;
    }
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
