/*
 * train.c: data-parallel training through the NCCL API, the way a deep
 * learning framework uses NCCL, on GeoCCL's host buffers.
 *
 * The model is a small multi-layer perceptron (64 inputs, one hidden layer
 * of 64 ReLU units, 10-way softmax) or, with --model softmax, softmax
 * regression. The data are the 8x8 handwritten digits (1797 images, pixels
 * 0..16, digits 0..9) that Debian's python3-sklearn package ships as
 * digits.csv.gz; this program reads the file itself.
 *
 * Every rank:
 *   1. loads the whole data set and splits it the same way (seeded
 *      shuffle, 80% train, 20% test) and starts from the same weights;
 *   2. each step takes its own slice of the global mini-batch, computes the
 *      gradient of the loss on it, and all-reduces the flat gradient vector
 *      with one ncclAllReduce(ncclFloat, ncclAvg) on one bucket buffer that
 *      is reused every step (so a library keeping per-buffer state, such as
 *      the error feedback of gradient compression, sees the same address
 *      each time);
 *   3. applies SGD with momentum to its copy of the weights.
 * As every rank gets the same averaged gradient, the copies stay
 * identical; the program checks this every epoch by all-gathering a hash of
 * the weights, and stops if any rank differs.
 *
 * Rank 0 prints one line per epoch (training loss, test accuracy, time,
 * bytes sent between regions) and a final summary line naming the gradient
 * codec (GEOCCL_COMPRESS) and whether error feedback (GEOCCL_EF) was on.
 *
 * Two builds from this file:
 *   train      ranks started by hand or by a script: GEOCCL_COMM_ID=host:port
 *              GEOCCL_COMM_SECRET=s RANK=r NRANKS=n ./train [options]
 *   train-mpi  (built with -DTRAIN_WITH_MPI) ranks started by mpirun; rank 0
 *              makes the unique id and MPI_Bcast hands it to the others.
 * Run with --help for the options; see README.md beside this file.
 */
#define _GNU_SOURCE
#include <geoccl.h>
#include <nccl.h>

#ifdef TRAIN_WITH_MPI
#include <mpi.h>
#endif
#include <zlib.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DIGITS_DEFAULT_PATH "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
#define NFEAT 64   /* 8x8 pixels */
#define NCLASS 10  /* digits 0..9 */
#define PIXEL_MAX 16

/* ---- stopping --------------------------------------------------------- */

static int g_rank = -1; /* for messages; -1 before the rank is known */

/* Ends this rank. Under MPI, a failure calls MPI_Abort, which also ends
 * the other ranks: they would otherwise wait for this one until GeoCCL's
 * timeout. Code 0 (--help) is a normal end on every rank. */
static _Noreturn void stop(int code)
{
  fflush(stdout);
#ifdef TRAIN_WITH_MPI
  int up = 0;
  MPI_Initialized(&up);
  if (up && code != 0) MPI_Abort(MPI_COMM_WORLD, code);
  if (up) MPI_Finalize();
#endif
  exit(code);
}

static _Noreturn void fail(int code, const char *fmt, ...)
{
  va_list ap;
  fflush(stdout);
  if (g_rank >= 0) fprintf(stderr, "train: rank %d: ", g_rank);
  else fprintf(stderr, "train: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  stop(code);
}

/* An NCCL call that fails stops the rank with the library's own account of
 * what went wrong (peer, address, operation). */
#define NCCL_CHECK(comm, call)                                              \
  do {                                                                      \
    ncclResult_t r_ = (call);                                               \
    if (r_ != ncclSuccess)                                                  \
      fail(1, "%s failed: %s: %s", #call, ncclGetErrorString(r_),           \
           ncclGetLastError(comm));                                         \
  } while (0)

static void *xcalloc(size_t n, size_t size)
{
  void *p = calloc(n, size);
  if (p == NULL) fail(1, "out of memory (%zu x %zu bytes)", n, size);
  return p;
}

static double now_sec(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- random numbers ---------------------------------------------------- */

/* splitmix64: small, fast, and the same sequence on every machine, which is
 * what matters here: every rank must draw the same split, the same initial
 * weights and the same batch order. Each use gets its own stream. */
typedef struct {
  uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r)
{
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static rng_t rng_stream(uint64_t seed, uint64_t stream)
{
  rng_t r = {seed * 0xd1342543de82ef95ULL + stream};
  (void)rng_next(&r);
  return r;
}

/* Uniform in [0, 1). */
static double rng_unit(rng_t *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* Uniform in [0, n), n > 0 (multiply-shift: no modulo bias worth the name). */
static uint32_t rng_below(rng_t *r, uint32_t n)
{
  return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32);
}

static void shuffle(int *a, int n, rng_t *r)
{
  for (int i = n - 1; i > 0; i--) {
    int j = (int)rng_below(r, (uint32_t)i + 1);
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
  }
}

/* ---- the data set ------------------------------------------------------ */

typedef struct {
  int n;
  float *x;         /* n x NFEAT, pixels scaled to [0, 1] */
  unsigned char *y; /* n labels 0..9 */
} dataset_t;

/* Parses one CSV row "p0,p1,...,p63,label" (integers, no spaces needed).
 * Returns NULL on success, or what is wrong with it. */
static const char *parse_row(const char *s, float *x, unsigned char *y)
{
  for (int f = 0; f <= NFEAT; f++) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || errno != 0) return "a field is not an integer";
    if (f < NFEAT) {
      if (v < 0 || v > PIXEL_MAX) return "a pixel is outside 0..16";
      x[f] = (float)v / (float)PIXEL_MAX;
      if (*end != ',') return "fewer than 65 fields";
    } else {
      if (v < 0 || v >= NCLASS) return "the label is outside 0..9";
      *y = (unsigned char)v;
      while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
      if (*end != '\0') return "more than 65 fields";
    }
    s = end + 1;
  }
  return NULL;
}

/* Reads the digits CSV, gzip-compressed or not (gzread passes plain files
 * through). Stops with the reason if the file is missing or malformed. */
static void load_digits(const char *path, dataset_t *ds)
{
  gzFile f = gzopen(path, "rb");
  if (f == NULL) {
    int e = errno;
    fail(2,
         "cannot open the digits data set %s: %s\n"
         "  it comes with Debian's python3-sklearn package (apt-get install python3-sklearn);\n"
         "  elsewhere pass --data PATH to a copy of sklearn/datasets/data/digits.csv.gz\n"
         "  (compressed or not)",
         path, e ? strerror(e) : "out of memory");
  }
  int cap = 2048, n = 0;
  float *x = xcalloc((size_t)cap * NFEAT, sizeof(float));
  unsigned char *y = xcalloc((size_t)cap, 1);
  char line[1024];
  long lineno = 0;
  while (gzgets(f, line, (int)sizeof(line)) != NULL) {
    lineno++;
    size_t len = strlen(line);
    if (len == sizeof(line) - 1 && line[len - 1] != '\n')
      fail(2, "%s:%ld: line longer than %zu bytes: not the digits CSV", path, lineno,
           sizeof(line) - 2);
    if (strspn(line, " \t\r\n") == len) continue; /* blank line */
    if (n == cap) {
      cap *= 2;
      x = realloc(x, (size_t)cap * NFEAT * sizeof(float));
      y = realloc(y, (size_t)cap);
      if (x == NULL || y == NULL) fail(1, "out of memory reading %s", path);
    }
    const char *why = parse_row(line, x + (size_t)n * NFEAT, y + n);
    if (why != NULL)
      fail(2, "%s:%ld: %s: expected 64 pixels (0..16) and a label (0..9), comma-separated", path,
           lineno, why);
    n++;
  }
  int zerr;
  const char *zmsg = gzerror(f, &zerr);
  if (zerr != Z_OK && zerr != Z_STREAM_END)
    fail(2, "%s: read failed after line %ld: %s", path, lineno,
         zerr == Z_ERRNO ? strerror(errno) : zmsg);
  gzclose(f);
  if (n < 2 * NCLASS) fail(2, "%s: only %d samples; is this the digits data set?", path, n);
  ds->n = n;
  ds->x = x;
  ds->y = y;
}

/* ---- the model --------------------------------------------------------- */

typedef enum { MODEL_MLP, MODEL_SOFTMAX } model_kind_t;

/* All parameters live in one flat vector (and so does the gradient), which
 * is what the all-reduce moves. MLP layout: W1 [hidden][64], b1 [hidden],
 * W2 [10][hidden], b2 [10]. Softmax regression: W2 [10][64], b2 [10]. */
typedef struct {
  model_kind_t kind;
  int hidden; /* 0 for softmax regression */
  size_t nparams;
  size_t off_w1, off_b1, off_w2, off_b2;
} model_t;

static model_t model_make(model_kind_t kind, int hidden)
{
  model_t m = {.kind = kind, .hidden = kind == MODEL_MLP ? hidden : 0};
  size_t in2 = kind == MODEL_MLP ? (size_t)hidden : NFEAT; /* inputs of layer 2 */
  m.off_w1 = 0;
  m.off_b1 = m.off_w1 + (size_t)m.hidden * NFEAT;
  m.off_w2 = m.off_b1 + (size_t)m.hidden;
  m.off_b2 = m.off_w2 + NCLASS * in2;
  m.nparams = m.off_b2 + NCLASS;
  return m;
}

/* The same weights on every rank, because every rank draws them from the
 * same seeded stream: uniform He initialisation for the ReLU layer,
 * Glorot for the softmax layer, biases zero. */
static void model_init(const model_t *m, float *w, uint64_t seed)
{
  rng_t r = rng_stream(seed, 2);
  memset(w, 0, m->nparams * sizeof(float));
  if (m->kind == MODEL_MLP) {
    double a = sqrt(6.0 / NFEAT);
    for (size_t i = 0; i < (size_t)m->hidden * NFEAT; i++)
      w[m->off_w1 + i] = (float)((2.0 * rng_unit(&r) - 1.0) * a);
  }
  size_t in2 = m->kind == MODEL_MLP ? (size_t)m->hidden : NFEAT;
  double a = sqrt(6.0 / (double)(in2 + NCLASS));
  for (size_t i = 0; i < NCLASS * in2; i++)
    w[m->off_w2 + i] = (float)((2.0 * rng_unit(&r) - 1.0) * a);
}

/* Per-sample work space. */
typedef struct {
  float *h;  /* hidden activations (after ReLU) */
  float *dh; /* gradient at the hidden layer */
  float z[NCLASS];
} scratch_t;

/* Forward pass for one sample; leaves the logits in s->z (and the hidden
 * activations in s->h). Returns the layer-2 input. */
static const float *forward(const model_t *m, const float *w, const float *x, scratch_t *s)
{
  const float *in2 = x;
  int n2 = NFEAT;
  if (m->kind == MODEL_MLP) {
    const float *w1 = w + m->off_w1, *b1 = w + m->off_b1;
    for (int j = 0; j < m->hidden; j++) {
      const float *row = w1 + (size_t)j * NFEAT;
      float a = b1[j];
      for (int i = 0; i < NFEAT; i++) a += row[i] * x[i];
      s->h[j] = a > 0.0f ? a : 0.0f;
    }
    in2 = s->h;
    n2 = m->hidden;
  }
  const float *w2 = w + m->off_w2, *b2 = w + m->off_b2;
  for (int c = 0; c < NCLASS; c++) {
    const float *row = w2 + (size_t)c * n2;
    float a = b2[c];
    for (int i = 0; i < n2; i++) a += row[i] * in2[i];
    s->z[c] = a;
  }
  return in2;
}

static int argmax(const float *z)
{
  int best = 0;
  for (int c = 1; c < NCLASS; c++)
    if (z[c] > z[best]) best = c;
  return best;
}

/* Adds scale * d(cross-entropy)/d(parameters) for sample (x, y) into g and
 * returns the sample's loss. */
static double backward(const model_t *m, const float *w, const float *x, int y, float scale,
                       float *g, scratch_t *s)
{
  const float *in2 = forward(m, w, x, s);
  int n2 = m->kind == MODEL_MLP ? m->hidden : NFEAT;

  float zmax = s->z[0];
  for (int c = 1; c < NCLASS; c++)
    if (s->z[c] > zmax) zmax = s->z[c];
  float p[NCLASS], sum = 0.0f;
  for (int c = 0; c < NCLASS; c++) {
    p[c] = expf(s->z[c] - zmax);
    sum += p[c];
  }
  double loss = log((double)sum) - (double)(s->z[y] - zmax);

  /* d loss / d z = softmax(z) - onehot(y) */
  float dz[NCLASS];
  for (int c = 0; c < NCLASS; c++) dz[c] = (p[c] / sum - (c == y ? 1.0f : 0.0f)) * scale;

  const float *w2 = w + m->off_w2;
  float *gw2 = g + m->off_w2, *gb2 = g + m->off_b2;
  for (int c = 0; c < NCLASS; c++) {
    float *row = gw2 + (size_t)c * n2;
    for (int i = 0; i < n2; i++) row[i] += dz[c] * in2[i];
    gb2[c] += dz[c];
  }
  if (m->kind != MODEL_MLP) return loss;

  for (int j = 0; j < m->hidden; j++) s->dh[j] = 0.0f;
  for (int c = 0; c < NCLASS; c++) {
    const float *row = w2 + (size_t)c * n2;
    for (int j = 0; j < m->hidden; j++) s->dh[j] += dz[c] * row[j];
  }
  float *gw1 = g + m->off_w1, *gb1 = g + m->off_b1;
  for (int j = 0; j < m->hidden; j++) {
    if (s->h[j] <= 0.0f) continue; /* ReLU passes no gradient where it was off */
    float d = s->dh[j];
    float *row = gw1 + (size_t)j * NFEAT;
    for (int i = 0; i < NFEAT; i++) row[i] += d * x[i];
    gb1[j] += d;
  }
  return loss;
}

/* Fraction of the listed samples classified right. */
static double accuracy(const model_t *m, const float *w, const dataset_t *ds, const int *idx,
                       int n, scratch_t *s)
{
  int right = 0;
  for (int k = 0; k < n; k++) {
    int i = idx[k];
    forward(m, w, ds->x + (size_t)i * NFEAT, s);
    right += argmax(s->z) == ds->y[i];
  }
  return n > 0 ? (double)right / n : 0.0;
}

/* FNV-1a over the bytes of the weights: equal hashes on all ranks mean
 * (barring a collision) bit-identical weights. */
static uint64_t hash_bytes(const void *p, size_t n)
{
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

/* ---- options ----------------------------------------------------------- */

typedef struct {
  const char *data;
  int epochs;
  int batch;
  double lr;
  double momentum;
  uint64_t seed;
  model_kind_t model;
  int hidden;
} options_t;

static void usage(FILE *to)
{
  fprintf(to,
          "usage: train [options]            (GEOCCL_COMM_ID=host:port GEOCCL_COMM_SECRET=s RANK=r NRANKS=n)\n"
          "       mpirun -np N train-mpi [options]\n"
          "  --data PATH      digits CSV, gzip or plain (default " DIGITS_DEFAULT_PATH ")\n"
          "  --epochs N       passes over the training set (default 30)\n"
          "  --batch N        global mini-batch, split over the ranks (default 64)\n"
          "  --lr X           learning rate (default 0.1)\n"
          "  --momentum X     SGD momentum (default 0.9)\n"
          "  --seed N         split, initial weights and batch order (default 1)\n"
          "  --model M        mlp (64-hidden-10, ReLU) or softmax (default mlp)\n"
          "  --hidden N       hidden units of the mlp (default 64)\n"
          "Environment read by GeoCCL: GEOCCL_COMPRESS (gradient codec between regions),\n"
          "GEOCCL_EF (0: no error feedback), GEOCCL_REGION, GEOCCL_SOCKET_IFNAME, ...\n");
}

static long parse_long(const char *opt, const char *s, long lo, long hi)
{
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || errno != 0 || v < lo || v > hi)
    fail(2, "%s %s: want an integer in %ld..%ld", opt, s, lo, hi);
  return v;
}

static double parse_double(const char *opt, const char *s, double lo, double hi)
{
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno != 0 || !(v >= lo && v <= hi))
    fail(2, "%s %s: want a number in %g..%g", opt, s, lo, hi);
  return v;
}

static void parse_options(int argc, char **argv, options_t *o)
{
  static const struct option longopts[] = {
      {"data", required_argument, NULL, 'd'},  {"epochs", required_argument, NULL, 'e'},
      {"batch", required_argument, NULL, 'b'}, {"lr", required_argument, NULL, 'l'},
      {"momentum", required_argument, NULL, 'm'}, {"seed", required_argument, NULL, 's'},
      {"model", required_argument, NULL, 'M'}, {"hidden", required_argument, NULL, 'H'},
      {"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0}};
  *o = (options_t){.data = NULL, .epochs = 30, .batch = 64, .lr = 0.1, .momentum = 0.9,
                   .seed = 1, .model = MODEL_MLP, .hidden = 64};
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case 'd': o->data = optarg; break;
    case 'e': o->epochs = (int)parse_long("--epochs", optarg, 1, 100000); break;
    case 'b': o->batch = (int)parse_long("--batch", optarg, 1, 1 << 20); break;
    case 'l': o->lr = parse_double("--lr", optarg, 1e-9, 100.0); break;
    case 'm': o->momentum = parse_double("--momentum", optarg, 0.0, 0.999999); break;
    case 's': o->seed = (uint64_t)parse_long("--seed", optarg, 0, 0x7fffffffL); break;
    case 'H': o->hidden = (int)parse_long("--hidden", optarg, 1, 4096); break;
    case 'M':
      if (strcmp(optarg, "mlp") == 0) o->model = MODEL_MLP;
      else if (strcmp(optarg, "softmax") == 0) o->model = MODEL_SOFTMAX;
      else fail(2, "--model %s: want mlp or softmax", optarg);
      break;
    case 'h':
      if (g_rank <= 0) usage(stdout);
      stop(0);
    default:
      if (g_rank <= 0) {
        fprintf(stderr, "train: unknown option or missing value: %s\n", argv[optind - 1]);
        usage(stderr);
      }
      stop(2);
    }
  }
  if (optind < argc) fail(2, "unexpected argument '%s' (see --help)", argv[optind]);
}

/* ---- what GeoCCL will do with the gradients ---------------------------- */

/* The value in force of one of GeoCCL's parameters, from the library's own
 * table when it has the parameter (so a default counts too); otherwise the
 * environment. *known says which. */
static const char *geoccl_param(const char *name, int *known)
{
  int n = geocclParamCount();
  for (int i = 0; i < n; i++) {
    geocclParamInfo p;
    if (geocclParamGet(i, &p) == ncclSuccess && p.name != NULL && strcmp(p.name, name) == 0) {
      *known = 1;
      return p.value != NULL ? p.value : p.dflt;
    }
  }
  *known = 0;
  return getenv(name);
}

/* ---- main -------------------------------------------------------------- */

int main(int argc, char **argv)
{
  int rank, nranks;
  ncclUniqueId id;

#ifdef TRAIN_WITH_MPI
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  g_rank = rank;
#else
  {
    const char *r = getenv("RANK"), *n = getenv("NRANKS");
    if (r == NULL || n == NULL || getenv("GEOCCL_COMM_ID") == NULL) {
      int help = 0;
      for (int i = 1; i < argc; i++) help |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
      if (help) {
        usage(stdout);
        return 0;
      }
      fprintf(stderr,
              "train: start one process per rank with GEOCCL_COMM_ID=host:port (rank 0's address),\n"
              "  the same GEOCCL_COMM_SECRET, RANK=r and NRANKS=n set, or use train-mpi under\n"
              "  mpirun; see --help\n");
      return 2;
    }
    nranks = (int)parse_long("NRANKS", n, 1, 1 << 20);
    rank = (int)parse_long("RANK", r, 0, nranks - 1);
    g_rank = rank;
  }
#endif

  options_t opt;
  parse_options(argc, argv, &opt);

  /* Everything below up to the first collective is the same computation on
   * every rank, so every rank agrees on the data and the weights without
   * exchanging them. */
  dataset_t ds;
  const char *path = opt.data != NULL ? opt.data : DIGITS_DEFAULT_PATH;
  load_digits(path, &ds);
  int *order = xcalloc((size_t)ds.n, sizeof(int));
  for (int i = 0; i < ds.n; i++) order[i] = i;
  rng_t split_rng = rng_stream(opt.seed, 1);
  shuffle(order, ds.n, &split_rng);
  int ntest = (ds.n + 4) / 5, ntrain = ds.n - ntest;
  int *train_idx = order, *test_idx = order + ntrain;

  model_t m = model_make(opt.model, opt.hidden);
  float *w = xcalloc(m.nparams, sizeof(float));
  float *vel = xcalloc(m.nparams, sizeof(float));
  /* The gradient bucket: one buffer, all-reduced in place every step. */
  float *grad = xcalloc(m.nparams, sizeof(float));
  scratch_t s = {.h = xcalloc((size_t)m.hidden + 1, sizeof(float)),
                 .dh = xcalloc((size_t)m.hidden + 1, sizeof(float))};
  model_init(&m, w, opt.seed);

  ncclComm_t comm = NULL;
#ifdef TRAIN_WITH_MPI
  /* Rank 0 makes the id (it starts the bootstrap listener there); MPI only
   * carries its bytes. */
  if (rank == 0) NCCL_CHECK(NULL, ncclGetUniqueId(&id));
  MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
#else
  /* With GEOCCL_COMM_ID set the id only encodes that address: every rank
   * computes the same one. */
  NCCL_CHECK(NULL, ncclGetUniqueId(&id));
#endif
  NCCL_CHECK(NULL, ncclCommInitRank(&comm, nranks, id, rank));

  int nregions = 1, region = 0;
  const char *region_name = "";
  NCCL_CHECK(comm, geocclCommGetRegion(comm, &nregions, &region, NULL, NULL, &region_name));
  /* The bucket holds the same gradient every step: its error-feedback
   * residuals (lossy GEOCCL_COMPRESS) are kept for it (geoccl.h). */
  void *grad_reg = NULL;
  NCCL_CHECK(comm, geocclCommRegisterErrorFeedback(comm, grad, m.nparams * sizeof(float),
                                                   &grad_reg));

  int codec_known, ef_known;
  const char *codec = geoccl_param("GEOCCL_COMPRESS", &codec_known);
  const char *ef = geoccl_param("GEOCCL_EF", &ef_known);
  if (codec == NULL || codec[0] == '\0') codec = "none";
  int ef_on = !(ef != NULL && (strcmp(ef, "0") == 0 || strcmp(ef, "off") == 0 ||
                               strcmp(ef, "no") == 0 || strcmp(ef, "false") == 0));
  /* Say so when the codec asked for cannot have been used: the accuracy
   * would otherwise be credited to a codec that never ran. */
  char codec_label[160];
  if (!codec_known && strcmp(codec, "none") != 0)
    snprintf(codec_label, sizeof(codec_label), "%s [not applied: this libgeoccl has no GEOCCL_COMPRESS]",
             codec);
  else
    snprintf(codec_label, sizeof(codec_label), "%s", codec);

  if (rank == 0) {
    printf("# data: %s, %d samples, %d train / %d test (split seed %llu)\n", path, ds.n, ntrain,
           ntest, (unsigned long long)opt.seed);
    if (m.kind == MODEL_MLP)
      printf("# model: mlp %d-%d-%d (ReLU, softmax), %zu parameters\n", NFEAT, m.hidden, NCLASS,
             m.nparams);
    else
      printf("# model: softmax regression %d-%d, %zu parameters\n", NFEAT, NCLASS, m.nparams);
    printf("# sgd: batch %d global (~%d per rank), lr %g, momentum %g, %d epochs, seed %llu\n",
           opt.batch, (opt.batch + nranks - 1) / nranks, opt.lr, opt.momentum, opt.epochs,
           (unsigned long long)opt.seed);
    printf("# %d ranks, %d regions (rank 0 in '%s'); gradient all-reduce: %zu floats, ncclAvg, "
           "one bucket\n",
           nranks, nregions, region_name[0] ? region_name : "default", m.nparams);
    printf("# codec between regions: GEOCCL_COMPRESS=%s, error feedback %s (GEOCCL_EF=%s)\n", codec,
           ef_on ? "on" : "off", ef != NULL ? ef : "unset");
    if (!codec_known)
      printf("# note: this libgeoccl does not read GEOCCL_COMPRESS: gradients travel exact\n");
    printf("%5s %11s %9s %9s %11s %9s\n", "epoch", "train_loss", "test_acc", "seconds",
           "allreduce_s", "wan_MB");
    fflush(stdout);
  }

  uint64_t *hashes = xcalloc((size_t)nranks, sizeof(uint64_t));
  double *stats_all = xcalloc((size_t)nranks * 3, sizeof(double));
  int *epoch_order = xcalloc((size_t)ntrain, sizeof(int));
  geocclStats st0;
  NCCL_CHECK(comm, geocclCommGetStats(comm, &st0));
  unsigned long long wan_before = st0.bytesWan;
  double acc = 0.0;

  for (int epoch = 0; epoch <= opt.epochs; epoch++) {
    double t_start = now_sec(), t_comm = 0.0, loss_sum = 0.0, seen = 0.0;

    if (epoch > 0) {
      memcpy(epoch_order, train_idx, (size_t)ntrain * sizeof(int));
      rng_t er = rng_stream(opt.seed, 1000 + (uint64_t)epoch);
      shuffle(epoch_order, ntrain, &er);
      for (int start = 0; start < ntrain; start += opt.batch) {
        int bsz = ntrain - start < opt.batch ? ntrain - start : opt.batch;
        int lo = start + (int)((long)bsz * rank / nranks);
        int hi = start + (int)((long)bsz * (rank + 1) / nranks);
        /* Each rank sums its slice's gradients scaled by nranks / bsz, so
         * that ncclAvg (sum / nranks) yields the batch mean even when the
         * slices differ in size or one is empty. */
        float scale = (float)nranks / (float)bsz;
        memset(grad, 0, m.nparams * sizeof(float));
        for (int k = lo; k < hi; k++) {
          int i = epoch_order[k];
          loss_sum += backward(&m, w, ds.x + (size_t)i * NFEAT, ds.y[i], scale, grad, &s);
        }
        seen += hi - lo;
        double t0 = now_sec();
        NCCL_CHECK(comm, ncclAllReduce(grad, grad, m.nparams, ncclFloat, ncclAvg, comm, NULL));
        t_comm += now_sec() - t0;
        float lr = (float)opt.lr, mu = (float)opt.momentum;
        for (size_t j = 0; j < m.nparams; j++) {
          vel[j] = mu * vel[j] + grad[j];
          w[j] -= lr * vel[j];
        }
      }
    }

    /* Bytes sent between regions, read before this epoch's own
     * bookkeeping collectives below. */
    geocclStats st;
    NCCL_CHECK(comm, geocclCommGetStats(comm, &st));
    double mine[3] = {loss_sum, seen, (double)(st.bytesWan - wan_before)};
    wan_before = st.bytesWan;
    /* All-gather, not all-reduce: GeoCCL may compress floating-point sums
     * between regions, and these figures and hashes must arrive exact. */
    NCCL_CHECK(comm, ncclAllGather(mine, stats_all, 3, ncclDouble, comm, NULL));
    uint64_t h = hash_bytes(w, m.nparams * sizeof(float));
    NCCL_CHECK(comm, ncclAllGather(&h, hashes, 1, ncclUint64, comm, NULL));
    int differ = 0;
    for (int r = 0; r < nranks; r++) differ += hashes[r] != hashes[0];
    if (differ) {
      if (rank == 0) {
        fprintf(stderr,
                "train: the weights differ between ranks %s epoch %d: hash of rank 0 %016llx,",
                epoch == 0 ? "before" : "after", epoch, (unsigned long long)hashes[0]);
        for (int r = 1; r < nranks; r++)
          if (hashes[r] != hashes[0])
            fprintf(stderr, " rank %d %016llx", r, (unsigned long long)hashes[r]);
        fprintf(stderr, "\n  every rank must get the same averaged gradient; stopping\n");
      }
      fflush(stdout);
      NCCL_CHECK(comm, ncclCommDestroy(comm));
      stop(3);
    }
    if (epoch == 0) continue; /* only the check of the initial weights */

    double loss = 0.0, count = 0.0, wan = 0.0;
    for (int r = 0; r < nranks; r++) {
      loss += stats_all[3 * r];
      count += stats_all[3 * r + 1];
      wan += stats_all[3 * r + 2];
    }
    if (rank == 0) {
      acc = accuracy(&m, w, &ds, test_idx, ntest, &s);
      double secs = now_sec() - t_start;
      printf("%5d %11.4f %8.2f%% %9.2f %11.2f %9.3f\n", epoch, count > 0 ? loss / count : 0.0,
             100.0 * acc, secs, t_comm, wan / 1e6);
      fflush(stdout);
    }
    /* Every rank sees the same total, so all of them stop together. */
    if (!isfinite(loss)) {
      if (rank == 0) fprintf(stderr, "train: the training loss diverged in epoch %d: lower --lr\n", epoch);
      NCCL_CHECK(comm, ncclCommDestroy(comm));
      stop(4);
    }
  }

  if (rank == 0) {
    printf("final test accuracy %.2f%% (codec %s, error feedback %s, %d ranks, %d regions)\n",
           100.0 * acc, codec_label, ef_on ? "on" : "off", nranks, nregions);
    fflush(stdout);
  }

  NCCL_CHECK(comm, ncclCommDestroy(comm));
  free(hashes);
  free(stats_all);
  free(epoch_order);
  free(s.h);
  free(s.dh);
  free(grad);
  free(vel);
  free(w);
  free(order);
  free(ds.x);
  free(ds.y);
#ifdef TRAIN_WITH_MPI
  MPI_Finalize();
#endif
  return 0;
}
