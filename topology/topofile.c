#include "config.h"
#include "topology/topofile.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

double topoParseRate(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0)
        return -1;
    if (*end == '\0')
        return v;
    double mult = 1;
    switch (tolower((unsigned char)*end)) {
    case 'k': mult = 1e3; end++; break;
    case 'm': mult = 1e6; end++; break;
    case 'g': mult = 1e9; end++; break;
    default: break;
    }
    if (strcasecmp(end, "bit") == 0 || strcasecmp(end, "bps") == 0)
        return v * mult / 8;
    if (*end == '\0' || strcasecmp(end, "b") == 0 || strcasecmp(end, "B/s") == 0)
        return v * mult;
    return -1;
}

/* "25", "25ms", "0.01": milliseconds, finite and >= 0 (> 0 when positive
 * is set); -1 if bad. */
static double parse_ms(const char *s, int positive)
{
    char *e;
    double v = strtod(s, &e);
    if (e == s || (*e && strcmp(e, "ms") != 0) || !isfinite(v) || v < 0 || (positive && v == 0))
        return -1;
    return v;
}

/* "8": a count from 1 to 2^24; -1 if bad. */
static int parse_count(const char *s)
{
    char *e;
    long v = strtol(s, &e, 10);
    return e == s || *e || v < 1 || v > (1L << 24) ? -1 : (int)v;
}

static int add_region(topoFile *tf, const char *name)
{
    for (int i = 0; i < tf->nregions; i++)
        if (strcmp(tf->regions[i].name, name) == 0)
            return i;
    topoFileRegion *n = realloc(tf->regions, sizeof(*n) * (size_t)(tf->nregions + 1));
    if (n == NULL)
        return -1;
    tf->regions = n;
    memset(&n[tf->nregions], 0, sizeof(*n));
    snprintf(n[tf->nregions].name, TOPO_REGION_LABEL_LEN, "%s", name);
    n[tf->nregions].delay_ms = -1;
    return tf->nregions++;
}

int topoFileParse(const char *text, const char *name, topoFile *tf, char *err, size_t errlen)
{
    char *copy = strdup(text ? text : ""), *save = NULL, *line;
    int lineno = 0;
    memset(tf, 0, sizeof(*tf));
    tf->intra_delay_ms = -1;
    tf->node_delay_ms = -1;
    if (copy == NULL) {
        snprintf(err, errlen, "%s: out of memory", name);
        return -1;
    }
    (void)save;
    for (char *next = copy; next != NULL;) {
        char *tok[8], *ts = NULL, *t;
        int n = 0;
        /* One line at a time, empty ones included, so numbers are right. */
        line = next;
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        for (t = strtok_r(line, " \t\r", &ts); t && n < 8; t = strtok_r(NULL, " \t\r", &ts))
            tok[n++] = t;
        if (n == 0)
            continue;
        if (strcmp(tok[0], "region") == 0 && n >= 2) {
            if (strlen(tok[1]) >= TOPO_REGION_LABEL_LEN)
                goto bad_name;
            int g = add_region(tf, tok[1]);
            if (g < 0)
                goto oom;
            for (int i = 2; i < n; i++) {
                if (strncmp(tok[i], "bw=", 3) == 0) {
                    tf->regions[g].bw_bytes = topoParseRate(tok[i] + 3);
                    if (!(tf->regions[g].bw_bytes > 0)) {
                        snprintf(err, errlen, "%s:%d: bad rate '%s' (use 100mbit, 1gbit...)",
                                 name, lineno, tok[i] + 3);
                        goto fail;
                    }
                } else if (strncmp(tok[i], "in=", 3) == 0) {
                    tf->regions[g].in_bytes = topoParseRate(tok[i] + 3);
                    if (!(tf->regions[g].in_bytes > 0)) {
                        snprintf(err, errlen, "%s:%d: bad rate '%s' (use 100mbit, 1gbit...)",
                                 name, lineno, tok[i] + 3);
                        goto fail;
                    }
                } else if (strncmp(tok[i], "delay=", 6) == 0) {
                    tf->regions[g].delay_ms = parse_ms(tok[i] + 6, 0);
                    if (tf->regions[g].delay_ms < 0) {
                        snprintf(err, errlen, "%s:%d: bad delay '%s' (milliseconds)", name,
                                 lineno, tok[i] + 6);
                        goto fail;
                    }
                } else if (strncmp(tok[i], "ranks=", 6) == 0) {
                    char *e;
                    long v = strtol(tok[i] + 6, &e, 10);
                    if (e == tok[i] + 6 || *e || v < 1 || v > (1L << 24)) {
                        snprintf(err, errlen, "%s:%d: bad ranks '%s' (a count from 1 to %ld)",
                                 name, lineno, tok[i] + 6, 1L << 24);
                        goto fail;
                    }
                    tf->regions[g].ranks = (int)v;
                } else if (strncmp(tok[i], "node_ranks=", 11) == 0) {
                    int v = parse_count(tok[i] + 11);
                    if (v < 1) {
                        snprintf(err, errlen, "%s:%d: bad node_ranks '%s' (a count from 1 to "
                                 "%ld)", name, lineno, tok[i] + 11, 1L << 24);
                        goto fail;
                    }
                    tf->regions[g].node_ranks = v;
                } else {
                    snprintf(err, errlen, "%s:%d: unknown region attribute '%s'", name, lineno,
                             tok[i]);
                    goto fail;
                }
            }
        } else if ((strcmp(tok[0], "rank") == 0 || strcmp(tok[0], "host") == 0) && n == 3) {
            topoFileRule r;
            memset(&r, 0, sizeof(r));
            if (strlen(tok[2]) >= TOPO_REGION_LABEL_LEN)
                goto bad_name;
            if (tok[0][0] == 'r') {
                char *e;
                r.kind = 0;
                r.rank = strtol(tok[1], &e, 10);
                if (*e || r.rank < 0) {
                    snprintf(err, errlen, "%s:%d: '%s' is not a rank number", name, lineno,
                             tok[1]);
                    goto fail;
                }
            } else {
                r.kind = 1;
                snprintf(r.host, sizeof(r.host), "%s", tok[1]);
            }
            snprintf(r.region, sizeof(r.region), "%s", tok[2]);
            topoFileRule *nr = realloc(tf->rules, sizeof(*nr) * (size_t)(tf->nrules + 1));
            if (nr == NULL)
                goto oom;
            tf->rules = nr;
            nr[tf->nrules++] = r;
            if (add_region(tf, r.region) < 0)
                goto oom;
        } else if (strcmp(tok[0], "intra") == 0) {
            for (int i = 1; i < n; i++) {
                if (strncmp(tok[i], "bw=", 3) == 0) {
                    double v = topoParseRate(tok[i] + 3);
                    if (!(v > 0)) {
                        snprintf(err, errlen, "%s:%d: bad intra rate '%s' (use 10gbit, 5G...)",
                                 name, lineno, tok[i] + 3);
                        goto fail;
                    }
                    tf->intra_bw_bytes = v;
                } else if (strncmp(tok[i], "delay=", 6) == 0) {
                    double v = parse_ms(tok[i] + 6, 0);
                    if (v < 0) {
                        snprintf(err, errlen, "%s:%d: bad intra delay '%s' (milliseconds)",
                                 name, lineno, tok[i] + 6);
                        goto fail;
                    }
                    tf->intra_delay_ms = v;
                } else {
                    snprintf(err, errlen, "%s:%d: unknown intra attribute '%s' (bw=, delay=)",
                             name, lineno, tok[i]);
                    goto fail;
                }
            }
        } else if (strcmp(tok[0], "node") == 0) {
            for (int i = 1; i < n; i++) {
                if (strncmp(tok[i], "ranks=", 6) == 0) {
                    int v = parse_count(tok[i] + 6);
                    if (v < 1) {
                        snprintf(err, errlen, "%s:%d: bad node ranks '%s' (a count from 1 to "
                                 "%ld)", name, lineno, tok[i] + 6, 1L << 24);
                        goto fail;
                    }
                    tf->node_ranks = v;
                } else if (strncmp(tok[i], "bw=", 3) == 0) {
                    double v = topoParseRate(tok[i] + 3);
                    if (!(v > 0)) {
                        snprintf(err, errlen, "%s:%d: bad node rate '%s' (use 100gbit, 50G...)",
                                 name, lineno, tok[i] + 3);
                        goto fail;
                    }
                    tf->node_bw_bytes = v;
                } else if (strncmp(tok[i], "delay=", 6) == 0) {
                    double v = parse_ms(tok[i] + 6, 0);
                    if (v < 0) {
                        snprintf(err, errlen, "%s:%d: bad node delay '%s' (milliseconds)",
                                 name, lineno, tok[i] + 6);
                        goto fail;
                    }
                    tf->node_delay_ms = v;
                } else {
                    snprintf(err, errlen, "%s:%d: unknown node attribute '%s' (ranks=, bw=, "
                             "delay=)", name, lineno, tok[i]);
                    goto fail;
                }
            }
        } else if (strcmp(tok[0], "streams") == 0) {
            char *e = NULL;
            long v = n == 2 ? strtol(tok[1], &e, 10) : 0;
            if (n != 2 || e == tok[1] || *e || v < 1 || v > 1024) {
                snprintf(err, errlen, "%s:%d: expected 'streams N' with N from 1 to 1024", name,
                         lineno);
                goto fail;
            }
            tf->streams = (int)v;
        } else if (strcmp(tok[0], "rtt") == 0) {
            topoFileRtt rt;
            if (n != 4) {
                snprintf(err, errlen, "%s:%d: expected 'rtt REGION1 REGION2 MS'", name, lineno);
                goto fail;
            }
            if (strlen(tok[1]) >= TOPO_REGION_LABEL_LEN || strlen(tok[2]) >= TOPO_REGION_LABEL_LEN)
                goto bad_name;
            if (strcmp(tok[1], tok[2]) == 0) {
                snprintf(err, errlen, "%s:%d: rtt between '%s' and itself (two different "
                         "regions expected)", name, lineno, tok[1]);
                goto fail;
            }
            rt.ms = parse_ms(tok[3], 1);
            if (rt.ms < 0) {
                snprintf(err, errlen, "%s:%d: bad rtt '%s' (milliseconds, > 0)", name, lineno,
                         tok[3]);
                goto fail;
            }
            snprintf(rt.a, sizeof(rt.a), "%s", tok[1]);
            snprintf(rt.b, sizeof(rt.b), "%s", tok[2]);
            topoFileRtt *nr = realloc(tf->rtts, sizeof(*nr) * (size_t)(tf->nrtts + 1));
            if (nr == NULL)
                goto oom;
            tf->rtts = nr;
            nr[tf->nrtts++] = rt;
            if (add_region(tf, rt.a) < 0 || add_region(tf, rt.b) < 0)
                goto oom;
        } else if (strcmp(tok[0], "loss") == 0) {
            topoFileLoss ls = {.segs = 0};
            char *e = NULL;
            if (n != 4 && n != 5) {
                snprintf(err, errlen, "%s:%d: expected 'loss FROM TO PERCENT [segments=N]'",
                         name, lineno);
                goto fail;
            }
            if (strlen(tok[1]) >= TOPO_REGION_LABEL_LEN || strlen(tok[2]) >= TOPO_REGION_LABEL_LEN)
                goto bad_name;
            if (strcmp(tok[1], tok[2]) == 0) {
                snprintf(err, errlen, "%s:%d: loss from '%s' to itself (two different regions "
                         "expected)", name, lineno, tok[1]);
                goto fail;
            }
            double pct = strtod(tok[3], &e);
            if (e != NULL && *e == '%')
                e++;
            if (e == tok[3] || *e || !(pct >= 0 && pct <= 100)) {
                snprintf(err, errlen, "%s:%d: bad loss '%s' (percent, 0 to 100)", name, lineno,
                         tok[3]);
                goto fail;
            }
            if (n == 5) {
                e = NULL;
                double v = strncmp(tok[4], "segments=", 9) == 0 ? strtod(tok[4] + 9, &e) : -1;
                if (e == NULL || e == tok[4] + 9 || *e || !(v >= 0)) {
                    snprintf(err, errlen, "%s:%d: bad '%s' (segments=N)", name, lineno, tok[4]);
                    goto fail;
                }
                ls.segs = v;
            }
            ls.fraction = pct / 100;
            snprintf(ls.from, sizeof(ls.from), "%s", tok[1]);
            snprintf(ls.to, sizeof(ls.to), "%s", tok[2]);
            topoFileLoss *nl = realloc(tf->losses, sizeof(*nl) * (size_t)(tf->nlosses + 1));
            if (nl == NULL)
                goto oom;
            tf->losses = nl;
            nl[tf->nlosses++] = ls;
            if (add_region(tf, ls.from) < 0 || add_region(tf, ls.to) < 0)
                goto oom;
        } else {
            snprintf(err, errlen, "%s:%d: cannot read '%s': expected 'region NAME [bw=RATE] [in=RATE] "
                     "[delay=MS] [ranks=N] [node_ranks=G]', 'rank N REGION', 'host ADDR REGION', "
                     "'intra [bw=RATE] [delay=MS]', 'node [ranks=G] [bw=RATE] [delay=MS]', "
                     "'streams N', 'rtt REGION1 REGION2 MS' or 'loss "
                     "FROM TO PERCENT'", name, lineno, tok[0]);
            goto fail;
        }
        continue;
    bad_name:
        snprintf(err, errlen, "%s:%d: region name longer than %d characters", name, lineno,
                 TOPO_REGION_LABEL_LEN - 1);
        goto fail;
    }
    free(copy);
    return 0;
oom:
    snprintf(err, errlen, "%s: out of memory", name);
fail:
    free(copy);
    topoFileFree(tf);
    return -1;
}

int topoFileLoad(const char *path, topoFile *tf, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    char *buf;
    long len;
    int rc;
    if (f == NULL) {
        snprintf(err, errlen, "cannot open topology file %s: %m", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (len < 0 || len > (16 << 20) || (buf = malloc((size_t)len + 1)) == NULL) {
        fclose(f);
        snprintf(err, errlen, "topology file %s is too large or unreadable", path);
        return -1;
    }
    len = (long)fread(buf, 1, (size_t)len, f);
    buf[len] = '\0';
    fclose(f);
    rc = topoFileParse(buf, path, tf, err, errlen);
    free(buf);
    return rc;
}

void topoFileFree(topoFile *tf)
{
    free(tf->regions);
    free(tf->rules);
    free(tf->rtts);
    free(tf->losses);
    memset(tf, 0, sizeof(*tf));
    tf->intra_delay_ms = -1;
    tf->node_delay_ms = -1;
}

const char *topoFileRegionFor(const topoFile *tf, int rank, const char *addr, const char *host)
{
    for (int i = 0; i < tf->nrules; i++)
        if (tf->rules[i].kind == 0 && tf->rules[i].rank == rank)
            return tf->rules[i].region;
    for (int i = 0; i < tf->nrules; i++)
        if (tf->rules[i].kind == 1 && addr && strcmp(tf->rules[i].host, addr) == 0)
            return tf->rules[i].region;
    for (int i = 0; i < tf->nrules; i++)
        if (tf->rules[i].kind == 1 && host && strcmp(tf->rules[i].host, host) == 0)
            return tf->rules[i].region;
    return NULL;
}
