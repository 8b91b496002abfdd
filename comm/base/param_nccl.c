/* NCCL's variables read as GeoCCL's: how the value of a parameter's NCCL
 * twins (the table's nccl column, param.c) becomes the parameter's value
 * when its GEOCCL_ variable is unset, which NCCL variables GeoCCL accepts
 * with nothing to do, and which ones it ignores.  A program that replaces
 * NVIDIA's library (LD_PRELOAD) runs under job scripts that speak NCCL;
 * what they ask for is honoured where GeoCCL has the same knob, and said
 * at INFO where it has not, never dropped in silence.
 *
 * Reads the environment only; the caching is param.c's. */
#include "config.h"
#include "comm/base/param_nccl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

/* NCCL variables with no GEOCCL_ twin that GeoCCL honours by doing
 * nothing: what they switch off does not exist here. */
static const struct {
    const char *name;
    const char *why;
} accepted[] = {
    {"NCCL_IB_DISABLE", "accepted: GeoCCL has no InfiniBand transport (TCP, and sockets "
                        "between ranks of one host), so there is nothing to disable"},
};
#define N_ACCEPTED (int)(sizeof(accepted) / sizeof(accepted[0]))

/* A twin counts as set when it is non-empty: NCCL reads an empty value as
 * its default too. */
static const char *twin_env(const char *name)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : NULL;
}

const char *geoParamNcclFirstSet(geoParamId id)
{
    const geoParamDesc *d = geoParamDescribe(id);
    for (int k = 0; d != NULL && d->nccl != NULL && d->nccl[k] != NULL; k++)
        if (twin_env(d->nccl[k]) != NULL)
            return d->nccl[k];
    return NULL;
}

const char *geoParamNcclVar(int i, int *id, const char **how)
{
    for (int p = 0; p < GEO_PARAM_COUNT; p++) {
        const geoParamDesc *d = geoParamDescribe((geoParamId)p);
        for (int k = 0; d->nccl != NULL && d->nccl[k] != NULL; k++)
            if (i-- == 0) {
                *id = p;
                *how = d->nccl_map != NULL ? d->nccl_map : "taken as it is";
                return d->nccl[k];
            }
    }
    if (i < 0 || i >= N_ACCEPTED)
        return NULL;
    *id = -1;
    *how = accepted[i].why;
    return accepted[i].name;
}

static int is_known(const char *name, size_t len)
{
    int id;
    const char *how, *n;
    for (int i = 0; (n = geoParamNcclVar(i, &id, &how)) != NULL; i++)
        if (strlen(n) == len && strncmp(n, name, len) == 0)
            return 1;
    return 0;
}

int geoParamNcclIgnored(char *buf, size_t len)
{
    size_t used = 0;
    int count = 0, left_out = 0;

    if (len > 0)
        buf[0] = '\0';
    for (char **e = environ; e != NULL && *e != NULL; e++) {
        const char *eq = strchr(*e, '=');
        size_t n = eq != NULL ? (size_t)(eq - *e) : strlen(*e);
        if (strncmp(*e, "NCCL_", 5) != 0 || is_known(*e, n))
            continue;
        count++;
        /* Room for this name and for a closing "and N more". */
        if (left_out == 0 && used + n + 2 + 20 < len) {
            used += (size_t)snprintf(buf + used, len - used, "%s%.*s", used ? ", " : "", (int)n, *e);
        } else {
            left_out++;
        }
    }
    if (left_out > 0 && used < len)
        snprintf(buf + used, len - used, " and %d more", left_out);
    return count;
}

/* NCCL_DEBUG: GeoCCL has NONE, WARN, INFO and TRACE.  VERSION (NCCL's
 * version line only) becomes WARN: GeoCCL prints no version line, and
 * errors stay visible (geoccl-info prints the version); ABORT, between
 * INFO and TRACE in NCCL, becomes INFO. */
static int map_debug(const char *v, char *out, size_t olen)
{
    if (strcasecmp(v, "VERSION") == 0)
        v = "WARN";
    else if (strcasecmp(v, "ABORT") == 0)
        v = "INFO";
    snprintf(out, olen, "%s", v);
    return 1;
}

/* NCCL_DEBUG_SUBSYS names and the GeoCCL subsystem that logs the same
 * events; NULL: GeoCCL logs no such events. */
static const struct {
    const char *nccl, *geo;
} subsys_map[] = {
    {"INIT", "INIT"},     {"BOOTSTRAP", "INIT"}, {"ENV", "ENV"},       {"NET", "NET"},
    {"P2P", "NET"},       {"SHM", "NET"},        {"PROXY", "NET"},     {"GRAPH", "TOPO"},
    {"TUNING", "TUNING"}, {"COLL", "COLL"},      {"ALLOC", "CUDA"},    {"NVLS", "CUDA"},
    {"REG", "CUDA"},      {"ALL", "ALL"},        {"ALLOC_HOST", NULL}, {"CALL", NULL},
    {"PROFILE", NULL},    {"RAS", NULL},         {"DESTROY", NULL},
};

static int map_subsys(const char *v, char *out, size_t olen, char *note, size_t nlen)
{
    char buf[256], dropped[256] = "", *tok, *save = NULL;
    size_t used = 0, dused = 0;
    int invert = v[0] == '^';

    out[0] = '\0';
    if (invert)
        used += (size_t)snprintf(out, olen, "^");
    snprintf(buf, sizeof(buf), "%s", v + invert);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const char *geo = NULL;
        for (size_t i = 0; i < sizeof(subsys_map) / sizeof(subsys_map[0]); i++)
            if (strcasecmp(tok, subsys_map[i].nccl) == 0)
                geo = subsys_map[i].geo;
        if (geo == NULL) {
            if (dused < sizeof(dropped))
                dused += (size_t)snprintf(dropped + dused, sizeof(dropped) - dused, "%s%s",
                                          dused ? ", " : "", tok);
            continue;
        }
        /* Each GeoCCL name once. */
        size_t gl = strlen(geo);
        int dup = 0;
        for (const char *at = strstr(out, geo); at != NULL && !dup; at = strstr(at + 1, geo))
            dup = (at == out || at[-1] == ',' || at[-1] == '^') &&
                  (at[gl] == ',' || at[gl] == '\0');
        if (!dup && used < olen)
            used += (size_t)snprintf(out + used, olen - used, "%s%s",
                                     used > (size_t)invert ? "," : "", geo);
    }
    if (dused > 0)
        snprintf(note, nlen, "NCCL_DEBUG_SUBSYS=%s: %s left out (GeoCCL logs no such "
                 "subsystem)", v, dropped);
    /* Every name dropped from a list of those to show: show none, which
     * "^ALL" says (an empty list would mean all). */
    if (!invert && used == 0)
        snprintf(out, olen, "^ALL");
    return 1;
}

/* A positive integer in NCCL's syntax (GeoCCL's suffixes accepted). */
static int positive(const char *v, int64_t *out)
{
    return v != NULL && geoParseSize(v, out) == 0 && *out >= 1;
}

/* NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD: NCCL's sockets per peer
 * connection, GeoCCL's TCP connections per pair.  One unset counts as 1
 * (NCCL's value off the clouds it detects); NCCL's own caps apply: 16
 * threads, 64 sockets. */
static int map_streams(char *out, size_t olen, char *from, size_t flen, char *note, size_t nlen)
{
    const char *t = twin_env("NCCL_SOCKET_NTHREADS"), *s = twin_env("NCCL_NSOCKS_PERTHREAD");
    int64_t nt = 1, ns = 1;

    if (t == NULL && s == NULL)
        return 0;
    snprintf(from, flen, "%s%s%s%s%s", t ? "NCCL_SOCKET_NTHREADS=" : "", t ? t : "",
             t && s ? " x " : "", s ? "NCCL_NSOCKS_PERTHREAD=" : "", s ? s : "");
    if ((t != NULL && !positive(t, &nt)) || (s != NULL && !positive(s, &ns))) {
        snprintf(note, nlen, "%s: not a positive number; GEOCCL_NSTREAMS keeps its default",
                 from);
        return -1;
    }
    if (nt > 16)
        nt = 16;
    if (nt * ns > 64)
        ns = 64 / nt;
    snprintf(out, olen, "%lld", (long long)(nt * ns));
    return 1;
}

/* NCCL_SOCKET_SNDBUF and NCCL_SOCKET_RCVBUF: GeoCCL sets one size for both
 * directions, the larger; NCCL's -1 (or any value below 1) leaves the
 * kernel's autotuning, GeoCCL's 0. */
static int map_bufsize(char *out, size_t olen, char *from, size_t flen)
{
    const char *snd = twin_env("NCCL_SOCKET_SNDBUF"), *rcv = twin_env("NCCL_SOCKET_RCVBUF");
    int64_t a = 0, b = 0;

    if (snd == NULL && rcv == NULL)
        return 0;
    snprintf(from, flen, "%s%s%s%s%s", snd ? "NCCL_SOCKET_SNDBUF=" : "", snd ? snd : "",
             snd && rcv ? ", " : "", rcv ? "NCCL_SOCKET_RCVBUF=" : "", rcv ? rcv : "");
    if (!positive(snd, &a))
        a = 0;
    if (!positive(rcv, &b))
        b = 0;
    snprintf(out, olen, "%lld", (long long)(a > b ? a : b));
    return 1;
}

/* NCCL_ALGO: "list" or "list;func:list;..."; a list may start with ^ to
 * exclude.  GEOCCL_ALGO is the all-reduce's: the "allreduce:" entry
 * governs, else the first entry with no function.  Ring alone is GeoCCL's
 * flat ring; every other algorithm (Tree, CollnetDirect, CollnetChain,
 * NVLS, NVLSTree, PAT) has no counterpart, and a choice among several is
 * GeoCCL's own (auto). */
static int map_algo(const char *v, char *out, size_t olen, char *note, size_t nlen)
{
    char buf[256], *entry, *save = NULL, *list = NULL;

    snprintf(buf, sizeof(buf), "%s", v);
    for (entry = strtok_r(buf, ";", &save); entry; entry = strtok_r(NULL, ";", &save)) {
        char *colon = strchr(entry, ':');
        if (colon == NULL) {
            if (list == NULL)
                list = entry;
            continue;
        }
        *colon = '\0';
        if (strcasecmp(entry, "allreduce") == 0)
            list = colon + 1;
    }
    if (list == NULL) {
        snprintf(note, nlen, "NCCL_ALGO=%s chooses no all-reduce algorithm (GEOCCL_ALGO is the "
                 "all-reduce's): auto kept", v);
        return -1;
    }
    int invert = list[0] == '^', ring = 0, other = 0;
    char *tok, *s2 = NULL;
    for (tok = strtok_r(list + invert, ",", &s2); tok; tok = strtok_r(NULL, ",", &s2)) {
        if (strcasecmp(tok, "ring") == 0)
            ring = 1;
        else
            other = 1;
    }
    if (!invert && ring && !other) {
        snprintf(out, olen, "flat");
        return 1;
    }
    snprintf(note, nlen, "NCCL_ALGO=%s: GeoCCL's all-reduce is a ring (flat) or its "
             "hierarchical algorithm between regions; Tree, CollNet, NVLS and PAT have no "
             "counterpart, so GeoCCL chooses (auto)", v);
    return -1;
}

int geoParamNcclRead(geoParamId id, char *out, size_t olen, char *from, size_t flen, char *note,
                     size_t nlen)
{
    const char *name, *v;

    out[0] = from[0] = note[0] = '\0';
    switch (id) {
    case GEO_PARAM_NSTREAMS:
        return map_streams(out, olen, from, flen, note, nlen);
    case GEO_PARAM_SOCKET_BUFSIZE:
        return map_bufsize(out, olen, from, flen);
    default:
        break;
    }
    if ((name = geoParamNcclFirstSet(id)) == NULL)
        return 0;
    v = twin_env(name);
    snprintf(from, flen, "%s=%s", name, v);
    switch (id) {
    case GEO_PARAM_DEBUG:
        return map_debug(v, out, olen);
    case GEO_PARAM_DEBUG_SUBSYS:
        return map_subsys(v, out, olen, note, nlen);
    case GEO_PARAM_ALGO:
        return map_algo(v, out, olen, note, nlen);
    case GEO_PARAM_SHM: /* NCCL_SHM_DISABLE */
        snprintf(out, olen, "%s", strcmp(v, "0") == 0 ? "1" : "0");
        return 1;
    default:
        snprintf(out, olen, "%s", v);
        return 1;
    }
}
