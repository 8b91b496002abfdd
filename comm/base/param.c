/* The parameter table, its cache, and the sizes parser.  The table's
 * last two columns name each parameter's NCCL twins and how their values
 * map; param_nccl.c does the mapping. */
#include "config.h"
#include "comm/base/param.h"
#include "comm/base/param_nccl.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A NULL-terminated list of NCCL twins, with static storage. */
#define TWINS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const geoParamDesc table[GEO_PARAM_COUNT] = {
    [GEO_PARAM_DEBUG] = {"GEOCCL_DEBUG", GEO_PARAM_STR, "WARN",
                         "log level: NONE, WARN, INFO or TRACE", TWINS("NCCL_DEBUG"),
                         "VERSION is WARN (GeoCCL has no version-only level; geoccl-info "
                         "prints the version), ABORT is INFO; the others as they are"},
    [GEO_PARAM_DEBUG_SUBSYS] = {"GEOCCL_DEBUG_SUBSYS", GEO_PARAM_STR, "ALL",
                                "subsystems logged at INFO/TRACE: INIT,NET,TOPO,TUNING,"
                                "COMPRESS,CUDA,COLL,ENV,ALL; ^ in front excludes",
                                TWINS("NCCL_DEBUG_SUBSYS"),
                                "INIT and BOOTSTRAP are INIT; NET, P2P, SHM and PROXY are NET; "
                                "GRAPH is TOPO; ALLOC, NVLS and REG are CUDA; TUNING, COLL, ENV "
                                "and ALL as they are; others (CALL, PROFILE, RAS, ...) are left "
                                "out, said at INFO; ^ in front excludes, as in NCCL (unset, "
                                "GeoCCL shows ALL, not NCCL's INIT,BOOTSTRAP,ENV)"},
    [GEO_PARAM_DEBUG_TIMESTAMP_FORMAT] = {"GEOCCL_DEBUG_TIMESTAMP_FORMAT", GEO_PARAM_STR, "",
                                          "strftime format of the time that opens a log "
                                          "line of the levels GEOCCL_DEBUG_TIMESTAMP_LEVELS "
                                          "names, local time; %1f to %9f add that many "
                                          "digits of the second's fraction; empty: no time",
                                          TWINS("NCCL_DEBUG_TIMESTAMP_FORMAT"),
                                          "the same format (NCCL's default, \"[%F %T] \", is "
                                          "not GeoCCL's: unset, no time)"},
    [GEO_PARAM_DEBUG_TIMESTAMP_LEVELS] = {"GEOCCL_DEBUG_TIMESTAMP_LEVELS", GEO_PARAM_STR,
                                          "ALL", "levels whose lines get the time of "
                                          "GEOCCL_DEBUG_TIMESTAMP_FORMAT: WARN,INFO,TRACE or "
                                          "ALL; ^ in front excludes",
                                          TWINS("NCCL_DEBUG_TIMESTAMP_LEVELS"),
                                          "the same names (VERSION is WARN, ABORT is INFO; "
                                          "unset, NCCL stamps WARN lines only, GeoCCL all)"},
    [GEO_PARAM_DEBUG_FILE] = {"GEOCCL_DEBUG_FILE", GEO_PARAM_STR, "",
                              "file the log goes to instead of standard error, %h the host "
                              "name and %p the process id in its name (truncated when "
                              "opened; a process forked after its parent logged keeps "
                              "the parent's file); empty, or a file that cannot be "
                              "opened (said on standard error): standard error",
                              TWINS("NCCL_DEBUG_FILE"), "the same name pattern"},
    [GEO_PARAM_TIMEOUT] = {"GEOCCL_TIMEOUT", GEO_PARAM_INT, "300",
                           "seconds an operation may wait without progress before it fails"},
    [GEO_PARAM_NSTREAMS] = {"GEOCCL_NSTREAMS", GEO_PARAM_INT, "2",
                            "TCP connections per peer pair (1..64); rank 0's value is used by "
                            "all; unset, fast WAN pairs use only as many as the probe finds "
                            "they need",
                            TWINS("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"),
                            "their product (one unset counts as 1; NCCL's caps apply: 16 "
                            "threads, 64 sockets); it counts as set, so the probe does not "
                            "lower it"},
    [GEO_PARAM_SOCKET_IFNAME] = {"GEOCCL_SOCKET_IFNAME", GEO_PARAM_STR, NULL,
                                 "interfaces to use: prefixes, =exact, ^ excludes (as NCCL)",
                                 TWINS("NCCL_SOCKET_IFNAME"), NULL},
    [GEO_PARAM_COMM_ID] = {"GEOCCL_COMM_ID", GEO_PARAM_STR, NULL,
                           "host:port of the bootstrap root; rank 0 listens there",
                           TWINS("NCCL_COMM_ID"), NULL},
    [GEO_PARAM_COMM_SECRET] = {"GEOCCL_COMM_SECRET", GEO_PARAM_STR, NULL,
                               "passphrase all ranks of a GEOCCL_COMM_ID bootstrap share (stretched "
                               "with scrypt; 64 hex digits are used as a 256-bit key); "
                               "required with GEOCCL_COMM_ID (see GEOCCL_INSECURE_NO_SECRET)"},
    [GEO_PARAM_INSECURE_NO_SECRET] = {"GEOCCL_INSECURE_NO_SECRET", GEO_PARAM_INT, "0",
                                      "1: a GEOCCL_COMM_ID communicator may run without "
                                      "GEOCCL_COMM_SECRET (logged at WARN): any process that "
                                      "can reach the address can then join as any rank; only "
                                      "for ranks of one trusted host (init refuses ranks on "
                                      "other hosts and encrypted connections)"},
    [GEO_PARAM_CHUNK_SIZE] = {"GEOCCL_CHUNK_SIZE", GEO_PARAM_INT, "512K",
                              "bytes per pipelined chunk in ring algorithms"},
    [GEO_PARAM_WINDOW] = {"GEOCCL_WINDOW", GEO_PARAM_INT, "8",
                          "chunks in flight per ring step"},
    [GEO_PARAM_SOCKET_BUFSIZE] = {"GEOCCL_SOCKET_BUFSIZE", GEO_PARAM_INT, "0",
                                  "SO_SNDBUF/SO_RCVBUF per connection (set before connect, if "
                                  "net.core.*mem_max allows); 0: the kernel's autotuning",
                                  TWINS("NCCL_SOCKET_SNDBUF", "NCCL_SOCKET_RCVBUF"),
                                  "the larger of the two (GeoCCL sets one size for both "
                                  "directions); below 1 (NCCL's default -1) is 0"},
    [GEO_PARAM_TCP_CC] = {"GEOCCL_TCP_CC", GEO_PARAM_STR, NULL,
                          "TCP congestion control of GeoCCL's connections (TCP_CONGESTION, "
                          "e.g. cubic; one the kernel allows); unset: the host's default"},
    [GEO_PARAM_WAN_CC] = {"GEOCCL_WAN_CC", GEO_PARAM_STR, "auto",
                          "TCP congestion control of the connections between regions, set "
                          "once the regions are known (before the warm-up); auto: per pair of "
                          "regions from the loss the probe counted (cubic where the loss it "
                          "cannot rule out still leaves cubic the rate the pair needs, bbr "
                          "elsewhere and where unmeasured), and after init a pair moves from "
                          "bbr to cubic once its own counts show cubic would do; a name "
                          "(cubic, bbr, reno) forces it; host: leave them as the others "
                          "(GEOCCL_TCP_CC or the host's default)"},
    [GEO_PARAM_WAN_WARMUP] = {"GEOCCL_WAN_WARMUP", GEO_PARAM_INT, "2",
                              "at init, the WAN connections of the hierarchical exchange carry "
                              "a short transfer (10 RTTs) so that their congestion control "
                              "starts at the link's rate: 2 on pairs of regions whose "
                              "connections each carry 50 Mbit/s or more, 1 on every pair, 0 "
                              "never; rank 0's value is used by all"},
    [GEO_PARAM_ENCRYPT] = {"GEOCCL_ENCRYPT", GEO_PARAM_STR, "wan",
                           "authenticated encryption of frames: wan (every pair of ranks not "
                           "proven to share a host: another kernel, another network "
                           "namespace, or no same-host socket; region labels do not count), "
                           "all (every connection), off; a pair is encrypted when either "
                           "end asks"},
    [GEO_PARAM_CIPHER] = {"GEOCCL_CIPHER", GEO_PARAM_STR, "auto",
                          "cipher of encrypted frames: auto (AES-256-GCM with AES "
                          "instructions at both ends, else ChaCha20-Poly1305), aes-256-gcm, "
                          "chacha20-poly1305"},
    [GEO_PARAM_REGION] = {"GEOCCL_REGION", GEO_PARAM_STR, NULL,
                          "this process's region label (wins over the topology file)"},
    [GEO_PARAM_TOPO_FILE] = {"GEOCCL_TOPO_FILE", GEO_PARAM_STR, NULL,
                             "topology file mapping ranks/hosts to regions, with link rates; when "
                             "the file does not exist, rank 0 writes what the probe found "
                             "there, and the next start loads it instead of probing; its "
                             "regions shape the plan, never which connections are encrypted"},
    [GEO_PARAM_ALGO] = {"GEOCCL_ALGO", GEO_PARAM_STR, "auto",
                        "all-reduce algorithm: auto, flat (ring) or hier (hierarchical)",
                        TWINS("NCCL_ALGO"),
                        "Ring alone (for every collective, or in an allreduce: entry) is "
                        "flat; Tree, CollNet, NVLS and PAT have no counterpart: a list naming "
                        "them, or a ^ exclusion, keeps auto, said at INFO"},
    [GEO_PARAM_HIER_SLICE] = {"GEOCCL_HIER_SLICE", GEO_PARAM_INT, "4M",
                              "bytes per pipelined slice of the hierarchical all-reduce"},
    [GEO_PARAM_DIRECT_MAX] = {"GEOCCL_DIRECT_MAX", GEO_PARAM_INT, "16K",
                              "all-reduces up to this many bytes (and <= 32 ranks) send every "
                              "input to every rank: one message latency, unless the plan "
                              "chose the hierarchical algorithm; 0 turns it off"},
    [GEO_PARAM_COMPRESS] = {"GEOCCL_COMPRESS", GEO_PARAM_STR, "none",
                            "codec between regions: none, lossless, fp16, bf16, int8, int4, "
                            "sign, topk:<k>; lossy ones only on float sum/avg"},
    [GEO_PARAM_EF] = {"GEOCCL_EF", GEO_PARAM_INT, "1",
                      "error feedback for lossy codecs: 1 both trips, 0 off, 2 only the "
                      "return trip, 3 only the first trip; unset: 3 for sign, 1 for the "
                      "others"},
    [GEO_PARAM_EF_KEY] = {"GEOCCL_EF_KEY", GEO_PARAM_STR, "registered",
                          "which buffers keep error-feedback residuals: registered (only "
                          "memory given to geocclCommRegisterErrorFeedback) or address (any "
                          "buffer, keyed by its address and size: only for programs whose "
                          "compressed all-reduces always use the same buffers)"},
    [GEO_PARAM_EF_MAX_BYTES] = {"GEOCCL_EF_MAX_BYTES", GEO_PARAM_INT, "1G",
                                "bound on error-feedback residuals per communicator; least "
                                "recently used ones are dropped beyond it"},
    [GEO_PARAM_COMPRESS_BLOCK] = {"GEOCCL_COMPRESS_BLOCK", GEO_PARAM_INT, "256",
                                  "elements per scale for int8, int4 and sign (multiple of 8)"},
    [GEO_PARAM_COMPRESS_STOCHASTIC] = {"GEOCCL_COMPRESS_STOCHASTIC", GEO_PARAM_INT, "0",
                                       "int8/int4: 0 rounds to nearest; any other value is the "
                                       "seed of reproducible stochastic rounding"},
    [GEO_PARAM_PROBE] = {"GEOCCL_PROBE", GEO_PARAM_INT, "1",
                         "topology probe at init: 1 finds regions by RTT when no labels are "
                         "given and measures WAN bandwidth unless a topology file gives it; "
                         "2 always measures; 0 never"},
    [GEO_PARAM_PROBE_ROUNDS] = {"GEOCCL_PROBE_ROUNDS", GEO_PARAM_INT, "5",
                                "round trips per node pair in the probe (the minimum is kept)"},
    [GEO_PARAM_PROBE_LANDMARKS] = {"GEOCCL_PROBE_LANDMARKS", GEO_PARAM_INT, "16",
                                   "probe: with more than twice this many nodes, round trips "
                                   "are measured from every node to this many landmarks, then "
                                   "among the nodes they left unplaced, not between every pair "
                                   "(topology/cluster.h); rank 0's value is used by all"},
    [GEO_PARAM_NCCL_LIB] = {"GEOCCL_NCCL_LIB", GEO_PARAM_STR, NULL,
                            "NVIDIA's libnccl.so used inside a region for device buffers; "
                            "unset: libnccl.so.2, libnccl.so, then configure's NCCL directory"},
    [GEO_PARAM_CUDA_CODECS] = {"GEOCCL_CUDA_CODECS", GEO_PARAM_INT, "1",
                               "device buffers across regions: 1 encodes and decodes on the "
                               "GPU (cuda/, every codec but lossless); 0 copies the shard to "
                               "the host and compresses there; the same on every rank"},
    [GEO_PARAM_NCCL_INIT] = {"GEOCCL_NCCL_INIT", GEO_PARAM_STR, "auto",
                             "when NVIDIA's NCCL communicator of a region is made: auto (at "
                             "init when every rank of the region has a GPU of its own and "
                             "NCCL, else at the first device-buffer call), eager (at init, "
                             "or init fails saying why), lazy (at the first device-buffer "
                             "call); rank 0's value is used by all"},
    [GEO_PARAM_KEEPALIVE] = {"GEOCCL_KEEPALIVE", GEO_PARAM_INT, "60",
                             "seconds a TCP connection may idle before keepalive probes go "
                             "out (then every 10 s, 6 unanswered end it), so that NAT tables "
                             "and firewalls keep idle connections between training steps; "
                             "0: the system's keepalive settings"},
    [GEO_PARAM_RECONNECT_TIMEOUT] = {"GEOCCL_RECONNECT_TIMEOUT", GEO_PARAM_INT, "60",
                                     "seconds a TCP connection that was reset (by a NAT "
                                     "gateway, a firewall, a route change) may take to be "
                                     "dialled again and resumed, nothing lost or repeated; a "
                                     "peer whose process is gone is an error at once; 0: a "
                                     "reset is an error at once"},
    [GEO_PARAM_CONNECT] = {"GEOCCL_CONNECT", GEO_PARAM_STR, "auto",
                           "which connections init opens: all (every pair of ranks), lazy "
                           "(only those the plans use: ring neighbours, the hierarchical "
                           "exchange's partners, a small region's same-host ranks; any other "
                           "pair connects on its first message, the higher rank dialling), "
                           "auto (all up to 16 ranks, lazy beyond); rank 0's value is used "
                           "by all"},
    [GEO_PARAM_RESUME_BUFFER] = {"GEOCCL_RESUME_BUFFER", GEO_PARAM_INT, "64M",
                                 "bytes kept per peer (shared by its TCP connections) of what "
                                 "was sent until the receiver acknowledges them, so that they "
                                 "can be sent again after a reset; beyond it a reset before "
                                 "the receiver has caught up is an error"},
    [GEO_PARAM_HIER_SHARES] = {"GEOCCL_HIER_SHARES", GEO_PARAM_STR, "auto",
                               "how the hierarchical all-reduce splits each piece among "
                               "regions: auto (by their measured WAN rates, when 3 or more "
                               "regions' rates differ: the slowest link carries least) or "
                               "equal; the same on every rank (rank 0's plan)"},
    [GEO_PARAM_WAN_PACE] = {"GEOCCL_WAN_PACE", GEO_PARAM_INT, "1",
                            "1: where the probe (or the topology file's in=) found a region's "
                            "downlink slower than what the others send it, the hierarchical "
                            "all-reduce paces each connection into that region at its part "
                            "of the downlink's rate, so that a policing downlink does not "
                            "drop the excess; in uncompressed calls that keep the uplink busy "
                            "0.5 s or more, each connection to another region is also capped "
                            "at its share of its region's uplink, and its BBR is started again "
                            "before its 10 s PROBE_RTT window ends; 0: no pacing"},
    [GEO_PARAM_REPLAN] = {"GEOCCL_REPLAN", GEO_PARAM_INT, "2",
                          "the plan follows the links while the job runs: after this many "
                          "large hierarchical all-reduces in a row in which a region's uplink "
                          "carried a rate outside GEOCCL_REPLAN_BAND of the plan's figure, "
                          "the plan (shares, codecs, chunks, pacing) is made again from "
                          "what the calls achieved, on every rank after the same call; "
                          "0: the plan made at init is kept"},
    [GEO_PARAM_REPLAN_BAND] = {"GEOCCL_REPLAN_BAND", GEO_PARAM_INT, "25",
                               "percent by which a region's achieved uplink rate must differ "
                               "from the plan's figure to count toward a new plan "
                               "(GEOCCL_REPLAN)"},
    [GEO_PARAM_REPLAN_MIN_MS] = {"GEOCCL_REPLAN_MIN_MS", GEO_PARAM_INT, "250",
                                 "only hierarchical all-reduces whose WAN time the plan puts "
                                 "at this many milliseconds or more are observed for "
                                 "GEOCCL_REPLAN (smaller calls are too short to measure a "
                                 "rate)"},
    [GEO_PARAM_HIER_DEPTH] = {"GEOCCL_HIER_DEPTH", GEO_PARAM_INT, "0",
                              "slices of the hierarchical all-reduce in flight between regions "
                              "(a slice's partials are reduced this many slices after they are "
                              "sent); 0: a quarter of the slices, at least 2, at most 16; the "
                              "same on every rank"},
    [GEO_PARAM_SHM] = {"GEOCCL_SHM", GEO_PARAM_INT, "1",
                       "same-host fast path between ranks of one host AND one network "
                       "namespace (other namespaces, e.g. emulated regions, always use TCP): "
                       "1 AF_UNIX sockets with frames through shared-memory rings, 2 AF_UNIX "
                       "sockets only, 0 off (TCP)", TWINS("NCCL_SHM_DISABLE"),
                       "1 is 0 (TCP between ranks of one host), 0 is 1"},
    [GEO_PARAM_HOST_COLL] = {"GEOCCL_HOST_COLL", GEO_PARAM_INT, "1",
                             "collectives of a communicator whose ranks all share one host "
                             "(and GEOCCL_SHM != 0) through one shared-memory segment: 1 where "
                             "the cost model measured at init predicts them faster than "
                             "messages, 2 at every size, 0 never; the least value among the "
                             "ranks holds"},
    [GEO_PARAM_CMA] = {"GEOCCL_CMA", GEO_PARAM_INT, "1",
                       "1: ranks of one region on one host read each other's inputs with "
                       "process_vm_readv and write each other's outputs with process_vm_writev "
                       "in the hierarchical all-reduce (checked at init; "
                       "where the kernel refuses, the ring is used); 0: never"},
    [GEO_PARAM_NODE_RANKS] = {"GEOCCL_NODE_RANKS", GEO_PARAM_INT, "0",
                              "ranks per node for the hierarchical all-reduce's node stage: "
                              "each run of this many ranks of a region (in rank order) is one "
                              "node; 0: ranks with the same host name and boot id; the same "
                              "on every rank"},
    [GEO_PARAM_ELASTIC_ETCD] = {"GEOCCL_ELASTIC_ETCD", GEO_PARAM_STR, NULL,
                                "host:port,host:port,...: the etcd members (v3 JSON gateway, "
                                "plain HTTP) that keep the job's membership (docs/elastic.md); "
                                "tried in order, so list the nearest first; unset (with "
                                "GEOCCL_ELASTIC_JOB set): the process holding the first bootstrap "
                                "root keeps it, at GEOCCL_COMM_ID's port + 1"},
    [GEO_PARAM_ELASTIC_JOB] = {"GEOCCL_ELASTIC_JOB", GEO_PARAM_STR, "geoccl",
                               "the job's name: its records in the store are under "
                               "/geoccl/<job>/; jobs sharing a store need names of their own; "
                               "set without GEOCCL_ELASTIC_ETCD, rank 0's process keeps the "
                               "records (GEOCCL_ELASTIC_ETCD)"},
    [GEO_PARAM_ELASTIC_TTL] = {"GEOCCL_ELASTIC_TTL", GEO_PARAM_INT, "3",
                               "seconds a process's lease in the store lives without renewal "
                               "(renewed every third of it): a killed process leaves the "
                               "membership this long after its last renewal"},
    [GEO_PARAM_ELASTIC_POLL_MS] = {"GEOCCL_ELASTIC_POLL_MS", GEO_PARAM_INT, "500",
                                   "milliseconds between the background reads of the store "
                                   "that geocclCommJoinersWaiting reports, and between a "
                                   "joiner's looks for its admission"},
    [GEO_PARAM_ELASTIC_TIMEOUT] = {"GEOCCL_ELASTIC_TIMEOUT", GEO_PARAM_INT, "60",
                                   "seconds geocclCommGetFailedRanks waits for the survivors "
                                   "to settle the dead set, and one store request may take "
                                   "over all members"},
    [GEO_PARAM_ELASTIC_JOIN_TIMEOUT] = {"GEOCCL_ELASTIC_JOIN_TIMEOUT", GEO_PARAM_INT, "600",
                                        "seconds geocclCommJoin waits for the members to "
                                        "admit it (they do between rounds), then for its "
                                        "new communicator to form"},
};

static pthread_mutex_t param_lock = PTHREAD_MUTEX_INITIALIZER;
/* A variable hidden from another library (geoParamEnvHide): its name, how
 * many hides hold it now, and its value, which the live reads here take
 * while it is hidden.  Values are kept for the process's life (one per
 * distinct value): a live read may still hold one after the restore. */
typedef struct envKept {
    char *value;
    struct envKept *next;
} envKept;
static pthread_mutex_t env_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *env_hidden_name;
static int env_hides;
static const char *env_hidden_value;
static envKept *env_kept;
static int loaded;
static unsigned generation; /* atomic: loads so far (geoParamGeneration) */
static int64_t int_values[GEO_PARAM_COUNT];
static char *str_values[GEO_PARAM_COUNT];
static int is_set[GEO_PARAM_COUNT];
static char *nccl_origin[GEO_PARAM_COUNT]; /* the twins a value came from */
static char *nccl_note[GEO_PARAM_COUNT];   /* what a twin set could not say */

int geoParseSize(const char *s, int64_t *out)
{
    char *end;
    long long v;

    if (s == NULL)
        return -1;
    errno = 0;
    v = strtoll(s, &end, 0);
    if (errno != 0 || end == s)
        return -1;
    switch (toupper((unsigned char)*end)) {
    case 'K': v <<= 10; end++; break;
    case 'M': v <<= 20; end++; break;
    case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (toupper((unsigned char)*end) == 'I')
        end++;
    if (toupper((unsigned char)*end) == 'B')
        end++;
    if (*end != '\0')
        return -1;
    *out = v;
    return 0;
}

static void load_locked(void)
{
    if (loaded)
        return;
    for (int i = 0; i < GEO_PARAM_COUNT; i++) {
        const char *env = getenv(table[i].name);
        char twin[256], from[256], note[512];
        free(nccl_origin[i]);
        free(nccl_note[i]);
        nccl_origin[i] = nccl_note[i] = NULL;
        if (table[i].nccl != NULL && env == NULL) {
            if (geoParamNcclRead((geoParamId)i, twin, sizeof(twin), from, sizeof(from), note,
                                 sizeof(note)) == 1) {
                env = twin;
                nccl_origin[i] = strdup(from);
            }
            if (note[0] != '\0')
                nccl_note[i] = strdup(note);
        } else if (table[i].nccl != NULL && geoParamNcclFirstSet((geoParamId)i) != NULL) {
            snprintf(note, sizeof(note), "%s is set too: %s=%s wins",
                     geoParamNcclFirstSet((geoParamId)i), table[i].name, env);
            nccl_note[i] = strdup(note);
        }
        const char *txt = env ? env : table[i].dflt;
        free(str_values[i]);
        str_values[i] = txt ? strdup(txt) : NULL;
        is_set[i] = env != NULL;
        int_values[i] = 0;
        if (table[i].type == GEO_PARAM_INT) {
            if (geoParseSize(txt, &int_values[i]) != 0) {
                /* The default always parses. */
                geoParseSize(table[i].dflt, &int_values[i]);
                if (env)
                    fprintf(stderr, "[geoccl] WARN %s%s%s is not a number; using %s\n",
                            nccl_origin[i] ? nccl_origin[i] : table[i].name,
                            nccl_origin[i] ? ", read as " : "=",
                            nccl_origin[i] ? table[i].name : env, table[i].dflt);
            }
        }
    }
    loaded = 1;
    __atomic_add_fetch(&generation, 1, __ATOMIC_RELEASE);
}

static void ensure_loaded(void)
{
    pthread_mutex_lock(&param_lock);
    if (!loaded)
        load_locked();
    pthread_mutex_unlock(&param_lock);
}

unsigned geoParamGeneration(void)
{
    unsigned g = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    if (g == 0) { /* read on every log line: no lock once loaded */
        ensure_loaded();
        g = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
    }
    return g;
}

/* Values are read under the lock: geoParamReload (ncclResetDebugInit)
 * rewrites them while other threads (a bootstrap root, a proxy) may read. */
int64_t geoParamInt(geoParamId id)
{
    pthread_mutex_lock(&param_lock);
    if (!loaded)
        load_locked();
    int64_t v = int_values[id];
    pthread_mutex_unlock(&param_lock);
    return v;
}

const char *geoParamStr(geoParamId id)
{
    pthread_mutex_lock(&param_lock);
    if (!loaded)
        load_locked();
    const char *v = str_values[id];
    pthread_mutex_unlock(&param_lock);
    return v;
}

/* getenv, or the value of a variable hidden now (env_lock held). */
static const char *live_env(const char *name)
{
    const char *v = getenv(name);
    if (v == NULL && env_hides > 0 && strcmp(name, env_hidden_name) == 0)
        v = env_hidden_value;
    return v;
}

const char *geoParamStrLive(geoParamId id)
{
    pthread_mutex_lock(&env_lock);
    const char *v = live_env(table[id].name);
    if (v == NULL && table[id].nccl != NULL && table[id].nccl_map == NULL) {
        /* the first twin set, as geoParamNcclFirstSet, hidden ones too */
        for (int k = 0; v == NULL && table[id].nccl[k] != NULL; k++) {
            const char *t = live_env(table[id].nccl[k]);
            v = t && t[0] ? t : NULL;
        }
    }
    pthread_mutex_unlock(&env_lock);
    return v ? v : table[id].dflt;
}

int geoParamEnvHide(const char *name)
{
    pthread_mutex_lock(&env_lock);
    if (env_hides > 0 && strcmp(name, env_hidden_name) != 0) {
        pthread_mutex_unlock(&env_lock);
        return -1;
    }
    if (env_hides == 0) {
        const char *v = getenv(name), *keep = NULL;
        if (v != NULL) {
            envKept *k = env_kept;
            while (k != NULL && strcmp(k->value, v) != 0)
                k = k->next;
            if (k == NULL) {
                k = calloc(1, sizeof(*k));
                if (k == NULL || (k->value = strdup(v)) == NULL) {
                    free(k);
                    pthread_mutex_unlock(&env_lock);
                    return -1; /* out of memory: left visible */
                }
                k->next = env_kept;
                env_kept = k;
            }
            keep = k->value;
            unsetenv(name);
        }
        env_hidden_name = name;
        env_hidden_value = keep;
    }
    env_hides++;
    pthread_mutex_unlock(&env_lock);
    return 0;
}

void geoParamEnvRestore(const char *name)
{
    pthread_mutex_lock(&env_lock);
    if (env_hides > 0 && strcmp(name, env_hidden_name) == 0 && --env_hides == 0 &&
        env_hidden_value != NULL && getenv(name) == NULL)
        setenv(name, env_hidden_value, 1);
    pthread_mutex_unlock(&env_lock);
}

int geoParamIsSet(geoParamId id)
{
    pthread_mutex_lock(&param_lock);
    if (!loaded)
        load_locked();
    int v = is_set[id];
    pthread_mutex_unlock(&param_lock);
    return v;
}

const char *geoParamSetting(geoParamId id, char *buf, size_t len)
{
    pthread_mutex_lock(&param_lock);
    if (!loaded)
        load_locked();
    if (nccl_origin[id] != NULL)
        snprintf(buf, len, "%s, read as %s", nccl_origin[id], table[id].name);
    else if (is_set[id])
        snprintf(buf, len, "%s=%s", table[id].name, str_values[id]);
    else
        snprintf(buf, len, "%s unset", table[id].name);
    pthread_mutex_unlock(&param_lock);
    return buf;
}

const char *geoParamNcclOrigin(geoParamId id)
{
    pthread_mutex_lock(&param_lock);
    if (!loaded)
        load_locked();
    const char *v = nccl_origin[id];
    pthread_mutex_unlock(&param_lock);
    return v;
}

const char *geoParamNcclNote(geoParamId id)
{
    pthread_mutex_lock(&param_lock);
    if (!loaded)
        load_locked();
    const char *v = nccl_note[id];
    pthread_mutex_unlock(&param_lock);
    return v;
}

const geoParamDesc *geoParamDescribe(geoParamId id)
{
    return (id >= 0 && id < GEO_PARAM_COUNT) ? &table[id] : NULL;
}

void geoParamReload(void)
{
    pthread_mutex_lock(&param_lock);
    loaded = 0;
    load_locked();
    pthread_mutex_unlock(&param_lock);
}
