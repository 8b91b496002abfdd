/*
 * What the security tests (tests/test_security.c, tests/test_security_claims.c)
 * share: setting a parameter inside a rank, joining the bootstrap by hand
 * with an entry of the test's own making, and the attack both files make
 * from that: a rank 0 that holds the secret and sends a crafted peer info,
 * which every other rank must refuse with a named cause.
 *
 * sec_check_table_refused asserts with CUnit, so it is called from a test
 * in the parent process; the others are for the rank bodies.
 */
#ifndef GEOCCL_TESTS_SECURITY_HELPERS_H
#define GEOCCL_TESTS_SECURITY_HELPERS_H

#include "comm/bootstrap/bootstrap.h"
#include "comm/core/comm.h"

#include <stddef.h>

/* Sets name to value (NULL: unsets it) and rereads the parameter table, so
 * that the library in this process sees it at once. */
void sec_set_env(const char *name, const char *value);

/* ncclGetUniqueId (which starts the root where this process serves it)
 * and the id's decoded form.  ncclSuccess, or the first call's failure. */
ncclResult_t sec_get_id(ncclUniqueId *uid, geoUniqueIdInternal *id);

/* Joins the bootstrap of id by hand, as rank of nranks, waiting up to
 * timeout seconds, with len bytes of entry as this rank's table entry (the
 * rest zero) where the library would send its geoPeerInfo.  Returns what
 * geoBootstrapJoin returns (ncclSystemError if the table could not be
 * allocated, ncclInvalidArgument if entry does not fit); err, when not
 * NULL, gets the error text (errlen bytes with its NUL). */
ncclResult_t sec_bootstrap_join(const geoUniqueIdInternal *id, int rank, int nranks,
                                double timeout, const void *entry, size_t len, char *err,
                                size_t errlen);

/* Three ranks in forked processes: rank 0 holds the secret and joins with
 * *info as its entry; ranks 1 and 2 run ncclCommInitRank (GEOCCL_TIMEOUT=10,
 * GEOCCL_PROBE=0, and GEOCCL_SOCKET_IFNAME=ifname unless ifname is "").
 * Asserts that rank 0's table went out and that ranks 1 and 2 refused it
 * with ncclRemoteError and an error text holding expect; where the text
 * differs, prints it to stderr after the prefix what. */
void sec_check_table_refused(const geoPeerInfo *info, const char *ifname, const char *expect,
                             const char *what);

#endif
