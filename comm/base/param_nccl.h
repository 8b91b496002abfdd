/* How param.c reads a parameter's NCCL twins (param_nccl.c): one call per
 * parameter whose GEOCCL_ variable is unset, at each reading of the
 * environment. */
#ifndef GEOCCL_PARAM_NCCL_H_
#define GEOCCL_PARAM_NCCL_H_

#include <stddef.h>

#include "comm/base/param.h"

/* The value parameter id takes from its NCCL twins in the environment.
 * Returns 1 with the value in out (olen bytes) and the twins it came from,
 * with their values, in from (flen bytes); 0 when no twin is set; -1 when
 * a twin is set but says nothing GeoCCL can do (the reason in note, nlen
 * bytes).  A value may come with a note too (names it had to drop). */
int geoParamNcclRead(geoParamId id, char *out, size_t olen, char *from, size_t flen, char *note,
                     size_t nlen);

/* The first twin of id set (non-empty) in the environment; NULL if none. */
const char *geoParamNcclFirstSet(geoParamId id);

#endif
