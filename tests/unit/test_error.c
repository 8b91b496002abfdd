/* One way to fail (comm/base/checks.h): a report records the text on the
 * error state and on the calling thread, writes exactly one WARN line that
 * carries the cause and the reporting site's file:line, and gives back the
 * code; with no error state it records on the thread only; the layers
 * above that pass the code on with GEO_CHECK add no second WARN line, nor
 * does geoErrSet, which only carries a cause already reported.
 * stderr is caught through a pipe put in its place for the call. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/base/debug.h"
#include "comm/base/error.h"
#include "comm/base/param.h"

#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What the code under test wrote to stderr while it ran. */
typedef struct {
    int saved, pipe[2];
    char text[8192];
} capture;

static void capture_start(capture *c)
{
    fflush(stderr);
    CU_ASSERT_EQUAL_FATAL(pipe(c->pipe), 0);
    c->saved = dup(STDERR_FILENO);
    CU_ASSERT_FATAL(c->saved >= 0);
    CU_ASSERT_FATAL(dup2(c->pipe[1], STDERR_FILENO) >= 0);
    close(c->pipe[1]);
}

static void capture_end(capture *c)
{
    size_t n = 0;
    ssize_t r;
    fflush(stderr);
    dup2(c->saved, STDERR_FILENO); /* closes the pipe's last write end */
    close(c->saved);
    while (n < sizeof(c->text) - 1 && (r = read(c->pipe[0], c->text + n,
                                                sizeof(c->text) - 1 - n)) > 0)
        n += (size_t)r;
    c->text[n] = '\0';
    close(c->pipe[0]);
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

/* The one line that carries needle, or NULL when not exactly one does. */
static const char *only_line_with(const char *text, const char *needle, char *line, size_t len)
{
    const char *at = strstr(text, needle);
    if (at == NULL || strstr(at + 1, needle) != NULL)
        return NULL;
    const char *b = at, *e = strchr(at, '\n');
    while (b > text && b[-1] != '\n')
        b--;
    snprintf(line, len, "%.*s", (int)((e ? e : at + strlen(at)) - b), b);
    return line;
}

static void debug_at_warn(void)
{
    unsetenv("GEOCCL_DEBUG");
    unsetenv("GEOCCL_DEBUG_SUBSYS");
    geoParamReload();
    CU_ASSERT_EQUAL_FATAL(geoDebugLevel(), GEO_LEVEL_WARN);
}

static void test_report_records_and_logs_once(void)
{
    geoErr e;
    capture c;
    char line[1024], site[64];
    geoErrInit(&e);
    debug_at_warn();
    geoSetThreadError("older text");

    capture_start(&c);
    int at = __LINE__; ncclResult_t r = GEO_ERR(&e, ncclRemoteError, "op 7: peer %d reset", 3);
    capture_end(&c);

    CU_ASSERT_EQUAL(r, ncclRemoteError);
    CU_ASSERT_STRING_EQUAL(geoErrLast(&e), "op 7: peer 3 reset");
    CU_ASSERT_STRING_EQUAL(geoThreadError(), "op 7: peer 3 reset");
    CU_ASSERT_STRING_EQUAL(ncclGetLastError(NULL), "op 7: peer 3 reset");
    CU_ASSERT_EQUAL(count(c.text, "\n"), 1);
    CU_ASSERT_EQUAL(count(c.text, " WARN "), 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(only_line_with(c.text, "peer 3 reset", line,
                                                sizeof(line)));
    CU_ASSERT_PTR_NOT_NULL(strstr(line, " WARN "));
    snprintf(site, sizeof(site), "tests/unit/test_error.c:%d ", at);
    CU_ASSERT_PTR_NOT_NULL(strstr(line, site));
    geoErrDestroy(&e);
}

static void test_report_without_state_is_the_threads(void)
{
    geoErr e;
    capture c;
    char line[1024];
    geoErrInit(&e);
    debug_at_warn();
    capture_start(&c);
    (void)GEO_ERR(&e, ncclSystemError, "first cause");
    capture_end(&c);

    capture_start(&c);
    ncclResult_t r = GEO_ERR(NULL, ncclInvalidArgument, "second cause: %s", "bad count");
    capture_end(&c);

    CU_ASSERT_EQUAL(r, ncclInvalidArgument);
    CU_ASSERT_STRING_EQUAL(geoErrLast(&e), "first cause"); /* untouched */
    CU_ASSERT_STRING_EQUAL(geoThreadError(), "second cause: bad count");
    CU_ASSERT_EQUAL(count(c.text, " WARN "), 1);
    CU_ASSERT_PTR_NOT_NULL(only_line_with(c.text, "second cause: bad count", line, sizeof(line)));
    geoErrDestroy(&e);
}

/* A report on another thread: the error state has it, this thread's text
 * does not. */
static geoErr shared;
static void *report_elsewhere(void *arg)
{
    (void)arg;
    (void)GEO_ERR(&shared, ncclInternalError, "exchange thread: rank 2 out of step");
    return NULL;
}

static void test_thread_text_is_per_thread(void)
{
    pthread_t t;
    capture c;
    geoErrInit(&shared);
    debug_at_warn();
    geoSetThreadError("main thread text");
    capture_start(&c);
    CU_ASSERT_EQUAL_FATAL(pthread_create(&t, NULL, report_elsewhere, NULL), 0);
    pthread_join(t, NULL);
    capture_end(&c);
    CU_ASSERT_STRING_EQUAL(geoErrLast(&shared), "exchange thread: rank 2 out of step");
    CU_ASSERT_STRING_EQUAL(geoThreadError(), "main thread text");
    CU_ASSERT_EQUAL(count(c.text, " WARN "), 1);
    geoErrDestroy(&shared);
}

static int inner_line;
static ncclResult_t inner(int n)
{
    inner_line = __LINE__; GEO_RETURN_IF(n < 0, ncclInvalidArgument, "count %d is negative", n);
    return ncclSuccess;
}

static ncclResult_t middle(int n)
{
    GEO_CHECK(inner(n));
    return ncclSuccess;
}

static ncclResult_t outer(int n)
{
    ncclResult_t res;
    GEO_CHECK_GOTO(middle(n), res, fail);
    return ncclSuccess;
fail:
    return res;
}

static void test_callers_pass_the_code_on(void)
{
    capture c;
    char line[1024], site[64];
    debug_at_warn();
    capture_start(&c);
    ncclResult_t r = outer(-5);
    capture_end(&c);
    CU_ASSERT_EQUAL(r, ncclInvalidArgument);
    CU_ASSERT_STRING_EQUAL(geoThreadError(), "count -5 is negative");
    CU_ASSERT_EQUAL(count(c.text, "\n"), 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(only_line_with(c.text, "count -5 is negative", line,
                                                sizeof(line)));
    snprintf(site, sizeof(site), "tests/unit/test_error.c:%d ", inner_line);
    CU_ASSERT_PTR_NOT_NULL(strstr(line, site));
    capture_start(&c);
    CU_ASSERT_EQUAL(outer(5), ncclSuccess);
    capture_end(&c);
    CU_ASSERT_STRING_EQUAL(c.text, "");
}

/* Carrying a cause already reported to another state: recorded, no line. */
static void test_carry_is_silent(void)
{
    geoErr parent;
    capture c;
    geoErrInit(&parent);
    debug_at_warn();
    capture_start(&c);
    geoErrSet(&parent, "ncclCommShrink: %s", "cannot connect to 10.0.0.2:9000");
    geoErrSet(NULL, "init: %s", "the root is gone");
    capture_end(&c);
    CU_ASSERT_STRING_EQUAL(geoErrLast(&parent), "ncclCommShrink: cannot connect to 10.0.0.2:9000");
    CU_ASSERT_STRING_EQUAL(geoThreadError(), "init: the root is gone");
    CU_ASSERT_STRING_EQUAL(c.text, "");
    geoErrDestroy(&parent);
}

/* GEOCCL_DEBUG=NONE silences the line, never the record. */
static void test_silent_log_still_records(void)
{
    geoErr e;
    capture c;
    geoErrInit(&e);
    setenv("GEOCCL_DEBUG", "NONE", 1);
    geoParamReload();
    capture_start(&c);
    ncclResult_t r = GEO_ERR(&e, ncclSystemError, "out of memory for 4 requests");
    capture_end(&c);
    CU_ASSERT_EQUAL(r, ncclSystemError);
    CU_ASSERT_STRING_EQUAL(geoErrLast(&e), "out of memory for 4 requests");
    CU_ASSERT_STRING_EQUAL(c.text, "");
    unsetenv("GEOCCL_DEBUG");
    geoParamReload();
    geoErrDestroy(&e);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("error", NULL, NULL);
    CU_add_test(s, "a report records on the state and thread, one WARN line, its code",
                test_report_records_and_logs_once);
    CU_add_test(s, "with no error state the thread alone has it",
                test_report_without_state_is_the_threads);
    CU_add_test(s, "the thread's text belongs to the thread", test_thread_text_is_per_thread);
    CU_add_test(s, "GEO_CHECK above the origin adds no line", test_callers_pass_the_code_on);
    CU_add_test(s, "geoErrSet carries a reported cause without a line", test_carry_is_silent);
    CU_add_test(s, "GEOCCL_DEBUG=NONE: recorded, not logged", test_silent_log_still_records);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    int failed = (int)CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
