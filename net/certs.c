/* A run's PKI through OpenSSL's API (what `loco certs` writes): one CA and
 * one certificate per site, ECDSA P-256 keys, SHA-256 signatures. */
#include "net/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CERT_CURVE "P-256"
#define SECONDS_PER_DAY 86400L
#define MAX_DAYS 36500
#define SERIAL_BITS 127 /* positive, below the 20-byte limit of RFC 5280 */

static bool cert_name_ok(const char *s) {
    const size_t n = strlen(s);
    if (n < 1 || n >= LOCO_NET_NAME_MAX || !strcmp(s, "ca") || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static int ossl_fail(int rc, const char *what) {
    char why[256] = "";
    const unsigned long e = ERR_get_error();
    if (e)
        ERR_error_string_n(e, why, sizeof why);
    ERR_clear_error();
    return LOCO_ERR(rc, "certs: %s failed%s%s", what, why[0] ? ": " : "", why);
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
    if (!ext)
        return ossl_fail(LOCO_EINVAL, "certificate extension");
    const int ok = X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
    return ok ? 0 : ossl_fail(LOCO_ENOMEM, "X509_add_ext");
}

/* A certificate for key with CN = cn, valid [now + nb, now + nb + valid],
 * signed by issuer/issuer_key (NULL: self-signed CA). */
static int make_cert(X509 **out, EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key,
                     long nb, long valid) {
    *out = NULL;
    const bool ca = issuer == NULL;
    int rc = 0;
    X509 *x = X509_new();
    BIGNUM *bn = BN_new();
    if (!x || !bn) {
        rc = ossl_fail(LOCO_ENOMEM, "X509_new");
        goto out;
    }
    if (!X509_set_version(x, 2) || !BN_rand(bn, SERIAL_BITS, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) ||
        !BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) ||
        !X509_gmtime_adj(X509_getm_notBefore(x), nb) ||
        !X509_gmtime_adj(X509_getm_notAfter(x), nb + valid) || !X509_set_pubkey(x, key)) {
        rc = ossl_fail(LOCO_EINVAL, "certificate fields");
        goto out;
    }
    X509_NAME *name = X509_get_subject_name(x);
    if (!X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"loco", -1, -1,
                                    0) ||
        !X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1,
                                    0) ||
        !X509_set_issuer_name(x, ca ? name : X509_get_subject_name(issuer))) {
        rc = ossl_fail(LOCO_EINVAL, "certificate names");
        goto out;
    }
    X509 *iss = ca ? x : issuer;
    char san[LOCO_NET_NAME_MAX + 8];
    snprintf(san, sizeof san, "DNS:%s", cn);
    LOCO_CHECK_GOTO(add_ext(x, iss, NID_subject_key_identifier, "hash"), out);
    LOCO_CHECK_GOTO(add_ext(x, iss, NID_authority_key_identifier, "keyid:always"), out);
    if (ca) {
        LOCO_CHECK_GOTO(add_ext(x, iss, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"), out);
        LOCO_CHECK_GOTO(add_ext(x, iss, NID_key_usage, "critical,keyCertSign,cRLSign"), out);
    } else {
        LOCO_CHECK_GOTO(add_ext(x, iss, NID_basic_constraints, "critical,CA:FALSE"), out);
        LOCO_CHECK_GOTO(add_ext(x, iss, NID_key_usage, "critical,digitalSignature"), out);
        LOCO_CHECK_GOTO(add_ext(x, iss, NID_ext_key_usage, "serverAuth,clientAuth"), out);
        LOCO_CHECK_GOTO(add_ext(x, iss, NID_subject_alt_name, san), out);
    }
    if (!X509_sign(x, ca ? key : issuer_key, EVP_sha256())) {
        rc = ossl_fail(LOCO_EINVAL, "X509_sign");
        goto out;
    }
    *out = x;
    x = NULL;
out:
    BN_free(bn);
    X509_free(x);
    return rc;
}

/* Writes dir/name.ext through a temporary file: a key (mode 0600) or a
 * certificate (0644). */
static int write_pem(const char *dir, const char *name, const char *ext, EVP_PKEY *key,
                     X509 *cert) {
    char path[LOCO_PATH_MAX + 80], tmp[LOCO_PATH_MAX + 100];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    const mode_t mode = key ? 0600 : 0644;
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "certs: cannot create %s: %s", tmp, strerror(errno));
    if (fchmod(fd, mode) != 0) {
        const int e = errno;
        close(fd);
        unlink(tmp);
        return LOCO_ERR(LOCO_EIO, "certs: chmod %s: %s", tmp, strerror(e));
    }
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return LOCO_ERR(LOCO_EIO, "certs: fdopen %s", tmp);
    }
    const int ok =
        key ? PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL) : PEM_write_X509(f, cert);
    const bool flushed = fflush(f) == 0 && fsync(fileno(f)) == 0;
    const bool closed = fclose(f) == 0;
    if (!ok || !flushed || !closed) {
        unlink(tmp);
        ERR_clear_error();
        return LOCO_ERR(LOCO_EIO, "certs: cannot write %s", tmp);
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return LOCO_ERR(LOCO_EIO, "certs: rename to %s: %s", path, strerror(e));
    }
    return 0;
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Loads dir/ca.pem + dir/ca.key when both exist (*ca stays NULL when
 * neither does). */
static int load_ca(const char *dir, X509 **ca, EVP_PKEY **ca_key) {
    *ca = NULL;
    *ca_key = NULL;
    char cp[LOCO_PATH_MAX + 16], kp[LOCO_PATH_MAX + 16];
    snprintf(cp, sizeof cp, "%s/ca.pem", dir);
    snprintf(kp, sizeof kp, "%s/ca.key", dir);
    const bool have_c = exists(cp), have_k = exists(kp);
    if (!have_c && !have_k)
        return 0;
    if (have_c != have_k)
        return LOCO_ERR(LOCO_EINVAL, "certs: %s exists without %s", have_c ? cp : kp,
                        have_c ? kp : cp);
    FILE *f = fopen(cp, "r");
    if (f) {
        *ca = PEM_read_X509(f, NULL, NULL, NULL);
        fclose(f);
    }
    f = fopen(kp, "r");
    if (f) {
        *ca_key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
        fclose(f);
    }
    int rc = 0;
    if (!*ca || !*ca_key)
        rc = ossl_fail(LOCO_EINVAL, "reading the existing CA");
    else if (X509_check_private_key(*ca, *ca_key) != 1)
        rc = LOCO_ERR(LOCO_EAUTH, "certs: %s does not match %s", kp, cp);
    else if (X509_check_ca(*ca) < 1)
        rc = LOCO_ERR(LOCO_EINVAL, "certs: %s is not a CA certificate", cp);
    if (rc < 0) {
        ERR_clear_error();
        X509_free(*ca);
        EVP_PKEY_free(*ca_key);
        *ca = NULL;
        *ca_key = NULL;
    }
    return rc;
}

int loco__net_make_certs_ex(const char *out_dir, const char *const *names, int n_names,
                            long not_before_s, long valid_s) {
    if (!out_dir || !out_dir[0] || (n_names > 0 && !names) || n_names < 0 || valid_s <= 0)
        return LOCO_ERR(LOCO_EINVAL, "certs: bad arguments");
    if (strlen(out_dir) >= LOCO_PATH_MAX)
        return LOCO_ERR(LOCO_EINVAL, "certs: directory name too long");
    for (int i = 0; i < n_names; i++) {
        if (!names[i] || !cert_name_ok(names[i]))
            return LOCO_ERR(
                LOCO_EINVAL,
                "certs: name '%s' must be 1-%d characters of [A-Za-z0-9._-] and not 'ca'",
                names[i] ? names[i] : "(null)", LOCO_NET_NAME_MAX - 1);
        for (int j = 0; j < i; j++)
            if (!strcmp(names[i], names[j]))
                return LOCO_ERR(LOCO_EINVAL, "certs: name '%s' given twice", names[i]);
    }
    LOCO_CHECK(loco_mkdirs(out_dir));
    X509 *ca = NULL, *cert = NULL;
    EVP_PKEY *ca_key = NULL, *key = NULL;
    int rc = 0;
    LOCO_CHECK_GOTO(load_ca(out_dir, &ca, &ca_key), out);
    if (!ca) {
        ca_key = EVP_EC_gen(CERT_CURVE);
        if (!ca_key) {
            rc = ossl_fail(LOCO_ENOMEM, "CA key generation");
            goto out;
        }
        /* The CA outlives its leaves; it starts when they do. */
        LOCO_CHECK_GOTO(
            make_cert(&ca, ca_key, "loco run CA", NULL, NULL, not_before_s < 0 ? not_before_s : 0,
                      valid_s + (not_before_s < 0 ? -not_before_s : 0) + SECONDS_PER_DAY),
            out);
        LOCO_CHECK_GOTO(write_pem(out_dir, "ca", "key", ca_key, NULL), out);
        LOCO_CHECK_GOTO(write_pem(out_dir, "ca", "pem", NULL, ca), out);
    }
    for (int i = 0; i < n_names; i++) {
        key = EVP_EC_gen(CERT_CURVE);
        if (!key) {
            rc = ossl_fail(LOCO_ENOMEM, "key generation");
            goto out;
        }
        LOCO_CHECK_GOTO(make_cert(&cert, key, names[i], ca, ca_key, not_before_s, valid_s), out);
        LOCO_CHECK_GOTO(write_pem(out_dir, names[i], "key", key, NULL), out);
        LOCO_CHECK_GOTO(write_pem(out_dir, names[i], "pem", NULL, cert), out);
        X509_free(cert);
        EVP_PKEY_free(key);
        cert = NULL;
        key = NULL;
    }
out:
    X509_free(cert);
    EVP_PKEY_free(key);
    X509_free(ca);
    EVP_PKEY_free(ca_key);
    ERR_clear_error();
    return rc;
}

int loco_net_make_certs(const char *out_dir, const char *const *names, int n_names, int days) {
    if (days < 1 || days > MAX_DAYS)
        return LOCO_ERR(LOCO_EINVAL, "certs: days = %d, expected 1..%d", days, MAX_DAYS);
    /* Start a minute early: clocks of the sites differ a little. */
    return loco__net_make_certs_ex(out_dir, names, n_names, -60, days * SECONDS_PER_DAY + 60);
}
