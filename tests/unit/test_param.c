/* The environment parameter table and the logger's settings. */
#include "config.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"
#include "geoccl.h"

#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

static void test_parse_size(void)
{
    int64_t v;
    CU_ASSERT_EQUAL(geoParseSize("123", &v), 0);
    CU_ASSERT_EQUAL(v, 123);
    CU_ASSERT_EQUAL(geoParseSize("4K", &v), 0);
    CU_ASSERT_EQUAL(v, 4096);
    CU_ASSERT_EQUAL(geoParseSize("8M", &v), 0);
    CU_ASSERT_EQUAL(v, 8 << 20);
    CU_ASSERT_EQUAL(geoParseSize("1GiB", &v), 0);
    CU_ASSERT_EQUAL(v, 1 << 30);
    CU_ASSERT_EQUAL(geoParseSize("0x10", &v), 0);
    CU_ASSERT_EQUAL(v, 16);
    CU_ASSERT_EQUAL(geoParseSize("", &v), -1);
    CU_ASSERT_EQUAL(geoParseSize("12 apples", &v), -1);
    CU_ASSERT_EQUAL(geoParseSize(NULL, &v), -1);
}

static void test_defaults_and_env(void)
{
    unsetenv("GEOCCL_TIMEOUT");
    unsetenv("GEOCCL_NSTREAMS");
    geoParamReload();
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_TIMEOUT), 300);
    CU_ASSERT_FALSE(geoParamIsSet(GEO_PARAM_TIMEOUT));
    setenv("GEOCCL_TIMEOUT", "17", 1);
    setenv("GEOCCL_NSTREAMS", "lots", 1); /* unparsable: default, with a warning */
    geoParamReload();
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_TIMEOUT), 17);
    CU_ASSERT_TRUE(geoParamIsSet(GEO_PARAM_TIMEOUT));
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_NSTREAMS), 2);
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_CHUNK_SIZE), 512 * 1024);
    unsetenv("GEOCCL_TIMEOUT");
    unsetenv("GEOCCL_NSTREAMS");
    geoParamReload();
}

static void test_table_is_complete(void)
{
    /* Every parameter has a GEOCCL_ name and help, and the public view
     * agrees with the internal one. */
    CU_ASSERT_EQUAL(geocclParamCount(), GEO_PARAM_COUNT);
    for (int i = 0; i < geocclParamCount(); i++) {
        geocclParamInfo p;
        CU_ASSERT_EQUAL(geocclParamGet(i, &p), ncclSuccess);
        CU_ASSERT_EQUAL(strncmp(p.name, "GEOCCL_", 7), 0);
        CU_ASSERT_TRUE(p.help && strlen(p.help) > 10);
    }
    geocclParamInfo p;
    CU_ASSERT_EQUAL(geocclParamGet(-1, &p), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geocclParamGet(GEO_PARAM_COUNT, &p), ncclInvalidArgument);
}

static void test_debug_levels(void)
{
    setenv("GEOCCL_DEBUG", "INFO", 1);
    geoParamReload();
    CU_ASSERT_EQUAL(geoDebugLevel(), GEO_LEVEL_INFO);
    setenv("GEOCCL_DEBUG", "trace", 1);
    geoParamReload();
    CU_ASSERT_EQUAL(geoDebugLevel(), GEO_LEVEL_TRACE);
    unsetenv("GEOCCL_DEBUG");
    geoParamReload();
    CU_ASSERT_EQUAL(geoDebugLevel(), GEO_LEVEL_WARN);
    geoSetThreadError("peer %d gone", 3);
    CU_ASSERT_STRING_EQUAL(geoThreadError(), "peer 3 gone");
    CU_ASSERT_STRING_EQUAL(ncclGetLastError(NULL), "peer 3 gone");
}

/* A parameter every rank must agree on, out of range: init fails before
 * anything is sent, naming it; in range it is accepted. */
static void test_warmup_range(void)
{
    ncclUniqueId id;
    ncclComm_t c = NULL;
    setenv("GEOCCL_WAN_WARMUP", "5", 1);
    geoParamReload();
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&id), ncclSuccess);
    CU_ASSERT_EQUAL(ncclCommInitRank(&c, 1, id, 0), ncclInvalidArgument);
    CU_ASSERT_PTR_NOT_NULL(strstr(ncclGetLastError(NULL), "GEOCCL_WAN_WARMUP=5"));
    setenv("GEOCCL_WAN_WARMUP", "1", 1);
    geoParamReload();
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&id), ncclSuccess);
    CU_ASSERT_EQUAL(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
    int pairs = -1;
    double sec = -1;
    CU_ASSERT_EQUAL(geocclCommGetWarmup(c, &pairs, &sec), ncclSuccess);
    CU_ASSERT_EQUAL(pairs, 0); /* one region: nothing to warm */
    CU_ASSERT_EQUAL(sec, 0);
    CU_ASSERT_EQUAL(geocclCommGetWarmup(NULL, &pairs, &sec), ncclInvalidArgument);
    ncclCommDestroy(c);
    unsetenv("GEOCCL_WAN_WARMUP");
    geoParamReload();
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("param", NULL, NULL);
    CU_add_test(s, "parse sizes", test_parse_size);
    CU_add_test(s, "defaults and environment", test_defaults_and_env);
    CU_add_test(s, "table complete", test_table_is_complete);
    CU_add_test(s, "debug levels and thread error", test_debug_levels);
    CU_add_test(s, "GEOCCL_WAN_WARMUP out of range fails init", test_warmup_range);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
