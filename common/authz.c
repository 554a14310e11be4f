/* authz: see authz.h. */
#include "authz.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define T AUTHZ_TRAINER
#define O AUTHZ_ORACLE
#define A AUTHZ_ADMIN
#define E AUTHZ_EMBEDDING
#define ANY AUTHZ_ANY

/* The one table: service, method, the roles that may call it. */
static const struct {
  const char *service, *method;
  unsigned roles;
} table[] = {
    /* the embedding server */
    {"chanter.embedding.v1.Embedding", "Lookup", T | O | A},
    /* admins: resharding a checkpoint onto another server count on
     * resume (`chanter train --resume`) and `chanter embedding write` --
     * no more than an admin's Restore and Clear can do anyway; embedding
     * servers: a Reshape's rows sent to their new owners */
    {"chanter.embedding.v1.Embedding", "WriteBack", T | A | E},
    {"chanter.embedding.v1.Embedding", "Checkpoint", O | A},
    {"chanter.embedding.v1.Embedding", "Restore", O | A},
    {"chanter.embedding.v1.Embedding", "Clear", O | A},
    {"chanter.embedding.v1.Embedding", "Fence", O | A},
    {"chanter.embedding.v1.Embedding", "Reshape", O | A},
    {"chanter.embedding.v1.Embedding", "SealCheckpoint", O | A},
    {"chanter.embedding.v1.Embedding", "DeleteCheckpoint", O | A},
    {"chanter.embedding.v1.Embedding", "PutBlob", O | A | T},
    {"chanter.embedding.v1.Embedding", "GetBlob", O | A | T},
    {"chanter.embedding.v1.Embedding", "ListCheckpoints", ANY},
    {"chanter.embedding.v1.Embedding", "GetManifest", ANY},
    {"chanter.embedding.v1.Embedding", "Digest", ANY},
    {"chanter.embedding.v1.Embedding", "Stats", ANY},
    /* the oracle */
    {"chanter.oracle.v1.Oracle", "Join", T},
    {"chanter.oracle.v1.Oracle", "Heartbeat", T},
    {"chanter.oracle.v1.Oracle", "KvSet", T},
    {"chanter.oracle.v1.Oracle", "KvGet", T},
    {"chanter.oracle.v1.Oracle", "Work", T},
    {"chanter.oracle.v1.Oracle", "Status", ANY},
    {"chanter.oracle.v1.Oracle", "Stop", A},
    {"chanter.oracle.v1.Oracle", "Start", A},
    {"chanter.oracle.v1.Oracle", "Checkpoint", A},
    {"chanter.oracle.v1.Oracle", "Scale", A},
    /* the data processor: batches are no secret among the job's daemons */
    {"chanter.dataproc.v1.DataProc", "GetBatch", ANY},
    {"chanter.dataproc.v1.DataProc", "StreamBatches", ANY},
    {"chanter.dataproc.v1.DataProc", "Info", ANY},
};

static const char *names[] = {"trainer", "oracle", "embedding", "dataproc", "admin"};

unsigned authz_role_of_uri(const char *uri) {
  static const char prefix[] = "chanter://role/";
  if (!uri || strncmp(uri, prefix, sizeof prefix - 1)) return 0;
  const char *r = uri + sizeof prefix - 1;
  for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
    if (!strcmp(r, names[i])) return 1u << i;
  return 0;
}

const char *authz_role_name(unsigned bit) {
  for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
    if (bit == 1u << i) return names[i];
  return "none";
}

unsigned authz_allowed(const char *method) {
  if (!method || method[0] != '/') return 0;
  const char *slash = strchr(method + 1, '/');
  if (!slash) return 0;
  size_t sl = (size_t)(slash - method - 1);
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strlen(table[i].service) == sl && !strncmp(method + 1, table[i].service, sl) && !strcmp(slash + 1, table[i].method))
      return table[i].roles;
  return 0;
}

void authz_roles_str(unsigned mask, char *out, size_t n) {
  size_t o = 0;
  int k = 0, total = 0;
  out[0] = 0;
  if (mask == AUTHZ_ANY) {
    snprintf(out, n, "any role");
    return;
  }
  for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) total += (mask >> i) & 1;
  for (unsigned i = 0; i < sizeof names / sizeof names[0] && o < n; i++) {
    if (!(mask & (1u << i))) continue;
    k++;
    o += (size_t)snprintf(out + o, n - o, "%s%s", k == 1 ? "" : k == total ? " or " : ", ", names[i]);
  }
  if (!total) snprintf(out, n, "no role");
}

int authz_check(const char *method, unsigned roles, char *why, size_t why_len) {
  unsigned allowed = authz_allowed(method);
  if (roles & allowed) return 0;
  const char *m = method ? strrchr(method, '/') : NULL;
  m = m ? m + 1 : (method ? method : "?");
  char need[96];
  authz_roles_str(allowed, need, sizeof need);
  if (!allowed)
    snprintf(why, why_len, "%s is open to no role (it is not in the table of common/authz.c)", m);
  else if (!roles)
    snprintf(why, why_len, "%s needs %s%s; the caller's certificate names no chanter role (subjectAltName "
                           "URI chanter://role/...: `chanter certs issue --role`)",
             m, allowed == AUTHZ_ANY ? "" : "the role ", allowed == AUTHZ_ANY ? "a certificate naming a role" : need);
  else
    snprintf(why, why_len, "%s needs the role %s; the caller's certificate says %s", m, need, authz_role_name(roles));
  return -EACCES;
}
