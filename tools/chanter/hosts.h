/*
 * hosts: emulated hosts for `chanter local up --hosts N --link RATE,DELAY[,LOSS]`
 * (job keys local.hosts, local.link).
 *
 * Each host is a network namespace "ch<tag>-h<k>" (k = 1..N; tag: a hash
 * of the work directory's absolute path) with lo up and one veth, eth0,
 * 10.77.0.<k>/24.  Its peer, vh<k>, is a port of the bridge br0 in the
 * namespace "ch<tag>-br", which has nothing else (no uplink): the hosts
 * reach each other and nothing outside.  A last namespace, "ch<tag>-ops"
 * (10.77.0.254, unshaped), is where the CLI runs its calls to the cluster
 * (main.c joins it when W/run/netns-ops names it).  With a rate, both ends
 * of each host's link are shaped by a tbf qdisc: eth0's egress (the host
 * sends) and vh<k>'s (the host receives).
 *
 * Host assignment (slots, in this order): slot 0 = the oracle and every
 * data processor, then one slot per embedding server, then one per
 * trainer; slot s runs on host (s mod N) + 1.  local.hosts = auto is N =
 * trainers + embedding_servers + 1: one host per slot.
 *
 * Fixed ports (each namespace has its own port space): the oracle 7000,
 * data processor i 10000 + i, embedding server i 30000 + i.
 *
 * Files: W/run/netns (every namespace made, one a line, written before it
 * is made: `local down` removes them even after a crash), W/run/netns-ops
 * (the ops namespace's name, once all is up), W/run/hosts ("NAME HOST NS
 * ADDR" per daemon).
 */
#ifndef CHANTER_HOSTS_H
#define CHANTER_HOSTS_H

#include <stddef.h>

#include "cfg.h"

#define HOSTS_MAX 250
#define HOSTS_OPS_ADDR "10.77.0.254"
#define HOSTS_ORACLE_PORT 7000
#define HOSTS_DATAPROC_PORT 10000
#define HOSTS_EMBEDDING_PORT 30000

typedef struct hosts_plan_s {
  int n_hosts;          /* 0: off (local.hosts empty or 0) */
  int n_dp, n_emb, n_tr;
  char tag[16];         /* "ch" + 8 hex digits */
  long long rate_bits;  /* bits per second, 0: not shaped */
} hosts_plan_t;

/* The plan from cfg (local.hosts, local.link, the counts) for workdir.
 * 0 (p->n_hosts = 0 when emulation is off), or ERR_CONFIG with the
 * sentence in err. */
int hosts_plan(const cfg_t *cfg, const char *workdir, hosts_plan_t *p, char *err, size_t err_len);

/* A rate as tc spells it (1gbit, 100mbit, 500kbit, 10mbps, 1000000) in
 * bits per second: 0, or -1 when it is not one. */
int hosts_parse_rate(const char *s, long long *bits);

/* The host (1..N) of daemon i of kind ("oracle", "dataproc", "embedding",
 * "trainer"). */
int hosts_of(const hosts_plan_t *p, const char *kind, int i);
void hosts_ns_name(const hosts_plan_t *p, int host, char *out, size_t n); /* host 0: the bridge's */
void hosts_addr(int host, char *out, size_t n);

/* cluster.oracle, cluster.dataproc, cluster.embedding, cluster.trainers
 * as the plan places them. 0 or ERR_CONFIG (err). */
int hosts_set_cluster(const hosts_plan_t *p, cfg_t *cfg, char *err, size_t err_len);

/* Makes the namespaces, links and qdiscs (recording them in W/run/netns
 * first): 0, or 1 with the sentence in err (what was made stays recorded:
 * hosts_down removes it). */
int hosts_up(const hosts_plan_t *p, const char *workdir, char *err, size_t err_len);

/* Removes every namespace W/run/netns names (and with them their links
 * and qdiscs), then W/run/netns, W/run/netns-ops and W/run/hosts: the
 * number removed (0 when there was none), or -1 when one could not be
 * (said on stderr). */
int hosts_down(const char *workdir);

/* The number of emulated hosts of the cluster in workdir (W/run/netns's
 * host namespaces: the start-up's count, which a scale does not change),
 * 0 when it runs on 127.0.0.1.  And the address embedding server i gets
 * there, on the host its slot places it on (hosts_of): chanter scale
 * --embedding-servers gives it to the oracle, and the supervisor starts
 * the server in that host's namespace. */
int hosts_count(const char *workdir);
void hosts_embedding_addr(int n_hosts, int i, char *out, size_t n);

/* The argv of a daemon as its systemd unit's ExecStart= says
 * (unitdir/chanter-oracle.service, chanter-KIND@.service), with
 * /usr/local/bin/ -> bindir/, /etc/chanter/job.ini -> job, %i -> index:
 * the count of words (malloc'ed into argv[0..], NULL-terminated, at most
 * cap - 1), or -1 with the sentence in err. */
int hosts_unit_argv(const char *bindir, const char *job, const char *kind, int index, char **argv, int cap,
                    char *err, size_t err_len);

/* `chanter local exec-in NS -- PROGRAM ARGS...`: joins NS's network
 * namespace and execs PROGRAM (the pid stays).  Returns only on error. */
int hosts_exec_in(int argc, char **argv);

/* main.c, before anything else: when argv names a work directory
 * (--workdir W, or --config W/job.ini) of an emulated cluster
 * (W/run/netns-ops), join its ops namespace.  0, or 1 after saying why it
 * could not. */
int hosts_join_ops(int argc, char **argv);

#endif
