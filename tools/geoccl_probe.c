/*
 * geoccl-probe: measure the links between the ranks of a job, show the
 * regions GeoCCL finds and the plan it would choose.
 *
 *   GEOCCL_COMM_ID=host:port RANK=r NRANKS=n geoccl-probe [--json] [-o FILE]
 *   mpirun -np n -x GEOCCL_COMM_ID=host:port geoccl-probe [--json] [-o FILE]
 *   mpirun -np n geoccl-probe-mpi [--json] [-o FILE]   (MPI carries the id)
 *   geoccl-probe --simulate FILE [--json]              (no ranks, no network)
 *
 * Every rank runs the probe (GEOCCL_PROBE=2 unless set: measure even when
 * labels are given, labels still decide the regions); rank 0 prints the
 * nodes, the RTT matrix between nodes, the regions with their ranks, the
 * bandwidth matrix between regions, the streams a WAN pair needs and the
 * time the probe took, and the plan the cost model chose from those
 * figures.  --simulate prints the plan and predicted times of a described
 * topology (regions, ranks, nodes, rates, RTTs) without running anything,
 * with the hierarchical all-reduce split into its node, region and WAN
 * stages against the WAN bound.
 * -o FILE writes the topology file that, given as
 * GEOCCL_TOPO_FILE, makes the library skip the probe.
 *
 * Exit status: 0 done; 1 the probe or the communicator failed; 2 bad usage.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef GEOCCL_PROBE_MPI
#include <mpi.h>
#define TOOL "geoccl-probe-mpi"
#else
#define TOOL "geoccl-probe"
#endif

#include "geoccl.h"

typedef struct {
    int json;
    const char *out_file;
    const char *simulate;
} probeOptions;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [--json] [-o FILE]\n"
            "       %s --simulate TOPOFILE [--json]\n"

            "Measures RTT and bandwidth between the ranks of a job, finds the regions and\n"
            "prints the plan. Ranks: RANK/NRANKS, OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE\n"
            "with GEOCCL_COMM_ID=host:port of rank 0 (env bootstrap).\n"
            "  --json          machine-readable output\n"
            "  -o FILE         write a topology file (GEOCCL_TOPO_FILE) with what was found\n"
            "  --simulate F    read a described topology and print the plan, predicted\n"
            "                  times and the hierarchical all-reduce's node, region and\n"
            "                  WAN stages without running anything\n",
            TOOL, TOOL);
}

static int parse(int argc, char **argv, probeOptions *o)
{
    memset(o, 0, sizeof(*o));
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            o->json = 1;
        else if (strcmp(argv[i], "-o") == 0 && i + 1 < argc)
            o->out_file = argv[++i];
        else if (strcmp(argv[i], "--simulate") == 0 && i + 1 < argc)
            o->simulate = argv[++i];
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            exit(0);
        } else {
            fprintf(stderr, "%s: unknown or incomplete option '%s'\n", TOOL, argv[i]);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

#ifndef GEOCCL_PROBE_MPI
static int env_ranks(int *rank, int *nranks)
{
    static const char *const pairs[][2] = {
        {"RANK", "NRANKS"}, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"PMI_RANK", "PMI_SIZE"}};
    for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        const char *r = getenv(pairs[i][0]), *n = getenv(pairs[i][1]);
        char *e1, *e2;
        if (r == NULL || n == NULL)
            continue;
        long rv = strtol(r, &e1, 10), nv = strtol(n, &e2, 10);
        if (*r == '\0' || *e1 != '\0' || *n == '\0' || *e2 != '\0' || nv < 1 || rv < 0 ||
            rv >= nv) {
            fprintf(stderr, "%s: %s=%s %s=%s: need 0 <= rank < count\n", TOOL, pairs[i][0], r,
                    pairs[i][1], n);
            return -1;
        }
        *rank = (int)rv;
        *nranks = (int)nv;
        return 0;
    }
    fprintf(stderr, "%s: no rank given: set RANK and NRANKS (or run under mpirun) and "
            "GEOCCL_COMM_ID=host:port of rank 0\n", TOOL);
    return -1;
}
#endif

/* What rank 0 prints, read once from the communicator. */
typedef struct {
    const geocclTopology *t;
    int nranks;
    const int *region_of;   /* [nranks] */
    char (*names)[32];      /* [nregions] labels */
    int have_rtt;
    double *rtt;            /* [N*N] ms */
    double *bw, *rrtt;      /* [R*R] Mbit/s, ms */
    double *eg, *ow, *in;   /* [R] Mbit/s, ms, Mbit/s (0: no ingress limit seen) */
    int warm_pairs;         /* geocclCommGetWarmup */
    const char *wan_cc;     /* geocclCommGetWanCongestion, rank 0's */
    double warm_s;          /* the slowest rank's warm-up */
} probeView;

static void view_free(probeView *v)
{
    free(v->rtt);
    free(v->bw);
    free(v->rrtt);
    free(v->eg);
    free(v->ow);
    free(v->in);
}

static int view_read(ncclComm_t comm, probeView *v)
{
    int N = v->t->nnodes, R = v->t->nregions;
    v->rtt = malloc(sizeof(double) * (size_t)(N > 0 ? N * N : 1));
    v->bw = malloc(sizeof(double) * (size_t)R * (size_t)R);
    v->rrtt = malloc(sizeof(double) * (size_t)R * (size_t)R);
    v->eg = malloc(sizeof(double) * (size_t)R);
    v->ow = malloc(sizeof(double) * (size_t)R);
    v->in = calloc((size_t)R, sizeof(double));
    if (!v->rtt || !v->bw || !v->rrtt || !v->eg || !v->ow || !v->in)
        return -1;
    if (geocclCommGetIngress(comm, v->in) != ncclSuccess)
        return -1;
    v->have_rtt = geocclCommGetRtt(comm, v->rtt) == ncclSuccess;
    return geocclCommGetLinks(comm, v->bw, v->rrtt, v->eg, v->ow) == ncclSuccess ? 0 : -1;
}

static void print_human(ncclComm_t comm, const probeView *v)
{
    const geocclTopology *t = v->t;
    int N = t->nnodes, R = t->nregions, nranks = v->nranks;
    const int *region_of = v->region_of;
    char(*names)[32] = v->names;
    const double *rtt = v->rtt, *bw = v->bw, *rrtt = v->rrtt, *eg = v->eg, *ow = v->ow;
    printf("# %s: %d ranks on %d nodes in %d region%s", TOOL, nranks, N, R, R == 1 ? "" : "s");
    if (t->regionsMeasured)
        printf(", found by RTT (cut %.2f ms)\n", t->rttCutMs);
    else
        printf(", %s\n", R > 1 ? "from labels (GEOCCL_REGION or the topology file)"
                               : "(no gap in the RTTs, or one node)");
    printf("# probe time %.3f s (round trips %.3f s, bandwidth %.3f s), after waiting %.3f s "
           "for the other nodes to start\n", t->secProbe, t->secRtt, t->secBw, t->secWait);
    if (v->wan_cc && v->wan_cc[0])
        printf("# connections between regions: congestion control %s (GEOCCL_WAN_CC)\n",
               v->wan_cc);
    for (int a = 0; a < R; a++)
        for (int b = 0; b < R; b++) {
            const char *cc = "", *why = "";
            double loss = -1;
            if (a != b && geocclCommGetWanPlan(comm, a, b, &cc, &why, &loss) == ncclSuccess &&
                cc[0])
                printf("#   region %d%s%s -> %d%s%s: %s (%s)\n", a, names[a][0] ? " " : "",
                       names[a], b, names[b][0] ? " " : "", names[b], cc, why);
        }
    if (v->warm_pairs > 0)
        printf("# then %.3f s warming the WAN connections of %d pair%s of regions "
               "(GEOCCL_WAN_WARMUP)\n", v->warm_s, v->warm_pairs, v->warm_pairs == 1 ? "" : "s");
    printf("#\n# nodes (NIC: nominal rate of the data interface; - where the kernel does "
           "not say)\n# %4s  %-40s %6s  %-12s %s\n", "node", "address", "leader", "region",
           "NIC Gbit/s");
    for (int k = 0; k < N; k++) {
        const char *addr;
        int leader, g;
        double nic;
        if (geocclCommGetNode(comm, k, &addr, &leader, &g, &nic) == ncclSuccess) {
            char ns[16] = "-";
            if (nic > 0)
                snprintf(ns, sizeof(ns), "%g", nic);
            printf("# %4d  %-40s %6d  %-12s %s\n", k, addr, leader, names[g], ns);
        }
    }
    if (v->have_rtt) {
        printf("#\n# round-trip time between nodes, ms (minimum of the samples; \"?\": not "
               "measured, GEOCCL_PROBE_LANDMARKS)\n#       ");
        for (int j = 0; j < N; j++)
            printf(" %8d", j);
        printf("\n");
        for (int i = 0; i < N; i++) {
            printf("# %5d ", i);
            for (int j = 0; j < N; j++)
                if (i == j)
                    printf(" %8s", "-");
                else if (rtt[i * N + j] < 0)
                    printf(" %8s", "?");
                else
                    printf(" %8.3f", rtt[i * N + j]);
            printf("\n");
        }
    }
    printf("#\n# regions\n");
    for (int g = 0; g < R; g++) {
        printf("# %-12s ranks", names[g]);
        for (int r = 0; r < nranks; r++)
            if (region_of[r] == g)
                printf(" %d", r);
        printf("\n");
    }
    if (R > 1) {
        printf("#\n# links between regions: Mbit/s from row to column, all pairs sending at "
               "once%s\n# %-12s", t->bwMeasured ? "" : " (not measured)", "");
        for (int j = 0; j < R; j++)
            printf(" %10s", names[j]);
        printf(" %10s %10s %10s\n", "egress", "ingress", "one-way ms");
        for (int i = 0; i < R; i++) {
            printf("# %-12s", names[i]);
            for (int j = 0; j < R; j++)
                if (i == j)
                    printf(" %10s", "-");
                else
                    printf(" %10.1f", bw[i * R + j]);
            if (v->in[i] > 0)
                printf(" %10.1f %10.1f %10.2f\n", eg[i], v->in[i], ow[i]);
            else
                printf(" %10.1f %10s %10.2f\n", eg[i], "-", ow[i]);
        }
        printf("# region RTT, ms:");
        for (int i = 0; i < R; i++)
            for (int j = i + 1; j < R; j++)
                printf(" %s-%s %.2f", names[i], names[j], rrtt[i * R + j]);
        printf("\n# streams per WAN pair needed: %d (largest TCP window here %.1f MiB)\n",
               t->streamsNeeded, t->windowBytes / 1048576.0);
    }
    printf("#\n# plan (GEOCCL_ALGO, GEOCCL_COMPRESS, GEOCCL_CHUNK_SIZE force any choice)\n");
    fflush(stdout);
    geocclCommPrintPlan(comm, stdout, 0);
}

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++)
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    putchar('"');
}

static void print_json(ncclComm_t comm, const probeView *v)
{
    const geocclTopology *t = v->t;
    int N = t->nnodes, R = t->nregions, nranks = v->nranks;
    const int *region_of = v->region_of;
    char(*names)[32] = v->names;
    const double *rtt = v->rtt, *bw = v->bw, *rrtt = v->rrtt, *eg = v->eg, *ow = v->ow;
    printf("{\"tool\": \"%s\", \"ranks\": %d, \"nodes\": [", TOOL, nranks);
    for (int k = 0; k < N; k++) {
        const char *addr = "";
        int leader = -1, g = -1;
        double nic = -1;
        geocclCommGetNode(comm, k, &addr, &leader, &g, &nic);
        printf("%s{\"address\": ", k ? ", " : "");
        json_str(addr);
        printf(", \"leader\": %d, \"region\": %d, \"nic_gbit\": %g}", leader, g, nic);
    }
    printf("],\n \"rtt_ms\": ");
    if (v->have_rtt) {
        printf("[");
        for (int i = 0; i < N; i++) {
            printf("%s[", i ? ", " : "");
            for (int j = 0; j < N; j++)
                printf("%s%.4f", j ? ", " : "", rtt[i * N + j]);
            printf("]");
        }
        printf("]");
    } else {
        printf("null");
    }
    printf(",\n \"rtt_measured\": %s, \"regions_measured\": %s, \"from_file\": %s, "
           "\"rtt_cut_ms\": %.4f,\n \"regions\": [",
           t->rttMeasured ? "true" : "false", t->regionsMeasured ? "true" : "false",
           t->fromFile ? "true" : "false", t->rttCutMs);
    for (int g = 0; g < R; g++) {
        printf("%s{\"name\": ", g ? ", " : "");
        json_str(names[g]);
        printf(", \"ranks\": [");
        for (int r = 0, k = 0; r < nranks; r++)
            if (region_of[r] == g)
                printf("%s%d", k++ ? ", " : "", r);
        printf("]}");
    }
    printf("],\n");
    printf(" \"bw_measured\": %s, \"bw_mbit\": [", t->bwMeasured ? "true" : "false");
    for (int i = 0; i < R; i++) {
        printf("%s[", i ? ", " : "");
        for (int j = 0; j < R; j++)
            printf("%s%.3f", j ? ", " : "", bw[i * R + j]);
        printf("]");
    }
    printf("],\n \"region_rtt_ms\": [");
    for (int i = 0; i < R; i++) {
        printf("%s[", i ? ", " : "");
        for (int j = 0; j < R; j++)
            printf("%s%.4f", j ? ", " : "", rrtt[i * R + j]);
        printf("]");
    }
    printf("],\n \"egress_mbit\": [");
    for (int i = 0; i < R; i++)
        printf("%s%.3f", i ? ", " : "", eg[i]);
    printf("], \"ingress_mbit\": [");
    for (int i = 0; i < R; i++)
        printf("%s%.3f", i ? ", " : "", v->in[i]);
    printf("], \"oneway_ms\": [");
    for (int i = 0; i < R; i++)
        printf("%s%.4f", i ? ", " : "", ow[i]);
    printf("],\n \"streams_needed\": %d, \"window_bytes\": %.0f,\n", t->streamsNeeded,
           t->windowBytes);
    printf(" \"probe_s\": %.4f, \"rtt_s\": %.4f, \"bw_s\": %.4f, \"wait_s\": %.4f,\n",
           t->secProbe, t->secRtt, t->secBw, t->secWait);
    printf(" \"warm_pairs\": %d, \"warm_s\": %.4f, \"wan_cc\": \"%s\",\n", v->warm_pairs,
           v->warm_s, v->wan_cc ? v->wan_cc : "");
    /* The congestion control chosen per pair of regions (reasons carry no
     * quote or backslash: they are the library's own words). */
    printf(" \"wan_plan\": [");
    for (int a = 0, first = 1; a < R; a++)
        for (int b = 0; b < R; b++) {
            const char *cc = "", *why = "";
            double loss = -1;
            if (a == b || geocclCommGetWanPlan(comm, a, b, &cc, &why, &loss) != ncclSuccess)
                continue;
            printf("%s{\"from\": %d, \"to\": %d, \"cc\": \"%s\", \"loss\": %.6g, "
                   "\"why\": \"%s\"}", first ? "" : ", ", a, b, cc, loss, why);
            first = 0;
        }
    printf("],\n \"plan\": ");
    fflush(stdout);
    geocclCommPrintPlan(comm, stdout, 1);
    printf("}\n");
}

static int run(const probeOptions *o, int rank, int nranks, ncclUniqueId id)
{
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
    if (r != ncclSuccess) {
        fprintf(stderr, "%s: rank %d: init: %s: %s\n", TOOL, rank, ncclGetErrorString(r),
                ncclGetLastError(NULL));
        return 1;
    }
    geocclTopology t;
    int g = -1, status = 0;
    const char *name = NULL;
    int *region_of = calloc((size_t)nranks, sizeof(int));
    char(*labels)[32] = calloc((size_t)nranks, 32);
    char(*names)[32] = calloc((size_t)nranks, 32);
    char mine[32] = "";
    if (region_of == NULL || labels == NULL || names == NULL) {
        fprintf(stderr, "%s: out of memory\n", TOOL);
        status = 1;
        goto out;
    }
    geocclCommGetTopology(comm, &t);
    geocclCommGetRegion(comm, NULL, &g, NULL, NULL, &name);
    if (name && *name)
        snprintf(mine, sizeof(mine), "%s", name);
    else
        snprintf(mine, sizeof(mine), "default");
    /* Each rank's region and label, for the table (host buffers). */
    r = ncclAllGather(&g, region_of, 1, ncclInt32, comm, NULL);
    if (r == ncclSuccess)
        r = ncclAllGather(mine, labels, 32, ncclChar, comm, NULL);
    int warm_pairs = 0;
    double warm_s = 0;
    geocclCommGetWarmup(comm, &warm_pairs, &warm_s);
    if (r == ncclSuccess)
        r = ncclAllReduce(&warm_s, &warm_s, 1, ncclFloat64, ncclMax, comm, NULL);
    if (r != ncclSuccess) {
        fprintf(stderr, "%s: rank %d: all-gather: %s: %s\n", TOOL, rank, ncclGetErrorString(r),
                ncclGetLastError(comm));
        status = 1;
        goto out;
    }
    for (int q = nranks - 1; q >= 0; q--)
        if (region_of[q] >= 0 && region_of[q] < nranks)
            memcpy(names[region_of[q]], labels[q], 32);
    if (rank == 0) {
        probeView v = {.t = &t, .nranks = nranks, .region_of = region_of, .names = names,
                       .warm_pairs = warm_pairs, .warm_s = warm_s};
        geocclCommGetWanCongestion(comm, &v.wan_cc);
        if (view_read(comm, &v) != 0) {
            fprintf(stderr, "%s: cannot read the topology: %s\n", TOOL, ncclGetLastError(comm));
            status = 1;
        } else if (o->json) {
            print_json(comm, &v);
        } else {
            print_human(comm, &v);
        }
        view_free(&v);
        if (o->out_file) {
            r = geocclCommWriteTopology(comm, o->out_file);
            if (r != ncclSuccess) {
                fprintf(stderr, "%s: %s\n", TOOL, ncclGetLastError(comm));
                status = 1;
            } else if (!o->json) {
                printf("# wrote %s (GEOCCL_TOPO_FILE=%s skips the probe)\n", o->out_file,
                       o->out_file);
            }
        }
        fflush(stdout);
    }
out:
    free(region_of);
    free(labels);
    free(names);
    ncclCommDestroy(comm);
    return status;
}

int main(int argc, char **argv)
{
    probeOptions o;
    int rank = 0, nranks = 1, status;
    ncclUniqueId id;

    /* Measure even when labels are given (they still decide the regions). */
    setenv("GEOCCL_PROBE", "2", 0);
#ifdef GEOCCL_PROBE_MPI
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
#endif
    if (parse(argc, argv, &o) != 0)
        return 2;
    if (o.simulate) {
        status = 0;
        if (rank == 0) {
            ncclResult_t r = geocclSimulate(o.simulate, o.json, stdout);
            if (r != ncclSuccess)
                fprintf(stderr, "%s: %s\n", TOOL, ncclGetLastError(NULL));
            status = r == ncclSuccess ? 0 : 1;
        }
#ifdef GEOCCL_PROBE_MPI
        MPI_Finalize();
#endif
        return status;
    }
#ifdef GEOCCL_PROBE_MPI
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
        fprintf(stderr, "%s: ncclGetUniqueId: %s\n", TOOL, ncclGetLastError(NULL));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    status = run(&o, rank, nranks, id);
    MPI_Finalize();
#else
    if (env_ranks(&rank, &nranks) != 0)
        return 2;
    if (getenv("GEOCCL_COMM_ID") == NULL) {
        fprintf(stderr, "%s: GEOCCL_COMM_ID=host:port (rank 0's address) is not set\n", TOOL);
        return 2;
    }
    if (ncclGetUniqueId(&id) != ncclSuccess) {
        fprintf(stderr, "%s: ncclGetUniqueId: %s\n", TOOL, ncclGetLastError(NULL));
        return 1;
    }
    status = run(&o, rank, nranks, id);
#endif
    return status;
}
