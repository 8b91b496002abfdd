#include "config.h"
#include "topology/regions.h"

#include <stdlib.h>
#include <string.h>

void topoRegionMapFree(topoRegionMap *m)
{
    if (m->members)
        for (int r = 0; r < m->nregions; r++)
            free(m->members[r]);
    free(m->members);
    free(m->region_of);
    free(m->local_rank);
    free(m->size);
    free(m->order);
    free(m->names);
    memset(m, 0, sizeof(*m));
}

int topoRegionMapBuild(topoRegionMap *m, int nranks, const char (*labels)[TOPO_REGION_LABEL_LEN])
{
    memset(m, 0, sizeof(*m));
    m->nranks = nranks;
    m->region_of = calloc((size_t)nranks, sizeof(int));
    m->local_rank = calloc((size_t)nranks, sizeof(int));
    m->order = calloc((size_t)nranks, sizeof(int));
    m->size = calloc((size_t)nranks, sizeof(int));
    m->names = calloc((size_t)nranks, sizeof(*m->names));
    m->members = calloc((size_t)nranks, sizeof(int *));
    if (!m->region_of || !m->local_rank || !m->order || !m->size || !m->names || !m->members)
        goto fail;
    for (int r = 0; r < nranks; r++) {
        int g;
        for (g = 0; g < m->nregions; g++)
            if (strncmp(m->names[g], labels[r], TOPO_REGION_LABEL_LEN) == 0)
                break;
        if (g == m->nregions) {
            memcpy(m->names[g], labels[r], TOPO_REGION_LABEL_LEN);
            m->names[g][TOPO_REGION_LABEL_LEN - 1] = '\0';
            m->nregions++;
        }
        m->region_of[r] = g;
        m->local_rank[r] = m->size[g]++;
    }
    for (int g = 0, k = 0; g < m->nregions; g++) {
        m->members[g] = malloc(sizeof(int) * (size_t)m->size[g]);
        if (m->members[g] == NULL)
            goto fail;
        for (int r = 0, i = 0; r < nranks; r++)
            if (m->region_of[r] == g) {
                m->members[g][i++] = r;
                m->order[k++] = r;
            }
    }
    return 0;
fail:
    topoRegionMapFree(m);
    return -1;
}
