/*
 * CPU emulation of the CUDA device features the kernel files of cuda/ use,
 * and of the runtime calls in cuda_emu.h.  Included (once, through
 * cuda/kernels_device.h) by cuda_emu_kernels.cpp, which compiles those
 * files as one C++ unit with GEO_CUDA_EMU, for tests/device/codec_emu.
 *
 * Model: a launch runs at once, block after block; the threads of a block
 * are coroutines (entered with ucontext, then switched with _setjmp and
 * _longjmp, which unlike swapcontext make no system call) that run until
 * they reach a barrier
 * (__syncthreads, or a warp intrinsic, which is a barrier of the 32 lanes
 * of its warp that also exchanges their values).  Between barriers the
 * threads run in an order set by GEO_EMU_ORDER: "forward", "reverse", or
 * "random" (default; a fresh permutation of threads and blocks each time,
 * from GEO_EMU_SEED), so code that reads another thread's write without a
 * barrier, or depends on block order, gives different results across
 * orders.  It is strict where CUDA is undefined: every thread of the block
 * must reach every __syncthreads, all 32 lanes every warp intrinsic (full
 * mask only) and the same intrinsic; otherwise it reports a deadlock or a
 * divergent warp and aborts.  Atomics are plain read-modify-writes
 * (threads never interleave inside one).
 *
 * Device memory is host memory with guard bytes before and after each
 * allocation, checked at every synchronising call and at cudaFree, and
 * filled with 0xCD at allocation (CUDA does not zero it).  Built with
 * -fsanitize=address it annotates its stack switches for ASan.
 */
#ifndef GEOCCL_CUDA_EMU_DEVICE_H_
#define GEOCCL_CUDA_EMU_DEVICE_H_

#include "cuda_emu.h"

#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>

#include <map>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define GEO_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GEO_EMU_ASAN 1
#endif
#endif
#ifdef GEO_EMU_ASAN
extern "C" void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom,
                                               size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old,
                                                size_t *size_old);
#endif
#ifdef GEO_EMU_ASAN
extern "C" void __asan_poison_memory_region(void const volatile *addr, size_t size);
extern "C" void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
#define GEO_EMU_POISON(p, n) __asan_poison_memory_region((p), (n))
#define GEO_EMU_UNPOISON(p, n) __asan_unpoison_memory_region((p), (n))
#else
#define GEO_EMU_POISON(p, n) ((void)(p), (void)(n))
#define GEO_EMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#ifdef GEO_CUDA_EMU_STREAMS
/* The stream-ordered runtime of tests/device/dev_emu_runtime.c: queues
 * run(arg) on stream, as a launch queues a kernel, and returns at once;
 * the stream's worker runs it in stream order. */
extern "C" void geoEmuStreamLaunch(cudaStream_t stream, void (*run)(void *), void *arg);
/* Nonzero when p lies in memory a kernel may touch (device memory or
 * mapped pinned memory); a GPU would fault on any other pointer. */
extern "C" int geoEmuIsDeviceAccessible(const void *p);
/* An acquire load of a word the host writes (a kernel's ld.acquire.sys),
 * done in the runtime: it is built with the program's flags, the kernels'
 * object is not, so only there does ThreadSanitizer see the order it gives
 * (the host's writes before its release store, the stream's copies after
 * the wait). */
extern "C" unsigned geoEmuLoadAcquire32(const volatile unsigned *p);
#define GEO_EMU_LD_ACQUIRE(p) geoEmuLoadAcquire32(p)
#else
#define GEO_EMU_LD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#endif

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct float4 {
    float x, y, z, w;
};
struct uint4 {
    unsigned x, y, z, w;
};
static inline float4 make_float4(float a, float b, float c, float d)
{
    float4 f = {a, b, c, d};
    return f;
}
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d)
{
    uint4 u = {a, b, c, d};
    return u;
}

#define __shared__ static
#define __device__
#define __host__
#define __global__
#define __forceinline__ inline

namespace geoemu {

struct Barrier {
    unsigned arrived;
    unsigned long gen;
    int op; /* what the current phase's arrivals are doing (warp intrinsics) */
};

struct Thread {
    ucontext_t ctx; /* first entry only */
    jmp_buf jb;     /* where it waits */
    bool started;
    void *stack;
    void *fake; /* ASan's fake stack while suspended */
    unsigned tid;
    bool done;
};

struct Warp {
    Barrier bar;
    uint64_t slot[32];
};

struct Alloc {
    size_t bytes;   /* asked for */
    size_t total;   /* allocated: front guard, bytes, back guard and rounding */
    unsigned char *base;
};

struct State {
    dim3 tIdx, bIdx, bDim, gDim;
    std::vector<Thread> threads;
    Thread *cur;
    jmp_buf schedJb;
    void *schedFake;
    const void *schedBottom;
    size_t schedSize;
    Barrier block;
    std::vector<Warp> warps;
    unsigned long progress;
    void (*body)(void *);
    void *bodyArg;
    int order; /* 0 forward, 1 reverse, 2 random */
    uint64_t rng;
    bool configured;
    std::vector<void *> stacks;
    std::map<uintptr_t, Alloc> allocs;
};

/* Per thread: with GEO_CUDA_EMU_STREAMS each stream's worker runs its own
 * kernels, so kernels of different streams run at the same time, as on a
 * GPU (a kernel that waits on one stream must not hold another's). */
static thread_local State S;
static const size_t kStack = 256 * 1024;
static const size_t kFront = 256, kBack = 64;
static const unsigned char kGuard = 0xA5;

static void fail(const char *what)
{
    fprintf(stderr, "cuda emulation: %s (block %u, thread %u)\n", what, S.bIdx.x, S.tIdx.x);
    abort();
}

static void configure()
{
    if (S.configured)
        return;
    S.configured = true;
    const char *o = getenv("GEO_EMU_ORDER");
    S.order = (o && strcmp(o, "forward") == 0) ? 0 : (o && strcmp(o, "reverse") == 0) ? 1 : 2;
    const char *seed = getenv("GEO_EMU_SEED");
    S.rng = seed ? strtoull(seed, NULL, 10) : 1;
    S.rng = S.rng * 2 + 1;
}

static uint64_t rnd()
{
    S.rng ^= S.rng << 13;
    S.rng ^= S.rng >> 7;
    S.rng ^= S.rng << 17;
    return S.rng;
}

/* 0..n-1 in the configured order. */
static void permutation(std::vector<unsigned> &p, unsigned n)
{
    p.resize(n);
    for (unsigned i = 0; i < n; i++)
        p[i] = S.order == 1 ? n - 1 - i : i;
    if (S.order == 2)
        for (unsigned i = n; i > 1; i--)
            std::swap(p[i - 1], p[rnd() % i]);
}

static void yield()
{
    Thread *t = S.cur;
    if (_setjmp(t->jb) == 0) {
#ifdef GEO_EMU_ASAN
        __sanitizer_start_switch_fiber(&t->fake, S.schedBottom, S.schedSize);
#endif
        _longjmp(S.schedJb, 1);
    }
#ifdef GEO_EMU_ASAN
    __sanitizer_finish_switch_fiber(t->fake, NULL, NULL);
#endif
}

static void arrive(Barrier &b, unsigned size, int op)
{
    if (b.arrived == 0)
        b.op = op;
    else if (b.op != op)
        fail("threads of one warp or block wait at different barriers or intrinsics");
    unsigned long g = b.gen;
    S.progress++;
    if (++b.arrived == size) {
        b.arrived = 0;
        b.gen++;
        return;
    }
    while (b.gen == g)
        yield();
}

static void trampoline()
{
#ifdef GEO_EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &S.schedBottom, &S.schedSize);
#endif
    S.body(S.bodyArg);
    S.cur->done = true;
    S.progress++;
#ifdef GEO_EMU_ASAN
    __sanitizer_start_switch_fiber(NULL, S.schedBottom, S.schedSize);
#endif
    _longjmp(S.schedJb, 2); /* this stack is not used again */
}

/* Runs t until it waits or ends.  A function of its own, so that no
 * local of the scheduler's loop lives in the frame that _setjmp saves. */
static __attribute__((noinline)) void resume(Thread &t)
{
    S.cur = &t;
    S.tIdx = dim3(t.tid);
    if (_setjmp(S.schedJb) == 0) {
#ifdef GEO_EMU_ASAN
        __sanitizer_start_switch_fiber(&S.schedFake, t.stack, kStack);
#endif
        if (!t.started) {
            t.started = true;
            setcontext(&t.ctx);
        }
        _longjmp(t.jb, 1);
    }
#ifdef GEO_EMU_ASAN
    __sanitizer_finish_switch_fiber(S.schedFake, NULL, NULL);
#endif
}

static void runBlock(unsigned nthreads)
{
    S.threads.resize(nthreads);
    while (S.stacks.size() < nthreads) {
        void *p = mmap(NULL, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            fail("no memory for thread stacks");
        S.stacks.push_back(p);
    }
    S.warps.assign(nthreads / 32, Warp());
    S.block = Barrier();
    for (unsigned i = 0; i < nthreads; i++) {
        Thread &t = S.threads[i];
        t.tid = i;
        t.done = false;
        t.started = false;
        t.stack = S.stacks[i];
        t.fake = NULL;
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp = t.stack;
        t.ctx.uc_stack.ss_size = kStack;
        t.ctx.uc_link = NULL; /* trampoline never returns */
        makecontext(&t.ctx, trampoline, 0);
    }
    unsigned live = nthreads;
    std::vector<unsigned> order;
    while (live > 0) {
        unsigned long before = S.progress;
        permutation(order, nthreads);
        for (unsigned k = 0; k < nthreads; k++) {
            Thread &t = S.threads[order[k]];
            if (t.done)
                continue;
            resume(t);
            if (t.done)
                live--;
        }
        if (live > 0 && S.progress == before)
            fail("deadlock: threads wait at a barrier that not all threads reach");
    }
}

static void checkGuards()
{
    for (auto &kv : S.allocs) {
        const Alloc &a = kv.second;
        GEO_EMU_UNPOISON(a.base, a.total);
        for (size_t i = 0; i < kFront; i++)
            if (a.base[i] != kGuard)
                fail("write before the start of a device allocation");
        for (size_t i = 0; i < kBack; i++)
            if (a.base[kFront + a.bytes + i] != kGuard)
                fail("write after the end of a device allocation");
        /* With ASan, any access to a guard is reported where it happens. */
        GEO_EMU_POISON(a.base, kFront);
        GEO_EMU_POISON(a.base + kFront + a.bytes, a.total - kFront - a.bytes);
    }
}

/* Warp intrinsics: each lane puts its value, all wait, each reads, all wait
 * again (so no lane overwrites a slot another has not read yet). */
static Warp &myWarp() { return S.warps[S.tIdx.x / 32]; }

static void checkMask(unsigned mask)
{
    if (mask != 0xFFFFFFFFu)
        fail("warp intrinsic with a partial mask (the kernels use full warps only)");
}

template <class T>
static uint64_t toBits(T v)
{
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}

template <class T>
static T fromBits(uint64_t u)
{
    T v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static void put(int op, uint64_t v)
{
    Warp &w = myWarp();
    w.slot[S.tIdx.x % 32] = v;
    arrive(w.bar, 32, op);
}

static void release() { arrive(myWarp().bar, 32, -1); }

#ifdef GEO_CUDA_EMU_STREAMS
template <class T>
static void checkArg(const T &v, unsigned argno)
{
    if constexpr (std::is_pointer<T>::value) {
        if (v != nullptr && !geoEmuIsDeviceAccessible((const void *)v)) {
            fprintf(stderr, "cuda emulation: kernel argument %u (%p) is host memory a GPU "
                    "cannot read\n", argno, (const void *)v);
            abort();
        }
    } else {
        (void)v;
        (void)argno;
    }
}
#endif

template <class... P>
struct Launcher {
    dim3 grid, block;
    void (*kernel)(P...);
    cudaStream_t stream;

    static void runGrid(void (*kernel)(P...), std::tuple<P...> *args, dim3 grid, dim3 block)
    {
        struct Call {
            void (*kernel)(P...);
            std::tuple<P...> *args;
            static void run(void *p)
            {
                Call *c = (Call *)p;
                std::apply(c->kernel, *c->args); /* a copy per thread, as CUDA */
            }
        } call = {kernel, args};
        S.body = Call::run;
        S.bodyArg = &call;
        S.bDim = block;
        S.gDim = grid;
        std::vector<unsigned> blocks;
        permutation(blocks, grid.x);
        for (unsigned b : blocks) {
            S.bIdx = dim3(b);
            runBlock(block.x);
        }
        checkGuards();
    }

    template <class... A>
    void operator()(A &&...a)
    {
        configure();
        if (block.x == 0 || block.x % 32 != 0 || block.x > 1024 || block.y != 1 ||
            block.z != 1 || grid.x == 0 || grid.y != 1 || grid.z != 1)
            fail("launch configuration the kernels do not use");
        std::tuple<P...> args(std::forward<A>(a)...);
#ifdef GEO_CUDA_EMU_STREAMS
        /* every pointer argument must be one the GPU can dereference */
        unsigned argno = 0;
        std::apply([&argno](auto &...v) { (checkArg(v, argno++), ...); }, args);
        /* Queued, as a CUDA launch: the arguments are copied now, the
         * grid runs when the stream gets there. */
        struct Job {
            void (*kernel)(P...);
            std::tuple<P...> args;
            dim3 grid, block;
            static void run(void *p)
            {
                Job *j = (Job *)p;
                runGrid(j->kernel, &j->args, j->grid, j->block);
                delete j;
            }
        };
        Job *j = new Job{kernel, args, grid, block};
        geoEmuStreamLaunch(stream, Job::run, j);
#else
        runGrid(kernel, &args, grid, block);
#endif
    }
};

} // namespace geoemu

#define threadIdx (geoemu::S.tIdx)
#define blockIdx (geoemu::S.bIdx)
#define blockDim (geoemu::S.bDim)
#define gridDim (geoemu::S.gDim)

template <class... P>
static geoemu::Launcher<P...> geoEmuLaunch(dim3 grid, dim3 block, cudaStream_t stream,
                                           void (*kernel)(P...))
{
    geoemu::Launcher<P...> l;
    l.grid = grid;
    l.block = block;
    l.kernel = kernel;
    l.stream = stream;
    return l;
}

/* A thread that sleeps lets the host (or another stream) go on. */
static inline void __nanosleep(unsigned ns)
{
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

static inline void __syncthreads() { geoemu::arrive(geoemu::S.block, geoemu::S.bDim.x, -2); }

template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src)
{
    geoemu::checkMask(mask);
    geoemu::put(1, geoemu::toBits(v));
    T r = geoemu::fromBits<T>(geoemu::myWarp().slot[src & 31]);
    geoemu::release();
    return r;
}

template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d)
{
    geoemu::checkMask(mask);
    geoemu::put(2, geoemu::toBits(v));
    unsigned lane = geoemu::S.tIdx.x % 32;
    T r = lane + d < 32 ? geoemu::fromBits<T>(geoemu::myWarp().slot[lane + d]) : v;
    geoemu::release();
    return r;
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int m)
{
    geoemu::checkMask(mask);
    geoemu::put(3, geoemu::toBits(v));
    unsigned lane = geoemu::S.tIdx.x % 32;
    T r = geoemu::fromBits<T>(geoemu::myWarp().slot[(lane ^ (unsigned)m) & 31]);
    geoemu::release();
    return r;
}

static inline unsigned __ballot_sync(unsigned mask, int pred)
{
    geoemu::checkMask(mask);
    geoemu::put(4, pred != 0);
    unsigned r = 0;
    for (unsigned l = 0; l < 32; l++)
        r |= (unsigned)(geoemu::myWarp().slot[l] != 0) << l;
    geoemu::release();
    return r;
}

static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }

static inline unsigned __match_any_sync(unsigned mask, unsigned v)
{
    geoemu::checkMask(mask);
    geoemu::put(5, v);
    unsigned r = 0;
    for (unsigned l = 0; l < 32; l++)
        r |= (unsigned)(geoemu::myWarp().slot[l] == v) << l;
    geoemu::release();
    return r;
}

static inline int __popc(unsigned v) { return __builtin_popcount(v); }
static inline int __ffs(unsigned v) { return __builtin_ffs((int)v); }

template <class T>
static inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}

template <class T>
static inline T atomicMin(T *p, T v)
{
    T old = *p;
    *p = v < old ? v : old;
    return old;
}

/* ------------------------------------------------------------------------ */
/* Runtime                                                                   */
/* ------------------------------------------------------------------------ */

/* With GEO_CUDA_EMU_STREAMS the runtime comes from elsewhere (tests/device/
 * dev_emu_runtime.c: streams with worker threads, shared with the library
 * under test), and only the device side above is defined here. */
#ifndef GEO_CUDA_EMU_STREAMS

struct CUevent_st {
    double t;
};

static double geoEmuNow()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

extern "C" {

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    (void)device;
    memset(prop, 0, sizeof *prop);
    strcpy(prop->name, "CPU emulation of the codec kernels (not a GPU)");
    prop->totalGlobalMem = (size_t)1 << 30;
    prop->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    (void)device;
    *value = attr == cudaDevAttrMultiProcessorCount ? 1 : 0;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *version)
{
    *version = 0;
    return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int *version)
{
    *version = 0;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes)
{
    using namespace geoemu;
    size_t total = (kFront + bytes + kBack + 255) / 256 * 256;
    unsigned char *base = (unsigned char *)aligned_alloc(256, total);
    if (!base)
        return cudaErrorMemoryAllocation;
    memset(base, kGuard, kFront);
    memset(base + kFront, 0xCD, bytes);
    memset(base + kFront + bytes, kGuard, kBack);
    GEO_EMU_POISON(base, kFront);
    GEO_EMU_POISON(base + kFront + bytes, total - kFront - bytes);
    S.allocs[(uintptr_t)(base + kFront)] = Alloc{bytes, total, base};
    *ptr = base + kFront;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr)
{
    using namespace geoemu;
    if (!ptr)
        return cudaSuccess;
    auto it = S.allocs.find((uintptr_t)ptr);
    if (it == S.allocs.end())
        return cudaErrorInvalidValue;
    checkGuards();
    GEO_EMU_UNPOISON(it->second.base, it->second.total);
    free(it->second.base);
    S.allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    (void)kind;
    if (bytes)
        memmove(dst, src, bytes);
    geoemu::checkGuards();
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    (void)stream;
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void *ptr, int value, size_t bytes)
{
    if (bytes)
        memset(ptr, value, bytes);
    geoemu::checkGuards();
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream)
{
    (void)stream;
    return cudaMemset(ptr, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    *stream = (cudaStream_t)malloc(1);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    free(stream);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    (void)stream;
    geoemu::checkGuards();
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    geoemu::checkGuards();
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

const char *cudaGetErrorString(cudaError_t err)
{
    switch (err) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unknown error";
    }
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    *event = (cudaEvent_t)calloc(1, sizeof(struct CUevent_st));
    return *event ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    (void)stream;
    event->t = geoEmuNow();
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    (void)event;
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    *ms = (float)((end->t - start->t) * 1e3);
    return cudaSuccess;
}

} /* extern "C" */

#endif /* !GEO_CUDA_EMU_STREAMS */

#endif
