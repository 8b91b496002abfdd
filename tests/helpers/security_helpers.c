/*
 * Helpers shared by the security tests: see security_helpers.h for the
 * contracts.  They drive the bootstrap below ncclCommInitRank, as a rank
 * that lies would, so they link against the library's internal headers.
 */
#define _GNU_SOURCE
#include "config.h"
#include "tests/helpers/security_helpers.h"
#include "tests/helpers/harness.h"
#include "comm/base/param.h"

#include <CUnit/Basic.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sec_set_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    geoParamReload();
}

ncclResult_t sec_get_id(ncclUniqueId *uid, geoUniqueIdInternal *id)
{
    ncclResult_t res = ncclGetUniqueId(uid);
    return res != ncclSuccess ? res : geoBootstrapDecode(uid, id);
}

ncclResult_t sec_bootstrap_join(const geoUniqueIdInternal *id, int rank, int nranks,
                                double timeout, const void *entry, size_t len, char *err,
                                size_t errlen)
{
    geoErr e;
    geoBootInfo mine, *all;
    ncclResult_t res;
    if (len > sizeof(mine.bytes))
        return ncclInvalidArgument;
    all = calloc((size_t)nranks, sizeof(*all));
    if (all == NULL)
        return ncclSystemError;
    memset(&mine, 0, sizeof(mine));
    memcpy(mine.bytes, entry, len);
    geoErrInit(&e);
    geoBootSelf self = {.rank = rank, .nranks = nranks, .timeout = timeout, .err = &e};
    res = geoBootstrapJoin(&self, id, &mine, all);
    if (err != NULL)
        snprintf(err, errlen, "%s", geoErrLast(&e));
    free(all);
    geoErrDestroy(&e);
    return res;
}

#define TABLE_RANKS 3

typedef struct {
    geoPeerInfo info;           /* rank 0's entry */
    char ifname[IF_NAMESIZE];   /* the other ranks' interface ("": unset) */
    ncclResult_t res[TABLE_RANKS];
    char err[TABLE_RANKS][600];
} tableArgs;

static int table_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    tableArgs *a = arg;
    ncclComm_t comm = NULL;
    sec_set_env("GEOCCL_TIMEOUT", "10");
    sec_set_env("GEOCCL_PROBE", "0");
    if (rank == 0) {
        /* Rank 0 holds the secret but sends values of its own choosing. */
        geoUniqueIdInternal in;
        geoBootstrapDecode(id, &in);
        a->res[0] = sec_bootstrap_join(&in, 0, nranks, 10, &a->info, sizeof(a->info), NULL, 0);
        return 0;
    }
    if (a->ifname[0])
        sec_set_env("GEOCCL_SOCKET_IFNAME", a->ifname);
    a->res[rank] = ncclCommInitRank(&comm, nranks, *id, rank);
    snprintf(a->err[rank], sizeof(a->err[rank]), "%s", ncclGetLastError(comm));
    if (comm)
        ncclCommDestroy(comm);
    return 0;
}

void sec_check_table_refused(const geoPeerInfo *info, const char *ifname, const char *expect,
                             const char *what)
{
    tableArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    a->info = *info;
    snprintf(a->ifname, sizeof(a->ifname), "%s", ifname);
    CU_ASSERT_EQUAL(harness_run_noinit(TABLE_RANKS, table_body, a, 60), 0);
    CU_ASSERT_EQUAL(a->res[0], ncclSuccess); /* the table went out */
    for (int r = 1; r < TABLE_RANKS; r++) {
        CU_ASSERT_EQUAL(a->res[r], ncclRemoteError);
        CU_ASSERT_PTR_NOT_NULL(strstr(a->err[r], expect));
        if (strstr(a->err[r], expect) == NULL)
            fprintf(stderr, "    %srank %d: %s\n", what, r, a->err[r]);
    }
    harness_shared_free(a, sizeof(*a));
}
