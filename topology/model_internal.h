/* What model.c (the cost model), model_plan.c (the plan built on it) and
 * model_file.c (the model from a topology file) share and nothing else
 * sees. */
#ifndef GEOCCL_TOPO_MODEL_INTERNAL_H_
#define GEOCCL_TOPO_MODEL_INTERNAL_H_

#include "topology/model.h"

/* 1 when every field of m is in range (model.h says which), else 0. */
int topoModelOk(const topoModel *m);
/* The ranks of all regions. */
int topoModelNranks(const topoModel *m);
/* One-way delay between regions i and j: half their measured RTT, else
 * the mean of their delays. */
double topoModelOneway(const topoModel *m, int i, int j);

#endif
