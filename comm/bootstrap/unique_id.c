/* Unique ids: a fresh root with a random secret (ncclGetUniqueId), one
 * derived from GEOCCL_COMM_ID (or its twin NCCL_COMM_ID, param.c) and
 * GEOCCL_COMM_SECRET that every rank computes alike, the secrets of child
 * communicators derived from the parent's, and the id of a shrunk
 * communicator with its candidate root addresses.  Starting a root's
 * thread is root.c's; deciding where it listens is here. */
#include "config.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/bootstrap_internal.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/transport/ifaces.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static int parse_hex_key(const char *s, uint8_t out[GEO_SHA256_BYTES])
{
    if (strlen(s) != 2 * GEO_SHA256_BYTES)
        return 0;
    for (int i = 0; i < GEO_SHA256_BYTES; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1 || !isxdigit((unsigned char)s[2 * i]) ||
            !isxdigit((unsigned char)s[2 * i + 1]))
            return 0;
        out[i] = (uint8_t)v;
    }
    return 1;
}

int geoBootstrapSecretKey(const char *secret, const char *salt, uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t key[GEO_SHA256_BYTES];
    if (parse_hex_key(secret, key)) {
        geoHmacSha256(key, sizeof(key), salt, strlen(salt), out);
        geoWipe(key, sizeof(key));
        return 0;
    }
    return geoScrypt(secret, strlen(secret), salt, strlen(salt), GEO_SCRYPT_N, GEO_SCRYPT_R,
                     GEO_SCRYPT_P, out, GEO_SHA256_BYTES);
}

static ncclResult_t id_from_env(geoUniqueIdInternal *id)
{
    const char *cid = geoParamStrLive(GEO_PARAM_COMM_ID);
    const char *secret = geoParamStrLive(GEO_PARAM_COMM_SECRET);
    char salt[300];

    memset(id, 0, sizeof(id[0]));
    id->magic = GEO_ID_MAGIC;
    id->flags = GEO_ID_ENV;
    GEO_CHECK(geoAddrFromString(cid, &id->root));
    /* The salt is the GEOCCL_COMM_ID string: every rank of the job knows
     * it, and a guess tried against one job's handshake serves only jobs
     * with the same string (ranks must spell it alike, or they derive
     * different secrets and are refused as strangers). */
    snprintf(salt, sizeof(salt), "geoccl/v2/env:%s", cid);
    if (secret != NULL) {
        GEO_RETURN_IF(secret[0] == '\0', ncclInvalidArgument,
                      "GEOCCL_COMM_SECRET is set but empty");
        GEO_RETURN_IF(geoBootstrapSecretKey(secret, salt, id->secret) != 0, ncclSystemError,
                      "cannot stretch GEOCCL_COMM_SECRET with scrypt (out of memory?)");
    } else {
        /* No secret: every rank would derive the same key from the
         * address, which anyone can know, so anyone who can reach it could
         * join as any rank, read and change the data.  Refused unless the
         * user opted out for ranks of one trusted host; init then refuses
         * ranks on other hosts and connections to be encrypted
         * (GEO_ID_NOSECRET, connect.c). */
        const char *opt = geoParamStrLive(GEO_PARAM_INSECURE_NO_SECRET);
        int insecure = opt != NULL && strcmp(opt, "1") == 0;
        GEO_RETURN_IF(opt != NULL && !insecure && strcmp(opt, "0") != 0 && opt[0] != '\0',
                      ncclInvalidArgument, "GEOCCL_INSECURE_NO_SECRET=%s: must be 0 or 1", opt);
        GEO_RETURN_IF(!insecure, ncclInvalidArgument,
                      "GEOCCL_COMM_ID=%s is set but GEOCCL_COMM_SECRET is not: without a "
                      "secret, any process that can reach %s could join as any rank and read "
                      "or change the communicator's data.  Set GEOCCL_COMM_SECRET to the same "
                      "passphrase (or 64 hex digits) in every rank; only for ranks of one "
                      "trusted host, GEOCCL_INSECURE_NO_SECRET=1 runs without one", cid, cid);
        geoWarn(GEO_LOG_INIT, "GEOCCL_INSECURE_NO_SECRET=1: the communicator at %s has no "
                "secret: any process that can reach that address can join it as any rank and "
                "read or change its data; ranks on other hosts and encrypted connections are "
                "refused", cid);
        id->flags |= GEO_ID_NOSECRET;
        geoHmacSha256(salt, strlen(salt), "geoccl/v2/no-secret", 19, id->secret);
    }
    id->nonce = 0;
    return ncclSuccess;
}

static ncclResult_t new_root(const uint8_t *secret, int nranks, ncclUniqueId *out)
{
    geoUniqueIdInternal id;
    topoIface ifs[1];
    geoSockAddr addr;
    int fd;

    memset(&id, 0, sizeof(id));
    id.magic = GEO_ID_MAGIC;
    const char *filter = geoParamStr(GEO_PARAM_SOCKET_IFNAME);
    if (topoFindIfaces(filter, NULL, ifs, 1) < 1) {
        char set[300];
        return GEO_ERR(NULL, ncclSystemError, "no usable network interface (%s)",
                       geoParamSetting(GEO_PARAM_SOCKET_IFNAME, set, sizeof(set)));
    }
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr, &ifs[0].addr, ifs[0].addr.ss_family == AF_INET6 ? sizeof(addr.sin6)
                                                                  : sizeof(addr.sin));
    GEO_CHECK(geoSocketListen(&addr, &fd, &id.root));
    if (secret != NULL)
        memcpy(id.secret, secret, sizeof(id.secret));
    if ((secret == NULL && geoRandomBytes(id.secret, sizeof(id.secret)) != 0) ||
        geoRandomBytes(&id.nonce, sizeof(id.nonce)) != 0) {
        int err = errno;
        close(fd);
        return GEO_ERR(NULL, ncclSystemError, "getrandom failed: %s", strerror(err));
    }
    GEO_CHECK(geoBootRootStartThread(&id, fd, (double)geoParamInt(GEO_PARAM_TIMEOUT), nranks));
    memset(out, 0, sizeof(*out));
    memcpy(out->internal, &id, sizeof(id));
    char a[GEO_ADDR_STRLEN];
    geoInfo(GEO_LOG_INIT, "bootstrap root listening on %s (%s)", geoAddrToString(&id.root, a),
            ifs[0].name);
    return ncclSuccess;
}

ncclResult_t geoBootstrapNewRoot(int nranks, ncclUniqueId *out)
{
    return new_root(NULL, nranks, out);
}

ncclResult_t geoBootstrapNewRootKeyed(const uint8_t secret[GEO_SHA256_BYTES], int nranks,
                                      ncclUniqueId *out)
{
    return new_root(secret, nranks, out);
}

void geoBootstrapChildSecret(const uint8_t *parent_secret, uint64_t parent_hash,
                             uint64_t counter, int64_t tag, uint8_t out[GEO_SHA256_BYTES])
{
    uint8_t msg[24 + 24] = "geoccl/v2/child";
    memcpy(msg + 24, &parent_hash, 8);
    memcpy(msg + 32, &counter, 8);
    memcpy(msg + 40, &tag, 8);
    geoHmacSha256(parent_secret, GEO_SHA256_BYTES, msg, sizeof(msg), out);
}

void geoBootstrapSetSecret(ncclUniqueId *uid, const uint8_t *secret)
{
    geoUniqueIdInternal id;
    memcpy(&id, uid->internal, sizeof(id));
    if (secret != NULL)
        memcpy(id.secret, secret, sizeof(id.secret));
    else
        memset(id.secret, 0, sizeof(id.secret));
    memcpy(uid->internal, &id, sizeof(id));
}

void geoBootstrapMarkNoSecret(ncclUniqueId *uid)
{
    geoUniqueIdInternal id;
    memcpy(&id, uid->internal, sizeof(id));
    id.flags |= GEO_ID_NOSECRET;
    memcpy(uid->internal, &id, sizeof(id));
}

ncclResult_t geoBootstrapGetUniqueId(ncclUniqueId *out)
{
    if (geoParamStrLive(GEO_PARAM_COMM_ID) != NULL) {
        geoUniqueIdInternal id;
        GEO_CHECK(id_from_env(&id));
        memset(out, 0, sizeof(*out));
        memcpy(out->internal, &id, sizeof(id));
        return ncclSuccess;
    }
    return geoBootstrapNewRoot(0, out);
}

ncclResult_t geoBootstrapDecode(const ncclUniqueId *in, geoUniqueIdInternal *out)
{
    memcpy(out, in->internal, sizeof(*out));
    GEO_RETURN_IF(out->magic != GEO_ID_MAGIC ||
                      (out->root.sa.sa_family != AF_INET && out->root.sa.sa_family != AF_INET6),
                  ncclInvalidArgument,
                  "the ncclUniqueId was not made by ncclGetUniqueId of GeoCCL (bad magic)");
    return ncclSuccess;
}

void geoBootstrapCandidate(const geoUniqueIdInternal *id, int k, geoSockAddr *out)
{
    *out = id->root;
    if (k == 0)
        return;
    uint8_t msg[24] = "geoccl-shrink-port", h[GEO_SHA256_BYTES];
    int32_t kk = k;
    uint32_t v;
    memcpy(msg + 19, &kk, 4);
    geoHmacSha256(id->secret, sizeof(id->secret), msg, sizeof(msg), h);
    memcpy(&v, h, sizeof(v));
    /* Below Linux's ephemeral range (32768-60999), so that no outgoing
     * connection of the leader's host holds it. */
    uint16_t port = htons((uint16_t)(20000 + v % 12768));
    if (out->sa.sa_family == AF_INET6)
        out->sin6.sin6_port = port;
    else
        out->sin.sin_port = port;
}

void geoBootstrapShrinkId(const uint8_t *secret, uint64_t comm_hash, int nranks,
                          const geoSockAddr *leader_addr, const uint8_t *excluded,
                          uint32_t counter, ncclUniqueId *out)
{
    geoUniqueIdInternal id;
    size_t n = (size_t)nranks, len = 16 + 8 + 4 + 4 + n;
    uint8_t *msg = calloc(1, len), h[GEO_SHA256_BYTES];
    int32_t nr = nranks;

    memset(&id, 0, sizeof(id));
    id.magic = GEO_ID_MAGIC;
    id.flags = GEO_ID_SHRINK;
    id.root = *leader_addr;
    if (msg != NULL) {
        memcpy(msg, "geoccl-shrink-v1", 16);
        memcpy(msg + 16, &comm_hash, 8);
        memcpy(msg + 24, &counter, 4);
        memcpy(msg + 28, &nr, 4);
        for (size_t r = 0; r < n; r++)
            msg[32 + r] = excluded[r] ? 1 : 0;
        geoHmacSha256(secret, GEO_SHA256_BYTES, msg, len, id.secret);
        free(msg);
    } else {
        /* Without memory for the set, the counter alone separates shrinks;
         * every survivor takes this path only if all are out of memory,
         * and a mismatch fails as a refused join, not silently. */
        uint8_t small[32];
        memcpy(small, "geoccl-shrink-v1", 16);
        memcpy(small + 16, &comm_hash, 8);
        memcpy(small + 24, &counter, 4);
        memcpy(small + 28, &nr, 4);
        geoHmacSha256(secret, GEO_SHA256_BYTES, small, sizeof(small), id.secret);
    }
    geoHmacSha256(id.secret, sizeof(id.secret), "geoccl-shrink-nonce", 19, h);
    memcpy(&id.nonce, h, sizeof(id.nonce));
    memset(out, 0, sizeof(*out));
    memcpy(out->internal, &id, sizeof(id));
}

ncclResult_t geoBootstrapStartRoot(const geoUniqueIdInternal *id, int nranks, double timeout)
{
    int fd;
    geoSockAddr bound, cand;
    char a[GEO_ADDR_STRLEN];
    if (!(id->flags & GEO_ID_SHRINK)) {
        GEO_CHECK(geoSocketListen(&id->root, &fd, &bound));
        return geoBootRootStartThread(id, fd, timeout, nranks);
    }
    /* A candidate taken is no error while another one is free: tried
     * quietly, and only the last refusal is reported. */
    int err = 0;
    for (int k = 0; k < GEO_SHRINK_PORTS; k++) {
        geoBootstrapCandidate(id, k, &cand);
        if (geoSocketListenQuiet(&cand, &fd, &bound) == ncclSuccess) {
            geoInfo(GEO_LOG_INIT, "shrink: bootstrap root listening on %s (candidate %d)",
                    geoAddrToString(&bound, a), k);
            return geoBootRootStartThread(id, fd, timeout, nranks);
        }
        err = errno;
        geoInfo(GEO_LOG_INIT, "shrink: cannot listen on %s (candidate %d): %s",
                geoAddrToString(&cand, a), k, strerror(err));
    }
    char c[GEO_ADDR_STRLEN];
    return GEO_ERR(NULL, ncclSystemError, "cannot listen on any of the %d candidate ports of "
                   "the shrunk communicator's root at %s (the last error: cannot listen on "
                   "%s: %s)", GEO_SHRINK_PORTS, geoAddrToString(&id->root, a),
                   geoAddrToString(&cand, c), strerror(err));
}
