#include "config.h"
#include "comm/base/debug.h"
#include "comm/base/param.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_level = -1; /* -1: not read yet */
static unsigned log_generation; /* geoParamGeneration the settings came from */
static unsigned log_subsys = GEO_LOG_ALL;
static char log_host[64];
static char log_tsfmt[128];     /* GEOCCL_DEBUG_TIMESTAMP_FORMAT; "": none */
static unsigned log_tslevels;   /* GEOCCL_DEBUG_TIMESTAMP_LEVELS: bit 1 << level */
static FILE *log_file;          /* GEOCCL_DEBUG_FILE's; NULL: standard error */
static char log_file_name[4096]; /* its name as expanded */
static __thread int log_rank = -1;
static __thread char thread_error[1024];

static const struct {
    const char *name;
    unsigned bit;
} subsys_names[] = {
    {"INIT", GEO_LOG_INIT},         {"NET", GEO_LOG_NET},   {"TOPO", GEO_LOG_TOPO},
    {"TUNING", GEO_LOG_TUNING},     {"COMPRESS", GEO_LOG_COMPRESS},
    {"CUDA", GEO_LOG_CUDA},         {"COLL", GEO_LOG_COLL}, {"ENV", GEO_LOG_ENV},
    {"ALL", (unsigned)GEO_LOG_ALL},
};

/* GEOCCL_DEBUG_SUBSYS: comma list; a leading ^ inverts the whole list. */
static unsigned parse_subsys(const char *s)
{
    int invert = 0;
    unsigned mask = 0;
    char buf[256], *tok, *save = NULL;

    if (s == NULL || *s == '\0')
        return GEO_LOG_ALL;
    if (*s == '^') {
        invert = 1;
        s++;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        for (size_t i = 0; i < sizeof(subsys_names) / sizeof(subsys_names[0]); i++)
            if (strcasecmp(tok, subsys_names[i].name) == 0)
                mask |= subsys_names[i].bit;
    return invert ? ~mask : mask;
}

/* GEOCCL_DEBUG_TIMESTAMP_LEVELS: comma list of WARN, INFO, TRACE, ALL (and
 * NCCL's VERSION and ABORT); a leading ^ inverts the whole list. */
static unsigned parse_levels(const char *s)
{
    int invert = 0;
    unsigned mask = 0;
    char buf[128], *tok, *save = NULL;

    if (s == NULL || *s == '\0')
        return ~0U;
    if (*s == '^') {
        invert = 1;
        s++;
    }
    snprintf(buf, sizeof(buf), "%s", s);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strcasecmp(tok, "WARN") == 0 || strcasecmp(tok, "VERSION") == 0)
            mask |= 1U << GEO_LEVEL_WARN;
        else if (strcasecmp(tok, "INFO") == 0 || strcasecmp(tok, "ABORT") == 0)
            mask |= 1U << GEO_LEVEL_INFO;
        else if (strcasecmp(tok, "TRACE") == 0)
            mask |= 1U << GEO_LEVEL_TRACE;
        else if (strcasecmp(tok, "ALL") == 0)
            mask = ~0U;
    }
    return invert ? ~mask : mask;
}

/* The time a log line opens with: fmt through strftime (local time), each
 * %1f .. %9f first replaced by that many digits of the second's fraction.
 * "" where the result does not fit. */
static void format_time(const char *fmt, char *out, size_t len)
{
    struct timespec ts;
    struct tm tm;
    char f[256];
    size_t o = 0;

    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    for (const char *p = fmt; *p != '\0' && o + 10 < sizeof(f); p++) {
        if (p[0] == '%' && p[1] >= '1' && p[1] <= '9' && p[2] == 'f') {
            int digits = p[1] - '0';
            long frac = ts.tv_nsec;
            for (int i = digits; i < 9; i++)
                frac /= 10;
            o += (size_t)snprintf(f + o, sizeof(f) - o, "%0*ld", digits, frac);
            p += 2;
        } else if (p[0] == '%' && p[1] != '\0') { /* any other conversion, %% too, whole */
            f[o++] = *p++;
            f[o++] = *p;
        } else {
            f[o++] = *p;
        }
    }
    f[o] = '\0';
    if (strftime(out, len, f, &tm) == 0)
        out[0] = '\0';
}

/* GEOCCL_DEBUG_FILE: %h the host name, %p the process id, %% a percent
 * sign; any other character as it is.  The name goes to out (len bytes);
 * 0, or -1 when it does not fit. */
static int expand_file_name(const char *pattern, char *out, size_t len)
{
    size_t o = 0;
    for (const char *p = pattern; *p != '\0'; p++) {
        char piece[80];
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p' || p[1] == '%')) {
            if (p[1] == 'h')
                snprintf(piece, sizeof(piece), "%s", log_host);
            else if (p[1] == 'p')
                snprintf(piece, sizeof(piece), "%d", (int)getpid());
            else
                snprintf(piece, sizeof(piece), "%%");
            p++;
        } else {
            piece[0] = *p;
            piece[1] = '\0';
        }
        size_t l = strlen(piece);
        if (o + l + 1 > len)
            return -1;
        memcpy(out + o, piece, l);
        o += l;
    }
    out[o] = '\0';
    return 0;
}

/* Opens GEOCCL_DEBUG_FILE where it names another file than the one open
 * (log_lock held); where it cannot, the log stays on standard error and
 * says why there. */
static void close_log_file(void)
{
    if (log_file != NULL)
        fclose(log_file);
    log_file = NULL;
    log_file_name[0] = '\0';
}

static void open_log_file(void)
{
    const char *pattern = geoParamStr(GEO_PARAM_DEBUG_FILE);
    char name[sizeof(log_file_name)];
    if (pattern == NULL || pattern[0] == '\0') {
        close_log_file();
        return;
    }
    if (expand_file_name(pattern, name, sizeof(name)) != 0) {
        close_log_file();
        fprintf(stderr, "%s:%d:%d [geoccl] WARN GEOCCL_DEBUG_FILE=%s: the name is too long; "
                "logging to standard error\n", log_host, (int)getpid(), log_rank, pattern);
        return;
    }
    if (log_file != NULL && strcmp(name, log_file_name) == 0)
        return;
    close_log_file();
    FILE *f = fopen(name, "w");
    if (f == NULL) {
        fprintf(stderr, "%s:%d:%d [geoccl] WARN GEOCCL_DEBUG_FILE=%s: cannot open %s: %s; "
                "logging to standard error\n", log_host, (int)getpid(), log_rank, pattern, name,
                strerror(errno));
        return;
    }
    setvbuf(f, NULL, _IOLBF, 0);
    log_file = f;
    snprintf(log_file_name, sizeof(log_file_name), "%s", name);
}

/* The NCCL variables set that are no parameter's twin: those accepted,
 * each with what GeoCCL makes of it, and the others in one line. */
static void log_nccl_others(void)
{
    char list[640];
    const char *name, *how;
    int id;

    for (int i = 0; (name = geoParamNcclVar(i, &id, &how)) != NULL; i++)
        if (id < 0 && getenv(name) != NULL)
            geoInfo(GEO_LOG_ENV, "%s=%s %s", name, getenv(name), how);
    int n = geoParamNcclIgnored(list, sizeof(list));
    if (n > 0)
        geoInfo(GEO_LOG_ENV, "NCCL variable%s with no GeoCCL meaning, ignored: %s (NVIDIA's "
                "NCCL, where GeoCCL loads it for device buffers, reads its own)",
                n > 1 ? "s" : "", list);
}

/* A fork while another thread logs must not leave the child's logger
 * locked (programs fork ranks after ncclGetUniqueId started the root
 * thread). */
static void log_atfork_prepare(void) { pthread_mutex_lock(&log_lock); }
static void log_atfork_release(void) { pthread_mutex_unlock(&log_lock); }
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void register_atfork(void)
{
    pthread_atfork(log_atfork_prepare, log_atfork_release, log_atfork_release);
}

void geoDebugInit(void)
{
    pthread_once(&atfork_once, register_atfork);
    const char *lv = geoParamStr(GEO_PARAM_DEBUG);
    const char *ss = geoParamStr(GEO_PARAM_DEBUG_SUBSYS);
    int level = GEO_LEVEL_WARN;

    if (lv != NULL) {
        if (strcasecmp(lv, "NONE") == 0)
            level = GEO_LEVEL_NONE;
        else if (strcasecmp(lv, "INFO") == 0)
            level = GEO_LEVEL_INFO;
        else if (strcasecmp(lv, "TRACE") == 0)
            level = GEO_LEVEL_TRACE;
    }
    unsigned gen = geoParamGeneration();
    pthread_mutex_lock(&log_lock);
    gethostname(log_host, sizeof(log_host) - 1);
    log_subsys = parse_subsys(ss);
    const char *tsfmt = geoParamStr(GEO_PARAM_DEBUG_TIMESTAMP_FORMAT);
    snprintf(log_tsfmt, sizeof(log_tsfmt), "%s", tsfmt != NULL ? tsfmt : "");
    log_tslevels = parse_levels(geoParamStr(GEO_PARAM_DEBUG_TIMESTAMP_LEVELS));
    open_log_file();
    int fresh = __atomic_exchange_n(&log_generation, gen, __ATOMIC_ACQ_REL) != gen;
    __atomic_store_n(&log_level, level, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&log_lock);
    /* Every value the environment set, once per reading of it (the
     * secret's excepted), and what became of the NCCL variables set. */
    if (!fresh || level < GEO_LEVEL_INFO)
        return;
    for (int i = 0; i < GEO_PARAM_COUNT; i++) {
        geoParamId id = (geoParamId)i;
        const char *from = geoParamNcclOrigin(id), *note = geoParamNcclNote(id);
        if (i != GEO_PARAM_COMM_SECRET && geoParamIsSet(id))
            geoInfo(GEO_LOG_ENV, "%s set by environment to %s%s%s%s",
                    geoParamDescribe(id)->name, geoParamStr(id), from ? " (from " : "",
                    from ? from : "", from ? ")" : "");
        if (note != NULL)
            geoInfo(GEO_LOG_ENV, "%s", note);
    }
    log_nccl_others();
}

int geoDebugLevel(void)
{
    int lv = __atomic_load_n(&log_level, __ATOMIC_ACQUIRE);
    if (lv < 0 || __atomic_load_n(&log_generation, __ATOMIC_ACQUIRE) != geoParamGeneration()) {
        geoDebugInit();
        lv = __atomic_load_n(&log_level, __ATOMIC_ACQUIRE);
    }
    return lv;
}

void geoDebugSetRank(int rank) { log_rank = rank; }

static const char *level_name(int level)
{
    switch (level) {
    case GEO_LEVEL_WARN: return "WARN";
    case GEO_LEVEL_INFO: return "INFO";
    default: return "TRACE";
    }
}

void geoLog(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;

    if (geoDebugLevel() < level || (level > GEO_LEVEL_WARN && !(subsys & log_subsys)))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* The source path as the tree names it, whatever directory the
     * compiler was run from. */
    while (strncmp(file, "../", 3) == 0 || strncmp(file, "./", 2) == 0)
        file += file[1] == '.' ? 3 : 2;
    pthread_mutex_lock(&log_lock);
    char when[160] = "";
    if (log_tsfmt[0] != '\0' && (log_tslevels & (1U << level)))
        format_time(log_tsfmt, when, sizeof(when));
    FILE *out = log_file != NULL ? log_file : stderr;
    if (level != GEO_LEVEL_INFO)
        fprintf(out, "%s%s:%d:%d [geoccl] %s %s:%d %s\n", when, log_host, (int)getpid(),
                log_rank, level_name(level), file, line, msg);
    else
        fprintf(out, "%s%s:%d:%d [geoccl] %s %s\n", when, log_host, (int)getpid(), log_rank,
                level_name(level), msg);
    pthread_mutex_unlock(&log_lock);
}

void geoSetThreadError(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
    va_end(ap);
}

const char *geoThreadError(void) { return thread_error; }
