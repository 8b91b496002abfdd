/* The real NCCL inside GeoCCL.
 *
 * Design choices:
 *
 *  - Loaded with dlopen, never linked: libgeoccl must load and run its host
 *    path on machines without NVIDIA's library or a GPU.  The path is
 *    GEOCCL_NCCL_LIB when set (then nothing else is tried: an explicit
 *    choice that fails must say so, not silently pick another library),
 *    else libnccl.so.2, libnccl.so, then configure's NCCL directory.
 *  - Loaded lazily, once per process (pthread_once), by the first caller
 *    that needs it (a device-buffer call); logged at INFO with the path and
 *    the real version.  The result, success or the reason for failure, is
 *    immutable afterwards: the only global state besides the parameter cache
 *    and the logger.
 *  - Never ourselves: a candidate that exports a geoccl* symbol, or whose
 *    ncclGetVersion lies in the object holding this file, is GeoCCL (for
 *    instance libgeoccl installed under the name libnccl.so.2) and is
 *    refused.  Symbols are looked up with dlsym on the library's own handle,
 *    which searches that object and its dependencies only, never
 *    LD_PRELOAD'ed objects: with LD_PRELOAD=libgeoccl.so a trainer linked
 *    with NVIDIA's libnccl still gets NVIDIA's functions here.
 *  - RTLD_DEEPBIND when we load it: NVIDIA's library calls some of its own
 *    exported functions through the PLT; deep binding keeps those inside it.
 *    When the trainer had loaded it before us, its PLT already points at
 *    GeoCCL (LD_PRELOAD), so a thread-local guard marks calls we make into
 *    it and the GeoCCL entry points it re-enters forward to it (see
 *    nccl_real.h).  NVIDIA's own threads do not carry the guard: its
 *    internal threads call none of those functions in 2.28 as far as the
 *    relocation table shows (ncclBroadcast, ncclCommGetAsyncError,
 *    ncclCommRegister/Deregister, ncclCommWindowDeregister, ncclGetErrorString,
 *    ncclGetUniqueId, ncclGetVersion, ncclMemAlloc/Free), all reached from
 *    API calls; this is unverified without a GPU.
 *  - One real communicator per region, made at init when every rank of
 *    the region has a GPU of its own (geoDevInitAtInit, GEOCCL_NCCL_INIT),
 *    else at the first device-buffer call of a communicator: NCCL refuses
 *    two ranks of one communicator on one GPU, which host-buffer tests and
 *    emulated regions routinely do; GEOCCL_NCCL_INIT=lazy spares a
 *    host-only job on a GPU machine the NCCL init.
 */
#include "config.h"
#include "comm/device/nccl_real.h"
#include "comm/base/debug.h"
#include "comm/base/error.h"
#include "comm/base/param.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static geoNcclRealLib real_lib;
static int real_ok;
static char real_error[1536];

static __thread int real_depth;
static __thread int real_group_open;
static __thread const geoNcclRealLib *real_group_lib;

void geoNcclRealEnter(void) { real_depth++; }
void geoNcclRealLeave(void) { real_depth--; }
int geoNcclRealInCall(void) { return real_depth > 0; }

typedef struct {
    const char *name;
    size_t offset;
    int required;
} realSym;

#define SYM(n, req) {"nccl" #n, offsetof(geoNcclRealLib, n), req}
static const realSym real_syms[] = {
    SYM(GetVersion, 1),
    SYM(GetUniqueId, 1),
    SYM(CommInitRank, 1),
    SYM(CommInitRankConfig, 1),
    SYM(CommDestroy, 1),
    SYM(CommAbort, 1),
    SYM(CommFinalize, 1),
    SYM(CommGetAsyncError, 1),
    SYM(GetErrorString, 1),
    SYM(GetLastError, 1),
    SYM(AllReduce, 1),
    SYM(AllGather, 1),
    SYM(ReduceScatter, 1),
    SYM(Broadcast, 1),
    SYM(Reduce, 1),
    SYM(Send, 1),
    SYM(Recv, 1),
    SYM(GroupStart, 1),
    SYM(GroupEnd, 1),
    SYM(GroupSimulateEnd, 0),
    SYM(AlltoAll, 0),
    SYM(Gather, 0),
    SYM(Scatter, 0),
    SYM(CommRegister, 0),
    SYM(CommDeregister, 0),
    SYM(CommWindowRegister, 0),
    SYM(CommWindowDeregister, 0),
    SYM(MemAlloc, 0),
    SYM(MemFree, 0),
    SYM(RedOpCreatePreMulSum, 0),
    SYM(RedOpDestroy, 0),
    SYM(CommSplit, 0),
    SYM(CommShrink, 0),
};
#undef SYM

/* Any function of this file identifies the object GeoCCL is in. */
static int is_geoccl_object(void *handle, void *fn)
{
    Dl_info mine, theirs;
    if (dlsym(handle, "geocclVersionString") != NULL ||
        dlsym(handle, "geocclCommGetStats") != NULL)
        return 1;
    if (dladdr((void *)geoNcclRealOpen, &mine) == 0 || dladdr(fn, &theirs) == 0)
        return 0;
    return mine.dli_fbase == theirs.dli_fbase;
}

static int open_one(const char *path, geoNcclRealLib *lib, char *err, size_t errlen)
{
    Dl_info info;
    void *h;

    memset(lib, 0, sizeof(*lib));
    dlerror();
#ifdef GEOCCL_SANITIZE
    /* The sanitizer runtimes refuse RTLD_DEEPBIND (their interceptors must
     * see every call).  A sanitizer build runs where there is no GPU, with
     * the emulated NCCL only, which never calls its own exports; with
     * NVIDIA's library such a build is not supported (its internal calls
     * would bind to ours). */
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
#else
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
#endif
    if (h == NULL) {
        const char *why = dlerror();
        snprintf(err, errlen, "cannot load %s: %s", path, why ? why : "unknown dlopen error");
        return -1;
    }
    void *gv = dlsym(h, "ncclGetVersion");
    if (gv == NULL) {
        snprintf(err, errlen, "%s exports no ncclGetVersion: not an NCCL library", path);
        dlclose(h);
        return -1;
    }
    if (is_geoccl_object(h, gv)) {
        snprintf(err, errlen, "%s is GeoCCL itself, not NVIDIA's NCCL (refused: it would "
                 "call itself)", path);
        dlclose(h);
        return -1;
    }
    for (size_t i = 0; i < sizeof(real_syms) / sizeof(real_syms[0]); i++) {
        void *f = dlsym(h, real_syms[i].name);
        if (f == NULL && real_syms[i].required) {
            snprintf(err, errlen, "%s lacks %s, which GeoCCL needs (NCCL >= 2.19 required)",
                     path, real_syms[i].name);
            dlclose(h);
            memset(lib, 0, sizeof(*lib));
            return -1;
        }
        memcpy((char *)lib + real_syms[i].offset, &f, sizeof(f));
    }
    lib->handle = h;
    lib->version = 0;
    ncclResult_t r;
    GEO_REAL_CALL(r, lib, GetVersion, &lib->version);
    if (r != ncclSuccess || lib->version < 21900) {
        snprintf(err, errlen, "%s reports version %d (result %d); GeoCCL needs NCCL >= 2.19",
                 path, lib->version, (int)r);
        dlclose(h);
        memset(lib, 0, sizeof(*lib));
        return -1;
    }
    if (dladdr(gv, &info) != 0 && info.dli_fname && info.dli_fname[0])
        snprintf(lib->path, sizeof(lib->path), "%s", info.dli_fname);
    else
        snprintf(lib->path, sizeof(lib->path), "%s", path);
    return 0;
}

int geoNcclRealOpen(const char *path, geoNcclRealLib *lib, char *err, size_t errlen)
{
    if (path != NULL)
        return open_one(path, lib, err, errlen);
    static const char *const names[] = {
        "libnccl.so.2",
        "libnccl.so",
#ifdef GEOCCL_NCCL_LIB_DIR
        GEOCCL_NCCL_LIB_DIR "/libnccl.so.2",
        GEOCCL_NCCL_LIB_DIR "/libnccl.so",
#endif
    };
    size_t len = 0;
    if (errlen > 0)
        err[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char why[512];
        if (open_one(names[i], lib, why, sizeof(why)) == 0)
            return 0;
        if (len < errlen)
            len += (size_t)snprintf(err + len, errlen - len, "%s%s", len ? "; " : "", why);
    }
    return -1;
}

void geoNcclRealClose(geoNcclRealLib *lib)
{
    if (lib->handle)
        dlclose(lib->handle);
    memset(lib, 0, sizeof(*lib));
}

static void load_once(void)
{
    const char *path = geoParamStr(GEO_PARAM_NCCL_LIB);
    char why[1024];
    if (path != NULL && path[0] == '\0')
        path = NULL;
    if (geoNcclRealOpen(path, &real_lib, why, sizeof(why)) != 0) {
        if (path)
            snprintf(real_error, sizeof(real_error), "NVIDIA's NCCL could not be loaded from "
                     "GEOCCL_NCCL_LIB=%s: %s", path, why);
        else
            snprintf(real_error, sizeof(real_error), "NVIDIA's NCCL could not be loaded (set "
                     "GEOCCL_NCCL_LIB to its libnccl.so.2): %s", why);
        geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "%s", real_error);
        return;
    }
    real_ok = 1;
    geoInfo(GEO_LOG_INIT | GEO_LOG_CUDA, "real NCCL %d.%d.%d loaded from %s%s",
            real_lib.version / 10000, real_lib.version / 100 % 100, real_lib.version % 100,
            real_lib.path, path ? " (GEOCCL_NCCL_LIB)" : "");
}

const geoNcclRealLib *geoNcclReal(void)
{
    pthread_once(&real_once, load_once);
    return real_ok ? &real_lib : NULL;
}

const char *geoNcclRealError(void)
{
    pthread_once(&real_once, load_once);
    return real_ok ? "" : real_error;
}

/* ---- who the process's NCCL calls reach --------------------------------- */

static pthread_once_t binding_once = PTHREAD_ONCE_INIT;

static void check_binding(void)
{
    static const char *const names[] = {"ncclCommInitRank", "ncclAllReduce"};
    /* Our own addresses as the process sees them (the canonical ones, which
     * may be a non-PIE program's PLT entries, as dlsym's answer would be). */
    void *const ours[] = {(void *)ncclCommInitRank, (void *)ncclAllReduce};
    Dl_info mine, theirs;
    if (dladdr((void *)geoNcclRealOpen, &mine) == 0)
        return;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *f = dlsym(RTLD_DEFAULT, names[i]);
        if (f == NULL || f == ours[i] || dladdr(f, &theirs) == 0 ||
            theirs.dli_fbase == mine.dli_fbase)
            continue;
        geoWarn(GEO_LOG_INIT, "%s in this process resolves to %s, not to GeoCCL (%s): code "
                "that calls NCCL through the global symbol scope runs NVIDIA's NCCL; load "
                "libgeoccl first (LD_PRELOAD=libgeoccl.so, and check that ld.so did not "
                "print \"cannot be preloaded\") or link with -lgeoccl instead of -lnccl",
                names[i], theirs.dli_fname ? theirs.dli_fname : "another object",
                mine.dli_fname ? mine.dli_fname : "libgeoccl");
        return;
    }
}

void geoNcclCheckBinding(void) { pthread_once(&binding_once, check_binding); }

/* ---- groups ------------------------------------------------------------ */

ncclResult_t geoNcclRealGroupOpen(const geoNcclRealLib *lib)
{
    ncclResult_t r;
    if (real_group_open)
        return ncclSuccess;
    GEO_REAL_CALL(r, lib, GroupStart);
    if (r == ncclSuccess) {
        real_group_open = 1;
        real_group_lib = lib;
    }
    return r;
}

int geoNcclRealGroupIsOpen(void) { return real_group_open; }

ncclResult_t geoNcclRealGroupClose(void)
{
    ncclResult_t r;
    if (!real_group_open)
        return ncclSuccess;
    real_group_open = 0;
    GEO_REAL_CALL(r, real_group_lib, GroupEnd);
    if (r != ncclSuccess && r != ncclInProgress) {
        const char *txt;
        GEO_REAL_CALL(txt, real_group_lib, GetLastError, NULL);
        GEO_ERR(NULL, r, "ncclGroupEnd: NVIDIA's NCCL failed the grouped device operations: %s",
                txt ? txt : "(no text)");
    }
    return r;
}

ncclResult_t geoNcclRealGroupSimulate(ncclSimInfo_t *info)
{
    ncclResult_t r;
    if (!real_group_open)
        return ncclInvalidUsage;
    real_group_open = 0;
    if (real_group_lib->GroupSimulateEnd == NULL) {
        GEO_REAL_CALL(r, real_group_lib, GroupEnd);
        return GEO_ERR(NULL, ncclInvalidUsage, "ncclGroupSimulateEnd: the real NCCL at %s has "
                       "no ncclGroupSimulateEnd; its group was ended instead",
                       real_group_lib->path);
    }
    GEO_REAL_CALL(r, real_group_lib, GroupSimulateEnd, info);
    return r;
}
