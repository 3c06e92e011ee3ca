/* A run's PKI through OpenSSL's API (what `loco certs` writes): one CA and
 * one certificate per site, ECDSA P-256 keys, SHA-256 signatures, the run id
 * as a subjectAltName URI, and the CA's revocation list. */
#include "net/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CERT_CURVE "P-256"
#define SECONDS_PER_DAY 86400L
#define MAX_DAYS 36500
#define SERIAL_BITS 127 /* positive, below the 20-byte limit of RFC 5280 */

#define RUN_ID_BYTES 8 /* random run ids: 64 bits, 16 hex digits */

/* 1..max-1 characters of [A-Za-z0-9._-]: safe in file names, URIs and logs. */
static bool token_ok(const char *s, size_t max) {
    const size_t n = strnlen(s, max);
    if (n < 1 || n >= max)
        return false;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static bool cert_name_ok(const char *s) {
    return token_ok(s, LOCO_NET_NAME_MAX) && strcmp(s, "ca") != 0 && s[0] != '.';
}

int loco_net_run_id_check(const char *id) {
    if (!id || !token_ok(id, LOCO_NET_RUN_ID_MAX))
        return LOCO_ERR(LOCO_EINVAL,
                        "net: run id '%.80s' must be 1-%d characters of [A-Za-z0-9._-]",
                        id ? id : "(null)", LOCO_NET_RUN_ID_MAX - 1);
    return 0;
}

int loco_net_new_run_id(char out[LOCO_NET_RUN_ID_MAX]) {
    unsigned char b[RUN_ID_BYTES];
    out[0] = '\0';
    if (RAND_bytes(b, sizeof b) != 1) {
        ERR_clear_error();
        return LOCO_ERR(LOCO_EIO, "certs: no random bytes for a run id");
    }
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 0;
}

int loco_net_certs_run_id(const char *dir, char id[LOCO_NET_RUN_ID_MAX]) {
    id[0] = '\0';
    char path[LOCO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/run_id", dir);
    if (access(path, F_OK) != 0)
        return 0;
    void *text = NULL;
    size_t len = 0;
    LOCO_CHECK(loco_file_read(path, &text, &len));
    char *t = text;
    while (len > 0 && (t[len - 1] == '\n' || t[len - 1] == '\r' || t[len - 1] == ' '))
        len--;
    const bool fits = len < LOCO_NET_RUN_ID_MAX;
    if (fits) {
        memcpy(id, t, len);
        id[len] = '\0';
    }
    loco_free(text);
    if (!fits || loco_net_run_id_check(id) < 0) {
        id[0] = '\0';
        return LOCO_ERR(LOCO_EINVAL, "certs: %s does not hold a run id; fix or remove it", path);
    }
    return 1;
}

void loco__asn1_time_str(const ASN1_TIME *t, char *buf, size_t cap) {
    struct tm tm;
    if (!t || ASN1_TIME_to_tm(t, &tm) != 1 || !strftime(buf, cap, "%Y-%m-%d %H:%M:%S UTC", &tm))
        snprintf(buf, cap, "?");
}

int loco__cert_run_id_match(const X509 *x, const char *want, char *first, size_t cap) {
    const size_t pre = strlen(LOCO__RUN_URI);
    if (cap)
        first[0] = '\0';
    int match = 0;
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans) && !match; i++) {
        const GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
        if (g->type != GEN_URI)
            continue;
        const int len = ASN1_STRING_length(g->d.uniformResourceIdentifier);
        const char *s = (const char *)ASN1_STRING_get0_data(g->d.uniformResourceIdentifier);
        if (len <= (int)pre || len - (int)pre >= LOCO_NET_RUN_ID_MAX ||
            strncmp(s, LOCO__RUN_URI, pre))
            continue;
        char id[LOCO_NET_RUN_ID_MAX];
        memcpy(id, s + pre, (size_t)len - pre);
        id[len - pre] = '\0';
        if (!token_ok(id, sizeof id))
            continue;
        if (cap && !first[0])
            snprintf(first, cap, "%s", id);
        match = want && !strcmp(id, want);
    }
    GENERAL_NAMES_free(sans);
    return match;
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
 * signed by issuer/issuer_key (NULL: self-signed CA); a site certificate
 * carries run_id (NULL = none) as a SAN URI. */
static int make_cert(X509 **out, EVP_PKEY *key, const char *cn, X509 *issuer, EVP_PKEY *issuer_key,
                     long nb, long valid, const char *run_id) {
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
    char san[LOCO_NET_NAME_MAX + LOCO_NET_RUN_ID_MAX + 32];
    if (run_id && run_id[0])
        snprintf(san, sizeof san, "DNS:%s,URI:%s%s", cn, LOCO__RUN_URI, run_id);
    else
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

/* What write_file writes: exactly one of them. */
typedef struct {
    EVP_PKEY *key;
    X509 *cert;
    X509_CRL *crl;
    const char *text;
} file_item;

/* Writes dir/name.ext through a temporary file: a key (mode 0600), or a
 * certificate, a CRL or a line of text (0644). */
static int write_file(const char *dir, const char *name, const char *ext, const file_item *it) {
    char path[LOCO_PATH_MAX + 80], tmp[LOCO_PATH_MAX + 100];
    snprintf(path, sizeof path, "%s/%s%s%s", dir, name, ext[0] ? "." : "", ext);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    const mode_t mode = it->key ? 0600 : 0644;
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
    const int ok = it->key    ? PEM_write_PrivateKey(f, it->key, NULL, NULL, 0, NULL, NULL)
                   : it->cert ? PEM_write_X509(f, it->cert)
                   : it->crl  ? PEM_write_X509_CRL(f, it->crl)
                              : fprintf(f, "%s\n", it->text) > 0;
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

static int make_certs(const char *out_dir, const char *const *names, int n_names, long not_before_s,
                      long valid_s, const char *run_id) {
    if (!out_dir || !out_dir[0] || (n_names > 0 && !names) || n_names < 0 || valid_s <= 0)
        return LOCO_ERR(LOCO_EINVAL, "certs: bad arguments");
    if (run_id && run_id[0])
        LOCO_CHECK(loco_net_run_id_check(run_id));
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
                      valid_s + (not_before_s < 0 ? -not_before_s : 0) + SECONDS_PER_DAY, NULL),
            out);
        LOCO_CHECK_GOTO(write_file(out_dir, "ca", "key", &(file_item){.key = ca_key}), out);
        LOCO_CHECK_GOTO(write_file(out_dir, "ca", "pem", &(file_item){.cert = ca}), out);
    }
    for (int i = 0; i < n_names; i++) {
        key = EVP_EC_gen(CERT_CURVE);
        if (!key) {
            rc = ossl_fail(LOCO_ENOMEM, "key generation");
            goto out;
        }
        LOCO_CHECK_GOTO(make_cert(&cert, key, names[i], ca, ca_key, not_before_s, valid_s, run_id),
                        out);
        LOCO_CHECK_GOTO(write_file(out_dir, names[i], "key", &(file_item){.key = key}), out);
        LOCO_CHECK_GOTO(write_file(out_dir, names[i], "pem", &(file_item){.cert = cert}), out);
        X509_free(cert);
        EVP_PKEY_free(key);
        cert = NULL;
        key = NULL;
    }
    if (run_id && run_id[0])
        LOCO_CHECK_GOTO(write_file(out_dir, "run_id", "", &(file_item){.text = run_id}), out);
out:
    X509_free(cert);
    EVP_PKEY_free(key);
    X509_free(ca);
    EVP_PKEY_free(ca_key);
    ERR_clear_error();
    return rc;
}

int loco__net_make_certs_ex(const char *out_dir, const char *const *names, int n_names,
                            long not_before_s, long valid_s) {
    return make_certs(out_dir, names, n_names, not_before_s, valid_s, NULL);
}

int loco_net_make_certs_run(const char *out_dir, const char *const *names, int n_names, int days,
                            const char *run_id) {
    if (days < 1 || days > MAX_DAYS)
        return LOCO_ERR(LOCO_EINVAL, "certs: days = %d, expected 1..%d", days, MAX_DAYS);
    /* Start a minute early: clocks of the sites differ a little. */
    return make_certs(out_dir, names, n_names, -60, days * SECONDS_PER_DAY + 60, run_id);
}

int loco_net_make_certs(const char *out_dir, const char *const *names, int n_names, int days) {
    return loco_net_make_certs_run(out_dir, names, n_names, days, NULL);
}

/* ------------------------------------------------------- our certificate */

int loco__net_check_own_cert(const loco_net_params *p) {
    if (p->backend != LOCO_NET_TLS || !p->cert[0])
        return 0;
    FILE *f = fopen(p->cert, "r");
    X509 *x = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
    if (f)
        fclose(f);
    ERR_clear_error();
    if (!x)
        return LOCO_ERR(LOCO_EINVAL, "net.cert: cannot read a certificate from '%s'", p->cert);
    char cn[LOCO_NET_NAME_MAX] = "?", when[40], got[LOCO_NET_RUN_ID_MAX];
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof cn);
    int rc = 0;
    if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
        loco__asn1_time_str(X509_get0_notBefore(x), when, sizeof when);
        rc = LOCO_ERR(LOCO_EINVAL,
                      "net: our certificate '%s' (CN=%s) is not valid before %s (check the clock, "
                      "or issue one with `loco certs`)",
                      p->cert, cn, when);
    } else if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0) {
        loco__asn1_time_str(X509_get0_notAfter(x), when, sizeof when);
        rc = LOCO_ERR(LOCO_EINVAL,
                      "net: our certificate '%s' (CN=%s) expired on %s; issue a new one (`loco "
                      "certs`)",
                      p->cert, cn, when);
    } else if (p->cert_run_id[0] && !loco__cert_run_id_match(x, p->cert_run_id, got, sizeof got)) {
        if (got[0])
            rc = LOCO_ERR(LOCO_EINVAL,
                          "net: our certificate '%s' (CN=%s) is for run '%s', but net.run_id is "
                          "'%s'",
                          p->cert, cn, got, p->cert_run_id);
        else
            rc = LOCO_ERR(LOCO_EINVAL,
                          "net: our certificate '%s' (CN=%s) carries no run id, but net.run_id "
                          "is '%s' (issue it with `loco certs --run-id %s`)",
                          p->cert, cn, p->cert_run_id, p->cert_run_id);
    }
    X509_free(x);
    return rc;
}

/* ------------------------------------------------------------ revocation */

/* dir/crl.pem when it exists and ca signed it (*crl stays NULL when absent). */
static int load_crl(const char *dir, X509 *ca, X509_CRL **crl) {
    *crl = NULL;
    char path[LOCO_PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/crl.pem", dir);
    if (!exists(path))
        return 0;
    FILE *f = fopen(path, "r");
    if (f) {
        *crl = PEM_read_X509_CRL(f, NULL, NULL, NULL);
        fclose(f);
    }
    ERR_clear_error();
    if (!*crl)
        return LOCO_ERR(LOCO_EINVAL, "certs: cannot read the CRL %s", path);
    if (X509_NAME_cmp(X509_CRL_get_issuer(*crl), X509_get_subject_name(ca)) != 0 ||
        X509_CRL_verify(*crl, X509_get0_pubkey(ca)) != 1) {
        ERR_clear_error();
        X509_CRL_free(*crl);
        *crl = NULL;
        return LOCO_ERR(LOCO_EINVAL, "certs: %s was not issued by %s/ca.pem", path, dir);
    }
    return 0;
}

/* Adds the serial of dir/name.pem (which ca must have signed) to crl, once. */
static int revoke_one(X509_CRL *crl, const char *dir, const char *name, X509 *ca, ASN1_TIME *now) {
    char path[LOCO_PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s.pem", dir, name);
    FILE *f = fopen(path, "r");
    X509 *x = NULL;
    if (f) {
        x = PEM_read_X509(f, NULL, NULL, NULL);
        fclose(f);
    }
    ERR_clear_error();
    if (!x)
        return LOCO_ERR(LOCO_EINVAL, "certs: cannot read the certificate %s", path);
    int rc = 0;
    X509_REVOKED *r = NULL;
    if (X509_check_issued(ca, x) != X509_V_OK || X509_verify(x, X509_get0_pubkey(ca)) != 1) {
        rc = LOCO_ERR(LOCO_EINVAL, "certs: %s was not issued by %s/ca.pem", path, dir);
        goto out;
    }
    if (X509_CRL_get0_by_serial(crl, &r, X509_get0_serialNumber(x)) > 0)
        goto out; /* already listed */
    r = X509_REVOKED_new();
    if (!r || !X509_REVOKED_set_serialNumber(r, X509_get_serialNumber(x)) ||
        !X509_REVOKED_set_revocationDate(r, now) || !X509_CRL_add0_revoked(crl, r)) {
        X509_REVOKED_free(r);
        rc = ossl_fail(LOCO_ENOMEM, "CRL entry");
    }
out:
    ERR_clear_error();
    X509_free(x);
    return rc;
}

/* The CRL number after old's (1 when there is none). */
static int crl_number(X509_CRL *crl, X509_CRL *old) {
    ASN1_INTEGER *prev = old ? X509_CRL_get_ext_d2i(old, NID_crl_number, NULL, NULL) : NULL;
    BIGNUM *bn = prev ? ASN1_INTEGER_to_BN(prev, NULL) : BN_new();
    ASN1_INTEGER *num = NULL;
    int rc = 0;
    if (!bn || !BN_add_word(bn, 1) || !(num = BN_to_ASN1_INTEGER(bn, NULL)) ||
        X509_CRL_add1_ext_i2d(crl, NID_crl_number, num, 0, 0) != 1)
        rc = ossl_fail(LOCO_ENOMEM, "CRL number");
    ASN1_INTEGER_free(prev);
    ASN1_INTEGER_free(num);
    BN_free(bn);
    return rc;
}

int loco_net_revoke_certs(const char *dir, const char *const *names, int n_names, int *n_revoked) {
    if (n_revoked)
        *n_revoked = 0;
    if (!dir || !dir[0] || !names || n_names < 1)
        return LOCO_ERR(LOCO_EINVAL, "certs: revoke: bad arguments");
    if (strlen(dir) >= LOCO_PATH_MAX)
        return LOCO_ERR(LOCO_EINVAL, "certs: directory name too long");
    for (int i = 0; i < n_names; i++)
        if (!names[i] || !cert_name_ok(names[i]))
            return LOCO_ERR(LOCO_EINVAL, "certs: revoke: bad name '%s'",
                            names[i] ? names[i] : "(null)");
    X509 *ca = NULL;
    EVP_PKEY *ca_key = NULL;
    X509_CRL *old = NULL, *crl = NULL;
    ASN1_TIME *now = NULL;
    X509_EXTENSION *akid = NULL;
    LOCO_CHECK(load_ca(dir, &ca, &ca_key));
    int rc = 0;
    if (!ca) {
        rc = LOCO_ERR(LOCO_EINVAL,
                      "certs: no CA in %s (ca.pem + ca.key): only the holder of the CA key revokes",
                      dir);
        goto out;
    }
    LOCO_CHECK_GOTO(load_crl(dir, ca, &old), out);
    crl = X509_CRL_new();
    /* A minute early, as certificates: clocks of the sites differ a little.
     * The list stays valid as long as the certificates it could name. */
    now = X509_gmtime_adj(NULL, -60);
    if (!crl || !now || !X509_CRL_set_version(crl, 1) ||
        !X509_CRL_set_issuer_name(crl, X509_get_subject_name(ca)) ||
        !X509_CRL_set1_lastUpdate(crl, now) ||
        !X509_CRL_set1_nextUpdate(crl, X509_get0_notAfter(ca))) {
        rc = ossl_fail(LOCO_ENOMEM, "CRL fields");
        goto out;
    }
    const STACK_OF(X509_REVOKED) *prev = old ? X509_CRL_get_REVOKED(old) : NULL;
    for (int i = 0; prev && i < sk_X509_REVOKED_num(prev); i++) {
        X509_REVOKED *d = X509_REVOKED_dup(sk_X509_REVOKED_value(prev, i));
        if (!d || !X509_CRL_add0_revoked(crl, d)) {
            X509_REVOKED_free(d);
            rc = ossl_fail(LOCO_ENOMEM, "CRL entry");
            goto out;
        }
    }
    for (int i = 0; i < n_names; i++)
        LOCO_CHECK_GOTO(revoke_one(crl, dir, names[i], ca, now), out);
    LOCO_CHECK_GOTO(crl_number(crl, old), out);
    X509V3_CTX xc;
    X509V3_set_ctx_nodb(&xc);
    X509V3_set_ctx(&xc, ca, NULL, NULL, crl, 0);
    akid = X509V3_EXT_conf_nid(NULL, &xc, NID_authority_key_identifier, "keyid:always");
    if (!akid || !X509_CRL_add_ext(crl, akid, -1) || !X509_CRL_sort(crl) ||
        !X509_CRL_sign(crl, ca_key, EVP_sha256())) {
        rc = ossl_fail(LOCO_EINVAL, "signing the CRL");
        goto out;
    }
    LOCO_CHECK_GOTO(write_file(dir, "crl", "pem", &(file_item){.crl = crl}), out);
    if (n_revoked)
        *n_revoked = sk_X509_REVOKED_num(X509_CRL_get_REVOKED(crl));
out:
    X509_EXTENSION_free(akid);
    ASN1_TIME_free(now);
    X509_CRL_free(crl);
    X509_CRL_free(old);
    X509_free(ca);
    EVP_PKEY_free(ca_key);
    ERR_clear_error();
    return rc;
}
