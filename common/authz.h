/*
 * authz: who may call what -- the one table of roles per RPC method.
 *
 * A caller's role is in its certificate (`chanter certs issue --role`):
 * the subjectAltName URI chanter://role/<role>.  Each method of every
 * service names the roles that may call it; a call from another role is
 * refused with PERMISSION_DENIED naming the roles it needed and the one it
 * had.  The table (authz.c) follows what each daemon calls:
 *   - embedding: WriteBack by trainers (and admins: resharding a
 *     checkpoint on resume, `chanter embedding write`); Lookup by trainers, the oracle
 *     and admins; the checkpoint and state methods (Checkpoint, Restore,
 *     Clear, Fence, SealCheckpoint, DeleteCheckpoint) by the oracle and
 *     admins; PutBlob and GetBlob by the oracle, admins and trainers (rank
 *     0 stores the dense state at a checkpoint and every trainer reads it
 *     on a resume); the read-only ones (Stats, Digest, ListCheckpoints,
 *     GetManifest) by any role;
 *   - oracle: Join, Heartbeat, KvSet, KvGet and Work by trainers (the
 *     rendezvous and the Work stream); Stop, Start and Checkpoint by
 *     admins; Status by any role;
 *   - data processor: any role.
 * A method the table does not name is refused to every role.
 *
 * Pure functions (no gRPC here): the RPC layer finds the role of a call
 * and asks authz_check.
 */
#ifndef CHANTER_AUTHZ_H
#define CHANTER_AUTHZ_H

#include <stddef.h>

enum {
  AUTHZ_TRAINER = 1u << 0,
  AUTHZ_ORACLE = 1u << 1,
  AUTHZ_EMBEDDING = 1u << 2,
  AUTHZ_DATAPROC = 1u << 3,
  AUTHZ_ADMIN = 1u << 4,
  AUTHZ_ANY = (1u << 5) - 1,
};

/* The role bit of a subjectAltName URI "chanter://role/<role>", or 0 when
 * it is not one. */
unsigned authz_role_of_uri(const char *uri);
/* "trainer", ... for one bit; "none" for 0. */
const char *authz_role_name(unsigned bit);
/* The roles that may call a full method path ("/chanter.embedding.v1.Embedding/WriteBack"); 0: none. */
unsigned authz_allowed(const char *method);
/* "trainer or admin" (the roles of mask, in table order) into out. */
void authz_roles_str(unsigned mask, char *out, size_t n);
/* 0 when roles (the caller's, a bit or 0 for none) may call method, else
 * -EACCES with the sentence in why: "WriteBack needs the role trainer; the
 * caller's certificate says dataproc". */
int authz_check(const char *method, unsigned roles, char *why, size_t why_len);

#endif
