/*
 * cfg_net: the checks of a job's addresses and transport security.
 *
 * A cluster that listens beyond loopback speaks mutual TLS: a job file
 * that names a non-loopback address without tls.cert_file is refused,
 * unless tls.insecure = true says that plaintext is meant (a trusted,
 * isolated network).  The daemons check their own --listen the same way
 * (daemon_init).
 */
#include "cfg.h"

#include "err.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

int cfg_addr_loopback(const char *addr) {
  if (!addr) return 0;
  char host[256];
  const char *end;
  if (addr[0] == '[') { /* [v6]:port */
    addr++;
    end = strchr(addr, ']');
    if (!end) return 0;
  } else {
    end = strrchr(addr, ':');
    if (!end || strchr(addr, ':') != end) end = addr + strlen(addr); /* a bare host, or a bare v6 address */
  }
  size_t l = (size_t)(end - addr);
  if (l == 0 || l >= sizeof host) return 0; /* ":7000" binds every interface */
  memcpy(host, addr, l);
  host[l] = 0;
  if (!strcmp(host, "localhost")) return 1;
  unsigned char a[16];
  if (inet_pton(AF_INET, host, a) == 1) return a[0] == 127;
  if (inet_pton(AF_INET6, host, a) == 1) {
    static const unsigned char one[16] = {[15] = 1};
    return memcmp(a, one, 16) == 0;
  }
  return 0;
}

int cfg_tls_on(const cfg_t *c) { return *cfg_str(c, "tls.cert_file") != 0; }

int cfg_check_net(const cfg_t *c, char *err, size_t err_len) {
  const char *ma = cfg_str(c, "metrics.listen");
  unsigned char a[16];
  if (*ma && inet_pton(AF_INET, ma, a) != 1 && inet_pton(AF_INET6, ma, a) != 1)
    return err_set(err, err_len, ERR_CONFIG,
                "metrics.listen = '%s' (from %s) is not an IPv4 or IPv6 address (127.0.0.1, 0.0.0.0, ::1, or one of "
                "this host's)",
                ma, cfg_origin(c, "metrics.listen"));
  int has_cert = *cfg_str(c, "tls.cert_file") != 0, has_key = *cfg_str(c, "tls.key_file") != 0;
  if (has_cert != has_key)
    return err_set(err, err_len, ERR_CONFIG, "tls.cert_file and tls.key_file must be set together (cert from %s, key from %s)",
                cfg_origin(c, "tls.cert_file"), cfg_origin(c, "tls.key_file"));
  if (has_cert && !*cfg_str(c, "tls.ca_file"))
    return err_set(err, err_len, ERR_CONFIG, "TLS needs tls.ca_file to verify peers (tls.cert_file is set from %s)",
                cfg_origin(c, "tls.cert_file"));
  if (has_cert || cfg_bool(c, "tls.insecure")) return 0;
  static const char *keys[] = {"cluster.oracle", "cluster.embedding", "cluster.dataproc", "cluster.trainers"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    char **addrs;
    size_t n;
    int rc = cfg_list(c, keys[k], &addrs, &n);
    if (rc) return rc;
    for (size_t i = 0; i < n && !rc; i++)
      if (!cfg_addr_loopback(addrs[i]))
        rc = err_set(err, err_len, ERR_CONFIG,
                  "%s (from %s): entry %zu '%s' is not a loopback address and TLS is off: give the job "
                  "certificates (tls.ca_file, tls.cert_file, tls.key_file; see `chanter certs`), or set "
                  "tls.insecure = true to run plaintext on a network you trust",
                  keys[k], cfg_origin(c, keys[k]), i, addrs[i]);
    cfg_list_free(addrs, n);
    if (rc) return rc;
  }
  return 0;
}
