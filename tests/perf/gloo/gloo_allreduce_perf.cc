// gloo_allreduce_perf.cc: one rank of a Gloo all-reduce benchmark that
// prints the same table as nccl-tests' all_reduce_perf (and GeoCCL's
// geoccl-perf), so that GeoCCL can be compared with Gloo on the same links.
//
// Every rank is a separate process, started by hand, by a script or by
// mpirun (only for its OMPI_COMM_WORLD_* variables: MPI itself is not used).
// The ranks meet through a gloo::rendezvous::FileStore on a directory they
// all see, and talk over Gloo's TCP transport bound to one interface or
// address. See README.md next to this file.
//
// Build: tests/perf/gloo/build.sh [OUTPUT]

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier.h>
#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

const char* const kTool = "gloo-allreduce-perf";

// ---------------------------------------------------------------- options

struct Options {
  int rank = -1;
  int size = -1;
  std::string rankSource;  // where rank and size came from, for the header
  std::string store;
  std::string prefix = "gloo-allreduce-perf";
  std::string iface;
  std::string host;
  std::string algo = "ring";
  int base = 2;  // bcube base (peers per group)
  size_t minBytes = 8;
  size_t maxBytes = 32u << 20;
  size_t stepFactor = 2;
  size_t stepBytes = 0;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int timeoutSec = 600;
  bool keepKeys = false;
};

struct AlgoInfo {
  const char* name;
  const char* what;
};

const AlgoInfo kAlgos[] = {
    {"ring", "gloo::AllreduceRing<float> (each step passes the whole buffer on)"},
    {"ring_chunked", "gloo::AllreduceRingChunked<float> (reduce-scatter + allgather "
                     "ring, 2*P chunks)"},
    {"halving_doubling", "gloo::AllreduceHalvingDoubling<float> (recursive halving "
                         "and doubling)"},
    {"bcube", "gloo::AllreduceBcube<float>"},
    {"new_ring", "gloo::allreduce() with AllreduceOptions::RING (the newer "
                 "unbound-buffer API, segmented ring)"},
    {"new_bcube", "gloo::allreduce() with AllreduceOptions::BCUBE (the newer "
                  "unbound-buffer API)"},
};

const AlgoInfo* findAlgo(const std::string& name) {
  for (const auto& a : kAlgos) {
    if (name == a.name) {
      return &a;
    }
  }
  return nullptr;
}

void usage(FILE* f) {
  fprintf(f,
          "usage: %s --store DIR (--host ADDR | --iface NAME) [options]\n"
          "One rank of a Gloo all-reduce (float sum) benchmark; rank 0 prints an\n"
          "nccl-tests style table.\n"
          "\n"
          "  --rank R, --size N       this rank and the number of ranks (default: RANK and\n"
          "                           NRANKS, else OMPI_COMM_WORLD_RANK and _SIZE)\n"
          "  --store DIR              FileStore directory shared by all ranks (created if\n"
          "                           missing)\n"
          "  --prefix P               key prefix in the store, one per run (default %s);\n"
          "                           the keys are removed at a clean end unless --keep-keys\n"
          "  --host ADDR              bind Gloo's TCP device to this address\n"
          "  --iface NAME             bind it to this interface's address instead\n"
          "  --algo NAME              ring (default), ring_chunked, halving_doubling, bcube,\n"
          "                           new_ring, new_bcube\n"
          "  --base B                 bcube base: ranks per group (default 2; the number\n"
          "                           of ranks must be a multiple of it)\n"
          "  -b, --minbytes SIZE      smallest size (default 8; suffixes K, M, G)\n"
          "  -e, --maxbytes SIZE      largest size (default 32M)\n"
          "  -f, --stepfactor N       multiply the size by N each step (default 2)\n"
          "  -i, --stepbytes SIZE     add SIZE each step instead\n"
          "  -n, --iters N            timed iterations per size (default 20)\n"
          "  -w, --warmup_iters N     untimed iterations before them (default 5)\n"
          "  -c, --check 0|1          run one more, checked, iteration per size and count\n"
          "                           the wrong elements (default 1)\n"
          "  -d, --datatype float     the only type measured\n"
          "  -o, --op sum             the only operation measured\n"
          "  -T, --timeout S          Gloo context timeout in seconds, also used for the\n"
          "                           rendezvous (default 600)\n"
          "  --keep-keys              leave this run's keys in the store\n"
          "  -h, --help               this text\n",
          kTool, Options().prefix.c_str());
}

[[noreturn]] void die(const char* fmt, const char* a = "", const char* b = "") {
  fprintf(stderr, "%s: ", kTool);
  fprintf(stderr, fmt, a, b);
  fprintf(stderr, "\n");
  exit(2);
}

// Parses "64", "1K", "8M", "1G" (binary multiples, as nccl-tests does).
bool parseSize(const char* s, size_t* out) {
  if (s == nullptr || *s == '\0' || *s == '-') {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) {
    return false;
  }
  unsigned long long mult = 1;
  switch (*end) {
    case '\0':
      break;
    case 'k':
    case 'K':
      mult = 1ull << 10;
      end++;
      break;
    case 'm':
    case 'M':
      mult = 1ull << 20;
      end++;
      break;
    case 'g':
    case 'G':
      mult = 1ull << 30;
      end++;
      break;
    default:
      return false;
  }
  if ((*end == 'b' || *end == 'B') && mult != 1) {
    end++;
  }
  if (*end != '\0' || (v != 0 && mult > ULLONG_MAX / v)) {
    return false;
  }
  *out = static_cast<size_t>(v * mult);
  return true;
}

bool parseInt(const char* s, long lo, long hi, int* out) {
  if (s == nullptr || *s == '\0') {
    return false;
  }
  errno = 0;
  char* end = nullptr;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) {
    return false;
  }
  *out = static_cast<int>(v);
  return true;
}

Options parseArgs(int argc, char** argv) {
  enum {
    kRank = 1000,
    kSize,
    kStore,
    kPrefix,
    kIface,
    kHost,
    kAlgo,
    kBase,
    kKeepKeys,
  };
  static const struct option longopts[] = {
      {"rank", required_argument, nullptr, kRank},
      {"size", required_argument, nullptr, kSize},
      {"store", required_argument, nullptr, kStore},
      {"prefix", required_argument, nullptr, kPrefix},
      {"iface", required_argument, nullptr, kIface},
      {"host", required_argument, nullptr, kHost},
      {"algo", required_argument, nullptr, kAlgo},
      {"base", required_argument, nullptr, kBase},
      {"keep-keys", no_argument, nullptr, kKeepKeys},
      {"minbytes", required_argument, nullptr, 'b'},
      {"maxbytes", required_argument, nullptr, 'e'},
      {"stepfactor", required_argument, nullptr, 'f'},
      {"stepbytes", required_argument, nullptr, 'i'},
      {"iters", required_argument, nullptr, 'n'},
      {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},
      {"datatype", required_argument, nullptr, 'd'},
      {"op", required_argument, nullptr, 'o'},
      {"timeout", required_argument, nullptr, 'T'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  Options o;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:T:h", longopts, nullptr)) != -1) {
    bool ok = true;
    switch (c) {
      case kRank:
        ok = parseInt(optarg, 0, INT_MAX, &o.rank);
        break;
      case kSize:
        ok = parseInt(optarg, 1, INT_MAX, &o.size);
        break;
      case kStore:
        o.store = optarg;
        break;
      case kPrefix:
        o.prefix = optarg;
        break;
      case kIface:
        o.iface = optarg;
        break;
      case kHost:
        o.host = optarg;
        break;
      case kAlgo:
        o.algo = optarg;
        ok = findAlgo(o.algo) != nullptr;
        break;
      case kBase:
        ok = parseInt(optarg, 2, INT_MAX, &o.base);
        break;
      case kKeepKeys:
        o.keepKeys = true;
        break;
      case 'b':
        ok = parseSize(optarg, &o.minBytes);
        break;
      case 'e':
        ok = parseSize(optarg, &o.maxBytes);
        break;
      case 'f': {
        int v;
        ok = parseInt(optarg, 2, INT_MAX, &v);
        o.stepFactor = static_cast<size_t>(v);
        o.stepBytes = 0;
        break;
      }
      case 'i':
        ok = parseSize(optarg, &o.stepBytes) && o.stepBytes > 0;
        break;
      case 'n':
        ok = parseInt(optarg, 1, INT_MAX, &o.iters);
        break;
      case 'w':
        ok = parseInt(optarg, 0, INT_MAX, &o.warmup);
        break;
      case 'c':
        ok = parseInt(optarg, 0, 1, &o.check);
        break;
      case 'd':
        ok = strcmp(optarg, "float") == 0;
        break;
      case 'o':
        ok = strcmp(optarg, "sum") == 0;
        break;
      case 'T':
        ok = parseInt(optarg, 1, INT_MAX / 1000, &o.timeoutSec);
        break;
      case 'h':
        usage(stdout);
        exit(0);
      case ':':
        die("option %s needs a value", argv[optind - 1]);
      default:
        usage(stderr);
        die("unknown option %s", argv[optind - 1]);
    }
    if (!ok) {
      std::string name = std::string("-") + static_cast<char>(c);
      for (const struct option* lo = longopts; lo->name != nullptr; lo++) {
        if (lo->val == c) {
          name = std::string("--") + lo->name;
          break;
        }
      }
      die("%s %s: not a valid value", name.c_str(), optarg ? optarg : "");
    }
  }
  if (optind < argc) {
    die("unexpected argument %s", argv[optind]);
  }

  // Rank and size: options, else RANK/NRANKS, else Open MPI's variables.
  if (o.rank >= 0 || o.size >= 0) {
    if (o.rank < 0 || o.size < 0) {
      die("--rank and --size go together");
    }
    o.rankSource = "--rank/--size";
  } else {
    const char* pairs[][2] = {
        {"RANK", "NRANKS"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
    };
    for (const auto& p : pairs) {
      const char* r = getenv(p[0]);
      const char* n = getenv(p[1]);
      if (r == nullptr && n == nullptr) {
        continue;
      }
      if (r == nullptr || n == nullptr || !parseInt(r, 0, INT_MAX, &o.rank) ||
          !parseInt(n, 1, INT_MAX, &o.size)) {
        die("%s and %s must both be set to numbers", p[0], p[1]);
      }
      o.rankSource = std::string(p[0]) + "/" + p[1];
      break;
    }
    if (o.rankSource.empty()) {
      die("no rank: give --rank R --size N, or set RANK and NRANKS");
    }
  }
  if (o.rank >= o.size) {
    fprintf(stderr, "%s: rank %d: need 0 <= rank < size (%d)\n", kTool, o.rank, o.size);
    exit(2);
  }
  if (o.store.empty()) {
    die("--store DIR is required (a directory all ranks share)");
  }
  if (o.iface.empty() == o.host.empty()) {
    die("give exactly one of --host ADDR and --iface NAME");
  }
  if (o.minBytes > o.maxBytes) {
    die("-b is larger than -e");
  }
  if (o.minBytes < sizeof(float) && o.stepBytes == 0) {
    o.minBytes = sizeof(float);  // a size that stays 0 when multiplied
  }
  // The algorithm classes take the element count as int and AllreduceRing
  // keeps the byte count in an int.
  if (o.maxBytes > static_cast<size_t>(INT_MAX)) {
    die("-e: at most 2G - 1 bytes (Gloo's algorithm classes count in int)");
  }
  if (o.algo == "bcube" && o.size % o.base != 0) {
    fprintf(stderr, "%s: bcube: %d ranks is not a multiple of the base %d (--base)\n", kTool,
            o.size, o.base);
    exit(2);
  }
  return o;
}

// ---------------------------------------------------------------- store

// The rendezvous store. gloo's FileStore and PrefixStore give up after
// Store::kDefaultTimeout (30 s) when a wait comes without a timeout, which
// is too short when ranks are started one by one; this wrapper makes every
// wait (and get, which waits for its key) use the run's timeout.
class PatientStore : public gloo::rendezvous::Store {
 public:
  PatientStore(gloo::rendezvous::Store& inner, std::chrono::milliseconds timeout)
      : inner_(inner), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }

  std::vector<char> get(const std::string& key) override {
    inner_.wait({key}, timeout_);
    return inner_.get(key);
  }

  void wait(const std::vector<std::string>& keys) override {
    inner_.wait(keys, timeout_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, std::max(timeout, timeout_));
  }

 private:
  gloo::rendezvous::Store& inner_;
  std::chrono::milliseconds timeout_;
};

// ---------------------------------------------------------------- collectives

using Clock = std::chrono::steady_clock;

// Tags for the unbound-buffer collectives (barrier, allgather, allreduce of
// the timings, new_* algorithms). Every rank issues the same sequence, so
// the counters agree.
uint32_t nextTag = 1;

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(nextTag++);
  gloo::barrier(opts);
}

// In-place all-reduce of a few doubles with sum or max.
void reduceDoubles(const std::shared_ptr<gloo::Context>& ctx, double* v, size_t n, bool max) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  gloo::AllreduceOptions opts(ctx);
  opts.setOutput(v, n);
  opts.setReduceFunction(max ? static_cast<Fn>(&gloo::max<double>)
                             : static_cast<Fn>(&gloo::sum<double>));
  opts.setTag(nextTag++);
  gloo::allreduce(opts);
}

// One all-reduce of buf[0..count) in place, set up once per size.
class Runner {
 public:
  virtual ~Runner() = default;
  virtual void run() = 0;
};

class AlgorithmRunner : public Runner {
 public:
  explicit AlgorithmRunner(std::unique_ptr<gloo::Algorithm> a) : algo_(std::move(a)) {}
  void run() override {
    algo_->run();
  }

 private:
  std::unique_ptr<gloo::Algorithm> algo_;
};

class OptionsRunner : public Runner {
 public:
  OptionsRunner(const std::shared_ptr<gloo::Context>& ctx, float* buf, size_t count,
                gloo::AllreduceOptions::Algorithm algorithm)
      : ctx_(ctx), buf_(buf), count_(count), algorithm_(algorithm) {}
  void run() override {
    using Fn = void (*)(void*, const void*, const void*, size_t);
    gloo::AllreduceOptions opts(ctx_);
    opts.setAlgorithm(algorithm_);
    opts.setOutput(buf_, count_);  // no input: the output is also the input
    opts.setReduceFunction(static_cast<Fn>(&gloo::sum<float>));
    opts.setTag(nextTag++);
    gloo::allreduce(opts);
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  float* buf_;
  size_t count_;
  gloo::AllreduceOptions::Algorithm algorithm_;
};

std::unique_ptr<Runner> makeRunner(const std::string& algo,
                                   const std::shared_ptr<gloo::Context>& ctx, float* buf,
                                   size_t count) {
  const std::vector<float*> ptrs{buf};
  const int n = static_cast<int>(count);
  if (algo == "ring") {
    return std::make_unique<AlgorithmRunner>(
        std::make_unique<gloo::AllreduceRing<float>>(ctx, ptrs, n));
  }
  if (algo == "ring_chunked") {
    return std::make_unique<AlgorithmRunner>(
        std::make_unique<gloo::AllreduceRingChunked<float>>(ctx, ptrs, n));
  }
  if (algo == "halving_doubling") {
    return std::make_unique<AlgorithmRunner>(
        std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, ptrs, n));
  }
  if (algo == "bcube") {
    return std::make_unique<AlgorithmRunner>(
        std::make_unique<gloo::AllreduceBcube<float>>(ctx, ptrs, n));
  }
  if (algo == "new_ring") {
    return std::make_unique<OptionsRunner>(ctx, buf, count,
                                           gloo::AllreduceOptions::Algorithm::RING);
  }
  if (algo == "new_bcube") {
    return std::make_unique<OptionsRunner>(ctx, buf, count,
                                           gloo::AllreduceOptions::Algorithm::BCUBE);
  }
  throw std::logic_error("unknown algorithm " + algo);
}

// ---------------------------------------------------------------- data

// Small integers, so that the sum over any number of ranks up to 2^20 is
// exact in float; every rank and element gets a different mix.
inline float inputValue(int rank, size_t i) {
  return static_cast<float>((static_cast<uint64_t>(rank) * 7 + i) % 13 + 1);
}

inline float expectedValue(int size, size_t i) {
  uint64_t s = 0;
  for (int r = 0; r < size; r++) {
    s += (static_cast<uint64_t>(r) * 7 + i) % 13 + 1;
  }
  return static_cast<float>(s);
}

void fillInput(float* buf, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) {
    buf[i] = inputValue(rank, i);
  }
}

size_t countWrong(const float* buf, size_t count, int size) {
  // The expected values repeat with period 13 in i.
  float expect[13];
  for (size_t j = 0; j < 13; j++) {
    expect[j] = expectedValue(size, j);
  }
  size_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    if (buf[i] != expect[i % 13]) {
      wrong++;
    }
  }
  return wrong;
}

// ---------------------------------------------------------------- output

void printRow(size_t bytes, size_t count, double us, int nranks, bool check, double wrong,
              double* busSum, int* busN) {
  double algbw = us > 0 ? static_cast<double>(bytes) / (us * 1e-6) / 1e9 : 0.0;
  double busbw = algbw * 2.0 * (nranks - 1) / nranks;
  char wr[32];
  if (check) {
    snprintf(wr, sizeof(wr), "%.0f", wrong);
  } else {
    snprintf(wr, sizeof(wr), "N/A");
  }
  printf(" %12zu %12zu %9s %6s %6d  %10.2f %8.2f %8.2f %6s\n", bytes, count, "float", "sum", -1,
         us, algbw, busbw, wr);
  fflush(stdout);
  *busSum += busbw;
  (*busN)++;
}

struct RankInfo {
  int32_t rank;
  int32_t pid;
  char host[64];
  char device[184];
};

void printHeader(const Options& o, const AlgoInfo& algo, const std::vector<RankInfo>& ranks) {
  printf("# Gloo all-reduce: %d rank%s, algorithm %s: %s\n", o.size, o.size == 1 ? "" : "s",
         algo.name, algo.what);
  printf("# Gloo %d.%d.%d (GLOO_VERSION %d from gloo/config.h), tcp transport, FileStore %s "
         "prefix %s, ranks from %s\n",
         GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH, GLOO_VERSION,
         o.store.c_str(), o.prefix.c_str(), o.rankSource.c_str());
  printf("# minBytes %zu maxBytes %zu step: ", o.minBytes, o.maxBytes);
  if (o.stepBytes) {
    printf("%zu(bytes)", o.stepBytes);
  } else {
    printf("%zu(factor)", o.stepFactor);
  }
  printf(" warmup iters: %d iters: %d validation: %d timeout: %d\n", o.warmup, o.iters, o.check,
         o.timeoutSec);
  if (o.algo == "bcube") {
    printf("# bcube base: %d\n", o.base);
  }
  printf("#\n# Using ranks\n");
  for (const auto& r : ranks) {
    printf("#  Rank %2d Pid %7d on %s device %s\n", r.rank, r.pid, r.host, r.device);
  }
  printf("#\n");
  printf("# Gloo all-reduces in place (one buffer per rank): there is no separate\n"
         "# out-of-place measurement, so only one set of columns, the one nccl-tests\n"
         "# labels out-of-place. time: average per iteration, maximum over ranks.\n");
  printf("#%49s  %11s%s\n", "", "", "out-of-place");
  printf("#%12s %12s %9s %6s %6s  %10s %8s %8s %6s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong");
  printf("#%12s %12s %9s %6s %6s  %10s %8s %8s\n", "(B)", "(elements)", "", "", "", "(us)",
         "(GB/s)", "(GB/s)");
  fflush(stdout);
}

// ---------------------------------------------------------------- main

// Removes the key files this rank's store wrote (or read).
void removeKeys(gloo::rendezvous::FileStore& fileStore) {
  for (const auto& path : fileStore.getAllKeyFilePaths()) {
    unlink(path.c_str());
  }
}

int runWithStore(const Options& o, const AlgoInfo& algo, std::chrono::milliseconds timeout,
                 std::shared_ptr<gloo::transport::Device>& dev,
                 gloo::rendezvous::FileStore& fileStore, gloo::rendezvous::Store& store);

int runBenchmark(const Options& o) {
  const AlgoInfo& algo = *findAlgo(o.algo);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeoutSec) * 1000);

  if (mkdir(o.store.c_str(), 0777) != 0 && errno != EEXIST) {
    fprintf(stderr, "%s: rank %d: mkdir %s: %s\n", kTool, o.rank, o.store.c_str(),
            strerror(errno));
    return 2;
  }

  gloo::transport::tcp::attr attr;
  if (!o.iface.empty()) {
    attr.iface = o.iface;
  } else {
    attr.hostname = o.host;
  }
  auto dev = gloo::transport::tcp::CreateDevice(attr);

  gloo::rendezvous::FileStore fileStore(o.store);
  gloo::rendezvous::PrefixStore prefixStore(o.prefix, fileStore);
  PatientStore store(prefixStore, timeout);

  // A run that fails takes its keys with it too, so that a rerun with the
  // same --store and --prefix does not find this run's stale addresses.
  try {
    return runWithStore(o, algo, timeout, dev, fileStore, store);
  } catch (...) {
    if (!o.keepKeys) {
      removeKeys(fileStore);
    }
    throw;
  }
}

int runWithStore(const Options& o, const AlgoInfo& algo, std::chrono::milliseconds timeout,
                 std::shared_ptr<gloo::transport::Device>& dev,
                 gloo::rendezvous::FileStore& fileStore, gloo::rendezvous::Store& store) {
  auto rctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size, o.base);
  rctx->setTimeout(timeout);
  rctx->connectFullMesh(store, dev);
  std::shared_ptr<gloo::Context> ctx = rctx;

  // Who is who, for the header.
  RankInfo me{};
  me.rank = o.rank;
  me.pid = static_cast<int32_t>(getpid());
  gethostname(me.host, sizeof(me.host) - 1);
  snprintf(me.device, sizeof(me.device), "%s", dev->str().c_str());
  std::vector<RankInfo> ranks(static_cast<size_t>(o.size));
  {
    gloo::AllgatherOptions opts(ctx);
    opts.setInput(reinterpret_cast<char*>(&me), sizeof(me));
    opts.setOutput(reinterpret_cast<char*>(ranks.data()), sizeof(me) * ranks.size());
    opts.setTag(nextTag++);
    gloo::allgather(opts);
  }
  if (o.rank == 0) {
    printHeader(o, algo, ranks);
  }

  const size_t maxCount = o.maxBytes / sizeof(float);
  std::vector<float> buf(maxCount > 0 ? maxCount : 1);

  double wrongTotal = 0, busSum = 0;
  int busN = 0;
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes;) {
    const size_t count = bytes / sizeof(float);
    const size_t rowBytes = count * sizeof(float);

    fillInput(buf.data(), count, o.rank);
    auto runner = makeRunner(o.algo, ctx, buf.data(), count);
    for (int i = 0; i < o.warmup; i++) {
      runner->run();
    }
    barrier(ctx);
    auto t0 = Clock::now();
    for (int i = 0; i < o.iters; i++) {
      runner->run();
    }
    auto t1 = Clock::now();
    double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / o.iters;
    double wrong = 0;
    if (o.check) {
      // The timed iterations kept summing in place; start again from the
      // input for one checked iteration.
      fillInput(buf.data(), count, o.rank);
      runner->run();
      wrong = static_cast<double>(countWrong(buf.data(), count, o.size));
    }
    runner.reset();
    reduceDoubles(ctx, &us, 1, true);
    reduceDoubles(ctx, &wrong, 1, false);
    wrongTotal += wrong;
    if (o.rank == 0) {
      printRow(rowBytes, count, us, o.size, o.check != 0, wrong, &busSum, &busN);
    }

    if (o.stepBytes) {
      if (bytes > SIZE_MAX - o.stepBytes) {
        break;
      }
      bytes += o.stepBytes;
    } else {
      if (bytes == 0 || bytes > SIZE_MAX / o.stepFactor) {
        break;
      }
      bytes *= o.stepFactor;
    }
  }

  if (o.rank == 0) {
    if (o.check) {
      printf("# Wrong values         : %.0f %s\n", wrongTotal, wrongTotal ? "FAILED" : "OK");
    } else {
      printf("# Results not checked (-c 0)\n");
    }
    printf("# Avg bus bandwidth    : %g \n#\n", busN ? busSum / busN : 0.0);
    fflush(stdout);
  }

  // Every rank is past the rendezvous once all are here: the keys can go,
  // so that the same --store and --prefix can serve the next run.
  barrier(ctx);
  if (!o.keepKeys) {
    removeKeys(fileStore);
  }
  return wrongTotal > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parseArgs(argc, argv);
  try {
    return runBenchmark(o);
  } catch (const gloo::Exception& e) {
    fprintf(stderr, "%s: rank %d: gloo error: %s\n", kTool, o.rank, e.what());
  } catch (const std::exception& e) {
    fprintf(stderr, "%s: rank %d: error: %s\n", kTool, o.rank, e.what());
  }
  return 3;
}
