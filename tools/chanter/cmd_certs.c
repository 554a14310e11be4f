/*
 * chanter certs: a job's certificate authority and its daemons'
 * certificates, for mutual TLS (tls.* keys).
 *
 *   chanter certs init --dir D [--days N]
 *   chanter certs issue --dir D --role ROLE --name N [--host H,H...] [--days N]
 *
 * init makes D/ca.pem and D/ca.key: a self-signed CA (EC P-256, SHA-256,
 * CA:TRUE, keyCertSign) that the job's daemons and tools trust and no one
 * else.  issue makes D/N.pem and D/N.key, signed by it, for one host or
 * tool: subject CN = N; subjectAltName = URI:chanter://role/ROLE (who the
 * holder is: trainer, oracle, embedding, dataproc or admin), DNS:N (when N
 * is a host name), IP:127.0.0.1, and each --host (a DNS name or an IP
 * address); serverAuth and clientAuth, since every daemon is both a
 * server and a client.  Keys are written 0600 and never overwritten.
 * Everything is OpenSSL's (libcrypto): no cryptography of our own.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

static const char *roles[] = {"trainer", "oracle", "embedding", "dataproc", "admin"};

static void ossl_err(const char *what) {
  unsigned long e = ERR_get_error();
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  fprintf(stderr, "chanter certs: %s: %s\n", what, e ? buf : "unknown OpenSSL error");
}

/* Writes a PEM file that must not exist yet (mode 0600 for keys). */
static int write_pem(const char *path, int key, EVP_PKEY *pk, X509 *x) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, key ? 0600 : 0644);
  if (fd < 0) {
    fprintf(stderr, "chanter certs: cannot create %s: %s%s\n", path, strerror(errno),
            errno == EEXIST ? " (remove it first if you mean to replace it)" : "");
    return -1;
  }
  FILE *f = fdopen(fd, "w");
  if (!f) {
    close(fd);
    return -1;
  }
  int ok = key ? PEM_write_PrivateKey(f, pk, NULL, NULL, 0, NULL, NULL) : PEM_write_X509(f, x);
  if (fclose(f) || !ok) {
    fprintf(stderr, "chanter certs: cannot write %s\n", path);
    unlink(path);
    return -1;
  }
  return 0;
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
  X509_EXTENSION *ex = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
  if (!ex) return -1;
  int ok = X509_add_ext(cert, ex, -1);
  X509_EXTENSION_free(ex);
  return ok ? 0 : -1;
}

/* A new certificate for key pk, subject CN = cn, valid for days, serial
 * random; issuer = itself when ca_cert is NULL. */
static X509 *new_cert(EVP_PKEY *pk, const char *cn, int days, X509 *ca_cert) {
  X509 *x = X509_new();
  if (!x) return NULL;
  BIGNUM *bn = BN_new();
  ASN1_INTEGER *serial = NULL;
  if (!bn || !BN_rand(bn, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) || !(serial = BN_to_ASN1_INTEGER(bn, NULL)) ||
      !X509_set_version(x, 2) || !X509_set_serialNumber(x, serial) || !X509_gmtime_adj(X509_getm_notBefore(x), -3600) ||
      !X509_gmtime_adj(X509_getm_notAfter(x), (long)days * 86400) || !X509_set_pubkey(x, pk)) {
    BN_free(bn);
    ASN1_INTEGER_free(serial);
    X509_free(x);
    return NULL;
  }
  BN_free(bn);
  ASN1_INTEGER_free(serial);
  X509_NAME *name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"chanter", -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
  X509_set_issuer_name(x, ca_cert ? X509_get_subject_name(ca_cert) : name);
  return x;
}

static int parse_days(cli_t *cli, const char *s, int *out) {
  char *end;
  long d = s ? strtol(s, &end, 10) : 825;
  if (s && (*end || d < 1 || d > 36500)) return cli_usage_error(cli, "--days %s: expected 1..36500", s);
  *out = (int)d;
  return 0;
}

/* D/ca.pem and D/ca.key, a new CA valid for days: 0, or 1 after saying
 * why on stderr. */
static int make_ca(const char *dir, int days, int quiet) {
  if (mkdir(dir, 0700) && errno != EEXIST) {
    fprintf(stderr, "chanter certs: cannot create %s: %s\n", dir, strerror(errno));
    return 1;
  }
  char kp[4200], cp[4200];
  snprintf(kp, sizeof kp, "%s/ca.key", dir);
  snprintf(cp, sizeof cp, "%s/ca.pem", dir);
  if (access(kp, F_OK) == 0 || access(cp, F_OK) == 0) {
    fprintf(stderr, "chanter certs init: %s already holds a CA (ca.pem / ca.key); every certificate it issued trusts "
                    "it: remove them first only if you mean to start over\n",
            dir);
    return 1;
  }
  EVP_PKEY *pk = EVP_EC_gen("P-256");
  X509 *x = pk ? new_cert(pk, "chanter job CA", days, NULL) : NULL;
  int rc = 1;
  if (!x || add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") ||
      add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") ||
      add_ext(x, x, NID_subject_key_identifier, "hash") || !X509_sign(x, pk, EVP_sha256())) {
    ossl_err("making the CA");
    goto out;
  }
  if (write_pem(kp, 1, pk, NULL) || write_pem(cp, 0, NULL, x)) goto out;
  if (!quiet)
    printf("CA: %s (certificate, give it to every host as tls.ca_file) and %s (its key: keep it off the cluster)\n",
           cp, kp);
  rc = 0;
out:
  X509_free(x);
  EVP_PKEY_free(pk);
  return rc;
}

static int certs_init(cli_t *cli) {
  const char *dir = cli_opt(cli, "--dir"), *days_s = cli_opt(cli, "--days");
  if (cli_done(cli, "init")) return 2;
  if (!dir) return cli_usage_error(cli, "--dir D is required (the CA goes to D/ca.pem and D/ca.key)");
  int days;
  if (parse_days(cli, days_s ? days_s : "3650", &days)) return 2;
  return make_ca(dir, days, 0);
}

static EVP_PKEY *read_key(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
  fclose(f);
  return k;
}

static X509 *read_cert(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
  fclose(f);
  return x;
}

static int valid_name(const char *n) {
  if (!*n || strlen(n) > 200) return 0;
  for (const char *p = n; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' ||
          *p == '_'))
      return 0;
  return n[0] != '.' && n[0] != '-';
}

/* "IP:x" for an address, "DNS:x" for a name. */
static void san_entry(char *out, size_t n, const char *h) {
  unsigned char buf[16];
  int ip = inet_pton(AF_INET, h, buf) == 1 || inet_pton(AF_INET6, h, buf) == 1;
  snprintf(out, n, "%s:%s", ip ? "IP" : "DNS", h);
}

/* D/name.pem and D/name.key for role, signed by D's CA, valid for days,
 * with hosts (comma-separated, or NULL) in its subjectAltName: 0, or 1
 * after saying why on stderr. */
static int make_cert(const char *dir, const char *role, const char *name, const char *hosts, int days, int quiet) {
  char kp[4200], cp[4200], ck[4200], cc[4200];
  snprintf(ck, sizeof ck, "%s/ca.key", dir);
  snprintf(cc, sizeof cc, "%s/ca.pem", dir);
  snprintf(kp, sizeof kp, "%s/%s.key", dir, name);
  snprintf(cp, sizeof cp, "%s/%s.pem", dir, name);
  EVP_PKEY *ca_key = read_key(ck), *pk = NULL;
  X509 *ca = read_cert(cc), *x = NULL;
  int rc = 1;
  if (!ca_key || !ca) {
    fprintf(stderr, "chanter certs issue: no CA in %s (%s, %s): run `chanter certs init --dir %s` first\n", dir, cc, ck,
            dir);
    goto out;
  }
  if (X509_check_private_key(ca, ca_key) != 1) {
    fprintf(stderr, "chanter certs issue: %s is not the key of %s\n", ck, cc);
    goto out;
  }
  /* subjectAltName: the role, the name, loopback, the hosts */
  char san[4096], e[300];
  int o = snprintf(san, sizeof san, "URI:chanter://role/%s, IP:127.0.0.1", role);
  unsigned char tmp[16];
  if (strchr(name, '.') || inet_pton(AF_INET, name, tmp) != 1) {
    san_entry(e, sizeof e, name);
    o += snprintf(san + o, sizeof san - (size_t)o, ", %s", e);
  }
  if (hosts) {
    char *copy = strdup(hosts), *save = NULL;
    for (char *h = copy ? strtok_r(copy, ",", &save) : NULL; h; h = strtok_r(NULL, ",", &save)) {
      while (*h == ' ') h++;
      if (!*h) continue;
      if (!valid_name(h) && !strchr(h, ':')) {
        free(copy);
        fprintf(stderr, "chanter certs issue: --host %s: not a host name or an address\n", h);
        goto out;
      }
      san_entry(e, sizeof e, h);
      o += snprintf(san + o, sizeof san - (size_t)o, ", %s", e);
    }
    free(copy);
  }
  pk = EVP_EC_gen("P-256");
  x = pk ? new_cert(pk, name, days, ca) : NULL;
  if (!x || add_ext(x, ca, NID_basic_constraints, "critical,CA:FALSE") ||
      add_ext(x, ca, NID_key_usage, "critical,digitalSignature") ||
      add_ext(x, ca, NID_ext_key_usage, "serverAuth,clientAuth") || add_ext(x, ca, NID_subject_alt_name, san) ||
      add_ext(x, ca, NID_authority_key_identifier, "keyid") || !X509_sign(x, ca_key, EVP_sha256())) {
    ossl_err("issuing the certificate");
    goto out;
  }
  if (write_pem(kp, 1, pk, NULL) || write_pem(cp, 0, NULL, x)) goto out;
  if (!quiet)
    printf("issued %s (role %s, valid %d days): %s and %s (its key); subjectAltName %s\n", name, role, days, cp, kp,
           san);
  rc = 0;
out:
  X509_free(x);
  X509_free(ca);
  EVP_PKEY_free(pk);
  EVP_PKEY_free(ca_key);
  return rc;
}


static int certs_issue(cli_t *cli) {
  const char *dir = cli_opt(cli, "--dir"), *role = cli_opt(cli, "--role"), *name = cli_opt(cli, "--name");
  const char *hosts = cli_opt(cli, "--host"), *days_s = cli_opt(cli, "--days");
  if (cli_done(cli, "issue")) return 2;
  if (!dir || !role || !name) return cli_usage_error(cli, "--dir D, --role ROLE and --name N are required");
  int known = 0;
  for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) known |= !strcmp(role, roles[i]);
  if (!known) return cli_usage_error(cli, "--role %s: one of trainer, oracle, embedding, dataproc, admin", role);
  if (!valid_name(name))
    return cli_usage_error(cli, "--name %s: use a host or tool name of A-Z a-z 0-9 . - _ (it names the files)", name);
  int days;
  if (parse_days(cli, days_s, &days)) return 2;
  return make_cert(dir, role, name, hosts, days, 0);
}

int certs_local(const char *dir) {
  char p[4200];
  snprintf(p, sizeof p, "%s/ca.pem", dir);
  if (access(p, F_OK) != 0 && make_ca(dir, 3650, 1)) return 1;
  for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
    snprintf(p, sizeof p, "%s/%s.pem", dir, roles[i]);
    if (access(p, F_OK) == 0) continue;
    if (make_cert(dir, roles[i], roles[i], "localhost", 825, 1)) return 1;
  }
  return 0;
}

int cmd_certs(cli_t *cli) {
  if (cli->argc < 1) return cli_usage_error(cli, "expected init or issue");
  const char *sub = cli->argv[0];
  cli->argc--;
  cli->argv++;
  cli->sub = sub;
  if (!strcmp(sub, "init")) return certs_init(cli);
  if (!strcmp(sub, "issue")) return certs_issue(cli);
  return cli_usage_error(cli, "unknown subcommand '%s': init or issue", sub);
}
