/* The topology file (GEOCCL_TOPO_FILE): a text file that says which region
 * each rank or host is in and, when known, how fast each region's WAN link
 * is.  Format, one statement per line, '#' starts a comment:
 *
 *   region NAME [bw=RATE] [delay=MS]   declare a region; RATE like 100mbit,
 *                                      1gbit, 10gbit or bytes/s (125M); delay
 *                                      is the one-way WAN delay in ms
 *   rank N NAME                        global rank N is in region NAME
 *   host ADDR-OR-NAME NAME             ranks whose address (or hostname) is
 *                                      ADDR-OR-NAME are in region NAME
 *
 * A rank line wins over a host line; addresses win over host names.  A
 * region named in a rank/host line need not be declared.  Errors name the
 * file and line. */
#ifndef GEOCCL_TOPO_FILE_H_
#define GEOCCL_TOPO_FILE_H_

#include <stddef.h>

#include "topology/regions.h"

typedef struct {
    char name[TOPO_REGION_LABEL_LEN];
    double bw_bytes;  /* bytes/s; 0 unknown */
    double delay_ms;  /* one-way; < 0 unknown */
} topoFileRegion;

typedef struct {
    int kind;         /* 0 rank, 1 host */
    long rank;
    char host[256];
    char region[TOPO_REGION_LABEL_LEN];
} topoFileRule;

typedef struct {
    topoFileRegion *regions;
    int nregions;
    topoFileRule *rules;
    int nrules;
} topoFile;

/* Parse path.  Returns 0; or -1 with a message in err (file:line: what). */
int topoFileLoad(const char *path, topoFile *tf, char *err, size_t errlen);
/* Parse text held in memory (same rules; `name` used in messages). */
int topoFileParse(const char *text, const char *name, topoFile *tf, char *err, size_t errlen);
void topoFileFree(topoFile *tf);
/* Region label for a rank with address `addr` (numeric, no port) and host
 * name `host`; NULL when the file does not say. */
const char *topoFileRegionFor(const topoFile *tf, int rank, const char *addr, const char *host);
/* Parse "100mbit", "1gbit", "125M" (bytes/s) into bytes/s; -1 if bad. */
double topoParseRate(const char *s);

#endif
