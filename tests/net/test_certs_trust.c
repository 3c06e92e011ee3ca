/* Whom a TLS link trusts beyond the CA's signature: certificates outside
 * their validity window (a peer's is refused at the handshake, naming the
 * peer and the date; a process with one of its own refuses to start), the
 * run id bound into every certificate (net.run_id, both sides of the
 * handshake), the CA's revocation list (net.crl), and `loco certs` issuing
 * and revoking them. */
#include "tests/net/net_test.h"
#include "tests/support.h"

#include <openssl/bn.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <time.h>
#include <unistd.h>

TestSuite(net_certs, .init = t_setup_certs, .fini = t_teardown_certs, .timeout = 30);

#define DAY 86400L
/* The loco of the build under test (make asan sets LOCO_BIN); with a wait
 * policy set it does not start itself a second time. */
#define LOCO "OMP_WAIT_POLICY=PASSIVE \"${LOCO_BIN:-build/loco}\""

static X509 *read_cert(const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s.pem", dir, name);
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    cr_assert(x, "cannot read %s", path);
    return x;
}

/* notAfter (after) or notBefore of dir/name.pem as the messages print it;
 * returns it as seconds since the epoch. */
static time_t cert_date(const char *dir, const char *name, bool after, char *buf, size_t cap) {
    X509 *x = read_cert(dir, name);
    struct tm tm;
    cr_assert_eq(ASN1_TIME_to_tm(after ? X509_get0_notAfter(x) : X509_get0_notBefore(x), &tm), 1);
    strftime(buf, cap, "%Y-%m-%d %H:%M:%S UTC", &tm);
    X509_free(x);
    return timegm(&tm);
}

/* The serial number of dir/name.pem in hex (as BN_bn2hex writes it). */
static void cert_serial(const char *dir, const char *name, char *buf, size_t cap) {
    X509 *x = read_cert(dir, name);
    BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
    char *hex = BN_bn2hex(bn);
    snprintf(buf, cap, "%s", hex);
    OPENSSL_free(hex);
    BN_free(bn);
    X509_free(x);
}

/* Waits until the listener counted n refusals; its latest reason into info. */
static void await_refusals(loco_net_listener *l, uint64_t n, loco_net_listener_info *info) {
    const double end = loco_now() + T_ACCEPT_MS * 1e-3;
    do {
        loco_net_listener_get_info(l, info);
        if (info->refused >= n)
            return;
        usleep(5000);
    } while (loco_now() < end);
    cr_assert_fail("the listener refused %llu connections, expected %llu",
                   (unsigned long long)info->refused, (unsigned long long)n);
}

/* cp's connection to lst is refused by the listener (its refusal number n)
 * with a reason holding each of want[] (NULL-terminated). One stream: with
 * several, the client's first failure closes the others and the listener's
 * last reason may be that hang-up. */
static void refused_by_listener(loco_net_listener *lst, const loco_net_params *cp, uint64_t n,
                                const char *const *want) {
    loco_net_params one = *cp;
    one.streams = 1;
    loco_link *bad = NULL;
    const int rc = loco_net_connect(&bad, &one, "127.0.0.1", loco_net_listener_port(lst), -1);
    /* TLS 1.3: the client may finish its handshake before the server's
     * verdict; the refusal arrives as an alert or as the end of the socket. */
    cr_assert(rc == LOCO_EAUTH || rc == LOCO_EPEER, "rc %d: %s", rc, loco_errmsg());
    cr_assert_null(bad);
    loco_net_listener_info info;
    await_refusals(lst, n, &info);
    for (int i = 0; want[i]; i++)
        t_assert_has(info.last_refusal, want[i]);
    loco_link *none;
    cr_assert_eq(loco_net_accept(lst, &none, 0), LOCO_ETIMEDOUT);
}

/* cp connects to lst and the link carries a frame each way. */
static void accepted(loco_net_listener *lst, const loco_net_params *cp, const char *name) {
    loco_link *client, *server;
    cr_assert_eq(loco_net_connect(&client, cp, "127.0.0.1", loco_net_listener_port(lst), -1), 0,
                 "%s", loco_errmsg());
    cr_assert_eq(loco_net_accept(lst, &server, T_ACCEPT_MS), 0, "%s", loco_errmsg());
    cr_assert_str_eq(loco_link_peer_name(server), name);
    t_send(client, LOCO_FRAME_REGISTER, 1, 33, 1);
    t_expect(server, LOCO_FRAME_REGISTER, 1, 33, 1);
    t_send(server, LOCO_FRAME_ACK, 2, 5, 2);
    t_expect(client, LOCO_FRAME_ACK, 2, 5, 2);
    loco_link_destroy(client);
    loco_link_destroy(server);
}

/* The connecting side refuses the listener's certificate: LOCO_EAUTH with
 * each of want[] in the message. */
static void client_refuses(const loco_net_params *sp, const loco_net_params *cp,
                           const char *const *want) {
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    loco_link *l = NULL;
    cr_assert_eq(loco_net_connect(&l, cp, "127.0.0.1", loco_net_listener_port(lst), -1), LOCO_EAUTH,
                 "%s", loco_errmsg());
    cr_assert_null(l);
    for (int i = 0; want[i]; i++)
        t_assert_has(loco_errmsg(), want[i]);
    loco_net_listener_destroy(lst);
}

/* Params from a config naming dir/name's certificate (and net.run_id). */
static int params_from(loco_net_params *p, const char *name, const char *run_id) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    char set[800];
    snprintf(set, sizeof set, "net.ca=%s/ca.pem", t_dir);
    cr_assert_eq(loco_config_set(&cfg, set), 0);
    snprintf(set, sizeof set, "net.cert=%s/%s.pem", t_dir, name);
    cr_assert_eq(loco_config_set(&cfg, set), 0);
    snprintf(set, sizeof set, "net.key=%s/%s.key", t_dir, name);
    cr_assert_eq(loco_config_set(&cfg, set), 0);
    snprintf(set, sizeof set, "net.run_id=%s", run_id);
    cr_assert_eq(loco_config_set(&cfg, set), 0);
    return loco_net_params_from_config(p, &cfg);
}

Test(net_certs, expired_peer_certificate_is_refused_naming_the_peer_and_the_date) {
    const char *names[] = {"siteOld"};
    /* Valid from two days ago to yesterday, signed by the run's CA. */
    cr_assert_eq(loco__net_make_certs_ex(t_dir, names, 1, -2 * DAY, DAY), 0, "%s", loco_errmsg());
    char when[64], want[160];
    const time_t t = cert_date(t_dir, "siteOld", true, when, sizeof when);
    cr_assert(labs((long)(t - (time(NULL) - DAY))) < 120, "notAfter %s is not yesterday", when);
    snprintf(want, sizeof want, "certificate of peer 'siteOld' expired on %s", when);
    loco_net_params sp, cp, good;
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteOld");
    t_params_tls(&good, "siteA");
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    refused_by_listener(lst, &cp, 1, (const char *[]){want, "certificate has expired", NULL});
    accepted(lst, &good, "siteA");
    loco_net_listener_destroy(lst);
}

Test(net_certs, not_yet_valid_certificate_is_refused_on_either_side_naming_the_date) {
    const char *names[] = {"siteNew"};
    /* Valid from tomorrow. */
    cr_assert_eq(loco__net_make_certs_ex(t_dir, names, 1, DAY, DAY), 0, "%s", loco_errmsg());
    char when[64], want[160];
    const time_t t = cert_date(t_dir, "siteNew", false, when, sizeof when);
    cr_assert(labs((long)(t - (time(NULL) + DAY))) < 120, "notBefore %s is not tomorrow", when);
    snprintf(want, sizeof want, "certificate of peer 'siteNew' is not valid before %s", when);
    loco_net_params sp, cp;
    /* Listener side: the client presents it. */
    t_params_tls(&sp, "coordinator");
    t_params_tls(&cp, "siteNew");
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    refused_by_listener(lst, &cp, 1, (const char *[]){want, NULL});
    t_params_tls(&cp, "siteB");
    accepted(lst, &cp, "siteB");
    loco_net_listener_destroy(lst);
    /* Connecting side: the listener presents it (hand-built params; a
     * process started from its config would have refused to start). */
    t_params_tls(&sp, "siteNew");
    t_params_tls(&cp, "siteA");
    client_refuses(&sp, &cp, (const char *[]){"refused the peer's certificate", want, NULL});
}

Test(net_certs, own_certificate_outside_its_validity_refuses_to_start) {
    const char *old[] = {"siteOld"}, *young[] = {"siteNew"};
    cr_assert_eq(loco__net_make_certs_ex(t_dir, old, 1, -2 * DAY, DAY), 0, "%s", loco_errmsg());
    cr_assert_eq(loco__net_make_certs_ex(t_dir, young, 1, DAY, DAY), 0, "%s", loco_errmsg());
    char when[64], want[800];
    loco_net_params p;
    cr_assert_eq(params_from(&p, "siteOld", ""), LOCO_EINVAL);
    cert_date(t_dir, "siteOld", true, when, sizeof when);
    snprintf(want, sizeof want, "our certificate '%s/siteOld.pem' (CN=siteOld) expired on %s",
             t_dir, when);
    t_assert_has(loco_errmsg(), want);
    cr_assert_eq(params_from(&p, "siteNew", ""), LOCO_EINVAL);
    cert_date(t_dir, "siteNew", false, when, sizeof when);
    snprintf(want, sizeof want,
             "our certificate '%s/siteNew.pem' (CN=siteNew) is not valid before %s", t_dir, when);
    t_assert_has(loco_errmsg(), want);
    cr_assert_eq(params_from(&p, "siteA", ""), 0, "%s", loco_errmsg());
}

Test(net_certs, run_id_in_the_certificate_is_checked_on_both_sides) {
    /* One CA, two runs: coordinator and siteA of runA, siteC of runB;
     * siteB keeps its certificate without a run id. */
    const char *run_a[] = {"coordinator", "siteA"}, *run_b[] = {"siteC"};
    cr_assert_eq(loco_net_make_certs_run(t_dir, run_a, 2, 1, "runA"), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_net_make_certs_run(t_dir, run_b, 1, 1, "runB"), 0, "%s", loco_errmsg());
    char path[600];
    snprintf(path, sizeof path, "%s/run_id", t_dir);
    void *text;
    size_t len;
    cr_assert_eq(loco_file_read(path, &text, &len), 0);
    cr_assert(len == 5 && !memcmp(text, "runB\n", 5), "run_id file: %.*s", (int)len, (char *)text);
    loco_free(text);
    char got[LOCO_NET_RUN_ID_MAX];
    X509 *x = read_cert(t_dir, "siteA");
    cr_assert_eq(loco__cert_run_id_match(x, "runA", got, sizeof got), 1);
    cr_assert_eq(loco__cert_run_id_match(x, "runB", got, sizeof got), 0);
    cr_assert_str_eq(got, "runA");
    X509_free(x);

    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    snprintf(sp.cert_run_id, sizeof sp.cert_run_id, "runA");
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    /* Same CA, another run. */
    t_params_tls(&cp, "siteC");
    refused_by_listener(lst, &cp, 1,
                        (const char *[]){"certificate of peer 'siteC' is for run 'runB', this "
                                         "process is in run 'runA' (net.run_id)",
                                         NULL});
    /* Same CA, no run id. */
    t_params_tls(&cp, "siteB");
    refused_by_listener(lst, &cp, 2,
                        (const char *[]){"certificate of peer 'siteB' carries no run id",
                                         "this process is in run 'runA'", NULL});
    /* The right run, checking the listener's certificate in turn. */
    t_params_tls(&cp, "siteA");
    snprintf(cp.cert_run_id, sizeof cp.cert_run_id, "runA");
    accepted(lst, &cp, "siteA");
    loco_net_listener_destroy(lst);

    /* Connecting side: a listener of runB. */
    t_params_tls(&sp, "siteC");
    client_refuses(&sp, &cp,
                   (const char *[]){"refused the peer's certificate: certificate of peer 'siteC' "
                                    "is for run 'runB', this process is in run 'runA'",
                                    NULL});
    /* Unset: not checked, any run's certificate from the CA is accepted. */
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    t_params_tls(&cp, "siteB");
    accepted(lst, &cp, "siteB");
    loco_net_listener_destroy(lst);

    /* A process refuses to start with a certificate of another run. */
    loco_net_params p;
    cr_assert_eq(params_from(&p, "siteA", "runA"), 0, "%s", loco_errmsg());
    cr_assert_str_eq(p.cert_run_id, "runA");
    cr_assert_eq(params_from(&p, "siteC", "runA"), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "(CN=siteC) is for run 'runB', but net.run_id is 'runA'");
    cr_assert_eq(params_from(&p, "siteB", "runA"), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "(CN=siteB) carries no run id, but net.run_id is 'runA'");
    cr_assert_eq(params_from(&p, "siteA", "run A"), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "must be 1-63 characters");
    const char *bad[] = {"siteD"};
    cr_assert_eq(loco_net_make_certs_run(t_dir, bad, 1, 1, "a/b"), LOCO_EINVAL);
}

Test(net_certs, revoked_certificates_are_refused_on_both_sides) {
    const char *a[] = {"siteA"}, *b[] = {"siteB"};
    int listed = 0;
    cr_assert_eq(loco_net_revoke_certs(t_dir, a, 1, &listed), 0, "%s", loco_errmsg());
    cr_assert_eq(listed, 1);
    char serial[80], want[200];
    cert_serial(t_dir, "siteA", serial, sizeof serial);
    snprintf(want, sizeof want, "certificate of peer 'siteA' (serial %s) is revoked by net.crl",
             serial);
    loco_net_params sp, cp;
    t_params_tls(&sp, "coordinator");
    snprintf(sp.crl, sizeof sp.crl, "%s/crl.pem", t_dir);
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    t_params_tls(&cp, "siteA");
    refused_by_listener(lst, &cp, 1, (const char *[]){want, "certificate revoked", NULL});
    t_params_tls(&cp, "siteB");
    accepted(lst, &cp, "siteB");
    loco_net_listener_destroy(lst);

    /* Connecting side: a listener with a revoked certificate. */
    t_params_tls(&sp, "siteA");
    snprintf(cp.crl, sizeof cp.crl, "%s/crl.pem", t_dir);
    client_refuses(&sp, &cp, (const char *[]){"refused the peer's certificate", want, NULL});

    /* The list grows, keeping what it listed; a new certificate for a
     * revoked name is a new serial number and is accepted. */
    cr_assert_eq(loco_net_revoke_certs(t_dir, b, 1, &listed), 0, "%s", loco_errmsg());
    cr_assert_eq(listed, 2);
    cr_assert_eq(loco_net_revoke_certs(t_dir, b, 1, &listed), 0, "%s", loco_errmsg());
    cr_assert_eq(listed, 2, "a certificate is listed once");
    t_params_tls(&sp, "coordinator");
    snprintf(sp.crl, sizeof sp.crl, "%s/crl.pem", t_dir);
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    t_params_tls(&cp, "siteB");
    refused_by_listener(lst, &cp, 1, (const char *[]){"peer 'siteB'", "is revoked", NULL});
    t_params_tls(&cp, "siteA");
    refused_by_listener(lst, &cp, 2, (const char *[]){"peer 'siteA'", "is revoked", NULL});
    cr_assert_eq(loco_net_make_certs(t_dir, a, 1, 1), 0, "%s", loco_errmsg());
    accepted(lst, &cp, "siteA");
    loco_net_listener_destroy(lst);
}

Test(net_certs, a_crl_not_of_the_ca_or_missing_is_refused_at_start) {
    char other[256];
    snprintf(other, sizeof other, "%s/other", t_dir);
    const char *x[] = {"siteX"};
    cr_assert_eq(loco_net_make_certs(other, x, 1, 1), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_net_revoke_certs(other, x, 1, NULL), 0, "%s", loco_errmsg());
    loco_net_params sp;
    t_params_tls(&sp, "coordinator");
    snprintf(sp.crl, sizeof sp.crl, "%s/crl.pem", other);
    loco_net_listener *lst = NULL;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), LOCO_EINVAL);
    cr_assert_null(lst);
    t_assert_has(loco_errmsg(), "was not issued by the CA of net.ca");
    snprintf(sp.crl, sizeof sp.crl, "%s/nope.pem", t_dir);
    cr_assert_eq(loco_net_params_check(&sp, true), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "net.crl");
    snprintf(sp.crl, sizeof sp.crl, "%s/ca.pem", t_dir); /* a file, but no CRL in it */
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "holds no PEM CRL");
    /* Revoking needs the CA key, and certificates of this CA. */
    char empty[256];
    snprintf(empty, sizeof empty, "%s/empty", t_dir);
    cr_assert_eq(loco_mkdirs(empty), 0);
    cr_assert_eq(loco_net_revoke_certs(empty, x, 1, NULL), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "no CA in");
    char from[700], to[700];
    snprintf(from, sizeof from, "%s/siteX.pem", other);
    snprintf(to, sizeof to, "%s/siteX.pem", t_dir);
    cr_assert_eq(rename(from, to), 0);
    cr_assert_eq(loco_net_revoke_certs(t_dir, x, 1, NULL), LOCO_EINVAL);
    t_assert_has(loco_errmsg(), "was not issued by");
}

/* The first run id the certificate dir/name.pem carries. */
static void run_id_of(const char *dir, const char *name, char *got, size_t cap) {
    X509 *x = read_cert(dir, name);
    loco__cert_run_id_match(x, NULL, got, cap);
    X509_free(x);
}

Test(net_certs, loco_certs_binds_a_run_id_and_revokes) {
    static char out[8192];
    char dir[256], got[LOCO_NET_RUN_ID_MAX], id[LOCO_NET_RUN_ID_MAX], want[300];
    snprintf(dir, sizeof dir, "%s/cli", t_dir);
    /* A new random run id, printed and written to DIR/run_id. */
    int rc = test_run(out, sizeof out, LOCO " certs --out %s --names coordinator,siteA", dir);
    cr_assert_eq(rc, 0, "%s", out);
    run_id_of(dir, "siteA", id, sizeof id);
    cr_assert_eq(strlen(id), 16, "run id '%s'", id);
    cr_assert_eq(loco_net_run_id_check(id), 0);
    run_id_of(dir, "coordinator", got, sizeof got);
    cr_assert_str_eq(got, id);
    snprintf(want, sizeof want, "run id %s (new, random)", id);
    t_assert_has(out, want);
    snprintf(want, sizeof want, "set net.run_id = %s", id);
    t_assert_has(out, want);
    /* A site added later joins the same run. */
    rc = test_run(out, sizeof out, LOCO " certs --out %s --names siteB", dir);
    cr_assert_eq(rc, 0, "%s", out);
    run_id_of(dir, "siteB", got, sizeof got);
    cr_assert_str_eq(got, id);
    t_assert_has(out, "kept from DIR/run_id");
    /* --run-id, or net.run_id of the config. */
    rc = test_run(out, sizeof out, LOCO " certs --out %s --names siteC --run-id exp-7", dir);
    cr_assert_eq(rc, 0, "%s", out);
    run_id_of(dir, "siteC", got, sizeof got);
    cr_assert_str_eq(got, "exp-7");
    rc =
        test_run(out, sizeof out, LOCO " certs --out %s --names siteD --set net.run_id=exp-8", dir);
    cr_assert_eq(rc, 0, "%s", out);
    run_id_of(dir, "siteD", got, sizeof got);
    cr_assert_str_eq(got, "exp-8");
    /* revoke writes DIR/crl.pem, which a listener then applies. */
    rc = test_run(out, sizeof out, LOCO " certs revoke --out %s --names siteB", dir);
    cr_assert_eq(rc, 0, "%s", out);
    t_assert_has(out, "crl.pem lists 1 certificate");
    loco_net_params sp, cp;
    t_params_tls_in(&sp, dir, "coordinator", dir);
    snprintf(sp.crl, sizeof sp.crl, "%s/crl.pem", dir);
    snprintf(sp.cert_run_id, sizeof sp.cert_run_id, "%s", id);
    loco_net_listener *lst;
    cr_assert_eq(loco_net_listen(&lst, &sp, "127.0.0.1", 0), 0, "%s", loco_errmsg());
    t_params_tls_in(&cp, dir, "siteB", dir);
    refused_by_listener(lst, &cp, 1, (const char *[]){"peer 'siteB'", "is revoked", NULL});
    t_params_tls_in(&cp, dir, "siteA", dir);
    accepted(lst, &cp, "siteA");
    loco_net_listener_destroy(lst);
}
