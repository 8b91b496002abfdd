/* The region map of a communicator: which region each rank is in, its
 * local rank there, and the members of each region.  Built from one label
 * per rank (GEOCCL_REGION, a topology file, or later the probe); regions are
 * numbered in order of their lowest rank, so every rank builds the same map.
 * Depends on nothing in comm/. */
#ifndef GEOCCL_TOPO_REGIONS_H_
#define GEOCCL_TOPO_REGIONS_H_

#define TOPO_REGION_LABEL_LEN 32

typedef struct {
    int nranks;
    int nregions;
    int *region_of;     /* [nranks] region id of each rank */
    int *local_rank;    /* [nranks] index within its region */
    int *size;          /* [nregions] ranks per region */
    int **members;      /* [nregions][size] global ranks, ascending */
    int *order;         /* [nranks] ranks sorted by (region, local rank) */
    char (*names)[TOPO_REGION_LABEL_LEN]; /* [nregions] labels */
} topoRegionMap;

/* labels: nranks labels, each TOPO_REGION_LABEL_LEN bytes ("" = the
 * default region).  Returns 0, or -1 when out of memory. */
int topoRegionMapBuild(topoRegionMap *map, int nranks, const char (*labels)[TOPO_REGION_LABEL_LEN]);
void topoRegionMapFree(topoRegionMap *map);

#endif
