/*
 * The topology file (topology/topofile.h) and the region map
 * (topology/regions.h), called directly: the library exports both.
 *
 * Parsing: comments, blank lines, region attributes, rank and host rules
 * and their precedence; rates; errors that name file:line; loading from a
 * file. The region map: numbering by lowest rank, local ranks, members and
 * the region-sorted order. Then forked ranks that take their regions from
 * GEOCCL_TOPO_FILE, with GEOCCL_REGION overriding it in one rank.
 */
#define _GNU_SOURCE
#include "config.h"
#include "topology/regions.h"
#include "topology/topofile.h"
#include "geoccl.h"

#include "tests/helpers/harness.h"

#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* err starts with "NAME:LINE:" */
static int names_line(const char *err, const char *name, int line)
{
    char want[512];
    snprintf(want, sizeof(want), "%s:%d:", name, line);
    return strncmp(err, want, strlen(want)) == 0;
}

/* Parses text that must be rejected; checks that the message names
 * t.topo:line and contains `what`. */
static void expect_error(const char *text, int line, const char *what)
{
    topoFile tf;
    char err[512] = "";
    int rc = topoFileParse(text, "t.topo", &tf, err, sizeof(err));
    CU_ASSERT_EQUAL(rc, -1);
    if (rc != -1) {
        topoFileFree(&tf);
        fprintf(stderr, "\n    accepted: \"%s\"", text);
        return;
    }
    if (!names_line(err, "t.topo", line) || strstr(err, what) == NULL) {
        fprintf(stderr, "\n    \"%s\": got \"%s\", wanted t.topo:%d: ... %s", text, err,
                line, what);
        CU_FAIL("error message does not name file:line and the cause");
    }
    /* a failed parse leaves nothing allocated behind */
    CU_ASSERT_EQUAL(tf.nregions, 0);
    CU_ASSERT_EQUAL(tf.nrules, 0);
    CU_ASSERT_PTR_NULL(tf.regions);
    CU_ASSERT_PTR_NULL(tf.rules);
}

static const topoFileRegion *find_region(const topoFile *tf, const char *name)
{
    for (int i = 0; i < tf->nregions; i++)
        if (strcmp(tf->regions[i].name, name) == 0)
            return &tf->regions[i];
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Rates                                                                    */
/* ------------------------------------------------------------------------ */

static void test_parse_rate(void)
{
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("100mbit"), 12.5e6, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("1gbit"), 1.25e8, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("10gbit"), 1.25e9, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("1Gbit"), 1.25e8, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("800kbit"), 1e5, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("100Mbps"), 12.5e6, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("2.5gbit"), 3.125e8, 1e-6);
    /* bytes per second */
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("125M"), 125e6, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("125MB/s"), 125e6, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("3k"), 3e3, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(topoParseRate("1000"), 1000, 1e-6);

    static const char *const bad[] = {"",       "fast",   "mbit",     "-1",
                                      "-5mbit", "100 mbit", "100mbits", "100xbit",
                                      "12q",    "1.5.5",  "10gbit/s x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        double v = topoParseRate(bad[i]);
        if (v != -1) {
            fprintf(stderr, "\n    topoParseRate(\"%s\") = %g, expected -1", bad[i], v);
            CU_FAIL("a malformed rate was accepted");
        }
    }
}

/* A rate must be a finite number: strtod also reads "nan", "inf" and
 * overflowing exponents, and a NaN bandwidth passes the parser's "<= 0"
 * check. */
static void test_parse_rate_not_finite(void)
{
    static const char *const bad[] = {"nan", "inf", "infinity", "nanmbit", "1e999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        double v = topoParseRate(bad[i]);
        if (v != -1) {
            fprintf(stderr, "\n    topoParseRate(\"%s\") = %g, expected -1", bad[i], v);
            CU_FAIL("a non-finite rate was accepted");
        }
    }
    expect_error("region a bw=nan\n", 1, "bad rate");
}

/* ------------------------------------------------------------------------ */
/* Good files                                                               */
/* ------------------------------------------------------------------------ */

static const char good_text[] =
    "# GeoCCL topology for the test\n"
    "\n"
    "region east bw=100mbit delay=25\n"
    "   region west   bw=1gbit delay=80ms   # trailing comment\n"
    "region lab\n"
    "\t\n"
    "rank 0 east\n"
    "rank 5 west\n"
    "host 10.0.0.7 lab\n"
    "host node-a.example east\n"
    "host node-b.example west\r\n"
    "rank 9 south  # a region no line declared\n"
    "# rank 1 west (commented out)\n";

static void test_parse_good(void)
{
    topoFile tf;
    char err[512] = "";
    int rc = topoFileParse(good_text, "good.topo", &tf, err, sizeof(err));
    CU_ASSERT_EQUAL_FATAL(rc, 0);

    CU_ASSERT_EQUAL(tf.nregions, 4);
    const topoFileRegion *east = find_region(&tf, "east"), *west = find_region(&tf, "west");
    const topoFileRegion *lab = find_region(&tf, "lab"), *south = find_region(&tf, "south");
    CU_ASSERT_PTR_NOT_NULL_FATAL(east);
    CU_ASSERT_PTR_NOT_NULL_FATAL(west);
    CU_ASSERT_PTR_NOT_NULL_FATAL(lab);
    CU_ASSERT_PTR_NOT_NULL_FATAL(south);
    CU_ASSERT_DOUBLE_EQUAL(east->bw_bytes, 12.5e6, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(east->delay_ms, 25, 1e-9);
    CU_ASSERT_DOUBLE_EQUAL(west->bw_bytes, 1.25e8, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(west->delay_ms, 80, 1e-9);
    /* declared without attributes, or only named in a rule: unknown */
    CU_ASSERT_EQUAL(lab->bw_bytes, 0);
    CU_ASSERT(lab->delay_ms < 0);
    CU_ASSERT_EQUAL(south->bw_bytes, 0);
    CU_ASSERT(south->delay_ms < 0);

    CU_ASSERT_EQUAL_FATAL(tf.nrules, 6);
    CU_ASSERT_EQUAL(tf.rules[0].kind, 0);
    CU_ASSERT_EQUAL(tf.rules[0].rank, 0);
    CU_ASSERT_STRING_EQUAL(tf.rules[0].region, "east");
    CU_ASSERT_EQUAL(tf.rules[2].kind, 1);
    CU_ASSERT_STRING_EQUAL(tf.rules[2].host, "10.0.0.7");
    CU_ASSERT_STRING_EQUAL(tf.rules[2].region, "lab");
    CU_ASSERT_STRING_EQUAL(tf.rules[4].host, "node-b.example");
    CU_ASSERT_STRING_EQUAL(tf.rules[4].region, "west"); /* no '\r' kept */
    CU_ASSERT_EQUAL(tf.rules[5].rank, 9);

    const char *r;
    /* rank rules */
    r = topoFileRegionFor(&tf, 0, "192.168.1.1", "elsewhere");
    CU_ASSERT(r != NULL && strcmp(r, "east") == 0);
    r = topoFileRegionFor(&tf, 9, NULL, NULL);
    CU_ASSERT(r != NULL && strcmp(r, "south") == 0);
    /* a rank line wins over a host line, by address or by name */
    r = topoFileRegionFor(&tf, 5, "10.0.0.7", "node-a.example");
    CU_ASSERT(r != NULL && strcmp(r, "west") == 0);
    /* an address wins over a host name, whichever line comes first */
    r = topoFileRegionFor(&tf, 1, "10.0.0.7", "node-a.example");
    CU_ASSERT(r != NULL && strcmp(r, "lab") == 0);
    r = topoFileRegionFor(&tf, 1, "10.0.0.8", "node-a.example");
    CU_ASSERT(r != NULL && strcmp(r, "east") == 0);
    r = topoFileRegionFor(&tf, 2, "10.0.0.8", "node-b.example");
    CU_ASSERT(r != NULL && strcmp(r, "west") == 0);
    /* the file does not say */
    CU_ASSERT_PTR_NULL(topoFileRegionFor(&tf, 1, "10.0.0.8", "node-c.example"));
    CU_ASSERT_PTR_NULL(topoFileRegionFor(&tf, 1, NULL, NULL));
    /* the commented-out rule is not there */
    CU_ASSERT_PTR_NULL(topoFileRegionFor(&tf, 1, "", ""));

    topoFileFree(&tf);
    CU_ASSERT_EQUAL(tf.nregions, 0);
    CU_ASSERT_PTR_NULL(tf.rules);
    topoFileFree(&tf); /* twice is harmless */
}

static void test_parse_empty(void)
{
    static const char *const texts[] = {"", "\n\n", "# only a comment\n", "  \t \n#\n"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        topoFile tf;
        char err[256] = "";
        CU_ASSERT_EQUAL_FATAL(topoFileParse(texts[i], "e.topo", &tf, err, sizeof(err)), 0);
        CU_ASSERT_EQUAL(tf.nregions, 0);
        CU_ASSERT_EQUAL(tf.nrules, 0);
        CU_ASSERT_PTR_NULL(topoFileRegionFor(&tf, 0, "127.0.0.1", "h"));
        topoFileFree(&tf);
    }
    topoFile tf;
    char err[256] = "";
    CU_ASSERT_EQUAL(topoFileParse(NULL, "null", &tf, err, sizeof(err)), 0);
    topoFileFree(&tf);
}

/* A region name of 31 characters fits; 32 does not, in any statement. */
static void test_long_names(void)
{
    char n31[32], n32[33], text[256];
    memset(n31, 'r', 31);
    n31[31] = '\0';
    memset(n32, 'r', 32);
    n32[32] = '\0';

    topoFile tf;
    char err[256] = "";
    snprintf(text, sizeof(text), "region %s bw=1gbit\nrank 3 %s\n", n31, n31);
    CU_ASSERT_EQUAL_FATAL(topoFileParse(text, "t.topo", &tf, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(tf.nregions, 1);
    CU_ASSERT_STRING_EQUAL(tf.regions[0].name, n31);
    const char *r = topoFileRegionFor(&tf, 3, NULL, NULL);
    CU_ASSERT(r != NULL && strcmp(r, n31) == 0);
    topoFileFree(&tf);

    snprintf(text, sizeof(text), "# long\nregion %s\n", n32);
    expect_error(text, 2, "longer than 31");
    snprintf(text, sizeof(text), "region a\nrank 0 a\nrank 1 %s\n", n32);
    expect_error(text, 3, "longer than 31");
    snprintf(text, sizeof(text), "host 10.0.0.1 %s\n", n32);
    expect_error(text, 1, "longer than 31");
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

static void test_parse_errors(void)
{
    /* syntax */
    expect_error("region a\nfoo bar\n", 2, "foo");
    expect_error("region\n", 1, "region");
    expect_error("rank 1\n", 1, "rank");
    expect_error("rank 1 east extra\n", 1, "rank");
    expect_error("host east\n", 1, "host");
    expect_error("# c\nrank x east\n", 2, "not a rank number");
    expect_error("rank 1x east\n", 1, "not a rank number");
    expect_error("rank -1 east\n", 1, "not a rank number");
    /* region attributes */
    expect_error("region a bw=fast\n", 1, "bad rate");
    expect_error("region a bw=\n", 1, "bad rate");
    expect_error("region a bw=0\n", 1, "bad rate");
    expect_error("region a bw=-10mbit\n", 1, "bad rate");
    expect_error("region a delay=abc\n", 1, "bad delay");
    expect_error("region a delay=-3\n", 1, "bad delay");
    expect_error("region a delay=5s\n", 1, "bad delay");
    expect_error("region a colour=red\n", 1, "unknown region attribute");
    /* the error is on the bad line, not the first */
    expect_error("region a bw=1gbit\nregion b bw=10gbit\nregion c bw=1zbit\n", 3, "bad rate");
}

/* Blank lines count: an editor shows the line the message names. */
static void test_error_line_after_blank_lines(void)
{
    expect_error("# header\n\nregion a\n\n\nbogus line\n", 6, "bogus");
    expect_error("\n\n\nregion a bw=fast\n", 4, "bad rate");
}

/* ------------------------------------------------------------------------ */
/* Keys for the cost model                                                  */
/* ------------------------------------------------------------------------ */

static void test_parse_model_keys(void)
{
    topoFile tf;
    char err[512] = "";
    static const char text[] = "region a bw=1gbit delay=10 ranks=1024\n"
                               "region b ranks=3\n"
                               "intra bw=200gbit delay=0.01\n"
                               "streams 8\n"
                               "rtt a b 62\n"
                               "rtt b c 7.5ms  # c is declared by this line\n"
                               "rtt b a 64\n"
                               "loss a b 0.1%\n"
                               "loss b a 1.5 segments=3400\n";
    CU_ASSERT_EQUAL_FATAL(topoFileParse(text, "m.topo", &tf, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL_FATAL(tf.nlosses, 2);
    CU_ASSERT_STRING_EQUAL(tf.losses[0].from, "a");
    CU_ASSERT_STRING_EQUAL(tf.losses[0].to, "b");
    CU_ASSERT_DOUBLE_EQUAL(tf.losses[0].fraction, 0.001, 1e-15);
    CU_ASSERT_EQUAL(tf.losses[0].segs, 0);
    CU_ASSERT_DOUBLE_EQUAL(tf.losses[1].fraction, 0.015, 1e-15);
    CU_ASSERT_EQUAL(tf.losses[1].segs, 3400);
    CU_ASSERT_EQUAL(tf.nregions, 3);
    const topoFileRegion *a = find_region(&tf, "a"), *b = find_region(&tf, "b");
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_PTR_NOT_NULL_FATAL(b);
    CU_ASSERT_PTR_NOT_NULL(find_region(&tf, "c"));
    CU_ASSERT_EQUAL(a->ranks, 1024);
    CU_ASSERT_EQUAL(b->ranks, 3);
    CU_ASSERT_DOUBLE_EQUAL(a->delay_ms, 10, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf.intra_bw_bytes, 25e9, 1e-3);
    CU_ASSERT_DOUBLE_EQUAL(tf.intra_delay_ms, 0.01, 1e-12);
    CU_ASSERT_EQUAL(tf.streams, 8);
    CU_ASSERT_EQUAL_FATAL(tf.nrtts, 3);
    CU_ASSERT_STRING_EQUAL(tf.rtts[0].a, "a");
    CU_ASSERT_STRING_EQUAL(tf.rtts[0].b, "b");
    CU_ASSERT_DOUBLE_EQUAL(tf.rtts[0].ms, 62, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf.rtts[1].ms, 7.5, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(tf.rtts[2].ms, 64, 1e-12);
    topoFileFree(&tf);
    CU_ASSERT_PTR_NULL(tf.rtts);
    CU_ASSERT_EQUAL(tf.nrtts, 0);

    /* absent keys read as unknown */
    CU_ASSERT_EQUAL_FATAL(topoFileParse("region a\n", "m.topo", &tf, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(tf.regions[0].ranks, 0);
    CU_ASSERT_EQUAL(tf.intra_bw_bytes, 0);
    CU_ASSERT(tf.intra_delay_ms < 0);
    CU_ASSERT_EQUAL(tf.streams, 0);
    CU_ASSERT_EQUAL(tf.nrtts, 0);
    CU_ASSERT_EQUAL(tf.node_ranks, 0);
    CU_ASSERT_EQUAL(tf.regions[0].node_ranks, 0);
    CU_ASSERT_EQUAL(tf.node_bw_bytes, 0);
    CU_ASSERT(tf.node_delay_ms < 0);
    topoFileFree(&tf);

    /* the node level: a node line, a region's own node_ranks= */
    CU_ASSERT_EQUAL_FATAL(topoFileParse("node ranks=8 bw=1200gbit delay=0.003\n"
                                        "region a ranks=1024 node_ranks=4\nregion b\n",
                                        "m.topo", &tf, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(tf.node_ranks, 8);
    CU_ASSERT_DOUBLE_EQUAL(tf.node_bw_bytes, 150e9, 1e-3);
    CU_ASSERT_DOUBLE_EQUAL(tf.node_delay_ms, 0.003, 1e-12);
    CU_ASSERT_EQUAL(find_region(&tf, "a")->node_ranks, 4);
    CU_ASSERT_EQUAL(find_region(&tf, "b")->node_ranks, 0);
    topoFileFree(&tf);
}

static void test_parse_model_errors(void)
{
    expect_error("region a ranks=0\n", 1, "bad ranks");
    expect_error("region a ranks=-2\n", 1, "bad ranks");
    expect_error("region a ranks=4x\n", 1, "bad ranks");
    expect_error("region a ranks=\n", 1, "bad ranks");
    expect_error("# x\nintra bw=fast\n", 2, "bad intra rate");
    expect_error("intra delay=-1\n", 1, "bad intra delay");
    expect_error("intra delay=1s\n", 1, "bad intra delay");
    expect_error("intra colour=red\n", 1, "unknown intra attribute");
    expect_error("node ranks=0\n", 1, "bad node ranks");
    expect_error("node ranks=8x\n", 1, "bad node ranks");
    expect_error("node bw=fast\n", 1, "bad node rate");
    expect_error("node delay=-1\n", 1, "bad node delay");
    expect_error("node gpus=8\n", 1, "unknown node attribute");
    expect_error("region a node_ranks=0\n", 1, "bad node_ranks");
    expect_error("streams\n", 1, "streams N");
    expect_error("streams 0\n", 1, "streams N");
    expect_error("streams 2000\n", 1, "streams N");
    expect_error("streams 4 8\n", 1, "streams N");
    expect_error("streams two\n", 1, "streams N");
    expect_error("rtt a b\n", 1, "rtt REGION1 REGION2 MS");
    expect_error("rtt a b 5 6\n", 1, "rtt REGION1 REGION2 MS");
    expect_error("region a\nrtt a a 5\n", 2, "itself");
    expect_error("rtt a b 0\n", 1, "bad rtt");
    expect_error("rtt a b -4\n", 1, "bad rtt");
    expect_error("rtt a b nan\n", 1, "bad rtt");
    expect_error("rtt a b 5s\n", 1, "bad rtt");
    expect_error("loss a b\n", 1, "loss FROM TO PERCENT");
    expect_error("loss a a 1\n", 1, "itself");
    expect_error("loss a b 101\n", 1, "bad loss");
    expect_error("loss a b -1\n", 1, "bad loss");
    expect_error("loss a b lots\n", 1, "bad loss");
    expect_error("loss a b 1 segs=4\n", 1, "segments=N");
    expect_error("loss a b 1 segments=-4\n", 1, "segments=N");
    /* the message for an unknown statement lists the new forms too */
    expect_error("\nlink a b\n", 2, "'streams N'");
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

/* Writes text to a new file under /tmp; path receives its name. */
static int write_temp(const char *text, char *path, size_t len)
{
    snprintf(path, len, "/tmp/geoccl-topo-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n;
    close(fd);
    if (!ok) {
        unlink(path);
        return -1;
    }
    return 0;
}

static void test_load_file(void)
{
    char path[64], err[512] = "";
    topoFile tf;
    CU_ASSERT_EQUAL_FATAL(write_temp(good_text, path, sizeof(path)), 0);
    CU_ASSERT_EQUAL(topoFileLoad(path, &tf, err, sizeof(err)), 0);
    CU_ASSERT_EQUAL(tf.nregions, 4);
    CU_ASSERT_EQUAL(tf.nrules, 6);
    topoFileFree(&tf);
    unlink(path);

    /* a bad line is reported as path:line */
    CU_ASSERT_EQUAL_FATAL(write_temp("region a\nregion b delay=x\n", path, sizeof(path)), 0);
    CU_ASSERT_EQUAL(topoFileLoad(path, &tf, err, sizeof(err)), -1);
    CU_ASSERT(names_line(err, path, 2));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "bad delay"));
    unlink(path);

    /* a missing file names the path and the system's reason */
    err[0] = '\0';
    CU_ASSERT_EQUAL(topoFileLoad(path, &tf, err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, path));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "No such file"));
}

/* ------------------------------------------------------------------------ */
/* Region map                                                               */
/* ------------------------------------------------------------------------ */

static void test_region_map(void)
{
    static const char labels[5][TOPO_REGION_LABEL_LEN] = {"x", "y", "x", "z", "y"};
    topoRegionMap m;
    CU_ASSERT_EQUAL_FATAL(topoRegionMapBuild(&m, 5, labels), 0);
    CU_ASSERT_EQUAL(m.nranks, 5);
    CU_ASSERT_EQUAL_FATAL(m.nregions, 3);
    /* numbered by lowest rank: x (rank 0), y (rank 1), z (rank 3) */
    static const int region_of[5] = {0, 1, 0, 2, 1}, local[5] = {0, 0, 1, 0, 1};
    for (int r = 0; r < 5; r++) {
        CU_ASSERT_EQUAL(m.region_of[r], region_of[r]);
        CU_ASSERT_EQUAL(m.local_rank[r], local[r]);
    }
    CU_ASSERT_STRING_EQUAL(m.names[0], "x");
    CU_ASSERT_STRING_EQUAL(m.names[1], "y");
    CU_ASSERT_STRING_EQUAL(m.names[2], "z");
    CU_ASSERT_EQUAL(m.size[0], 2);
    CU_ASSERT_EQUAL(m.size[1], 2);
    CU_ASSERT_EQUAL(m.size[2], 1);
    CU_ASSERT_EQUAL(m.members[0][0], 0);
    CU_ASSERT_EQUAL(m.members[0][1], 2);
    CU_ASSERT_EQUAL(m.members[1][0], 1);
    CU_ASSERT_EQUAL(m.members[1][1], 4);
    CU_ASSERT_EQUAL(m.members[2][0], 3);
    static const int order[5] = {0, 2, 1, 4, 3};
    for (int i = 0; i < 5; i++)
        CU_ASSERT_EQUAL(m.order[i], order[i]);
    /* every rank sits in its region at its local rank */
    for (int r = 0; r < 5; r++)
        CU_ASSERT_EQUAL(m.members[m.region_of[r]][m.local_rank[r]], r);
    topoRegionMapFree(&m);
    CU_ASSERT_EQUAL(m.nregions, 0);
    CU_ASSERT_PTR_NULL(m.members);
    topoRegionMapFree(&m); /* twice is harmless */
}

static void test_region_map_default(void)
{
    /* "" is the default region: one region when nobody says otherwise */
    static const char none[3][TOPO_REGION_LABEL_LEN] = {"", "", ""};
    topoRegionMap m;
    CU_ASSERT_EQUAL_FATAL(topoRegionMapBuild(&m, 3, none), 0);
    CU_ASSERT_EQUAL(m.nregions, 1);
    CU_ASSERT_EQUAL(m.size[0], 3);
    CU_ASSERT_STRING_EQUAL(m.names[0], "");
    for (int r = 0; r < 3; r++) {
        CU_ASSERT_EQUAL(m.region_of[r], 0);
        CU_ASSERT_EQUAL(m.local_rank[r], r);
        CU_ASSERT_EQUAL(m.order[r], r);
    }
    topoRegionMapFree(&m);

    /* a named region and the default one; the highest rank first seen
     * last; labels that fill all 32 bytes still get a terminated name */
    char mixed[4][TOPO_REGION_LABEL_LEN];
    memset(mixed, 0, sizeof(mixed));
    strcpy(mixed[0], "");
    strcpy(mixed[1], "far");
    strcpy(mixed[2], "");
    memset(mixed[3], 'q', TOPO_REGION_LABEL_LEN);
    CU_ASSERT_EQUAL_FATAL(topoRegionMapBuild(&m, 4, (const char(*)[TOPO_REGION_LABEL_LEN])mixed),
                          0);
    CU_ASSERT_EQUAL(m.nregions, 3);
    CU_ASSERT_STRING_EQUAL(m.names[0], "");
    CU_ASSERT_STRING_EQUAL(m.names[1], "far");
    CU_ASSERT_EQUAL(strlen(m.names[2]), TOPO_REGION_LABEL_LEN - 1);
    CU_ASSERT_EQUAL(m.region_of[3], 2);
    CU_ASSERT_EQUAL(m.order[0], 0);
    CU_ASSERT_EQUAL(m.order[1], 2);
    CU_ASSERT_EQUAL(m.order[2], 1);
    CU_ASSERT_EQUAL(m.order[3], 3);
    topoRegionMapFree(&m);

    /* one rank */
    static const char one[1][TOPO_REGION_LABEL_LEN] = {"solo"};
    CU_ASSERT_EQUAL_FATAL(topoRegionMapBuild(&m, 1, one), 0);
    CU_ASSERT_EQUAL(m.nregions, 1);
    CU_ASSERT_EQUAL(m.members[0][0], 0);
    topoRegionMapFree(&m);
}

/* ------------------------------------------------------------------------ */
/* Forked ranks with GEOCCL_TOPO_FILE                                       */
/* ------------------------------------------------------------------------ */

#define MP_RANKS 4
#define MP_COUNT 10007

struct mp_arg {
    const char *override;   /* GEOCCL_REGION for rank override_rank, or NULL */
    int override_rank;
    const char *label[MP_RANKS]; /* expected region name of each rank */
};

/* The region map implied by the expected labels. */
static void expected_map(const struct mp_arg *a, int rank, int *nregions, int *region,
                         int *local, int *size)
{
    int first[MP_RANKS], k = 0, g = -1;
    for (int r = 0; r < MP_RANKS; r++) {
        int q;
        for (q = 0; q < k; q++)
            if (strcmp(a->label[first[q]], a->label[r]) == 0)
                break;
        if (q == k)
            first[k++] = r;
        if (r == rank)
            g = q;
    }
    *nregions = k;
    *region = g;
    *local = 0;
    *size = 0;
    for (int r = 0; r < MP_RANKS; r++)
        if (strcmp(a->label[r], a->label[rank]) == 0) {
            if (r < rank)
                (*local)++;
            (*size)++;
        }
}

static int topo_rank_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    const struct mp_arg *a = arg;
    int fails = 0;
    ncclComm_t comm = NULL;
    if (a->override != NULL && rank == a->override_rank)
        setenv("GEOCCL_REGION", a->override, 1);
    else
        unsetenv("GEOCCL_REGION");
    ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
    if (r != ncclSuccess) {
        fprintf(stderr, "[rank %d] ncclCommInitRank with GEOCCL_TOPO_FILE=%s: %s: %s\n", rank,
                getenv("GEOCCL_TOPO_FILE"), ncclGetErrorString(r), ncclGetLastError(NULL));
        return 1;
    }

    int k = -1, g = -1, lr = -1, sz = -1, wk, wg, wl, ws;
    const char *name = NULL;
    expected_map(a, rank, &wk, &wg, &wl, &ws);
    r = geocclCommGetRegion(comm, &k, &g, &lr, &sz, &name);
    if (r != ncclSuccess || k != wk || g != wg || lr != wl || sz != ws || name == NULL ||
        strcmp(name, a->label[rank]) != 0) {
        fprintf(stderr, "[rank %d] geocclCommGetRegion: %s, nregions %d region %d localRank %d "
                "regionSize %d name '%s'; expected %d %d %d %d '%s'\n", rank,
                ncclGetErrorString(r), k, g, lr, sz, name ? name : "(null)", wk, wg, wl, ws,
                a->label[rank]);
        fails++;
    }

    /* exact all-reduces over the regions the file made */
    static const struct {
        ncclDataType_t t;
        ncclRedOp_t op;
    } cases[] = {{ncclFloat32, ncclSum}, {ncclInt32, ncclMax}, {ncclBfloat16, ncclProd}};
    if (geocclCommResetStats(comm) != ncclSuccess)
        fails++;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t nb = MP_COUNT * harness_type_size(cases[c].t);
        void *buf = malloc(nb), *exp = malloc(nb);
        char m[256];
        harness_fill_input(buf, cases[c].t, cases[c].op, nranks, rank, 0, MP_COUNT,
                           (uint32_t)(c + 1));
        harness_fill_expected(exp, cases[c].t, cases[c].op, nranks, 0, MP_COUNT,
                              (uint32_t)(c + 1));
        r = ncclAllReduce(buf, buf, MP_COUNT, cases[c].t, cases[c].op, comm, NULL);
        if (r != ncclSuccess) {
            fprintf(stderr, "[rank %d] all-reduce %s %s: %s: %s\n", rank,
                    harness_type_name(cases[c].t), harness_op_name(cases[c].op),
                    ncclGetErrorString(r), ncclGetLastError(comm));
            free(buf);
            free(exp);
            fails++;
            break;
        }
        if (harness_check(buf, exp, cases[c].t, cases[c].op, nranks, MP_COUNT, m, sizeof(m))) {
            fprintf(stderr, "[rank %d] all-reduce %s %s: %s\n", rank,
                    harness_type_name(cases[c].t), harness_op_name(cases[c].op), m);
            fails++;
        }
        free(buf);
        free(exp);
    }
    geocclStats st;
    if (fails == 0 && (geocclCommGetStats(comm, &st) != ncclSuccess ||
                       st.callsHier != (wk > 1 ? 3u : 0u))) {
        fprintf(stderr, "[rank %d] %llu hierarchical all-reduces counted over %d regions\n",
                rank, st.callsHier, wk);
        fails++;
    }
    r = ncclCommDestroy(comm);
    if (r != ncclSuccess)
        fails++;
    return fails;
}

/* Every rank of a file that cannot be read fails init, and the message
 * names the file and line. */
static int bad_file_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    const char *path = arg;
    ncclComm_t comm = NULL;
    unsetenv("GEOCCL_REGION");
    ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
    if (r == ncclSuccess) {
        fprintf(stderr, "[rank %d] init with a bad topology file succeeded\n", rank);
        ncclCommDestroy(comm);
        return 1;
    }
    char want[128];
    snprintf(want, sizeof(want), "%s:2:", path);
    const char *msg = ncclGetLastError(NULL);
    if (r != ncclInvalidUsage || msg == NULL || strstr(msg, want) == NULL) {
        fprintf(stderr, "[rank %d] init with a bad topology file: %s: '%s'; expected "
                "invalid usage naming %s\n", rank, ncclGetErrorString(r), msg ? msg : "",
                want);
        return 1;
    }
    return 0;
}

static const char mp_text[] =
    "region east bw=100mbit delay=25\n"
    "region west bw=1gbit delay=40\n"
    "# every rank runs on 127.0.0.1 here: the host lines lose to rank lines\n"
    "host 127.0.0.1 lab\n"
    "rank 0 east\n"
    "rank 1 east\n"
    "rank 2 west\n"
    "rank 3 west\n";

static void run_with_file(const char *text, struct mp_arg *a)
{
    char path[64];
    CU_ASSERT_EQUAL_FATAL(write_temp(text, path, sizeof(path)), 0);
    setenv("GEOCCL_TOPO_FILE", path, 1);
    int rc = harness_run_noinit(MP_RANKS, topo_rank_body, a, 60.0);
    unsetenv("GEOCCL_TOPO_FILE");
    unlink(path);
    CU_ASSERT_EQUAL(rc, 0);
}

static void test_ranks_from_file(void)
{
    struct mp_arg a = {NULL, -1, {"east", "east", "west", "west"}};
    run_with_file(mp_text, &a);
}

static void test_region_env_overrides_file(void)
{
    struct mp_arg a = {"east", 3, {"east", "east", "west", "east"}};
    run_with_file(mp_text, &a);
}

static void test_host_rules(void)
{
    /* no rank lines: the address rule (127.0.0.1, the loopback interface
     * the ranks use) wins over the host-name rule, for every rank */
    char host[256] = "", text[512];
    gethostname(host, sizeof(host) - 1);
    snprintf(text, sizeof(text), "host %s far\nhost 127.0.0.1 lab\n", host);
    struct mp_arg a = {NULL, -1, {"lab", "lab", "lab", "lab"}};
    run_with_file(text, &a);
    /* the host name alone; rank 2 elsewhere by a rank line */
    snprintf(text, sizeof(text), "host %s far\nrank 2 near\n", host);
    struct mp_arg b = {NULL, -1, {"far", "far", "near", "far"}};
    run_with_file(text, &b);
    /* the file does not place ranks 1 and 3: the default region "" */
    struct mp_arg c = {NULL, -1, {"east", "", "west", ""}};
    run_with_file("rank 0 east\nrank 2 west\n", &c);
}

static void test_bad_file_fails_init(void)
{
    char path[64];
    CU_ASSERT_EQUAL_FATAL(write_temp("region a\nrank two a\n", path, sizeof(path)), 0);
    setenv("GEOCCL_TOPO_FILE", path, 1);
    CU_ASSERT_EQUAL(harness_run_noinit(2, bad_file_body, path, 30.0), 0);
    unsetenv("GEOCCL_TOPO_FILE");
    unlink(path);
}

int main(void)
{
    harness_setup_env();
    unsetenv("GEOCCL_REGION");
    unsetenv("GEOCCL_TOPO_FILE");
    /* The file gives link rates, so the plan would pick flat or
     * hierarchical per size; the checks below count hierarchical calls, so
     * the algorithm is forced (tests/unit/test_model.c and the probe tests cover
     * the plan). */
    setenv("GEOCCL_ALGO", "hier", 1);
    /* 40 KB all-reduces: hierarchical even without a plan (no link rates
     * for a region), not the direct exchange. */
    setenv("GEOCCL_DIRECT_MAX", "0", 1);

    if (CU_initialize_registry() != CUE_SUCCESS)
        return CU_get_error();
    CU_pSuite s = CU_add_suite("topology file and region map", NULL, NULL);
    if (s == NULL) {
        CU_cleanup_registry();
        return CU_get_error();
    }
    CU_add_test(s, "topoParseRate", test_parse_rate);
    CU_add_test(s, "topoParseRate rejects nan, inf and overflow", test_parse_rate_not_finite);
    CU_add_test(s, "parse a good file", test_parse_good);
    CU_add_test(s, "parse empty and comment-only text", test_parse_empty);
    CU_add_test(s, "region names up to 31 characters", test_long_names);
    CU_add_test(s, "errors name file:line", test_parse_errors);
    CU_add_test(s, "error line numbers count blank lines", test_error_line_after_blank_lines);
    CU_add_test(s, "region ranks=, intra, streams, rtt", test_parse_model_keys);
    CU_add_test(s, "bad ranks=, intra, streams, rtt name file:line", test_parse_model_errors);
    CU_add_test(s, "topoFileLoad", test_load_file);
    CU_add_test(s, "topoRegionMapBuild 'x y x z y'", test_region_map);
    CU_add_test(s, "topoRegionMapBuild default and mixed labels", test_region_map_default);
    CU_add_test(s, "4 ranks placed by rank lines", test_ranks_from_file);
    CU_add_test(s, "GEOCCL_REGION overrides the file", test_region_env_overrides_file);
    CU_add_test(s, "host rules: address over name, default region", test_host_rules);
    CU_add_test(s, "a bad file fails init with file:line", test_bad_file_fails_init);

    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned failures = CU_get_number_of_failures();
    CU_cleanup_registry();
    return failures != 0;
}
