/* The environment parameter table and the logger's settings. */
#include "config.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"
#include "geoccl.h"

#include <CUnit/Basic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* ---- NCCL twins ---------------------------------------------------------- */

/* The NCCL variables these tests set, and the GEOCCL_ ones they shadow;
 * the harness's GEOCCL_SOCKET_IFNAME=lo is put back at the end. */
static const char *const nccl_vars[] = {
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_COMM_ID",
    "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_SOCKET_SNDBUF", "NCCL_SOCKET_RCVBUF",
    "NCCL_ALGO", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_FOO",
    "NCCL_DEBUG_TIMESTAMP_FORMAT", "NCCL_DEBUG_TIMESTAMP_LEVELS", "NCCL_DEBUG_FILE",
    "GEOCCL_DEBUG", "GEOCCL_DEBUG_SUBSYS", "GEOCCL_SOCKET_IFNAME", "GEOCCL_COMM_ID",
    "GEOCCL_DEBUG_TIMESTAMP_FORMAT", "GEOCCL_DEBUG_TIMESTAMP_LEVELS", "GEOCCL_DEBUG_FILE",
    "GEOCCL_NSTREAMS", "GEOCCL_SOCKET_BUFSIZE", "GEOCCL_ALGO", "GEOCCL_SHM",
};
static char *saved_ifname;

static void clear_twins(void)
{
    for (size_t i = 0; i < sizeof(nccl_vars) / sizeof(nccl_vars[0]); i++)
        unsetenv(nccl_vars[i]);
    geoParamReload();
}

static void restore_env(void)
{
    clear_twins();
    if (saved_ifname != NULL)
        setenv("GEOCCL_SOCKET_IFNAME", saved_ifname, 1);
    geoParamReload();
}

static int str_is(geoParamId id, const char *want)
{
    const char *v = geoParamStr(id);
    if (v == NULL || strcmp(v, want) != 0) {
        fprintf(stderr, "  %s is %s, not %s\n", geoParamDescribe(id)->name, v ? v : "(null)",
                want);
        return 0;
    }
    return 1;
}

/* A twin stands in for an unset variable; the GEOCCL_ one wins when both
 * are set, and the twin set beside it is noted. */
static void test_twin_fallback_and_precedence(void)
{
    char buf[300];
    clear_twins();
    setenv("NCCL_SOCKET_IFNAME", "=eth1", 1);
    geoParamReload();
    CU_ASSERT_TRUE(str_is(GEO_PARAM_SOCKET_IFNAME, "=eth1"));
    CU_ASSERT_TRUE(geoParamIsSet(GEO_PARAM_SOCKET_IFNAME));
    CU_ASSERT_STRING_EQUAL(geoParamNcclOrigin(GEO_PARAM_SOCKET_IFNAME),
                           "NCCL_SOCKET_IFNAME==eth1");
    CU_ASSERT_STRING_EQUAL(geoParamSetting(GEO_PARAM_SOCKET_IFNAME, buf, sizeof(buf)),
                           "NCCL_SOCKET_IFNAME==eth1, read as GEOCCL_SOCKET_IFNAME");

    setenv("GEOCCL_SOCKET_IFNAME", "lo", 1);
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("GEOCCL_DEBUG", "TRACE", 1);
    geoParamReload();
    CU_ASSERT_TRUE(str_is(GEO_PARAM_SOCKET_IFNAME, "lo"));
    CU_ASSERT_PTR_NULL(geoParamNcclOrigin(GEO_PARAM_SOCKET_IFNAME));
    CU_ASSERT_PTR_NOT_NULL(strstr(geoParamNcclNote(GEO_PARAM_SOCKET_IFNAME) ?: "",
                                  "NCCL_SOCKET_IFNAME is set too: GEOCCL_SOCKET_IFNAME=lo wins"));
    CU_ASSERT_STRING_EQUAL(geoParamSetting(GEO_PARAM_SOCKET_IFNAME, buf, sizeof(buf)),
                           "GEOCCL_SOCKET_IFNAME=lo");
    CU_ASSERT_TRUE(str_is(GEO_PARAM_DEBUG, "TRACE"));
    CU_ASSERT_EQUAL(geoDebugLevel(), GEO_LEVEL_TRACE);
    unsetenv("GEOCCL_DEBUG");
    geoParamReload();
    CU_ASSERT_EQUAL(geoDebugLevel(), GEO_LEVEL_INFO);

    /* The bootstrap reads NCCL_COMM_ID live, as GEOCCL_COMM_ID. */
    setenv("NCCL_COMM_ID", "127.0.0.1:4711", 1);
    CU_ASSERT_STRING_EQUAL(geoParamStrLive(GEO_PARAM_COMM_ID), "127.0.0.1:4711");
    setenv("GEOCCL_COMM_ID", "127.0.0.1:4712", 1);
    CU_ASSERT_STRING_EQUAL(geoParamStrLive(GEO_PARAM_COMM_ID), "127.0.0.1:4712");
    setenv("NCCL_COMM_ID", "", 1); /* empty: unset, as in NCCL */
    unsetenv("GEOCCL_COMM_ID");
    CU_ASSERT_PTR_NULL(geoParamStrLive(GEO_PARAM_COMM_ID));

    /* Hidden from NVIDIA's NCCL (geoParamEnvHide), nested: gone from the
     * environment, still GeoCCL's bootstrap root, back at the last restore;
     * another name cannot be hidden meanwhile. */
    setenv("NCCL_COMM_ID", "127.0.0.1:4713", 1);
    CU_ASSERT_EQUAL(geoParamEnvHide("NCCL_COMM_ID"), 0);
    CU_ASSERT_EQUAL(geoParamEnvHide("NCCL_COMM_ID"), 0);
    CU_ASSERT_EQUAL(geoParamEnvHide("NCCL_DEBUG"), -1);
    CU_ASSERT_PTR_NULL(getenv("NCCL_COMM_ID"));
    CU_ASSERT_STRING_EQUAL(geoParamStrLive(GEO_PARAM_COMM_ID), "127.0.0.1:4713");
    geoParamEnvRestore("NCCL_COMM_ID");
    CU_ASSERT_PTR_NULL(getenv("NCCL_COMM_ID"));
    geoParamEnvRestore("NCCL_COMM_ID");
    CU_ASSERT_STRING_EQUAL(getenv("NCCL_COMM_ID"), "127.0.0.1:4713");
    unsetenv("NCCL_COMM_ID");
    CU_ASSERT_EQUAL(geoParamEnvHide("NCCL_COMM_ID"), 0); /* unset: stays unset */
    geoParamEnvRestore("NCCL_COMM_ID");
    CU_ASSERT_PTR_NULL(getenv("NCCL_COMM_ID"));
    restore_env();
}

/* How each twin's value maps where it differs. */
static void test_twin_values(void)
{
    clear_twins();
    setenv("NCCL_DEBUG", "VERSION", 1);
    setenv("NCCL_DEBUG_SUBSYS", "BOOTSTRAP,init,GRAPH,CALL,RAS", 1);
    setenv("NCCL_SOCKET_NTHREADS", "2", 1);
    setenv("NCCL_NSOCKS_PERTHREAD", "4", 1);
    setenv("NCCL_SOCKET_SNDBUF", "1M", 1);
    setenv("NCCL_SOCKET_RCVBUF", "4194304", 1);
    setenv("NCCL_ALGO", "allreduce:ring;broadcast:tree", 1);
    setenv("NCCL_SHM_DISABLE", "1", 1);
    geoParamReload();
    CU_ASSERT_TRUE(str_is(GEO_PARAM_DEBUG, "WARN"));
    CU_ASSERT_TRUE(str_is(GEO_PARAM_DEBUG_SUBSYS, "INIT,TOPO"));
    CU_ASSERT_PTR_NOT_NULL(strstr(geoParamNcclNote(GEO_PARAM_DEBUG_SUBSYS) ?: "",
                                  "CALL, RAS left out"));
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_NSTREAMS), 8);
    CU_ASSERT_TRUE(geoParamIsSet(GEO_PARAM_NSTREAMS));
    CU_ASSERT_STRING_EQUAL(geoParamNcclOrigin(GEO_PARAM_NSTREAMS),
                           "NCCL_SOCKET_NTHREADS=2 x NCCL_NSOCKS_PERTHREAD=4");
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_SOCKET_BUFSIZE), 4 << 20);
    CU_ASSERT_TRUE(str_is(GEO_PARAM_ALGO, "flat"));
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_SHM), 0);

    setenv("NCCL_DEBUG_SUBSYS", "^NET,P2P,SHM", 1);
    setenv("NCCL_SOCKET_NTHREADS", "16", 1);
    setenv("NCCL_NSOCKS_PERTHREAD", "8", 1); /* 128 sockets: NCCL's cap is 64 */
    setenv("NCCL_SOCKET_SNDBUF", "-1", 1);
    setenv("NCCL_SOCKET_RCVBUF", "-1", 1);
    setenv("NCCL_ALGO", "Tree,Ring", 1);
    setenv("NCCL_SHM_DISABLE", "0", 1);
    geoParamReload();
    CU_ASSERT_TRUE(str_is(GEO_PARAM_DEBUG_SUBSYS, "^NET"));
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_NSTREAMS), 64);
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_SOCKET_BUFSIZE), 0);
    CU_ASSERT_TRUE(str_is(GEO_PARAM_ALGO, "auto"));
    CU_ASSERT_FALSE(geoParamIsSet(GEO_PARAM_ALGO));
    CU_ASSERT_PTR_NOT_NULL(strstr(geoParamNcclNote(GEO_PARAM_ALGO) ?: "", "NCCL_ALGO=Tree,Ring"));
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_SHM), 1);

    /* Nothing GeoCCL logs: none shown (an empty list would be all). */
    setenv("NCCL_DEBUG_SUBSYS", "CALL", 1);
    setenv("NCCL_SOCKET_NTHREADS", "many", 1);
    unsetenv("NCCL_NSOCKS_PERTHREAD");
    setenv("NCCL_ALGO", "^ring", 1);
    geoParamReload();
    CU_ASSERT_TRUE(str_is(GEO_PARAM_DEBUG_SUBSYS, "^ALL"));
    CU_ASSERT_EQUAL(geoParamInt(GEO_PARAM_NSTREAMS), 2);
    CU_ASSERT_FALSE(geoParamIsSet(GEO_PARAM_NSTREAMS));
    CU_ASSERT_PTR_NOT_NULL(strstr(geoParamNcclNote(GEO_PARAM_NSTREAMS) ?: "",
                                  "not a positive number"));
    CU_ASSERT_TRUE(str_is(GEO_PARAM_ALGO, "auto"));
    restore_env();
}

/* The log of one reading of the environment at INFO, in buf. */
static void capture_env_log(char *buf, size_t len)
{
    char path[] = "/tmp/geoccl-test-param.XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    ssize_t n = 0;

    buf[0] = '\0';
    if (fd < 0 || saved < 0)
        return;
    fflush(stderr);
    dup2(fd, 2);
    geoParamReload();
    (void)geoDebugLevel(); /* the logger reads the new settings and logs them */
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    if (lseek(fd, 0, SEEK_SET) == 0)
        n = read(fd, buf, len - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
}

/* NCCL variables that are no twin: NCCL_IB_DISABLE accepted, an unknown
 * one listed as ignored, in one INFO line; twins never listed. */
static void test_ignored_at_info(void)
{
    static char log[16384];
    char list[256];
    clear_twins();
    setenv("GEOCCL_DEBUG", "INFO", 1);
    setenv("NCCL_FOO", "1", 1);
    setenv("NCCL_IB_DISABLE", "1", 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    CU_ASSERT_TRUE(geoParamNcclIgnored(list, sizeof(list)) >= 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(list, "NCCL_FOO"));
    CU_ASSERT_PTR_NULL(strstr(list, "NCCL_IB_DISABLE"));
    CU_ASSERT_PTR_NULL(strstr(list, "NCCL_SOCKET_IFNAME"));
    capture_env_log(log, sizeof(log));
    int lines = 0;
    for (const char *at = log; (at = strstr(at, "ignored: ")) != NULL; at++)
        lines++;
    CU_ASSERT_EQUAL(lines, 1);
    const char *line = strstr(log, "ignored: ");
    CU_ASSERT_PTR_NOT_NULL(line);
    if (line != NULL) {
        const char *eol = strchr(line, '\n');
        CU_ASSERT_PTR_NOT_NULL(strstr(line, "NCCL_FOO"));
        CU_ASSERT_TRUE(strstr(line, "NCCL_FOO") < eol);
        CU_ASSERT_PTR_NOT_NULL(strstr(log, "[geoccl] INFO NCCL variable"));
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "NCCL_IB_DISABLE=1 accepted"));
    CU_ASSERT_PTR_NOT_NULL(
        strstr(log, "GEOCCL_SOCKET_IFNAME set by environment to lo (from NCCL_SOCKET_IFNAME=lo)"));
    /* Below INFO, nothing. */
    setenv("GEOCCL_DEBUG", "WARN", 1);
    capture_env_log(log, sizeof(log));
    CU_ASSERT_PTR_NULL(strstr(log, "NCCL_FOO"));
    restore_env();
    CU_ASSERT_EQUAL(geoDebugLevel(), GEO_LEVEL_WARN);
}

/* NCCL_DEBUG_TIMESTAMP_FORMAT through its twin: the lines of the levels
 * named open with the time in that format, %3f the milliseconds; the
 * others, and every line when no format is set, do not. */
static void test_timestamps(void)
{
    static char log[16384];
    clear_twins();
    setenv("GEOCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_TIMESTAMP_FORMAT", "<%Y-%m-%d %H:%M:%S.%3f %%> ", 1);
    capture_env_log(log, sizeof(log));
    /* every INFO line is stamped: "<YYYY-MM-DD HH:MM:SS.mmm %> host:..." */
    int stamped = 0, lines = 0;
    for (const char *at = log; *at != '\0'; lines++) {
        int y, mo, d, h, mi, sec, ms;
        char pct;
        if (sscanf(at, "<%4d-%2d-%2d %2d:%2d:%2d.%3d %c> ", &y, &mo, &d, &h, &mi, &sec, &ms,
                   &pct) == 8 && pct == '%' && at[25] == '%' && at[21] != ' ')
            stamped++;
        const char *eol = strchr(at, '\n');
        if (eol == NULL)
            break;
        at = eol + 1;
    }
    CU_ASSERT_TRUE(lines > 0);
    CU_ASSERT_EQUAL(stamped, lines);
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "GEOCCL_DEBUG_TIMESTAMP_FORMAT set by environment to"));
    /* WARN lines only: the INFO lines are not stamped */
    setenv("NCCL_DEBUG_TIMESTAMP_LEVELS", "WARN", 1);
    capture_env_log(log, sizeof(log));
    CU_ASSERT_TRUE(log[0] != '\0' && log[0] != '<');
    CU_ASSERT_PTR_NULL(strstr(log, "\n<"));
    /* no format: no time */
    unsetenv("NCCL_DEBUG_TIMESTAMP_FORMAT");
    unsetenv("NCCL_DEBUG_TIMESTAMP_LEVELS");
    capture_env_log(log, sizeof(log));
    CU_ASSERT_TRUE(log[0] != '\0' && log[0] != '<');
    restore_env();
}

/* NCCL_DEBUG_FILE through its twin: the log goes to the file named, %h
 * and %p expanded; standard error keeps nothing of it.  A file that cannot
 * be opened leaves the log on standard error, saying so there. */
static void test_debug_file(void)
{
    static char log[16384];
    char dir[] = "/tmp/geoccl-test-logfile.XXXXXX", pattern[128], want[256], host[64] = "";
    if (mkdtemp(dir) == NULL) {
        CU_FAIL("mkdtemp");
        return;
    }
    gethostname(host, sizeof(host) - 1);
    snprintf(pattern, sizeof(pattern), "%s/geo.%%h.%%p.log", dir);
    snprintf(want, sizeof(want), "%s/geo.%s.%d.log", dir, host, (int)getpid());
    clear_twins();
    setenv("GEOCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_FILE", pattern, 1);
    capture_env_log(log, sizeof(log));
    CU_ASSERT_PTR_NULL(strstr(log, "[geoccl]"));
    FILE *f = fopen(want, "r");
    CU_ASSERT_PTR_NOT_NULL(f);
    if (f != NULL) {
        size_t n = fread(log, 1, sizeof(log) - 1, f);
        log[n] = '\0';
        fclose(f);
        CU_ASSERT_PTR_NOT_NULL(strstr(log, "GEOCCL_DEBUG_FILE set by environment to"));
        CU_ASSERT_PTR_NOT_NULL(strstr(log, "(from NCCL_DEBUG_FILE="));
    }
    /* a directory that does not exist: standard error, and why */
    snprintf(pattern, sizeof(pattern), "%s/no/such/dir/%%p.log", dir);
    setenv("NCCL_DEBUG_FILE", pattern, 1);
    capture_env_log(log, sizeof(log));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "cannot open"));
    CU_ASSERT_PTR_NOT_NULL(strstr(log, "[geoccl] INFO"));
    unsetenv("NCCL_DEBUG_FILE");
    restore_env();
    unlink(want);
    rmdir(dir);
}

int main(void)
{
    if (getenv("GEOCCL_SOCKET_IFNAME") != NULL)
        saved_ifname = strdup(getenv("GEOCCL_SOCKET_IFNAME"));
    restore_env(); /* no NCCL twin of the caller's shell changes what is tested */
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("param", NULL, NULL);
    CU_add_test(s, "parse sizes", test_parse_size);
    CU_add_test(s, "defaults and environment", test_defaults_and_env);
    CU_add_test(s, "table complete", test_table_is_complete);
    CU_add_test(s, "debug levels and thread error", test_debug_levels);
    CU_add_test(s, "GEOCCL_WAN_WARMUP out of range fails init", test_warmup_range);
    CU_add_test(s, "NCCL twins: fallback, GEOCCL_ wins", test_twin_fallback_and_precedence);
    CU_add_test(s, "NCCL twins: values mapped", test_twin_values);
    CU_add_test(s, "NCCL variables ignored, said at INFO", test_ignored_at_info);
    CU_add_test(s, "NCCL_DEBUG_TIMESTAMP_FORMAT and _LEVELS", test_timestamps);
    CU_add_test(s, "NCCL_DEBUG_FILE", test_debug_file);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
