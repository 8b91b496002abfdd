/* Loading NVIDIA's NCCL (comm/device/nccl_real.c): the default search finds
 * NVIDIA's library and its functions, never GeoCCL's; GEOCCL_NCCL_LIB
 * naming a missing file or GeoCCL itself gives a clear error; and a trainer
 * linked with NVIDIA's libnccl and run with LD_PRELOAD=libgeoccl.so still
 * gets NVIDIA's functions (tests/helpers/nccl_real_preload, run here).  Runs without
 * a GPU: loading and ncclGetVersion need none. */
#include "config.h"
#include "comm/device/nccl_real.h"
#include "comm/base/param.h"
#include "tests/helpers/harness.h"
#include "nccl.h"

#include <CUnit/Basic.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The file libgeoccl was loaded from. */
static const char *geoccl_path(void)
{
    static Dl_info info;
    if (dladdr((void *)ncclGetVersion, &info) == 0)
        return NULL;
    return info.dli_fname;
}

static void test_default_finds_nvidia(void)
{
    geoNcclRealLib lib;
    char err[2048] = "";
    Dl_info theirs, ours;
    int v = 0;

    if (geoNcclRealOpen(NULL, &lib, err, sizeof(err)) != 0) {
        fprintf(stderr, "\n  no NVIDIA NCCL found: %s\n", err);
#ifdef HAVE_NCCL
        CU_FAIL("configure found NVIDIA's NCCL, the loader did not");
#endif
        return;
    }
    CU_ASSERT_TRUE(lib.version >= 22800 && lib.version < 22900);
    CU_ASSERT_EQUAL(lib.GetVersion(&v), ncclSuccess);
    CU_ASSERT_EQUAL(v, lib.version);
    /* Not GeoCCL's answer: another function in another object. */
    CU_ASSERT_PTR_NOT_EQUAL((void *)lib.GetVersion, (void *)ncclGetVersion);
    CU_ASSERT_PTR_NOT_EQUAL((void *)lib.AllReduce, (void *)ncclAllReduce);
    CU_ASSERT_NOT_EQUAL(dladdr((void *)lib.GetVersion, &theirs), 0);
    CU_ASSERT_NOT_EQUAL(dladdr((void *)ncclGetVersion, &ours), 0);
    CU_ASSERT_PTR_NOT_EQUAL(theirs.dli_fbase, ours.dli_fbase);
    CU_ASSERT_PTR_NULL(strstr(theirs.dli_fname, "geoccl"));
    CU_ASSERT_PTR_NOT_NULL(strstr(theirs.dli_fname, "libnccl"));
    CU_ASSERT_PTR_NULL(dlsym(lib.handle, "geocclVersionString"));
    /* Every function the device path calls is there. */
    CU_ASSERT_PTR_NOT_NULL(lib.ReduceScatter);
    CU_ASSERT_PTR_NOT_NULL(lib.AllGather);
    CU_ASSERT_PTR_NOT_NULL(lib.CommInitRankConfig);
    CU_ASSERT_PTR_NOT_NULL(lib.GroupStart);
    CU_ASSERT_PTR_NOT_NULL(lib.CommWindowRegister);
    CU_ASSERT_PTR_NOT_NULL(lib.CommShrink);
    geoNcclRealClose(&lib);
}

/* Run fn in a child with GEOCCL_NCCL_LIB=path (the process-wide, cached
 * loader can be tried once per process); returns its exit status. */
static int in_child(const char *path, int (*fn)(const char *path))
{
    pid_t pid = fork();
    if (pid == 0) {
        if (path)
            setenv("GEOCCL_NCCL_LIB", path, 1);
        else
            unsetenv("GEOCCL_NCCL_LIB");
        geoParamReload();
        _exit(fn(path));
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

static int cached_refuses(const char *path)
{
    const geoNcclRealLib *lib = geoNcclReal();
    const char *e = geoNcclRealError();
    if (lib != NULL) {
        fprintf(stderr, "  GEOCCL_NCCL_LIB=%s was accepted (version %d from %s)\n", path,
                lib->version, lib->path);
        return 1;
    }
    /* The message names the parameter and the path, and says what failed. */
    if (strstr(e, "GEOCCL_NCCL_LIB=") == NULL || strstr(e, path) == NULL) {
        fprintf(stderr, "  unclear error: %s\n", e);
        return 2;
    }
    printf("  refused as expected: %s\n", e);
    return 0;
}

static int cached_finds_nvidia(const char *path)
{
    (void)path;
    const geoNcclRealLib *lib = geoNcclReal();
    if (lib == NULL) {
        fprintf(stderr, "  not loaded: %s\n", geoNcclRealError());
        return 1;
    }
    return geoNcclReal() == lib && lib->version >= 22800 && lib->version < 22900 ? 0 : 2;
}

static void test_missing_file(void)
{
    geoNcclRealLib lib;
    char err[2048] = "";
    const char *p = "/nonexistent/geoccl-test/libnccl.so.2";
    CU_ASSERT_EQUAL(geoNcclRealOpen(p, &lib, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, p));
    CU_ASSERT_PTR_NULL(lib.handle);
    CU_ASSERT_EQUAL(in_child(p, cached_refuses), 0);
}

static void test_self_refused(void)
{
    geoNcclRealLib lib;
    char err[2048] = "";
    const char *self = geoccl_path();
    CU_ASSERT_PTR_NOT_NULL_FATAL(self);
    CU_ASSERT_EQUAL(geoNcclRealOpen(self, &lib, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "GeoCCL itself"));
    CU_ASSERT_EQUAL(in_child(self, cached_refuses), 0);

    /* A copy of libgeoccl installed under NVIDIA's name is another file (a
     * second instance once loaded): the marker symbol catches it. */
    char dir[] = "/tmp/geoccl-nccl-real-XXXXXX", copy[256], cmd[1024];
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(dir));
    snprintf(copy, sizeof(copy), "%s/libnccl.so.2", dir);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", self, copy);
    CU_ASSERT_EQUAL_FATAL(system(cmd), 0);
    err[0] = '\0';
    CU_ASSERT_EQUAL(geoNcclRealOpen(copy, &lib, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "GeoCCL itself"));
    CU_ASSERT_EQUAL(in_child(copy, cached_refuses), 0);
    unlink(copy);
    rmdir(dir);
}

static void test_cached_default(void)
{
    geoNcclRealLib lib;
    char err[2048];
    if (geoNcclRealOpen(NULL, &lib, err, sizeof(err)) != 0) {
        printf("  skipped: no NVIDIA NCCL on this machine\n");
        return;
    }
    geoNcclRealClose(&lib);
    CU_ASSERT_EQUAL(in_child(NULL, cached_finds_nvidia), 0);
}

/* tests/helpers/nccl_real_preload is linked with NVIDIA's libnccl only; run under
 * LD_PRELOAD=libgeoccl.so it checks the loader from inside that process. */
static void test_preload(void)
{
    const char *bdir = getenv("GEOCCL_TEST_BUILDDIR");
    char helper[1024], lib[1024];
    snprintf(helper, sizeof(helper), "%s/tests/helpers/nccl_real_preload", bdir ? bdir : ".");
    snprintf(lib, sizeof(lib), "%s/lib/.libs/libgeoccl.so", bdir ? bdir : ".");
    if (access(helper, X_OK) != 0) {
        printf("  skipped: %s not built (configure found no NVIDIA NCCL)\n", helper);
#ifdef HAVE_NCCL
        CU_FAIL("HAVE_NCCL but the preload helper is missing");
#endif
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        setenv("LD_PRELOAD", lib, 1);
        unsetenv("GEOCCL_NCCL_LIB");
        execl(helper, helper, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    CU_ASSERT_EQUAL_FATAL(waitpid(pid, &st, 0), pid);
    CU_ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(void)
{
    const char *san = getenv("GEOCCL_SANITIZE");
    if (san != NULL && san[0] != '\0') {
        printf("SKIP: built with -fsanitize=%s: NVIDIA's NCCL needs RTLD_DEEPBIND, which the "
               "sanitizer runtimes refuse, and LD_PRELOAD into a -lnccl program built without "
               "the runtime cannot work\n", san);
        return 77;
    }
    harness_setup_env();
    unsetenv("GEOCCL_NCCL_LIB");
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("real NCCL loader", NULL, NULL);
    CU_add_test(s, "default search finds NVIDIA's library", test_default_finds_nvidia);
    CU_add_test(s, "the cached loader finds it too", test_cached_default);
    CU_add_test(s, "GEOCCL_NCCL_LIB: missing file", test_missing_file);
    CU_add_test(s, "GEOCCL_NCCL_LIB: GeoCCL itself is refused", test_self_refused);
    CU_add_test(s, "LD_PRELOAD=libgeoccl.so over a -lnccl program", test_preload);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
