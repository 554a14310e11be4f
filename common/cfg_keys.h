/*
 * cfg_keys: every key of the job file -- type, default, bounds, meaning --
 * as one table, read by cfg.c alone (`chanter config keys` prints it).
 * A header of data, not an interface: include it in cfg.c only.
 */
#ifndef CHANTER_CFG_KEYS_H
#define CHANTER_CFG_KEYS_H

/* T_LIST: comma-separated strings; T_INTS: comma-separated integers >= 0
 * (bounds are checked where the list is used).  Both are read strictly (no
 * empty entry) and stored as "a,b,c"; cfg_str returns that. */
typedef enum { T_INT, T_FLOAT, T_BOOL, T_STR, T_ENUM, T_LIST, T_INTS } ctype_t;

typedef struct entry_s {
  const char *name;
  ctype_t type;
  const char *def;
  double min, max;        /* numbers */
  const char *choices;    /* enums: "a|b|c" */
  const char *help;
} entry_t;

#define CRITEO_ROWS                                                                  \
  "1460,583,200000,200000,305,24,12517,633,3,93145,5683,200000,3194,27,14992,200000," \
  "10,5652,2173,4,200000,18,15,200000,105,142572"

static const entry_t entries[] = {
    /* ---- the job (DESIGN.md section 6, stable names) ---- */
    {"model", T_ENUM, "dlrm", 0, 0, "dlrm|wdl|deepfm|dcn|dlrm_dcn", "model architecture"},
    {"optimizer", T_ENUM, "sgd", 0, 0, "sgd|adagrad|adam", "optimizer of the dense parameters"},
    {"embedding_optimizer", T_ENUM, "sgd", 0, 0, "sgd|adagrad|rowwise_adagrad",
     "optimizer of embedding rows; its state is stored after each row (0, dim or 1 floats)"},
    {"learning_rate", T_FLOAT, "0.05", 0, 1e6, NULL, "learning rate"},
    {"batch_size", T_INT, "1024", 1, 1 << 24, NULL, "global batch size (samples per iteration, all trainers)"},
    {"iterations", T_INT, "1000", 0, 1e12, NULL, "training iterations"},
    {"seed", T_INT, "42", 0, 9.2e18, NULL, "job seed: data, allocation and lazy row initialization"},
    {"dataset", T_STR, "synthetic", 0, 0, NULL, "a dataset path, or 'synthetic'"},
    {"trainers", T_INT, "2", 1, 4096, NULL, "number of trainers"},
    {"embedding_servers", T_INT, "2", 1, 4096, NULL, "number of embedding servers (shards)"},
    {"dataprocs", T_INT, "1", 1, 4096, NULL, "number of data processors"},
    {"lookahead", T_STR, "auto", 0, 0, NULL, "lookahead L in batches (0 = baseline), or 'auto' (largest L cache_rows allows)"},
    {"cache_rows", T_INT, "1000000", 0, 1e12, NULL, "rows each trainer's embedding cache holds"},
    {"lrpp", T_BOOL, "true", 0, 0, NULL,
     "rows only one trainer uses in a batch, and evicted after it, are fetched, updated and written back by that "
     "trainer alone, never synchronized (false: every row is shared)"},
    {"delayed_sync", T_BOOL, "true", 0, 0, NULL,
     "shared rows the next batch does not use are synchronized in the background during its forward (false: "
     "every shared row before the next batch starts)"},
    {"allocation", T_ENUM, "contiguous", 0, 0, "contiguous|random|laia", "which trainer trains which sample"},
    {"table_strategy", T_STR, "auto", 0, 0, NULL,
     "how each table's rows move: cache (the lookahead cache), partition (the rows live on one trainer, pooled "
     "embeddings move by AlltoAll), partition_rows (the rows are spread over every trainer, row r on trainer r mod "
     "P; partial sums move by AlltoAll), auto (the oracle chooses per table: cache, partition, or partition_rows for "
     "a table too big for strategy.partition_mb); one word, or one per table, comma-separated.  auto is the "
     "default: measured 1.3-2.2x the samples/s of cache with two CPU trainers and 5.5x with one GPU trainer "
     "(README, Table strategies)"},
    {"mode", T_ENUM, "normal", 0, 0, "normal|ideal", "ideal skips all embedding traffic (lower bound of iteration time)"},
    {"device", T_ENUM, "cpu", 0, 0, "cpu|cuda", "where trainers compute"},
    {"eval_every", T_INT, "0", 0, 1e12, NULL, "evaluate every N iterations (0 = only at the end)"},
    {"eval_batches", T_INT, "8", 0, 1e9, NULL, "held-out batches per evaluation"},
    {"checkpoint_every", T_INT, "0", 0, 1e12, NULL,
     "take a whole-job checkpoint after every N iterations (0 = by checkpoint_seconds only); one is always taken at "
     "the end of the job"},
    {"checkpoint_seconds", T_INT, "600", 0, 1e9, NULL,
     "take a whole-job checkpoint when this many seconds have passed since the last one (0 = by checkpoint_every only)"},
    {"checkpoint_keep", T_INT, "3", 1, 1000000, NULL, "complete checkpoints kept on every embedding server (older ones are removed)"},
    {"checkpoint.backup_dir", T_STR, "", 0, 0, NULL,
     "where each embedding server backs up its sealed checkpoints (RocksDB BackupEngine, incremental; empty = off): "
     "%i = the server's shard, else <dir>/embedding-<shard>; a server started on an empty data dir restores them"},
    {"log_level", T_ENUM, "info", 0, 0, "error|warn|info|debug", "log verbosity of every daemon"},
    /* ---- embedding tables ---- */
    {"n_dense", T_INT, "13", 0, 1 << 20, NULL, "dense features per sample"},
    {"table_rows", T_INTS, CRITEO_ROWS, 0, 0, NULL,
     "comma-separated row count of each embedding table (Criteo's 26 cardinalities, capped at 200000)"},
    {"table_scale", T_INT, "1", 1, 1e12, NULL,
     "divides every table's row count: table_rows / table_scale rows (rounded down, at least 1), in the layout and "
     "the data schema alike, to fit a job's tables on a smaller machine (deploy/jobs/mlperf-dlrmv2.ini)"},
    {"embedding_dim", T_INT, "16", 1, 65536, NULL, "embedding dimension of every table"},
    {"table_dims", T_INTS, "", 0, 0, NULL, "optional comma-separated dimension per table (overrides embedding_dim)"},
    /* ---- data ---- */
    {"dataset_format", T_ENUM, "auto", 0, 0, "auto|criteo|avazu|binary",
     "format of dataset: auto = by content (binary magic) and extension (.csv = avazu, else criteo TSV)"},
    {"test_fraction", T_FLOAT, "0.1", 0, 0.9, NULL, "the last fraction of the dataset's samples is held out for evaluation"},
    {"strict", T_BOOL, "false", 0, 0, NULL, "stop at the first malformed record (file:line and why) instead of counting and skipping it; also refuse a batch_size larger than the train or test split"},
    {"hash_seed", T_INT, "0", 0, 9.2e18, NULL, "seed of hash64 (XXH3) that maps raw categorical values to table rows"},
    {"table_hotness", T_INTS, "", 0, 0, NULL,
     "optional comma-separated ids per sample of each table (multi-hot, pooled by sum); empty = one-hot everywhere"},
    {"data.max_reports", T_INT, "5", 0, 1000000, NULL, "malformed records reported individually (file:line) before only counting"},
    {"data.max_bad_fraction", T_FLOAT, "0.01", 0, 1, NULL,
     "a text dataset with more than this fraction of malformed records is refused at open and by data convert (1 = no limit)"},
    {"synthetic.samples", T_INT, "1000000", 1, 1e13, NULL, "samples in the synthetic dataset (train + test)"},
    {"synthetic.alpha", T_FLOAT, "1.05", 0, 10, NULL, "Zipf exponent of row popularity in each table (0 = uniform)"},
    {"synthetic.table_alpha", T_LIST, "", 0, 0, NULL,
     "optional comma-separated Zipf exponent of each table (overrides synthetic.alpha per table; 0 = uniform)"},
    {"synthetic.hot_share", T_FLOAT, "0", 0, 100, NULL,
     "if > 0: the hottest 1% of each table's rows take this % of accesses, the rest uniform (overrides alpha)"},
    {"synthetic.signal", T_FLOAT, "1.0", 0, 100, NULL, "strength of the planted logistic signal (0 = labels are coin flips)"},
    {"synthetic.preset", T_ENUM, "independent", 0, 0, "independent|sessions",
     "independent: every feature drawn on its own (Zipf); sessions: samples come in sessions of users "
     "(active_users at once, interleaved in time) whose user_tables values are fixed per user"},
    {"synthetic.users", T_INT, "50000", 1, 1e12, NULL, "sessions: number of users (activity Zipf(user_alpha) over them)"},
    {"synthetic.user_alpha", T_FLOAT, "1.0", 0, 10, NULL, "sessions: Zipf exponent of user activity (0 = every user alike)"},
    {"synthetic.user_tables", T_INTS, "", 0, 0, NULL,
     "sessions: tables whose value is fixed per user (the first is the user id); empty = the first "
     "round(n_tables * 5 / 22) tables, at least one"},
    {"synthetic.active_users", T_INT, "1024", 1, 1e9, NULL,
     "sessions: users in a session at any moment, whose samples interleave in the log"},
    {"synthetic.session_mean", T_FLOAT, "6", 1, 4096, NULL,
     "sessions: samples of one user per session (a session spans active_users * session_mean samples of the log)"},
    /* ---- model ---- */
    {"model.bottom_mlp", T_INTS, "512,256,64", 0, 0, NULL,
     "DLRM (and dlrm_dcn) bottom MLP hidden sizes (dense features -> ... -> embedding_dim is appended)"},
    {"model.top_mlp", T_INTS, "512,256", 0, 0, NULL,
     "DLRM (and dlrm_dcn) top MLP hidden sizes (an output of 1 is appended)"},
    {"model.deep_mlp", T_INTS, "512,256,128", 0, 0, NULL, "deep tower hidden sizes of wdl, deepfm and dcn (an output of 1 is appended)"},
    {"model.cross_layers", T_INT, "3", 0, 64, NULL, "cross layers of dcn and dlrm_dcn"},
    {"model.cross_rank", T_INT, "0", 0, 1 << 20, NULL,
     "dlrm_dcn: rank r of each DCNv2 cross layer's matrix, U [d x r] V^T (MLPerf DLRMv2: 512); 0 = full rank, one "
     "d x d matrix"},
    {"adagrad_eps", T_FLOAT, "1e-8", 0, 1, NULL, "epsilon of Adagrad and row-wise Adagrad"},
    {"adagrad_init", T_FLOAT, "0", 0, 1e6, NULL, "initial Adagrad accumulator of dense parameters"},
    {"adam_beta1", T_FLOAT, "0.9", 0, 1, NULL, "Adam first-moment decay"},
    {"adam_beta2", T_FLOAT, "0.999", 0, 1, NULL, "Adam second-moment decay"},
    {"adam_eps", T_FLOAT, "1e-8", 0, 1, NULL, "Adam epsilon"},
    /* ---- cluster endpoints ---- */
    {"cluster.embedding", T_LIST, "", 0, 0, NULL,
     "comma-separated host:port of each embedding server, in shard order (empty: chanter local up assigns loopback ports)"},
    {"cluster.oracle", T_STR, "", 0, 0, NULL, "host:port of the oracle (empty: chanter local up assigns a loopback port)"},
    {"cluster.trainers", T_LIST, "", 0, 0, NULL,
     "comma-separated host of each trainer, in rank order: the address its collectives bind to (empty: 127.0.0.1)"},
    {"cluster.dataproc", T_LIST, "", 0, 0, NULL,
     "comma-separated host:port of each data processor (empty: chanter local up assigns loopback ports)"},
    /* ---- sharding ---- */
    {"shard.table_wise_max_rows", T_INT, "100000", 0, 1e15, NULL,
     "tables with at most this many rows live whole on one server; larger ones are split row-wise by key hash"},
    {"shard.table_servers", T_LIST, "", 0, 0, NULL,
     "optional: the embedding server of each table, comma-separated (a server index, or rows = split row-wise by key "
     "hash), as `chanter shard plan` prints the cost model's placement; empty = whole up to "
     "shard.table_wise_max_rows rows, by rows-greedy balance"},
    {"shard.rule", T_ENUM, "consistent", 0, 0, "consistent|modulo",
     "how rows go to the embedding servers when shard.table_servers is empty: consistent = row-wise tables by jump "
     "consistent hash of the key, whole tables placed for n servers by moving tables onto server n - 1 from the "
     "placement for n - 1 (a scale from n to n + 1 servers moves about 1/(n + 1) of the rows, all onto the new "
     "server); modulo = the hash modulo the server count and whole tables greedily from scratch (the rule before; "
     "moves most rows): resume a checkpoint with the rule it was taken with"},
    {"shard.placement", T_ENUM, "autoshard", 0, 0, "autoshard|lookup_greedy|size_greedy|random",
     "where the partitioned tables live on the trainers: autoshard = the planner on the cost model (shard.cost_model), "
     "within strategy.partition_mb; lookup_greedy = by hotness x dim (the rule before AutoShard); size_greedy and "
     "random are baselines.  Placement never changes the model's bits"},
    {"shard.cost_model", T_STR, "", 0, 0, NULL,
     "the sharding planner's cost model (chanter shard plan): a file `chanter shard fit` wrote from `chanter bench "
     "tables`' measurements of the machines the job runs on; empty = the default built into the binary "
     "(deploy/shard/cost_model.txt of its tree, labelled with the machine it was fitted on)"},
    /* ---- rpc ---- */
    {"rpc.timeout_ms", T_INT, "30000", 1, 86400000, NULL, "deadline of every unary RPC"},
    {"metrics.listen", T_STR, "127.0.0.1", 0, 0, NULL,
     "the address every daemon's Prometheus endpoint binds to: loopback by default (a scraper on the host, or an "
     "ssh tunnel); 0.0.0.0 to scrape from another host (plain HTTP: only on a trusted network, or metrics.tls)"},
    {"metrics.tls", T_BOOL, "false", 0, 0, NULL,
     "serve every daemon's /metrics (and the oracle's status page) over HTTPS with the daemon's own "
     "tls.cert_file and tls.key_file ({role}); needs them set.  Scrapers then use https and the job's CA "
     "(chanter prometheus-config writes it so)"},
    {"rpc.max_message_mb", T_INT, "256", 4, 2047, NULL,
     "largest gRPC message a client sends or receives, and a server sends; a server receives at most what its "
     "own limits allow (the embedding server: embedding.max_lookup_keys, embedding.max_write_keys with the "
     "largest row, embedding.max_blob_mb, plus 1 MiB; the data processor: 1 MiB; the oracle: this), so gRPC "
     "refuses a larger request before the handler sees it (gRPC 1.51 still reads it whole first)"},
    /* ---- TLS (empty = plaintext; use TLS off loopback) ---- */
    {"tls.ca_file", T_STR, "", 0, 0, NULL, "PEM CA bundle that peers' certificates must chain to"},
    {"tls.cert_file", T_STR, "", 0, 0, NULL,
     "this daemon's certificate chain (PEM); {role} stands for the process's role (trainer, oracle, embedding, "
     "dataproc; admin for the chanter CLI), so one job file names a certificate per role"},
    {"tls.key_file", T_STR, "", 0, 0, NULL, "this daemon's private key (PEM); {role} as in tls.cert_file"},
    {"tls.require_client_cert", T_BOOL, "true", 0, 0, NULL, "servers refuse clients without a certificate from tls.ca_file (mutual TLS)"},
    {"tls.server_name", T_STR, "", 0, 0, NULL, "name expected in servers' certificates (default: the host in the address)"},
    {"tls.insecure", T_BOOL, "false", 0, 0, NULL,
     "run plaintext although an address is not loopback (a trusted, isolated network only): without TLS and "
     "without this, a job naming a non-loopback address is refused"},
    /* ---- embedding server ---- */
    {"embedding.data_dir", T_STR, "chanter-data/embedding-%i", 0, 0, NULL,
     "RocksDB data directory; %i is replaced by the shard index"},
    {"embedding.hot_mb", T_INT, "1024", 0, 1 << 24, NULL, "memory tier budget in MiB (rows kept in memory in front of RocksDB)"},
    {"embedding.block_cache_mb", T_INT, "256", 0, 1 << 24, NULL, "RocksDB block cache in MiB"},
    {"embedding.sync_writes", T_BOOL, "true", 0, 0, NULL,
     "fsync the write-ahead log before acknowledging a WriteBack (false: survives a process crash, not a power loss)"},
    {"embedding.metrics_port_offset", T_INT, "1000", 0, 60000, NULL,
     "Prometheus endpoint port = RPC port + this (0 = a free port, printed at start)"},
    {"embedding.drain_ms", T_INT, "5000", 0, 600000, NULL, "on SIGTERM, how long in-flight calls may finish"},
    {"embedding.disk_full_timeout_s", T_INT, "600", 1, 604800, NULL,
     "how long the job waits for a server whose data dir is full: its writes and checkpoints are answered "
     "RESOURCE_EXHAUSTED, the trainers and the oracle retry them and the job is paused (status, log, "
     "chanter_oracle_embedding_disk_full); once space is freed it goes on by itself; after this long the job "
     "fails, naming the server and its data dir"},
    {"embedding.max_lookup_keys", T_INT, "1048576", 1, 1 << 26, NULL,
     "keys one Lookup call may carry (8 MiB of keys); larger calls are refused before anything is allocated for "
     "them. A step needs at most batch_size x the tables' hotness keys (26,624 for the default job), a trainer's "
     "prefetch at most cache_rows (1,000,000 by default); common/embc.c, which every trainer, the oracle and the "
     "CLI use, cuts any larger call (an evaluation's rows, reshard) into calls of at most this many keys"},
    {"embedding.max_write_keys", T_INT, "262144", 1, 1 << 26, NULL,
     "keys one WriteBack call may carry; its rows are keys x the row size (vector + optimizer state: 128 B for "
     "dim 16 with Adagrad, so 34 MiB with the keys). A step writes back at most the keys it looked up; "
     "common/embc.c cuts larger writes (the cache flushed at a checkpoint, reshard) into calls of at most this "
     "many keys"},
    {"embedding.max_blob_mb", T_INT, "64", 1, 2047, NULL,
     "largest PutBlob payload in MiB: the trainers' dense checkpoint (parameters and optimizer state: ~6 MiB for "
     "the default DLRM with Adam; raise it for a dense model of more than ~5M parameters with Adam) and the "
     "oracle's job and state blobs (KiBs to a few MiB)"},
    /* ---- oracle ---- */
    {"oracle.metrics_port_offset", T_INT, "1000", 0, 60000, NULL,
     "Prometheus endpoint port = RPC port + this (0 = a free port, printed at start)"},
    {"oracle.drain_ms", T_INT, "5000", 0, 600000, NULL, "on SIGTERM, how long in-flight calls may finish"},
    {"oracle.state_dir", T_STR, "", 0, 0, NULL,
     "where the oracle keeps a copy of every checkpoint's manifest (empty: only on the embedding servers)"},
    {"oracle.window", T_INT, "4", 1, 1024, NULL, "steps the oracle sends a trainer ahead of its reports"},
    {"oracle.max_lookahead", T_INT, "64", 0, 4096, NULL, "the largest L lookahead = auto may choose"},
    {"oracle.laia_window", T_INT, "64", 1, 1000000, NULL,
     "allocation = laia: a row is held by the trainer that alone used it within this many batches"},
    {"oracle.laia_profile", T_INT, "16", 0, 1000000, NULL,
     "allocation = laia: batches that score every table before keeping the useful ones (0: every table, always)"},
    {"oracle.laia_min_share", T_FLOAT, "0.01", 0, 1, NULL,
     "allocation = laia: a table stays scored if this share of its ids found a held row during the profile"},
    {"oracle.measure_batches", T_INT, "128", 1, 100000, NULL,
     "the measured batches: lookahead = auto measures the cache each L needs over this many first batches of "
     "the run (and table_strategy = auto each table's traffic)"},
    {"oracle.heartbeat_timeout_ms", T_INT, "10000", 100, 3600000, NULL,
     "a trainer silent this long (no heartbeat, no message) is taken for hung: the job recovers without it"},
    {"oracle.max_recoveries", T_INT, "5", 0, 1000000, NULL,
     "the job fails instead of recovering once it recovered this many times within oracle.recovery_window_s "
     "(0: no limit)"},
    {"oracle.recovery_window_s", T_INT, "600", 1, 86400000, NULL, "the window of oracle.max_recoveries"},
    {"oracle.start_timeout_ms", T_INT, "60000", 100, 3600000, NULL, "how long the oracle waits for every trainer to register"},
    /* ---- the table strategy's knobs (table_strategy above; common/strategy.h) ---- */
    {"strategy.auto_cost", T_ENUM, "bytes", 0, 0, "model|bytes",
     "table_strategy = auto weighs the cache against partitioning by: bytes = the bytes each moves, weighted by "
     "strategy.cache_weight and strategy.step_kb; model = the microseconds the cost model (shard.cost_model: its "
     "trainer, server and collective parts) predicts (bytes when the model lacks a part, with a warning; "
     "docs/autoshard.md says why bytes is the default)"},
    {"strategy.cache_weight", T_FLOAT, "10", 0, 1e6, NULL,
     "table_strategy = auto with strategy.auto_cost = bytes: what a byte of rows the cache moves (fetched, written back, synchronized) costs "
     "against a byte of pooled embeddings between trainers (chanter bench e2e measures both)"},
    {"strategy.step_kb", T_INT, "1024", 0, 1 << 30, NULL,
     "table_strategy = auto with strategy.auto_cost = bytes: what running the cache, or partitioning, costs every step whatever its bytes, in KB "
     "of pooled embeddings between trainers"},
    {"strategy.partition_mb", T_INT, "2048", 0, 1 << 24, NULL,
     "table_strategy = auto partitions a table only while the partitioned rows each trainer holds stay within "
     "this many MiB: a table over it is spread over every trainer (partition_rows), or cached if even that does "
     "not fit"},
    {"strategy.partition_on_device", T_ENUM, "auto", 0, 0, "auto|off",
     "device = cuda, table_strategy = partition | partition_rows: auto keeps the rows a trainer holds, their "
     "pooling over the global batch, their fold and their row update in GPU memory (on the host when they do "
     "not fit); off keeps them in host memory, pooled and updated on the host's CPUs.  The same bits either way"},
    /* ---- trainer ---- */
    {"trainer.metrics_port", T_INT, "0", 0, 65535, NULL, "Prometheus endpoint of a trainer (0 = a free port, printed at start)"},
    {"trainer.heartbeat_ms", T_INT, "1000", 10, 600000, NULL, "how often trainers send a heartbeat to the oracle"},
    {"trainer.rejoin_timeout_ms", T_INT, "300000", 1000, 86400000, NULL,
     "after a recovery or the oracle's loss, how long a trainer keeps trying to join the job again before it exits"},
    {"trainer.coll_timeout_ms", T_INT, "60000", 100, 3600000, NULL,
     "a collective (all-reduce, barrier) that does not complete in this time fails the trainer"},
    {"trainer.device_mb", T_INT, "-1", -1, 1 << 24, NULL,
     "device = cuda, train --local: MiB of GPU memory for the embedding tables (rows and their optimizer "
     "state); tables go to the GPU smallest first while they fit, the others stay in host memory and are "
     "pooled and updated on the CPU (same bits either way, slower).  -1 = what the GPU has free once the "
     "model and the step's buffers are allocated, less 5% of its memory (at least 512 MiB) for cuBLAS, the "
     "allocator and other processes; 0 = every table on the host"},
    {"trainer.bucket_kb", T_INT, "1024", 0, 1048576, NULL,
     "dense gradients are all-reduced in buckets of this size while the backward runs (0 = one buffer after "
     "the backward); part of the job: with 3+ trainers another size may change the last bits"},
    {"trainer.comm_schedule", T_ENUM, "threads", 0, 0, "threads|priority",
     "threads: each thread issues its own collectives (the dense all-reduce's thread, the partitioned tables' own "
     "group, the background); priority: one queue per trainer runs every collective, the next step's AlltoAll and "
     "critical rows first, then dense buckets, then delayed rows, the trainers agreeing on the order before each "
     "(one small allgather: on 2 shared cores it cost 5-15% in bench e2e); the same bits either way"},
    {"trainer.comm_chunk_kb", T_INT, "256", 1, 1048576, NULL,
     "comm_schedule = priority: the delayed rows' all-reduce is cut into operations of this size, so that more "
     "urgent ones can go between them"},
    /* ---- data processor ---- */
    {"dataproc.metrics_port_offset", T_INT, "1000", 0, 60000, NULL,
     "Prometheus endpoint port = RPC port + this (0 = a free port, printed at start)"},
    {"dataproc.build_threads", T_INT, "0", 0, 64, NULL,
     "threads that build batches in a data processor (0 = the CPUs it may use, at most 8); a stream builds up to "
     "max(4, this) batches ahead, in parallel, and sends them in order (the same bytes whatever the count); "
     "processors sharing a host share its CPUs: on a small one set it so that they do not oversubscribe it"},
    {"dataproc.drain_ms", T_INT, "5000", 0, 600000, NULL, "on SIGTERM, how long in-flight calls may finish"},
    {"dataproc.max_batch_samples", T_INT, "0", 0, 1 << 22, NULL,
     "samples one GetBatch or StreamBatches request may ask for (0 = the job's batch_size, at least 16384: the "
     "oracle fetches training and evaluation batches of batch_size, the CLI batch_size or its --batch-size, the "
     "benchmarks 4096 to 16384); larger requests are refused before any sample is read"},
    /* ---- chanter local's supervisor (the units' Restart=, RestartSec=, StartLimit*=, WatchdogSec=) ---- */
    {"local.restart_ms", T_INT, "500", 0, 3600000, NULL,
     "chanter local: a daemon that exits non-zero (but 3) or dies by a signal is restarted after this long, on "
     "its port"},
    {"local.restart_burst", T_INT, "5", 0, 1000, NULL,
     "chanter local: a daemon restarted this many times within local.restart_window_s is left down when it fails "
     "again (0: never restarted)"},
    {"local.restart_window_s", T_INT, "60", 1, 86400, NULL, "chanter local: the window of local.restart_burst"},
    {"local.watchdog_ms", T_INT, "10000", 0, 3600000, NULL,
     "chanter local: a daemon that pinged the watchdog and then fell silent this long is killed (SIGABRT) and "
     "restarted; it pings at half of this (0: no watchdog)"},
    {"local.hosts", T_STR, "", 0, 0, NULL,
     "chanter local up: run the daemons on this many emulated hosts (network namespaces on a bridge; needs root): "
     "auto = trainers + embedding_servers + 1 (one per trainer, one per embedding server, one for the oracle and "
     "the data processors); a number N spreads those slots over N hosts; empty or 0: every daemon on 127.0.0.1"},
    {"local.link", T_STR, "", 0, 0, NULL,
     "chanter local up --hosts: each host's link as RATE,DELAY[,LOSS] (RATE as tc spells it: 1gbit, 100mbit, "
     "500kbit; shaped with tbf in both directions); DELAY and LOSS must be 0 (no netem in this kernel); empty: "
     "unshaped"},
};
#define N_ENTRIES (sizeof entries / sizeof entries[0])

/* Old names of renamed keys.  A job file or --set may still use one: it
 * sets the new key, with a deprecation warning (once per old name) naming
 * the old key, the new one and where it was set; setting both is an error
 * naming both places.  Nothing writes an old name (cfg_dump writes the new
 * one), and the getters know only the new names. */
typedef struct alias_s {
  const char *old, *now;
} alias_t;

static const alias_t aliases[] = {
    {"oracle.auto_probe", "oracle.measure_batches"},
    {"oracle.strategy_cache_weight", "strategy.cache_weight"},
    {"oracle.strategy_step_kb", "strategy.step_kb"},
    {"trainer.partition_mb", "strategy.partition_mb"},
    {"trainer.partition_on_device", "strategy.partition_on_device"},
};
#define N_ALIASES (sizeof aliases / sizeof aliases[0])

#endif
