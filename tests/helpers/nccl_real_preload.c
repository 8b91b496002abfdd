/* Helper of tests/test_nccl_real: a program linked with NVIDIA's libnccl
 * (as a trainer is), run with LD_PRELOAD=libgeoccl.so.  GeoCCL's loader,
 * reached through the preloaded library, must return NVIDIA's already
 * loaded library and NVIDIA's functions, not GeoCCL's own.  Exit 0 on
 * success; prints what it found. */
#include "config.h"
#include "comm/device/nccl_real.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*openFn)(const char *, geoNcclRealLib *, char *, size_t);
typedef const geoNcclRealLib *(*cachedFn)(void);

static int fail(const char *what)
{
    fprintf(stderr, "nccl_real_preload: FAIL: %s\n", what);
    return 1;
}

int main(void)
{
    Dl_info d_default, d_real, d_geo;
    openFn open_real = (openFn)dlsym(RTLD_DEFAULT, "geoNcclRealOpen");
    cachedFn cached = (cachedFn)dlsym(RTLD_DEFAULT, "geoNcclReal");
    void *gv_default = dlsym(RTLD_DEFAULT, "ncclGetVersion");
    geoNcclRealLib lib;
    char err[2048] = "";
    int v = 0;

    /* A direct call, so that the link needs libnccl (as a trainer's does);
     * with the preload it lands in GeoCCL, which answers 2.28 too. */
    int pv = 0;
    if (ncclGetVersion(&pv) != ncclSuccess || pv < 22800)
        return fail("the program's own ncclGetVersion call failed");
    if (open_real == NULL || cached == NULL)
        return fail("libgeoccl is not preloaded (no geoNcclRealOpen in the process)");
    /* The preload interposes: the program's ncclGetVersion is GeoCCL's. */
    if (gv_default == NULL || dladdr(gv_default, &d_default) == 0 ||
        dladdr((void *)open_real, &d_geo) == 0)
        return fail("dladdr");
    if (d_default.dli_fbase != d_geo.dli_fbase)
        return fail("ncclGetVersion of the process is not GeoCCL's: the preload did not "
                    "interpose");
    /* NVIDIA's library is loaded too (DT_NEEDED of this program). */
    void *nv = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
    if (nv == NULL)
        return fail("NVIDIA's libnccl.so.2 is not loaded in this process");
    if (open_real(NULL, &lib, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return fail("the loader found no NVIDIA NCCL");
    }
    if (lib.handle != nv)
        return fail("the loader opened another library than the one the program uses");
    if (dladdr((void *)lib.GetVersion, &d_real) == 0 || d_real.dli_fbase == d_geo.dli_fbase ||
        strstr(d_real.dli_fname, "geoccl") != NULL)
        return fail("the loader's ncclGetVersion is GeoCCL's");
    if (lib.GetVersion(&v) != 0 || v < 22800 || v >= 22900)
        return fail("NVIDIA's ncclGetVersion is not 2.28");
    const geoNcclRealLib *c = cached();
    if (c == NULL || c->GetVersion != lib.GetVersion || c->AllReduce != lib.AllReduce)
        return fail("the cached loader disagrees");
    printf("nccl_real_preload: NVIDIA NCCL %d at %s; GeoCCL at %s\n", v, lib.path,
           d_geo.dli_fname);
    return 0;
}
